//! Directory watches: changes made to a share's directories by anyone but
//! this process's own calls, from Linux inotify(7).
//!
//! A caller subscribes to a directory, or to a whole tree, and gets every
//! change to the entries of the watched directories (created, removed,
//! written, metadata changed, renamed) as [`FsEvent`]s through one sink.
//! Kernel watches are shared and counted: a directory watched by many
//! subscriptions has one, and it ends with the last. At most `limit`
//! directories are watched in the kernel at once; past that (or past the
//! kernel's own `fs.inotify.max_user_watches`) a directory simply gets no
//! watch, which is logged once: changes on disk there go unseen.
//!
//! **The process's own changes.** A caller that changes the file system
//! itself (the SMB server, which reports its clients' changes on its own)
//! wraps the change in [`DirWatcher::own_change`] naming the paths it
//! touches. inotify does not say which process made a change, so the
//! watcher tells them apart by path and by order instead, using the
//! kernel's queue as the clock. When the guard is made, the queue is read
//! (so that changes made on disk before are reported as such) and the
//! paths are marked, *before* the system calls; their events, queued by the
//! kernel before each call returns, find the marks however soon they are
//! read. When the guard ends, the queue is read up to what it held at that
//! moment, which includes every event of the change, and only then are the
//! marks lifted. No timer is involved, so a change made on disk right after
//! (even to the same name) is reported, and nothing of the process's own
//! change leaks, side effects included (the extended attribute written
//! beside a new file, each write). What cannot be told apart: a change made
//! on disk to the very path the process is changing at that instant, which
//! is taken for the process's own.
//!
//! **Order and bounds.** Events are read by one dedicated thread (blocking
//! in `poll`, never a runtime worker), or by the thread ending an
//! `own_change`, always under one lock, so changes reach the sink in the
//! kernel's order. The kernel queue is bounded (`max_queued_events`); when
//! it overflows, the sink gets [`Notice::Overflow`]. Records the watcher
//! does not understand are skipped; nothing in a record can panic it.

mod events;
pub(crate) mod raw;
mod table;

#[cfg(test)]
mod tests;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{VfsError, VfsResult};
use crate::LocalFs;
use events::Held;
use raw::{Inotify, RawEvent, READ_BUFFER};
use table::Table;

/// How long the first half of a rename waits for its second before it is
/// taken for a move out of sight. The kernel queues both within one
/// rename(2), so the second is there within microseconds when it exists.
const PAIR_WAIT: Duration = Duration::from_millis(20);

/// A change to an entry of a watched directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsChange {
    /// IN_CREATE: a new name (file, directory, link).
    Created,
    /// IN_DELETE.
    Removed,
    /// IN_MODIFY: data written, or the size changed.
    Written,
    /// IN_ATTRIB: permissions, owner, timestamps, extended attributes or
    /// link count; inotify does not say which.
    Metadata,
    /// Renamed from `from` (share-relative), both names watched.
    Renamed { from: String },
    /// Moved to a place no watch sees.
    MovedOut,
    /// Moved in from a place no watch sees.
    MovedIn,
}

/// One change, named by share-relative path ('/'-separated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsEvent {
    /// The share root the path is relative to ([`LocalFs::root_path`]).
    pub root: Arc<Path>,
    pub path: String,
    pub is_dir: bool,
    pub change: FsChange,
}

/// What the sink receives.
#[derive(Debug)]
pub enum Notice {
    /// Changes, in the order they were made.
    Changes(Vec<FsEvent>),
    /// The kernel's queue overflowed: changes to any watched directory may
    /// have been lost.
    Overflow,
}

/// A subscription to one directory or tree; end it with
/// [`DirWatcher::unsubscribe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Subscription(u64);

/// The watches of one process (one inotify descriptor, one reader thread).
pub struct DirWatcher {
    inner: Arc<Inner>,
}

struct Inner {
    ino: Inotify,
    table: Mutex<Table>,
    reading: Mutex<Reading>,
    sink: Box<dyn Fn(Notice) + Send + Sync>,
    /// Kernel watches held (the table's count): while none, `own_change`
    /// takes no lock.
    active: AtomicUsize,
    /// Wakes the reader thread (to stop, or to time a held rename half).
    wake: OwnedFd,
    stop: AtomicBool,
}

