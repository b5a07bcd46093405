//! The leases of one cluster node's group of alike opens
//! (`grouped_opens`), held in the file's caching record as a single grant:
//! "leases granted through the node" (docs/SCALING.md). Pure rules: the
//! service (`nimbus_services::oplocks::grouped`) sends the breaks and
//! writes the record.
//!
//! **Why.** A file that clients of several nodes open for reading with a
//! read or read-handle lease of their own costs a write of its caching
//! record at every open (the lease joins the record) and every close (it
//! leaves). The rules of MS-FSA 2.1.4.12 and MS-SMB2 3.3.5.9 only ask, of
//! the holders on *other* nodes, what each may cache. So a node can hold
//! one grant for all of its group's leases, at least as much as any of
//! them caches, and keep the members' own leases (key, state, epoch,
//! version) in memory, as this module does.
//!
//! **The group's grant is a lease.** It is named by a lease id this node
//! makes up (`GroupLeases::lease_id`): a client GUID that begins with
//! `MARK` and goes on with bytes the node drew at random when it started,
//! and a key that is the group's id. In the record it is an ordinary lease
//! whose one open is the group's entry, so every node, old or new, applies
//! the same rules to it, and a break of it goes, as any lease's break does,
//! to its first open, which names its node. No new record layout is needed.
//! A client cannot name it: it would have to guess 64 random bits, and the
//! CREATE path gives no group lease to a client GUID that begins with the
//! mark (`is_group_lease`).
//!
//! **What keeps it safe** (the invariant the tests below hold):
//! - a member is granted from memory only what the group's grant holds,
//!   and only while no break of it is known and the grant was proven by
//!   this node's last write, less than `LICENCE_LIFETIME` ago
//!   (`from_memory`): a break order that never came (its message lost,
//!   or its sender gone before it was sent) holds new members to the
//!   record again within that time;
//! - a break of the grant goes to every member whose state it lowers
//!   (`fan_out`); the group's grant is acknowledged in the record only once
//!   no member still waits (`GroupAck`), at the union of what the members
//!   kept, which is within what the break allows;
//! - a member admitted while a break is under way gets no more than the
//!   break's target, nor more than an acknowledgement handed out;
//! - what the node learns of the grant is ordered by the grant's epoch
//!   (`Known`): a write's answer, a break order or the end of a break
//!   that is older than what the node knows changes nothing;
//! - the group's acknowledgement names the epoch of its break, and the
//!   service writes it only into that break (the record would take any
//!   state within what a break allows, and an old acknowledgement could
//!   end a newer break below a member's state).
//!
//! So the record's grant is never less than what a member caches, and every
//! open on another node meets the rules it would meet with one grant per
//! lease.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::caching::{AckError, BreakOrder, Granted, Holder, LeaseId, HANDLE, READ, WRITE};
use crate::file_key::FileKey;

/// How long a write that proved the group's grant lets members be granted
/// from memory; the next member after it goes through the record, whose
/// answer proves the grant again. A second costs a busy group one write a
/// second at most.
pub const LICENCE_LIFETIME: Duration = Duration::from_secs(1);

/// The first half of a group lease's client GUID.
pub const MARK: [u8; 8] = *b"nimbus-g";

/// Whether `id` has the form of a group's lease (any node's): a client
/// whose own GUID has it gets no lease through a group.
pub fn is_group_lease(id: &LeaseId) -> bool {
    id.client[..8] == MARK
}

/// What a member's CREATE asks (its lease create context).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberAsk {
    pub id: LeaseId,
    /// Read, or read and handle: the states a group grants.
    pub state: u32,
    pub version: u8,
    pub parent_key: Option<[u8; 16]>,
    /// The epoch the client knows (lease v2; 0 for a new lease).
    pub epoch: u16,
}

/// Whether a lease ask may be served through a group: read, or read and
/// handle (a group grants no write caching: its members share one grant,
/// and writes are cached only by a file's sole user).
pub fn groupable(state: u32) -> bool {
    state == READ || state == READ | HANDLE
}

/// One member's lease, as the record would keep it if it were a grant of
/// its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub state: u32,
    pub epoch: u16,
    pub version: u8,
    pub parent_key: Option<[u8; 16]>,
    /// Its opens in the group (a break reaches the client through any).
    pub opens: Vec<u64>,
    /// A break awaits this member's acknowledgement: the state it was told
    /// to go to.
    pub sent: Option<u32>,
}

/// The group's grant as an admit's write left it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantSeen {
    pub state: u32,
    pub breaking: bool,
    pub epoch: u16,
}

/// The group's grant is to be acknowledged in the record at `state`: no
/// member waits any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupAck {
    pub group: u64,
    pub file: FileKey,
    pub id: LeaseId,
    pub state: u32,
    /// The epoch of the break it ends: it is written only while the
    /// record's grant is still in that break (the record takes any
    /// acknowledgement within what a break allows, and an old one could
    /// end a newer break).
    pub epoch: u16,
}

/// What a break of a group's grant leads to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FanOut {
    /// Each member's own break, and the open to send it through.
    pub breaks: Vec<(BreakOrder, u64)>,
    /// No member must acknowledge: the group's grant is acknowledged now.
    pub ack: Option<GroupAck>,
}

/// A member's accepted acknowledgement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberAcked {
    /// The member's state now.
    pub state: u32,
    /// It kept more than the group's break now allows: its further break.
    pub follow_up: Option<(BreakOrder, u64)>,
    /// It was the last member the group waited for.
    pub group: Option<GroupAck>,
}

