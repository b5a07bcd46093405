//! The watcher against a real inotify and real temporary directories. Every
//! wait is on the sink (with a timeout); changes expected *not* to come are
//! checked with a fence: a later change made on disk, which inotify queues
//! after them, so whatever should not be there would have come first.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use super::{DirWatcher, FsChange, FsEvent, Notice};
use crate::LocalFs;

struct Scratch {
    base: PathBuf,
    fs: LocalFs,
    watcher: DirWatcher,
    rx: Receiver<Notice>,
}

impl Scratch {
    fn new(limit: usize) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::temp_dir().join(format!(
            "nimbus-watch-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("share")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        let fs = LocalFs::new(&base.join("share")).unwrap();
        let (tx, rx) = channel();
        let watcher = DirWatcher::new(limit, move |n| {
            let _ = tx.send(n);
        })
        .unwrap();
        Scratch {
            base,
            fs,
            watcher,
            rx,
        }
    }

    fn disk(&self, path: &str) -> PathBuf {
        self.base.join("share").join(path)
    }

    /// The next changes reported, flattened as (path, change).
    fn next(&self) -> Vec<(String, FsChange)> {
        match self.rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Notice::Changes(events)) => events.into_iter().map(|e| (e.path, e.change)).collect(),
            Ok(Notice::Overflow) => panic!("unexpected overflow"),
            Err(e) => panic!("no change reported: {e}"),
        }
    }

    /// Changes until one for `path` arrives (that one included), a change
    /// repeated at once counted once (the kernel merges most repeats, not
    /// those read apart).
    fn until(&self, path: &str) -> Vec<(String, FsChange)> {
        let mut all = Vec::new();
        loop {
            let got = self.next();
            let done = got.iter().any(|(p, _)| p == path);
            all.extend(got);
            all.dedup();
            if done {
                return all;
            }
        }
    }

    fn root(&self) -> &Path {
        self.fs.root_path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn c(path: &str, change: FsChange) -> (String, FsChange) {
    (path.to_string(), change)
}

#[test]
fn changes_on_disk_are_reported() {
    let s = Scratch::new(100);
    std::fs::create_dir(s.disk("d")).unwrap();
    let sub = s.watcher.subscribe(&s.fs, "d", false).unwrap();
    assert_eq!(s.watcher.watch_count(), 1);

    std::fs::write(s.disk("d/a"), b"x").unwrap();
    assert_eq!(s.until("d/a")[0], c("d/a", FsChange::Created));
    std::fs::rename(s.disk("d/a"), s.disk("d/b")).unwrap();
    let got = s.until("d/b");
    assert!(got.contains(&c("d/b", FsChange::Renamed { from: "d/a".into() })));
    std::fs::remove_file(s.disk("d/b")).unwrap();
    assert!(s.until("d/b").contains(&c("d/b", FsChange::Removed)));
    std::fs::create_dir(s.disk("d/sub")).unwrap();
    let got = s.until("d/sub");
    assert_eq!(got, [c("d/sub", FsChange::Created)]);
    // A rename to a place no watch sees.
    std::fs::rename(s.disk("d/sub"), s.disk("elsewhere")).unwrap();
    assert_eq!(s.until("d/sub"), [c("d/sub", FsChange::MovedOut)]);

    s.watcher.unsubscribe(sub);
    assert_eq!(s.watcher.watch_count(), 0);
}

#[test]
fn own_changes_are_not_reported_and_later_ones_are() {
    let s = Scratch::new(100);
    std::fs::create_dir(s.disk("d")).unwrap();
    std::fs::write(s.disk("d/f"), b"x").unwrap();
    let _sub = s.watcher.subscribe(&s.fs, "d", false).unwrap();
    {
        let _own = s.watcher.own_change(s.root(), &["d/new", "d/f"]);
        std::fs::write(s.disk("d/new"), b"1234").unwrap();
        std::fs::write(s.disk("d/f"), b"more").unwrap();
    }
    {
        let _own = s.watcher.own_change(s.root(), &["d/f", "d/g"]);
        std::fs::rename(s.disk("d/f"), s.disk("d/g")).unwrap();
    }
    // The same name changed on disk right after is reported.
    std::fs::write(s.disk("d/new"), b"on disk").unwrap();
    std::fs::write(s.disk("d/fence"), b"").unwrap();
    assert_eq!(
        s.until("d/fence"),
        [
            c("d/new", FsChange::Written),
            c("d/fence", FsChange::Created)
        ]
    );
}

#[test]
fn a_tree_is_watched_with_its_new_directories() {
    let s = Scratch::new(100);
    std::fs::create_dir_all(s.disk("t/a/b")).unwrap();
    std::fs::create_dir_all(s.disk("t/link-target")).unwrap();
    // A symlink to a directory is not walked into.
    std::os::unix::fs::symlink("link-target", s.disk("t/link")).unwrap();
    let sub = s.watcher.subscribe(&s.fs, "t", true).unwrap();
    assert_eq!(s.watcher.watch_count(), 4, "t, t/a, t/a/b, t/link-target");

    std::fs::write(s.disk("t/a/b/f"), b"").unwrap();
    assert_eq!(s.until("t/a/b/f")[0], c("t/a/b/f", FsChange::Created));
    // A directory made later is watched before it is reported.
    std::fs::create_dir(s.disk("t/new")).unwrap();
    assert_eq!(s.until("t/new"), [c("t/new", FsChange::Created)]);
    std::fs::write(s.disk("t/new/g"), b"").unwrap();
    assert_eq!(s.until("t/new/g")[0], c("t/new/g", FsChange::Created));
    // A directory renamed within the tree keeps its watch under its new name.
    std::fs::rename(s.disk("t/a"), s.disk("t/renamed")).unwrap();
    assert_eq!(
        s.until("t/renamed"),
        [c("t/renamed", FsChange::Renamed { from: "t/a".into() })]
    );
    std::fs::write(s.disk("t/renamed/b/h"), b"").unwrap();
    assert_eq!(
        s.until("t/renamed/b/h")[0],
        c("t/renamed/b/h", FsChange::Created)
    );
    // Moved out of the share: its watches end, for their names would lie.
    let before = s.watcher.watch_count();
    std::fs::rename(s.disk("t/renamed"), s.base.join("outside/gone")).unwrap();
    assert_eq!(s.until("t/renamed"), [c("t/renamed", FsChange::MovedOut)]);
    assert_eq!(s.watcher.watch_count(), before - 2);
    std::fs::write(s.base.join("outside/gone/b/secret"), b"").unwrap();
    std::fs::write(s.disk("t/fence"), b"").unwrap();
    assert_eq!(s.until("t/fence"), [c("t/fence", FsChange::Created)]);

    s.watcher.unsubscribe(sub);
    assert_eq!(s.watcher.watch_count(), 0);
}

#[test]
fn a_directory_moved_away_unseen_loses_its_watch() {
    let s = Scratch::new(100);
    std::fs::create_dir_all(s.disk("p/w")).unwrap();
    // Only p/w is watched, not p: its move is seen only as IN_MOVE_SELF.
    let _sub = s.watcher.subscribe(&s.fs, "p/w", false).unwrap();
    let _fence = s.watcher.subscribe(&s.fs, "", false).unwrap();
    assert_eq!(s.watcher.watch_count(), 2);
    std::fs::rename(s.disk("p/w"), s.base.join("outside/w")).unwrap();
    std::fs::write(s.disk("fence"), b"").unwrap();
    assert_eq!(s.until("fence"), [c("fence", FsChange::Created)]);
    assert_eq!(s.watcher.watch_count(), 1);
}

#[test]
fn subscriptions_share_kernel_watches_and_the_limit_holds() {
    let s = Scratch::new(2);
    std::fs::create_dir_all(s.disk("x/y/z")).unwrap();
    let a = s.watcher.subscribe(&s.fs, "x", false).unwrap();
    let b = s.watcher.subscribe(&s.fs, "x", true).unwrap();
    // x and x/y; x/y/z is past the limit.
    assert_eq!(s.watcher.watch_count(), 2);
    s.watcher.unsubscribe(b);
    assert_eq!(s.watcher.watch_count(), 1);
    s.watcher.unsubscribe(a);
    assert_eq!(s.watcher.watch_count(), 0);
    // A path that cannot be watched still gives a subscription.
    let gone = s.watcher.subscribe(&s.fs, "missing", false).unwrap();
    assert_eq!(s.watcher.watch_count(), 0);
    s.watcher.unsubscribe(gone);
}

#[test]
fn renames_told_by_the_caller_are_followed() {
    let s = Scratch::new(100);
    std::fs::create_dir_all(s.disk("m/old")).unwrap();
    let _sub = s.watcher.subscribe(&s.fs, "m/old", false).unwrap();
    {
        let _own = s.watcher.own_change(s.root(), &["m/old", "m/new"]);
        std::fs::rename(s.disk("m/old"), s.disk("m/new")).unwrap();
        s.watcher.moved(s.root(), "m/old", "m/new");
    }
    std::fs::write(s.disk("m/new/f"), b"").unwrap();
    assert_eq!(s.until("m/new/f")[0], c("m/new/f", FsChange::Created));
}

#[test]
fn events_carry_their_share_root() {
    let s = Scratch::new(100);
    let _sub = s.watcher.subscribe(&s.fs, "", false).unwrap();
    std::fs::create_dir(s.disk("dir")).unwrap();
    match s.rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Notice::Changes(events)) => assert_eq!(
            events,
            [FsEvent {
                root: s.root().into(),
                path: "dir".into(),
                is_dir: true,
                change: FsChange::Created
            }]
        ),
        other => panic!("{other:?}"),
    }
}