struct Reading {
    buf: Vec<u8>,
    held: Option<Held>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl DirWatcher {
    /// Starts watching (nothing yet): an inotify descriptor and the thread
    /// that reads it. `limit` bounds the kernel watches held at once;
    /// `sink` gets every change and must not call back into this watcher's
    /// [`DirWatcher::own_change`].
    pub fn new(limit: usize, sink: impl Fn(Notice) + Send + Sync + 'static) -> VfsResult<Self> {
        let ino = Inotify::new().map_err(VfsError::from_errno)?;
        // SAFETY: plain system call without pointers.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(VfsError::last());
        }
        let inner = Arc::new(Inner {
            ino,
            table: Mutex::new(Table::new(limit)),
            reading: Mutex::new(Reading {
                buf: vec![0; READ_BUFFER],
                held: None,
            }),
            sink: Box::new(sink),
            active: AtomicUsize::new(0),
            // SAFETY: wake is a fresh descriptor owned by nobody else.
            wake: unsafe { OwnedFd::from_raw_fd(wake) },
            stop: AtomicBool::new(false),
        });
        let reader = inner.clone();
        std::thread::Builder::new()
            .name("nimbus-inotify".into())
            .spawn(move || reader.run())
            .map_err(VfsError::Io)?;
        Ok(DirWatcher { inner })
    }

    /// Watches directory `dir` of `fs` (with `tree`, every directory
    /// beneath too, and those made later). None if the share cannot be
    /// watched at all; a directory that could not get its kernel watch
    /// (missing, or the limit reached) still gets its subscription.
    pub fn subscribe(&self, fs: &LocalFs, dir: &str, tree: bool) -> Option<Subscription> {
        let mut t = lock(&self.inner.table);
        let root = t.root_of(fs)?;
        let id = t.subscribe(&self.inner.ino, root, dir, tree);
        self.inner.counted(&t);
        Some(Subscription(id))
    }

    pub fn unsubscribe(&self, sub: Subscription) {
        let mut t = lock(&self.inner.table);
        t.unsubscribe(&self.inner.ino, sub.0);
        self.inner.counted(&t);
    }

    /// The caller renamed directory `from` to `to` beneath share `root`:
    /// watches and subscriptions there follow (a rename seen by inotify in
    /// both directories is followed on its own; saying it twice is
    /// harmless).
    pub fn moved(&self, root: &Path, from: &str, to: &str) {
        let mut t = lock(&self.inner.table);
        if let Some(r) = t.find_root(root) {
            t.moved(&self.inner.ino, r, from, to);
            self.inner.counted(&t);
        }
    }

    /// The caller is about to change `paths` beneath share `root` itself:
    /// inotify events for them are not reported until the guard ends (see
    /// the module comment). Costs nothing unless one of the paths, or its
    /// directory, is watched; then two reads of the queue (each one
    /// FIONREAD when it is empty) and the marks.
    pub fn own_change(&self, root: &Path, paths: &[&str]) -> OwnChange {
        let inert = OwnChange { inner: None };
        if self.inner.active.load(Ordering::Acquire) == 0 {
            return inert;
        }
        let r = {
            let t = lock(&self.inner.table);
            let Some(r) = t.find_root(root) else {
                return inert;
            };
            let watched = paths
                .iter()
                .any(|p| t.is_watched(r, p) || parent_of(p).is_some_and(|d| t.is_watched(r, d)));
            if !watched {
                return inert;
            }
            r
        };
        // Changes made on disk before this one are reported as such, not
        // taken for this change's by the marks.
        self.inner.drain();
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        lock(&self.inner.table).mark(r, &paths);
        OwnChange {
            inner: Some((self.inner.clone(), r, paths)),
        }
    }

    /// Directories watched in the kernel now.
    pub fn watch_count(&self) -> usize {
        self.inner.active.load(Ordering::Acquire)
    }
}

impl Drop for DirWatcher {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake();
    }
}

