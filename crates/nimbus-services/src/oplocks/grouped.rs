//! Leases granted through this node's groups of alike opens
//! (`nimbus_state::group_leases`, docs/SCALING.md "Leases granted through
//! the node"), on a cluster node whose `[cluster] group_leases` is on.
//!
//! The file's caching record holds one lease for a group, named by a lease
//! id this node made up, whose one open is the group's entry. Its members'
//! own leases are in memory (`GroupLeases`). Here is what moves between
//! the two:
//! - an open of the group is granted its lease from memory when the
//!   group's grant allows it (no etcd request), or through the record: an
//!   admit of the group's lease, written with the file's other steps;
//! - a break of the group's grant, from this node's own contention or
//!   another node's message, is fanned out to the members it touches;
//! - a member's acknowledgement changes memory; the last one the group
//!   waited for writes the group's acknowledgement into the record;
//! - a member that does not answer within the break timeout is answered
//!   for (its caching goes), before the breaking node's own timer of the
//!   group's grant fires (`GROUP_GRACE`).

use std::sync::MutexGuard;
use std::time::Duration;

use nimbus_state::caching::{AckError, Acked, BreakOrder, Granted, Holder, LeaseId, OpenAsk, Want};
use nimbus_state::group_leases::{self, GrantSeen, GroupAck, GroupLeases, MemberAsk};
use nimbus_state::{FileKey, ShareModes};

use super::together::{Step, Stepped};
use super::{nothing_granted, AckOutcome, Notifier, Oplocks, Route};
use crate::sync::lock;

/// How much longer the node that breaks a group's grant waits for its
/// acknowledgement than for a lease's own: the group's node answers for
/// members that do not answer, and its timers start only when the break
/// reaches it.
pub(super) const GROUP_GRACE: Duration = Duration::from_secs(5);

/// How soon a group's acknowledgement the store did not take is written
/// again.
const GROUP_ACK_RETRY: Duration = Duration::from_secs(1);

impl Oplocks {
    /// The same, granting leases through this node's groups of alike opens;
    /// `node`: bytes drawn at random when the node starts, which name its
    /// groups' leases.
    pub fn with_group_leases(self, node: [u8; 8]) -> Oplocks {
        Oplocks {
            groups: Some(std::sync::Mutex::new(GroupLeases::new(node))),
            ..self
        }
    }

