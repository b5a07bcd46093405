//! The changes a cluster node made in the last moments, kept so that a
//! watch another node began just before them still hears of them.
//!
//! A node relays a change to the nodes its copy of the registrations names
//! (`crate::cluster_registry`), and that copy follows etcd through a watch:
//! a registration reaches it some milliseconds after it was written. A
//! client that asks for a watch through one node and makes a change
//! through another at once (smbtorture smb2.notify.basedir does, without
//! waiting for the first request's interim response) can have its change
//! made in that moment. When the copy then learns of the registration,
//! the changes made here after the watch began, and not sent to its node,
//! go to it late (`missed`).
//!
//! "After the watch began" compares the time the registering node wrote
//! into its registration with the time each change was made here, both
//! read from the system clock: nothing else orders an operation on one
//! node against one on another without an etcd round trip per change (a
//! linearizable read after each change, measured, halved the rate of file
//! creation on a 3-node cluster and doubled etcd's CPU per file). Only the
//! changes made within `KEPT_FOR` before the copy learned of a watch are
//! judged this way, so clocks apart by less than the time between a
//! client's two requests misjudge nothing; clocks further apart can make
//! a watch hear of a change made a moment before it began, or miss one
//! made a moment after, as it would without this.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nimbus_wire::notify::NotifyAction;

use crate::notify::covering;

/// Changes as they travel: (action, filter, share-relative path).
pub type OwnedChange = (NotifyAction, u32, String);

/// How long a change is kept for a watch the copy has not heard of yet:
/// far beyond an etcd watch's latency.
pub const KEPT_FOR: Duration = Duration::from_secs(2);

/// The most batches kept, and the most bytes of names they hold, whatever
/// their age: memory stays bounded however fast clients change things. A
/// watch the copy learns of late misses what was dropped for room.
pub const KEPT_MOST: usize = 4096;
pub const KEPT_BYTES: usize = 8 << 20;

/// The system clock in nanoseconds since the Unix epoch (0 before it).
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One batch of changes made through SMB on this node.
struct Made {
    /// When (`now`), as it was reported.
    at: u64,
    share: String,
    changes: Vec<OwnedChange>,
    /// The nodes it went to.
    sent_to: Vec<String>,
    /// What its names take.
    bytes: usize,
}

#[derive(Default)]
pub struct Recent {
    made: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    batches: VecDeque<Made>,
    bytes: usize,
}

impl Recent {
    /// Keeps a batch made at `at` and sent to `sent_to`, and forgets those
    /// older than `KEPT_FOR`.
    pub fn record(&self, at: u64, share: &str, changes: Vec<OwnedChange>, sent_to: Vec<String>) {
        let bytes = changes
            .iter()
            .map(|(_, _, p)| p.len() + std::mem::size_of::<OwnedChange>())
            .sum::<usize>()
            + share.len();
        let mut kept = crate::sync::lock(&self.made);
        let oldest = at.saturating_sub(KEPT_FOR.as_nanos() as u64);
        while kept.batches.front().is_some_and(|m| {
            m.at < oldest || kept.batches.len() >= KEPT_MOST || kept.bytes + bytes > KEPT_BYTES
        }) {
            if let Some(gone) = kept.batches.pop_front() {
                kept.bytes -= gone.bytes;
            }
        }
        kept.bytes += bytes;
        kept.batches.push_back(Made {
            at,
            share: share.to_owned(),
            changes,
            sent_to,
            bytes,
        });
    }

