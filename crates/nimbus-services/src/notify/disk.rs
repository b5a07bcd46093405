//! Changes made on the server's disk by anything but Nimbus (another
//! program, another file server on the same directory, an administrator),
//! from the VFS's directory watches (inotify), reported as SMB changes.
//!
//! **Which directories.** A watch (a handle's first CHANGE_NOTIFY, kept
//! until the handle closes, buffering changes between requests) subscribes
//! its directory, or with WATCH_TREE its whole tree, to the VFS; the last
//! subscription of a directory ends its kernel watch. The kernel watches
//! held at once are bounded by `[limits] max_inotify_watches`: a tree
//! bigger than what is left is watched breadth first until the bound, and
//! changes made on disk deeper than that are not seen (changes made through
//! SMB are, everywhere); 0 turns watching the disk off. inotify being
//! unavailable (no kernel support, no descriptor) is logged once, and
//! change notify goes on with SMB changes only.
//!
//! **Reported once.** A change made through SMB is reported by its handler
//! at once (or at close, for writes), and the kernel also queues inotify
//! events for it, often more than one (the file, then the extended
//! attribute holding its DOS attributes, then each write). Matching those
//! against what the handler reported would miss the side effects, and a
//! time window would drop changes made on disk meanwhile. Instead handlers
//! wrap what they do to the disk in `own_change`: the VFS marks the paths
//! before the system calls and, when the guard ends, reads the inotify
//! queue up to what it held then (which holds every event of the change),
//! dropping events for marked paths, before it lifts the marks (the VFS
//! `watch` module has the argument). So an SMB client sees exactly what
//! the SMB handlers report, and the disk adds only what happened
//! elsewhere. The cost, only while a directory concerned is watched on
//! disk: a mark and one read of the queue per SMB change.
//!
//! **Translation** (MS-FSCC 2.7.1 FILE_NOTIFY_INFORMATION actions, MS-SMB2
//! 2.2.35 CompletionFilter): a name made, removed or moved in or out is
//! ADDED or REMOVED under FILE_NAME or DIR_NAME; a rename within one
//! directory is RENAMED_OLD_NAME then RENAMED_NEW_NAME, across two REMOVED
//! then ADDED (as SMB renames are reported); data written is MODIFIED under
//! SIZE and LAST_WRITE; a metadata change is MODIFIED under every class a
//! metadata change can be, for inotify does not say which it was (missing
//! one would leave a client stale, an extra one costs it a refresh).

use std::sync::{Arc, Weak};

use nimbus_vfs::{DirWatcher, FsChange, FsEvent, LocalFs, Notice, OwnChange};
use nimbus_wire::notify::{completion_filter as cf, NotifyAction};

use super::{name_filter, parent_of, Change, ChangeNotify, Completion};
use crate::open::Open;
use crate::share::Share;

/// What a change of data is: IN_MODIFY (a write, a truncation).
pub(super) const WRITE_CLASSES: u32 = cf::SIZE | cf::LAST_WRITE;

/// What a metadata change may be: IN_ATTRIB (mode, owner, times,
/// extended attributes, where Nimbus keeps DOS attributes and creation
/// time, or link count).
pub(super) const METADATA_CLASSES: u32 =
    cf::ATTRIBUTES | cf::LAST_WRITE | cf::LAST_ACCESS | cf::CREATION | cf::EA | cf::SECURITY;

/// The entries one change on disk makes, with the classes they belong to.
pub(super) fn changes_of(ev: &FsEvent) -> Vec<Change<'_>> {
    let names = name_filter(ev.is_dir);
    let one = |action, filter| {
        vec![Change {
            action,
            filter,
            path: &ev.path,
        }]
    };
    match &ev.change {
        FsChange::Created | FsChange::MovedIn => one(NotifyAction::Added, names),
        FsChange::Removed | FsChange::MovedOut => one(NotifyAction::Removed, names),
        FsChange::Written => one(NotifyAction::Modified, WRITE_CLASSES),
        FsChange::Metadata => one(NotifyAction::Modified, METADATA_CLASSES),
        FsChange::Renamed { from } => {
            let (old, new) = if parent_of(from) == parent_of(&ev.path) {
                (NotifyAction::RenamedOldName, NotifyAction::RenamedNewName)
            } else {
                (NotifyAction::Removed, NotifyAction::Added)
            };
            vec![
                Change {
                    action: old,
                    filter: names,
                    path: from,
                },
                Change {
                    action: new,
                    filter: names,
                    path: &ev.path,
                },
            ]
        }
    }
}