struct Group {
    file: FileKey,
    /// What the record's grant holds, as this node last wrote or was told.
    granted: u32,
    /// A break of the grant that needs acknowledging is under way: the
    /// state the members must end at, until the record settles it.
    breaking: Option<u32>,
    /// The group's acknowledgement of that break was handed out
    /// (`GroupAck`) at this state: it is written once, and a member
    /// admitted before the record settles holds no more.
    acked: Option<u32>,
    /// The epoch of the last break order of the grant: an order with the
    /// same epoch is a step of the same break (no new epoch for members).
    order_epoch: Option<u16>,
    /// The newest state of the record's grant this node has learnt, from
    /// a break order, its own acknowledgement or an admit's write
    /// (`Known`): a write's answer taken in after a newer one is not
    /// believed.
    known: Option<Known>,
    /// The grant was proven by this node's last write, and no break of it
    /// has come since: members may be granted from memory.
    licensed: bool,
    /// When that write's answer was taken in.
    proven_at: Option<Instant>,
    members: HashMap<LeaseId, Member>,
}

/// One node's group leases.
pub struct GroupLeases {
    /// The second half of this node's group lease GUIDs.
    node: [u8; 8],
    groups: HashMap<u64, Group>,
    /// Each member's group.
    of_lease: HashMap<LeaseId, u64>,
    /// Each member open's lease.
    of_open: HashMap<u64, LeaseId>,
    /// `LICENCE_LIFETIME`, unless a test sets another.
    licence_lifetime: Duration,
}

impl GroupLeases {
    /// `node`: bytes drawn at random when the node starts.
    pub fn new(node: [u8; 8]) -> GroupLeases {
        GroupLeases {
            node,
            groups: HashMap::new(),
            of_lease: HashMap::new(),
            of_open: HashMap::new(),
            licence_lifetime: LICENCE_LIFETIME,
        }
    }

    /// The same, its grants' proofs lasting `lifetime` instead.
    pub fn with_licence_lifetime(self, lifetime: Duration) -> GroupLeases {
        GroupLeases {
            licence_lifetime: lifetime,
            ..self
        }
    }

    /// The lease id of group `group`'s grant.
    pub fn lease_id(&self, group: u64) -> LeaseId {
        let mut client = [0; 16];
        client[..8].copy_from_slice(&MARK);
        client[8..].copy_from_slice(&self.node);
        let mut key = [0; 16];
        key[..8].copy_from_slice(&group.to_le_bytes());
        LeaseId { client, key }
    }

    /// The group whose grant `id` names, if it is one of this node's.
    pub fn group_of(&self, id: &LeaseId) -> Option<u64> {
        let group = u64::from_le_bytes(id.key[..8].try_into().ok()?);
        (self.lease_id(group) == *id).then_some(group)
    }

    /// Whether group `group` (an open's id) holds a grant of this node's, or
    /// is about to.
    pub fn has_group(&self, group: u64) -> bool {
        self.groups.contains_key(&group)
    }

    /// The group lease `id` is a member of.
    pub fn member_group(&self, id: &LeaseId) -> Option<u64> {
        self.of_lease.get(id).copied()
    }

    /// The member lease that open `open_id` shares, if any.
    pub fn member_of_open(&self, open_id: u64) -> Option<(LeaseId, &Member)> {
        let id = self.of_open.get(&open_id)?;
        let group = self.of_lease.get(id)?;
        let m = self.groups.get(group)?.members.get(id)?;
        Some((*id, m))
    }

    /// The epoch of member `id`'s break that awaits its acknowledgement
    /// (its timer checks that it is still the same break).
    pub fn waiting_epoch(&self, id: &LeaseId) -> Option<u16> {
        let group = self.of_lease.get(id)?;
        let m = self.groups.get(group)?.members.get(id)?;
        m.sent.map(|_| m.epoch)
    }

    /// How many member leases this node keeps.
    pub fn len(&self) -> usize {
        self.of_lease.len()
    }

    pub fn is_empty(&self) -> bool {
        self.of_lease.is_empty()
    }

    /// Grants open `open_id` of group `group` its lease without a write,
    /// when the group's grant is proven, holds what is asked, and no break
    /// of it is known. `None`: go through the record (`admitted`).
    pub fn from_memory(&mut self, group: u64, ask: &MemberAsk, open_id: u64) -> Option<Granted> {
        let lifetime = self.licence_lifetime;
        let g = self.groups.get_mut(&group)?;
        let proven = g.proven_at.is_some_and(|t| t.elapsed() < lifetime);
        if !g.licensed || !proven || g.breaking.is_some() || !groupable(ask.state) {
            return None;
        }
        // One lease key has one holder: a key of another group is not
        // joined here.
        if self.of_lease.get(&ask.id).is_some_and(|&o| o != group) {
            return None;
        }
        if ask.state & !g.granted != 0 {
            return None;
        }
        let granted = g.granted;
        Some(self.join(group, ask, open_id, granted))
    }

    /// An admit of group `group`'s lease is about to be written for a
    /// member: a break of the grant that comes before the member is in
    /// the group (`admitted`) must find the group, to be answered for the
    /// members it has and to bound the newcomer.
    pub fn expect(&mut self, group: u64, file: FileKey) {
        self.groups.entry(group).or_insert_with(|| Group {
            file,
            granted: 0,
            breaking: None,
            acked: None,
            order_epoch: None,
            known: None,
            licensed: false,
            proven_at: None,
            members: HashMap::new(),
        });
    }

    /// The admit `expect` announced was not written: a group left without
    /// members is forgotten (no grant of it was written either).
    pub fn abandon(&mut self, group: u64) {
        if self
            .groups
            .get(&group)
            .is_some_and(|g| g.members.is_empty())
        {
            self.groups.remove(&group);
        }
    }

