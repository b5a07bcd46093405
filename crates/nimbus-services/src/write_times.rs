//! Windows' delayed write-time update, as Windows 2016 and Samba show it
//! to clients (smbtorture smb2.timestamps.delayed-*): a WRITE does not move
//! a file's last write time at once. The first one through any handle of
//! the file moves it 2 s later (seen by the next query after that), or
//! when the file's size is set, it is flushed, or FileBasicInformation is
//! set on it, whichever comes first; later WRITEs do not move it again;
//! the close of a handle that wrote sets it to the time of the close if
//! the file was written since it last moved. A write time set explicitly
//! through a handle stays through that handle's own writes (MS-FSA
//! 2.1.5.14.2 Open.UserSetModificationTime), not through another's.
//!
//! The kernel moves a file's mtime on every write; while a file has
//! writers, the time clients see is kept here and put in place of the
//! mtime wherever this node reports times (`shown`: QUERY_INFO, CLOSE,
//! CREATE, QUERY_DIRECTORY), and written to the disk when it moves and
//! when the file's last writer closes. Nothing is done per WRITE but a
//! map lookup: a syscall per WRITE cost 8% of the server's CPU on a large
//! upload. Other cluster nodes and the disk watch see the kernel's mtime
//! meanwhile (later than what this node shows, never earlier).
//!
//! Named streams are left alone: their write time is never reported (a
//! stream's times are its file's).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nimbus_state::FileKey;
use nimbus_vfs::Timespec;
use nimbus_wire::fscc::{unix_to_filetime, FileInfo};

use crate::open::Open;
use crate::sync::lock;

/// How long after its first WRITE a file's write time moves.
const DELAY: Duration = Duration::from_secs(2);

/// A file written through one of its open handles.
struct Written {
    /// The write time clients see, and the disk holds between writes.
    shown: Timespec,
    /// When the update the file's first WRITE asked for is due; None once
    /// made.
    due: Option<Instant>,
    /// Written since the time shown was last moved: a close moves it.
    dirty: bool,
    /// Open handles of the file that wrote.
    writers: u32,
    /// Opens that set the write time explicitly: their writes leave it
    /// (MS-FSA Open.UserSetModificationTime). The entry goes when neither
    /// writers nor these are left.
    user_set: Vec<u64>,
}

#[derive(Default)]
pub struct WriteTimes {
    /// By device and inode, without the generation: an entry is of a
    /// file open on this node, whose inode no other file can take while
    /// it is open; a directory listing, which does not read generations
    /// (`nimbus_vfs::Stat::gen`), finds it.
    files: Mutex<HashMap<(u64, u64), Written>>,
    /// Entries in `files`: reporting paths look no further while it is 0.
    count: AtomicUsize,
}

fn inode(key: FileKey) -> (u64, u64) {
    (key.dev, key.ino)
}

fn now() -> Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

impl WriteTimes {
    /// Before data is written through `open`.
    pub fn before_write(&self, open: &Open) {
        if open.stream.is_some() {
            return;
        }
        let first_of_open = !open.wrote.load(Ordering::Relaxed);
        let mut files = lock(&self.files);
        if let Some(w) = files.get_mut(&inode(open.file_key)) {
            if first_of_open {
                w.writers += 1;
            }
            w.dirty |= !w.user_set.contains(&open.open_id);
            return;
        }
        let Ok(st) = open.handle.stat() else {
            return;
        };
        let shown = st.mtime;
        files.insert(
            inode(open.file_key),
            Written {
                shown,
                due: Some(Instant::now() + DELAY),
                dirty: true,
                writers: 1,
                user_set: Vec::new(),
            },
        );
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Puts the write time clients see of file `key` into `info`, where it
    /// is not the disk's (the file has writers on this node).
    pub fn adjust(&self, key: FileKey, info: &mut FileInfo) {
        if self.count.load(Ordering::Relaxed) == 0 {
            return;
        }
        if let Some(w) = lock(&self.files).get(&inode(key)) {
            info.last_write_time = unix_to_filetime(w.shown.sec, w.shown.nsec);
        }
    }

    /// Before `open`'s file's times are reported: an update now due is
    /// made.
    pub fn settle(&self, open: &Open) {
        self.with(open, |w| {
            if w.due.is_some_and(|d| Instant::now() >= d) {
                update(open, w);
            }
        });
    }

    /// FLUSH, or FileBasicInformation set without a write time: a pending
    /// update is made now.
    pub fn flush(&self, open: &Open) {
        self.with(open, |w| {
            if w.due.is_some() || w.dirty {
                update(open, w);
            }
        });
    }

    /// The size was set (the kernel moved the mtime): the write time is
    /// now, or stays the one this open set explicitly.
    pub fn size_set(&self, open: &Open) {
        self.with(open, |w| {
            if !w.user_set.contains(&open.open_id) {
                update(open, w);
            }
        });
    }

    /// FileBasicInformation set the write time to `t` through `open`: a
    /// pending update is dropped, and `open`'s own writes leave the time.
    pub fn set_explicitly(&self, open: &Open, t: Timespec) {
        if open.stream.is_some() {
            return;
        }
        let mut files = lock(&self.files);
        let w = files.entry(inode(open.file_key)).or_insert_with(|| {
            self.count.fetch_add(1, Ordering::Relaxed);
            Written {
                shown: t,
                due: None,
                dirty: false,
                writers: 0,
                user_set: Vec::new(),
            }
        });
        w.shown = t;
        w.due = None;
        w.dirty = false;
        if !w.user_set.contains(&open.open_id) {
            w.user_set.push(open.open_id);
        }
    }

    /// `open` closes: if it wrote and its file was written since its
    /// write time last moved, the time becomes now (unless this open set
    /// it); the file is forgotten with the last of its writers and setters.
    pub fn closing(&self, open: &Open) {
        if open.stream.is_some() {
            return;
        }
        let mut files = lock(&self.files);
        let Some(w) = files.get_mut(&inode(open.file_key)) else {
            return;
        };
        let set_here = w.user_set.contains(&open.open_id);
        if open.wrote.load(Ordering::Relaxed) {
            if w.dirty && !set_here {
                update(open, w);
            }
            w.writers = w.writers.saturating_sub(1);
        }
        if set_here {
            w.user_set.retain(|id| *id != open.open_id);
        }
        if w.writers == 0 && w.user_set.is_empty() {
            // The disk keeps the time shown from now on.
            let _ = open.handle.set_times(None, Some(w.shown));
            files.remove(&inode(open.file_key));
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn with(&self, open: &Open, f: impl FnOnce(&mut Written)) {
        if open.stream.is_some() {
            return;
        }
        if let Some(w) = lock(&self.files).get_mut(&inode(open.file_key)) {
            f(w);
        }
    }
}

/// Moves the write time of `open`'s file to now.
fn update(open: &Open, w: &mut Written) {
    let t = now();
    if open.handle.set_times(None, Some(t)).is_ok() {
        w.shown = t;
        w.due = None;
        w.dirty = false;
    }
}