impl ChangeNotify {
    /// The disk watcher, started on first use.
    fn disk(self: &Arc<Self>) -> Option<&DirWatcher> {
        self.disk
            .get_or_init(|| start(self.max_disk_watches, Arc::downgrade(self)))
            .as_ref()
    }

    /// The disk watcher if it runs.
    pub(super) fn disk_watcher(&self) -> Option<&DirWatcher> {
        self.disk.get().and_then(Option::as_ref)
    }

    /// Subscribes watch `open_id`'s directory `dir` (a tree with `tree`).
    pub(super) fn watch_disk(self: &Arc<Self>, open_id: u64, fs: &LocalFs, dir: &str, tree: bool) {
        let Some(disk) = self.disk() else {
            return;
        };
        let subscribe = || disk.subscribe(fs, dir, tree);
        // A tree is walked, one kernel watch per directory: 150 ms for
        // 8192 directories on a local file system (18 µs each: open beneath
        // the root, add the watch, list). CHANGE_NOTIFY runs on the
        // connection's reader task, which keeps a connection's requests in
        // order (a CLOSE after it must find its watch), so the walk stays
        // there, and the runtime moves the worker's other tasks away.
        let sub = if tree {
            nimbus_state::blocking::off_worker(subscribe)
        } else {
            subscribe()
        };
        let Some(sub) = sub else {
            return;
        };
        let kept = match self.watches().by_open.get_mut(&open_id) {
            Some(watch) => {
                watch.disk = Some(sub);
                true
            }
            // Its handle closed while the tree was walked.
            None => false,
        };
        if !kept {
            disk.unsubscribe(sub);
        }
    }

    /// Marks `paths` of `share` as changed through SMB until the guard is
    /// dropped: hold it across the disk calls, and the changes are
    /// reported by the handler only (see the module comment). None while
    /// nothing is watched on disk.
    pub fn own_change(&self, share: &Share, paths: &[&str]) -> Option<OwnChange> {
        let disk = self.disk_watcher()?;
        if disk.watch_count() == 0 {
            return None;
        }
        Some(disk.own_change(share.fs.as_ref()?.root_path(), paths))
    }

    /// [`ChangeNotify::own_change`] of `open`'s path (its name is looked up
    /// only while something is watched on disk: WRITE comes here).
    pub fn own_change_of(&self, open: &Open) -> Option<OwnChange> {
        let disk = self.disk_watcher()?;
        if disk.watch_count() == 0 {
            return None;
        }
        let path = open.path();
        Some(disk.own_change(open.share.fs.as_ref()?.root_path(), &[&path]))
    }

    /// What the disk watcher reports.
    fn on_disk(&self, notice: Notice) {
        match notice {
            Notice::Changes(events) => {
                for ev in &events {
                    // The store of named streams is the server's own.
                    if ev.path.split('/').next() == Some(nimbus_vfs::STORE_DIR) {
                        continue;
                    }
                    self.deliver_local(&ev.root, &changes_of(ev));
                    // Watches of a directory renamed on disk follow it,
                    // as they follow one renamed through SMB.
                    if let (true, FsChange::Renamed { from }) = (ev.is_dir, &ev.change) {
                        self.move_watches(&ev.root, from, &ev.path);
                    }
                }
            }
            Notice::Overflow => self.overflow_disk_watches(),
        }
    }

    /// inotify lost events: every watch it serves gets
    /// STATUS_NOTIFY_ENUM_DIR, the answer to changes it cannot list.
    fn overflow_disk_watches(&self) {
        let done: Vec<Completion> = {
            let mut w = self.watches();
            let ids: Vec<u64> = w
                .by_open
                .iter()
                .filter(|(_, watch)| watch.disk.is_some())
                .map(|(&id, _)| id)
                .collect();
            ids.into_iter().filter_map(|id| w.overflow(id)).collect()
        };
        for c in done {
            c.send();
        }
    }
}