    /// The record admitted the group's lease (after `expect`) for open
    /// `open_id`, which asked `ask`; the write left the grant as `seen`.
    /// Returns what the member is granted.
    pub fn admitted(
        &mut self,
        group: u64,
        file: FileKey,
        ask: &MemberAsk,
        open_id: u64,
        seen: GrantSeen,
    ) -> Granted {
        self.expect(group, file);
        let Some(g) = self.groups.get_mut(&group) else {
            return self.join(group, ask, open_id, 0);
        };
        // A break order, or the end of a break, that came between the
        // write and now is newer than what the write saw: the group's
        // view stands.
        let overtaken = !learn(
            &mut g.known,
            Known {
                epoch: seen.epoch,
                settled: !seen.breaking,
            },
        );
        if !overtaken {
            g.granted = seen.state;
        }
        g.licensed = !overtaken && !seen.breaking && g.breaking.is_none();
        if g.licensed {
            g.proven_at = Some(Instant::now());
        }
        // A break being fanned out bounds what a new member may hold, and
        // so does an acknowledgement handed out; a break whose order has
        // not come yet will reach this member too.
        let allowed = g.granted
            & seen.state
            & g.breaking.unwrap_or(READ | HANDLE)
            & g.acked.unwrap_or(READ | HANDLE);
        self.join(group, ask, open_id, allowed)
    }

    /// Adds the open to its member lease (new, or upgraded within `allowed`
    /// as MS-SMB2 3.3.5.9.8 upgrades an existing lease).
    fn join(&mut self, group: u64, ask: &MemberAsk, open_id: u64, allowed: u32) -> Granted {
        let none = Granted::Lease {
            state: 0,
            epoch: ask.epoch,
            breaking: false,
            version: ask.version,
        };
        // One lease key has one holder: a key another group holds (the
        // same client opening the file with other access or sharing) is
        // granted nothing here.
        if self.of_lease.get(&ask.id).is_some_and(|&o| o != group) {
            return none;
        }
        let Some(g) = self.groups.get_mut(&group) else {
            return none;
        };
        self.of_lease.insert(ask.id, group);
        let offered = lease_state(ask.state & allowed & (READ | HANDLE));
        let m = g.members.entry(ask.id).or_insert_with(|| Member {
            state: offered,
            // A new lease continues from the client's epoch, one higher
            // once it holds anything (MS-SMB2 3.3.5.9.11).
            epoch: if offered != 0 {
                ask.epoch.wrapping_add(1)
            } else {
                ask.epoch
            },
            version: ask.version,
            parent_key: ask.parent_key,
            opens: Vec::new(),
            sent: None,
        });
        if !m.opens.contains(&open_id) {
            m.opens.push(open_id);
        }
        self.of_open.insert(open_id, ask.id);
        if m.sent.is_none() && offered & m.state == m.state && offered != m.state {
            m.state = offered;
            m.epoch = m.epoch.wrapping_add(1);
        }
        Granted::Lease {
            state: m.state,
            epoch: m.epoch,
            breaking: m.sent.is_some(),
            version: m.version,
        }
    }

    /// Open `open_id` closed (or its CREATE did not go on). Its member lease
    /// goes with its last open; a break that waited only for it is then
    /// acknowledged for the group.
    pub fn leave(&mut self, open_id: u64) -> Option<GroupAck> {
        let id = self.of_open.remove(&open_id)?;
        let group = self.member_group(&id)?;
        let g = self.groups.get_mut(&group)?;
        let m = g.members.get_mut(&id)?;
        m.opens.retain(|&o| o != open_id);
        if m.opens.is_empty() {
            g.members.remove(&id);
            self.of_lease.remove(&id);
        }
        self.ack_if_done(group)
    }

    /// The group's entry left the records (its last open closed): the
    /// grant went with it.
    /// The member leases that went with it.
    pub fn forget_group(&mut self, group: u64) -> Vec<LeaseId> {
        let Some(g) = self.groups.remove(&group) else {
            return Vec::new();
        };
        for (id, m) in &g.members {
            self.of_lease.remove(id);
            for o in &m.opens {
                self.of_open.remove(o);
            }
        }
        g.members.into_keys().collect()
    }

    /// A break of group `group`'s grant came (from this node's own
    /// contention or another node's): each member whose state it lowers
    /// gets its own break, and members are granted from the record again
    /// until the group's next write proves its grant.
    pub fn fan_out(&mut self, group: u64, order: &BreakOrder) -> FanOut {
        let mut out = FanOut::default();
        let Some(g) = self.groups.get_mut(&group) else {
            return out;
        };
        // Epochs rise by one at each break or upgrade of the grant: an
        // order older than the last one that came was overtaken (orders
        // from different nodes travel different ways), and what the record
        // did since reached the group already.
        if g.known.is_some_and(|k| later(k.epoch, order.epoch)) {
            return out;
        }
        let new_break = g.order_epoch != Some(order.epoch);
        if !new_break && g.acked.is_some() {
            // A step of a break the group answered already: told again.
            return out;
        }
        g.licensed = false;
        if new_break {
            // The record settled the last break before it sent this one.
            g.acked = None;
        }
        g.order_epoch = Some(order.epoch);
        learn(
            &mut g.known,
            Known {
                epoch: order.epoch,
                settled: !order.ack_required,
            },
        );
        if order.ack_required {
            g.breaking = Some(g.breaking.map_or(order.to, |b| b & order.to));
        } else {
            // The record moved the grant already.
            g.granted = order.to;
        }
        let target = g.breaking.unwrap_or(order.to) & order.to;
        for (id, m) in &mut g.members {
            if m.sent.is_some() || m.state & !target == 0 {
                // Waiting already (its acknowledgement is held to the
                // target), or untouched by the break.
                continue;
            }
            if new_break {
                m.epoch = m.epoch.wrapping_add(1);
            }
            if let Some(b) = member_break(*id, m, target) {
                out.breaks.push(b);
            }
        }
        out.ack = self.ack_if_done(group);
        out
    }

