//! A case-blind index of the names in a share's large directories.
//!
//! SMB names compare without case, the file system's with it: a CREATE of
//! a name that does not exist as spelled must learn whether it exists in
//! another case, and without an index that means listing the directory.
//! Filling a directory of N files that way lists it N times (quadratic: a
//! copy of 100,000 files into one folder reads 5·10⁹ entries). For a
//! directory of at least `MIN_ENTRIES` names, the first such listing
//! builds an index instead (folded name → spellings), and from then on the
//! directory's names are kept from inotify(7) events, whoever makes the
//! change: this server, another process, another server on this machine.
//!
//! **Why it can be trusted.** The kernel queues an inotify event before the
//! system call that caused it returns, and every answer first reads the
//! queue. So a change to the directory that finished before a lookup began
//! is in the index when the lookup answers, and the answer is the one a
//! listing made at that moment would give. Building registers the watch
//! before listing, then applies the events that came meanwhile after the
//! listing, in order: each event sets the state of its name, so the last
//! one per name wins, as on disk. A lost event is never guessed at: when
//! the kernel's queue overflows every index is dropped (and rebuilt by the
//! next listing), and a directory whose watch ends (removed, unmounted)
//! drops its own.
//!
//! Only where this machine's kernel sees every change to the files: on a
//! network or cluster file system another machine's changes make no
//! event, so `LocalFs` makes no index there (`local_fs`).
//!
//! **Bounds.** At most `MAX_DIRS` directories and `MAX_NAMES` names in all
//! (the least recently used directory goes first); a directory too big for
//! that is listed without an index. One mutex over everything: a lookup is a read
//! of an empty queue and a hash probe; the listing that builds an index is
//! done outside it.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::handle::FileHandle;
use crate::watch::raw::{self, Inotify, Kind};

/// Smaller directories are listed each time: cheap, and no watch is spent.
pub const MIN_ENTRIES: usize = 1024;
const MAX_DIRS: usize = 64;
const MAX_NAMES: usize = 400_000;
/// Events held for a directory while it is being listed, at most.
const MAX_PENDING: usize = 100_000;
/// Names coming and going, and the watch's own end. Not IN_MODIFY or
/// IN_ATTRIB: writes and metadata change no name.
const MASK: u32 =
    libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO | libc::IN_ONLYDIR;

/// A directory by device and inode.
pub type DirKey = (u64, u64);

/// The case-blind form of a name: two names compare equal ignoring case
/// exactly when their folded forms are equal (each character lowercased,
/// as nimbus-server's `names::eq_ignore_case` compares them).
pub fn fold(name: &str) -> String {
    name.chars().flat_map(char::to_lowercase).collect()
}

pub struct NameIndex {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for NameIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("NameIndex")
            .field("dirs", &inner.dirs.len())
            .field("names", &inner.names)
            .finish()
    }
}

struct Inner {
    inotify: Inotify,
    max_dirs: usize,
    max_names: usize,
    dirs: HashMap<DirKey, Dir>,
    by_wd: HashMap<i32, DirKey>,
    /// Names held by every directory together.
    names: usize,
    /// Counts lookups, to find the least recently used directory.
    clock: u64,
    buf: Vec<u8>,
}

struct Dir {
    wd: i32,
    /// Folded name → the spellings on disk (more than one only where names
    /// differ in case alone).
    names: HashMap<Box<str>, Vec<Box<str>>>,
    count: usize,
    used: u64,
    /// While the directory is being listed: the changes seen meanwhile
    /// (true for a name added), applied after the listing.
    pending: Option<Vec<(bool, String)>>,
}

impl Dir {
    fn add(&mut self, name: &str) {
        let spellings = self.names.entry(fold(name).into()).or_default();
        if !spellings.iter().any(|s| &**s == name) {
            spellings.push(name.into());
            self.count += 1;
        }
    }

