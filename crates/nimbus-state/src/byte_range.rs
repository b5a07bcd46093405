//! Byte-range locks of one file, as pure rules over its list of locks
//! (MS-FSA 2.1.5.7 "Server Requests Setting a Byte-Range Lock", 2.1.5.8
//! "... Unlock", 2.1.4.10 "Algorithm to Determine if a Range Access
//! Conflicts with Byte-Range Locks"). Nothing here waits or sends: callers
//! ask, get a decision and the new list, and keep the list where they keep
//! the file's state.
//!
//! The list is what a file's record holds (`records::LockList`), in the
//! order granted. A client chooses how many locks it asks for (up to 65,535
//! elements in one LOCK request), so the rules bound it (`LockCaps`) and
//! never compare every lock with every other: a request of several
//! elements, or several waiters retried together, is checked through an
//! interval index (`index`) in O((n + k) log(n + k)), and several unlocks
//! of one request find their locks through a map.

mod index;
#[cfg(any(test, feature = "fuzzing"))]
pub mod model;

use std::collections::{HashMap, VecDeque};

use index::{Among, Index};

/// One granted lock. Locks belong to the open that took them (MS-SMB2
/// Open.LockSequence... is per open; two opens of one session conflict).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeLock {
    /// The open id of the holder.
    pub owner: u64,
    pub offset: u64,
    pub length: u64,
    pub exclusive: bool,
}

/// One element of a lock request, validated by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRange {
    pub offset: u64,
    pub length: u64,
    pub exclusive: bool,
}

/// Why a lock cannot be granted now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockError {
    /// Offset + length runs past 2^64 (STATUS_INVALID_LOCK_RANGE).
    InvalidRange,
    /// Another lock covers part of the range (STATUS_LOCK_NOT_GRANTED, or a
    /// wait for a blocking request).
    Conflict,
    /// Granting the request would pass a cap (STATUS_INSUFFICIENT_RESOURCES).
    TooMany(Cap),
}

/// Which of `LockCaps` a request would pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    PerOpen,
    PerFile,
}

/// How many locks one open, and one file, may hold. Windows has no fixed
/// number (each lock takes kernel pool, which bounds them); a server that
/// keeps a file's locks in one record it rewrites on every change needs
/// one, or a single client grows the record, and the cost of every later
/// LOCK on the file, without end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockCaps {
    pub per_open: usize,
    pub per_file: usize,
}

impl LockCaps {
    /// No cap (the rules as MS-FSA states them).
    pub const NONE: LockCaps = LockCaps {
        per_open: usize::MAX,
        per_file: usize::MAX,
    };

    /// Whether `owner` may add `more` locks to `locks`.
    fn check(&self, locks: &[RangeLock], owner: u64, more: usize) -> Result<(), LockError> {
        if locks.len().saturating_add(more) > self.per_file {
            return Err(LockError::TooMany(Cap::PerFile));
        }
        // Counting needs a pass over the list only when the file's locks
        // could be too many for the open.
        if locks.len().saturating_add(more) > self.per_open {
            let held = locks.iter().filter(|l| l.owner == owner).count();
            if held.saturating_add(more) > self.per_open {
                return Err(LockError::TooMany(Cap::PerOpen));
            }
        }
        Ok(())
    }
}

/// The last byte of a range, or None for a zero-length range.
fn last_byte(offset: u64, length: u64) -> Option<u64> {
    length.checked_sub(1).map(|l| offset.saturating_add(l))
}

/// Whether `offset + length` fits in 64 bits (MS-FSA 2.1.5.7: a range
/// ending past 2^64 - 1 is STATUS_INVALID_LOCK_RANGE).
pub fn valid_range(offset: u64, length: u64) -> bool {
    length == 0 || offset.checked_add(length - 1).is_some()
}

