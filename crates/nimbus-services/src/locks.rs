//! The server's byte-range locks. Each file's granted locks are a record
//! in the server's `StateStore` (`nimbus_state::records::LockList`),
//! changed only by `nimbus_state::byte_range`'s rules through
//! compare-and-set, so that a cluster store can later hold them for every
//! node. The blocking requests waiting for a range are this node's own
//! (they are its clients' pending requests): kept here, retried when the
//! file's locks shrink, and completed with their pending requests.
//!
//! A lock per file orders this node's steps on that file, so that a
//! waiter queued after a conflict cannot miss the unlock that frees its
//! range, while requests on other files go on beside it (one client's
//! costly LOCK must not hold up everyone else's). The map from file to
//! its entry is locked only to find, add or drop an entry, in shards.
//! Files with no lock are known locally, so READ and WRITE on them (every
//! data request checks) cost no look-up in the store and no wait for the
//! file's lock.
//!
//! How many locks an open and a file may hold is capped (`LockCaps`, from
//! `[limits]`): a request past a cap is refused whole with
//! STATUS_INSUFFICIENT_RESOURCES, as Windows does when the kernel pool
//! its locks take is exhausted.
//!
//! On a cluster node the records of a file several nodes use are decided
//! on etcd (`ClusterStore`): what this node remembers is then no proof
//! that a file has no lock, so READ and WRITE of such a file read the
//! record; another node's unlock reaches this node's waiters through
//! `retry` (a watch on the lock records calls it), and locks of a node
//! that is gone are dropped when they stand in the way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use nimbus_state::byte_range::{self, Cap, LockCaps, LockError, LockRange, RangeLock};
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

/// What this node keeps about one file's locks, under the file's lock.
#[derive(Default)]
struct FileState {
    /// In arrival order; the first that fits is granted first.
    waiting: Vec<Waiter>,
    /// Dropped from the map (no lock, no waiter): whoever finds this entry
    /// still looks the file up again.
    retired: bool,
}

#[derive(Default)]
struct FileEntry {
    /// Whether the file's record may hold a lock: set before a change that
    /// may add one and cleared once the record is seen empty, so that
    /// READ and WRITE, which read it without the file's lock, never take a
    /// locked file for an unlocked one.
    locked: AtomicBool,
    state: Mutex<FileState>,
}

/// Shards of the file map: a look-up locks one.
const SHARDS: usize = 64;

type Shard = RwLock<HashMap<FileKey, Arc<FileEntry>>>;

pub struct ByteRangeLocks {
    store: Arc<dyn StateStore>,
    /// On a cluster node: whether a lock's holder is an open of a node
    /// that is gone (its lock is stale: nobody will unlock it).
    gone: Option<Gone>,
    caps: std::sync::Mutex<LockCaps>,
    /// Files with locks or waiters (and, briefly, files being changed).
    files: Box<[Shard]>,
    /// How many entries are marked `locked`.
    locked_files: AtomicUsize,
    /// Closed opens whose locks the store did not let go of (etcd did not
    /// answer): released again by `retry_releases`, since no other node
    /// drops a live node's entries.
    unreleased: std::sync::Mutex<std::collections::HashSet<(FileKey, u64)>>,
    /// Told when a request starts waiting (a cluster node's watch of the
    /// lock records runs only while requests wait).
    on_wait: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

fn refusal(e: LockError) -> NtStatus {
    match e {
        LockError::InvalidRange => NtStatus::INVALID_LOCK_RANGE,
        LockError::Conflict => NtStatus::LOCK_NOT_GRANTED,
        LockError::TooMany(_) => NtStatus::INSUFFICIENT_RESOURCES,
    }
}

/// The `[limits]` key behind a cap.
fn cap_key(cap: Cap) -> &'static str {
    match cap {
        Cap::PerOpen => "limits.max_byte_range_locks_per_open",
        Cap::PerFile => "limits.max_byte_range_locks_per_file",
    }
}

