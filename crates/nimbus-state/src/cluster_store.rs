//! The store of a cluster node: per-file ownership over etcd
//! (ARCHITECTURE.md "State"), so that a file used from one node costs no
//! etcd round trip per open, and a file used from several is decided on
//! etcd's linearizable records.
//!
//! Keys under the `clustered` prefixes are one file's records (`prefix`
//! then the file's 24-byte key, the file's "group"). For each group:
//! - **Owned** by this node: `own/<group>` in etcd names this node's
//!   incarnation; the records live in this node's memory and etcd's copy
//!   is stale. Reads and compare-and-sets are local.
//! - **Shared** (no `own/<group>`): etcd holds the records; every
//!   compare-and-set is an etcd transaction that also checks nobody owns
//!   the group.
//! - **Owned by another node**: this node writes `release/<owner>/<group>`;
//!   the owner, watching its `release/` range, writes its records back and
//!   deletes `own/<group>` in one transaction; the group is then shared.
//!
//! An ownership record is not under the owner's lease: etcd 3.6 (and
//! 3.5.30+, 3.4.44+) checks every key on a lease at each put under it in
//! a transaction when authentication is on, and a node's takes would cost
//! in proportion to the files it holds (docs/SCALING.md, "Which etcd").
//! It names the owner's incarnation, whose record (`incarnations/<n>`) is
//! under the lease instead, and it is **dead** unless that record was
//! created before it: an incarnation record that is gone, or that was
//! put again later (a restarted node adopting an earlier run), ends the
//! ownership. A node writes `own/` only while its own incarnation record
//! exists (the fence, `EtcdStore::fence_on`), so a live owner's record is
//! always younger than its incarnation's; and once dead, a record stays
//! dead (incarnation numbers are never drawn twice, and a record put
//! again is younger). Whoever finds a dead one deletes it
//! (`clear_if_dead`) and looks again.
//!
//! A node takes a group when its records name no other live node's opens
//! (`claimable`): the first open of a file, and a file every other node
//! has let go of. Groups this node owns and nobody has open are given back
//! after a while (`sweep`), so that etcd holds one key per file in use
//! (and, until they are cleared, those of nodes that are gone).
//!
//! Versions: etcd's mod_revisions for shared records, and versions with
//! the top bit set for owned ones, so that a version read in one state
//! never matches in the other: a compare-and-set that raced a change of
//! ownership fails and its caller reads again. Keys outside the clustered
//! prefixes stay in this node's memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::etcd_store::{Cmp, Op, TxnOutcome, Txns, MAX_READS_PER_REQUEST, MAX_TXNS_PER_REQUEST};
use crate::group_commit::{Answers, GroupCommit};
use crate::memory::MemoryStore;
use crate::store::{
    Change, Durability, InPlace, Memo, StateError, StateStore, Together, TurnsUpdate, Versioned,
    Written,
};
use crate::EtcdStore;

mod dir_claims;
pub use dir_claims::{made_here, of_a_directory, opening_in, OpeningIn, CLAIM_PREFIX};

/// Key prefix of ownership records.
pub const OWN_PREFIX: &[u8] = b"own/";
/// Key prefix of hand-back requests: `release/<owner>/<group>`.
pub const RELEASE_PREFIX: &[u8] = b"release/";

/// Versions of owned records carry this bit; etcd revisions never do.
const LOCAL_VERSION: u64 = 1 << 63;

/// Whether a record (key, value) names only opens this node may decide
/// alone (its own, or those of nodes that are gone).
pub type Claimable = Box<dyn Fn(&[u8], &[u8]) -> bool + Send + Sync>;

enum Group {
    Owned {
        records: BTreeMap<Vec<u8>, Versioned>,
        /// Since when no record of the group exists (None: some does).
        empty_since: Option<Instant>,
        /// When this node took the group (`TENURE`).
        taken: Instant,
        /// The directory whose claim this node holds the group under, made
        /// there with no `own/` record (`dir_claims`); None: taken.
        under: Option<Vec<u8>>,
    },
    /// Being written back to etcd: callers wait. Also while a write-back
    /// whose outcome etcd left unknown is tried again (`unsettled`).
    Releasing,
    /// One thread of this node is looking the group up in etcd and may
    /// take it; the others only read it meanwhile (`peek`). Two lookups
    /// that may take it would race: the second would find this node named
    /// owner in etcd but not yet in memory, take that for a lost hand-back
    /// and delete the ownership the first had just taken, leaving this
    /// node deciding the file from memory while another node may take it.
    /// The token tells this lookup's mark from a later lookup's.
    Finding(u64),
}

/// Ends a `Group::Finding` however the lookup ended (a taken group is
/// `Owned` by then and stays so).
struct FindingMark<'a> {
    store: &'a ClusterStore,
    group: &'a [u8],
    token: u64,
}

impl Drop for FindingMark<'_> {
    fn drop(&mut self) {
        let mut g = self.store.lock();
        if matches!(g.get(self.group), Some(Group::Finding(t)) if *t == self.token) {
            g.remove(self.group);
        }
        drop(g);
        self.store.changed.notify_all();
    }
}

pub struct ClusterStore {
    etcd: Arc<EtcdStore>,
    local: MemoryStore,
    clustered: Vec<&'static [u8]>,
    /// Key prefix of the incarnation records (`incarnations/<n>`).
    incarnations: &'static [u8],
    /// Incarnations read alive lately: the create revision of each one's
    /// record, and when it was read (`ALIVE_FOR`).
    seen_alive: Mutex<HashMap<Vec<u8>, (u64, Instant)>>,
    /// This node's incarnation, as `own/` records name it: a new one
    /// after the node lost its lease and joined again (`rejoined`).
    me: Mutex<Arc<[u8]>>,
    lease: AtomicI64,
    claimable: Claimable,
    groups: Mutex<HashMap<Vec<u8>, Group>>,
    /// Directories this node claims (`dir_claims`). Taken before `groups`
    /// when both are.
    claims: Mutex<dir_claims::Claims>,
    /// Signalled when a claim's write or letting go ends.
    claims_changed: Condvar,
    changed: Condvar,
    next_version: AtomicU64,
    /// How long to wait for another node to hand a group over before the
    /// operation fails (its lease must have expired by then).
    handover_timeout: Duration,
    /// Until when this node's lease is proven (nanoseconds after `epoch`;
    /// u64::MAX until `lease_proven_until` is first told). Past it etcd
    /// may have ended the lease and given this node's files to others, so
    /// the groups it holds in memory are not decided here until a renewal
    /// proves the lease again: a node cut off from etcd stops granting
    /// within its lease TTL.
    proven_until: AtomicU64,
    epoch: Instant,
    /// Turns of updates of shared records (`StateStore::in_turn`), one
    /// per record, each with what the last update in it left. One per
    /// record, not shared by a hash: an update may wait in its turn for a
    /// hand-over (up to `handover_timeout`), and only its own file's
    /// updates should wait with it.
    turns: Mutex<HashMap<Vec<u8>, Turn>>,
    /// Groups whose write-back failed without a definite answer (etcd may
    /// have applied it): their records and when they were taken. Until a
    /// write-back of them is answered, they are neither decided from
    /// memory (another node may have them now) nor given up (etcd may
    /// still name this node as owner with records older than these); they
    /// stay `Releasing` and `settle` tries again.
    unsettled: Mutex<HashMap<Vec<u8>, Unsettled>>,
    /// Takes of files nobody has records of (`find`'s first transaction),
    /// those of lookups that arrive together sent in one request.
    takes: GroupCommit<(Vec<u8>, Option<Vec<u8>>), TxnOutcome>,
    /// Reads of a group's ownership and one of its records (`peek`), those
    /// of lookups that arrive together sent in one read-only request.
    peeks: GroupCommit<Peek, PeekAnswer>,
    /// How many times the node lost its lease (`forget_all`) or joined
    /// again (`rejoined`), changed under the groups' lock: a take
    /// answered after such a change that it began before must not be
    /// adopted into memory (see `adopt`).
    lease_changes: AtomicU64,
    /// Tests: the next write-back is applied, but its answer is lost.
    #[cfg(test)]
    lose_write_back_answer: std::sync::atomic::AtomicBool,
    /// Test hook: the lease is lost just before the next take is adopted.
    #[cfg(test)]
    lose_lease_before_adopting: std::sync::atomic::AtomicBool,
    /// Test hook: the next write decided from memory, once past its fence
    /// and under the groups' lock, says so on the first channel and goes
    /// on when the second one hears.
    #[cfg(test)]
    decision_gate: crate::test_gate::TestGate,
    /// Test hook: the next claim of a directory, once written and before
    /// this node holds it, says so and waits to be let go.
    #[cfg(test)]
    claim_gate: crate::test_gate::TestGate,
    /// Test hook: a wait for a hand-over that watches never reads the
    /// record or the owner's incarnation, so only the watch can end it
    /// before the hand-over timeout.
    #[cfg(test)]
    watch_alone: std::sync::atomic::AtomicBool,
}

type Turn = Arc<Mutex<Option<Memo>>>;

/// An unsettled write-back's records, and when the group was taken.
type Unsettled = (BTreeMap<Vec<u8>, Versioned>, Instant);

/// What a compare-and-set of a shared record came to.
enum SharedSet {
    /// Written, at this version (0: deleted).
    Written(u64),
    /// Not written: another write came first; the record as it is now
    /// (when read).
    Lost(Option<Versioned>),
    /// The group is owned (here or elsewhere), or the version expected
    /// was an owned record's: the record is where its owner keeps it.
    NotShared,
}

/// How many records' turns are kept before those nobody is in are
/// forgotten (with what they remembered: their next update reads first).
const TURNS_KEPT: usize = 4096;

/// What etcd said about a group this node does not own.
enum Found {
    Taken,
    Shared(Option<Versioned>),
    /// Owned by the node incarnation named, since the revision given (the
    /// `own/` record's version: the same node may own the group again
    /// later, under another).
    OwnedBy(Vec<u8>, u64),
    /// Nobody owns it and it has no records, but the directory it was
    /// opened through is claimed (`dir_claims`): by the incarnation named,
    /// since the revision given; the claim's key.
    ClaimedBy(Vec<u8>, u64, Vec<u8>),
    /// The records changed between two looks: look again.
    Retry,
}

/// How long a node keeps a file it took before it hands it back to
/// another node that asks (a request that comes sooner is answered when
/// the time is up). A file opened from several nodes at once moves to
/// whichever node finds it free and is asked back at the next open
/// elsewhere; each move costs a request, a hand-back and a take, and
/// without a tenure the file moved at nearly every open, with every
/// node's opens waiting on the moves. With one, the node that has it
/// decides its own clients' opens from memory for that long, and the
/// others' wait at most that long more. 40 ms, not 20: since an asker
/// watches for the hand-back (`ask_release`) it gets the file at its
/// second ask, and with 20 ms turns the moves took 15-35 % off the rate
/// of a file four clients on three nodes open (BENCHMARKS.md, "A watch
/// for the second ask").
const TENURE: Duration = Duration::from_millis(40);

/// How many times one read looks again after losing a race, at least:
/// it goes on as long as a hand-over may take (`look_up`).
const FIND_TRIES: usize = 64;

/// How long a batch of takes may be out before the takes queued behind it
/// go without it (`crate::group_commit`): a healthy etcd answers in a few
/// milliseconds, so one out longer is stuck on a member that fails or
/// hangs, and its wait must not become every other CREATE's.
const TAKE_PATIENCE: Duration = Duration::from_millis(25);

/// At most this many batches of takes (or of peeks) out at once.
const TAKES_OUT: usize = 4;

/// What a peek reads: a group's ownership key, one of its records' keys,
/// and the claim of the directory it was opened through, if any.
type Peek = (Vec<u8>, Vec<u8>, Option<Vec<u8>>);
/// A peek's answer: the file's ownership record, the record asked for and
/// the claim (None when the file is owned: the lookup does not go on
/// them).
type PeekAnswer = (Option<Versioned>, Option<Versioned>, Option<Versioned>);

/// How many peeks one read-only request carries: up to three reads each.
const PEEKS_PER_REQUEST: usize = MAX_READS_PER_REQUEST / 3;

/// A wait for a hand-over looks whether the owner is dead first after
/// this, then once per `DEAD_OWNER_LOOK_EVERY`: a live owner answers
/// sooner, and each such look costs etcd a read.
const DEAD_OWNER_FIRST_LOOK: Duration = Duration::from_millis(30);
const DEAD_OWNER_LOOK_EVERY: Duration = Duration::from_millis(250);

/// How often, at most, a wait for a hand-over that does not watch reads
/// the ownership record (`ask_release`): at once, then after 1 ms, twice
/// as long each time up to this.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// How long an incarnation read alive is taken for alive without reading
/// it again, where being wrong costs only time (`clear_if_dead`): an
/// attribute open of a file another node holds is answered from its
/// records in etcd rather than found free for up to this long after its
/// owner died.
const ALIVE_FOR: Duration = Duration::from_secs(1);

/// At most this many incarnations are remembered alive.
const ALIVE_KEPT: usize = 1024;

/// Ownership records read at once by `clear_gone_owners`: a pass over a
/// cluster with many files in use is many small reads, not one answer
/// past etcd's limits or the call's timeout.
#[cfg(not(test))]
const GONE_OWNERS_PAGE: i64 = 1024;
/// Small in tests, whose few records then take several pages.
#[cfg(test)]
const GONE_OWNERS_PAGE: i64 = 2;

fn key_of(prefix: &[u8], group: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(prefix.len() + group.len());
    k.extend_from_slice(prefix);
    k.extend_from_slice(group);
    k
}