    fn groups(&self) -> Option<MutexGuard<'_, GroupLeases>> {
        self.groups.as_ref().map(lock)
    }

    /// For an open that joins group `group` of `file` (its entry's id) and
    /// asks a lease: the ask the group's entry makes of the record in its
    /// place, when the lease may be granted through the group. None: it may
    /// not (groups are off, the lease asks for writes, or its key is held
    /// outside the groups), and the open asks for its lease alone.
    pub fn group_lease_ask(&self, file: FileKey, group: u64, ask: &OpenAsk) -> Option<OpenAsk> {
        let member = self.member_ask(file, group, ask)?;
        let id = self.groups()?.lease_id(group);
        Some(OpenAsk {
            open_id: group,
            want: Want::Lease {
                id,
                state: member.state,
                version: 2,
                parent_key: None,
                epoch: 0,
            },
            ..*ask
        })
    }

    /// Whether `ask`'s lease, on `file`, is one a group may grant (which
    /// group, the open's joining decides).
    pub fn lease_groupable(&self, file: FileKey, ask: &OpenAsk) -> bool {
        self.groupable(file, ask).is_some()
    }

    /// `ask`'s lease as a member's of group `group`, if it may be granted
    /// through it.
    fn member_ask(&self, file: FileKey, group: u64, ask: &OpenAsk) -> Option<MemberAsk> {
        let member = self.groupable(file, ask)?;
        // One lease key, one holder: a key of another group of the file
        // (the same client opening it with other access or sharing) stays
        // with that group.
        let groups = self.groups.as_ref()?;
        if lock(groups)
            .member_group(&member.id)
            .is_some_and(|g| g != group)
        {
            return None;
        }
        Some(member)
    }

    /// `ask`'s lease as a member's, if groups grant leases of its kind and
    /// its key is not held outside them.
    fn groupable(&self, file: FileKey, ask: &OpenAsk) -> Option<MemberAsk> {
        self.groups.as_ref()?;
        let Want::Lease {
            id,
            state,
            version,
            parent_key,
            epoch,
        } = ask.want
        else {
            return None;
        };
        if !group_leases::groupable(state) || group_leases::is_group_lease(&id) || ask.is_dir {
            return None;
        }
        // A key this node holds outside its groups, or on another file,
        // stays where it is.
        {
            let t = self.table();
            match t.lease_files.get(&id) {
                None => {}
                Some(k) if *k == file && t.members.contains(&id) => {}
                Some(_) => return None,
            }
        }
        Some(MemberAsk {
            id,
            state,
            version,
            parent_key,
            epoch,
        })
    }

    /// Grants open `ask.open_id`, which joined group `group` of `file`
    /// asking a lease `group_lease_ask` let through, its lease: from memory
    /// when the group's grant allows, else through the record (the group's
    /// entry's admit, written with the file's other steps).
    pub fn admit_member(
        &self,
        file: FileKey,
        group: u64,
        ask: &OpenAsk,
        route: Route,
        share_modes: &ShareModes,
    ) -> Granted {
        // Routed first: a break of the grant may come at once.
        self.notifier.register(ask.open_id, route);
        let Some(member) = self.member_ask(file, group, ask) else {
            // Its key was taken meanwhile (by an open of another file, or
            // one that holds it alone): no lease, as for a key in use.
            return nothing_granted(ask);
        };
        let entry = self.group_lease_ask(file, group, ask);
        let Some(entry) = entry else {
            return nothing_granted(ask);
        };
        if let Some(mut g) = self.groups() {
            // The key is the group's from now: an open outside the groups
            // that names it while the group's admit is written gets no
            // lease of its own (`claim_for_admit`), as after it.
            if !self.reserve_member(file, member.id) {
                return nothing_granted(ask);
            }
            if let Some(granted) = g.from_memory(group, &member, ask.open_id) {
                return granted;
            }
            g.expect(group, file);
        }
        let granted = match self.together(file, Step::Admit { ask: entry }, share_modes) {
            None => {
                let mut entry = entry;
                entry.has_byte_range_locks |= self.host.has_locks(file);
                self.admit_unrouted(file, &entry)
            }
            Some(Ok(Stepped::Admitted(granted))) => Some(granted),
            Some(Err(e)) => {
                tracing::error!("caching state of {file:?}: {e:?}");
                None
            }
            Some(Ok(_)) => None,
        };
        let Some(Granted::Lease {
            state,
            epoch,
            breaking,
            ..
        }) = granted
        else {
            // Not written: no answer of the record's to take in.
            if let Some(mut g) = self.groups() {
                g.abandon(group);
                self.unreserve_unless_member(&g, member.id);
            }
            return nothing_granted(ask);
        };
        let seen = GrantSeen {
            state,
            breaking,
            epoch,
        };
        let Some(mut g) = self.groups() else {
            return nothing_granted(ask);
        };
        let granted = g.admitted(group, file, &member, ask.open_id, seen);
        // Claimed again: another open of the same key may have given the
        // claim back while this one's admit was being written.
        if g.member_group(&member.id) == Some(group) {
            self.reserve_member(file, member.id);
        } else {
            self.unreserve_unless_member(&g, member.id);
        }
        let breaks = g.hold_to_grant(group);
        // The member itself may be among those broken (another open of its
        // key cached more than the grant): it is answered as it now is.
        let granted = match g.member_of_open(ask.open_id) {
            Some((id, m)) if breaks.iter().any(|(b, _)| b.holder == Holder::Lease(id)) => {
                Granted::Lease {
                    state: m.state,
                    epoch: m.epoch,
                    breaking: m.sent.is_some(),
                    version: m.version,
                }
            }
            _ => granted,
        };
        drop(g);
        self.send_member_breaks(breaks);
        granted
    }

    /// Claims member key `id` on `file`: no other file's open may use it,
    /// and no open outside the groups may hold it alone. False: it is
    /// held so already. Called with the groups locked (their lock comes
    /// before the table's), so that a member's leaving cannot come between.
    fn reserve_member(&self, file: FileKey, id: LeaseId) -> bool {
        let mut t = self.table();
        match t.lease_files.get(&id) {
            Some(k) if *k != file || !t.members.contains(&id) => false,
            _ => {
                t.lease_files.insert(id, file);
                t.members.insert(id);
                true
            }
        }
    }

    /// Gives back `reserve_member`'s claim of a key that joined no group
    /// after all. Called with the groups locked, as `g`.
    fn unreserve_unless_member(&self, g: &GroupLeases, id: LeaseId) {
        if g.member_group(&id).is_none() {
            let mut t = self.table();
            t.members.remove(&id);
            t.lease_files.remove(&id);
        }
    }

    /// Open `open_id` closed, or its CREATE did not go on: it leaves its
    /// member lease (which goes with its last open). A break that waited
    /// only for it is acknowledged for the group.
    pub fn leave_member(&self, open_id: u64) {
        let Some(mut g) = self.groups() else {
            return;
        };
        let Some((id, _)) = g.member_of_open(open_id) else {
            return;
        };
        let ack = g.leave(open_id);
        if g.member_group(&id).is_none() {
            let mut t = self.table();
            t.members.remove(&id);
            t.lease_files.remove(&id);
        }
        drop(g);
        if let Some(ack) = ack {
            self.write_group_ack(ack);
        }
    }

    /// The group whose lease `order` breaks, if it is one of this node's.
    pub(super) fn group_of_order(&self, order: &BreakOrder) -> Option<u64> {
        let Holder::Lease(id) = order.holder else {
            return None;
        };
        self.groups()?.group_of(&id)
    }

    /// A break of this node's group `group`'s grant: each member it
    /// touches gets its own break; one that needs no member's answer is
    /// acknowledged for the group at once.
    pub(super) fn fan_out(&self, group: u64, order: &BreakOrder) {
        let Some(out) = self.groups().map(|mut g| g.fan_out(group, order)) else {
            return;
        };
        self.send_member_breaks(out.breaks);
        if let Some(ack) = out.ack {
            self.write_group_ack(ack);
        }
    }

    /// Sends members their own breaks (through their first open's route),
    /// and times those that need an answer.
    fn send_member_breaks(&self, breaks: Vec<(BreakOrder, u64)>) {
        for (order, open_id) in breaks {
            self.notifier.deliver(open_id, order);
            if let (true, Holder::Lease(id)) = (order.ack_required, order.holder) {
                let epoch = order.epoch;
                self.host.later(
                    self.break_timeout(),
                    Box::new(move |oplocks: &Oplocks| oplocks.member_timed_out(id, epoch)),
                );
            }
        }
    }

    /// Member `id` did not answer its break of `epoch` in time: its caching
    /// goes (MS-SMB2 3.3.6.5), and the group may be acknowledged.
    pub fn member_timed_out(&self, id: LeaseId, epoch: u16) {
        let ack = {
            let Some(mut g) = self.groups() else {
                return;
            };
            if g.waiting_epoch(&id) != Some(epoch) {
                return;
            }
            super::log_timeout(Holder::Lease(id), self.break_timeout());
            crate::metrics::break_timed_out();
            g.timed_out(&id)
        };
        if let Some(ack) = ack {
            self.write_group_ack(ack);
        }
    }

    /// A client's acknowledgement of a member lease's break (MS-SMB2
    /// 3.3.5.22.2), applied in memory. None: `id` is no member here.
    pub(super) fn ack_member(&self, id: LeaseId, state: u32) -> Option<AckOutcome> {
        let acked = {
            let mut g = self.groups()?;
            g.member_group(&id)?;
            g.ack(&id, state)
        };
        Some(match acked {
            Ok(a) => {
                self.send_member_breaks(a.follow_up.into_iter().collect());
                if let Some(ack) = a.group {
                    self.write_group_ack(ack);
                }
                AckOutcome::Done(Acked {
                    state: a.state,
                    follow_up: None,
                })
            }
            Err(e) => AckOutcome::Refused(e),
        })
    }

    /// Writes the group's acknowledgement into the record, only while its
    /// grant is in the break it ends; members still above what the record
    /// then holds are broken, and a further break the record asks reaches
    /// the group after that.
    fn write_group_ack(&self, ack: GroupAck) {
        // The grant as the write found it, when the break was over; and
        // whether the store answered at all.
        let mut found = None;
        let mut answered = false;
        // The rule passed, and the acknowledgement was to be written: a
        // refusal then is the store's (its compare-and-set, or no answer).
        let mut passed = false;
        let (outcome, effects) = self.ack_applied(ack.file, |s| {
            found = None;
            passed = false;
            answered = true;
            match s.grant(Holder::Lease(ack.id)) {
                Some(g) if g.epoch == ack.epoch && g.breaking.is_some() => {}
                // That break is over: the breaking node timed it out (its
                // timer fired first), or a newer break began. Nothing to
                // answer; what the record settled at holds the members.
                Some(g) => {
                    found = g.breaking.is_none().then_some((g.state, g.epoch));
                    return Err(AckError::NotBreaking);
                }
                None => return Err(AckError::NotBreaking),
            }
            let r = s.ack_lease(ack.id, ack.state);
            passed = r.is_ok();
            r
        });
        let written = matches!(outcome, AckOutcome::Done(_));
        if !answered || (passed && !written) {
            // The store did not answer, or did not take the write (its
            // compare-and-set lost to another change): handed out again,
            // and tried again shortly (the breaking node's timer ends the
            // break meanwhile if the store stays away, and the next try
            // finds it over).
            if let Some(mut g) = self.groups() {
                g.unack(ack.group);
            }
            let group = ack.group;
            self.host.later(
                GROUP_ACK_RETRY,
                Box::new(move |oplocks: &Oplocks| {
                    let again = oplocks.groups().and_then(|mut g| g.retry_ack(group));
                    if let Some(ack) = again {
                        oplocks.write_group_ack(ack);
                    }
                }),
            );
            return;
        }
        let settled = match outcome {
            AckOutcome::Done(acked) => Some((acked.state, ack.epoch)),
            AckOutcome::Refused(_) => found,
        };
        if let Some((state, epoch)) = settled {
            let breaks = self
                .groups()
                .map(|mut g| g.settled(ack.group, state, epoch))
                .unwrap_or_default();
            self.send_member_breaks(breaks);
        }
        self.after_ack(ack.file, effects);
    }

    /// What `held_by` answers for a member's open.
    pub(super) fn member_holds(&self, open_id: u64) -> Option<(Granted, LeaseId)> {
        let g = self.groups()?;
        let (id, m) = g.member_of_open(open_id)?;
        Some((
            Granted::Lease {
                state: m.state,
                epoch: m.epoch,
                breaking: m.sent.is_some(),
                version: m.version,
            },
            id,
        ))
    }

    /// The group's grant went from the record with its entry: its members
    /// go from memory.
    pub(super) fn forget_group_lease(&self, id: &LeaseId) {
        let Some(mut g) = self.groups() else {
            return;
        };
        let Some(group) = g.group_of(id) else {
            return;
        };
        let members = g.forget_group(group);
        let mut t = self.table();
        for id in members {
            t.members.remove(&id);
            t.lease_files.remove(&id);
        }
    }

    /// Whether `open_id` is the id of one of this node's groups that holds
    /// a group lease (the group's first open, lease or not, has it).
    pub(super) fn names_group_lease(&self, open_id: u64) -> bool {
        self.groups().is_some_and(|g| g.has_group(open_id))
    }

    /// Whether `holder` is a group's lease (any node's): its breaker waits
    /// `GROUP_GRACE` longer.
    pub(super) fn is_group_holder(holder: Holder) -> bool {
        matches!(holder, Holder::Lease(id) if group_leases::is_group_lease(&id))
    }
}