/// Whether two ranges share a byte. A zero-length range covers no byte: it
/// overlaps a range only when its offset lies strictly inside that range
/// (after its first byte), and never overlaps another zero-length range.
fn overlaps(a_off: u64, a_len: u64, b_off: u64, b_len: u64) -> bool {
    match (last_byte(a_off, a_len), last_byte(b_off, b_len)) {
        (Some(a_end), Some(b_end)) => a_off <= b_end && b_off <= a_end,
        (None, Some(b_end)) => b_off < a_off && a_off <= b_end,
        (Some(a_end), None) => a_off < b_off && b_off <= a_end,
        (None, None) => false,
    }
}

/// Whether `existing` stops `owner` from taking `want`.
fn conflicts(existing: &RangeLock, owner: u64, want: &LockRange) -> bool {
    if !overlaps(existing.offset, existing.length, want.offset, want.length) {
        return false;
    }
    // An exclusive request conflicts with every overlapping lock, the
    // requester's own included; a shared one only with exclusive locks of
    // other opens.
    want.exclusive || (existing.exclusive && existing.owner != owner)
}

/// Grants all of `wanted` to `owner` or none of it: the new list, or why
/// not. Elements of one request are checked against the locks granted by
/// the earlier ones too.
pub fn try_lock(
    locks: &[RangeLock],
    owner: u64,
    wanted: &[LockRange],
) -> Result<Vec<RangeLock>, LockError> {
    let mut out = locks.to_vec();
    grant(&mut out, owner, wanted, LockCaps::NONE)?;
    Ok(out)
}

/// Grants all of `wanted` to `owner`, appended to `locks` in order, or
/// none of it (MS-SMB2 3.3.5.14: a LOCK request is all or nothing), with
/// why not: a range past 2^64 first, then a cap, then a conflict with a
/// lock held or with an earlier element of the request.
pub fn grant(
    locks: &mut Vec<RangeLock>,
    owner: u64,
    wanted: &[LockRange],
    caps: LockCaps,
) -> Result<(), LockError> {
    if wanted.iter().any(|w| !valid_range(w.offset, w.length)) {
        return Err(LockError::InvalidRange);
    }
    caps.check(locks, owner, wanted.len())?;
    if held_conflict(locks, owner, wanted) {
        return Err(LockError::Conflict);
    }
    append(locks, owner, wanted);
    Ok(())
}

fn append(locks: &mut Vec<RangeLock>, owner: u64, wanted: &[LockRange]) {
    locks.extend(wanted.iter().map(|w| RangeLock {
        owner,
        offset: w.offset,
        length: w.length,
        exclusive: w.exclusive,
    }));
}

/// The elements of one request, indexed; None when an element conflicts
/// with an earlier one: an exclusive element with any earlier element it
/// overlaps (the open's own shared and exclusive locks alike), a shared
/// one never.
fn request_index(owner: u64, wanted: &[LockRange]) -> Option<Index> {
    let mut index = Index::new(wanted.iter().map(|w| w.offset).collect());
    for w in wanted {
        if w.exclusive && index.overlaps(w.offset, w.length, Among::All) {
            return None;
        }
        index.insert(owner, w.offset, w.length, w.exclusive);
    }
    Some(index)
}

/// Whether an element of `wanted` conflicts with an earlier one.
fn conflict_within(owner: u64, wanted: &[LockRange]) -> bool {
    wanted.len() > 1 && request_index(owner, wanted).is_none()
}

/// Whether `wanted` conflicts with a lock of `locks` or within itself.
/// With several elements, the request is indexed and each held lock asks
/// it, so the list is read once and never sorted: O((n + k) log k).
fn held_conflict(locks: &[RangeLock], owner: u64, wanted: &[LockRange]) -> bool {
    match wanted {
        [] => false,
        [w] => locks.iter().any(|l| conflicts(l, owner, w)),
        _ => {
            let Some(index) = request_index(owner, wanted) else {
                return true;
            };
            // `conflicts` seen from the held lock: another open's exclusive
            // lock stops every element it overlaps, any other lock only
            // exclusive elements.
            locks.iter().any(|l| {
                let among = if l.exclusive && l.owner != owner {
                    Among::All
                } else {
                    Among::Exclusive
                };
                index.overlaps(l.offset, l.length, among)
            })
        }
    }
}

