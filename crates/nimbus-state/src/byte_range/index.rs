//! An index over a set of byte-range locks that answers "does a lock of
//! the set overlap this range?" in O(log n) per question and per lock
//! added, so that a request of many elements, or many waiters retried at
//! once, costs O(n log n) instead of a scan of every lock per element.
//!
//! Shared locks may overlap each other without limit, so no ordering of
//! the locks by offset alone tells where the overlapping ones are. What
//! does: a lock covering bytes `s..=e` overlaps the range `a..=b` exactly
//! when `s <= b` and `e >= a`. Over the locks sorted by `s`, that is "the
//! furthest `e` among the locks with `s <= b` reaches `a`": a prefix
//! maximum, kept in a Fenwick tree over the starting offsets (known before
//! any lock is added: the caller names them). Zero-length locks, which
//! overlap by the rules of `super::overlaps` rather than by their bytes,
//! are kept apart the same way with `e = s`.
//!
//! A shared request is stopped only by exclusive locks of other opens, so
//! each node keeps the furthest end and the furthest end of any other
//! holder than that one's: whatever open asks, one of the two is the
//! furthest end of the others.

use super::last_byte;

/// The furthest end among some locks (`first`, with its holder) and the
/// furthest end among those of the other holders (`second`).
#[derive(Clone, Copy, Debug, Default)]
struct Reach {
    first: Option<(u64, u64)>,
    second: Option<(u64, u64)>,
}

impl Reach {
    /// Adds a lock of `owner` reaching to `end`.
    fn add(&mut self, end: u64, owner: u64) {
        match self.first {
            None => self.first = Some((end, owner)),
            Some((e, o)) if end > e => {
                // The old furthest is the furthest of everyone else's when
                // it was not this owner's; otherwise `second` stands.
                if o != owner {
                    self.second = self.first;
                }
                self.first = Some((end, owner));
            }
            Some((_, o)) => {
                if o != owner && self.second.is_none_or(|(s, _)| end > s) {
                    self.second = Some((end, owner));
                }
            }
        }
    }

    fn merge(&mut self, other: &Reach) {
        for (end, owner) in [other.first, other.second].into_iter().flatten() {
            self.add(end, owner);
        }
    }

    /// The furthest end of any lock, or of any not held by `except`.
    fn furthest(&self, except: Option<u64>) -> Option<u64> {
        match (self.first, except) {
            (Some((_, o)), Some(x)) if o == x => self.second.map(|(e, _)| e),
            (first, _) => first.map(|(e, _)| e),
        }
    }
}

/// Prefix maxima of `Reach` over the positions of a sorted list of
/// starting offsets (1-based, as Fenwick trees are).
#[derive(Debug)]
struct Tree(Vec<Reach>);

impl Tree {
    fn new(positions: usize) -> Tree {
        Tree(vec![Reach::default(); positions + 1])
    }

    fn add(&mut self, mut at: usize, end: u64, owner: u64) {
        while at > 0 && at < self.0.len() {
            self.0[at].add(end, owner);
            at += at & at.wrapping_neg();
        }
    }

    /// What the first `upto` positions reach.
    fn prefix(&self, mut upto: usize) -> Reach {
        let mut r = Reach::default();
        upto = upto.min(self.0.len().saturating_sub(1));
        while upto > 0 {
            r.merge(&self.0[upto]);
            upto &= upto - 1;
        }
        r
    }
}

/// Which locks of the index a question is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Among {
    /// Every lock.
    All,
    /// Exclusive locks only.
    Exclusive,
    /// Exclusive locks not held by this open.
    ExclusiveOfOthers(u64),
}

/// Locks indexed by where they start and how far they reach.
#[derive(Debug)]
pub struct Index {
    /// Every offset a lock of the index may start at, sorted, once each.
    starts: Vec<u64>,
    /// Locks covering at least one byte: ends are their last bytes.
    ranges: Tree,
    /// Zero-length locks: ends are their offsets.
    points: Tree,
    exclusive_ranges: Tree,
    exclusive_points: Tree,
}

impl Index {
    /// An empty index for locks starting at offsets among `starts`.
    pub fn new(mut starts: Vec<u64>) -> Index {
        starts.sort_unstable();
        starts.dedup();
        let n = starts.len();
        Index {
            starts,
            ranges: Tree::new(n),
            points: Tree::new(n),
            exclusive_ranges: Tree::new(n),
            exclusive_points: Tree::new(n),
        }
    }

