//! Claims on directories (docs/SCALING.md, "New files"): a node that makes
//! files in a directory at a rate writes `newin/<directory's group>` once,
//! naming its incarnation, and then holds the files it makes there from
//! memory, with no etcd request each. The claim means: every file of that
//! directory with neither an `own/` record nor records is that node's. So
//! another node's take of a file opened through that directory compares
//! the claim absent in the same transaction, and one that finds it asks
//! the holder to let it go (a request under `release/<holder>/`, as for a
//! file), as it would ask for a file the holder owns.
//!
//! The store's calls take record keys only, so the directory an open
//! resolved its name through reaches the lookups of that open by a scope
//! on its thread (`opening_in`). Only lookups made while a file is opened
//! need it: a file some node has open has records (in etcd, or in an
//! owner's memory behind its `own/` record), and no claim covers it.
//!
//! Letting a claim go: the holder stops making files under it, writes
//! `own/` for every file it holds under it that has records, drops the
//! others from memory (nobody's once the claim is gone), then deletes the
//! claim. A claim is dead on the rule of an `own/` record (its
//! incarnation's record gone, or younger than the claim) and cleared by
//! whoever finds it so.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{key_of, release_key, with_reads, ClusterStore, Group, OWN_PREFIX};
use crate::etcd_store::{Cmp, Op, MAX_TXNS_PER_REQUEST};
use crate::store::StateError;

/// Key prefix of directory claims: `newin/<directory's group>`.
pub const CLAIM_PREFIX: &[u8] = b"newin/";

/// A node claims a directory once it made this many files in it within
/// `CLAIM_WITHIN`: one file alone is taken by its own transaction.
const CLAIM_AFTER: u32 = 2;
const CLAIM_WITHIN: Duration = Duration::from_secs(1);

/// A claim let go because another node asked is not made again for this
/// long: a directory several nodes make files in goes back to one
/// transaction per file, not a hand-over of the claim per file.
const NOT_AGAIN_FOR: Duration = Duration::from_secs(5);

/// A claim under which no file was made for this long is let go (`sweep`).
pub(super) const CLAIM_IDLE: Duration = Duration::from_secs(30);

/// At most this many directories' counts of files made lately are kept.
const COUNTED_KEPT: usize = 1024;

