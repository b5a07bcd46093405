//! nimbus-services' byte-range lock service (crates/nimbus-services/src/
//! locks.rs) as the harness runs it: each file's granted locks and its
//! blocking requests in arrival order, retried whenever a file's locks
//! shrink (an unlock or a close). Requests are named by their async id
//! instead of a pending request to answer.

use nimbus_state::byte_range::{self, LockError, LockRange, RangeLock};
use nimbus_state::FileKey;

/// A blocking LOCK waiting for its range.
#[derive(Clone, Debug)]
pub struct LockWaiter {
    pub owner: u64,
    pub ranges: Vec<LockRange>,
    pub async_id: u64,
}

#[derive(Debug)]
pub struct FileLocks {
    pub key: FileKey,
    pub granted: Vec<RangeLock>,
    pub waiting: Vec<LockWaiter>,
}

pub enum Outcome {
    Granted,
    Refused,
    Waiting,
}

/// Files with no lock and no waiter have no entry, as in the server.
#[derive(Default)]
pub struct Locks {
    pub files: Vec<FileLocks>,
}

impl Locks {
    fn index(&self, file: FileKey) -> Option<usize> {
        self.files.iter().position(|f| f.key == file)
    }

    fn index_or_insert(&mut self, file: FileKey) -> usize {
        self.index(file).unwrap_or_else(|| {
            self.files.push(FileLocks {
                key: file,
                granted: Vec::new(),
                waiting: Vec::new(),
            });
            self.files.len() - 1
        })
    }

    fn prune(&mut self, i: usize) {
        if self.files[i].granted.is_empty() && self.files[i].waiting.is_empty() {
            self.files.remove(i);
        }
    }

    /// Grants `ranges` now, refuses, or (with `wait`, the request's async
    /// id) queues them.
    pub fn lock(
        &mut self,
        file: FileKey,
        owner: u64,
        ranges: Vec<LockRange>,
        wait: Option<u64>,
    ) -> Outcome {
        let i = self.index_or_insert(file);
        let entry = &mut self.files[i];
        match byte_range::try_lock(&entry.granted, owner, &ranges) {
            Ok(granted) => {
                entry.granted = granted;
                Outcome::Granted
            }
            Err(LockError::Conflict) if wait.is_some() => {
                entry.waiting.push(LockWaiter {
                    owner,
                    ranges,
                    async_id: wait.unwrap_or_default(),
                });
                Outcome::Waiting
            }
            Err(_) => {
                self.prune(i);
                Outcome::Refused
            }
        }
    }

    /// Unlocks `ranges` in order, stopping at the first the owner does not
    /// hold; returns the waiters granted afterwards.
    pub fn unlock(&mut self, file: FileKey, owner: u64, ranges: &[(u64, u64)]) -> Vec<u64> {
        let i = self.index_or_insert(file);
        let entry = &mut self.files[i];
        for &(offset, length) in ranges {
            if byte_range::unlock(&mut entry.granted, owner, offset, length).is_err() {
                break;
            }
        }
        let done = grant_waiters(entry);
        self.prune(i);
        done
    }

    /// A handle closed: its locks go, its own waiters end (the first list),
    /// others may be granted (the second).
    pub fn release_open(&mut self, file: FileKey, owner: u64) -> (Vec<u64>, Vec<u64>) {
        let Some(i) = self.index(file) else {
            return (Vec::new(), Vec::new());
        };
        let entry = &mut self.files[i];
        byte_range::release(&mut entry.granted, owner);
        let mut ended = Vec::new();
        entry.waiting.retain(|w| {
            if w.owner == owner {
                ended.push(w.async_id);
                false
            } else {
                true
            }
        });
        let done = grant_waiters(entry);
        self.prune(i);
        (ended, done)
    }

    /// CANCEL: whether the request was still waiting.
    pub fn withdraw(&mut self, file: FileKey, async_id: u64) -> bool {
        let Some(i) = self.index(file) else {
            return false;
        };
        let entry = &mut self.files[i];
        let before = entry.waiting.len();
        entry.waiting.retain(|w| w.async_id != async_id);
        let found = entry.waiting.len() != before;
        self.prune(i);
        found
    }

    pub fn has_locks(&self, file: FileKey) -> bool {
        self.index(file)
            .is_some_and(|i| !self.files[i].granted.is_empty())
    }
}

/// Grants every waiter whose ranges are free, in arrival order.
fn grant_waiters(entry: &mut FileLocks) -> Vec<u64> {
    let mut done = Vec::new();
    let mut i = 0;
    while i < entry.waiting.len() {
        let w = &entry.waiting[i];
        match byte_range::try_lock(&entry.granted, w.owner, &w.ranges) {
            Ok(granted) => {
                entry.granted = granted;
                done.push(entry.waiting.remove(i).async_id);
            }
            Err(_) => i += 1,
        }
    }
    done
}