/// Fewer waiters than this are retried one `grant` each, a scan of the
/// list each; more, through one index of the list.
const WAITERS_BY_SCAN: usize = 8;

/// Retries waiting requests (owner, elements) in arrival order, each on
/// the list as the ones before it left it. A waiter whose ranges are still
/// taken waits on, whatever the caps; one whose ranges are free is granted
/// (its locks appended) unless that would pass a cap, which refuses it.
/// Returns the ones decided, in order; the others still wait.
pub fn grant_waiters(
    locks: &mut Vec<RangeLock>,
    asks: &[(u64, &[LockRange])],
    caps: LockCaps,
) -> Vec<(usize, Result<(), LockError>)> {
    let mut decided = Vec::new();
    if asks.len() < WAITERS_BY_SCAN {
        for (i, (owner, wanted)) in asks.iter().enumerate() {
            let (owner, wanted) = (*owner, *wanted);
            if wanted.iter().any(|w| !valid_range(w.offset, w.length)) {
                decided.push((i, Err(LockError::InvalidRange)));
            } else if !held_conflict(locks, owner, wanted) {
                let r = caps.check(locks, owner, wanted.len());
                if r.is_ok() {
                    append(locks, owner, wanted);
                }
                decided.push((i, r));
            }
        }
        return decided;
    }
    let starts = locks
        .iter()
        .map(|l| l.offset)
        .chain(asks.iter().flat_map(|(_, w)| w.iter().map(|w| w.offset)))
        .collect();
    let mut index = Index::new(starts);
    let mut held: HashMap<u64, usize> = HashMap::new();
    for l in locks.iter() {
        index.insert(l.owner, l.offset, l.length, l.exclusive);
        *held.entry(l.owner).or_default() += 1;
    }
    for (i, (owner, wanted)) in asks.iter().enumerate() {
        let (owner, wanted) = (*owner, *wanted);
        if wanted.iter().any(|w| !valid_range(w.offset, w.length)) {
            decided.push((i, Err(LockError::InvalidRange)));
            continue;
        }
        let blocked = |w: &LockRange| {
            let among = if w.exclusive {
                Among::All
            } else {
                Among::ExclusiveOfOthers(owner)
            };
            index.overlaps(w.offset, w.length, among)
        };
        if wanted.iter().any(blocked) || conflict_within(owner, wanted) {
            continue;
        }
        let mine = held.get(&owner).copied().unwrap_or(0);
        let cap = if locks.len().saturating_add(wanted.len()) > caps.per_file {
            Some(Cap::PerFile)
        } else if mine.saturating_add(wanted.len()) > caps.per_open {
            Some(Cap::PerOpen)
        } else {
            None
        };
        if let Some(cap) = cap {
            decided.push((i, Err(LockError::TooMany(cap))));
            continue;
        }
        for w in wanted {
            index.insert(owner, w.offset, w.length, w.exclusive);
        }
        *held.entry(owner).or_default() += wanted.len();
        append(locks, owner, wanted);
        decided.push((i, Ok(())));
    }
    decided
}

/// `unlock` found no lock of the owner with that offset and length
/// (STATUS_RANGE_NOT_LOCKED).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotLocked;

/// Removes one lock of `owner` with exactly this offset and length; Err if
/// it holds none (STATUS_RANGE_NOT_LOCKED). Of stacked locks on one range an
/// exclusive one goes first, then the shared ones (as Windows does: the
/// range then stays readable by the others).
pub fn unlock(
    locks: &mut Vec<RangeLock>,
    owner: u64,
    offset: u64,
    length: u64,
) -> Result<(), NotLocked> {
    let same = |l: &RangeLock| l.owner == owner && l.offset == offset && l.length == length;
    let at = locks
        .iter()
        .position(|l| same(l) && l.exclusive)
        .or_else(|| locks.iter().rposition(same))
        .ok_or(NotLocked)?;
    locks.remove(at);
    Ok(())
}