thread_local! {
    /// The group of the directory the open under way on this thread
    /// resolved its name through (`opening_in`).
    static OPENING_IN: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// While the returned scope lives, the lookups of this thread are of a
/// file opened through directory `dir` (its group: the directory's
/// `FileKey::record_key(&[])`): a take of a file nobody has records of
/// compares that directory's claim. A store that keeps no claims ignores
/// it.
pub fn opening_in(dir: Vec<u8>) -> OpeningIn {
    let before = OPENING_IN.with(|d| d.replace(Some(dir)));
    OpeningIn { before }
}

/// While the returned scope lives, the lookups of this thread are of a
/// directory's own records (its leases, say): no claim covers a
/// directory, whatever the directory its open came through, and its
/// lookups compare none.
pub fn of_a_directory() -> OpeningIn {
    comparing_no_claim()
}

/// While the returned scope lives, the lookups of this thread are of a
/// file this node has just made (`O_EXCL`): no other node made it, so no
/// other node holds it under a claim, and its take compares none (a node
/// that makes files in a directory another node claims does not ask that
/// node to let the claim go).
pub fn made_here() -> OpeningIn {
    comparing_no_claim()
}

/// The scope of both cases above: the thread's lookups compare no claim
/// until it ends.
fn comparing_no_claim() -> OpeningIn {
    let before = OPENING_IN.with(|d| d.replace(None));
    OpeningIn { before }
}

/// The scope `opening_in` returns; the directory before it is back when
/// it ends.
pub struct OpeningIn {
    before: Option<Vec<u8>>,
}

impl Drop for OpeningIn {
    fn drop(&mut self) {
        let before = self.before.take();
        OPENING_IN.with(|d| *d.borrow_mut() = before);
    }
}

/// The directory of the open under way on this thread, if one is.
pub(super) fn opened_through() -> Option<Vec<u8>> {
    OPENING_IN.with(|d| d.borrow().clone())
}

/// What a node knows of its claims.
#[derive(Default)]
pub(super) struct Claims {
    /// Directories this node claims: a token per claim, when it last made
    /// a file under it, and the count of lease changes it was made under.
    /// Only these this node's lookups do not compare: it knows what it
    /// holds under them.
    held: HashMap<Vec<u8>, Held>,
    /// Claims being let go, and whether a thread is at it now (false: its
    /// last try failed, and whoever meets the claim tries again). This
    /// node's lookups that meet one wait for the letting go.
    letting_go: HashMap<Vec<u8>, bool>,
    /// Claims being written: one at a time per directory. This node's
    /// lookups that meet one wait for its answer, and do not take it for
    /// a leftover; a request to let one go waits until it is held.
    claiming: HashSet<Vec<u8>>,
    /// Files made lately in directories not claimed: how many, since when.
    counted: HashMap<Vec<u8>, (u32, Instant)>,
    /// Directories let go on request, not claimed again until then.
    not_before: HashMap<Vec<u8>, Instant>,
    next_token: u64,
}

/// A claim this node holds.
struct Held {
    token: u64,
    last: Instant,
    lease_changes: u64,
}

/// How long a lookup waits for this node's own claim to be written or
/// let go before it fails (etcd would be failing by then).
const CLAIM_SETTLES_WITHIN: Duration = Duration::from_secs(10);

/// Ends a claim's write or letting go in `Claims` when the thread leaves
/// it otherwise than by its own ending (an unwinding panic), and wakes the
/// lookups that wait for it: none waits for a write or letting go that no
/// thread does any more.
struct Settling<'a> {
    store: &'a ClusterStore,
    dir: &'a [u8],
    writing: bool,
    armed: bool,
}

impl Drop for Settling<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut c = self.store.claims();
        if self.writing {
            c.claiming.remove(self.dir);
        } else if let Some(under_way) = c.letting_go.get_mut(self.dir) {
            *under_way = false;
        }
        self.store.claims_settled(c);
    }
}

impl Claims {
    /// Whether this node's claim on `dir` is being written or let go by a
    /// thread now.
    fn unsettled(&self, dir: &[u8]) -> bool {
        self.claiming.contains(dir) || self.letting_go.get(dir) == Some(&true)
    }
}