    /// Member `id`'s client acknowledged its break with `state` (MS-SMB2
    /// 3.3.5.22.2). `Err(Unknown)`: not a member lease.
    pub fn ack(&mut self, id: &LeaseId, state: u32) -> Result<MemberAcked, AckError> {
        let group = self.member_group(id).ok_or(AckError::Unknown)?;
        let g = self.groups.get_mut(&group).ok_or(AckError::Unknown)?;
        let (target, granted) = (g.breaking, g.granted);
        let m = g.members.get_mut(id).ok_or(AckError::Unknown)?;
        let sent = m.sent.ok_or(AckError::NotBreaking)?;
        if state & !sent != 0 {
            return Err(AckError::TooMuch);
        }
        if state != 0 && state & READ == 0 {
            return Err(AckError::NotALeaseState);
        }
        m.sent = None;
        m.state = state;
        // Held to what the group's break now allows, as `caching::settle`
        // holds a lease to a lowered requirement, or, the break being
        // over, to what the record's grant holds.
        let follow_up = member_break(*id, m, target.unwrap_or(granted) & state);
        let state = m.state;
        Ok(MemberAcked {
            state,
            follow_up,
            group: self.ack_if_done(group),
        })
    }

    /// Member `id` did not acknowledge in time: it loses its caching
    /// (MS-SMB2 3.3.6.5), and the group may be acknowledged.
    pub fn timed_out(&mut self, id: &LeaseId) -> Option<GroupAck> {
        let group = self.member_group(id)?;
        let m = self.groups.get_mut(&group)?.members.get_mut(id)?;
        m.sent.take()?;
        m.state = 0;
        self.ack_if_done(group)
    }

    /// The record's grant settled at `state`, at epoch `epoch`: the
    /// group's acknowledgement was written, or the record was read after
    /// the break ended otherwise (its timer on the breaking node fired
    /// first). No member may cache more: a member that still does is
    /// broken now (the breaks returned), and one that waits is held to it
    /// when it answers. After the group's own acknowledgement there are
    /// none: every member is within it. What the group learnt since (a
    /// newer break, a newer write) is newer than this, and is left to run.
    pub fn settled(&mut self, group: u64, state: u32, epoch: u16) -> Vec<(BreakOrder, u64)> {
        let Some(g) = self.groups.get_mut(&group) else {
            return Vec::new();
        };
        if !learn(
            &mut g.known,
            Known {
                epoch,
                settled: true,
            },
        ) {
            return Vec::new();
        }
        g.granted = state;
        g.breaking = None;
        g.acked = None;
        break_above(&mut g.members, state)
    }

    /// After `admitted` took in a grant lower than what members cache and
    /// no break of it is known (its order never came): those members are
    /// broken to it now (the breaks returned), as `settled` breaks them.
    pub fn hold_to_grant(&mut self, group: u64) -> Vec<(BreakOrder, u64)> {
        let Some(g) = self.groups.get_mut(&group) else {
            return Vec::new();
        };
        if g.breaking.is_some() || !g.licensed {
            return Vec::new();
        }
        break_above(&mut g.members, g.granted)
    }

    /// The group's acknowledgement handed out could not be written (the
    /// store did not answer): it is handed out again by `retry_ack`.
    pub fn unack(&mut self, group: u64) {
        if let Some(g) = self.groups.get_mut(&group) {
            g.acked = None;
        }
    }

    /// The group's acknowledgement, if a break of its grant waits for no
    /// member and none is being written: after `unack`.
    pub fn retry_ack(&mut self, group: u64) -> Option<GroupAck> {
        self.ack_if_done(group)
    }

    /// The group's acknowledgement, once a break of its grant waits for no
    /// member: at the union of what the members hold.
    fn ack_if_done(&mut self, group: u64) -> Option<GroupAck> {
        let g = self.groups.get_mut(&group)?;
        g.breaking?;
        if g.acked.is_some() || g.members.values().any(|m| m.sent.is_some()) {
            return None;
        }
        let state = g.members.values().fold(0, |s, m| s | m.state);
        let file = g.file;
        let epoch = g.order_epoch?;
        // Written once. It, and the break's target, bound members admitted
        // before the record settles (`settled`).
        g.acked = Some(state);
        Some(GroupAck {
            group,
            file,
            id: self.lease_id(group),
            state,
            epoch,
        })
    }
}

/// A state of the group's grant in the record: its epoch, and whether a
/// break at that epoch had ended (a break raises the epoch and is then
/// under way; its acknowledgement ends it at the same epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    epoch: u16,
    settled: bool,
}

/// Whether epoch `a` comes after `b`. Epochs rise by one at each break or
/// upgrade of the grant, and wrap: far fewer than 2^15 changes are ever
/// in flight at once.
fn later(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) > 0
}

/// Takes in `seen` unless what is `known` is newer; whether it was taken.
fn learn(known: &mut Option<Known>, seen: Known) -> bool {
    let newer = known.is_some_and(|k| {
        later(k.epoch, seen.epoch) || (k.epoch == seen.epoch && k.settled && !seen.settled)
    });
    if !newer {
        *known = Some(seen);
    }
    !newer
}

/// `state` as a lease state: read is the least one holds (handle alone
/// is none).
fn lease_state(state: u32) -> u32 {
    if state & READ == 0 {
        0
    } else {
        state
    }
}

/// Breaks member `m` to `to` if it holds more: recorded as awaiting its
/// acknowledgement when it caches handles, done at once otherwise.
/// Breaks, each with a new epoch, the members that cache more than
/// `state`. One that waits for its answer is left: it answers what it was
/// told, and `ack` then holds it to the grant.
fn break_above(members: &mut HashMap<LeaseId, Member>, state: u32) -> Vec<(BreakOrder, u64)> {
    let mut breaks = Vec::new();
    for (id, m) in members {
        if m.sent.is_none() && m.state & !state != 0 {
            m.epoch = m.epoch.wrapping_add(1);
            breaks.extend(member_break(*id, m, state));
        }
    }
    breaks
}