fn log_cap(file: FileKey, owner: u64, e: LockError) {
    if let LockError::TooMany(cap) = e {
        tracing::warn!(
            "byte-range lock of open {owner:#x} on {file:?} refused: too many locks ({})",
            cap_key(cap)
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// The shard of a file: inode numbers spread it, device numbers rarely
/// differ.
fn shard_of(file: FileKey) -> usize {
    let h = (file.ino ^ file.dev.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (h >> 58) as usize % SHARDS
}

/// What a change of a file's locks did to its waiters, to act on once the
/// file's lock is released.
#[derive(Default)]
struct Decided {
    granted: Vec<Granted>,
    refused: Vec<(Arc<PendingRequest>, NtStatus)>,
}

impl Decided {
    fn answer(self) {
        for (r, status) in self.refused {
            r.complete(status, |_| {});
        }
        answer(self.granted);
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
            caps: std::sync::Mutex::new(LockCaps::NONE),
            files: (0..SHARDS).map(|_| Shard::default()).collect(),
            locked_files: AtomicUsize::new(0),
            unreleased: Default::default(),
            on_wait: std::sync::OnceLock::new(),
        }
    }

    /// What to tell when a request starts waiting (set once).
    pub fn on_wait(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_wait.set(f);
    }

    /// The same, with caps on the locks of one open and of one file.
    pub fn with_caps(self, caps: LockCaps) -> ByteRangeLocks {
        self.set_caps(caps);
        self
    }

    /// A reloaded configuration's caps, for the next LOCKs: locks held
    /// above them stay.
    pub fn set_caps(&self, caps: LockCaps) {
        *self.caps.lock().unwrap_or_else(|e| e.into_inner()) = caps;
    }

    fn caps(&self) -> LockCaps {
        *self.caps.lock().unwrap_or_else(|e| e.into_inner())
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

    /// The file's entry, if it has one; with `add`, one is made if not.
    fn entry(&self, file: FileKey, add: bool) -> Option<Arc<FileEntry>> {
        let shard = &self.files[shard_of(file)];
        if let Some(e) = read(shard).get(&file) {
            return Some(e.clone());
        }
        if !add {
            return None;
        }
        Some(write(shard).entry(file).or_default().clone())
    }

    /// Whether the file may have locks, as this node knows without the
    /// store.
    fn marked_locked(&self, file: FileKey) -> bool {
        self.entry(file, false)
            .is_some_and(|e| e.locked.load(Ordering::Acquire))
    }

    fn mark_locked(&self, entry: &FileEntry, locked: bool) {
        if entry.locked.swap(locked, Ordering::AcqRel) != locked {
            if locked {
                self.locked_files.fetch_add(1, Ordering::Relaxed);
            } else {
                self.locked_files.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs `f` under the file's lock (None: the file has no entry and
    /// `add` is false). The map's shard is locked only to find the entry
    /// and, afterwards, to drop it if the file has neither locks nor
    /// waiters; the file's lock is never waited for with a shard locked.
    fn with_file<T>(
        &self,
        file: FileKey,
        add: bool,
        f: impl FnOnce(&FileEntry, &mut FileState) -> T,
    ) -> Option<T> {
        loop {
            let entry = self.entry(file, add)?;
            let mut state = lock(&entry.state);
            if state.retired {
                continue;
            }
            let out = f(&entry, &mut state);
            if state.waiting.is_empty() && !entry.locked.load(Ordering::Acquire) {
                let mut shard = write(&self.files[shard_of(file)]);
                if shard.get(&file).is_some_and(|e| Arc::ptr_eq(e, &entry)) {
                    shard.remove(&file);
                }
                state.retired = true;
            }
            return Some(out);
        }
    }

    /// Applies `f` to `file`'s locks in the store, then retries the file's
    /// waiters on the new list (in the same commit: granted, or refused at
    /// a cap, or left waiting) and notes whether the file still has locks.
    /// Returns `f`'s answer and what became of waiters, to answer once the
    /// file's lock is released.
    fn change<T>(
        &self,
        entry: &FileEntry,
        state: &mut FileState,
        file: FileKey,
        mut f: impl FnMut(&mut Vec<RangeLock>) -> T,
    ) -> Result<(T, Decided), StateError> {
        let asks: Vec<(u64, &[LockRange])> = state
            .waiting
            .iter()
            .map(|w| (w.owner, w.ranges.as_slice()))
            .collect();
        // Marked before the record may gain a lock (see `FileEntry`); a
        // store that fails leaves it marked, which only costs READ and
        // WRITE a look at the record.
        self.mark_locked(entry, true);
        let (out, decided, has_locks) = records::update::<LockList, _, StateError>(
            &*self.store,
            &file.record_key(LOCKS_PREFIX),
            |list| {
                let out = f(&mut list.0);
                let decided = self.grant_waiters(&mut list.0, &asks);
                Ok((out, decided, !list.0.is_empty()))
            },
        )?;
        self.mark_locked(entry, has_locks);
        let mut done = Decided::default();
        // Indices in ascending order: take from the back.
        for (i, result) in decided.into_iter().rev() {
            if i >= state.waiting.len() {
                continue;
            }
            let w = state.waiting.remove(i);
            match result {
                Ok(()) => done.granted.push((w.request, w.on_grant)),
                Err(e) => {
                    log_cap(file, w.owner, e);
                    done.refused.push((w.request, refusal(e)));
                }
            }
        }
        done.granted.reverse();
        done.refused.reverse();
        Ok((out, done))
    }

    /// Retries `asks` (waiters in arrival order) on `list`; where some
    /// are left waiting, the locks of gone nodes go and those left get
    /// another chance. Returns the waiters decided, ascending.
    fn grant_waiters(
        &self,
        list: &mut Vec<RangeLock>,
        asks: &[(u64, &[LockRange])],
    ) -> Vec<(usize, Result<(), LockError>)> {
        let mut decided = byte_range::grant_waiters(list, asks, self.caps());
        if decided.len() < asks.len() && self.purge_gone(list) {
            let mut done = vec![false; asks.len()];
            for (i, _) in &decided {
                if let Some(d) = done.get_mut(*i) {
                    *d = true;
                }
            }
            let left: Vec<usize> = (0..asks.len()).filter(|i| !done[*i]).collect();
            let again: Vec<(u64, &[LockRange])> = left.iter().map(|&i| asks[i]).collect();
            let more = byte_range::grant_waiters(list, &again, self.caps());
            decided.extend(more.into_iter().map(|(j, r)| (left[j], r)));
            decided.sort_by_key(|(i, _)| *i);
        }
        decided
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
        let caps = self.caps();
        let done = self.with_file(file, true, |entry, state| {
            let tried = self.change(entry, state, file, |list| {
                let mut tried = byte_range::grant(list, owner, &ranges, caps);
                // Locks of gone nodes count for nothing.
                if matches!(tried, Err(LockError::Conflict | LockError::TooMany(_)))
                    && self.purge_gone(list)
                {
                    tried = byte_range::grant(list, owner, &ranges, caps);
                }
                tried
            });
            let (tried, done) = match tried {
                Err(e) => return (Outcome::Refused(store_failed(file, e)), None),
                Ok(t) => t,
            };
            let outcome = match tried {
                Ok(()) => Outcome::Granted,
                Err(LockError::Conflict) if wait.is_some() => match wait.and_then(|w| w()) {
                    Some((request, on_grant)) => {
                        state.waiting.push(Waiter {
                            owner,
                            ranges,
                            request,
                            on_grant,
                        });
                        crate::metrics::lock_waited();
                        if let Some(f) = self.on_wait.get() {
                            f();
                        }
                        Outcome::Waiting
                    }
                    None => Outcome::Refused(NtStatus::INSUFFICIENT_RESOURCES),
                },
                Err(e) => {
                    log_cap(file, owner, e);
                    Outcome::Refused(refusal(e))
                }
            };
            (outcome, Some(done))
        });
        match done {
            Some((outcome, done)) => {
                // Waiters this change decided (a gone node's locks dropped,
                // or a cap now passed) hear of it too.
                if let Some(done) = done {
                    done.answer();
                }
                outcome
            }
            None => Outcome::Refused(NtStatus::INSUFFICIENT_RESOURCES),
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
        // The plain unlocks before the first element that is not one.
        let bad = elements.iter().position(|e| e.flags != lock_flags::UNLOCK);
        let ranges: Vec<(u64, u64)> = elements[..bad.unwrap_or(elements.len())]
            .iter()
            .map(|e| (e.offset, e.length))
            .collect();
        let (result, done) = self
            .with_file(file, true, |entry, state| {
                self.change(entry, state, file, |list| {
                    if byte_range::unlock_each(list, owner, &ranges).is_err() {
                        return Err(NtStatus::RANGE_NOT_LOCKED);
                    }
                    match bad {
                        Some(_) => Err(NtStatus::INVALID_PARAMETER),
                        None => Ok(()),
                    }
                })
            })
            .unwrap_or_else(|| Err(StateError::Unavailable("no entry".into())))
            .map_err(|e| store_failed(file, e))?;
        done.answer();
        result
    }

    /// An open closed: its locks go, its waiting requests end with
    /// STATUS_RANGE_NOT_LOCKED, and other waiters get their chance.
    pub fn release_open(&self, file: FileKey, owner: u64) {
        let Some((ended, done)) = self.with_file(file, false, |entry, state| {
            let had = entry.locked.load(Ordering::Acquire) || !state.waiting.is_empty();
            let mut ended = Vec::new();
            state.waiting.retain(|w| {
                if w.owner == owner {
                    ended.push(w.request.clone());
                    false
                } else {
                    true
                }
            });
            if !had {
                return (ended, Decided::default());
            }
            match self.change(entry, state, file, |list| {
                byte_range::release(list, owner);
            }) {
                Ok(((), done)) => (ended, done),
                Err(e) => {
                    store_failed(file, e);
                    lock(&self.unreleased).insert((file, owner));
                    (ended, Decided::default())
                }
            }
        }) else {
            return;
        };
        for r in ended {
            r.complete(NtStatus::RANGE_NOT_LOCKED, |_| {});
        }
        done.answer();
    }

    /// Releases again the locks of closed opens the store failed to let
    /// go of (each tried once; those that fail again wait for the next
    /// call). How many were tried.
    pub fn retry_releases(&self) -> usize {
        let pending = std::mem::take(&mut *lock(&self.unreleased));
        for &(file, owner) in &pending {
            self.release_open(file, owner);
        }
        pending.len()
    }

    /// Takes a waiting request out of its queue (CANCEL, logoff,
    /// disconnect); whether it was still waiting.
    pub fn withdraw(&self, file: FileKey, async_id: u64) -> bool {
        self.with_file(file, false, |_, state| {
            let before = state.waiting.len();
            state.waiting.retain(|w| w.request.async_id() != async_id);
            state.waiting.len() != before
        })
        .unwrap_or(false)
    }

    /// The file's locks may have changed elsewhere (another cluster node):
    /// its waiting requests whose ranges are free now are granted.
    pub fn retry(&self, file: FileKey) {
        let done = self.with_file(file, false, |entry, state| {
            if state.waiting.is_empty() {
                return None;
            }
            match self.change(entry, state, file, |_| ()) {
                Ok(((), done)) => Some(done),
                Err(e) => {
                    store_failed(file, e);
                    None
                }
            }
        });
        if let Some(Some(done)) = done {
            done.answer();
        }
    }

    /// How many files this node knows to hold byte-range locks.
    pub fn locked_files(&self) -> usize {
        self.locked_files.load(Ordering::Relaxed)
    }

    /// The files with waiting requests.
    pub fn waiting_files(&self) -> Vec<FileKey> {
        // Entries are gathered first: no file's lock is taken with a
        // shard locked.
        let entries: Vec<(FileKey, Arc<FileEntry>)> = self
            .files
            .iter()
            .flat_map(|shard| {
                read(shard)
                    .iter()
                    .map(|(k, e)| (*k, e.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        entries
            .into_iter()
            .filter(|(_, e)| !lock(&e.state).waiting.is_empty())
            .map(|(k, _)| k)
            .collect()
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
        self.with_file(file, true, |entry, _| self.mark_locked(entry, true));
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
            return self.marked_locked(file);
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
        if !self.marked_locked(file) && !self.shared(file) {
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

fn answer(granted: Vec<Granted>) {
    for (r, on_grant) in granted {
        on_grant();
        r.complete(NtStatus::SUCCESS, nimbus_wire::lock::encode_lock_response);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use nimbus_state::conformance::SharedMemory;

    use super::*;

    fn unlock_of(offset: u64, length: u64) -> LockElement {
        LockElement {
            offset,
            length,
            flags: lock_flags::UNLOCK,
        }
    }

    fn range(offset: u64, length: u64, exclusive: bool) -> Vec<LockRange> {
        vec![LockRange {
            offset,
            length,
            exclusive,
        }]
    }

    #[test]
    fn a_slow_change_of_one_files_locks_holds_up_no_other_files_locks() {
        // A LOCK whose write is slow (a costly request, or an etcd round
        // trip) holds its own file's lock only: another file's lock and
        // unlock go through meanwhile (they waited for one server-wide
        // lock).
        let store = Arc::new(SharedMemory::default());
        let locks = Arc::new(ByteRangeLocks::new(store.clone()));
        let (slow, other) = (FileKey::new(1, 1, 1), FileKey::new(1, 2, 1));
        store.close_gate_on(&slow.record_key(LOCKS_PREFIX));
        let locking = {
            let l = locks.clone();
            std::thread::spawn(move || l.lock(slow, 1, range(0, 10, true), None).granted())
        };
        store.wait_held(1);
        let (done, got) = mpsc::channel();
        {
            let l = locks.clone();
            std::thread::spawn(move || {
                let locked = l.lock(other, 2, range(0, 10, true), None).granted();
                let io = l.io_conflicts(other, 3, 0, 1, false);
                let unlocked = l.unlock(other, 2, &[unlock_of(0, 10)]);
                let _ = done.send((locked, io, unlocked));
            });
        }
        let other_file = got.recv_timeout(Duration::from_secs(10));
        // Opened before anything is asserted, so that a failure here holds
        // nothing up.
        store.open_gate();
        assert_eq!(other_file, Ok((Ok(()), true, Ok(()))));
        assert_eq!(locking.join().unwrap(), Ok(()));
        assert!(locks.io_conflicts(slow, 3, 5, 1, true));
        assert_eq!(locks.locked_files(), 1);
        assert_eq!(locks.unlock(slow, 1, &[unlock_of(0, 10)]), Ok(()));
        assert_eq!(locks.locked_files(), 0);
        assert!(!locks.has_locks(slow) && !locks.has_locks(other));
        assert!(locks.files.iter().all(|s| read(s).is_empty()));
    }

    #[test]
    fn caps_refuse_a_request_whole_and_unlocks_stop_at_the_first_not_held() {
        let locks =
            ByteRangeLocks::new(Arc::new(nimbus_state::MemoryStore::new())).with_caps(LockCaps {
                per_open: 3,
                per_file: 4,
            });
        let f = FileKey::new(1, 1, 1);
        let shared = |n| {
            vec![
                LockRange {
                    offset: 0,
                    length: 1,
                    exclusive: false,
                };
                n
            ]
        };
        assert_eq!(locks.lock(f, 1, shared(2), None).granted(), Ok(()));
        assert_eq!(
            locks.lock(f, 1, shared(2), None).granted(),
            Err(NtStatus::INSUFFICIENT_RESOURCES)
        );
        assert_eq!(locks.lock(f, 2, shared(2), None).granted(), Ok(()));
        assert_eq!(
            locks.lock(f, 1, shared(1), None).granted(),
            Err(NtStatus::INSUFFICIENT_RESOURCES)
        );
        assert_eq!(locks.held_by(f, 1).len(), 2);
        // The first unlock goes, the second is not held, the third is not
        // reached.
        assert_eq!(
            locks.unlock(f, 2, &[unlock_of(0, 1), unlock_of(7, 1), unlock_of(0, 1)]),
            Err(NtStatus::RANGE_NOT_LOCKED)
        );
        assert_eq!(locks.held_by(f, 2).len(), 1);
        let mut bad = unlock_of(0, 1);
        bad.flags |= lock_flags::FAIL_IMMEDIATELY;
        assert_eq!(
            locks.unlock(f, 2, &[unlock_of(0, 1), bad]),
            Err(NtStatus::INVALID_PARAMETER)
        );
        assert!(locks.held_by(f, 2).is_empty());
        locks.release_open(f, 1);
        assert!(!locks.has_locks(f));
    }
}