/// The watcher, whose notices go to `notify` while it lives.
fn start(limit: usize, notify: Weak<ChangeNotify>) -> Option<DirWatcher> {
    if limit == 0 {
        tracing::info!(
            "change notify: [limits] max_inotify_watches = 0, changes made on disk outside SMB \
             are not reported"
        );
        return None;
    }
    // Completing a request may hand work to the runtime (the rest of a
    // compound chain): from the watcher's thread too, never run in place
    // under the watcher's lock.
    let runtime = tokio::runtime::Handle::try_current().ok();
    let sink = move |notice| {
        let _in_runtime = runtime.as_ref().map(|rt| rt.enter());
        if let Some(notify) = notify.upgrade() {
            notify.on_disk(notice);
        }
    };
    match DirWatcher::new(limit, sink) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "change notify: cannot watch the disk with inotify ({e}); only changes made \
                 through SMB are reported"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ev(path: &str, is_dir: bool, change: FsChange) -> FsEvent {
        FsEvent {
            root: Arc::from(Path::new("/srv")),
            path: path.into(),
            is_dir,
            change,
        }
    }

    fn entries(e: &FsEvent) -> Vec<(NotifyAction, u32, &str)> {
        changes_of(e)
            .into_iter()
            .map(|c| (c.action, c.filter, c.path))
            .collect()
    }

    #[test]
    fn names_coming_and_going_are_added_and_removed() {
        use NotifyAction::*;
        let cases = [
            (FsChange::Created, false, Added, cf::FILE_NAME),
            (FsChange::Created, true, Added, cf::DIR_NAME),
            (FsChange::MovedIn, false, Added, cf::FILE_NAME),
            (FsChange::Removed, false, Removed, cf::FILE_NAME),
            (FsChange::Removed, true, Removed, cf::DIR_NAME),
            (FsChange::MovedOut, true, Removed, cf::DIR_NAME),
        ];
        for (change, is_dir, action, filter) in cases {
            let e = ev("d/x", is_dir, change.clone());
            assert_eq!(entries(&e), [(action, filter, "d/x")], "{change:?}");
        }
    }

    #[test]
    fn writes_and_metadata_are_modified_in_their_classes() {
        let w = ev("d/f", false, FsChange::Written);
        assert_eq!(
            entries(&w),
            [(NotifyAction::Modified, cf::SIZE | cf::LAST_WRITE, "d/f")]
        );
        let m = ev("d/f", false, FsChange::Metadata);
        let [(action, filter, _)] = entries(&m)[..] else {
            panic!("one entry expected");
        };
        assert_eq!(action, NotifyAction::Modified);
        for class in [cf::ATTRIBUTES, cf::LAST_WRITE, cf::SECURITY, cf::EA] {
            assert_ne!(filter & class, 0);
        }
        // Not a name change, nor a size change: a watch of names only, or
        // of sizes only, is not woken by a chmod.
        assert_eq!(filter & (cf::FILE_NAME | cf::DIR_NAME | cf::SIZE), 0);
    }

    #[test]
    fn renames_are_old_and_new_name_within_a_directory() {
        use NotifyAction::*;
        let within = ev(
            "d/new",
            false,
            FsChange::Renamed {
                from: "d/old".into(),
            },
        );
        assert_eq!(
            entries(&within),
            [
                (RenamedOldName, cf::FILE_NAME, "d/old"),
                (RenamedNewName, cf::FILE_NAME, "d/new")
            ]
        );
        let across = ev(
            "e/sub",
            true,
            FsChange::Renamed {
                from: "d/sub".into(),
            },
        );
        assert_eq!(
            entries(&across),
            [
                (Removed, cf::DIR_NAME, "d/sub"),
                (Added, cf::DIR_NAME, "e/sub")
            ]
        );
        // The share root is a directory like any other.
        let top = ev("b", false, FsChange::Renamed { from: "a".into() });
        assert_eq!(entries(&top)[0].0, RenamedOldName);
    }
}