fn member_break(id: LeaseId, m: &mut Member, to: u32) -> Option<(BreakOrder, u64)> {
    let to = m.state & to;
    if m.state & !to == 0 {
        return None;
    }
    let ack_required = m.state & (WRITE | HANDLE) != 0;
    let order = BreakOrder {
        holder: Holder::Lease(id),
        from: m.state,
        to,
        ack_required,
        epoch: m.epoch,
        version: m.version,
    };
    if ack_required {
        m.sent = Some(to);
    } else {
        m.state = to;
    }
    Some((order, *m.opens.first()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caching::{FileCaching, OpenAsk, Want};

    const NODE: [u8; 8] = [7; 8];
    const GROUP: u64 = 3 << 40 | 9;
    const RH: u32 = READ | HANDLE;
    /// A proof's lifetime no test outlasts.
    const HOUR: Duration = Duration::from_secs(3600);

    fn file() -> FileKey {
        FileKey::new(1, 2, 1)
    }

    fn lease(n: u8) -> LeaseId {
        LeaseId {
            client: [n; 16],
            key: [n; 16],
        }
    }

    fn ask(n: u8, state: u32) -> MemberAsk {
        MemberAsk {
            id: lease(n),
            state,
            version: 2,
            parent_key: None,
            epoch: 0,
        }
    }

    fn seen(state: u32, breaking: bool, epoch: u16) -> GrantSeen {
        GrantSeen {
            state,
            breaking,
            epoch,
        }
    }

    fn state_of(g: Granted) -> u32 {
        match g {
            Granted::Lease { state, .. } => state,
            Granted::Oplock(_) => panic!("a member is granted a lease"),
        }
    }

    /// The group's grant as the record holds it, admitted for the group's
    /// entry: what `admitted` is told.
    fn record_with_group(leases: &GroupLeases, state: u32) -> FileCaching {
        let mut rec = FileCaching::default();
        rec.admit(&group_ask(leases, state));
        rec
    }

    /// The record's first break of the group's read-handle grant, to `to`.
    fn break_of(l: &GroupLeases, to: u32) -> BreakOrder {
        BreakOrder {
            holder: Holder::Lease(l.lease_id(GROUP)),
            from: RH,
            to,
            ack_required: true,
            epoch: 2,
            version: 2,
        }
    }

    fn group_with(members: &[(u8, u64)]) -> GroupLeases {
        let mut l = GroupLeases::new(NODE).with_licence_lifetime(HOUR);
        for (i, (n, open)) in members.iter().enumerate() {
            if i == 0 {
                l.admitted(GROUP, file(), &ask(*n, RH), *open, seen(RH, false, 1));
            } else {
                assert!(l.from_memory(GROUP, &ask(*n, RH), *open).is_some());
            }
        }
        l
    }

    #[test]
    fn a_group_lease_id_names_its_group_and_only_this_node_s() {
        let l = GroupLeases::new(NODE).with_licence_lifetime(HOUR);
        let id = l.lease_id(GROUP);
        assert!(is_group_lease(&id));
        assert_eq!(l.group_of(&id), Some(GROUP));
        assert_eq!(GroupLeases::new([8; 8]).group_of(&id), None);
        assert_eq!(l.group_of(&lease(1)), None);
        assert!(!is_group_lease(&lease(1)));
        // Any open's id makes a well-formed group lease id: only a group
        // this node keeps has one.
        assert!(!l.has_group(GROUP));
        assert!(group_with(&[(1, 10)]).has_group(GROUP));
    }

    #[test]
    fn members_after_the_first_are_granted_from_memory_what_the_grant_holds() {
        let mut l = GroupLeases::new(NODE).with_licence_lifetime(HOUR);
        assert_eq!(l.from_memory(GROUP, &ask(1, RH), 10), None, "no grant yet");
        let first = l.admitted(GROUP, file(), &ask(1, RH), 10, seen(RH, false, 1));
        assert_eq!(state_of(first), RH);
        let second = l.from_memory(GROUP, &ask(2, READ), 11).unwrap();
        assert_eq!(state_of(second), READ);
        // Another open of the same lease key joins its member lease.
        let again = l.from_memory(GROUP, &ask(2, RH), 12).unwrap();
        assert_eq!(state_of(again), RH, "upgraded within the grant");
        assert_eq!(l.len(), 2);
        assert_eq!(l.member_of_open(12).unwrap().1.opens, vec![11, 12]);
    }

    #[test]
    fn a_proof_older_than_its_lifetime_sends_the_next_member_to_the_record() {
        // A break order may never come (its message lost): the grant in
        // memory is believed only for a while after a write proved it.
        let mut l = GroupLeases::new(NODE).with_licence_lifetime(Duration::ZERO);
        l.admitted(GROUP, file(), &ask(1, RH), 10, seen(RH, false, 1));
        assert_eq!(
            l.from_memory(GROUP, &ask(2, READ), 11),
            None,
            "proof expired"
        );
        // The record's answer, taken in through the next member's admit,
        // is what the group then holds: here the grant lost its read
        // caching to a write whose order never came.
        let second = l.admitted(GROUP, file(), &ask(2, RH), 11, seen(0, false, 2));
        assert_eq!(state_of(second), 0);
        // The first member, which still caches, is broken to it.
        let breaks = l.hold_to_grant(GROUP);
        assert_eq!(breaks.len(), 1);
        let (order, open) = breaks[0];
        assert_eq!(
            (order.holder, order.from, order.to, order.ack_required, open),
            (Holder::Lease(lease(1)), RH, 0, true, 10)
        );
        assert!(l.hold_to_grant(GROUP).is_empty(), "told once");
        assert_eq!(l.ack(&lease(1), 0).unwrap().state, 0);
        let mut l = GroupLeases::new(NODE);
        assert_eq!(LICENCE_LIFETIME, Duration::from_secs(1));
        l.admitted(GROUP, file(), &ask(1, RH), 10, seen(RH, false, 1));
        assert!(
            l.from_memory(GROUP, &ask(2, READ), 11).is_some(),
            "a fresh proof is used"
        );
    }

    #[test]
    fn a_grant_that_holds_less_than_asked_or_is_being_broken_sends_members_to_the_record() {
        let mut l = GroupLeases::new(NODE).with_licence_lifetime(HOUR);
        l.admitted(GROUP, file(), &ask(1, READ), 10, seen(READ, false, 1));
        assert_eq!(l.from_memory(GROUP, &ask(2, RH), 11), None);
        let mut l = GroupLeases::new(NODE).with_licence_lifetime(HOUR);
        l.admitted(GROUP, file(), &ask(1, RH), 10, seen(RH, true, 1));
        assert_eq!(l.from_memory(GROUP, &ask(2, READ), 11), None, "not proven");
        // Write caching is never a group's.
        let mut l = group_with(&[(1, 10)]);
        assert_eq!(l.from_memory(GROUP, &ask(2, READ | WRITE), 11), None);
    }

    #[test]
    fn a_break_reaches_every_member_and_the_group_is_acknowledged_after_the_last() {
        let mut l = group_with(&[(1, 10), (2, 11), (3, 12)]);
        // The record breaks the group's grant RH -> R (a sharing violation
        // elsewhere), and so tells the group's node.
        let mut rec = record_with_group(&l, RH);
        let c = rec.contend(&OpenAsk {
            open_id: 99,
            access: 0x4000_0000,
            overwrite: false,
            sharing_violation: true,
            is_dir: false,
            has_byte_range_locks: false,
            want: Want::Nothing,
        });
        assert_eq!(c.breaks.len(), 1);
        let out = l.fan_out(GROUP, &c.breaks[0]);
        assert_eq!(out.breaks.len(), 3);
        assert!(out.ack.is_none());
        assert!(out
            .breaks
            .iter()
            .all(|(b, _)| b.from == RH && b.to == READ && b.ack_required && b.epoch == 2));
        assert_eq!(l.from_memory(GROUP, &ask(4, READ), 13), None, "revoked");
        assert!(l.ack(&lease(1), READ).unwrap().group.is_none());
        assert_eq!(l.ack(&lease(1), READ), Err(AckError::NotBreaking));
        assert_eq!(l.ack(&lease(2), RH), Err(AckError::TooMuch));
        assert!(l.ack(&lease(2), 0).unwrap().group.is_none());
        // The last one to answer closes instead.
        let ack = l.leave(12).unwrap();
        assert_eq!(ack.state, READ, "the union of what members kept");
        assert_eq!(ack.id, l.lease_id(GROUP));
        // The record takes it, and the break is over there too.
        let settled = rec.ack_lease(ack.id, ack.state).unwrap();
        assert_eq!(settled.state, READ);
        assert!(!rec.breaking());
        assert_eq!(l.settled(GROUP, settled.state, ack.epoch), vec![]);
        assert_eq!(l.member_of_open(10).unwrap().1.state, READ);
    }

    #[test]
    fn a_break_that_needs_no_answer_lowers_members_at_once() {
        let mut l = GroupLeases::new(NODE).with_licence_lifetime(HOUR);
        l.admitted(GROUP, file(), &ask(1, READ), 10, seen(READ, false, 1));
        l.from_memory(GROUP, &ask(2, READ), 11).unwrap();
        let mut rec = record_with_group(&l, READ);
        let orders = rec.contend_readers(99);
        let out = l.fan_out(GROUP, &orders[0]);
        assert_eq!(out.breaks.len(), 2);
        assert!(out.breaks.iter().all(|(b, _)| !b.ack_required && b.to == 0));
        assert_eq!(out.ack, None, "the record moved already");
        assert_eq!(l.member_of_open(11).unwrap().1.state, 0);
        assert_eq!(l.from_memory(GROUP, &ask(3, READ), 12), None);
    }

    #[test]
    fn a_member_admitted_during_a_break_holds_no_more_than_its_target() {
        let mut l = group_with(&[(1, 10)]);
        let order = break_of(&l, READ);
        l.fan_out(GROUP, &order);
        // The record still holds RH (breaking); a new member is admitted.
        let g = l.admitted(GROUP, file(), &ask(2, RH), 11, seen(RH, true, 2));
        assert_eq!(state_of(g), READ);
        // Its acknowledgement is not waited for: only member 1's is.
        let acked = l.ack(&lease(1), READ).unwrap();
        assert_eq!(acked.group.map(|a| a.state), Some(READ));
    }

    #[test]
    fn a_member_that_does_not_answer_counts_as_none() {
        let mut l = group_with(&[(1, 10), (2, 11)]);
        let order = break_of(&l, 0);
        l.fan_out(GROUP, &order);
        assert!(l.ack(&lease(1), 0).unwrap().group.is_none());
        assert_eq!(l.timed_out(&lease(2)).map(|a| a.state), Some(0));
        assert_eq!(l.timed_out(&lease(2)), None, "once");
    }

    #[test]
    fn a_repeated_order_is_a_step_of_the_same_break() {
        let mut l = group_with(&[(1, 10)]);
        let order = break_of(&l, READ);
        let first = l.fan_out(GROUP, &order);
        let again = l.fan_out(GROUP, &order);
        assert_eq!(first.breaks.len(), 1);
        assert!(
            again.breaks.is_empty() && again.ack.is_none(),
            "still waiting"
        );
        assert_eq!(l.member_of_open(10).unwrap().1.epoch, 2);
    }

    #[test]
    fn the_record_settling_first_holds_members_to_it() {
        let mut l = group_with(&[(1, 10), (2, 11)]);
        let order = break_of(&l, READ);
        l.fan_out(GROUP, &order);
        l.ack(&lease(1), READ).unwrap();
        // The breaker's timer ended the break in the record at none: the
        // member that answered is broken again, the other held to none.
        let breaks = l.settled(GROUP, 0, 2);
        assert_eq!(breaks.len(), 1);
        assert_eq!(
            (breaks[0].0.from, breaks[0].0.to, breaks[0].1),
            (READ, 0, 10)
        );
        assert_eq!(l.member_of_open(10).unwrap().1.state, 0);
        // The other answers what it was told, and is held to the record.
        let late = l.ack(&lease(2), READ).unwrap();
        assert_eq!(late.state, 0);
        let (follow_up, open) = late.follow_up.unwrap();
        assert_eq!(
            (follow_up.from, follow_up.to, follow_up.ack_required, open),
            (READ, 0, false, 11)
        );
        assert_eq!(l.from_memory(GROUP, &ask(3, READ), 12), None);
    }

    #[test]
    fn a_key_of_another_group_is_not_joined_and_a_group_s_end_forgets_its_members() {
        let mut l = group_with(&[(1, 10)]);
        l.admitted(GROUP + 1, file(), &ask(2, RH), 20, seen(RH, false, 1));
        assert_eq!(l.from_memory(GROUP, &ask(2, RH), 11), None);
        // Nor through the record: the key stays with its group.
        let other = l.admitted(GROUP + 1, file(), &ask(1, RH), 21, seen(RH, false, 1));
        assert_eq!(state_of(other), 0);
        assert_eq!(l.member_group(&lease(1)), Some(GROUP));
        assert_eq!(l.member_of_open(21), None);
        l.forget_group(GROUP);
        assert_eq!(l.member_group(&lease(1)), None);
        assert_eq!(l.member_group(&lease(2)), Some(GROUP + 1));
    }

    /// The group beside a record it shares with other nodes' opens, in
    /// random interleavings: joins (from memory or through the record),
    /// closes, contention from elsewhere, breaks delivered late, members'
    /// acknowledgements and timeouts, the group's acknowledgement written
    /// late. After every step no member caches more than the record's
    /// grant holds; at the end, with every message delivered and every
    /// member answering, no break is left under way.
    #[test]
    fn no_member_ever_caches_more_than_the_record_grants() {
        for seed in 1..=2000u64 {
            run_model(seed, 300);
        }
    }

    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            // xorshift64*
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    fn group_ask(l: &GroupLeases, state: u32) -> OpenAsk {
        OpenAsk {
            open_id: GROUP,
            access: 0x8000_0000,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want: Want::Lease {
                id: l.lease_id(GROUP),
                state,
                version: 2,
                parent_key: None,
                epoch: 0,
            },
        }
    }

    fn elsewhere(sharing_violation: bool, overwrite: bool) -> OpenAsk {
        OpenAsk {
            open_id: 99,
            access: 0x4000_0000,
            overwrite,
            sharing_violation,
            is_dir: false,
            has_byte_range_locks: false,
            want: Want::Nothing,
        }
    }

    struct World {
        rec: FileCaching,
        l: GroupLeases,
        orders: Vec<BreakOrder>,
        acks: Vec<GroupAck>,
        opens: Vec<u64>,
        /// Members whose admit was written, not yet taken in.
        admitting: Vec<(MemberAsk, u64, GrantSeen)>,
        /// The group's acknowledgements written, their answers not yet
        /// taken in.
        settling: Vec<(u16, crate::caching::Acked)>,
        next_open: u64,
    }

    impl World {
        fn holder(&self) -> Holder {
            Holder::Lease(self.l.lease_id(GROUP))
        }

        fn join(&mut self, member: u8, state: u32) {
            let a = ask(member, state);
            let open = self.next_open;
            self.next_open += 1;
            if self.l.from_memory(GROUP, &a, open).is_some() {
                self.opens.push(open);
                return;
            }
            let asked = group_ask(&self.l, state);
            if self.rec.contend(&asked).wait {
                return;
            }
            self.l.expect(GROUP, file());
            // As `Oplocks::admit` does: the entry, counted by `contend`, is
            // admitted in its place.
            self.rec.opens.retain(|o| o.open_id != GROUP);
            self.rec.admit(&asked);
            // The group's entry is one open of the grant, however many of
            // its members went through the record.
            let g = self.rec.grant(self.holder()).cloned().unwrap();
            assert_eq!(g.opens, vec![GROUP]);
            // Breaks may come before the write's answer is taken in.
            let seen = GrantSeen {
                state: g.state,
                breaking: g.breaking.is_some(),
                epoch: g.epoch,
            };
            self.admitting.push((a, open, seen));
        }

        fn admitted(&mut self, at: usize) {
            let (a, open, seen) = self.admitting.remove(at);
            self.l.admitted(GROUP, file(), &a, open, seen);
            // As the service does: members above a lower grant the write
            // found are broken to it (their breaks are in `waiting`).
            self.l.hold_to_grant(GROUP);
            self.opens.push(open);
        }

        fn leave(&mut self, at: usize) {
            let open = self.opens.swap_remove(at);
            self.acks.extend(self.l.leave(open));
            if self.opens.is_empty() && self.admitting.is_empty() {
                self.settling.clear();
                // The group's entry goes with its last open, and its grant
                // with it: what was in flight for it finds nothing.
                self.l.forget_group(GROUP);
                self.rec.remove_open(GROUP);
                self.orders.clear();
                self.acks.clear();
            }
        }

        fn contend(&mut self, how: u64) {
            let orders = match how {
                0 => self.rec.contend(&elsewhere(true, false)).breaks,
                1 => self.rec.contend(&elsewhere(false, true)).breaks,
                2 => self.rec.contend_readers(99),
                _ => self.rec.contend_handles(99).breaks,
            };
            self.orders.extend(orders);
        }

        fn deliver(&mut self, at: usize) {
            let order = self.orders.remove(at);
            let out = self.l.fan_out(GROUP, &order);
            self.acks.extend(out.ack);
        }

        fn waiting(&self) -> Vec<(LeaseId, u32)> {
            let mut w: Vec<_> = self
                .l
                .groups
                .values()
                .flat_map(|g| g.members.iter())
                .filter_map(|(id, m)| m.sent.map(|s| (*id, s)))
                .collect();
            w.sort_by_key(|(id, _)| id.key);
            w
        }

        fn answer(&mut self, at: usize, how: u64) {
            let (id, sent) = self.waiting()[at];
            let state = match how {
                0 => sent,
                1 => sent & READ,
                _ => 0,
            };
            let acked = self.l.ack(&id, state).unwrap();
            self.acks.extend(acked.group);
        }

        fn time_out(&mut self, at: usize) {
            let (id, _) = self.waiting()[at];
            self.acks.extend(self.l.timed_out(&id));
        }

        fn write_ack(&mut self, at: usize) {
            let ack = self.acks.remove(at);
            // As the service writes it: only into the break it ends.
            let g = self.rec.grant(self.holder()).cloned().unwrap();
            if g.epoch != ack.epoch || g.breaking.is_none() {
                return;
            }
            match self.rec.ack_lease(ack.id, ack.state) {
                // Taken in later: another break may reach the group first.
                Ok(done) => self.settling.push((ack.epoch, done)),
                Err(e) => panic!("the group's acknowledgement of {g:?} refused: {e:?} ({ack:?})"),
            }
        }

        fn settle(&mut self, at: usize) {
            let (epoch, done) = self.settling.remove(at);
            // Every member is within what the group acknowledged, unless
            // the record went on at once to a lower requirement (a
            // follow-up needing no answer): its breaks are those of
            // `settled`.
            let breaks = self.l.settled(GROUP, done.state, epoch);
            match done.follow_up {
                Some(f) if !f.ack_required => {
                    assert!(breaks.iter().all(|(b, _)| !b.ack_required && b.to == f.to))
                }
                _ => assert_eq!(breaks, vec![]),
            }
            self.orders.extend(done.follow_up);
        }

        fn check(&self, seed: u64, step: usize) {
            let members: Vec<&Member> = self
                .l
                .groups
                .values()
                .flat_map(|g| g.members.values())
                .collect();
            let Some(g) = self.rec.grant(self.holder()) else {
                assert!(
                    members.is_empty(),
                    "seed {seed} step {step}: members without a grant"
                );
                return;
            };
            // A break that needs no answer moves the record at once, and
            // its holders when it reaches them: the window every holder of
            // read caching has, one grant per lease or not.
            let told_late = self
                .orders
                .iter()
                .chain(
                    self.settling
                        .iter()
                        .filter_map(|(_, a)| a.follow_up.as_ref()),
                )
                .filter(|o| !o.ack_required)
                .fold(0, |s, o| s | o.from);
            for m in members {
                assert_eq!(
                    m.state & !(g.state | told_late),
                    0,
                    "seed {seed} step {step}: a member caches {:#x}, the record grants {:#x}",
                    m.state,
                    g.state
                );
            }
        }
    }

    fn run_model(seed: u64, steps: usize) {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut w = World {
            rec: FileCaching::default(),
            l: GroupLeases::new(NODE).with_licence_lifetime(HOUR),
            orders: Vec::new(),
            acks: Vec::new(),
            opens: Vec::new(),
            admitting: Vec::new(),
            settling: Vec::new(),
            next_open: 100,
        };
        for step in 0..steps {
            match rng.below(10) {
                0 | 1 => {
                    let state = if rng.below(2) == 0 { READ } else { RH };
                    w.join(rng.below(4) as u8 + 1, state);
                }
                2 if !w.opens.is_empty() => w.leave(rng.below(w.opens.len() as u64) as usize),
                3 if !w.opens.is_empty() => w.contend(rng.below(4)),
                4 if !w.orders.is_empty() => w.deliver(rng.below(w.orders.len() as u64) as usize),
                5 if !w.waiting().is_empty() => {
                    let at = rng.below(w.waiting().len() as u64) as usize;
                    if rng.below(8) == 0 {
                        w.time_out(at);
                    } else {
                        w.answer(at, rng.below(3));
                    }
                }
                6 if !w.acks.is_empty() => w.write_ack(rng.below(w.acks.len() as u64) as usize),
                8 if !w.settling.is_empty() => {
                    w.settle(rng.below(w.settling.len() as u64) as usize)
                }
                7 if !w.admitting.is_empty() => {
                    w.admitted(rng.below(w.admitting.len() as u64) as usize)
                }
                _ => {}
            }
            w.check(seed, step);
        }
        // Everything delivered, every member answering: the record's break
        // ends.
        for _ in 0..32 {
            while !w.admitting.is_empty() {
                w.admitted(0);
            }
            while !w.orders.is_empty() {
                w.deliver(0);
            }
            while !w.waiting().is_empty() {
                w.answer(0, 0);
            }
            while !w.acks.is_empty() {
                w.write_ack(0);
            }
            while !w.settling.is_empty() {
                w.settle(0);
            }
            w.check(seed, steps);
        }
        assert!(
            !w.rec.breaking(),
            "seed {seed}: a break never ends: {:?}",
            w.rec
        );
    }
}