/// `unlock` of each (offset, length) in order, stopping at the first that
/// `owner` does not hold (Err) and keeping the ones before it. The owner's
/// locks are found through a map, not a scan per element.
pub fn unlock_each(
    locks: &mut Vec<RangeLock>,
    owner: u64,
    ranges: &[(u64, u64)],
) -> Result<(), NotLocked> {
    if let [(offset, length)] = ranges {
        return unlock(locks, owner, *offset, *length);
    }
    if ranges.is_empty() {
        return Ok(());
    }
    /// Where the owner's locks of one range are, in list order.
    #[derive(Default)]
    struct Stack {
        exclusive: VecDeque<usize>,
        shared: Vec<usize>,
    }
    let mut held: HashMap<(u64, u64), Stack> = HashMap::new();
    for (i, l) in locks.iter().enumerate().filter(|(_, l)| l.owner == owner) {
        let s = held.entry((l.offset, l.length)).or_default();
        if l.exclusive {
            s.exclusive.push_back(i);
        } else {
            s.shared.push(i);
        }
    }
    let mut gone = vec![false; locks.len()];
    let mut result = Ok(());
    for range in ranges {
        // As `unlock`: the first exclusive lock in the list, else the last
        // (shared) one.
        let at = held
            .get_mut(range)
            .and_then(|s| s.exclusive.pop_front().or_else(|| s.shared.pop()));
        match at.and_then(|i| gone.get_mut(i)) {
            Some(g) => *g = true,
            None => {
                result = Err(NotLocked);
                break;
            }
        }
    }
    let mut i = 0;
    locks.retain(|_| {
        let keep = !gone.get(i).copied().unwrap_or(false);
        i += 1;
        keep
    });
    result
}

/// Drops every lock of `owner` (its handle closed); whether any went.
pub fn release(locks: &mut Vec<RangeLock>, owner: u64) -> bool {
    let before = locks.len();
    locks.retain(|l| l.owner != owner);
    locks.len() != before
}

