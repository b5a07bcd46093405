//! One share-mode entry for a group of one cluster node's opens of a file
//! that ask the same access and sharing.
//!
//! MS-FSA 2.1.5.1.2 checks a new open against every open of the file, and
//! the share-mode record (`share_modes`) keeps an entry per open. On a file
//! several nodes use, that record is in etcd, and every open and close
//! wrote it: a transaction each, the rate of a file opened for reading
//! from many clients of many nodes. But the check only asks, of each
//! entry, which access it holds and which sharing it allows: two opens
//! with the same access and sharing conflict with exactly the same opens.
//! So a node records its opens that are alike once, under the id of the
//! first (`GROUP_ENTRY` marks such an entry, `ShareModes::join_group`), and counts the members here,
//! in its own memory:
//! - an open that joins a group that is recorded is checked against the
//!   record (every other entry, and the group's own: an open that shares
//!   nothing conflicts with its twin) and, where nothing refuses it,
//!   leaves the record as it was: etcd is read, not written;
//! - a member's close writes nothing while other members remain; the
//!   last member's close takes the entry out, as a lone open's close
//!   does, unless another client's alike open joins while it waits a
//!   moment for one (`entry_to_leave_closing`).
//!
//! Only opens that nothing else follows by id join a group: no durable
//! handle (its record names the open), no caching (a grant names its
//! opens), no delete-on-close, no DELETE access, no stream. The entry's id
//! is a real open id of this node's incarnation, so a dead node's groups
//! go with its other entries (`ShareModes::drop_gone`).
//!
//! Nothing here is written to the store: a group's member set is this
//! node's alone, and it dies with the process, as its opens do.
//!
//! **Joins without a read.** An open that joins a recorded group needs
//! no look at the records to be decided: every entry recorded before the
//! group's was checked against the group's first member, and every entry
//! recorded after it was checked against the group's entry, which asks
//! what the joining open asks; no grant that excludes other opens (a
//! write-caching lease, a batch oplock) is given while the entry is
//! there. Only delete-pending, set on another node, could refuse it. So a
//! group is *licensed* (`license`) once the node has seen its entry in the
//! records without delete-pending (a write of its own, or a read that
//! proved a join), and its joins are then decided from what the node
//! remembers of the records, with no etcd request. A node that sets
//! delete-pending first has every node whose groups the record names
//! *revoke* them (`revoke`, `ShareModes::set_delete_pending`), and a
//! revoked group is never licensed again: its joins read the records, as
//! before. That is what makes a license safe whenever it is given: the
//! entry stays in the record while the group lives, so a setter's write
//! can only go through on a record that names it, after the node's answer,
//! and so after the group was revoked for good. A group formed after a
//! revocation is a new entry, so the setter's compare-and-set fails and it
//! revokes again.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::blocking::{lock, off_worker};
use crate::file_key::FileKey;

/// Set in `OpenRecord::share_access` of an entry that stands for a group
/// of one node's alike opens (the entry's `open_id` is its group's id).
pub const GROUP_ENTRY: u32 = 0x4000_0000;

/// How long the last member's close of a group that has had members of
/// several clients waits for another to join (`entry_to_leave_closing`).
/// A wait that no join ends costs the close that much more, on top of the
/// entry's removal; one that does saves the removal and the next open's
/// writes (3-4 etcd transactions with the losses they cause). 8 ms, not
/// the 2 of an etcd write's round trip: on busy cores the other client's
/// next open is often later than that for the scheduler alone, and with
/// two clients per node 14 % of the waits ended unjoined at 2 ms against
/// 9 % at 8, for 30 % fewer etcd requests per open (docs/SCALING.md).
pub const REJOIN_WAIT: Duration = Duration::from_millis(8);

/// What a member's leaving asks of the file's records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leaving {
    /// The open is in no group: its own entry goes, as ever.
    Alone,
    /// Other members remain: the group's entry stays, nothing is written.
    Stays,
    /// It was the last member: the group's entry (this id) goes.
    Last(u64),
}

/// Which group an open may join: a file, an access mask and a sharing.
type Kind = (FileKey, u32, u32);