#[cfg(test)]
mod tests {
    //! The service's side of group leases, on a store that writes the
    //! records as etcd does for a file several nodes share
    //! (`SharedMemory`): what reaches the record, and what each member is
    //! told, when a write fails or races.

    use std::sync::{Arc, Mutex};

    use nimbus_state::caching::{FileCaching, HANDLE, READ};
    use nimbus_state::conformance::SharedMemory;
    use nimbus_state::records::{self, CACHING_PREFIX};
    use nimbus_state::OpenRecord;

    use super::super::OplockHost;
    use super::*;

    const K: FileKey = FileKey::new(1, 7, 1);
    const READ_DATA: u32 = 0x1;
    const SHARE_ALL: u32 = 0x7;
    type Timer = Box<dyn FnOnce(&Oplocks) + Send>;

    /// A host whose timers (`OplockHost::later`) wait for the test to run
    /// them, whatever their delay.
    #[derive(Default)]
    struct Timers(Mutex<Vec<Timer>>);

    impl OplockHost for Timers {
        fn later(&self, _after: Duration, f: Timer) {
            self.0.lock().unwrap().push(f);
        }
    }

    impl Timers {
        /// Runs the timers set so far; how many.
        fn fire(&self, o: &Oplocks) -> usize {
            let due = std::mem::take(&mut *self.0.lock().unwrap());
            let n = due.len();
            for f in due {
                f(o);
            }
            n
        }
    }