impl ClusterStore {
    fn claims(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The claim key a lookup of `group` by this thread compares absent:
    /// that of the directory its open came through, unless this node
    /// claims it, or `group` is that directory itself (its own records,
    /// a parent's lease break or notification say, are not its entries:
    /// no claim on it covers them, and meeting one would ask for it).
    pub(super) fn claim_to_compare(&self, group: &[u8]) -> Option<Vec<u8>> {
        let dir = opened_through().filter(|dir| dir.as_slice() != group)?;
        (!self.claims().held.contains_key(&dir)).then(|| key_of(CLAIM_PREFIX, &dir))
    }

    /// Says that a claim of this node was written or let go, to lookups
    /// that wait for it (`meet_claim`).
    fn claims_settled(&self, c: std::sync::MutexGuard<'_, Claims>) {
        drop(c);
        self.claims_changed.notify_all();
    }

    /// A regular file is about to be made (`O_EXCL`) in directory `dir`: a
    /// token when it may be held from memory once made (`made`), the
    /// directory's claim standing in etcd now. The claim is written here,
    /// in place of the file's take, once the node has made files in the
    /// directory at a rate.
    pub fn before_making(&self, dir: &[u8]) -> Option<u64> {
        // The count first, as `find` does: `forget_all` ends the proof
        // before it counts.
        let changes = self.lease_changes.load(Ordering::SeqCst);
        self.fenced().ok()?;
        let now = Instant::now();
        {
            let mut c = self.claims();
            if let Some(held) = c.held.get_mut(dir) {
                held.last = now;
                return Some(held.token);
            }
            if c.letting_go.contains_key(dir)
                || c.claiming.contains(dir)
                || c.not_before.get(dir).is_some_and(|t| now < *t)
            {
                return None;
            }
            c.not_before.retain(|_, t| now < *t);
            if c.counted.len() >= COUNTED_KEPT {
                c.counted
                    .retain(|_, (_, since)| now.duration_since(*since) < CLAIM_WITHIN);
                if c.counted.len() >= COUNTED_KEPT {
                    c.counted.clear();
                }
            }
            let count = c.counted.entry(dir.to_vec()).or_insert((0, now));
            if now.duration_since(count.1) >= CLAIM_WITHIN {
                *count = (0, now);
            }
            count.0 += 1;
            if count.0 < CLAIM_AFTER {
                return None;
            }
            c.counted.remove(dir);
            c.claiming.insert(dir.to_vec());
        }
        let mut settling = Settling {
            store: self,
            dir,
            writing: true,
            armed: true,
        };
        let claim = key_of(CLAIM_PREFIX, dir);
        let me = self.me();
        // Not under the lease, as `own/` records are not (the module
        // comment of `cluster_store`): the incarnation record is.
        let written = self.etcd.txn(
            &[Cmp::Absent(&claim)],
            &[Op::Put(&claim, &me, 0)],
            &[Op::Get(&claim)],
        );
        #[cfg(test)]
        self.claim_gate.pass();
        let mut c = self.claims();
        c.claiming.remove(dir);
        settling.armed = false;
        // An error leaves the claim perhaps written and not held: a
        // leftover, which whoever meets it deletes (`meet_claim`).
        let Ok(t) = written else {
            self.claims_settled(c);
            return None;
        };
        if !t.succeeded {
            self.claims_settled(c);
            // A dead node's claim (or this node's own, left over) goes
            // now; a live node's stands, and is not tried again at every
            // other file made here.
            if let Some(Some(holder)) = t.reads.first() {
                let _ = self.meet_claim(&holder.value, holder.version, &claim, false, false);
            }
            self.claims()
                .not_before
                .insert(dir.to_vec(), Instant::now() + NOT_AGAIN_FOR);
            return None;
        }
        // A claim written across a change of lease names the incarnation
        // that ended: dead, and not held (as `adopt` does for a take).
        if self.lease_changes.load(Ordering::SeqCst) != changes {
            self.claims_settled(c);
            return None;
        }
        c.next_token += 1;
        let token = c.next_token;
        c.held.insert(
            dir.to_vec(),
            Held {
                token,
                last: Instant::now(),
                lease_changes: changes,
            },
        );
        self.claims_settled(c);
        tracing::debug!("cluster: claimed a directory for the files made in it");
        Some(token)
    }

    /// The file `group` was made in `dir` after `before_making` gave
    /// `token`: held from memory, with no take, if that claim still
    /// stands (true); else the file is taken as any other.
    pub fn made(&self, group: &[u8], dir: &[u8], token: u64) -> bool {
        // Under the claims' lock, which letting go takes first: the file
        // is either among those it finds, or not held from the claim.
        let c = self.claims();
        let Some(held) = c.held.get(dir).filter(|h| h.token == token) else {
            return false;
        };
        if self.fenced().is_err() {
            return false;
        }
        let mut g = self.lock();
        // Under the groups' lock, which `forget_all` counts lease changes
        // under: a claim of an incarnation that ended holds nothing.
        if g.contains_key(group) || self.lease_changes.load(Ordering::SeqCst) != held.lease_changes
        {
            return false;
        }
        g.insert(
            group.to_vec(),
            Group::Owned {
                records: BTreeMap::new(),
                empty_since: Some(Instant::now()),
                taken: Instant::now(),
                under: Some(dir.to_vec()),
            },
        );
        drop(g);
        drop(c);
        crate::metrics_names::file_taken();
        self.changed.notify_all();
        true
    }

    /// Lets this node's claim on `dir` go (another node asked, with
    /// `request`; or it is idle): the files held under it that have
    /// records get `own/` records, the others are dropped, then the claim
    /// and the request are deleted. An error leaves the claim standing
    /// and the caller tries again; files already given `own/` records
    /// are held as any owned file.
    pub(super) fn let_go_claim(&self, dir: &[u8], asked: bool) -> Result<bool, StateError> {
        self.fenced()?;
        {
            let mut c = self.claims();
            // Asked for while its write is out: answered once it is held.
            // Being let go by another thread: answered by it.
            if c.unsettled(dir) {
                return Ok(false);
            }
            // Held or not (a leftover of a write whose answer was lost),
            // the claim and the request are deleted.
            c.held.remove(dir);
            c.letting_go.insert(dir.to_vec(), true);
            if asked {
                c.not_before
                    .insert(dir.to_vec(), Instant::now() + NOT_AGAIN_FOR);
            }
        }
        let mut settling = Settling {
            store: self,
            dir,
            writing: false,
            armed: true,
        };
        let handed = self.hand_files_of_claim_over(dir);
        let mut c = self.claims();
        settling.armed = false;
        match &handed {
            Ok(()) => c.letting_go.remove(dir),
            // Tried again by the sweep, or by whoever meets it.
            Err(_) => c.letting_go.insert(dir.to_vec(), false),
        };
        self.claims_settled(c);
        handed.map(|()| true)
    }

    fn hand_files_of_claim_over(&self, dir: &[u8]) -> Result<(), StateError> {
        let me = self.me();
        let with_records: Vec<Vec<u8>> = {
            let mut g = self.lock();
            g.retain(|_, v| {
                !matches!(v, Group::Owned { records, under: Some(d), .. }
                    if d == dir && records.is_empty())
            });
            g.iter()
                .filter_map(|(k, v)| match v {
                    Group::Owned { under: Some(d), .. } if d == dir => Some(k.clone()),
                    _ => None,
                })
                .collect()
        };
        self.changed.notify_all();
        self.own_from_claim(&with_records)?;
        let claim = key_of(CLAIM_PREFIX, dir);
        let request = release_key(&me, &claim);
        self.etcd.txn(
            &[Cmp::Value(&claim, &me)],
            &[Op::Delete(&claim), Op::Delete(&request)],
            &[Op::Delete(&request)],
        )?;
        Ok(())
    }

    /// Whether this node holds `group` under a directory claim.
    pub(super) fn held_under_claim(&self, group: &[u8]) -> bool {
        matches!(
            self.lock().get(group),
            Some(Group::Owned { under: Some(_), .. })
        )
    }

    /// Writes `own/` naming this node for each of `groups`, held under a
    /// claim, which are owned from then on. A record found already naming
    /// this node counts as written (an earlier try whose answer was lost).
    /// An error leaves the rest under the claim, to be tried again.
    pub(super) fn own_from_claim(&self, groups: &[Vec<u8>]) -> Result<(), StateError> {
        let me = self.me();
        for chunk in groups.chunks(MAX_TXNS_PER_REQUEST) {
            let owns: Vec<Vec<u8>> = chunk.iter().map(|g| key_of(OWN_PREFIX, g)).collect();
            type Parts<'k> = ([Cmp<'k>; 1], [Op<'k>; 1], [Op<'k>; 1]);
            let parts: Vec<Parts<'_>> = owns
                .iter()
                .map(|own| ([Cmp::Absent(own)], [Op::Put(own, &me, 0)], [Op::Get(own)]))
                .collect();
            self.fenced()?;
            let answers = self.etcd.txns(&with_reads(&parts))?;
            let mut g = self.lock();
            for (group, answer) in chunk.iter().zip(answers) {
                let t = answer?;
                let owned = t.succeeded
                    || matches!(t.reads.first(), Some(Some(v)) if v.value[..] == me[..]);
                if owned {
                    if let Some(Group::Owned { under, .. }) = g.get_mut(group) {
                        *under = None;
                    }
                } else {
                    // Not reached: nobody takes a file the claim covers.
                    // Held no more, so never decided on two nodes.
                    tracing::error!(
                        "cluster: a file made under a directory claim was owned by another \
                         node; dropped"
                    );
                    g.remove(group);
                }
            }
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Lets go of the claims under which no file was made for `idle`; how
    /// many.
    pub(super) fn let_go_idle_claims(&self, idle: Duration) -> usize {
        // And those whose letting go failed, tried again.
        let idle_dirs: Vec<Vec<u8>> = {
            let c = self.claims();
            c.held
                .iter()
                .filter(|(_, h)| h.last.elapsed() >= idle)
                .map(|(d, _)| d.clone())
                .chain(
                    c.letting_go
                        .iter()
                        .filter(|(_, under_way)| !**under_way)
                        .map(|(d, _)| d.clone()),
                )
                .collect()
        };
        idle_dirs
            .iter()
            .filter(|d| match self.let_go_claim(d, false) {
                Ok(handled) => handled,
                Err(e) => {
                    tracing::warn!("cluster: letting an idle directory claim go: {e}");
                    false
                }
            })
            .count()
    }

    /// A claim found in etcd by this thread's lookup: `holder` claims the
    /// directory since revision `since`. Ok(true): it ended (found dead,
    /// or this node's own left over, and deleted; or let go when asked),
    /// and the caller looks again at once. Ok(false) with `ask` false:
    /// alive, not asked.
    pub(super) fn meet_claim(
        &self,
        holder: &[u8],
        since: u64,
        claim: &[u8],
        ask: bool,
        asked_before: bool,
    ) -> Result<bool, StateError> {
        if holder == &*self.me() {
            let dir = claim.strip_prefix(CLAIM_PREFIX).unwrap_or(claim);
            let mut c = self.claims();
            // Being written or let go by another thread: its outcome
            // decides (held, or gone), then the lookup looks again.
            let deadline = Instant::now() + CLAIM_SETTLES_WITHIN;
            let waited = c.unsettled(dir);
            while c.unsettled(dir) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(StateError::Unavailable(
                        "a directory claim's write did not settle".into(),
                    ));
                }
                c = crate::blocking::off_worker(|| {
                    self.claims_changed
                        .wait_timeout(c, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                });
            }
            // Held: the lookup looks again, comparing it no more
            // (`claim_to_compare`).
            if c.held.contains_key(dir) {
                return Ok(true);
            }
            // Its letting go failed: tried again now.
            if c.letting_go.contains_key(dir) {
                drop(c);
                return self.let_go_claim(dir, false);
            }
            drop(c);
            // Let go, or its write ended, meanwhile: looked up again (a
            // leftover of a write is met again, and deleted then).
            if waited {
                return Ok(true);
            }
            // Written by this node and not held (its answer lost, or the
            // node forgot it with a lease): nothing stands on it.
            let request = release_key(holder, claim);
            let t = self.etcd.txn(
                &[Cmp::Version(claim, Some(since))],
                &[Op::Delete(claim), Op::Delete(&request)],
                &[],
            )?;
            return Ok(t.succeeded);
        }
        if !ask {
            return self.clear_if_dead(holder, since, claim, false);
        }
        self.ask_release(holder, since, claim, asked_before)
    }

    /// Forgets every claim (the lease was lost: they ended with the
    /// incarnation).
    pub(super) fn forget_claims(&self) {
        let mut c = self.claims();
        c.held.clear();
        c.letting_go.retain(|_, under_way| *under_way);
        c.counted.clear();
        // A write still out finds the lease change counted and does not
        // hold what it wrote (`before_making`); a letting go under way
        // ends (its etcd writes fail, fenced).
        self.claims_settled(c);
    }
}