struct Group {
    kind: Kind,
    members: HashSet<u64>,
    /// Its joins may be decided without reading the records.
    licensed: bool,
    /// Revoked for delete-pending (or a lost lease): never licensed again.
    revoked: bool,
    /// The client (`join`'s) of its first member.
    first_client: u64,
    /// It has had members of two clients: a close that empties it may
    /// well be followed by another client's alike open at once (a
    /// client mostly sends its own next open once its close is answered).
    shared: bool,
    /// Its last member is closing and waits for an alike open to join
    /// (`entry_to_leave_closing`).
    emptied: bool,
}

#[derive(Default)]
struct Groups {
    /// A group's id by what its members ask.
    by_kind: HashMap<Kind, u64>,
    groups: HashMap<u64, Group>,
    /// Each member's group.
    of_open: HashMap<u64, u64>,
}

/// This node's groups of alike opens.
#[derive(Default)]
pub struct GroupedOpens {
    groups: Mutex<Groups>,
    /// How many opens are in groups (`Groups::of_open`'s size), changed
    /// under the lock. At 0 (a single node, which groups nothing, and a
    /// cluster node without a shared file) the questions every open and
    /// close asks are answered without the lock, which every thread of
    /// the node would otherwise take in turn.
    grouped: AtomicUsize,
    /// Told when an emptied group is joined again or revoked.
    rejoined: Condvar,
}

impl GroupedOpens {
    /// Puts open `open_id` of `file`, with `access` and `share`, into the
    /// group of its kind, which it starts if there is none: the group's
    /// id, under which it is recorded (`ShareModes::join_group`). The open
    /// must `leave` however its CREATE ends. `client` tells the opens of
    /// one client (its connection) from another's.
    pub fn join(&self, file: FileKey, open_id: u64, access: u32, share: u32, client: u64) -> u64 {
        let kind = (file, access, share & !GROUP_ENTRY);
        let mut g = lock(&self.groups);
        let id = match g.by_kind.get(&kind) {
            Some(&id) => id,
            None => {
                g.by_kind.insert(kind, open_id);
                g.groups.insert(
                    open_id,
                    Group {
                        kind,
                        members: HashSet::new(),
                        licensed: false,
                        revoked: false,
                        first_client: client,
                        shared: false,
                        emptied: false,
                    },
                );
                open_id
            }
        };
        if let Some(group) = g.groups.get_mut(&id) {
            group.members.insert(open_id);
            group.shared |= group.first_client != client;
            if std::mem::take(&mut group.emptied) {
                self.rejoined.notify_all();
            }
        }
        g.of_open.insert(open_id, id);
        self.grouped.store(g.of_open.len(), Ordering::SeqCst);
        id
    }

    /// Takes `open_id` out of its group. A group whose last member left is
    /// forgotten at once: an open that comes meanwhile starts a new one
    /// (under its own id) rather than joining an entry about to go.
    pub fn leave(&self, open_id: u64) -> Leaving {
        if self.none_grouped() {
            return Leaving::Alone;
        }
        let mut g = lock(&self.groups);
        let Some(id) = g.of_open.remove(&open_id) else {
            return Leaving::Alone;
        };
        self.grouped.store(g.of_open.len(), Ordering::SeqCst);
        let Some(group) = g.groups.get_mut(&id) else {
            return Leaving::Alone;
        };
        group.members.remove(&open_id);
        if !group.members.is_empty() {
            return Leaving::Stays;
        }
        let kind = group.kind;
        g.groups.remove(&id);
        if g.by_kind.get(&kind) == Some(&id) {
            g.by_kind.remove(&kind);
        }
        Leaving::Last(id)
    }