    /// One node's caching and share modes, over the shared records.
    #[derive(Clone)]
    struct Node {
        store: Arc<SharedMemory>,
        timers: Arc<Timers>,
        oplocks: Arc<Oplocks>,
        sm: Arc<ShareModes>,
    }

    fn node() -> Node {
        let store = Arc::new(SharedMemory::default());
        let timers = Arc::new(Timers::default());
        let oplocks = Oplocks::new(Duration::from_secs(35), store.clone())
            .with_host(timers.clone())
            .with_group_leases([7; 8]);
        Node {
            sm: Arc::new(ShareModes::new(store.clone())),
            store,
            timers,
            oplocks: Arc::new(oplocks),
        }
    }

    fn lease(n: u8) -> LeaseId {
        LeaseId {
            client: [n; 16],
            key: [n; 16],
        }
    }

    /// Open `open_id` of `file`, for reading and sharing everything, asking
    /// a read-handle lease under key `n`.
    fn reader(open_id: u64, n: u8) -> OpenAsk {
        OpenAsk {
            open_id,
            access: READ_DATA,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want: Want::Lease {
                id: lease(n),
                state: READ | HANDLE,
                version: 2,
                parent_key: None,
                epoch: 0,
            },
        }
    }

    impl Node {
        /// A reader joins the node's group of `K`, as a CREATE does
        /// (`contend`, then `admit_member`): its group's id.
        fn join(&self, ask: OpenAsk) -> u64 {
            let open = OpenRecord {
                open_id: ask.open_id,
                access: ask.access,
                share_access: SHARE_ALL,
            };
            let entry = self.sm.join_group(K, open, ask.open_id);
            let entry_ask = self
                .oplocks
                .group_lease_ask(K, entry.open_id, &ask)
                .expect("a reader's lease is groupable");
            let c = self
                .oplocks
                .contend_opening(K, &entry_ask, &self.sm, entry)
                .unwrap()
                .unwrap();
            assert!(!c.wait);
            entry.open_id
        }