    /// How many of the starting offsets are at most `x`.
    fn upto(&self, x: u64) -> usize {
        self.starts.partition_point(|&s| s <= x)
    }

    /// Adds a lock. Its offset must be one `new` was given; one that is
    /// not is left out of the index (it could not be found where it
    /// belongs).
    pub fn insert(&mut self, owner: u64, offset: u64, length: u64, exclusive: bool) {
        let at = self.starts.partition_point(|&s| s < offset);
        if self.starts.get(at) != Some(&offset) {
            debug_assert!(false, "offset {offset} was not named to the index");
            return;
        }
        let at = at + 1;
        let (tree, ex_tree, end) = match last_byte(offset, length) {
            Some(last) => (&mut self.ranges, &mut self.exclusive_ranges, last),
            None => (&mut self.points, &mut self.exclusive_points, offset),
        };
        tree.add(at, end, owner);
        if exclusive {
            ex_tree.add(at, end, owner);
        }
    }

    /// Whether a lock of the index, `among` those asked about, overlaps
    /// `length` bytes at `offset` (in the sense of `super::overlaps`).
    pub fn overlaps(&self, offset: u64, length: u64, among: Among) -> bool {
        let (ranges, points, except) = match among {
            Among::All => (&self.ranges, &self.points, None),
            Among::Exclusive => (&self.exclusive_ranges, &self.exclusive_points, None),
            Among::ExclusiveOfOthers(o) => {
                (&self.exclusive_ranges, &self.exclusive_points, Some(o))
            }
        };
        // Some lock of `tree` starting at or before `x` reaches `y`.
        let reaches = |tree: &Tree, x: u64, y: u64| {
            tree.prefix(self.upto(x))
                .furthest(except)
                .is_some_and(|end| end >= y)
        };
        match last_byte(offset, length) {
            // A lock of bytes s..=e overlaps offset..=last when s <= last
            // and e >= offset; a zero-length one at p when offset < p <= last.
            Some(last) => {
                reaches(ranges, last, offset)
                    || offset
                        .checked_add(1)
                        .is_some_and(|after| reaches(points, last, after))
            }
            // A zero-length range at q lies inside a lock of bytes s..=e
            // when s < q <= e, and inside no zero-length lock.
            None => offset
                .checked_sub(1)
                .is_some_and(|before| reaches(ranges, before, offset)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reach_keeps_the_furthest_of_the_others() {
        let mut r = Reach::default();
        r.add(10, 1);
        r.add(20, 1);
        assert_eq!((r.furthest(None), r.furthest(Some(1))), (Some(20), None));
        r.add(5, 2);
        assert_eq!(r.furthest(Some(1)), Some(5));
        r.add(30, 2);
        assert_eq!(r.furthest(Some(2)), Some(20));
        assert_eq!(r.furthest(Some(3)), Some(30));
        let mut m = Reach::default();
        m.add(25, 3);
        m.merge(&r);
        assert_eq!(m.furthest(Some(2)), Some(25));
        assert_eq!(m.furthest(Some(3)), Some(30));
    }

    #[test]
    fn overlapping_shared_locks_and_zero_lengths() {
        let mut i = Index::new(vec![0, 2, 4, 6, 10]);
        // Shared, overlapping each other.
        i.insert(1, 0, 5, false);
        i.insert(2, 2, 1, false);
        i.insert(3, 4, 1, true);
        i.insert(4, 10, 0, true);
        assert!(i.overlaps(4, 1, Among::All));
        assert!(i.overlaps(0, 100, Among::ExclusiveOfOthers(1)));
        assert!(!i.overlaps(0, 4, Among::Exclusive));
        assert!(!i.overlaps(4, 1, Among::ExclusiveOfOthers(3)));
        assert!(!i.overlaps(5, 5, Among::All));
        // The zero-length lock at 10: inside 9..=11, not at 10..
        assert!(i.overlaps(9, 3, Among::Exclusive));
        assert!(!i.overlaps(10, 3, Among::Exclusive));
        // A zero-length range inside 0..=4, not at its first byte.
        assert!(i.overlaps(3, 0, Among::All));
        assert!(!i.overlaps(0, 0, Among::All));
        assert!(!i.overlaps(10, 0, Among::All));
    }
}
