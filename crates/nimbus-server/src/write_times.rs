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
//! The kernel moves a file's mtime on every write, so the time clients
//! should see is put back after each WRITE (one futimens): the disk always
//! holds the time clients see, for other cluster nodes, directory listings
//! and the disk watch alike. What is kept in memory is only which files
//! have a pending update, per node; a node that dies loses nothing a
//! client could tell apart from an update made at its close.
//!
//! Named streams are left alone: their write time is never reported (a
//! stream's times are its file's).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nimbus_state::FileKey;
use nimbus_vfs::Timespec;

use crate::session::{lock, Open};

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
    files: Mutex<HashMap<FileKey, Written>>,
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
    /// Before data is written through `open`: the write time to put back
    /// afterwards (None: leave the kernel's).
    pub fn before_write(&self, open: &Open) -> Option<Timespec> {
        if open.stream.is_some() {
            return None;
        }
        let first_of_open = !open.wrote.load(Ordering::Relaxed);
        let mut files = lock(&self.files);
        if let Some(w) = files.get_mut(&open.file_key) {
            if first_of_open {
                w.writers += 1;
            }
            w.dirty |= !w.user_set.contains(&open.open_id);
            return Some(w.shown);
        }
        let shown = open.handle.stat().ok()?.mtime;
        files.insert(
            open.file_key,
            Written {
                shown,
                due: Some(Instant::now() + DELAY),
                dirty: true,
                writers: 1,
                user_set: Vec::new(),
            },
        );
        Some(shown)
    }

    /// After the write: the kernel's new mtime gives way to the one shown.
    pub fn after_write(&self, open: &Open, shown: Option<Timespec>) {
        if let Some(t) = shown {
            if let Err(e) = open.handle.set_times(None, Some(t)) {
                tracing::debug!("keeping the write time of open {}: {e}", open.open_id);
            }
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
            if w.user_set.contains(&open.open_id) {
                let _ = open.handle.set_times(None, Some(w.shown));
            } else {
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
        let w = files.entry(open.file_key).or_insert_with(|| Written {
            shown: t,
            due: None,
            dirty: false,
            writers: 0,
            user_set: Vec::new(),
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
        let Some(w) = files.get_mut(&open.file_key) else {
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
            files.remove(&open.file_key);
        }
    }

    fn with(&self, open: &Open, f: impl FnOnce(&mut Written)) {
        if open.stream.is_some() {
            return;
        }
        if let Some(w) = lock(&self.files).get_mut(&open.file_key) {
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