/// Transactions of conditions and writes that read nothing when they
/// fail, to send together (`EtcdStore::txns`).
/// Transactions of `parts`: compares, operations on success, reads on
/// failure.
fn with_reads<'a, C, O, R>(parts: &'a [(C, O, R)]) -> Vec<Txns<'a>>
where
    C: AsRef<[Cmp<'a>]>,
    O: AsRef<[Op<'a>]>,
    R: AsRef<[Op<'a>]>,
{
    parts
        .iter()
        .map(|(cmps, success, failure)| Txns {
            cmps: cmps.as_ref(),
            success: success.as_ref(),
            failure: failure.as_ref(),
        })
        .collect()
}

fn unread<'a, C, O>(parts: &'a [(C, O)]) -> Vec<Txns<'a>>
where
    C: AsRef<[Cmp<'a>]>,
    O: AsRef<[Op<'a>]>,
{
    parts
        .iter()
        .map(|(cmps, ops)| Txns {
            cmps: cmps.as_ref(),
            success: ops.as_ref(),
            failure: &[],
        })
        .collect()
}

/// `release/<owner>/<group>`.
pub fn release_key(owner: &[u8], group: &[u8]) -> Vec<u8> {
    let mut k = RELEASE_PREFIX.to_vec();
    k.extend_from_slice(owner);
    k.push(b'/');
    k.extend_from_slice(group);
    k
}

/// The record a hand-over request's subject names: `own/<group>` for a
/// file's group, the claim itself for a directory's claim.
fn record_of(subject: &[u8]) -> Vec<u8> {
    if subject.starts_with(CLAIM_PREFIX) {
        subject.to_vec()
    } else {
        key_of(OWN_PREFIX, subject)
    }
}

impl ClusterStore {
    /// A store deciding the records under `clustered` by ownership, as
    /// incarnation `me` holding etcd lease `lease`; incarnation `n`'s
    /// record is `incarnations` then `n`. `etcd` must be fenced on `me`'s
    /// record (`EtcdStore::fence_on`), and `rejoined` told of a new
    /// incarnation before the fence moves to it: an ownership is alive
    /// only while it is younger than its incarnation's record, which the
    /// fence makes true of every take.
    pub fn new(
        etcd: Arc<EtcdStore>,
        clustered: Vec<&'static [u8]>,
        incarnations: &'static [u8],
        me: &str,
        lease: i64,
        claimable: Claimable,
        handover_timeout: Duration,
    ) -> ClusterStore {
        ClusterStore {
            etcd,
            local: MemoryStore::new(),
            clustered,
            incarnations,
            seen_alive: Mutex::new(HashMap::new()),
            me: Mutex::new(Arc::from(me.as_bytes())),
            lease: AtomicI64::new(lease),
            claimable,
            groups: Mutex::new(HashMap::new()),
            claims: Mutex::new(dir_claims::Claims::default()),
            claims_changed: Condvar::new(),
            changed: Condvar::new(),
            next_version: AtomicU64::new(1),
            handover_timeout,
            proven_until: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            turns: Mutex::new(HashMap::new()),
            unsettled: Mutex::new(HashMap::new()),
            takes: GroupCommit::new(MAX_TXNS_PER_REQUEST, TAKES_OUT, TAKE_PATIENCE),
            peeks: GroupCommit::new(PEEKS_PER_REQUEST, TAKES_OUT, TAKE_PATIENCE),
            lease_changes: AtomicU64::new(0),
            #[cfg(test)]
            lose_write_back_answer: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            lose_lease_before_adopting: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            decision_gate: Default::default(),
            #[cfg(test)]
            claim_gate: Default::default(),
            #[cfg(test)]
            watch_alone: Default::default(),
        }
    }

    /// This node's lease is proven to last until `until` (a renewal sent
    /// at `t` proves it until `t` plus its TTL).
    pub fn lease_proven_until(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.epoch).as_nanos();
        self.proven_until.store(
            u64::try_from(nanos).unwrap_or(u64::MAX - 1),
            Ordering::SeqCst,
        );
    }

    /// This node's incarnation as `own/` records name it.
    fn me(&self) -> Arc<[u8]> {
        self.me.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Refuses a decision from memory that the lease no longer proves.
    fn fenced(&self) -> Result<(), StateError> {
        let now = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        if now < self.proven_until.load(Ordering::SeqCst) {
            return Ok(());
        }
        Err(StateError::Unavailable(
            "cut off from etcd: this node's lease is not proven, so the files it holds are not \
             decided here until it is renewed"
                .into(),
        ))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Group>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn group<'k>(&self, key: &'k [u8]) -> Option<&'k [u8]> {
        self.clustered
            .iter()
            .find_map(|p| key.strip_prefix(*p))
            .filter(|g| !g.is_empty())
    }

    fn local_version(&self) -> u64 {
        LOCAL_VERSION | self.next_version.fetch_add(1, Ordering::Relaxed)
    }

    /// How many groups this node owns now.
    pub fn owned(&self) -> usize {
        self.lock()
            .values()
            .filter(|g| matches!(g, Group::Owned { .. }))
            .count()
    }

    /// Whether this node owns the group `group` now.
    pub fn owns(&self, group: &[u8]) -> bool {
        matches!(self.lock().get(group), Some(Group::Owned { .. }))
    }

    /// Waits while `group` is being written back or taken; returns the
    /// guard.
    fn settled(&self, group: &[u8]) -> MutexGuard<'_, HashMap<Vec<u8>, Group>> {
        self.settled_while(group, |g| matches!(g, Group::Releasing | Group::Finding(_)))
    }

    /// Waits while `group` is being written back; returns the guard.
    fn written_back(&self, group: &[u8]) -> MutexGuard<'_, HashMap<Vec<u8>, Group>> {
        self.settled_while(group, |g| matches!(g, Group::Releasing))
    }

    fn settled_while(
        &self,
        group: &[u8],
        busy: impl Fn(&Group) -> bool,
    ) -> MutexGuard<'_, HashMap<Vec<u8>, Group>> {
        let mut g = self.lock();
        while g.get(group).is_some_and(&busy) {
            g = crate::blocking::off_worker(|| {
                self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
            });
        }
        g
    }

    /// Reads `group` from etcd, taking it when nobody owns it and its
    /// records are claimable; `key`'s record when it stays shared.
    fn find(&self, group: &[u8], key: &[u8]) -> Result<Found, StateError> {
        let changes = self.lease_changes.load(Ordering::SeqCst);
        // After the count, as `forget_all` ends the proof before it counts:
        // a take that passes this is made under the lease of `changes`.
        self.fenced()?;
        let own = key_of(OWN_PREFIX, group);
        let keys: Vec<Vec<u8>> = self.clustered.iter().map(|p| key_of(p, group)).collect();
        let claim = self.claim_to_compare(group);
        // The common case, a file nobody has records of: taken in one
        // transaction, sent with those of other lookups under way.
        let t = self
            .takes
            .submit((group.to_vec(), claim.clone()), |asked| {
                self.take_new(asked)
            })?;
        if t.succeeded {
            return Ok(self.adopt(group, BTreeMap::new(), changes));
        }
        let short = || StateError::Unavailable("etcd: short transaction answer".into());
        let (owner, records, claimed) = match (t.reads.split_first(), &claim) {
            (Some((owner, rest)), None) => (owner, rest, None),
            (Some((owner, rest)), Some(_)) => match rest.split_last() {
                Some((claimed, records)) => (owner, records, claimed.as_ref()),
                None => return Err(short()),
            },
            (None, _) => return Err(short()),
        };
        if records.len() != keys.len() {
            return Err(short());
        }
        if let Some(owner) = owner {
            return Ok(Found::OwnedBy(owner.value.clone(), owner.version));
        }
        if let (Some(holder), Some(claim), true) =
            (claimed, &claim, records.iter().all(Option::is_none))
        {
            return Ok(Found::ClaimedBy(
                holder.value.clone(),
                holder.version,
                claim.clone(),
            ));
        }
        let present: Vec<(&Vec<u8>, &Versioned)> = keys
            .iter()
            .zip(records)
            .filter_map(|(k, r)| r.as_ref().map(|r| (k, r)))
            .collect();
        if present.iter().all(|(k, r)| (self.claimable)(k, &r.value)) {
            let mut cmps = vec![Cmp::Absent(&own)];
            // A file with records is no claim's; one without is, if its
            // directory's claim came since the read.
            if let Some(claim) = claim.as_ref().filter(|_| present.is_empty()) {
                cmps.push(Cmp::Absent(claim));
            }
            cmps.extend(
                keys.iter()
                    .zip(records)
                    .map(|(k, r)| Cmp::Version(k, r.as_ref().map(|r| r.version))),
            );
            let t = self.etcd.txn(&cmps, &[Op::Put(&own, &self.me(), 0)], &[])?;
            if t.succeeded {
                let records = present
                    .into_iter()
                    .map(|(k, r)| {
                        (
                            k.clone(),
                            Versioned {
                                version: self.local_version(),
                                value: r.value.clone(),
                            },
                        )
                    })
                    .collect();
                return Ok(self.adopt(group, records, changes));
            }
            return Ok(Found::Retry);
        }
        let mine = keys.iter().position(|k| k.as_slice() == key);
        Ok(Found::Shared(
            mine.and_then(|i| records.get(i).cloned().flatten()),
        ))
    }

    /// `group`'s ownership key and its records' keys (in `clustered`
    /// order).
    fn keys_of(&self, group: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
        let records = self.clustered.iter().map(|p| key_of(p, group)).collect();
        (key_of(OWN_PREFIX, group), records)
    }

    /// Takes each group asked for if nobody owns it, it has no record and
    /// the claim given with it is absent, in
    /// one request (a transaction alone, or one for each when several
    /// lookups arrived together: `EtcdStore::txns`); each one's outcome,
    /// its ownership and records read when it was not taken.
    fn take_new(&self, asked: &[(Vec<u8>, Option<Vec<u8>>)]) -> Answers<TxnOutcome> {
        let me = self.me();
        let keys: Vec<(Vec<u8>, Vec<Vec<u8>>)> =
            asked.iter().map(|(g, _)| self.keys_of(g)).collect();
        type Parts<'k> = (Vec<Cmp<'k>>, [Op<'k>; 1], Vec<Op<'k>>);
        let parts: Vec<Parts<'_>> = keys
            .iter()
            .zip(asked)
            .map(|((own, records), (_, claim))| {
                let mut cmps = vec![Cmp::Absent(own)];
                cmps.extend(records.iter().map(|k| Cmp::Absent(k)));
                let mut reads = vec![Op::Get(own)];
                reads.extend(records.iter().map(|k| Op::Get(k)));
                // The claim of the directory the file was opened through:
                // compared and read last (`dir_claims`).
                if let Some(claim) = claim {
                    cmps.push(Cmp::Absent(claim));
                    reads.push(Op::Get(claim));
                }
                // Not under the lease: see the module comment.
                (cmps, [Op::Put(own, &me, 0)], reads)
            })
            .collect();
        if let [(cmps, success, failure)] = parts.as_slice() {
            return Ok(vec![self.etcd.txn(cmps, success, failure)]);
        }
        self.etcd.txns(&with_reads(&parts))
    }

    /// Reads `group` from etcd without taking it (another thread of this
    /// node is looking it up and may): its owner, or `key`'s record when
    /// nobody owns it.
    fn peek(&self, group: &[u8], key: &[u8]) -> Result<Found, StateError> {
        let own = key_of(OWN_PREFIX, group);
        let claim = self.claim_to_compare(group);
        let (owner, record, claimed) = self
            .peeks
            .submit((own, key.to_vec(), claim.clone()), |asked| {
                self.peek_many(asked)
            })?;
        Ok(match (owner, claimed, claim) {
            (Some(owner), _, _) => Found::OwnedBy(owner.value, owner.version),
            // The directory's claim covers a file without records (one of
            // them read: one found is enough to say it has some).
            (None, Some(holder), Some(claim)) if record.is_none() => {
                Found::ClaimedBy(holder.value, holder.version, claim)
            }
            _ => Found::Shared(record),
        })
    }

    /// Reads each of `asked` (an ownership key and a record's key) in one
    /// read-only request (`EtcdStore::get_many`: no raft proposal). A
    /// record that does not decode (forged) fails its own pair's answer
    /// only, not the other lookups'.
    fn peek_many(&self, asked: &[Peek]) -> Answers<PeekAnswer> {
        let keys: Vec<&[u8]> = asked
            .iter()
            .flat_map(|(own, key, claim)| {
                [Some(own.as_slice()), Some(key.as_slice()), claim.as_deref()]
                    .into_iter()
                    .flatten()
            })
            .collect();
        let mut reads = self.etcd.get_many(&keys)?.into_iter();
        // Two reads per peek, three with a claim: `get_many` answers every
        // key or fails (and `submit` fails a peek a short answer left out).
        let mut answers = Vec::with_capacity(asked.len());
        for (_, _, claim) in asked {
            let (Some(owner), Some(record)) = (reads.next(), reads.next()) else {
                break;
            };
            let claimed = match claim {
                Some(_) => match reads.next() {
                    Some(c) => Some(c),
                    None => break,
                },
                None => None,
            };
            answers.push(match (owner, record, claimed) {
                // Owned: the record is not what the lookup goes on (`peek`),
                // so one that does not decode does not fail it.
                (Ok(Some(owner)), _, _) => Ok((Some(owner), None, None)),
                (owner, record, claimed) => {
                    (|| Ok((owner?, record?, claimed.transpose()?.flatten())))()
                }
            });
        }
        Ok(answers)
    }

    /// A compare-and-set of a shared group's record in etcd, provided
    /// nobody took the group meanwhile. Lost: with `read`, the record as
    /// the same transaction found it (None when the group is owned, or
    /// `expected` is an owned record's version: stale now).
    fn set_shared(
        &self,
        group: &[u8],
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
        read: bool,
    ) -> Result<SharedSet, StateError> {
        if expected.is_some_and(|v| v & LOCAL_VERSION != 0) {
            return Ok(SharedSet::NotShared);
        }
        let own = key_of(OWN_PREFIX, group);
        let op = match &value {
            Some(v) => Op::Put(key, v, 0),
            None => Op::Delete(key),
        };
        let mut cmps = vec![Cmp::Absent(&own), Cmp::Version(key, expected)];
        // A record written where none was, by an open: not in a file its
        // directory's claim covers (`dir_claims`). A claim found makes the
        // group not shared, and the caller looks it up.
        let claim = self.claim_to_compare(group).filter(|_| expected.is_none());
        if let Some(claim) = &claim {
            cmps.push(Cmp::Absent(claim));
        }
        // With a claim compared, the group's other records are read too:
        // a file with records is no claim's, whatever its directory's.
        let others: Vec<Vec<u8>> = match claim {
            Some(_) => self
                .clustered
                .iter()
                .map(|p| key_of(p, group))
                .filter(|k| k[..] != *key)
                .collect(),
            None => Vec::new(),
        };
        let mut reads = vec![Op::Get(&own), Op::Get(key)];
        reads.extend(others.iter().map(|k| Op::Get(k)));
        let failure: &[Op<'_>] = if read || claim.is_some() { &reads } else { &[] };
        let mut t = self.etcd.txn(&cmps, std::slice::from_ref(&op), failure)?;
        if let (false, Some(_), [None, None, rest @ ..]) = (t.succeeded, &claim, t.reads.as_slice())
        {
            // Lost to the claim: written after all when the file has other
            // records, compared unchanged in place of the claim.
            let present: Vec<(&Vec<u8>, u64)> = others
                .iter()
                .zip(rest)
                .filter_map(|(k, r)| Some((k, r.as_ref()?.version)))
                .collect();
            if present.is_empty() {
                return Ok(SharedSet::NotShared);
            }
            let mut cmps = vec![Cmp::Absent(&own), Cmp::Version(key, None)];
            cmps.extend(present.iter().map(|(k, v)| Cmp::Version(k, Some(*v))));
            t = self.etcd.txn(&cmps, &[op], &reads[..2])?;
        }
        if t.succeeded {
            return Ok(SharedSet::Written(if value.is_some() {
                t.revision
            } else {
                0
            }));
        }
        match t.reads.get(..2) {
            Some([None, now]) if read => Ok(SharedSet::Lost(now.clone())),
            _ => Ok(SharedSet::NotShared),
        }
    }

    /// Holds `group` in memory, taken in etcd with `records` by a lookup
    /// that began after `changes` lease changes; `Found::Retry` when the
    /// node lost its lease or joined again since. etcd may have applied
    /// the take under the incarnation that ended with the lease, and then
    /// the ownership is dead: a group held in memory that etcd names
    /// nobody's would be decided here, once the node joined again, while
    /// another node took it too. `forget_all` dropped what it held; this
    /// keeps a take that was under way from coming back after it. The
    /// lookup looks again: once the lease is proven, a record the take
    /// left under an incarnation still alive names this node and is
    /// mended as a lost hand-back (`ask_release`); before, `fenced`
    /// refuses.
    fn adopt(&self, group: &[u8], records: BTreeMap<Vec<u8>, Versioned>, changes: u64) -> Found {
        #[cfg(test)]
        if self
            .lose_lease_before_adopting
            .swap(false, Ordering::SeqCst)
        {
            self.forget_all();
        }
        let empty_since = records.is_empty().then(Instant::now);
        let mut g = self.lock();
        if self.lease_changes.load(Ordering::SeqCst) != changes {
            tracing::debug!("cluster: a file taken across a change of lease is not held");
            return Found::Retry;
        }
        g.insert(
            group.to_vec(),
            Group::Owned {
                records,
                empty_since,
                taken: Instant::now(),
                under: None,
            },
        );
        crate::metrics_names::file_taken();
        drop(g);
        self.changed.notify_all();
        Found::Taken
    }

    /// Asks `owner` to hand `group` over and waits until it has (or is
    /// found gone: `clear_if_dead`). `since` is the revision of the ownership asked
    /// about: the owner may hand the group back and take it again (its
    /// own clients' next open) between the asking and the looking, and
    /// that new ownership has not been asked for. A request for it may be
    /// gone already: the owner deletes requests as it hands back, and one
    /// that reached it between two ownerships. So the request is written
    /// only while that ownership stands, and the wait ends when it ends,
    /// however briefly, for the caller to look again (and ask again).
    ///
    /// With `watch` (a lookup's second ask and later) the wait watches the
    /// ownership record from the revision the request was written at;
    /// without, it reads the record at once, then after 1 ms, twice as
    /// long each time up to `POLL_EVERY`. The owner's own clients take the file
    /// again about one round trip after it hands it back, and an asker
    /// that polls wakes 10-30 ms late and sees only the new ownership: a
    /// lookup that only polled could lose every race to the owner for
    /// seconds (docs/SCALING.md, "Waiting for a hand-over"). A watch hears
    /// the hand-back as soon as the owner's clients do. The first ask
    /// polls all the same: the owner's clients keep the file for that
    /// while, which cost fewer hand-overs than a watch at every ask
    /// (BENCHMARKS.md, "A watch for the second ask"). A watch that fails
    /// leaves the wait reading the record.
    ///
    /// Ok(true): the ownership asked about ended while asked (handed back,
    /// found dead, or a lost hand-back mended), and the caller looks again
    /// at once; Ok(false): it had ended before the request was written, a
    /// race lost.
    fn ask_release(
        &self,
        owner: &[u8],
        since: u64,
        group: &[u8],
        watch: bool,
    ) -> Result<bool, StateError> {
        crate::metrics_names::handover_asked();
        let own = record_of(group);
        let me = self.me();
        if owner == &*me {
            // Named as owner by etcd but not in memory: a hand-back whose
            // answer was lost. The records in etcd are the last written.
            let t = self
                .etcd
                .txn(&[Cmp::Version(&own, Some(since))], &[Op::Delete(&own)], &[])?;
            return Ok(t.succeeded);
        }
        if self.clear_if_dead(owner, since, group, false)? {
            return Ok(true);
        }
        let request = release_key(owner, group);
        let lease = self.lease.load(Ordering::SeqCst);
        let t = self.etcd.txn(
            &[Cmp::Version(&own, Some(since))],
            &[Op::Put(&request, &me, lease)],
            &[],
        )?;
        if !t.succeeded {
            return Ok(false);
        }
        let deadline = Instant::now() + self.handover_timeout;
        let mut dead_look = Instant::now() + DEAD_OWNER_FIRST_LOOK;
        // Tests: only the watch may end the wait (`watch_alone`).
        #[cfg(test)]
        let read_at_deadline = !(watch && self.watch_alone.load(Ordering::SeqCst));
        #[cfg(not(test))]
        let read_at_deadline = true;
        if !read_at_deadline {
            dead_look = deadline + Duration::from_secs(3600);
        }
        // Every change after the request's revision: the ownership stood
        // until then (the request's condition). An answer without its
        // revision (etcd's header missing) is not watched from: from
        // revision 1 the watch would replay the key's history, and every
        // ask would end at once.
        let asked_at = t.revision;
        let mut watch = (watch && asked_at > 0).then(|| self.etcd.watch(&own, asked_at + 1));
        let mut pause = Duration::from_millis(1);
        loop {
            let now = Instant::now();
            // Now and then the record is read too, and the owner's
            // incarnation: a watch slow to deliver (its member silent) is
            // caught up with, and an owner that dies while asked never
            // answers: its ownership ends with its incarnation record.
            // Without a watch, the record is read every time; with one, at
            // the deadline too, before the wait fails.
            if now >= dead_look || watch.is_none() || (now >= deadline && read_at_deadline) {
                match self.etcd.get(&own)? {
                    Some(v) if v.version == since => {}
                    _ => return Ok(true),
                }
            }
            if now >= dead_look {
                dead_look = now + DEAD_OWNER_LOOK_EVERY;
                if self.clear_if_dead(owner, since, group, true)? {
                    return Ok(true);
                }
            }
            if now >= deadline {
                return Err(StateError::Unavailable(format!(
                    "node incarnation {} did not hand over a file within {:?}",
                    String::from_utf8_lossy(owner),
                    self.handover_timeout
                )));
            }
            let wait = deadline.min(dead_look).saturating_duration_since(now);
            let Some(w) = watch.as_mut() else {
                let nap = wait.min(pause);
                crate::blocking::off_worker(|| std::thread::sleep(nap));
                pause = (pause * 2).min(POLL_EVERY);
                continue;
            };
            match w.next(wait) {
                // The record changed (the ownership ended, or another
                // began), or changes were compacted away: look again.
                Ok(batch)
                    if batch.resync
                        || batch
                            .events
                            .iter()
                            .any(|e| e.key == own && e.revision > asked_at) =>
                {
                    return Ok(true)
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("cluster: watching a file's hand-over: {e}; reading instead");
                    watch = None;
                }
            }
        }
    }

    /// Whether the ownership of `group` by incarnation `owner` since
    /// revision `since` is dead (see the module comment): then it is
    /// deleted, with any request to that owner about it, and Ok(true)
    /// tells the caller to look again. This node's own ownership is never
    /// dead to it (it is fenced on its incarnation record instead). Not
    /// `fresh`, an owner read alive in the last `ALIVE_FOR` is taken for
    /// alive without a read.
    fn clear_if_dead(
        &self,
        owner: &[u8],
        since: u64,
        group: &[u8],
        fresh: bool,
    ) -> Result<bool, StateError> {
        if owner == &*self.me() {
            return Ok(false);
        }
        let alive = |born: u64| born < since;
        if !fresh {
            let seen = self.seen_alive.lock().unwrap_or_else(|p| p.into_inner());
            if seen
                .get(owner)
                .is_some_and(|(born, at)| at.elapsed() < ALIVE_FOR && alive(*born))
            {
                return Ok(false);
            }
        }
        let born = self.etcd.created(&key_of(self.incarnations, owner))?;
        if let Some(born) = born {
            let mut seen = self.seen_alive.lock().unwrap_or_else(|p| p.into_inner());
            if seen.len() >= ALIVE_KEPT {
                seen.retain(|_, (_, at)| at.elapsed() < ALIVE_FOR);
                if seen.len() >= ALIVE_KEPT {
                    seen.clear();
                }
            }
            seen.insert(owner.to_vec(), (born, Instant::now()));
        }
        if born.is_some_and(alive) {
            return Ok(false);
        }
        // Dead for good (the module comment): only the ownership record
        // must still be the one read, so that a later owner's is kept.
        let own = record_of(group);
        let request = release_key(owner, group);
        let t = self.etcd.txn(
            &[Cmp::Version(&own, Some(since))],
            &[Op::Delete(&own), Op::Delete(&request)],
            &[],
        )?;
        if t.succeeded {
            crate::metrics_names::gone_owner_cleared();
            tracing::debug!(
                "cluster: a file owned by incarnation {}, which is gone, is free again",
                String::from_utf8_lossy(owner)
            );
        }
        Ok(true)
    }

    /// Deletes every dead ownership record (see the module comment): those
    /// of node runs that crashed, left, or lost their lease, which nobody
    /// looked up since. A file's lookup clears its own anyway; this keeps
    /// etcd from holding them for files nobody opens again. How many it
    /// deleted.
    pub fn clear_gone_owners(&self) -> Result<usize, StateError> {
        // Directory claims too: they end as ownerships do (`dir_claims`).
        let mut cleared = 0;
        for prefix in [OWN_PREFIX, CLAIM_PREFIX] {
            let mut start = prefix.to_vec();
            loop {
                // A record that fails its tag is left alone (and logged): a
                // forged one must not stop the pass.
                let (page, _forged, more) =
                    self.etcd
                        .scan_page_skipping_forged(prefix, &start, GONE_OWNERS_PAGE)?;
                if let Some((last, _)) = page.last() {
                    start = last.clone();
                    start.push(0);
                }
                cleared += self.clear_dead_of(prefix, page)?;
                if !more {
                    break;
                }
            }
        }
        Ok(cleared)
    }

    /// `clear_gone_owners` of one page of ownership records.
    fn clear_dead_of(
        &self,
        prefix: &[u8],
        owned: Vec<(Vec<u8>, Versioned)>,
    ) -> Result<usize, StateError> {
        if owned.is_empty() {
            return Ok(0);
        }
        // Ownerships first, then incarnations: an incarnation record
        // absent or younger than an ownership read before it ends that
        // ownership for good, whatever happens after.
        let born: HashMap<Vec<u8>, u64> = self
            .etcd
            .scan_created(self.incarnations)?
            .into_iter()
            .filter_map(|(k, c)| Some((k.strip_prefix(self.incarnations)?.to_vec(), c)))
            .collect();
        // What a request to the owner names: the file's group, or the
        // claim's whole key (`record_of`).
        let subject = |key: &[u8]| -> Option<Vec<u8>> {
            key.strip_prefix(prefix)?;
            Some(match prefix == CLAIM_PREFIX {
                true => key.to_vec(),
                false => key[prefix.len()..].to_vec(),
            })
        };
        let dead: Vec<(Vec<u8>, Vec<u8>, u64)> = owned
            .into_iter()
            .filter_map(|(key, v)| {
                let group = subject(&key)?;
                let alive = born.get(&v.value).is_some_and(|&b| b < v.version);
                (!alive).then_some((group, v.value, v.version))
            })
            .collect();
        let mut cleared = 0;
        for chunk in dead.chunks(MAX_TXNS_PER_REQUEST) {
            let keys: Vec<(Vec<u8>, Vec<u8>, u64)> = chunk
                .iter()
                .map(|(group, owner, since)| (record_of(group), release_key(owner, group), *since))
                .collect();
            let parts: Vec<([Cmp<'_>; 1], [Op<'_>; 2])> = keys
                .iter()
                .map(|(own, request, since)| {
                    (
                        [Cmp::Version(own, Some(*since))],
                        [Op::Delete(own), Op::Delete(request)],
                    )
                })
                .collect();
            for t in self.etcd.txns(&unread(&parts))?.into_iter().flatten() {
                if t.succeeded {
                    crate::metrics_names::gone_owner_cleared();
                    cleared += 1;
                }
            }
        }
        Ok(cleared)
    }

    /// Hands `group` back to etcd (another node asked for it): its records
    /// written, `own/<group>` and the request deleted, in one transaction.
    /// A group this node does not own only has its request removed.
    pub fn release(&self, group: &[u8]) -> Result<(), StateError> {
        self.release_or_defer(group, true).map(|_| ())
    }

    /// `release`; with `wait_for_lookup` false, a group this node is
    /// looking up right now is left for later (Ok(false)) instead of waited
    /// for: that lookup may itself wait for another node's hand-over
    /// thread, which may be waiting for this one's (each node handing
    /// requests over one at a time).
    fn release_or_defer(&self, group: &[u8], wait_for_lookup: bool) -> Result<bool, StateError> {
        if let Some(dir) = group.strip_prefix(CLAIM_PREFIX) {
            return self.let_go_claim(dir, true);
        }
        // Held under a claim: owned first, then handed back as any owned
        // file (its `own/` record is what the write-back ends).
        if self.held_under_claim(group) {
            self.own_from_claim(&[group.to_vec()])?;
        }
        let request = release_key(&self.me(), group);
        if self.is_unsettled(group) {
            // Its hand-back is being tried again; the request goes with it.
            return self
                .settle_one(group, &[Op::Delete(&request)])
                .map(|()| true);
        }
        let records = {
            let mut g = if wait_for_lookup {
                self.settled(group)
            } else {
                self.written_back(group)
            };
            match g.get(group) {
                Some(Group::Finding(_)) => return Ok(false),
                Some(Group::Owned { taken, .. })
                    if !wait_for_lookup && taken.elapsed() < TENURE =>
                {
                    return Ok(false)
                }
                _ => {}
            }
            match g.remove(group) {
                Some(Group::Owned { records, taken, .. }) => {
                    g.insert(group.to_vec(), Group::Releasing);
                    (records, taken)
                }
                None => {
                    // Marked as a lookup marks it: no lookup of this node
                    // takes the group while etcd is asked whether this
                    // node owns it, and ends that ownership (`Finding`).
                    let token = self.next_version.fetch_add(1, Ordering::Relaxed);
                    g.insert(group.to_vec(), Group::Finding(token));
                    drop(g);
                    let _mark = FindingMark {
                        store: self,
                        group,
                        token,
                    };
                    return self.end_lost_take(group, &request).map(|()| true);
                }
                Some(other) => {
                    // Not reached: the waits above leave no `Releasing`
                    // and return on `Finding`.
                    g.insert(group.to_vec(), other);
                    drop(g);
                    self.etcd.txn(&[], &[Op::Delete(&request)], &[])?;
                    return Ok(true);
                }
            }
        };
        let (records, taken) = records;
        let r = self.write_back(group, &records, &[Op::Delete(&request)]);
        self.written_back_or_unsettled(group, r, records, taken)
            .map(|()| true)
    }

    /// Answers `request` for `group`, which this node holds nothing of
    /// and has marked `Finding` (the caller holds the mark): when etcd
    /// still names this node the owner, a take of it was applied but its
    /// answer lost (a take is not sent twice). Nothing here stands on that
    /// ownership (no lookup under way, none can start meanwhile, no
    /// hand-back unsettled), so it ends with the request, as `ask_release`
    /// ends it for this node's own lookups; the records in etcd are the
    /// last written. Left, it would keep every other node's lookups waiting
    /// out the hand-over time for as long as this node lives and opens
    /// nothing of the file.
    fn end_lost_take(&self, group: &[u8], request: &[u8]) -> Result<(), StateError> {
        let own = key_of(OWN_PREFIX, group);
        let mine = match self.etcd.get(&own) {
            Ok(Some(v)) if v.value[..] == self.me()[..] => Some(v.version),
            // A forged ownership is not this node's: the request goes.
            Ok(_) | Err(StateError::Corrupt(_)) => None,
            Err(e) => return Err(e),
        };
        match mine {
            Some(version) => self.etcd.txn(
                &[Cmp::Version(&own, Some(version))],
                &[Op::Delete(&own), Op::Delete(request)],
                &[Op::Delete(request)],
            )?,
            None => self.etcd.txn(&[], &[Op::Delete(request)], &[])?,
        };
        Ok(())
    }

    /// After a write-back of `group`: answered, the group is etcd's (or
    /// another node's, if this node's ownership was gone); not answered,
    /// it stays `Releasing` with its records kept for `settle`, since etcd
    /// may have applied it and another node taken the group already.
    fn written_back_or_unsettled(
        &self,
        group: &[u8],
        r: Result<bool, StateError>,
        records: BTreeMap<Vec<u8>, Versioned>,
        taken: Instant,
    ) -> Result<(), StateError> {
        match r {
            Ok(written) => {
                if !written {
                    tracing::error!(
                        "cluster: a file's ownership was lost before its records were written back"
                    );
                }
                self.given_back(group);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(
                    "cluster: handing a file back to etcd: {e}; its outcome is unknown, so it is \
                     neither decided here nor given up until a retry is answered"
                );
                self.unsettled_lock()
                    .insert(group.to_vec(), (records, taken));
                Err(e)
            }
        }
    }

    /// `group`'s write-back was answered: it is no longer this node's.
    fn given_back(&self, group: &[u8]) {
        self.lock().remove(group);
        crate::metrics_names::file_given_back();
        self.changed.notify_all();
    }

    fn unsettled_lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Unsettled>> {
        self.unsettled.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_unsettled(&self, group: &[u8]) -> bool {
        self.unsettled_lock().contains_key(group)
    }

    /// Tries again the write-back of `group`, unsettled. Its first try may
    /// have been applied: this one then finds this node no longer named
    /// owner and writes nothing, which settles it as well.
    fn settle_one(&self, group: &[u8], also: &[Op<'_>]) -> Result<(), StateError> {
        let Some((records, taken)) = self.unsettled_lock().remove(group) else {
            return Ok(());
        };
        match self.write_back(group, &records, also) {
            Ok(written) => {
                if !written {
                    tracing::info!(
                        "cluster: a hand-back whose answer was lost had been applied (or this \
                         node's lease ended meanwhile)"
                    );
                }
                self.given_back(group);
                Ok(())
            }
            Err(e) => {
                self.unsettled_lock()
                    .insert(group.to_vec(), (records, taken));
                Err(e)
            }
        }
    }

    /// Tries again every write-back whose outcome is unknown; how many
    /// are still unknown.
    pub fn settle(&self) -> usize {
        let groups: Vec<Vec<u8>> = self.unsettled_lock().keys().cloned().collect();
        for group in &groups {
            let _ = self.settle_one(group, &[]);
        }
        self.unsettled_lock().len()
    }

    /// Writes `records` of `group` to etcd and deletes its ownership, if
    /// this node still owns it there: Ok(false) when it did not (nothing
    /// written but `also`). An error leaves the outcome unknown.
    fn write_back(
        &self,
        group: &[u8],
        records: &BTreeMap<Vec<u8>, Versioned>,
        also: &[Op<'_>],
    ) -> Result<bool, StateError> {
        let own = key_of(OWN_PREFIX, group);
        let keys: Vec<Vec<u8>> = self.clustered.iter().map(|p| key_of(p, group)).collect();
        let mut ops: Vec<Op<'_>> = keys
            .iter()
            .map(|k| match records.get(k) {
                Some(v) => Op::Put(k, &v.value, 0),
                None => Op::Delete(k),
            })
            .collect();
        ops.push(Op::Delete(&own));
        ops.extend(also.iter().copied());
        // `also` happens either way, in the same round trip.
        let me = self.me();
        let t = self.etcd.txn(&[Cmp::Value(&own, &me)], &ops, also)?;
        #[cfg(test)]
        if self.lose_write_back_answer.swap(false, Ordering::SeqCst) {
            return Err(StateError::Unavailable("test: the answer was lost".into()));
        }
        Ok(t.succeeded)
    }

    /// Gives back the groups that have had no record for `idle`: etcd keeps
    /// ownership records only for files in use.
    pub fn sweep(&self, idle: Duration) -> usize {
        self.settle();
        self.let_go_idle_claims(dir_claims::CLAIM_IDLE.max(idle));
        let now = Instant::now();
        let idle_groups: Vec<Vec<u8>> = {
            let mut g = self.lock();
            // Files made under a claim that stands and idle since: dropped
            // from memory, nothing to give back (the claim covers them).
            g.retain(|_, v| {
                !matches!(v, Group::Owned {
                    records,
                    empty_since: Some(t),
                    under: Some(_),
                    ..
                } if records.is_empty() && now.duration_since(*t) >= idle)
            });
            let picked: Vec<Vec<u8>> = g
                .iter()
                .filter_map(|(k, v)| match v {
                    Group::Owned {
                        records,
                        empty_since: Some(t),
                        ..
                    } if records.is_empty() && now.duration_since(*t) >= idle => Some(k.clone()),
                    _ => None,
                })
                .collect();
            for k in &picked {
                g.insert(k.clone(), Group::Releasing);
            }
            picked
        };
        let mut done = 0;
        for chunk in idle_groups.chunks(MAX_TXNS_PER_REQUEST) {
            let answers = self.give_back_empty(chunk);
            for (i, group) in chunk.iter().enumerate() {
                let r = match &answers {
                    Ok(written) => match written.get(i) {
                        Some(Ok(w)) => Ok(*w),
                        Some(Err(e)) => Err(e.clone_message()),
                        None => Err(StateError::Unavailable("etcd: short answer".into())),
                    },
                    Err(e) => Err(e.clone_message()),
                };
                if self
                    .written_back_or_unsettled(group, r, BTreeMap::new(), now)
                    .is_ok()
                {
                    done += 1;
                }
            }
        }
        done
    }

    /// `write_back` of groups without records, in one request (a
    /// transaction for each: `EtcdStore::txns`): an idle node's give-backs
    /// cost etcd one request per `MAX_TXNS_PER_REQUEST` files, not one
    /// per file.
    fn give_back_empty(&self, groups: &[Vec<u8>]) -> Answers<bool> {
        if let [group] = groups {
            return Ok(vec![self.write_back(group, &BTreeMap::new(), &[])]);
        }
        let me = self.me();
        let keys: Vec<(Vec<u8>, Vec<Vec<u8>>)> = groups.iter().map(|g| self.keys_of(g)).collect();
        let parts: Vec<([Cmp<'_>; 1], Vec<Op<'_>>)> = keys
            .iter()
            .map(|(own, records)| {
                let mut ops: Vec<Op<'_>> = records.iter().map(|k| Op::Delete(k)).collect();
                ops.push(Op::Delete(own));
                ([Cmp::Value(own, &me)], ops)
            })
            .collect();
        Ok(self
            .etcd
            .txns(&unread(&parts))?
            .into_iter()
            .map(|t| t.map(|t| t.succeeded))
            .collect())
    }

    /// The node lost its lease: etcd ended it, or it could not be proven
    /// within its TTL, so other nodes may have taken every file it held
    /// and decided over its opens. What it held in memory is dropped, not
    /// written back (its clients' connections are dropped with it), and
    /// nothing is decided here until `rejoined` and a new proof.
    pub fn forget_all(&self) {
        self.proven_until.store(0, Ordering::SeqCst);
        // Unsettled write-backs go too: the ownership they were about
        // ended with the incarnation, whose record was on the lease.
        let unsettled: Vec<Vec<u8>> = self.unsettled_lock().drain().map(|(k, _)| k).collect();
        let mut g = self.lock();
        // Under the lock `adopt` checks it under: a take under way either
        // lands before this and is dropped here, or is refused.
        self.lease_changes.fetch_add(1, Ordering::SeqCst);
        let held = g.len();
        g.retain(|_, v| !matches!(v, Group::Owned { .. }));
        for group in &unsettled {
            g.remove(group);
        }
        let forgotten = held - g.len();
        drop(g);
        // After the count of lease changes: a claim written before it and
        // held after this would be under the incarnation that ended.
        self.forget_claims();
        self.turns.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.changed.notify_all();
        if forgotten > 0 {
            tracing::warn!("cluster: {forgotten} files held in memory dropped with the lease");
        }
    }

    /// The node leaves its cluster: nothing more is decided here, and a
    /// decision that passed its check under the groups' lock before this
    /// is over when it returns. What is held stays (its ownerships end
    /// with the incarnation the node revokes next).
    pub fn end_proof(&self) {
        self.proven_until.store(0, Ordering::SeqCst);
        drop(self.lock());
    }

    /// The node joined again after it lost its lease: it is incarnation
    /// `me` now, under lease `lease`. It decides again once the new lease
    /// is proven (`lease_proven_until`).
    pub fn rejoined(&self, me: &str, lease: i64) {
        let g = self.lock();
        *self.me.lock().unwrap_or_else(|p| p.into_inner()) = Arc::from(me.as_bytes());
        self.lease.store(lease, Ordering::SeqCst);
        self.lease_changes.fetch_add(1, Ordering::SeqCst);
        drop(g);
    }
}

impl ClusterStore {
    /// Hands over what other nodes ask for, until `stop`: the requests
    /// already in etcd, then those a watch on `release/<me>/` brings. A
    /// hand-back that fails (etcd out of reach) is tried again.
    pub fn serve_releases(&self, stop: &std::sync::atomic::AtomicBool) {
        let mut me = self.me();
        let mut prefix = release_key(&me, b"");
        let mut pending: Vec<Vec<u8>> = Vec::new();
        let mut watch = None;
        let mut failing = false;
        while !stop.load(Ordering::SeqCst) {
            // A node without a proven lease hands nothing over (it holds
            // nothing once it has lost the lease), and a node that joined
            // again is asked under its new incarnation.
            if self.fenced().is_err() {
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
            if self.me() != me {
                me = self.me();
                prefix = release_key(&me, b"");
                pending.clear();
                watch = None;
            }
            let w = match watch.as_mut() {
                Some(w) => w,
                None => {
                    // Start from now, after reading what is already asked.
                    let start = match self.etcd.revision() {
                        Ok(r) => r + 1,
                        Err(e) => {
                            tracing::warn!("cluster: watching hand-over requests: {e}");
                            std::thread::sleep(Duration::from_millis(200));
                            continue;
                        }
                    };
                    match self.etcd.scan_prefix(&prefix) {
                        Ok(all) => pending.extend(all.into_iter().filter_map(|(k, _)| {
                            k.strip_prefix(prefix.as_slice()).map(<[u8]>::to_vec)
                        })),
                        Err(e) => {
                            tracing::warn!("cluster: reading hand-over requests: {e}");
                            std::thread::sleep(Duration::from_millis(200));
                            continue;
                        }
                    }
                    watch.insert(self.etcd.watch(&prefix, start))
                }
            };
            // A request left for later (a lookup under way, a tenure not
            // yet up) is tried again soon; one whose hand-back failed
            // (etcd out of reach or refusing) at the usual pace, not
            // hundreds of times a second.
            let wait = if pending.is_empty() || failing {
                250
            } else {
                2
            };
            match w.next(Duration::from_millis(wait)) {
                Ok(batch) => {
                    if batch.resync {
                        watch = None;
                    }
                    pending.extend(batch.events.into_iter().filter_map(|e| {
                        e.value?;
                        e.key.strip_prefix(prefix.as_slice()).map(<[u8]>::to_vec)
                    }));
                }
                Err(e) => {
                    tracing::warn!("cluster: watching hand-over requests: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            pending.sort();
            pending.dedup();

            failing = self.settle() > 0;
            pending.retain(|group| match self.release_or_defer(group, false) {
                Ok(handled) => !handled,
                Err(e) => {
                    tracing::warn!("cluster: handing a file over: {e}");
                    failing = true;
                    true
                }
            });
        }
    }
}

impl ClusterStore {
    /// The turn of updates of `key` (`StateStore::in_turn`).
    fn turn(&self, key: &[u8]) -> Turn {
        let mut turns = self.turns.lock().unwrap_or_else(|p| p.into_inner());
        if turns.len() >= TURNS_KEPT {
            turns.retain(|_, t| Arc::strong_count(t) > 1);
        }
        turns.entry(key.to_vec()).or_default().clone()
    }

    /// A record that names only this node's opens (or none) may be one
    /// this node can take into its memory, which only a full read (`get`)
    /// finds out and does: the next update starts from one.
    fn forget_if_claimable(&self, memo: &mut Option<Memo>) {
        if self.claimable_memo(memo) {
            *memo = None;
        }
    }

    fn claimable_memo(&self, memo: &Option<Memo>) -> bool {
        memo.as_ref().is_some_and(|m| {
            m.record
                .as_ref()
                .is_none_or(|r| (self.claimable)(&m.key, &r.value))
        })
    }

    /// A read in place's answer when etcd names another node's `owner`
    /// as holding `group` since revision `since`: `HeldElsewhere` while
    /// that ownership is alive; None once it was found dead and cleared,
    /// and the lookup goes on.
    fn held_elsewhere(
        &self,
        owner: &[u8],
        since: u64,
        group: &[u8],
    ) -> Result<Option<InPlace>, StateError> {
        Ok((!self.clear_if_dead(owner, since, group, false)?).then_some(InPlace::HeldElsewhere))
    }

    /// Looks `key` up for `get` and `read_in_place`: from memory when this
    /// node owns its group; else from etcd, taking the group when nobody
    /// owns it and its records are claimable. A group another node owns is
    /// asked for (`ask`) or reported as held elsewhere.
    fn look_up(&self, group: &[u8], key: &[u8], ask: bool) -> Result<InPlace, StateError> {
        // A lookup that lost a race looks again for as long as a hand-over
        // may take (`ask_release`'s wait), and at least FIND_TRIES times:
        // a count alone covers less time the faster etcd answers, and
        // under every node's opens of one file 64 lost races fitted in a
        // few seconds (test_share_modes_hold_under_contention_from_every_node).
        // Past FIND_TRIES each lost race waits a little longer before the
        // next (up to 50 ms, as `ask_release` polls), so that a lookup
        // that keeps losing does not send etcd a request per round trip
        // for the whole hand-over time.
        let until = Instant::now() + self.handover_timeout;
        let mut tries = 0;
        let mut pause = Duration::from_millis(1);
        // Whether this lookup asked already (`ask_release`'s watch).
        let mut asked = false;
        // Whether the last look lost a race: a take that succeeded, or a
        // hand-over that came, is looked at again at once (the file is
        // the asker's to take before the owner's next open takes it back).
        let mut lost = false;
        while tries < FIND_TRIES || Instant::now() < until {
            if tries >= FIND_TRIES && lost {
                crate::blocking::off_worker(|| std::thread::sleep(pause));
                pause = (pause * 2).min(POLL_EVERY);
            }
            tries += 1;
            lost = true;
            // Some(token): this thread's lookup may take the group.
            let may_take = {
                let mut g = self.written_back(group);
                match g.get(group) {
                    Some(Group::Owned { records, .. }) => {
                        self.fenced()?;
                        return Ok(InPlace::Record(records.get(key).cloned()));
                    }
                    Some(Group::Finding(_)) => None,
                    _ => {
                        let token = self.next_version.fetch_add(1, Ordering::Relaxed);
                        g.insert(group.to_vec(), Group::Finding(token));
                        Some(token)
                    }
                }
            };
            if let Some(token) = may_take {
                // The mark is held until this lookup is done with the
                // group, through `ask_release` too: two lookups both
                // mending a lost hand-back would otherwise see the second
                // delete the ownership the first had just taken.
                let _mark = FindingMark {
                    store: self,
                    group,
                    token,
                };
                // A read in place reads before it takes. The take is a
                // transaction that etcd logs and applies on every member
                // even when it fails, as it does for a file another live
                // node holds (many nodes' attribute opens of one file) or
                // one whose record this node may not claim (other nodes'
                // opens of a file they share): both are answered from the
                // read, as `find` would answer them after its take.
                if !ask {
                    self.fenced()?;
                    match self.peek(group, key)? {
                        Found::OwnedBy(owner, since) if *owner != *self.me() => {
                            if let Some(elsewhere) = self.held_elsewhere(&owner, since, group)? {
                                return Ok(elsewhere);
                            }
                        }
                        Found::Shared(Some(v)) if !(self.claimable)(key, &v.value) => {
                            return Ok(InPlace::Record(Some(v)));
                        }
                        _ => {}
                    }
                }
                match self.find(group, key)? {
                    Found::Taken => lost = false,
                    Found::Retry => {}
                    Found::Shared(v) => return Ok(InPlace::Record(v)),
                    // This node named in etcd but not in memory: a lost
                    // hand-back, which `ask_release` mends.
                    Found::OwnedBy(owner, since) if ask || *owner == *self.me() => {
                        lost = !self.ask_release(&owner, since, group, asked)?;
                        asked = true;
                    }
                    Found::OwnedBy(owner, since) => {
                        if let Some(elsewhere) = self.held_elsewhere(&owner, since, group)? {
                            return Ok(elsewhere);
                        }
                        lost = false;
                    }
                    // Asked for even by a lookup that only reads: a file
                    // held under a claim is found by no lookup that does
                    // not know its directory (a later one of this open
                    // would take it), one with an `own/` record by all.
                    Found::ClaimedBy(holder, since, claim) => {
                        lost = !self.meet_claim(&holder, since, &claim, true, asked)?;
                        asked = true;
                    }
                }
            } else {
                match self.peek(group, key)? {
                    Found::Shared(v) => return Ok(InPlace::Record(v)),
                    // Taken by the lookup under way: wait for its outcome.
                    Found::OwnedBy(owner, _) if *owner == *self.me() => {
                        drop(self.settled(group));
                        lost = false;
                    }
                    Found::OwnedBy(owner, since) if ask => {
                        lost = !self.ask_release(&owner, since, group, asked)?;
                        asked = true;
                    }
                    Found::OwnedBy(owner, since) => {
                        if let Some(elsewhere) = self.held_elsewhere(&owner, since, group)? {
                            return Ok(elsewhere);
                        }
                        lost = false;
                    }
                    // Asked for even by a lookup that only reads: a file
                    // held under a claim is found by no lookup that does
                    // not know its directory (a later one of this open
                    // would take it), one with an `own/` record by all.
                    Found::ClaimedBy(holder, since, claim) => {
                        lost = !self.meet_claim(&holder, since, &claim, true, asked)?;
                        asked = true;
                    }
                    Found::Taken | Found::Retry => {}
                }
            }
        }
        Err(StateError::Unavailable(
            "too much contention on one file's ownership".into(),
        ))
    }
}

impl StateStore for ClusterStore {
    fn before_making(&self, dir: &[u8]) -> Option<u64> {
        ClusterStore::before_making(self, dir)
    }

    fn made(&self, file: &[u8], dir: &[u8], token: u64) -> bool {
        ClusterStore::made(self, file, dir, token)
    }

    fn naming_elsewhere(&self, file: &[u8]) -> Result<(), StateError> {
        if self.held_under_claim(file) {
            self.own_from_claim(&[file.to_vec()])?;
        }
        Ok(())
    }

    fn lease_proven(&self) -> bool {
        self.fenced().is_ok()
    }

    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let Some(group) = self.group(key) else {
            return self.local.get(key);
        };
        match self.look_up(group, key, true)? {
            InPlace::Record(v) => Ok(v),
            InPlace::HeldElsewhere => Err(StateError::Unavailable(
                "a file's owner did not hand it over".into(),
            )),
        }
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        let Some(group) = self.group(key) else {
            return self.local.compare_and_set(key, expected, value);
        };
        {
            // Not waiting for a lookup under way: should it take the group,
            // etcd refuses the write below (the group is owned) and the
            // caller reads again, here.
            let mut g = self.written_back(group);
            if let Some(Group::Owned {
                records,
                empty_since,
                ..
            }) = g.get_mut(group)
            {
                self.fenced()?;
                #[cfg(test)]
                self.decision_gate.pass();
                if records.get(key).map(|v| v.version) != expected {
                    return Ok(None);
                }
                let version = match value {
                    Some(value) => {
                        let version = self.local_version();
                        records.insert(key.to_vec(), Versioned { version, value });
                        version
                    }
                    None => {
                        records.remove(key);
                        0
                    }
                };
                *empty_since = records.is_empty().then(Instant::now);
                return Ok(Some(version));
            }
        }
        match self.set_shared(group, key, expected, value, false)? {
            SharedSet::Written(version) => Ok(Some(version)),
            SharedSet::Lost(_) | SharedSet::NotShared => Ok(None),
        }
    }

    fn compare_and_set_or_read(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
        durability: Durability,
    ) -> Result<Result<u64, Option<Versioned>>, StateError> {
        let Some(group) = self.group(key) else {
            return self
                .local
                .compare_and_set_or_read(key, expected, value, durability);
        };
        if !self.owns(group) {
            match self.set_shared(group, key, expected, value, true)? {
                SharedSet::Written(version) => return Ok(Ok(version)),
                SharedSet::Lost(now) => return Ok(Err(now)),
                // Owned now (here or elsewhere), or an owned group's
                // version: the record is wherever its owner keeps it.
                SharedSet::NotShared => return Ok(Err(self.get(key)?)),
            }
        }
        match self.compare_and_set(key, expected, value)? {
            Some(version) => Ok(Ok(version)),
            None => Ok(Err(self.get(key)?)),
        }
    }

    /// Updates of a shared record take turns on this node (see the trait);
    /// records of owned groups and node-local ones are in memory already.
    fn in_turn(&self, key: &[u8], update: &mut dyn FnMut(Option<&mut Option<Memo>>)) {
        if self.is_local(key) {
            return update(None);
        }
        let turn = self.turn(key);
        let mut memo = crate::blocking::lock(&turn);
        update(Some(&mut memo));
        self.forget_if_claimable(&mut memo);
    }

    /// An update of several shared records takes the turn of each, in key
    /// order (as every update of several does, so that two never wait for
    /// each other's turns).
    fn in_turns(&self, keys: &[&[u8]], update: &mut TurnsUpdate<'_>) {
        if keys.iter().any(|k| self.is_local(k)) {
            return update(None);
        }
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i]);
        order.dedup_by_key(|i| keys[*i]);
        if order.len() != keys.len() {
            // One record named twice: not an update of several.
            return update(None);
        }
        let turns: Vec<Turn> = order.iter().map(|&i| self.turn(keys[i])).collect();
        let mut held: Vec<_> = turns.iter().map(|t| crate::blocking::lock(t)).collect();
        // In the callers' order.
        let mut memos: Vec<Option<Memo>> = vec![None; keys.len()];
        for (&i, memo) in order.iter().zip(held.iter_mut()) {
            memos[i] = memo.take();
        }
        update(Some(&mut memos));
        // Only a file all of whose records this node may take is looked
        // up again in full; one record naming another node's open keeps
        // the file shared, and the others' memos stand.
        if memos.iter().all(|m| self.claimable_memo(m)) {
            memos.iter_mut().for_each(|m| *m = None);
        }
        for (&i, memo) in order.iter().zip(held.iter_mut()) {
            **memo = memos[i].take();
        }
    }

    /// Where the file's records are shared in etcd (no node owns it, and
    /// they name other nodes' opens): one read-only transaction, which
    /// etcd answers without a consensus round, where `get` of each would
    /// be a transaction each that may take the file (and so goes through
    /// consensus even when it does not). Wherever `get` could take the
    /// file (nobody's records, or only this node's) or must ask its owner
    /// for it, the records are read by `get`.
    fn get_together(&self, keys: &[&[u8]]) -> Result<Vec<Option<Versioned>>, StateError> {
        let each = || keys.iter().map(|k| self.get(k)).collect();
        let Some(group) = keys.first().and_then(|k| self.group(k)) else {
            return each();
        };
        if keys.len() >= MAX_READS_PER_REQUEST
            || keys.iter().any(|k| self.group(k) != Some(group))
            || self.written_back(group).contains_key(group)
        {
            return each();
        }
        let own = key_of(OWN_PREFIX, group);
        let mut asked: Vec<&[u8]> = vec![&own];
        asked.extend_from_slice(keys);
        // One read per key, in order (`get_many` fails otherwise); a
        // record that does not decode fails the read, as `get` of it would.
        let reads: Vec<Option<Versioned>> = self
            .etcd
            .get_many(&asked)?
            .into_iter()
            .collect::<Result<_, _>>()?;
        match reads.split_first() {
            Some((None, records)) => {
                let shared = records
                    .iter()
                    .zip(keys)
                    .any(|(r, k)| r.as_ref().is_some_and(|r| !(self.claimable)(k, &r.value)));
                if shared {
                    Ok(records.to_vec())
                } else {
                    each()
                }
            }
            _ => each(),
        }
    }

    /// Writes a shared file's records in one etcd transaction, which also
    /// checks that nobody took the file meanwhile; a lost one reads them
    /// all in its failure branch. A file this node holds, or one another
    /// node took meanwhile, is not written here (None): its records are
    /// updated one by one where they are.
    fn compare_and_set_together(&self, writes: &[Together<'_>]) -> Result<Written, StateError> {
        let Some(group) = writes.first().and_then(|w| self.group(w.key)) else {
            return Ok(Written::NotTogether);
        };
        let one_group = writes.iter().all(|w| self.group(w.key) == Some(group));
        // A version of a record held in memory: stale now, and the record
        // is wherever its owner keeps it.
        let held = writes
            .iter()
            .any(|w| w.expected.is_some_and(|v| v & LOCAL_VERSION != 0));
        if !one_group || held || self.owns(group) {
            return Ok(Written::NotTogether);
        }
        let own = key_of(OWN_PREFIX, group);
        let mut cmps = vec![Cmp::Absent(&own)];
        cmps.extend(writes.iter().map(|w| Cmp::Version(w.key, w.expected)));
        let ops: Vec<Op<'_>> = writes
            .iter()
            .filter_map(|w| match &w.change {
                Change::Keep => None,
                Change::Put(v) => Some(Op::Put(w.key, v, 0)),
                Change::Delete => Some(Op::Delete(w.key)),
            })
            .collect();
        let mut reads = vec![Op::Get(&own)];
        reads.extend(writes.iter().map(|w| Op::Get(w.key)));
        let t = self.etcd.txn(&cmps, &ops, &reads)?;
        if t.succeeded {
            let versions = writes
                .iter()
                .map(|w| match &w.change {
                    Change::Keep => w.expected.unwrap_or(0),
                    Change::Put(_) => t.revision,
                    Change::Delete => 0,
                })
                .collect();
            return Ok(Written::Done(versions));
        }
        match t.reads.split_first() {
            Some((None, now)) if now.len() == writes.len() => Ok(Written::Changed(now.to_vec())),
            // Owned now, here or elsewhere.
            _ => Ok(Written::NotTogether),
        }
    }

    /// Owned groups and node-local keys change only here; a shared
    /// group's records may change on any node. An owned group whose
    /// ownership the lease no longer proves is not local: callers that
    /// answer from their own memory for a local file (a READ's lock check,
    /// a WRITE's caching check) go to the store, which refuses.
    fn is_local(&self, key: &[u8]) -> bool {
        self.group(key)
            .is_none_or(|group| self.owns(group) && self.fenced().is_ok())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError> {
        // Scans are of node-local records (persistent opens live in the
        // node's store on disk); a clustered prefix is not scanned.
        self.local.scan_prefix(prefix)
    }

    /// As `get`, except that a group another node owns is reported as
    /// held elsewhere instead of asked for.
    fn read_in_place(&self, key: &[u8]) -> Result<InPlace, StateError> {
        match self.group(key) {
            Some(group) => self.look_up(group, key, false),
            None => self.local.get(key).map(InPlace::Record),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::Raw;
    use crate::etcd_test_cluster::Cluster;
    use std::sync::atomic::AtomicBool;

    const G: &[u8] = b"0123456789abcdef";
    const INCARNATIONS: &[u8] = b"incarnations/";

    fn file_key() -> Vec<u8> {
        key_of(b"file/", G)
    }

    /// A node: its store, its lease, and its hand-over thread.
    struct Node {
        store: Arc<ClusterStore>,
        etcd: Arc<EtcdStore>,
        lease: i64,
        stop: Arc<AtomicBool>,
        server: Option<std::thread::JoinHandle<()>>,
    }

    impl Node {
        /// Node `me`: records are comma-separated entries, each starting
        /// with the incarnation of the node that wrote it; a record is
        /// claimable when every entry is this node's or one in `gone`.
        fn start(urls: &[String], me: &'static str, gone: &'static [&'static str]) -> Node {
            Node::start_sealed(urls, me, gone, None)
        }

        /// `start`, the node's values tagged with `seal` when given (the
        /// cluster secret's key).
        fn start_sealed(
            urls: &[String],
            me: &'static str,
            gone: &'static [&'static str],
            seal: Option<Arc<crate::etcd_seal::RecordKey>>,
        ) -> Node {
            let etcd = EtcdStore::new(urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
            let etcd = Arc::new(match seal {
                Some(key) => etcd.sealed(key),
                None => etcd,
            });
            let lease = etcd.grant_lease(30).unwrap();
            // Registered as a cluster node is: its incarnation's record
            // under its lease, which its writes are fenced on.
            let incarnation = key_of(INCARNATIONS, me.as_bytes());
            etcd.txn(&[], &[Op::Put(&incarnation, b"node", lease)], &[])
                .unwrap();
            etcd.fence_on(&incarnation);
            let claimable: Claimable = Box::new(move |_k, v| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .all(|e| e.starts_with(me) || gone.iter().any(|g| e.starts_with(g)))
            });
            let store = Arc::new(ClusterStore::new(
                etcd.clone(),
                vec![b"file/", b"more/"],
                INCARNATIONS,
                me,
                lease,
                claimable,
                Duration::from_secs(10),
            ));
            let stop = Arc::new(AtomicBool::new(false));
            let (s, st) = (store.clone(), stop.clone());
            let server = Some(std::thread::spawn(move || s.serve_releases(&st)));
            Node {
                store,
                etcd,
                lease,
                stop,
                server,
            }
        }

        fn set(&self, value: &str) {
            crate::records::update::<Raw, _, StateError>(&*self.store, &file_key(), |r| {
                r.0 = value.as_bytes().to_vec();
                Ok(())
            })
            .unwrap();
        }

        fn read(&self) -> String {
            String::from_utf8(
                crate::records::read::<Raw>(&*self.store, &file_key())
                    .unwrap()
                    .0,
            )
            .unwrap()
        }
    }

    impl Drop for Node {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            if let Some(t) = self.server.take() {
                let _ = t.join();
            }
        }
    }

    /// An ownership record is not under the owner's lease: it ends with
    /// the owner's incarnation record. A node that finds an owner gone
    /// deletes its ownership and goes on at once (neither waiting out the
    /// hand-over timeout nor reporting the file held elsewhere); a live
    /// owner's is kept.
    #[test]
    fn a_file_whose_owner_is_gone_is_free_at_once_and_a_live_owners_is_kept() {
        let cluster = Cluster::start("gone-owner");
        let one = Node::start(&cluster.urls, "1", &["2"]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        two.set("2a");
        assert!(two.store.owns(G));

        // Alive: held elsewhere, and not cleared.
        assert!(matches!(
            one.store.read_in_place(&file_key()).unwrap(),
            InPlace::HeldElsewhere
        ));
        assert_eq!(one.store.clear_gone_owners().unwrap(), 0);
        assert!(raw.get(&key_of(OWN_PREFIX, G)).unwrap().is_some());

        // Gone (its lease, with its incarnation record, revoked): the
        // record it had in memory was never written back to etcd. A node
        // that has not just seen it alive (node 1 has, and takes it for
        // alive for `ALIVE_FOR`) finds it free in a read in place, and
        // takes it: nobody's records.
        two.etcd.revoke_lease(two.lease).unwrap();
        assert!(raw.get(&key_of(OWN_PREFIX, G)).unwrap().is_some());
        let three = Node::start(&cluster.urls, "3", &["2"]);
        assert!(matches!(
            three.store.read_in_place(&file_key()).unwrap(),
            InPlace::Record(None)
        ));
        assert!(three.store.owns(G));
        // Node 1 sees it alive, then it dies too: node 1, taking it for
        // alive still, asks it for the file, and its wait for the
        // hand-over reads the owner afresh and finds it gone.
        assert!(matches!(
            one.store.read_in_place(&file_key()).unwrap(),
            InPlace::HeldElsewhere
        ));
        three.etcd.revoke_lease(three.lease).unwrap();
        assert_eq!(one.store.get(&file_key()).unwrap(), None);
        assert!(one.store.owns(G));
        one.set("1b");
        assert_eq!(
            raw.get(&key_of(OWN_PREFIX, G)).unwrap().unwrap().value,
            b"1"
        );
    }

    /// A take that etcd applied but whose answer was lost leaves etcd
    /// naming a node that holds nothing of the file: asked for it, that
    /// node ends the ownership, and the asker gets the file instead of
    /// waiting out the hand-over time and failing.
    #[test]
    fn an_owner_that_lost_its_takes_answer_hands_the_file_over_when_asked() {
        let cluster = Cluster::start("lost-take");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let own = key_of(OWN_PREFIX, G);
        raw.txn(&[], &[Op::Put(&own, b"2", 0)], &[]).unwrap();
        assert!(!two.store.owns(G));
        assert_eq!(one.store.get(&file_key()).unwrap(), None);
        assert!(one.store.owns(G));
        one.set("1a");
        assert_eq!(two.read(), "1a");
    }

    /// A restarted node puts its earlier runs' incarnation records again
    /// (it adopts their persistent handles): ownerships those runs left
    /// stay dead, to a lookup and to `clear_gone_owners` alike, while the
    /// live node's own are kept.
    #[test]
    fn an_incarnation_put_again_does_not_revive_its_ownerships() {
        let cluster = Cluster::start("adopted-owner");
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let (g2, g3) = (b"1123456789abcdef", b"2123456789abcdef");
        {
            let two = Node::start(&cluster.urls, "2", &[]);
            two.set("2a");
            crate::records::update::<Raw, _, StateError>(&*two.store, &key_of(b"file/", g2), |r| {
                r.0 = b"2b".to_vec();
                Ok(())
            })
            .unwrap();
            assert!(two.store.owns(G) && two.store.owns(g2));
            two.etcd.revoke_lease(two.lease).unwrap();
        }
        // The next run of that node adopts incarnation 2 under its lease.
        let lease = raw.grant_lease(30).unwrap();
        raw.txn(
            &[],
            &[Op::Put(&key_of(INCARNATIONS, b"2"), b"node", lease)],
            &[],
        )
        .unwrap();
        let one = Node::start(&cluster.urls, "1", &["2"]);
        crate::records::update::<Raw, _, StateError>(&*one.store, &key_of(b"file/", g3), |r| {
            r.0 = b"1c".to_vec();
            Ok(())
        })
        .unwrap();
        assert!(one.store.owns(g3));

        // One ownership found by a lookup (which takes the file, whose
        // records never reached etcd), the other by a pass.
        assert_eq!(one.store.get(&file_key()).unwrap(), None);
        assert!(one.store.owns(G));
        let three = Node::start(&cluster.urls, "3", &["2"]);
        assert_eq!(three.store.clear_gone_owners().unwrap(), 1);
        assert_eq!(raw.get(&key_of(OWN_PREFIX, g2)).unwrap(), None);
        for live in [G, g3] {
            assert_eq!(
                raw.get(&key_of(OWN_PREFIX, live)).unwrap().unwrap().value,
                b"1"
            );
        }
        assert!(one.store.owns(G) && one.store.owns(g3));
        assert_eq!(three.store.clear_gone_owners().unwrap(), 0);
    }

    #[test]
    fn ownership_moves_between_nodes_through_etcd() {
        let cluster = Cluster::start("ownership");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();

        // The first writer takes the file: its record stays in memory.
        one.set("1a");
        assert!(one.store.owns(G));
        assert_eq!(raw.get(&file_key()).unwrap(), None);
        assert_eq!(
            raw.get(&key_of(OWN_PREFIX, G)).unwrap().unwrap().value,
            b"1"
        );
        // A version read while owned does not match once the file moved.
        let stale = one.store.get(&file_key()).unwrap().unwrap().version;

        // The second node asks for it: the first hands it back, and the
        // record (naming node 1's open) is shared in etcd.
        assert_eq!(two.read(), "1a");
        assert!(!one.store.owns(G) && !two.store.owns(G));
        assert_eq!(raw.get(&file_key()).unwrap().unwrap().value, b"1a");
        assert_eq!(raw.get(&key_of(OWN_PREFIX, G)).unwrap(), None);
        assert_eq!(raw.scan_prefix(RELEASE_PREFIX).unwrap(), vec![]);
        assert_eq!(
            one.store
                .compare_and_set(&file_key(), Some(stale), Some(b"lost".to_vec()))
                .unwrap(),
            None
        );

        // Both write through etcd while both have entries.
        two.set("1a,2b");
        assert_eq!(one.read(), "1a,2b");
        assert!(!one.store.owns(G) && !two.store.owns(G));
        one.set("2b");
        // Only node 2's entry is left: its next look takes the file.
        assert_eq!(two.read(), "2b");
        assert!(two.store.owns(G));
        two.set("2b,2c");
        assert_eq!(raw.get(&file_key()).unwrap().unwrap().value, b"2b");

        // Node 2 dies: its ownership ends with its incarnation record,
        // which was on its lease, and node 1 (for
        // which node 2 is not gone) finds the record as node 2 last wrote
        // it to etcd, shared.
        two.etcd.revoke_lease(two.lease).unwrap();
        assert_eq!(one.read(), "2b");
        assert!(!one.store.owns(G));

        // A node for which the dead node is gone takes the file back, and
        // gives it up once nothing of it is left.
        let three = Node::start(&cluster.urls, "3", &["2"]);
        three.set("3x");
        assert!(three.store.owns(G));
        three.set("");
        assert_eq!(three.store.sweep(Duration::ZERO), 1);
        assert!(!three.store.owns(G));
        assert_eq!(raw.get(&key_of(OWN_PREFIX, G)).unwrap(), None);
        assert_eq!(raw.get(&file_key()).unwrap(), None);
        drop(one);
    }

    impl Node {
        /// Applies `f` to the record (comma-separated entries).
        fn update(&self, mut f: impl FnMut(&mut Vec<String>) -> Result<(), ()>) -> Result<(), ()> {
            crate::records::update::<Raw, _, StateError>(&*self.store, &file_key(), |r| {
                let mut entries: Vec<String> = String::from_utf8_lossy(&r.0)
                    .split(',')
                    .filter(|e| !e.is_empty())
                    .map(str::to_string)
                    .collect();
                let out = f(&mut entries);
                r.0 = entries.join(",").into_bytes();
                Ok(out)
            })
            .unwrap()
        }

        fn add(&self, entry: &str) {
            self.update(|e| {
                e.push(entry.to_string());
                Ok(())
            })
            .unwrap()
        }

        /// The etcd calls `f` made (on this thread: not the node's
        /// hand-over thread's, which may watch again meanwhile).
        fn calls_of(&self, f: impl FnOnce()) -> u64 {
            let before = crate::etcd_store::calls_on_this_thread();
            f();
            crate::etcd_store::calls_on_this_thread() - before
        }

        /// Asks twice before making a file in directory D: the first ask
        /// claims nothing (one file is taken alone), the second claims D;
        /// the test's file G is then made and held under the claim.
        fn claim_and_make(&self) {
            assert_eq!(self.store.before_making(D), None, "one file is taken alone");
            let token = self
                .store
                .before_making(D)
                .expect("claimed at the second file");
            assert!(self.store.made(G, D, token));
        }
    }

    /// The group of a directory the tests' file is made in.
    const D: &[u8] = b"a-directory-of-new-files";

    /// A node that makes files in a directory claims it at the second
    /// file, and holds what it makes there from memory: no `own/` record,
    /// no request. Another node that opens such a file through the
    /// directory meets the claim (an attribute open finds the file held
    /// elsewhere) and asks for it; the holder writes the file's ownership
    /// and lets the claim go, then hands the file over as any file it
    /// owns, its record with it.
    #[test]
    fn a_file_made_under_a_directory_claim_is_held_until_another_node_asks() {
        let cluster = Cluster::start("claims");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let claim = key_of(CLAIM_PREFIX, D);
        assert_eq!(one.store.before_making(D), None, "one file is taken alone");
        let token = one
            .store
            .before_making(D)
            .expect("claimed at the second file");
        assert_eq!(one.etcd.get(&claim).unwrap().unwrap().value, b"1");
        assert!(one.store.made(G, D, token));
        let _through = opening_in(D.to_vec());
        assert_eq!(one.calls_of(|| one.add("1a")), 0);
        assert!(one.etcd.get(&key_of(OWN_PREFIX, G)).unwrap().is_none());
        assert!(matches!(
            two.store.read_in_place(&file_key()).unwrap(),
            InPlace::HeldElsewhere
        ));
        // The attribute open asked for the claim, so the file is owned
        // now: a later lookup that does not know its directory (a query
        // of the attribute open's handle) finds it held, and takes nothing.
        assert!(one.etcd.get(&claim).unwrap().is_none(), "the claim let go");
        assert_eq!(
            one.etcd.get(&key_of(OWN_PREFIX, G)).unwrap().unwrap().value,
            b"1"
        );
        {
            let _unknown = made_here();
            assert!(matches!(
                two.store.read_in_place(&file_key()).unwrap(),
                InPlace::HeldElsewhere
            ));
        }
        two.add("2a");
        assert_eq!(two.read(), "1a,2a");
        // Not claimed again at once, where another node made it let go.
        assert_eq!(one.store.before_making(D), None);
        assert_eq!(one.store.before_making(D), None);
    }

    /// A lookup of a directory's own records through that directory (a
    /// CREATE's lease break or notification of its parent) compares no
    /// claim on it: the claim covers the directory's entries, not the
    /// directory, and the holder is not asked to let it go.
    #[test]
    fn a_directorys_own_records_are_not_under_its_claim() {
        let cluster = Cluster::start("claim-own-dir");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let claim = key_of(CLAIM_PREFIX, D);
        one.claim_and_make();
        let _through = opening_in(D.to_vec());
        let directory = key_of(b"file/", D);
        crate::records::update::<Raw, _, StateError>(&*two.store, &directory, |r| {
            r.0 = b"2d".to_vec();
            Ok(())
        })
        .unwrap();
        assert!(two.store.owns(D));
        assert_eq!(
            one.etcd.get(&claim).unwrap().unwrap().value,
            b"1",
            "the claim stands"
        );
        assert!(one.etcd.get(&key_of(OWN_PREFIX, G)).unwrap().is_none());
    }

    /// A node that makes files in a directory another node claims tries to
    /// claim it once, not at every other file, and takes the files it
    /// made comparing no claim: the claim stands.
    #[test]
    fn a_node_making_files_where_another_claims_leaves_the_claim_be() {
        let cluster = Cluster::start("claimed-elsewhere");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let claim = key_of(CLAIM_PREFIX, D);
        assert_eq!(one.store.before_making(D), None);
        assert!(one.store.before_making(D).is_some());
        assert_eq!(two.store.before_making(D), None);
        assert_eq!(two.store.before_making(D), None, "tried, and lost");
        let again = two.calls_of(|| assert_eq!(two.store.before_making(D), None));
        assert_eq!(again, 0, "not tried again at once");
        let _through = opening_in(D.to_vec());
        {
            let _made = made_here();
            two.add("2a");
        }
        assert!(two.store.owns(G));
        assert_eq!(one.etcd.get(&claim).unwrap().unwrap().value, b"1");
    }

    /// A file made under a claim and renamed into another directory is
    /// owned first: a node that opens it through its new directory, which
    /// no claim covers, finds its ownership and asks for it.
    #[test]
    fn a_file_made_under_a_claim_is_owned_before_it_moves_elsewhere() {
        let cluster = Cluster::start("claim-rename");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        one.claim_and_make();
        {
            let _through = opening_in(D.to_vec());
            one.add("1a");
        }
        one.store.naming_elsewhere(G).unwrap();
        let own = one.etcd.get(&key_of(OWN_PREFIX, G)).unwrap().unwrap();
        assert_eq!(own.value, b"1");
        let _through = opening_in(b"another-directory-of-all".to_vec());
        two.add("2a");
        assert_eq!(two.read(), "1a,2a");
    }

    /// Two files made at once in one directory: while the first's claim
    /// is written and not yet held, the second neither writes another
    /// (which would fail, find this node's claim not held and delete it
    /// as a leftover) nor holds the file from memory. Once held, the claim
    /// stands in etcd and covers what is made under it.
    #[test]
    fn a_claim_being_written_is_not_written_again_nor_taken_for_a_leftover() {
        let cluster = Cluster::start("claim-race");
        let one = Node::start(&cluster.urls, "1", &[]);
        let claim = key_of(CLAIM_PREFIX, D);
        assert_eq!(one.store.before_making(D), None);
        let held = one.store.claim_gate.arm();
        let first = {
            let store = one.store.clone();
            std::thread::spawn(move || store.before_making(D))
        };
        held.reached(Duration::from_secs(10));
        assert_eq!(one.etcd.get(&claim).unwrap().unwrap().value, b"1");
        // Two more files: enough to claim, were the write out not known.
        for _ in 0..2 {
            assert_eq!(
                one.store.before_making(D),
                None,
                "the claim is being written"
            );
        }
        assert_eq!(
            one.etcd.get(&claim).unwrap().map(|v| v.value),
            Some(b"1".to_vec()),
            "the claim being written stands"
        );
        held.release();
        let token = first
            .join()
            .unwrap()
            .expect("the first write holds the claim");
        assert!(one.store.made(G, D, token));
        assert_eq!(one.etcd.get(&claim).unwrap().unwrap().value, b"1");
    }

    /// A node whose own claim of a directory is being written (and will
    /// fail: another node holds it) compares the directory's claim in its
    /// takes meanwhile: it asks the holder, and does not take a file the
    /// holder made there.
    #[test]
    fn a_node_writing_a_claim_still_compares_the_one_that_stands() {
        let cluster = Cluster::start("claim-writing");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        two.claim_and_make();
        let _through = opening_in(D.to_vec());
        two.add("2a");
        assert_eq!(one.store.before_making(D), None);
        let held = one.store.claim_gate.arm();
        let claiming = {
            let store = one.store.clone();
            std::thread::spawn(move || store.before_making(D))
        };
        held.reached(Duration::from_secs(10));
        one.add("1a");
        assert_eq!(one.read(), "2a,1a", "the holder's record kept");
        held.release();
        assert_eq!(claiming.join().unwrap(), None);
    }

    /// A record written where none was, in a file that has others, in a
    /// directory another node claims: no claim covers a file with records,
    /// so it is written at once (not lost to the claim time after time).
    #[test]
    fn a_shared_files_new_record_is_written_in_a_claimed_directory() {
        let cluster = Cluster::start("claim-shared");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        shared_by(&one, &two);
        assert_eq!(one.store.before_making(D), None);
        assert!(one.store.before_making(D).is_some());
        let _through = opening_in(D.to_vec());
        let more = key_of(b"more/", G);
        let calls = two.calls_of(|| {
            crate::records::update::<Raw, _, StateError>(&*two.store, &more, |r| {
                r.0 = b"2m".to_vec();
                Ok(())
            })
            .unwrap()
        });
        assert!(calls <= 4, "{calls} etcd calls");
        assert_eq!(two.read_more(), "2m");
        assert_eq!(one.read(), "1a,2a");
    }

    /// A claim whose holder is gone is dead: a node that meets it deletes
    /// it and takes the file at once.
    #[test]
    fn a_dead_nodes_directory_claim_is_cleared_by_the_next_take() {
        let cluster = Cluster::start("dead-claim");
        let two = Node::start(&cluster.urls, "2", &[]);
        let claim = key_of(CLAIM_PREFIX, D);
        two.etcd.txn(&[], &[Op::Put(&claim, b"9", 0)], &[]).unwrap();
        let _through = opening_in(D.to_vec());
        two.add("2a");
        assert!(two.store.owns(G));
        assert!(two.etcd.get(&claim).unwrap().is_none());
        assert_eq!(two.read(), "2a");
        // One nobody meets is cleared by the sweep of gone owners; a live
        // node's stands.
        let other = key_of(CLAIM_PREFIX, b"another-directory");
        let live = key_of(CLAIM_PREFIX, b"a-live-one");
        two.etcd
            .txn(
                &[],
                &[Op::Put(&other, b"9", 0), Op::Put(&live, b"2", 0)],
                &[],
            )
            .unwrap();
        assert_eq!(two.store.clear_gone_owners().unwrap(), 1);
        assert!(two.etcd.get(&other).unwrap().is_none());
        assert!(two.etcd.get(&live).unwrap().is_some());
    }

    /// A record naming both nodes' entries: shared in etcd, owned by none.
    fn shared_by(one: &Node, two: &Node) {
        one.add("1a");
        two.add("2a");
        assert!(!one.store.owns(G) && !two.store.owns(G));
        assert_eq!(two.read(), "1a,2a");
    }

    #[test]
    fn updates_of_a_shared_record_start_from_the_last_one_and_prove_it() {
        let cluster = Cluster::start("turns");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        shared_by(&one, &two);

        // The first update on node 1 reads and writes; each after it
        // starts from what the one before left: one round trip.
        assert_eq!(one.calls_of(|| one.add("1b")), 2);
        for e in ["1c", "1d", "1e"] {
            assert_eq!(one.calls_of(|| one.add(e)), 1, "{e}");
        }
        // Node 2 changed the record: node 1's write against its memo
        // fails, and the same transaction reads the record as it is.
        two.add("2b");
        assert_eq!(one.calls_of(|| one.add("1f")), 2);
        assert_eq!(one.read(), "1a,2a,1b,1c,1d,1e,2b,1f");

        // A rule that refuses (or would write nothing) on a remembered
        // record is decided again on the current one: node 1 remembers
        // 2b, which node 2 has since removed.
        two.update(|e| {
            e.retain(|e| e != "2b");
            Ok(())
        })
        .unwrap();
        one.update(|e| {
            if e.iter().any(|e| e == "2b") {
                return Err(());
            }
            e.push("1g".into());
            Ok(())
        })
        .expect("refused on a stale record");
        // And a refusal on the current record stands.
        assert_eq!(
            one.update(|e| if e.len() > 1 { Err(()) } else { Ok(()) }),
            Err(())
        );
        assert_eq!(two.read(), "1a,2a,1b,1c,1d,1e,1f,1g");
        assert!(!one.store.owns(G) && !two.store.owns(G));

        // Once the record names only node 1's entries, node 1 takes the
        // file again (a full read finds that out): its updates are in
        // memory from then on.
        two.update(|e| {
            e.retain(|e| !e.starts_with('2'));
            Ok(())
        })
        .unwrap();
        one.add("1h");
        one.add("1i");
        assert!(one.store.owns(G));
        assert_eq!(one.calls_of(|| one.add("1j")), 0);
        assert_eq!(one.read(), "1a,1b,1c,1d,1e,1f,1g,1h,1i,1j");
    }

    impl Node {
        /// Appends `entry` to both records of the file in one write, if
        /// the store writes them together.
        fn add_both(&self, entry: &str) -> Option<()> {
            let more = key_of(b"more/", G);
            crate::records::update_both::<Raw, Raw, (), StateError>(
                &*self.store,
                [&file_key(), &more],
                |a, b| {
                    for r in [a, b] {
                        if !r.0.is_empty() {
                            r.0.push(b',');
                        }
                        r.0.extend_from_slice(entry.as_bytes());
                    }
                    Ok(())
                },
            )
            .map(|r| r.unwrap())
        }

        fn read_more(&self) -> String {
            let v = crate::records::read::<Raw>(&*self.store, &key_of(b"more/", G)).unwrap();
            String::from_utf8(v.0).unwrap()
        }
    }

    #[test]
    fn two_records_of_a_shared_file_are_written_in_one_transaction() {
        let cluster = Cluster::start("together");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        // A file node 1 holds is not written together: its updates are
        // in memory, one by one.
        one.add("1a");
        assert!(one.store.owns(G));
        assert_eq!(one.add_both("1x"), None);
        assert_eq!(one.read(), "1a");

        two.add("2a");
        assert!(!one.store.owns(G) && !two.store.owns(G));
        // The first write reads both records (a round trip each), then
        // writes both in one; the next starts from what it left.
        assert_eq!(one.calls_of(|| assert_eq!(one.add_both("1b"), Some(()))), 3);
        assert_eq!(one.calls_of(|| assert_eq!(one.add_both("1c"), Some(()))), 1);
        // An update that changes nothing on the records it remembers
        // proves its answer on both records as they are now: one
        // read-only transaction (they name node 2's entries, so node 1
        // could not take the file).
        let unchanged = || {
            crate::records::update_both::<Raw, Raw, (), StateError>(
                &*one.store,
                [&file_key(), &key_of(b"more/", G)],
                |_, _| Ok(()),
            )
        };
        assert_eq!(
            one.calls_of(|| assert!(matches!(unchanged(), Some(Ok(()))))),
            1
        );
        // An update of one record in its own turn follows on from the
        // write of both.
        assert_eq!(one.calls_of(|| one.add("1d")), 1);
        // Node 2 changes one of them: node 1's next write loses, reads
        // both in the same transaction, and writes again.
        two.add("2b");
        assert_eq!(one.calls_of(|| assert_eq!(one.add_both("1e"), Some(()))), 2);
        assert_eq!(two.read(), "1a,2a,1b,1c,1d,2b,1e");
        assert_eq!(two.read_more(), "1b,1c,1e");
        assert!(!one.store.owns(G) && !two.store.owns(G));
    }

    #[test]
    fn a_file_waiting_for_its_hand_over_holds_up_no_other_files_updates() {
        let cluster = Cluster::start("turnsapart");
        let mut one = Node::start(&cluster.urls, "1", &[]);
        let two = Arc::new(Node::start(&cluster.urls, "2", &[]));
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let other_group: &[u8] = b"fedcba9876543210";
        let other = key_of(b"file/", other_group);
        let add = |node: &Node, key: &[u8], entry: &str| {
            crate::records::update::<Raw, _, StateError>(&*node.store, key, |r| {
                if !r.0.is_empty() {
                    r.0.push(b',');
                }
                r.0.extend_from_slice(entry.as_bytes());
                Ok(())
            })
            .unwrap()
        };
        // The other file is shared by both nodes (its updates take turns
        // on each); node 1 holds the first and stops answering requests.
        add(&one, &other, "1a");
        add(&two, &other, "2a");
        assert!(!one.store.owns(other_group) && !two.store.owns(other_group));
        one.set("1a");
        one.stop.store(true, Ordering::SeqCst);
        one.server.take().unwrap().join().unwrap();

        // Node 2's update of the first file waits in its turn for node 1.
        let waiting = {
            let two = two.clone();
            std::thread::spawn(move || two.set("2a"))
        };
        let request = release_key(b"1", G);
        let deadline = Instant::now() + Duration::from_secs(5);
        while raw.get(&request).unwrap().is_none() {
            assert!(Instant::now() < deadline, "node 2 never asked");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Meanwhile node 2's updates of the other file go on at once.
        let t = Instant::now();
        add(&two, &other, "2b");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

        // Node 1 answers again: the waiting update goes through.
        let stop = Arc::new(AtomicBool::new(false));
        let serving = {
            let (s, st) = (one.store.clone(), stop.clone());
            std::thread::spawn(move || s.serve_releases(&st))
        };
        waiting.join().unwrap();
        assert_eq!(two.read(), "2a");
        stop.store(true, Ordering::SeqCst);
        serving.join().unwrap();
    }

    #[test]
    fn concurrent_updates_on_two_nodes_lose_nothing() {
        let cluster = Cluster::start("turnsrace");
        let one = Arc::new(Node::start(&cluster.urls, "1", &[]));
        let two = Arc::new(Node::start(&cluster.urls, "2", &[]));
        shared_by(&one, &two);
        let writers: Vec<_> = (0..8)
            .map(|t| {
                let node = if t % 2 == 0 { one.clone() } else { two.clone() };
                std::thread::spawn(move || {
                    for i in 0..10 {
                        node.add(&format!("{}t{t}i{i}", if t % 2 == 0 { 1 } else { 2 }));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let all = one.read();
        let entries: Vec<&str> = all.split(',').collect();
        assert_eq!(entries.len(), 2 + 80, "{all}");
        for t in 0..8 {
            for i in 0..10 {
                let e = format!("{}t{t}i{i}", if t % 2 == 0 { 1 } else { 2 });
                assert!(entries.contains(&e.as_str()), "{e} lost: {all}");
            }
        }
    }

    #[test]
    fn a_request_for_a_file_names_the_ownership_it_asks_to_end() {
        let cluster = Cluster::start("terms");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let own = key_of(OWN_PREFIX, G);

        // Node 1 takes the file, hands it back when node 2 looks, and takes
        // it again once its record names only node 1's entries.
        one.set("1a");
        let first = raw.get(&own).unwrap().unwrap().version;
        assert_eq!(two.read(), "1a");
        assert!(!one.store.owns(G));
        one.set("1b");
        assert!(one.store.owns(G));
        let second = raw.get(&own).unwrap().unwrap().version;
        assert_ne!(first, second);

        // Asked about the first ownership, node 2 neither writes a request
        // (nobody would answer one for an ownership that ended) nor waits
        // out the hand-over timeout on the second: it returns to look
        // again at once.
        let asked = Instant::now();
        two.store.ask_release(b"1", first, G, true).unwrap();
        assert!(asked.elapsed() < Duration::from_secs(5));
        assert_eq!(raw.scan_prefix(RELEASE_PREFIX).unwrap(), vec![]);
        assert!(one.store.owns(G));

        // Asked about the ownership that stands, node 1 hands it back.
        two.store.ask_release(b"1", second, G, true).unwrap();
        assert!(!one.store.owns(G));
        assert_eq!(raw.get(&own).unwrap(), None);
        assert_eq!(raw.get(&file_key()).unwrap().unwrap().value, b"1b");
    }

    #[test]
    fn a_node_keeps_a_file_it_took_for_its_tenure_before_handing_it_over() {
        let cluster = Cluster::start("tenure");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);

        let before_take = Instant::now();
        one.set("1a");
        assert!(one.store.owns(G));
        // Asked at once, node 1 answers when its tenure is up, not sooner;
        // the reader then has the record as node 1 wrote it.
        assert_eq!(two.read(), "1a");
        assert!(before_take.elapsed() >= TENURE);
        assert!(!one.store.owns(G));
        // A node's own hand-back (`release`, for a file it must share now)
        // is done at once, tenure or not.
        let three = Node::start(&cluster.urls, "3", &["1"]);
        three.set("3a");
        assert!(three.store.owns(G));
        three.store.release(G).unwrap();
        assert!(!three.store.owns(G));
    }

    /// A wait for a hand-over that watches the ownership record ends on
    /// the watch's event: with the wait's own reads of the record and of
    /// the owner put past the hand-over timeout, only the watch can tell
    /// the asker that the owner let the file go.
    #[test]
    fn a_watched_hand_over_ends_the_wait_on_the_watchs_event() {
        let cluster = Cluster::start("watched-hand-over");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let own = key_of(OWN_PREFIX, G);
        one.set("1a");
        assert!(one.store.owns(G));
        let since = raw.get(&own).unwrap().unwrap().version;

        two.store.watch_alone.store(true, Ordering::SeqCst);
        assert!(two.store.ask_release(b"1", since, G, true).unwrap());
        assert!(!one.store.owns(G));
        assert_eq!(raw.get(&own).unwrap(), None);
        assert_eq!(raw.get(&file_key()).unwrap().unwrap().value, b"1a");
    }

    /// A hand-back etcd applied but whose answer was lost: the node must
    /// not go on deciding the file from memory (another node may have
    /// taken it by then), nor give up its records (etcd may still name it
    /// owner); it tries again, learns that the first try was applied, and
    /// then reaches the file through etcd like any other node.
    #[test]
    fn a_hand_back_whose_answer_was_lost_is_not_decided_from_memory() {
        let cluster = Cluster::start("lost-answer");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        one.set("1a");
        one.set("");
        assert!(one.store.owns(G));
        // The idle file is given back to etcd; the answer is lost.
        one.store
            .lose_write_back_answer
            .store(true, Ordering::SeqCst);
        assert_eq!(one.store.sweep(Duration::ZERO), 0);
        assert!(
            !one.store.owns(G),
            "decided from memory after an unknown outcome"
        );
        // Node 2 takes the free file meanwhile.
        two.set("2b");
        assert!(two.store.owns(G));
        // Node 1's next write reaches it through node 2, not its memory.
        one.set("1c");
        assert_eq!(two.read(), "1c");
        assert_eq!(one.read(), "1c");
        assert_eq!(one.store.settle(), 0);
    }

    /// A take etcd applied under a lease the node lost before it could
    /// hold the file in memory: the file is not held (etcd's ownership
    /// ends with the incarnation on that lease, and a node holding it
    /// once it joined again would decide it beside whoever took it next).
    #[test]
    fn a_take_answered_after_the_lease_was_lost_is_not_held() {
        let cluster = Cluster::start("take-across-loss");
        let one = Node::start(&cluster.urls, "1", &[]);
        one.store
            .lose_lease_before_adopting
            .store(true, Ordering::SeqCst);
        let read = crate::records::read::<Raw>(&*one.store, &file_key());
        assert!(matches!(read, Err(StateError::Unavailable(_))), "{read:?}");
        assert!(!one.store.owns(G), "held in memory across the lease's loss");
        assert_eq!(one.store.owned(), 0);
        // Proven again, it finds itself named owner in etcd but holds
        // nothing: mended as a lost hand-back, and the file taken anew.
        one.store
            .lease_proven_until(Instant::now() + Duration::from_secs(30));
        assert_eq!(one.read(), "");
        assert!(one.store.owns(G));
    }

    /// A node that leaves ends its proof (`end_proof`) and then revokes
    /// its lease, after which other nodes take its files. A write decided
    /// from memory that passed its fence before the end must therefore be
    /// over when `end_proof` returns, and none may begin after it.
    #[test]
    fn end_proof_returns_after_a_decision_under_way_and_no_other_begins() {
        let cluster = Cluster::start("endproof");
        let one = Node::start(&cluster.urls, "1", &[]);
        one.set("1a");
        assert!(one.store.owns(G));
        let held = one.store.decision_gate.arm();
        let store = one.store.clone();
        let deciding = std::thread::spawn(move || {
            crate::records::update::<Raw, _, StateError>(&*store, &file_key(), |r| {
                r.0 = b"1b".to_vec();
                Ok(())
            })
        });
        held.reached(Duration::from_secs(10));
        let ended = Arc::new(AtomicBool::new(false));
        let (store, flag) = (one.store.clone(), ended.clone());
        let ending = std::thread::spawn(move || {
            store.end_proof();
            flag.store(true, Ordering::SeqCst);
        });
        // The decision holds the groups' lock: end_proof waits for it.
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            assert!(
                !ended.load(Ordering::SeqCst),
                "end_proof returned while a decision from memory was under way"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        held.release();
        deciding.join().unwrap().unwrap();
        ending.join().unwrap();
        assert!(ended.load(Ordering::SeqCst));
        // Nothing more is decided from memory, nor read from it.
        assert!(!one.store.lease_proven());
        let refused = crate::records::update::<Raw, _, StateError>(&*one.store, &file_key(), |r| {
            r.0 = b"1c".to_vec();
            Ok(())
        });
        assert!(
            matches!(refused, Err(StateError::Unavailable(_))),
            "{refused:?}"
        );
        assert!(matches!(
            one.store.read_in_place(&file_key()),
            Err(StateError::Unavailable(_))
        ));
    }

    #[test]
    fn a_read_in_place_never_asks_another_node_for_a_file() {
        let cluster = Cluster::start("inplace");
        let one = Node::start(&cluster.urls, "1", &[]);
        let two = Node::start(&cluster.urls, "2", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let own = key_of(OWN_PREFIX, G);

        // Nobody has records of the file: read as `get` reads it, which
        // takes it.
        assert_eq!(
            two.store.read_in_place(&file_key()).unwrap(),
            InPlace::Record(None)
        );
        assert!(two.store.owns(G));
        let owned_at = raw.get(&own).unwrap().unwrap().version;

        // Node 1 is told node 2 holds it, and node 2 keeps it (the same
        // ownership record, no hand-over request), records and all.
        two.set("2a");
        for _ in 0..3 {
            assert_eq!(
                one.store.read_in_place(&file_key()).unwrap(),
                InPlace::HeldElsewhere
            );
        }
        assert!(two.store.owns(G) && !one.store.owns(G));
        assert_eq!(raw.get(&own).unwrap().unwrap().version, owned_at);
        assert_eq!(raw.scan_prefix(RELEASE_PREFIX).unwrap(), vec![]);
        match two.store.read_in_place(&file_key()).unwrap() {
            InPlace::Record(Some(v)) => assert_eq!(v.value, b"2a"),
            other => panic!("{other:?}"),
        }

        // Shared (node 1 wrote through `get`, which asked for it): read
        // from etcd as it is, and taken by neither node while it names
        // both nodes' entries.
        one.set("2a,1b");
        assert!(!one.store.owns(G) && !two.store.owns(G));
        for node in [&one, &two] {
            match node.store.read_in_place(&file_key()).unwrap() {
                InPlace::Record(Some(v)) => assert_eq!(v.value, b"2a,1b"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(raw.get(&own).unwrap(), None);
        // Only node 1's entry left: claimable by node 1, which takes it.
        two.set("1b");
        assert!(matches!(
            one.store.read_in_place(&file_key()).unwrap(),
            InPlace::Record(Some(_))
        ));
        assert!(one.store.owns(G));
    }

    /// A record that does not decode (forged: no valid tag of the cluster
    /// secret) of a file another node holds: a read in place answers from
    /// the ownership, which is what it goes on, as `HeldElsewhere`; the
    /// forged record fails only a lookup that would read it.
    #[test]
    fn a_forged_record_of_a_file_another_node_holds_fails_no_read_in_place() {
        let cluster = Cluster::start("forgedheld");
        let key = Arc::new(crate::etcd_seal::RecordKey::from_secret(&[3; 32]).unwrap());
        let one = Node::start_sealed(&cluster.urls, "1", &[], Some(key.clone()));
        let two = Node::start_sealed(&cluster.urls, "2", &[], Some(key));
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        assert_eq!(
            two.store.read_in_place(&file_key()).unwrap(),
            InPlace::Record(None)
        );
        assert!(two.store.owns(G));
        raw.compare_and_set(&file_key(), None, Some(b"forged".to_vec()))
            .unwrap();
        assert_eq!(
            one.store.read_in_place(&file_key()).unwrap(),
            InPlace::HeldElsewhere
        );
        // Given back, nobody owns it: the forged record is what a lookup
        // reads, and it fails.
        two.store.forget_all();
        raw.compare_and_set(
            &key_of(OWN_PREFIX, G),
            Some(raw.get(&key_of(OWN_PREFIX, G)).unwrap().unwrap().version),
            None,
        )
        .unwrap();
        assert!(matches!(
            one.store.read_in_place(&file_key()),
            Err(StateError::Corrupt(_))
        ));
    }

    #[test]
    fn threads_of_one_node_taking_a_file_at_once_leave_it_owned_in_etcd() {
        // Requests of several connections of one node look up a file nobody
        // owns at the same moment: whichever takes it, the node must end
        // up named its owner in etcd as well as in memory (a second lookup
        // used to take the first one's fresh ownership for a lost
        // hand-back and delete it).
        let cluster = Cluster::start("race");
        let one = Node::start(&cluster.urls, "1", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        for round in 0..40u32 {
            let group = format!("race-{round:011}").into_bytes();
            let key = key_of(b"file/", &group);
            let start = Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (store, key, start) = (one.store.clone(), key.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        store.get(&key)
                    })
                })
                .collect();
            for t in threads {
                assert_eq!(t.join().unwrap().unwrap(), None);
            }
            assert!(one.store.owns(&group), "round {round}");
            assert_eq!(
                raw.get(&key_of(OWN_PREFIX, &group))
                    .unwrap()
                    .map(|v| v.value),
                Some(b"1".to_vec()),
                "round {round}: owned in memory but not in etcd"
            );
        }
    }

    /// Takes of files looked up together go in one request, and each is
    /// decided on its own: a file with a record another node's opens
    /// hold stays shared while the others are taken. Idle files are given
    /// back the same way.
    #[test]
    fn takes_and_give_backs_sent_together_decide_each_file_alone() {
        let cluster = Cluster::start("batch");
        let one = Node::start(&cluster.urls, "1", &[]);
        let raw = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let groups: Vec<Vec<u8>> = (0..3)
            .map(|i| format!("batch-{i:010}").into_bytes())
            .collect();
        // The middle one has a record of node 2's (not claimable by 1).
        raw.compare_and_set(
            &key_of(b"file/", &groups[1]),
            None,
            Some(b"2-open".to_vec()),
        )
        .unwrap();
        // Counted on this thread: the node's own threads call etcd too.
        let on_this_thread = crate::etcd_store::calls_on_this_thread;
        let calls = on_this_thread();
        let out: Vec<TxnOutcome> = one
            .store
            .take_new(&groups.iter().map(|g| (g.clone(), None)).collect::<Vec<_>>())
            .unwrap()
            .into_iter()
            .map(|t| t.unwrap())
            .collect();
        assert_eq!(on_this_thread() - calls, 1, "three takes, one request");
        assert_eq!(
            out.iter().map(|t| t.succeeded).collect::<Vec<_>>(),
            [true, false, true]
        );
        let owner = |g: &[u8]| raw.get(&key_of(OWN_PREFIX, g)).unwrap().map(|v| v.value);
        assert_eq!(owner(&groups[0]), Some(b"1".to_vec()));
        assert_eq!(owner(&groups[1]), None);
        assert_eq!(owner(&groups[2]), Some(b"1".to_vec()));
        // The failed one read what it needs to go on: no owner, its record.
        let record = out[1].reads.get(1).cloned().flatten().map(|r| r.value);
        assert_eq!(out[1].reads.first().cloned().flatten(), None);
        assert_eq!(record, Some(b"2-open".to_vec()));

        // Files taken through the store's lookups, idle: given back
        // together.
        let idle: Vec<Vec<u8>> = (3..6)
            .map(|i| format!("batch-{i:010}").into_bytes())
            .collect();
        for g in &idle {
            assert_eq!(one.store.get(&key_of(b"file/", g)).unwrap(), None);
            assert!(one.store.owns(g));
            assert_eq!(owner(g), Some(b"1".to_vec()));
        }
        let calls = on_this_thread();
        assert_eq!(one.store.sweep(Duration::ZERO), 3);
        assert_eq!(on_this_thread() - calls, 1, "three give-backs, one request");
        for g in &idle {
            assert_eq!(owner(g), None);
            assert!(!one.store.owns(g));
        }
    }

    #[test]
    fn watch_delivers_changes_in_order_from_a_revision() {
        let cluster = Cluster::start("watch");
        let etcd = EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let start = etcd.revision().unwrap() + 1;
        etcd.compare_and_set(b"w/a", None, Some(b"1".to_vec()))
            .unwrap();
        etcd.compare_and_set(b"other", None, Some(b"x".to_vec()))
            .unwrap();
        let mut w = etcd.watch(b"w/", start);
        let v = etcd.get(b"w/a").unwrap().unwrap().version;
        etcd.compare_and_set(b"w/a", Some(v), None).unwrap();
        let mut events = Vec::new();
        let until = Instant::now() + Duration::from_secs(10);
        while events.len() < 2 && Instant::now() < until {
            events.extend(w.next(Duration::from_millis(200)).unwrap().events);
        }
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(
            (events[0].key.as_slice(), events[0].value.as_deref()),
            (&b"w/a"[..], Some(&b"1"[..]))
        );
        assert_eq!(
            (events[1].key.as_slice(), events[1].value.as_deref()),
            (&b"w/a"[..], None)
        );
        assert!(events[0].revision < events[1].revision);
        // Nothing more comes, and a wait with nothing is short and empty.
        assert!(w
            .next(Duration::from_millis(100))
            .unwrap()
            .events
            .is_empty());
    }
}
