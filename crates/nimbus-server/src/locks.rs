//! The server's byte-range locks: per file (device, inode), the granted
//! locks and the blocking requests waiting for a range to come free. The
//! rules are `nimbus_state::byte_range`'s pure functions; this service only
//! keeps each file's list, retries waiters when a file's locks shrink, and
//! completes their pending requests. One mutex over the table: a lock or
//! unlock is a few comparisons, and files without locks hold no entry.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use nimbus_state::byte_range::{self, LockError, LockRange, RangeLock};
use nimbus_state::FileKey;
use nimbus_wire::lock::{lock_flags, LockElement};
use nimbus_wire::NtStatus;

use crate::pending::PendingRequest;

/// A blocking LOCK request waiting for its ranges.
struct Waiter {
    owner: u64,
    ranges: Vec<LockRange>,
    request: Arc<PendingRequest>,
}

#[derive(Default)]
struct FileLocks {
    granted: Vec<RangeLock>,
    /// In arrival order; the first that fits is granted first.
    waiting: Vec<Waiter>,
}

/// What a lock request came to.
pub enum Outcome {
    Granted,
    Refused(NtStatus),
    /// Queued: `complete` will answer the pending request.
    Waiting,
}

/// Files that hold no lock and have no waiter hold no entry. READ and
/// WRITE only read the table (every data request checks it), so they do
/// not wait on each other.
#[derive(Default)]
pub struct ByteRangeLocks {
    files: RwLock<HashMap<FileKey, FileLocks>>,
}

fn refusal(e: LockError) -> NtStatus {
    match e {
        LockError::InvalidRange => NtStatus::INVALID_LOCK_RANGE,
        LockError::Conflict => NtStatus::LOCK_NOT_GRANTED,
    }
}

impl ByteRangeLocks {
    fn write(&self) -> RwLockWriteGuard<'_, HashMap<FileKey, FileLocks>> {
        self.files.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<FileKey, FileLocks>> {
        self.files.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Grants `ranges` to open `owner` now, or refuses, or (when `wait` is
    /// given) queues the request until they can be granted.
    pub fn lock(
        &self,
        file: FileKey,
        owner: u64,
        ranges: Vec<LockRange>,
        wait: Option<&mut dyn FnMut() -> Option<Arc<PendingRequest>>>,
    ) -> Outcome {
        let mut files = self.write();
        let entry = files.entry(file).or_default();
        match byte_range::try_lock(&entry.granted, owner, &ranges) {
            Ok(granted) => {
                entry.granted = granted;
                Outcome::Granted
            }
            Err(LockError::Conflict) if wait.is_some() => {
                let request = wait.and_then(|w| w());
                match request {
                    Some(request) => {
                        entry.waiting.push(Waiter {
                            owner,
                            ranges,
                            request,
                        });
                        Outcome::Waiting
                    }
                    None => Outcome::Refused(NtStatus::INSUFFICIENT_RESOURCES),
                }
            }
            Err(e) => {
                if entry.granted.is_empty() && entry.waiting.is_empty() {
                    files.remove(&file);
                }
                Outcome::Refused(refusal(e))
            }
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
        let mut files = self.write();
        let entry = files.entry(file).or_default();
        let mut result = Ok(());
        for e in elements {
            if e.flags != lock_flags::UNLOCK {
                result = Err(NtStatus::INVALID_PARAMETER);
                break;
            }
            if byte_range::unlock(&mut entry.granted, owner, e.offset, e.length).is_err() {
                result = Err(NtStatus::RANGE_NOT_LOCKED);
                break;
            }
        }
        let done = grant_waiters(entry);
        if entry.granted.is_empty() && entry.waiting.is_empty() {
            files.remove(&file);
        }
        drop(files);
        answer(done);
        result
    }

    /// An open closed: its locks go, its waiting requests end with
    /// `status`, and other waiters get their chance.
    pub fn release_open(&self, file: FileKey, owner: u64) {
        let mut files = self.write();
        let Some(entry) = files.get_mut(&file) else {
            return;
        };
        byte_range::release(&mut entry.granted, owner);
        let mut ended = Vec::new();
        entry.waiting.retain(|w| {
            if w.owner == owner {
                ended.push(w.request.clone());
                false
            } else {
                true
            }
        });
        let done = grant_waiters(entry);
        if entry.granted.is_empty() && entry.waiting.is_empty() {
            files.remove(&file);
        }
        drop(files);
        for r in ended {
            r.complete(NtStatus::RANGE_NOT_LOCKED, |_| {});
        }
        answer(done);
    }

    /// Takes a waiting request out of its queue (CANCEL, logoff,
    /// disconnect); whether it was still waiting.
    pub fn withdraw(&self, file: FileKey, async_id: u64) -> bool {
        let mut files = self.write();
        let Some(entry) = files.get_mut(&file) else {
            return false;
        };
        let before = entry.waiting.len();
        entry.waiting.retain(|w| w.request.async_id() != async_id);
        let found = entry.waiting.len() != before;
        if entry.granted.is_empty() && entry.waiting.is_empty() {
            files.remove(&file);
        }
        found
    }

    /// Whether the file has any byte-range lock (no read or handle caching
    /// is granted on such a file).
    pub fn has_locks(&self, file: FileKey) -> bool {
        self.read()
            .get(&file)
            .is_some_and(|e| !e.granted.is_empty())
    }

    /// Whether a READ or WRITE by `owner` runs into another lock.
    pub fn io_conflicts(
        &self,
        file: FileKey,
        owner: u64,
        offset: u64,
        length: u64,
        write: bool,
    ) -> bool {
        let files = self.read();
        files
            .get(&file)
            .is_some_and(|e| byte_range::io_conflicts(&e.granted, owner, offset, length, write))
    }
}

/// Grants every waiter whose ranges are free now, in arrival order; returns
/// their requests to answer once the table is unlocked.
fn grant_waiters(entry: &mut FileLocks) -> Vec<Arc<PendingRequest>> {
    let mut done = Vec::new();
    let mut i = 0;
    while i < entry.waiting.len() {
        let w = &entry.waiting[i];
        match byte_range::try_lock(&entry.granted, w.owner, &w.ranges) {
            Ok(granted) => {
                entry.granted = granted;
                done.push(entry.waiting.remove(i).request);
            }
            Err(_) => i += 1,
        }
    }
    done
}

fn answer(granted: Vec<Arc<PendingRequest>>) {
    for r in granted {
        r.complete(NtStatus::SUCCESS, nimbus_wire::lock::encode_lock_response);
    }
}
