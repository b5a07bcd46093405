//! Which directories are watched in the kernel and why: the subscriptions
//! (a directory, or a whole tree), the kernel watches they need, and the
//! paths this process is changing itself (marks).
//!
//! Everything is named by share-relative path, as the server names it, and
//! every kernel watch is added on a directory opened beneath its share root
//! (`openat2` with RESOLVE_BENEATH; a tree's directories only as real
//! directories, never through a symlink), so no watch reaches outside a
//! share. Paths go
//! stale when a watched directory moves; `moved` follows renames seen
//! (through SMB or as a paired inotify rename), and a directory that moves
//! where no watch sees it loses its watches (see `self_moved`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use super::raw::Inotify;
use super::{is_beneath, join, parent_of};
use crate::handle::{Access, FileHandle};
use crate::sys::{self, cstring, openat2_beneath};
use crate::LocalFs;

/// One share root, by its path (shares on the same directory share one).
pub(crate) struct Root {
    pub path: Arc<Path>,
    /// A duplicate of the share's root descriptor: directories are opened
    /// beneath it.
    fd: OwnedFd,
    /// Kernel watches by directory path.
    by_path: HashMap<String, i32>,
    /// Subscriptions per directory path: (directory only, whole tree).
    cover: HashMap<String, (u32, u32)>,
    /// Paths being changed by this process now, with how many changes.
    marks: HashMap<String, u32>,
}

/// One kernel watch.
struct Dir {
    root: usize,
    path: String,
    /// (device, inode) when added: a moved directory is told by it.
    id: (u64, u64),
}

struct Sub {
    root: usize,
    path: String,
    tree: bool,
}

/// What a directory needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    Nothing,
    /// A kernel watch of its own (a subscription of just this directory).
    Watch,
    /// A watch for it and every directory beneath (a tree subscription at
    /// it or above it).
    Tree,
}

pub(crate) struct Table {
    pub roots: Vec<Root>,
    dirs: HashMap<i32, Dir>,
    subs: HashMap<u64, Sub>,
    next_sub: u64,
    /// The most kernel watches held at once.
    limit: usize,
    /// The limit (ours or the kernel's) was reported once.
    warned: bool,
}

impl Table {
    pub(crate) fn new(limit: usize) -> Table {
        Table {
            roots: Vec::new(),
            dirs: HashMap::new(),
            subs: HashMap::new(),
            next_sub: 1,
            limit,
            warned: false,
        }
    }

    pub(crate) fn watch_count(&self) -> usize {
        self.dirs.len()
    }