        fn admit(&self, group: u64, ask: &OpenAsk) -> Granted {
            let route = super::super::tests::route();
            self.oplocks.admit_member(K, group, ask, route, &self.sm)
        }

        /// The group lease's grant in `K`'s caching record: its state, and
        /// whether a break of it awaits acknowledgement.
        fn grant(&self, group: u64) -> (u32, bool) {
            let key = K.record_key(CACHING_PREFIX);
            let s = records::read::<FileCaching>(&*self.store, &key).unwrap();
            let id = self.oplocks.groups().unwrap().lease_id(group);
            let g = s.grant(Holder::Lease(id)).expect("the group's grant");
            (g.state, g.breaking.is_some())
        }
    }

    fn state(g: Granted) -> u32 {
        match g {
            Granted::Lease { state, .. } => state,
            Granted::Oplock(_) => 0,
        }
    }

    #[test]
    fn a_group_acknowledgement_the_store_did_not_take_is_written_again() {
        let n = node();
        let ask = reader(1, 1);
        let group = n.join(ask);
        assert_eq!(state(n.admit(group, &ask)), READ | HANDLE);
        // A rename elsewhere breaks handle caching: the member is told.
        assert!(n.oplocks.contend_handles(K, 99));
        assert_eq!(n.grant(group), (READ | HANDLE, true));
        assert!(n.oplocks.open_breaking(K, 1));
        // Its acknowledgement passes the record's rule, but the write of
        // it fails (etcd did not answer).
        n.store.fail_next_write_on(&K.record_key(CACHING_PREFIX));
        assert!(matches!(
            n.oplocks.ack_lease(lease(1), READ),
            Some(AckOutcome::Done(_))
        ));
        assert_eq!(n.grant(group), (READ | HANDLE, true), "written anyway");
        // The write is tried again (GROUP_ACK_RETRY), and goes through:
        // the breaker need not wait out its timeout.
        assert!(n.timers.fire(&n.oplocks) > 0);
        assert_eq!(n.grant(group), (READ, false), "not written again");
    }

