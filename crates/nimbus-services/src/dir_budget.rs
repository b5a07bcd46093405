//! How many directory entries one connection's enumerations may hold at
//! once (`limits.max_directory_entries`). A QUERY_DIRECTORY keeps the
//! matching entries of its directory until the enumeration restarts or the
//! open closes (MS-SMB2 3.3.5.18); without a total, a client could open many
//! large directories and hold a listing of each (about 200 bytes a name).
//! A listing takes what is free up to the limit before it reads the
//! directory, so reading is bounded too, then gives back what it does not
//! keep.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

pub struct EntryBudget {
    held: AtomicUsize,
    max: usize,
}

/// Entries taken from a connection's budget; given back when dropped.
pub struct EntryLease {
    budget: Arc<EntryBudget>,
    n: usize,
}

impl EntryBudget {
    pub fn new(max: usize) -> Arc<EntryBudget> {
        Arc::new(EntryBudget {
            held: AtomicUsize::new(0),
            max,
        })
    }

    /// Takes what is free, up to `want`; None when nothing is.
    pub fn take_up_to(self: &Arc<Self>, want: usize) -> Option<EntryLease> {
        let mut taken = 0;
        let r = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                taken = self.max.saturating_sub(held).min(want);
                (taken > 0).then_some(held + taken)
            });
        r.ok().map(|_| EntryLease {
            budget: self.clone(),
            n: taken,
        })
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

impl EntryLease {
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Keeps `n` entries (no more than were taken) and gives the rest back.
    pub fn shrink_to(&mut self, n: usize) {
        let n = n.min(self.n);
        self.budget.held.fetch_sub(self.n - n, Ordering::AcqRel);
        self.n = n;
    }
}

impl Drop for EntryLease {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.n, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_share_one_total() {
        let b = EntryBudget::new(1000);
        let mut first = b.take_up_to(1000).expect("all of it");
        assert_eq!(first.len(), 1000);
        assert!(b.take_up_to(1).is_none());
        first.shrink_to(300);
        assert_eq!(b.held(), 300);
        let second = b.take_up_to(1000).expect("what is left");
        assert_eq!(second.len(), 700);
        drop(first);
        assert_eq!(b.held(), 700);
        drop(second);
        assert_eq!(b.held(), 0);
    }
}
