//! The server's byte-range locks. Each file's granted locks are a record
//! in the server's `StateStore` (`nimbus_state::records::LockList`),
//! changed only by `nimbus_state::byte_range`'s rules through
//! compare-and-set, so that a cluster store can later hold them for every
//! node. The blocking requests waiting for a range are this node's own
//! (they are its clients' pending requests): kept here, retried when the
//! file's locks shrink, and completed with their pending requests.
//!
//! A node-local lock orders this node's steps, so that a waiter queued
//! after a conflict cannot miss the unlock that frees its range; files
//! with no lock are known locally, so READ and WRITE on them (every data
//! request checks) cost no look-up in the store.
//!
//! On a cluster node the records of a file several nodes use are decided
//! on etcd (`ClusterStore`): what this node remembers is then no proof
//! that a file has no lock, so READ and WRITE of such a file read the
//! record; another node's unlock reaches this node's waiters through
//! `retry` (a watch on the lock records calls it), and locks of a node
//! that is gone are dropped when they stand in the way.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use nimbus_state::byte_range::{self, LockError, LockRange, RangeLock};
use nimbus_state::records::{self, LockList, LOCKS_PREFIX};
use nimbus_state::share_modes::Gone;
use nimbus_state::{FileKey, StateError, StateStore};
use nimbus_wire::lock::{lock_flags, LockElement};
use nimbus_wire::NtStatus;

use crate::pending::PendingRequest;

/// Run when a waiting request is granted, before it is answered (what the
/// LOCK handler does after a lock granted at once: the lock sequence, a
/// persistent open's record).
pub type OnGrant = Box<dyn FnOnce() + Send + Sync>;

/// A blocking LOCK request waiting for its ranges.
struct Waiter {
    owner: u64,
    ranges: Vec<LockRange>,
    request: Arc<PendingRequest>,
    on_grant: OnGrant,
}

/// A waiter granted, to be answered once the local lock is released.
type Granted = (Arc<PendingRequest>, OnGrant);

/// What a lock request came to.
pub enum Outcome {
    Granted,
    Refused(NtStatus),
    /// Queued: `complete` will answer the pending request.
    Waiting,
}

impl Outcome {
    /// Ok when granted; the refusal otherwise (a request that could wait
    /// was not asked to).
    pub fn granted(self) -> Result<(), NtStatus> {
        match self {
            Outcome::Granted => Ok(()),
            Outcome::Refused(s) => Err(s),
            Outcome::Waiting => Err(NtStatus::LOCK_NOT_GRANTED),
        }
    }
}

#[derive(Default)]
struct Local {
    /// Files whose record holds at least one lock.
    locked: HashSet<FileKey>,
    /// Per file, in arrival order; the first that fits is granted first.
    waiting: HashMap<FileKey, Vec<Waiter>>,
}

pub struct ByteRangeLocks {
    store: Arc<dyn StateStore>,
    /// On a cluster node: whether a lock's holder is an open of a node
    /// that is gone (its lock is stale: nobody will unlock it).
    gone: Option<Gone>,
    local: RwLock<Local>,
}

fn refusal(e: LockError) -> NtStatus {
    match e {
        LockError::InvalidRange => NtStatus::INVALID_LOCK_RANGE,
        LockError::Conflict => NtStatus::LOCK_NOT_GRANTED,
    }
}

/// A store that fails leaves the locks as they were; the client is told
/// the server could not do it.
fn store_failed(file: FileKey, e: StateError) -> NtStatus {
    tracing::error!("byte-range locks of {file:?}: {e}");
    NtStatus::INSUFFICIENT_RESOURCES
}

impl ByteRangeLocks {
    pub fn new(store: Arc<dyn StateStore>) -> ByteRangeLocks {
        ByteRangeLocks {
            store,
            gone: None,
            local: RwLock::new(Local::default()),
        }
    }

    /// The locks of a cluster node: a lock of a node that is gone gives
    /// way to a request it stands in the way of.
    pub fn with_liveness(store: Arc<dyn StateStore>, gone: Gone) -> ByteRangeLocks {
        ByteRangeLocks {
            gone: Some(gone),
            ..ByteRangeLocks::new(store)
        }
    }

    /// Drops the locks of gone nodes' opens; whether any went.
    fn purge_gone(&self, list: &mut Vec<RangeLock>) -> bool {
        let Some(gone) = &self.gone else {
            return false;
        };
        let before = list.len();
        list.retain(|l| !gone(l.owner));
        list.len() != before
    }

