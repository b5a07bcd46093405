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
//!   does.
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
use std::sync::Mutex;

use crate::blocking::lock;
use crate::file_key::FileKey;

/// Set in `OpenRecord::share_access` of an entry that stands for a group
/// of one node's alike opens (the entry's `open_id` is its group's id).
pub const GROUP_ENTRY: u32 = 0x4000_0000;

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
}

impl GroupedOpens {
    /// Puts open `open_id` of `file`, with `access` and `share`, into the
    /// group of its kind, which it starts if there is none: the group's
    /// id, under which it is recorded (`ShareModes::join_group`). The open
    /// must `leave` however its CREATE ends.
    pub fn join(&self, file: FileKey, open_id: u64, access: u32, share: u32) -> u64 {
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
                    },
                );
                open_id
            }
        };
        if let Some(group) = g.groups.get_mut(&id) {
            group.members.insert(open_id);
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

    const F: FileKey = FileKey { dev: 1, ino: 2 };
    const G: FileKey = FileKey { dev: 1, ino: 3 };

    #[test]
    fn alike_opens_of_a_file_share_one_entry_until_the_last_leaves() {
        let g = GroupedOpens::default();
        assert_eq!(g.join(F, 10, 1, 7), 10);
        assert_eq!(g.join(F, 11, 1, 7), 10);
        assert_eq!(g.join(F, 12, 1, 7), 10);
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
            g.join(F, 1, 1, 7),
            g.join(G, 2, 1, 7),
            g.join(F, 3, 3, 7),
            g.join(F, 4, 1, 1),
        ];
        assert_eq!(ids, [1, 2, 3, 4]);
        for id in ids {
            assert_eq!(g.leave(id), Leaving::Last(id));
        }
    }

    #[test]
    fn a_revoked_group_is_never_licensed_again_and_a_new_one_may_be() {
        let g = GroupedOpens::default();
        g.join(F, 1, 1, 7);
        g.join(G, 2, 1, 7);
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
        assert_eq!(g.join(F, 3, 1, 7), 3);
        g.license(3);
        assert!(g.licensed(3));
        g.revoke_all();
        assert!(!g.licensed(2) && !g.licensed(3));
        assert_eq!(
            g.join(F, 4, 1, 7),
            4,
            "joined a group from before the lease was lost"
        );
        assert_eq!(g.leave(3), Leaving::Last(3));
        assert_eq!(g.leave(4), Leaving::Last(4));
    }

    #[test]
    fn an_open_after_the_last_member_left_starts_a_new_group() {
        let g = GroupedOpens::default();
        g.join(F, 1, 1, 7);
        assert_eq!(g.leave(1), Leaving::Last(1));
        assert_eq!(g.join(F, 2, 1, 7), 2);
        assert_eq!(g.leave(2), Leaving::Last(2));
    }
}