    fn remove(&mut self, name: &str) {
        let key = fold(name);
        if let Some(spellings) = self.names.get_mut(key.as_str()) {
            let before = spellings.len();
            spellings.retain(|s| &**s != name);
            self.count -= before - spellings.len();
            if spellings.is_empty() {
                self.names.remove(key.as_str());
            }
        }
    }
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl NameIndex {
    /// None when inotify is not available (the directories are listed).
    pub fn new() -> Option<NameIndex> {
        NameIndex::with_bounds(MAX_DIRS, MAX_NAMES)
    }

    fn with_bounds(max_dirs: usize, max_names: usize) -> Option<NameIndex> {
        let inotify = Inotify::new().ok()?;
        Some(NameIndex {
            inner: Mutex::new(Inner {
                inotify,
                max_dirs,
                max_names,
                dirs: HashMap::new(),
                by_wd: HashMap::new(),
                names: 0,
                clock: 0,
                buf: vec![0; raw::READ_BUFFER],
            }),
        })
    }

    /// The names in directory `key` equal to `name` ignoring case, as
    /// spelled on disk (empty: none); None when the directory is not
    /// indexed.
    pub fn spellings(&self, key: DirKey, name: &str) -> Option<Vec<String>> {
        let mut inner = lock(&self.inner);
        if inner.dirs.is_empty() {
            // Nothing indexed: no queue to read (what a directory left
            // there, its IN_IGNORED, waits for the next index).
            return None;
        }
        inner.drain();
        inner.clock += 1;
        let now = inner.clock;
        let dir = inner.dirs.get_mut(&key)?;
        if dir.pending.is_some() {
            return None;
        }
        dir.used = now;
        Some(
            dir.names
                .get(fold(name).as_str())
                .map(|s| s.iter().map(|n| n.to_string()).collect())
                .unwrap_or_default(),
        )
    }

    /// Whether directory `key` is indexed (its lookups list nothing).
    pub fn covers(&self, key: DirKey) -> bool {
        let mut inner = lock(&self.inner);
        inner.drain();
        inner.dirs.get(&key).is_some_and(|d| d.pending.is_none())
    }

    /// Indexes the directory open as `dir` (device and inode `key`), which
    /// a listing just found to hold `entries` names; nothing for a small
    /// directory, one indexed already, or one too big for the bounds.
    /// Lists the directory once more (outside the lock).
    pub fn index(&self, dir: &FileHandle, key: DirKey, entries: usize) {
        if entries < MIN_ENTRIES {
            return; // the common case, without the lock
        }
        {
            let mut inner = lock(&self.inner);
            if !(MIN_ENTRIES..=inner.max_names).contains(&entries) {
                return;
            }
            inner.drain();
            if inner.dirs.contains_key(&key) {
                return;
            }
            inner.make_room(entries);
            let Ok(wd) = inner.inotify.add_with(dir.raw(), MASK) else {
                return;
            };
            if inner.by_wd.contains_key(&wd) {
                return; // the same directory under another key: leave it be
            }
            let used = inner.clock;
            inner.by_wd.insert(wd, key);
            inner.dirs.insert(
                key,
                Dir {
                    wd,
                    names: HashMap::new(),
                    count: 0,
                    used,
                    pending: Some(Vec::new()),
                },
            );
        }
        let listed = dir.read_dir_names();
        let mut inner = lock(&self.inner);
        // The events up to now go to the pending list (or drop the index).
        inner.drain();
        let Some(d) = inner.dirs.get_mut(&key) else {
            return; // dropped meanwhile (overflow, eviction, removal)
        };
        let Ok(names) = listed else {
            inner.drop_dir(key, true);
            return;
        };
        let pending = d.pending.take().unwrap_or_default();
        for name in &names {
            d.add(name);
        }
        for (added, name) in pending {
            if added {
                d.add(&name);
            } else {
                d.remove(&name);
            }
        }
        let count = d.count;
        inner.names += count;
        if inner.names > inner.max_names {
            inner.drop_dir(key, true);
        }
    }
}

impl Inner {
    /// Reads every queued event and applies it.
    fn drain(&mut self) {
        let mut events = Vec::new();
        loop {
            let n = match self.inotify.read(&mut self.buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            raw::parse(&self.buf[..n], &mut events);
        }
        for e in events {
            self.apply(e);
        }
    }

    fn apply(&mut self, e: raw::RawEvent) {
        let kind = raw::classify(e.mask);
        if kind == Kind::Overflow {
            // Events were lost: no index can be trusted.
            let keys: Vec<DirKey> = self.dirs.keys().copied().collect();
            for key in keys {
                self.drop_dir(key, true);
            }
            return;
        }
        let Some(&key) = self.by_wd.get(&e.wd) else {
            return; // a watch already let go
        };
        let added = match kind {
            Kind::Created | Kind::MovedTo => true,
            Kind::Removed | Kind::MovedFrom => false,
            Kind::Ignored => {
                self.drop_dir(key, false);
                return;
            }
            _ => return,
        };
        // A name that is not UTF-8 is never listed, so never indexed.
        let Ok(name) = String::from_utf8(e.name) else {
            return;
        };
        let Some(dir) = self.dirs.get_mut(&key) else {
            return;
        };
        let too_many = match &mut dir.pending {
            Some(pending) if pending.len() >= MAX_PENDING => true,
            Some(pending) => {
                pending.push((added, name));
                false
            }
            None => {
                let before = dir.count;
                if added {
                    dir.add(&name);
                } else {
                    dir.remove(&name);
                }
                self.names = self.names - before + dir.count;
                self.names > self.max_names
            }
        };
        if too_many {
            self.drop_dir(key, true);
        }
    }

    /// Lets directories go, least recently used first, until one of
    /// `entries` names fits.
    fn make_room(&mut self, entries: usize) {
        while !self.dirs.is_empty()
            && (self.dirs.len() >= self.max_dirs || self.names + entries > self.max_names)
        {
            let oldest = self
                .dirs
                .iter()
                .min_by_key(|(_, d)| d.used)
                .map(|(k, _)| *k);
            match oldest {
                Some(key) => self.drop_dir(key, true),
                None => break,
            }
        }
    }

    /// Forgets a directory's index; `unwatch` ends its kernel watch too
    /// (not needed when the kernel ended it).
    fn drop_dir(&mut self, key: DirKey, unwatch: bool) {
        let Some(dir) = self.dirs.remove(&key) else {
            return;
        };
        if dir.pending.is_none() {
            self.names -= dir.count;
        }
        self.by_wd.remove(&dir.wd);
        if unwatch {
            self.inotify.remove(dir.wd);
        }
    }
}

/// Whether the file system of the descriptor `fd` is one whose every
/// change this machine's kernel makes, and so reports to inotify: a local
/// disk file system (not NFS, SMB, Ceph, a cluster file system, or an
/// overlay, whose lower layers change unseen).
pub(crate) fn local_fs(fd: std::os::fd::RawFd) -> bool {
    const LOCAL: [i64; 7] = [
        0xEF53,      // ext2, ext3, ext4
        0x5846_5342, // XFS
        0x9123_683E, // Btrfs
        0x0102_1994, // tmpfs
        0xF2F5_2010, // F2FS
        0x2FC1_2FC1, // ZFS
        0xCA45_1A4E, // bcachefs
    ];
    // SAFETY: zeroed statfs is a valid value for this plain C struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: s is a valid out pointer; fstatfs accepts O_PATH descriptors.
    if unsafe { libc::fstatfs(fd, &mut s) } != 0 {
        return false;
    }
    LOCAL.contains(&(s.f_type as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CreateMode, Kind, LocalFs, OpenOptions};

    struct Scratch(std::path::PathBuf, LocalFs);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A share holding directory `big` of MIN_ENTRIES + 10 files `fN`.
    fn scratch(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("nimbus-names-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("big")).unwrap();
        for i in 0..MIN_ENTRIES + 10 {
            std::fs::write(dir.join(format!("big/f{i}")), b"").unwrap();
        }
        let fs = LocalFs::new(&dir).unwrap();
        Scratch(dir, fs)
    }

    fn open_dir(fs: &LocalFs, path: &str) -> (FileHandle, DirKey) {
        let opts = OpenOptions {
            read: false,
            write: false,
            mode: CreateMode::OpenExisting,
            kind: Kind::Directory,
            perm: 0,
            append_only: false,
            expect: None,
        };
        let (h, st, _) = fs.open(path, &opts).unwrap();
        (h, (st.dev, st.ino))
    }

    #[test]
    fn changes_made_on_disk_are_seen_by_the_next_lookup() {
        let s = scratch("seen");
        let index = NameIndex::new().unwrap();
        let (dir, key) = open_dir(&s.1, "big");
        assert_eq!(index.spellings(key, "F1"), None, "not indexed yet");
        index.index(&dir, key, MIN_ENTRIES + 10);
        assert!(index.covers(key));
        assert_eq!(index.spellings(key, "F1"), Some(vec!["f1".to_string()]));
        assert_eq!(index.spellings(key, "nothing"), Some(vec![]));
        // No waiting: each change is in the kernel's queue when its call
        // returns, and the lookup reads the queue first.
        let big = s.0.join("big");
        std::fs::write(big.join("NewName"), b"").unwrap();
        assert_eq!(
            index.spellings(key, "newname"),
            Some(vec!["NewName".to_string()])
        );
        std::fs::write(big.join("newNAME"), b"").unwrap();
        let mut both = index.spellings(key, "NEWNAME").unwrap();
        both.sort();
        assert_eq!(both, ["NewName", "newNAME"]);
        std::fs::remove_file(big.join("NewName")).unwrap();
        assert_eq!(
            index.spellings(key, "newname"),
            Some(vec!["newNAME".to_string()])
        );
        std::fs::rename(big.join("f1"), big.join("Moved")).unwrap();
        assert_eq!(index.spellings(key, "F1"), Some(vec![]));
        assert_eq!(
            index.spellings(key, "moved"),
            Some(vec!["Moved".to_string()])
        );
        std::fs::rename(big.join("Moved"), s.0.join("Away")).unwrap();
        assert_eq!(index.spellings(key, "moved"), Some(vec![]));
        std::fs::create_dir(big.join("SubDir")).unwrap();
        assert_eq!(
            index.spellings(key, "subdir"),
            Some(vec!["SubDir".to_string()])
        );
        // The directory gone, its index goes.
        drop(dir);
        std::fs::remove_dir_all(&big).unwrap();
        assert_eq!(index.spellings(key, "f2"), None);
    }

    #[test]
    fn small_directories_are_not_indexed_and_the_oldest_makes_room() {
        let s = scratch("bounds");
        for d in ["a", "b"] {
            std::fs::create_dir(s.0.join(d)).unwrap();
        }
        let index = NameIndex::with_bounds(2, MIN_ENTRIES * 4).unwrap();
        let (small, small_key) = open_dir(&s.1, "a");
        index.index(&small, small_key, MIN_ENTRIES - 1);
        assert!(!index.covers(small_key));
        // Three directories for two places: the least recently used goes.
        let (big, big_key) = open_dir(&s.1, "big");
        index.index(&big, big_key, MIN_ENTRIES + 10);
        let (a, a_key) = open_dir(&s.1, "a");
        index.index(&a, a_key, MIN_ENTRIES);
        assert!(index.covers(big_key) && index.covers(a_key));
        assert!(index.spellings(big_key, "f3").is_some());
        let (b, b_key) = open_dir(&s.1, "b");
        index.index(&b, b_key, MIN_ENTRIES);
        assert!(index.covers(big_key) && index.covers(b_key) && !index.covers(a_key));
        // Too many names for the bounds: listed without an index.
        let index = NameIndex::with_bounds(2, MIN_ENTRIES).unwrap();
        index.index(&big, big_key, MIN_ENTRIES + 10);
        assert!(!index.covers(big_key));
    }
}