    #[test]
    fn a_member_s_break_is_known_to_await_its_answer_for_redelivery() {
        // `redeliver_breaks` asks `open_breaking` of each open whose break
        // went out on a lost channel. A member that is not its group's
        // first open is named by no grant of the record: only memory
        // knows its break.
        let n = node();
        let (first, second) = (reader(1, 1), reader(2, 2));
        let group = n.join(first);
        n.admit(group, &first);
        assert_eq!(n.join(second), group);
        assert_eq!(state(n.admit(group, &second)), READ | HANDLE);
        assert!(!n.oplocks.open_breaking(K, 2));
        assert!(n.oplocks.contend_handles(K, 99));
        assert!(
            n.oplocks.open_breaking(K, 2),
            "the member's break forgotten"
        );
        n.oplocks.ack_lease(lease(2), READ);
        assert!(!n.oplocks.open_breaking(K, 2), "answered, still breaking");
        // The first member still owes its answer.
        assert!(n.oplocks.open_breaking(K, 1));
    }

    #[test]
    fn a_key_joining_a_group_is_no_other_file_s_while_the_admit_is_written() {
        // A CREATE of another file naming the same lease key, admitted
        // while the group's admit waits on the store, must not take the
        // key: it would then name two files.
        let n = node();
        let ask = reader(1, 1);
        let group = n.join(ask);
        n.store.close_gate_on(&K.record_key(CACHING_PREFIX));
        let admitting = {
            let n = n.clone();
            std::thread::spawn(move || state(n.admit(group, &ask)))
        };
        n.store.wait_held(1);
        let elsewhere = FileKey::new(1, 8, 1);
        let other = OpenAsk {
            open_id: 5,
            ..reader(5, 1)
        };
        let route = super::super::tests::route();
        let c = n.oplocks.contend(elsewhere, &other);
        assert!(!c.wait);
        assert_eq!(
            state(n.oplocks.admit(elsewhere, &other, route)),
            0,
            "the key was taken by another file's open"
        );
        n.store.open_gate();
        assert_eq!(admitting.join().unwrap(), READ | HANDLE);
        assert!(n.oplocks.lease_fits(lease(1), Some(K)));
        assert!(!n.oplocks.lease_fits(lease(1), Some(elsewhere)));
    }
}