    /// The batches, in the order they were made, of the changes made after
    /// `began` in directory `dir` of `share` (or anywhere beneath it, when
    /// `tree`) that did not go to `node`; they count as sent to it from
    /// now on.
    pub fn missed(
        &self,
        node: &str,
        share: &str,
        dir: &str,
        tree: bool,
        began: u64,
    ) -> Vec<Vec<OwnedChange>> {
        let mut kept = crate::sync::lock(&self.made);
        let mut late = Vec::new();
        for m in kept.batches.iter_mut() {
            if m.at <= began || m.share != share || m.sent_to.iter().any(|n| n == node) {
                continue;
            }
            let picked: Vec<OwnedChange> = m
                .changes
                .iter()
                .filter(|(_, _, path)| beneath(path, dir, tree))
                .cloned()
                .collect();
            if !picked.is_empty() {
                m.sent_to.push(node.to_owned());
                late.push(picked);
            }
        }
        late
    }
}

/// Whether a watch of `dir` hears of a change to `path`: `dir` is its
/// directory, or an ancestor of it and the watch covers the tree.
fn beneath(path: &str, dir: &str, tree: bool) -> bool {
    covering(path).any(|(d, direct)| d == dir && (direct || tree))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(path: &str) -> OwnedChange {
        (NotifyAction::Modified, 4, path.to_owned())
    }

    #[test]
    fn what_a_late_watch_hears_is_made_after_it_began_beneath_it_and_not_sent_to_it() {
        let r = Recent::default();
        let t = now();
        r.record(t, "data", vec![change("base/before")], vec![]);
        r.record(t + 10, "data", vec![change("base/sent")], vec!["n1".into()]);
        r.record(
            t + 20,
            "data",
            vec![change("base/f"), change("elsewhere/g")],
            vec![],
        );
        r.record(t + 30, "other", vec![change("base/f")], vec![]);
        r.record(t + 40, "data", vec![change("base/sub/deep")], vec![]);
        // A direct watch of data/base that began at t + 5.
        assert_eq!(
            r.missed("n1", "data", "base", false, t + 5),
            vec![vec![change("base/f")]]
        );
        // Counted as sent: not twice.
        assert!(r.missed("n1", "data", "base", false, t + 5).is_empty());
        // Another node's tree watch of the root hears everything in data
        // after it began, in order.
        assert_eq!(
            r.missed("n2", "data", "", true, t + 5),
            vec![
                vec![change("base/sent")],
                vec![change("base/f"), change("elsewhere/g")],
                vec![change("base/sub/deep")],
            ]
        );
    }

    #[test]
    fn old_batches_are_forgotten_and_the_count_is_bounded() {
        let r = Recent::default();
        let t = now();
        r.record(t, "data", vec![change("a/old")], vec![]);
        r.record(
            t + KEPT_FOR.as_nanos() as u64 + 1,
            "data",
            vec![change("a/new")],
            vec![],
        );
        assert_eq!(
            r.missed("n1", "data", "a", false, 0),
            vec![vec![change("a/new")]]
        );
        for i in 0..KEPT_MOST as u64 + 10 {
            r.record(
                t + KEPT_FOR.as_nanos() as u64 + 2 + i,
                "data",
                vec![change("b/x")],
                vec![],
            );
        }
        assert_eq!(crate::sync::lock(&r.made).batches.len(), KEPT_MOST);
        // Long names: the bytes bound holds first.
        let r = Recent::default();
        let long = "d/".to_owned() + &"n".repeat(60_000);
        for i in 0..500 {
            r.record(
                t + i,
                "data",
                vec![(NotifyAction::Added, 1, long.clone())],
                vec![],
            );
        }
        let kept = crate::sync::lock(&r.made);
        assert!(kept.bytes <= KEPT_BYTES && kept.batches.len() < 500);
        assert_eq!(
            kept.bytes,
            kept.batches.iter().map(|m| m.bytes).sum::<usize>()
        );
    }

    #[test]
    fn a_watch_hears_of_its_directorys_children_and_of_its_tree_only_when_it_covers_it() {
        assert!(beneath("a/f", "a", false));
        assert!(!beneath("a/b/f", "a", false));
        assert!(beneath("a/b/f", "a", true));
        assert!(beneath("f", "", false));
        assert!(!beneath("ab/f", "a", true));
        assert!(!beneath("a", "a", true));
    }
}
