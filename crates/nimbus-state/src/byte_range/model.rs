//! The byte-range lock rules written the plain way, a scan of the whole
//! list for every element, as the model the indexed rules of the parent
//! module must agree with: `run` drives both with the same random
//! requests (the `byte_range_locks` fuzz target, and a seeded run in this
//! crate's tests) and panics at the first answer or list that differs.

use super::{
    conflicts, grant, grant_waiters, release, unlock, unlock_each, valid_range, Cap, LockCaps,
    LockError, LockRange, NotLocked, RangeLock,
};

/// `super::grant`, by scanning: every element against every lock held and
/// every element before it.
pub fn model_grant(
    locks: &mut Vec<RangeLock>,
    owner: u64,
    wanted: &[LockRange],
    caps: LockCaps,
) -> Result<(), LockError> {
    if wanted.iter().any(|w| !valid_range(w.offset, w.length)) {
        return Err(LockError::InvalidRange);
    }
    if locks.len() + wanted.len() > caps.per_file {
        return Err(LockError::TooMany(Cap::PerFile));
    }
    if locks.iter().filter(|l| l.owner == owner).count() + wanted.len() > caps.per_open {
        return Err(LockError::TooMany(Cap::PerOpen));
    }
    let mut out = locks.clone();
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
    *locks = out;
    Ok(())
}

/// `super::grant_waiters`, one `model_grant` per waiter: without caps
/// first, to see whether its ranges are free, then with them.
pub fn model_grant_waiters(
    locks: &mut Vec<RangeLock>,
    asks: &[(u64, &[LockRange])],
    caps: LockCaps,
) -> Vec<(usize, Result<(), LockError>)> {
    let mut decided = Vec::new();
    for (i, (owner, wanted)) in asks.iter().enumerate() {
        let mut free = locks.clone();
        match model_grant(&mut free, *owner, wanted, LockCaps::NONE) {
            Err(LockError::Conflict) => {}
            Err(e) => decided.push((i, Err(e))),
            Ok(()) => decided.push((i, model_grant(locks, *owner, wanted, caps))),
        }
    }
    decided
}

/// `super::unlock_each`, one `unlock` (itself a scan) per range.
pub fn model_unlock_each(
    locks: &mut Vec<RangeLock>,
    owner: u64,
    ranges: &[(u64, u64)],
) -> Result<(), NotLocked> {
    for &(offset, length) in ranges {
        let same = |l: &RangeLock| l.owner == owner && l.offset == offset && l.length == length;
        let at = locks
            .iter()
            .position(|l| same(l) && l.exclusive)
            .or_else(|| locks.iter().rposition(same))
            .ok_or(NotLocked)?;
        locks.remove(at);
    }
    Ok(())
}

/// Reads the fuzzer's bytes as numbers; zeros once they run out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn small(&mut self, below: u8) -> u8 {
        self.byte().unwrap_or(0) % below.max(1)
    }

    /// An offset or length: mostly below `small`, so that ranges meet and
    /// repeat; now and then near 2^64, where ranges end or overflow.
    fn number(&mut self, small: u8) -> u64 {
        match self.byte().unwrap_or(0) {
            b @ 0..=0xEF => u64::from(b % small),
            b @ 0xF0..=0xF7 => u64::MAX - u64::from(b - 0xF0),
            b => (u64::from(b - 0xF8) << 61) | 7,
        }
    }

    fn range(&mut self) -> LockRange {
        let (offset, length) = (self.number(16), self.number(5));
        LockRange {
            offset,
            length,
            exclusive: self.small(3) == 0,
        }
    }

    fn owner(&mut self) -> u64 {
        1 + u64::from(self.small(4))
    }
}

/// Replays `data` as a sequence of requests against the indexed rules and
/// against the model, asserting the same answer and the same list (in
/// order) after every step. Returns how many steps ran.
pub fn run(data: &[u8]) -> usize {
    let mut input = Input(data);
    let caps = match input.small(4) {
        0 => LockCaps::NONE,
        _ => LockCaps {
            per_open: 1 + usize::from(input.small(48)),
            per_file: 1 + usize::from(input.byte().unwrap_or(0) % 96),
        },
    };
    let mut new: Vec<RangeLock> = Vec::new();
    let mut old: Vec<RangeLock> = Vec::new();
    let mut steps = 0;
    while let Some(op) = input.byte() {
        steps += 1;
        match op % 8 {
            // A request of up to 40 elements; long ones take the index.
            0..=2 => {
                let owner = input.owner();
                let n = input.small(if op & 0x80 != 0 { 41 } else { 4 });
                let wanted: Vec<LockRange> = (0..n).map(|_| input.range()).collect();
                let a = grant(&mut new, owner, &wanted, caps);
                let b = model_grant(&mut old, owner, &wanted, caps);
                assert_eq!(a, b, "grant to {owner} of {wanted:?} over {old:?}");
            }
            // Unlocks, mostly of ranges held, mostly by their holder.
            3 | 4 => {
                let mut owner = input.owner();
                let n = 1 + input.small(12);
                let mut ranges: Vec<(u64, u64)> = Vec::new();
                for i in 0..n {
                    let range = match (input.small(4), old.is_empty()) {
                        (0, _) | (_, true) => (input.number(16), input.number(5)),
                        _ => {
                            let l = old[usize::from(input.byte().unwrap_or(0)) % old.len()];
                            if i == 0 && op & 0x80 == 0 {
                                owner = l.owner;
                            }
                            (l.offset, l.length)
                        }
                    };
                    ranges.push(range);
                }
                let before = old.clone();
                let a = unlock_each(&mut new, owner, &ranges);
                let b = model_unlock_each(&mut old, owner, &ranges);
                assert_eq!(a, b, "unlock by {owner} of {ranges:?} in {before:?}");
                // One range alone is `unlock` itself.
                if let [(offset, length)] = ranges[..] {
                    let mut single = before;
                    assert_eq!(unlock(&mut single, owner, offset, length), b);
                    assert_eq!(single, old);
                }
            }
            5 => {
                let owner = input.owner();
                assert_eq!(release(&mut new, owner), {
                    let before = old.len();
                    old.retain(|l| l.owner != owner);
                    old.len() != before
                });
            }
            // Waiters retried together, past the scan's threshold or not.
            6 => {
                let n = input.small(20);
                let asks: Vec<(u64, Vec<LockRange>)> = (0..n)
                    .map(|_| {
                        let owner = input.owner();
                        let k = 1 + input.small(3);
                        (owner, (0..k).map(|_| input.range()).collect())
                    })
                    .collect();
                let asks: Vec<(u64, &[LockRange])> =
                    asks.iter().map(|(o, w)| (*o, w.as_slice())).collect();
                let before = old.clone();
                let a = grant_waiters(&mut new, &asks, caps);
                let b = model_grant_waiters(&mut old, &asks, caps);
                assert_eq!(a, b, "waiters {asks:?} over {before:?}");
            }
            // A lock no rule would grant (overlapping another's exclusive
            // one, or running past 2^64), as a damaged or foreign record
            // holds: the rules must still agree on it, and not panic.
            _ => {
                let r = input.range();
                let l = RangeLock {
                    owner: input.owner(),
                    offset: r.offset,
                    length: r.length,
                    exclusive: r.exclusive,
                };
                new.push(l);
                old.push(l);
            }
        }
        assert_eq!(new, old, "lists after step {steps}");
    }
    steps
}
