//! From inotify records to changes: names resolved through the watch table,
//! the two halves of a rename paired by cookie, the process's own changes
//! (marked paths) dropped, and the watch table kept in step (new
//! directories of a watched tree watched before their creation is told,
//! renamed ones followed, vanished ones forgotten).

use std::time::Instant;

use super::raw::{classify, is_dir, Inotify, Kind, RawEvent};
use super::table::Table;
use super::{FsChange, FsEvent};

/// A rename's first half whose second may still be on its way: the kernel
/// queues MOVED_FROM and MOVED_TO one after the other, so a read can end
/// between them.
pub(crate) struct Held {
    cookie: u32,
    root: usize,
    path: String,
    is_dir: bool,
    own: bool,
    pub since: Instant,
}

/// What a batch of records comes to.
#[derive(Default)]
pub(crate) struct Output {
    pub events: Vec<FsEvent>,
    /// The kernel dropped events (IN_Q_OVERFLOW).
    pub overflow: bool,
}

impl Output {
    fn push(&mut self, t: &Table, root: usize, path: String, is_dir: bool, change: FsChange) {
        let e = FsEvent {
            root: t.roots[root].path.clone(),
            path,
            is_dir,
            change,
        };
        // A file written in many pieces is one change to report.
        let repeat = matches!(e.change, FsChange::Written | FsChange::Metadata)
            && self.events.last() == Some(&e);
        if !repeat {
            self.events.push(e);
        }
    }
}

/// Turns `batch` into changes; `held` carries an unpaired MOVED_FROM that
/// ended one batch into the next, where its MOVED_TO is looked for first.
pub(crate) fn process(
    t: &mut Table,
    ino: &Inotify,
    batch: &[RawEvent],
    held: &mut Option<Held>,
) -> Output {
    let mut out = Output::default();
    let mut used = vec![false; batch.len()];
    if let Some(h) = held.take() {
        match pair_of(batch, &used, 0, h.cookie) {
            Some(j) => {
                used[j] = true;
                rename(t, ino, &mut out, h, &batch[j]);
            }
            None => moved_out(t, ino, &mut out, h),
        }
    }
    for (i, ev) in batch.iter().enumerate() {
        if used[i] {
            continue;
        }
        let kind = classify(ev.mask);
        match kind {
            Kind::Overflow => out.overflow = true,
            Kind::Ignored => t.forget(ev.wd),
            Kind::SelfMoved => {
                // A move this process makes is followed by its caller.
                let own = t
                    .dir(ev.wd)
                    .is_some_and(|(root, path)| t.is_marked(root, path));
                if !own {
                    t.self_moved(ino, ev.wd);
                }
            }
            Kind::Other => {}
            Kind::Created
            | Kind::Removed
            | Kind::Written
            | Kind::Metadata
            | Kind::MovedFrom
            | Kind::MovedTo => {
                let Some((root, path)) = t.entry(ev.wd, &ev.name) else {
                    continue;
                };
                let own = t.is_marked(root, &path);
                let dir = is_dir(ev.mask);
                let change = match kind {
                    Kind::Created => {
                        // Watched before anyone hears of it, so that what
                        // is made in it next is seen.
                        if dir {
                            t.grow(ino, root, &path);
                        }
                        FsChange::Created
                    }
                    Kind::Removed => FsChange::Removed,
                    Kind::Written => FsChange::Written,
                    Kind::Metadata => FsChange::Metadata,
                    Kind::MovedTo => {
                        if dir {
                            t.grow(ino, root, &path);
                        }
                        FsChange::MovedIn
                    }
                    _ => {
                        let h = Held {
                            cookie: ev.cookie,
                            root,
                            path,
                            is_dir: dir,
                            own,
                            since: Instant::now(),
                        };
                        match pair_of(batch, &used, i + 1, ev.cookie) {
                            Some(j) => {
                                used[j] = true;
                                rename(t, ino, &mut out, h, &batch[j]);
                            }
                            None if i + 1 == batch.len() => *held = Some(h),
                            None => moved_out(t, ino, &mut out, h),
                        }
                        continue;
                    }
                };
                if !own {
                    out.push(t, root, path, dir, change);
                }
            }
        }
    }
    out
}

/// The unpaired MOVED_FROM held too long: it left for a place no watch sees.
pub(crate) fn flush(t: &mut Table, ino: &Inotify, held: &mut Option<Held>) -> Output {
    let mut out = Output::default();
    if let Some(h) = held.take() {
        moved_out(t, ino, &mut out, h);
    }
    out
}

/// The MOVED_TO at or after `from` with `cookie`.
fn pair_of(batch: &[RawEvent], used: &[bool], from: usize, cookie: u32) -> Option<usize> {
    (from..batch.len()).find(|&j| {
        !used[j] && classify(batch[j].mask) == Kind::MovedTo && batch[j].cookie == cookie
    })
}

fn rename(t: &mut Table, ino: &Inotify, out: &mut Output, from: Held, to: &RawEvent) {
    let Some((root, path)) = t.entry(to.wd, &to.name) else {
        // Its second half names nothing we can report: gone, as far as
        // the watches can tell.
        return moved_out(t, ino, out, from);
    };
    if root != from.root {
        // Between two shares on one file system.
        let own_to = t.is_marked(root, &path);
        moved_out(t, ino, out, from);
        if is_dir(to.mask) {
            t.grow(ino, root, &path);
        }
        if !own_to {
            out.push(t, root, path, is_dir(to.mask), FsChange::MovedIn);
        }
        return;
    }
    let own = from.own || t.is_marked(root, &path);
    if from.is_dir {
        t.moved(ino, root, &from.path, &path);
    }
    if !own {
        out.push(
            t,
            root,
            path,
            from.is_dir,
            FsChange::Renamed { from: from.path },
        );
    }
}

fn moved_out(t: &mut Table, ino: &Inotify, out: &mut Output, h: Held) {
    if h.is_dir {
        // Its watches would report from wherever it went under the old name.
        t.prune(ino, h.root, &h.path, true);
    }
    if !h.own {
        out.push(t, h.root, h.path, h.is_dir, FsChange::MovedOut);
    }
}