    /// The index of `fs`'s root, registered on first use.
    pub(crate) fn root_of(&mut self, fs: &LocalFs) -> Option<usize> {
        if let Some(i) = self.find_root(fs.root_path()) {
            return Some(i);
        }
        let fd = match fs.root_fd().try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                tracing::warn!(
                    "change notify: cannot watch {}: {e}",
                    fs.root_path().display()
                );
                return None;
            }
        };
        self.roots.push(Root {
            path: Arc::from(fs.root_path()),
            fd,
            by_path: HashMap::new(),
            cover: HashMap::new(),
            marks: HashMap::new(),
        });
        Some(self.roots.len() - 1)
    }

    pub(crate) fn find_root(&self, path: &Path) -> Option<usize> {
        self.roots.iter().position(|r| &*r.path == path)
    }

    /// The share-relative path of entry `name` of watch `wd`, with its root;
    /// None for a watch no longer kept, or a name no client can use (not
    /// UTF-8, empty, a path).
    pub(crate) fn entry(&self, wd: i32, name: &[u8]) -> Option<(usize, String)> {
        let dir = self.dirs.get(&wd)?;
        let name = std::str::from_utf8(name).ok()?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return None;
        }
        Some((dir.root, join(&dir.path, name)))
    }

    /// The root and path of watch `wd`.
    pub(crate) fn dir(&self, wd: i32) -> Option<(usize, &str)> {
        self.dirs.get(&wd).map(|d| (d.root, d.path.as_str()))
    }

    pub(crate) fn is_watched(&self, root: usize, path: &str) -> bool {
        self.roots[root].by_path.contains_key(path)
    }

    // --- subscriptions -------------------------------------------------

    pub(crate) fn subscribe(&mut self, ino: &Inotify, root: usize, path: &str, tree: bool) -> u64 {
        let id = self.next_sub;
        self.next_sub += 1;
        self.subs.insert(
            id,
            Sub {
                root,
                path: path.to_string(),
                tree,
            },
        );
        let c = self.roots[root].cover.entry(path.to_string()).or_default();
        if tree {
            c.1 += 1;
        } else {
            c.0 += 1;
        }
        self.grow(ino, root, path);
        id
    }

    pub(crate) fn unsubscribe(&mut self, ino: &Inotify, id: u64) {
        let Some(sub) = self.subs.remove(&id) else {
            return;
        };
        let cover = &mut self.roots[sub.root].cover;
        if let Some(c) = cover.get_mut(&sub.path) {
            if sub.tree {
                c.1 = c.1.saturating_sub(1);
            } else {
                c.0 = c.0.saturating_sub(1);
            }
            if *c == (0, 0) {
                cover.remove(&sub.path);
            }
        }
        self.prune(ino, sub.root, &sub.path, false);
    }

    /// What `path` needs, from the subscriptions at it and above it.
    pub(crate) fn need(&self, root: usize, path: &str) -> Need {
        let cover = &self.roots[root].cover;
        let mut need = match cover.get(path) {
            Some(&(_, tree)) if tree > 0 => return Need::Tree,
            Some(&(plain, _)) if plain > 0 => Need::Watch,
            _ => Need::Nothing,
        };
        let mut at = path;
        while let Some(up) = parent_of(at) {
            if cover.get(up).is_some_and(|&(_, tree)| tree > 0) {
                need = Need::Tree;
                break;
            }
            at = up;
        }
        need
    }

    // --- kernel watches ----------------------------------------------

    /// Adds the watches `path` needs: its own, and for a tree every
    /// directory beneath, breadth first, until the limit.
    pub(crate) fn grow(&mut self, ino: &Inotify, root: usize, path: &str) {
        match self.need(root, path) {
            Need::Nothing => {}
            Need::Watch => {
                self.add(ino, root, path, true);
            }
            Need::Tree => self.walk(ino, root, path),
        }
    }

    fn walk(&mut self, ino: &Inotify, root: usize, top: &str) {
        let mut queue = VecDeque::from([top.to_string()]);
        let mut first = true;
        // However the tree loops back on itself (a bind mount), the walk
        // ends.
        let mut steps = self.limit.saturating_mul(2);
        while let Some(path) = queue.pop_front() {
            steps = match steps.checked_sub(1) {
                Some(s) => s,
                None => return,
            };
            // The subscribed directory is reached as the client reached it
            // (a symlink inside the share followed); directories beneath it
            // were listed as real directories, and are opened only if the
            // name still is one.
            let Some(fd) = self.add(ino, root, &path, first) else {
                if first || self.dirs.len() >= self.limit {
                    return;
                }
                continue;
            };
            first = false;
            // One name more than there is room for tells that the tree
            // does not fit.
            let room = self.limit.saturating_sub(self.dirs.len() + queue.len());
            let handle = FileHandle::new(fd, true, Access::None);
            match handle.subdirectory_names(room + 1) {
                Ok(mut names) => {
                    if names.len() > room {
                        names.truncate(room);
                        self.warn_limit();
                    }
                    queue.extend(names.iter().map(|n| join(&path, n)));
                }
                Err(e) => tracing::debug!("change notify: listing {path}: {e}"),
            }
        }
    }

    fn warn_limit(&mut self) {
        let n = self.dirs.len();
        self.warn_once(format_args!(
            "{n} directories are watched on disk, the most [limits] max_inotify_watches allows"
        ));
    }

    /// Watches directory `path` (already watched: nothing to do). Returns
    /// the directory, opened for listing, when a watch is in place under
    /// this name.
    fn add(&mut self, ino: &Inotify, root: usize, path: &str, follow: bool) -> Option<OwnedFd> {
        let r = &self.roots[root];
        let cpath = match path {
            "" => c".".to_owned(),
            p => cstring(p).ok()?,
        };
        let mut flags = libc::O_RDONLY | libc::O_DIRECTORY;
        if !follow {
            flags |= libc::O_NOFOLLOW;
        }
        let fd = match openat2_beneath(r.fd.as_raw_fd(), &cpath, flags, 0) {
            Ok(fd) => fd,
            // Gone or replaced meanwhile: nothing to watch.
            Err(e) => {
                tracing::debug!("change notify: opening {path} to watch it: errno {e}");
                return None;
            }
        };
        if r.by_path.contains_key(path) {
            return Some(fd);
        }
        if self.dirs.len() >= self.limit {
            self.warn_limit();
            return None;
        }
        // The directory is open, so a failure here is inotify's (or a
        // missing /proc), not the directory's.
        let wd = match ino.add(&fd) {
            Ok(wd) => wd,
            Err(libc::ENOSPC) => {
                self.warn_once(format_args!(
                    "the kernel's inotify watch limit is reached (sysctl fs.inotify.max_user_watches)"
                ));
                return None;
            }
            Err(e) => {
                self.warn_once(format_args!(
                    "adding an inotify watch through /proc/self/fd failed: {}",
                    std::io::Error::from_raw_os_error(e)
                ));
                return None;
            }
        };
        let st = sys::fstat_raw(fd.as_raw_fd()).ok()?;
        let id = (st.st_dev, st.st_ino);
        if let Some(old) = self.dirs.get(&wd) {
            // The same directory under another name (a bind mount, or a
            // symlink followed at the top): it keeps its first name, and
            // is not walked again under this one.
            if old.id == id {
                return None;
            }
            // A watch number the kernel handed out again.
            let (old_root, old_path) = (old.root, old.path.clone());
            self.roots[old_root].by_path.remove(&old_path);
        }
        self.roots[root].by_path.insert(path.to_string(), wd);
        self.dirs.insert(
            wd,
            Dir {
                root,
                path: path.to_string(),
                id,
            },
        );
        Some(fd)
    }

    fn warn_once(&mut self, what: std::fmt::Arguments<'_>) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                "change notify: {what}; changes made on disk in directories not yet watched are \
                 not reported (changes made through SMB still are)"
            );
        }
    }

    /// Ends the watches at and beneath `prefix` that nothing needs any
    /// more, or all of them (`all`).
    pub(crate) fn prune(&mut self, ino: &Inotify, root: usize, prefix: &str, all: bool) {
        let doomed: Vec<(String, i32)> = self.roots[root]
            .by_path
            .iter()
            .filter(|(p, _)| is_beneath(p, prefix))
            .filter(|(p, _)| all || self.need(root, p) == Need::Nothing)
            .map(|(p, &wd)| (p.clone(), wd))
            .collect();
        for (path, wd) in doomed {
            ino.remove(wd);
            self.roots[root].by_path.remove(&path);
            self.dirs.remove(&wd);
        }
    }

    /// The kernel ended watch `wd` (IN_IGNORED): its directory is gone.
    pub(crate) fn forget(&mut self, wd: i32) {
        if let Some(d) = self.dirs.remove(&wd) {
            self.roots[d.root].by_path.remove(&d.path);
        }
    }

    /// Directory `from` is now `to`: the watches and subscriptions at and
    /// beneath it take the new names; then what the new place needs is
    /// added, and what it no longer needs ended.
    pub(crate) fn moved(&mut self, ino: &Inotify, root: usize, from: &str, to: &str) {
        if from == to || is_beneath(to, from) {
            return;
        }
        let rename = |p: &str| -> Option<String> {
            if p == from {
                Some(to.to_string())
            } else {
                p.strip_prefix(from)
                    .and_then(|rest| rest.strip_prefix('/'))
                    .map(|rest| join(to, rest))
            }
        };
        let r = &mut self.roots[root];
        let moved: Vec<(String, String)> = r
            .by_path
            .keys()
            .filter_map(|p| rename(p).map(|n| (p.clone(), n)))
            .collect();
        for (old, new) in moved {
            if let Some(wd) = r.by_path.remove(&old) {
                r.by_path.insert(new.clone(), wd);
                if let Some(d) = self.dirs.get_mut(&wd) {
                    d.path = new;
                }
            }
        }
        let covers: Vec<(String, String)> = r
            .cover
            .keys()
            .filter_map(|p| rename(p).map(|n| (p.clone(), n)))
            .collect();
        for (old, new) in covers {
            if let Some(c) = r.cover.remove(&old) {
                let e = r.cover.entry(new).or_default();
                e.0 += c.0;
                e.1 += c.1;
            }
        }
        for sub in self.subs.values_mut().filter(|s| s.root == root) {
            if let Some(n) = rename(&sub.path) {
                sub.path = n;
            }
        }
        self.prune(ino, root, to, false);
        self.grow(ino, root, to);
    }

    /// Watch `wd`'s directory moved. If its path still leads to it, the
    /// move was seen and followed; otherwise it went where no watch sees
    /// (perhaps out of the share): its watches and those beneath end, for
    /// their paths no longer say where their events happen.
    pub(crate) fn self_moved(&mut self, ino: &Inotify, wd: i32) {
        let Some(d) = self.dirs.get(&wd) else {
            return;
        };
        let (root, path, id) = (d.root, d.path.clone(), d.id);
        if path.is_empty() {
            // The share root is reached through its descriptor, wherever it is.
            return;
        }
        let r = &self.roots[root];
        let here = cstring(&path).ok().and_then(|c| {
            let fd = openat2_beneath(r.fd.as_raw_fd(), &c, libc::O_PATH, 0).ok()?;
            let st = sys::fstat_raw(fd.as_raw_fd()).ok()?;
            Some((st.st_dev, st.st_ino))
        });
        if here != Some(id) {
            self.prune(ino, root, &path, true);
        }
    }

    // --- marks ---------------------------------------------------------

    pub(crate) fn mark(&mut self, root: usize, paths: &[String]) {
        for p in paths {
            *self.roots[root].marks.entry(p.clone()).or_default() += 1;
        }
    }

    pub(crate) fn unmark(&mut self, root: usize, paths: &[String]) {
        let marks = &mut self.roots[root].marks;
        for p in paths {
            if let Some(n) = marks.get_mut(p) {
                *n -= 1;
                if *n == 0 {
                    marks.remove(p);
                }
            }
        }
    }

    pub(crate) fn is_marked(&self, root: usize, path: &str) -> bool {
        self.roots[root].marks.contains_key(path)
    }
}