/// Whether a READ (`write` false) or WRITE by `owner` of `length` bytes at
/// `offset` runs into a lock (MS-FSA 2.1.4.10): a read is stopped by other
/// opens' exclusive locks; a write by other opens' locks of either kind and
/// by shared locks of its own.
pub fn io_conflicts(
    locks: &[RangeLock],
    owner: u64,
    offset: u64,
    length: u64,
    write: bool,
) -> bool {
    if length == 0 {
        return false;
    }
    locks.iter().any(|l| {
        l.length != 0
            && overlaps(l.offset, l.length, offset, length)
            && if write {
                l.owner != owner || !l.exclusive
            } else {
                l.owner != owner && l.exclusive
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(offset: u64, length: u64) -> LockRange {
        LockRange {
            offset,
            length,
            exclusive: true,
        }
    }

    fn sh(offset: u64, length: u64) -> LockRange {
        LockRange {
            offset,
            length,
            exclusive: false,
        }
    }

    #[test]
    fn exclusive_and_shared_conflicts() {
        let locks = try_lock(&[], 1, &[ex(100, 10)]).unwrap();
        // Another open: nothing overlapping.
        assert_eq!(try_lock(&locks, 2, &[ex(105, 1)]), Err(LockError::Conflict));
        assert_eq!(try_lock(&locks, 2, &[sh(109, 5)]), Err(LockError::Conflict));
        assert!(try_lock(&locks, 2, &[ex(110, 5)]).is_ok());
        assert!(try_lock(&locks, 2, &[ex(90, 10)]).is_ok());
        // The holder: a shared lock over its own exclusive range, not another exclusive.
        assert!(try_lock(&locks, 1, &[sh(100, 10)]).is_ok());
        assert_eq!(
            try_lock(&locks, 1, &[ex(100, 10)]),
            Err(LockError::Conflict)
        );
        // Shared locks stack.
        let shared = try_lock(&[], 1, &[sh(0, 10)]).unwrap();
        let shared = try_lock(&shared, 2, &[sh(5, 10)]).unwrap();
        assert_eq!(try_lock(&shared, 3, &[ex(9, 1)]), Err(LockError::Conflict));
    }

    #[test]
    fn one_request_is_all_or_nothing() {
        let locks = try_lock(&[], 1, &[ex(50, 10)]).unwrap();
        assert_eq!(
            try_lock(&locks, 2, &[ex(0, 10), ex(55, 1)]),
            Err(LockError::Conflict)
        );
        // Elements of one request conflict with each other too.
        assert_eq!(
            try_lock(&[], 2, &[ex(0, 10), ex(5, 10)]),
            Err(LockError::Conflict)
        );
    }

    #[test]
    fn ranges_at_the_top_and_zero_length() {
        assert!(valid_range(u64::MAX, 1));
        assert!(!valid_range(u64::MAX, 2));
        assert!(valid_range(u64::MAX, 0));
        assert_eq!(
            try_lock(&[], 1, &[ex(u64::MAX, 2)]),
            Err(LockError::InvalidRange)
        );
        let locks = try_lock(&[], 1, &[ex(u64::MAX - 9, 10)]).unwrap();
        assert_eq!(
            try_lock(&locks, 2, &[ex(u64::MAX, 1)]),
            Err(LockError::Conflict)
        );
        // Zero-length: inside another range it conflicts, at its first byte
        // or with another zero-length lock it does not.
        let locks = try_lock(&[], 1, &[ex(10, 10)]).unwrap();
        assert_eq!(try_lock(&locks, 2, &[ex(15, 0)]), Err(LockError::Conflict));
        assert!(try_lock(&locks, 2, &[ex(10, 0)]).is_ok());
        let zero = try_lock(&[], 1, &[ex(5, 0)]).unwrap();
        assert!(try_lock(&zero, 2, &[ex(5, 0)]).is_ok());
        assert!(try_lock(&zero, 2, &[ex(4, 2)]).is_err());
    }

    #[test]
    fn unlock_exact_range_of_the_owner() {
        let mut locks = try_lock(&[], 1, &[sh(0, 10)]).unwrap();
        locks = try_lock(&locks, 1, &[sh(0, 10)]).unwrap();
        assert_eq!(unlock(&mut locks, 2, 0, 10), Err(NotLocked));
        assert_eq!(unlock(&mut locks, 1, 0, 5), Err(NotLocked));
        assert_eq!(unlock(&mut locks, 1, 0, 10), Ok(()));
        assert_eq!(locks.len(), 1);
        assert_eq!(unlock(&mut locks, 1, 0, 10), Ok(()));
        assert_eq!(unlock(&mut locks, 1, 0, 10), Err(NotLocked));
        // Exclusive before shared, whatever the order they were taken in.
        let mut locks = try_lock(&[], 1, &[ex(10, 0)]).unwrap();
        locks = try_lock(&locks, 1, &[sh(10, 0)]).unwrap();
        assert_eq!(unlock(&mut locks, 1, 10, 0), Ok(()));
        assert!(!locks[0].exclusive);
    }

    #[test]
    fn caps_refuse_the_whole_request() {
        let caps = LockCaps {
            per_open: 3,
            per_file: 4,
        };
        let mut locks = Vec::new();
        assert_eq!(grant(&mut locks, 1, &[sh(0, 1), sh(0, 1)], caps), Ok(()));
        // A third is within the open's cap, a fourth is not: neither is granted.
        assert_eq!(
            grant(&mut locks, 1, &[sh(5, 1), sh(6, 1)], caps),
            Err(LockError::TooMany(Cap::PerOpen))
        );
        assert_eq!(locks.len(), 2);
        assert_eq!(grant(&mut locks, 2, &[ex(10, 1), ex(11, 1)], caps), Ok(()));
        assert_eq!(
            grant(&mut locks, 3, &[sh(20, 1)], caps),
            Err(LockError::TooMany(Cap::PerFile))
        );
        // A range past 2^64 is named before a cap.
        assert_eq!(
            grant(&mut locks, 3, &[sh(u64::MAX, 2)], caps),
            Err(LockError::InvalidRange)
        );
        assert!(release(&mut locks, 2));
        assert_eq!(grant(&mut locks, 3, &[sh(20, 1)], caps), Ok(()));
    }

    #[test]
    fn many_shared_elements_on_one_byte() {
        // The request that once took seconds: 65,535 shared locks on one
        // byte, twice, then an exclusive one that all of them stop.
        let wanted = vec![sh(0, 1); 65535];
        let mut locks = Vec::new();
        assert_eq!(grant(&mut locks, 1, &wanted, LockCaps::NONE), Ok(()));
        assert_eq!(grant(&mut locks, 2, &wanted, LockCaps::NONE), Ok(()));
        let mut both = wanted.clone();
        both.push(ex(0, 1));
        assert_eq!(
            grant(&mut locks, 3, &both, LockCaps::NONE),
            Err(LockError::Conflict)
        );
        assert_eq!(
            grant(&mut locks, 1, &[sh(1, 1), ex(0, 2)], LockCaps::NONE),
            Err(LockError::Conflict)
        );
        let ranges = vec![(0, 1); 65535];
        assert_eq!(unlock_each(&mut locks, 2, &ranges), Ok(()));
        assert_eq!(locks.len(), 65535);
        assert!(locks.iter().all(|l| l.owner == 1));
    }

    #[test]
    fn waiters_are_granted_in_order_or_refused_at_a_cap() {
        let mut locks = try_lock(&[], 1, &[ex(0, 10)]).unwrap();
        let w = [ex(0, 5)];
        let s = [sh(5, 1)];
        let far = [sh(100, 1)];
        // 2 and 3 want 0..5 exclusively: only the first of them gets it.
        let mut asks: Vec<(u64, &[LockRange])> = vec![(2, &w), (3, &w), (4, &s), (5, &far)];
        asks.extend((10..20).map(|o| (o, &far[..])));
        let caps = LockCaps {
            per_open: 10,
            per_file: 12,
        };
        let mut cleared = locks.clone();
        release(&mut cleared, 1);
        let decided = grant_waiters(&mut cleared, &asks, caps);
        let mut by_model = locks.clone();
        release(&mut by_model, 1);
        let expected = model::model_grant_waiters(&mut by_model, &asks, caps);
        assert_eq!(decided, expected);
        assert_eq!(cleared, by_model);
        assert_eq!(
            &decided[..4],
            &[(0, Ok(())), (2, Ok(())), (3, Ok(())), (4, Ok(()))]
        );
        assert_eq!(
            decided.last(),
            Some(&(13, Err(LockError::TooMany(Cap::PerFile))))
        );
        // Still held by 1: nobody gets 0..5, and those who would pass a cap
        // wait on rather than being refused.
        let full = LockCaps {
            per_open: 1,
            per_file: 1,
        };
        assert!(grant_waiters(&mut locks, &asks[..2], full).is_empty());
    }

    #[test]
    fn indexed_rules_agree_with_the_scan_on_seeded_random_requests() {
        // splitmix64: the same inputs on every run.
        let mut seed = 0x6e69_6d62_7573_u64;
        let mut next = || {
            seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut steps = 0;
        for _ in 0..2000 {
            let len = 64 + (next() % 512) as usize;
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            steps += model::run(&data);
        }
        assert!(steps > 3000, "{steps} steps");
    }

    #[test]
    fn io_against_locks() {
        let mut locks = try_lock(&[], 1, &[ex(0, 10)]).unwrap();
        locks = try_lock(&locks, 1, &[sh(20, 10)]).unwrap();
        // The holder reads and writes its exclusive range; others cannot.
        assert!(!io_conflicts(&locks, 1, 0, 10, false));
        assert!(!io_conflicts(&locks, 1, 0, 10, true));
        assert!(io_conflicts(&locks, 2, 5, 1, false));
        assert!(io_conflicts(&locks, 2, 9, 5, true));
        // A shared range: read by anyone, written by no one.
        assert!(!io_conflicts(&locks, 2, 20, 10, false));
        assert!(io_conflicts(&locks, 2, 25, 1, true));
        assert!(io_conflicts(&locks, 1, 25, 1, true));
        assert!(!io_conflicts(&locks, 2, 10, 10, true));
        assert!(release(&mut locks, 1));
        assert!(!io_conflicts(&locks, 2, 0, 100, true));
    }
}