/// Marks paths as being changed by this process; see
/// [`DirWatcher::own_change`].
#[must_use = "the marks end when the guard is dropped"]
pub struct OwnChange {
    inner: Option<(Arc<Inner>, usize, Vec<String>)>,
}

impl Drop for OwnChange {
    fn drop(&mut self) {
        if let Some((inner, root, paths)) = self.inner.take() {
            // Every event of the change is queued by now: read them while
            // the marks still stand.
            inner.drain();
            lock(&inner.table).unmark(root, &paths);
        }
    }
}

impl Inner {
    fn counted(&self, t: &Table) {
        self.active.store(t.watch_count(), Ordering::Release);
    }

    fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64. A full counter (EAGAIN)
        // still leaves the reader woken.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Reads the events queued when it starts (at least those: an event of
    /// a change made before the call is among them) and reports them.
    fn drain(&self) {
        let mut guard = lock(&self.reading);
        let reading = &mut *guard;
        let queued = self.ino.queued();
        let mut batch: Vec<RawEvent> = Vec::new();
        let mut got = 0;
        loop {
            match self.ino.read(&mut reading.buf) {
                Ok(0) => break,
                Ok(n) => {
                    raw::parse(&reading.buf[..n], &mut batch);
                    got += n;
                    // Later events are the next drain's: a busy disk does
                    // not keep this caller reading.
                    if got >= queued {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!("change notify: reading inotify: errno {e}");
                    break;
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        let out = {
            let mut t = lock(&self.table);
            let out = events::process(&mut t, &self.ino, &batch, &mut reading.held);
            self.counted(&t);
            out
        };
        let held = reading.held.is_some();
        // Still under `reading`: the sink sees changes in order.
        self.deliver(out);
        drop(guard);
        if held {
            // The reader times the wait for the other half.
            self.wake();
        }
    }

    /// Gives up on a held rename half that waited long enough.
    fn flush_held(&self) {
        let mut guard = lock(&self.reading);
        if guard
            .held
            .as_ref()
            .is_none_or(|h| h.since.elapsed() < PAIR_WAIT)
        {
            return;
        }
        let out = {
            let mut t = lock(&self.table);
            let out = events::flush(&mut t, &self.ino, &mut guard.held);
            self.counted(&t);
            out
        };
        self.deliver(out);
    }

    fn deliver(&self, out: events::Output) {
        if !out.events.is_empty() {
            (self.sink)(Notice::Changes(out.events));
        }
        if out.overflow {
            (self.sink)(Notice::Overflow);
        }
    }

    /// The reader thread: waits for events (or a wake-up), drains them.
    fn run(&self) {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let timeout = match &lock(&self.reading).held {
                Some(h) => PAIR_WAIT.saturating_sub(h.since.elapsed()).as_millis() as i32 + 1,
                None => -1,
            };
            let mut fds = [
                libc::pollfd {
                    fd: self.ino.raw(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: fds is a valid array of two pollfd.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if n < 0 {
                if crate::sys::errno() != libc::EINTR {
                    // Never spin on a failing poll.
                    std::thread::sleep(Duration::from_millis(100));
                }
                continue;
            }
            if fds[1].revents != 0 {
                let mut count = [0u8; 8];
                // SAFETY: reads 8 bytes into a valid buffer (resets the counter).
                unsafe { libc::read(self.wake.as_raw_fd(), count.as_mut_ptr().cast(), 8) };
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if fds[0].revents & (libc::POLLERR | libc::POLLNVAL) != 0 {
                // Not seen from inotify; should it come, no spinning.
                tracing::warn!("change notify: the inotify descriptor failed; disk changes stop");
                return;
            }
            if fds[0].revents != 0 {
                self.drain();
            }
            self.flush_held();
        }
    }
}

/// `name` in directory `dir` ("" is the root).
fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The directory holding `path`; None for the root.
fn parent_of(path: &str) -> Option<&str> {
    if path.is_empty() {
        return None;
    }
    Some(path.rsplit_once('/').map_or("", |(dir, _)| dir))
}

/// Whether `path` is `prefix` or beneath it.
fn is_beneath(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}
