//! Byte-range locks of one file, as pure rules over its list of locks
//! (MS-FSA 2.1.5.7 "Server Requests Setting a Byte-Range Lock", 2.1.5.8
//! "... Unlock", 2.1.4.10 "Algorithm to Determine if a Range Access
//! Conflicts with Byte-Range Locks"). Nothing here waits or sends: callers
//! ask, get a decision and the new list, and keep the list where they keep
//! the file's state.

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
    if wanted.iter().any(|w| !valid_range(w.offset, w.length)) {
        return Err(LockError::InvalidRange);
    }
    let mut out = locks.to_vec();
    for w in wanted {
        if out.iter().any(|l| conflicts(l, owner, w)) {
            return Err(LockError::Conflict);
        }
        out.push(RangeLock {
            owner,
            offset: w.offset,
            length: w.length,
            exclusive: w.exclusive,
        });
    }
    Ok(out)
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