    /// `entry_to_leave` for a close, on a file whose records are where a
    /// write is a round trip (etcd): when the open is the last member of a
    /// licensed group that has had others beside it, the close waits up
    /// to `wait` for an alike open of another client to join before the
    /// group's entry goes. If one joins, the entry stands for it: the
    /// close writes nothing, and neither does the join's share-mode check
    /// (its lease, if the group's grant is not proven or is being broken,
    /// is still admitted through the record); the two writes
    /// saved are the entry's (and its lease grant's) removal and
    /// recording again, which several clients of one node reading a file
    /// in turns would otherwise make whenever all of them happen to be
    /// between a close and their next open at once.
    ///
    /// Nothing changes for anyone else: until the close is answered, its
    /// open is as good as open, and the entry is its (as during the
    /// removal's own write); once it is answered, the entry is the new
    /// member's. A group revoked meanwhile goes at once. `wait` is asked
    /// only of a close that would wait.
    pub fn entry_to_leave_closing(
        &self,
        open_id: u64,
        wait: impl FnOnce() -> Duration,
    ) -> Option<u64> {
        if self.none_grouped() {
            return Some(open_id);
        }
        let mut g = lock(&self.groups);
        let Some(&id) = g.of_open.get(&open_id) else {
            return Some(open_id);
        };
        // A revoked group is never licensed; one member left means the
        // group is not already emptied (its last member's removal empties
        // it).
        let waits = g
            .groups
            .get(&id)
            .is_some_and(|group| group.members.len() == 1 && group.shared && group.licensed);
        let wait = if waits { wait() } else { Duration::ZERO };
        if wait.is_zero() {
            drop(g);
            return self.entry_to_leave(open_id);
        }
        // The closing open stays counted among the grouped while it waits
        // (`none_grouped` must not answer for its group meanwhile).
        if let Some(group) = g.groups.get_mut(&id) {
            group.members.remove(&open_id);
            group.emptied = true;
        }
        let deadline = Instant::now() + wait;
        // Whether the entry is no longer this close's to take out.
        let handed_on = loop {
            let Some(group) = g.groups.get(&id) else {
                // Joined, and emptied again by a member whose own wait
                // ended first: that close took the entry out.
                break true;
            };
            if !group.emptied {
                // Joined again: the entry is the new member's.
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || group.revoked {
                break false;
            }
            g = off_worker(|| {
                self.rejoined
                    .wait_timeout(g, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0
            });
        };
        g.of_open.remove(&open_id);
        self.grouped.store(g.of_open.len(), Ordering::SeqCst);
        if handed_on {
            return None;
        }
        if let Some(group) = g.groups.remove(&id) {
            if g.by_kind.get(&group.kind) == Some(&id) {
                g.by_kind.remove(&group.kind);
            }
        }
        Some(id)
    }

    /// `leave`, as the entry to take out of the file's records: the open's
    /// own, its group's when it was the last member, none while other
    /// members remain.
    pub fn entry_to_leave(&self, open_id: u64) -> Option<u64> {
        match self.leave(open_id) {
            Leaving::Alone => Some(open_id),
            Leaving::Stays => None,
            Leaving::Last(id) => Some(id),
        }
    }

    /// The id under which `open_id` is in its file's records: its group's,
    /// or its own.
    pub fn entry_id(&self, open_id: u64) -> u64 {
        if self.none_grouped() {
            return open_id;
        }
        lock(&self.groups)
            .of_open
            .get(&open_id)
            .copied()
            .unwrap_or(open_id)
    }

    /// How many opens the group `id` stands for (0: no such group).
    pub fn members(&self, id: u64) -> usize {
        lock(&self.groups)
            .groups
            .get(&id)
            .map_or(0, |g| g.members.len())
    }

    /// Whether `id` names a group: a new open must not take it, as the
    /// group may outlive the open it was named after.
    pub fn is_group(&self, id: u64) -> bool {
        !self.none_grouped() && lock(&self.groups).groups.contains_key(&id)
    }

    /// Group `id`'s entry was seen in the file's records, without
    /// delete-pending: its joins may be decided without reading, unless
    /// it was revoked.
    pub fn license(&self, id: u64) {
        if self.none_grouped() {
            return;
        }
        if let Some(g) = lock(&self.groups).groups.get_mut(&id) {
            g.licensed = !g.revoked;
        }
    }

    /// Whether a join of group `id` may be decided without reading the
    /// file's records.
    pub fn licensed(&self, id: u64) -> bool {
        !self.none_grouped()
            && lock(&self.groups)
                .groups
                .get(&id)
                .is_some_and(|g| g.licensed)
    }

    /// Another node is about to set `file` delete-pending (or this one
    /// is): every group of it is revoked, for good, before the answer
    /// that lets the setter write. The ids of the groups revoked.
    pub fn revoke(&self, file: FileKey) -> Vec<u64> {
        self.revoke_where(|kind| kind.0 == file)
    }

    /// The node's lease is lost, or it leaves its cluster: what it
    /// remembers of the records proves nothing now, and its entries may be
    /// dropped by other nodes. New opens start groups of their own rather
    /// than join one whose entry may be gone.
    pub fn revoke_all(&self) {
        self.revoke_where(|_| true);
        lock(&self.groups).by_kind.clear();
    }

    fn revoke_where(&self, which: impl Fn(&Kind) -> bool) -> Vec<u64> {
        let mut g = lock(&self.groups);
        let mut ids = Vec::new();
        for (id, group) in g.groups.iter_mut().filter(|(_, g)| which(&g.kind)) {
            group.revoked = true;
            group.licensed = false;
            ids.push(*id);
        }
        // A last member waiting for its group to be joined again stops.
        self.rejoined.notify_all();
        ids
    }

    /// No open is in a group, so none is asked about: an open's own
    /// joining happens before its questions (its CREATE's order).
    fn none_grouped(&self) -> bool {
        self.grouped.load(Ordering::SeqCst) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: FileKey = FileKey::new(1, 2, 1);
    const G: FileKey = FileKey::new(1, 3, 1);

    #[test]
    fn alike_opens_of_a_file_share_one_entry_until_the_last_leaves() {
        let g = GroupedOpens::default();
        assert_eq!(g.join(F, 10, 1, 7, 10), 10);
        assert_eq!(g.join(F, 11, 1, 7, 11), 10);
        assert_eq!(g.join(F, 12, 1, 7, 12), 10);
        assert_eq!(g.members(10), 3);
        assert_eq!(g.entry_id(12), 10);
        // The open the group is named after leaves first: the group stays,
        // and its id is still not a new open's to take.
        assert_eq!(g.leave(10), Leaving::Stays);
        assert!(g.is_group(10));
        assert_eq!(g.leave(12), Leaving::Stays);
        assert_eq!(g.leave(11), Leaving::Last(10));
        assert!(!g.is_group(10));
        assert_eq!(g.leave(11), Leaving::Alone);
        assert_eq!(g.entry_id(11), 11);
    }

    #[test]
    fn opens_that_differ_in_file_access_or_sharing_are_apart() {
        let g = GroupedOpens::default();
        let ids = [
            g.join(F, 1, 1, 7, 1),
            g.join(G, 2, 1, 7, 2),
            g.join(F, 3, 3, 7, 3),
            g.join(F, 4, 1, 1, 4),
        ];
        assert_eq!(ids, [1, 2, 3, 4]);
        for id in ids {
            assert_eq!(g.leave(id), Leaving::Last(id));
        }
    }

    #[test]
    fn a_revoked_group_is_never_licensed_again_and_a_new_one_may_be() {
        let g = GroupedOpens::default();
        g.join(F, 1, 1, 7, 1);
        g.join(G, 2, 1, 7, 2);
        assert!(!g.licensed(1), "licensed before any write");
        g.license(1);
        g.license(2);
        assert!(g.licensed(1) && g.licensed(2));
        assert_eq!(g.revoke(F), vec![1]);
        assert!(!g.licensed(1), "revoked, still licensed");
        assert!(g.licensed(2), "another file's group was revoked");
        g.license(1);
        assert!(!g.licensed(1), "a revoked group licensed again");
        // A group that forms once the revoked one has gone is a new entry.
        assert_eq!(g.leave(1), Leaving::Last(1));
        assert_eq!(g.join(F, 3, 1, 7, 3), 3);
        g.license(3);
        assert!(g.licensed(3));
        g.revoke_all();
        assert!(!g.licensed(2) && !g.licensed(3));
        assert_eq!(
            g.join(F, 4, 1, 7, 4),
            4,
            "joined a group from before the lease was lost"
        );
        assert_eq!(g.leave(3), Leaving::Last(3));
        assert_eq!(g.leave(4), Leaving::Last(4));
    }

    /// `entry_to_leave_closing(open, wait)` on a thread of its own: its
    /// answer, once it comes.
    fn closing(
        g: &std::sync::Arc<GroupedOpens>,
        open: u64,
        wait: Duration,
    ) -> std::sync::mpsc::Receiver<Option<u64>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let g = g.clone();
        std::thread::spawn(move || {
            let _ = tx.send(g.entry_to_leave_closing(open, || wait));
        });
        rx
    }

    /// Waits until group `id`'s last member is waiting to be joined: the
    /// group is still there, with no member.
    fn wait_emptied(g: &GroupedOpens, id: u64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(g.is_group(id) && g.members(id) == 0) {
            assert!(Instant::now() < deadline, "the close never waited");
            std::thread::yield_now();
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const ANSWERED: Duration = Duration::from_secs(10);

    #[test]
    fn a_closing_last_member_hands_its_entry_to_an_alike_open_that_joins() {
        let g = std::sync::Arc::new(GroupedOpens::default());
        g.join(F, 1, 1, 7, 1);
        g.join(F, 2, 1, 7, 2);
        g.license(1);
        assert_eq!(g.entry_to_leave_closing(1, || HOUR), None, "others remain");
        let close = closing(&g, 2, HOUR);
        wait_emptied(&g, 1);
        // Another client's open joins meanwhile: the entry is its now, and
        // neither writes anything.
        assert_eq!(g.join(F, 3, 1, 7, 3), 1);
        assert_eq!(close.recv_timeout(ANSWERED), Ok(None));
        assert_eq!(g.members(1), 1);
        // With nobody to join, the entry goes once the wait is over.
        g.join(F, 4, 1, 7, 4);
        assert_eq!(g.entry_to_leave_closing(4, || HOUR), None);
        assert_eq!(
            g.entry_to_leave_closing(3, || Duration::from_millis(1)),
            Some(1)
        );
        assert!(!g.is_group(1));
        assert_eq!(g.join(F, 5, 1, 7, 5), 5, "joined a group whose entry went");
    }

    #[test]
    fn only_a_licensed_unrevoked_group_with_members_of_two_clients_waits() {
        let g = std::sync::Arc::new(GroupedOpens::default());
        // One client's open alone: its close does not wait.
        g.join(F, 1, 1, 7, 1);
        g.license(1);
        assert_eq!(closing(&g, 1, HOUR).recv_timeout(ANSWERED), Ok(Some(1)));
        // Not licensed (its entry not proven in the records): no wait.
        g.join(F, 2, 1, 7, 2);
        g.join(F, 3, 1, 7, 3);
        assert_eq!(g.entry_to_leave_closing(2, || HOUR), None);
        assert_eq!(closing(&g, 3, HOUR).recv_timeout(ANSWERED), Ok(Some(2)));
        // Revoked while its last member waits: the entry goes at once.
        g.join(F, 4, 1, 7, 4);
        g.join(F, 5, 1, 7, 5);
        g.license(4);
        assert_eq!(g.entry_to_leave_closing(4, || HOUR), None);
        let close = closing(&g, 5, HOUR);
        wait_emptied(&g, 4);
        g.revoke(F);
        assert_eq!(close.recv_timeout(ANSWERED), Ok(Some(4)));
        assert!(!g.is_group(4));
        // Two handles of one client: the client's own next open cannot
        // come while its close waits, so it does not.
        g.join(G, 8, 1, 7, 100);
        g.join(G, 9, 1, 7, 100);
        g.license(8);
        assert_eq!(g.entry_to_leave_closing(8, || HOUR), None);
        assert_eq!(closing(&g, 9, HOUR).recv_timeout(ANSWERED), Ok(Some(8)));
        // No wait asked (the records are in this node's memory).
        g.join(G, 6, 1, 7, 6);
        g.join(G, 7, 1, 7, 7);
        g.license(6);
        assert_eq!(g.entry_to_leave_closing(6, || Duration::ZERO), None);
        assert_eq!(g.entry_to_leave_closing(7, || Duration::ZERO), Some(6));
    }

    #[test]
    fn an_open_after_the_last_member_left_starts_a_new_group() {
        let g = GroupedOpens::default();
        g.join(F, 1, 1, 7, 1);
        assert_eq!(g.leave(1), Leaving::Last(1));
        assert_eq!(g.join(F, 2, 1, 7, 2), 2);
        assert_eq!(g.leave(2), Leaving::Last(2));
    }
}