    fn write(&self) -> RwLockWriteGuard<'_, Local> {
        self.local.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, Local> {
        self.local.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `f` to `file`'s locks in the store, then grants the file's
    /// waiters whose ranges are free in the new list (in the same commit)
    /// and notes whether the file still has locks. Returns `f`'s answer and
    /// the requests granted, to answer once the local lock is released.
    fn change<T>(
        &self,
        local: &mut Local,
        file: FileKey,
        mut f: impl FnMut(&mut Vec<RangeLock>) -> T,
    ) -> Result<(T, Vec<Granted>), StateError> {
        let asks: Vec<(u64, &[LockRange])> = local
            .waiting
            .get(&file)
            .map(|w| w.iter().map(|w| (w.owner, w.ranges.as_slice())).collect())
            .unwrap_or_default();
        let (out, granted, has_locks) = records::update::<LockList, _, StateError>(
            &*self.store,
            &file.record_key(LOCKS_PREFIX),
            |list| {
                let out = f(&mut list.0);
                let mut granted = grant_waiters(&mut list.0, &asks);
                if granted.len() < asks.len() && self.purge_gone(&mut list.0) {
                    granted = grant_waiters(&mut list.0, &asks);
                }
                Ok((out, granted, !list.0.is_empty()))
            },
        )?;
        if has_locks {
            local.locked.insert(file);
        } else {
            local.locked.remove(&file);
        }
        let mut done = Vec::new();
        if let Some(queue) = local.waiting.get_mut(&file) {
            // Indices in ascending order: take from the back.
            for i in granted.into_iter().rev() {
                let w = queue.remove(i);
                done.push((w.request, w.on_grant));
            }
            done.reverse();
            if queue.is_empty() {
                local.waiting.remove(&file);
            }
        }
        Ok((out, done))
    }

    /// Grants `ranges` to open `owner` now, or refuses, or (when `wait` is
    /// given) queues the request until they can be granted: `wait` makes
    /// it pending and says what to do when it is granted.
    pub fn lock(
        &self,
        file: FileKey,
        owner: u64,
        ranges: Vec<LockRange>,
        wait: Option<&mut dyn FnMut() -> Option<Granted>>,
    ) -> Outcome {
        let mut local = self.write();
        let tried = self.change(&mut local, file, |list| {
            let mut tried = byte_range::try_lock(list, owner, &ranges);
            if tried == Err(LockError::Conflict) && self.purge_gone(list) {
                tried = byte_range::try_lock(list, owner, &ranges);
            }
            tried.map(|granted| *list = granted)
        });
        match tried {
            Err(e) => Outcome::Refused(store_failed(file, e)),
            Ok((Ok(()), _)) => Outcome::Granted,
            Ok((Err(LockError::Conflict), _)) if wait.is_some() => match wait.and_then(|w| w()) {
                Some((request, on_grant)) => {
                    local.waiting.entry(file).or_default().push(Waiter {
                        owner,
                        ranges,
                        request,
                        on_grant,
                    });
                    Outcome::Waiting
                }
                None => Outcome::Refused(NtStatus::INSUFFICIENT_RESOURCES),
            },
            Ok((Err(e), _)) => Outcome::Refused(refusal(e)),
        }
    }

    /// Unlocks `elements` in order (each must be a plain UNLOCK of a range
    /// `owner` holds with exactly that offset and length); stops at the
    /// first that is not (STATUS_INVALID_PARAMETER) or not held
    /// (STATUS_RANGE_NOT_LOCKED), keeping what went before. Waiters are
    /// retried either way.
    pub fn unlock(
        &self,
        file: FileKey,
        owner: u64,
        elements: &[LockElement],
    ) -> Result<(), NtStatus> {
        let mut local = self.write();
        let (result, done) = self
            .change(&mut local, file, |list| {
                for e in elements {
                    if e.flags != lock_flags::UNLOCK {
                        return Err(NtStatus::INVALID_PARAMETER);
                    }
                    if byte_range::unlock(list, owner, e.offset, e.length).is_err() {
                        return Err(NtStatus::RANGE_NOT_LOCKED);
                    }
                }
                Ok(())
            })
            .map_err(|e| store_failed(file, e))?;
        drop(local);
        answer(done);
        result
    }

    /// An open closed: its locks go, its waiting requests end with
    /// STATUS_RANGE_NOT_LOCKED, and other waiters get their chance.
    pub fn release_open(&self, file: FileKey, owner: u64) {
        let mut local = self.write();
        let mut ended = Vec::new();
        if let Some(queue) = local.waiting.get_mut(&file) {
            queue.retain(|w| {
                if w.owner == owner {
                    ended.push(w.request.clone());
                    false
                } else {
                    true
                }
            });
        }
        let done = if local.locked.contains(&file) || local.waiting.contains_key(&file) {
            match self.change(&mut local, file, |list| {
                byte_range::release(list, owner);
            }) {
                Ok(((), done)) => done,
                Err(e) => {
                    store_failed(file, e);
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        if local.waiting.get(&file).is_some_and(|q| q.is_empty()) {
            local.waiting.remove(&file);
        }
        drop(local);
        for r in ended {
            r.complete(NtStatus::RANGE_NOT_LOCKED, |_| {});
        }
        answer(done);
    }

    /// Takes a waiting request out of its queue (CANCEL, logoff,
    /// disconnect); whether it was still waiting.
    pub fn withdraw(&self, file: FileKey, async_id: u64) -> bool {
        let mut local = self.write();
        let Some(queue) = local.waiting.get_mut(&file) else {
            return false;
        };
        let before = queue.len();
        queue.retain(|w| w.request.async_id() != async_id);
        let found = queue.len() != before;
        if queue.is_empty() {
            local.waiting.remove(&file);
        }
        found
    }

    /// The file's locks may have changed elsewhere (another cluster node):
    /// its waiting requests whose ranges are free now are granted.
    pub fn retry(&self, file: FileKey) {
        let mut local = self.write();
        if !local.waiting.contains_key(&file) {
            return;
        }
        match self.change(&mut local, file, |_| ()) {
            Ok(((), done)) => {
                drop(local);
                answer(done);
            }
            Err(e) => {
                store_failed(file, e);
            }
        }
    }

    /// How many files this node knows to hold byte-range locks.
    pub fn locked_files(&self) -> usize {
        self.read().locked.len()
    }

    /// The files with waiting requests.
    pub fn waiting_files(&self) -> Vec<FileKey> {
        self.read().waiting.keys().copied().collect()
    }

    /// The ranges `owner` holds on `file` (a persistent open's record
    /// keeps them).
    pub fn held_by(&self, file: FileKey, owner: u64) -> Vec<LockRange> {
        match records::read::<LockList>(&*self.store, &file.record_key(LOCKS_PREFIX)) {
            Ok(list) => list
                .0
                .iter()
                .filter(|l| l.owner == owner)
                .map(|l| LockRange {
                    offset: l.offset,
                    length: l.length,
                    exclusive: l.exclusive,
                })
                .collect(),
            Err(e) => {
                store_failed(file, e);
                Vec::new()
            }
        }
    }

    /// An open with locks in `file`'s record came to this node (taken over
    /// from another): its close here must release them, as if they had
    /// been taken here.
    pub fn came_with_locks(&self, file: FileKey) {
        self.write().locked.insert(file);
    }

    /// Whether other cluster nodes may change `file`'s locks, so that this
    /// node's memory of which files are locked does not settle it. Never on
    /// a single node: READ and WRITE then ask nothing of the store.
    fn shared(&self, file: FileKey) -> bool {
        self.gone.is_some() && !self.store.is_local(&file.record_key(LOCKS_PREFIX))
    }

    /// Whether the file has any byte-range lock (no read or handle caching
    /// is granted on such a file).
    pub fn has_locks(&self, file: FileKey) -> bool {
        // Where other nodes may change the record (or an open that locked
        // here moved to another node), only the record says.
        if !self.shared(file) {
            return self.read().locked.contains(&file);
        }
        let key = file.record_key(LOCKS_PREFIX);
        match records::read::<LockList>(&*self.store, &key) {
            Ok(list) => !list.0.is_empty(),
            Err(e) => {
                store_failed(file, e);
                true
            }
        }
    }

    /// Whether a READ or WRITE by `owner` runs into another lock. A store
    /// that cannot answer counts as a conflict: data is not moved past a
    /// lock nobody could check.
    pub fn io_conflicts(
        &self,
        file: FileKey,
        owner: u64,
        offset: u64,
        length: u64,
        write: bool,
    ) -> bool {
        if !self.read().locked.contains(&file) && !self.shared(file) {
            return false;
        }
        let key = file.record_key(LOCKS_PREFIX);
        match records::read::<LockList>(&*self.store, &key) {
            Ok(list) => byte_range::io_conflicts(&list.0, owner, offset, length, write),
            Err(e) => {
                store_failed(file, e);
                true
            }
        }
    }
}

/// Grants every waiter (owner, ranges) whose ranges are free in `locks`,
/// in arrival order, adding their locks; returns their indices, ascending.
fn grant_waiters(locks: &mut Vec<RangeLock>, asks: &[(u64, &[LockRange])]) -> Vec<usize> {
    let mut granted = Vec::new();
    for (i, (owner, ranges)) in asks.iter().enumerate() {
        if let Ok(new) = byte_range::try_lock(locks, *owner, ranges) {
            *locks = new;
            granted.push(i);
        }
    }
    granted
}

fn answer(granted: Vec<Granted>) {
    for (r, on_grant) in granted {
        on_grant();
        r.complete(NtStatus::SUCCESS, nimbus_wire::lock::encode_lock_response);
    }
}
