//! Break orders this node could not post into another node's message box
//! because etcd did not answer (a leader election, a member lost), kept to
//! be posted again.
//!
//! The node whose CREATE caused a break waits for its acknowledgement, and
//! takes it as done only after the break timeout (35 s by default): an
//! order that never reaches the holder's node would hold that CREATE up
//! for all of it, though etcd was out for a second. Nor may the order be
//! taken as delivered to nobody: the holder still caches, and a break
//! acknowledged at once would grant past it. So it is posted again, until
//! etcd takes it or its `until` passes: half the break timeout (an order
//! that came later than that could reach a client after its break was
//! over), and never past the node's TTL (by then this node has lost its
//! lease, under which the message would have lived, and its clients with
//! it).
//!
//! An answer etcd did not give does not say the message was not written
//! (a leader that changed as it committed it): so a try again writes the
//! same key (`key`, chosen at the first try), and the receiving node takes
//! a key it took once never again (`Membership::first_take`). The holder
//! gets the order at most once.
//!
//! A newer order for the same open replaces a waiting one, and one that
//! is posted drops it; one being tried again is waited for first, so the
//! holder never gets an older order after a newer one. The queue is
//! bounded; an order pushed out of a full one falls back on the break
//! timeout.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nimbus_state::caching::BreakOrder;

/// Orders kept at most; a node that cannot reach etcd for its TTL while
/// thousands of breaks wait has lost its lease anyway.
const MAX_WAITING: usize = 4096;

/// How long after a failed try the next one is made: a leader election on
/// a loaded machine takes about a second.
pub const RETRY_EVERY: Duration = Duration::from_millis(250);

/// How long a newer order waits for an older one being tried again; more
/// than an etcd call takes, on every member.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);

/// A break order for `open_id` of incarnation `to`, under message key
/// `key` (in whichever node's box runs `to`), to be posted by `until`.
#[derive(Clone, Debug)]
pub struct Unposted {
    pub to: u64,
    pub open_id: u64,
    pub order: BreakOrder,
    pub key: String,
    pub until: Instant,
}

/// Keys of messages a node took lately, so that one written twice (its
/// sender tried again after an answer that never came) is acted on once.
#[derive(Default)]
pub struct TakenKeys {
    order: VecDeque<Vec<u8>>,
    keys: std::collections::HashSet<Vec<u8>>,
}

impl TakenKeys {
    /// Whether `key` was not taken before (it is noted now). The oldest
    /// keys are let go past `MAX_WAITING`: a copy written again comes
    /// within `until` of the first, while far fewer messages arrive.
    pub fn first(&mut self, key: &[u8]) -> bool {
        if self.keys.contains(key) {
            return false;
        }
        if self.order.len() >= MAX_WAITING {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
        self.order.push_back(key.to_vec());
        self.keys.insert(key.to_vec());
        true
    }
}

#[derive(Default)]
struct Queue {
    /// With the number each was kept under.
    waiting: VecDeque<(u64, Unposted)>,
    kept: u64,
    /// The open whose order is being tried again.
    in_flight: Option<u64>,
}

/// The orders waiting to be posted again.
#[derive(Default)]
pub struct Waiting {
    queue: Mutex<Queue>,
    changed: Condvar,
}

impl Waiting {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        crate::sync::lock(&self.queue)
    }

    /// Keeps `u` to be tried again, in place of any order for its open.
    /// The oldest order gives way when the queue is full.
    pub fn push(&self, u: Unposted) {
        let mut q = self.lock();
        q.waiting.retain(|(_, w)| w.open_id != u.open_id);
        if q.waiting.len() >= MAX_WAITING {
            q.waiting.pop_front();
        }
        q.kept += 1;
        let n = q.kept;
        q.waiting.push_back((n, u));
        self.changed.notify_all();
    }

    /// A newer order for `open_id` is about to be posted: a waiting older
    /// one is dropped, and one being tried is waited for.
    pub fn forget(&self, open_id: u64) {
        let mut q = self.lock();
        if q.waiting.is_empty() && q.in_flight.is_none() {
            return;
        }
        q.waiting.retain(|(_, w)| w.open_id != open_id);
        let until = Instant::now() + IN_FLIGHT_WAIT;
        while q.in_flight == Some(open_id) {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            q = match self.changed.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
    }

    /// The next order to try (it stays kept until `done`), waiting at
    /// most `idle` for one (None then, so that the caller sees its stop
    /// flag).
    pub fn next(&self, idle: Duration) -> Option<(u64, Unposted)> {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q = match self.changed.wait_timeout(q, idle) {
                Ok((q, _)) => q,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        let next = q.waiting.front().cloned()?;
        q.in_flight = Some(next.1.open_id);
        Some(next)
    }

    /// The try of the order kept as `n` ended: it goes (`settled`: posted,
    /// or given up), or stays to be tried again, unless a newer order for
    /// its open replaced it meanwhile.
    pub fn done(&self, n: u64, settled: bool) {
        let mut q = self.lock();
        q.in_flight = None;
        if settled {
            q.waiting.retain(|(kept, _)| *kept != n);
        }
        self.changed.notify_all();
    }

    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_state::caching::Holder;

    fn order(to: u32) -> BreakOrder {
        BreakOrder {
            holder: Holder::Oplock(7),
            from: 0x7,
            to,
            ack_required: true,
            epoch: 0,
            version: 0,
        }
    }

    fn unposted(open_id: u64, to: u32) -> Unposted {
        Unposted {
            to: 3,
            open_id,
            order: order(to),
            key: format!("3-{open_id}"),
            until: Instant::now() + Duration::from_secs(5),
        }
    }

    #[test]
    fn a_key_is_taken_once_and_the_oldest_are_let_go() {
        let mut t = TakenKeys::default();
        assert!(t.first(b"7-1"));
        assert!(!t.first(b"7-1"), "written again: not acted on again");
        for n in 2..=(MAX_WAITING as u64 + 1) {
            assert!(t.first(format!("7-{n}").as_bytes()));
        }
        assert!(t.first(b"7-1"), "let go past the bound");
        assert!(!t.first(format!("7-{MAX_WAITING}").as_bytes()));
    }

    fn next_to(w: &Waiting) -> Option<(u64, u32)> {
        w.next(Duration::ZERO).map(|(_, u)| (u.open_id, u.order.to))
    }

    #[test]
    fn a_newer_order_replaces_a_waiting_one_and_a_posted_one_drops_it() {
        let w = Waiting::default();
        w.push(unposted(1, 0x5));
        w.push(unposted(2, 0x1));
        w.push(unposted(1, 0x1));
        assert_eq!(w.len(), 2);
        let (n, u) = w.next(Duration::ZERO).unwrap();
        assert_eq!((u.open_id, u.order.to), (2, 0x1));
        // Not posted: it stays, and is tried first again.
        w.done(n, false);
        assert_eq!(next_to(&w), Some((2, 0x1)));
        let (n, _) = w.next(Duration::ZERO).unwrap();
        w.done(n, true);
        let (n, u) = w.next(Duration::ZERO).unwrap();
        assert_eq!(
            (u.open_id, u.order.to),
            (1, 0x1),
            "the newer order of open 1"
        );
        w.done(n, false);
        w.forget(1);
        assert!(w.is_empty());
        assert!(w.next(Duration::from_millis(10)).is_none());
    }

    #[test]
    fn a_try_that_a_newer_order_overtook_leaves_the_newer_one() {
        let w = Waiting::default();
        w.push(unposted(1, 0x5));
        let (n, _) = w.next(Duration::ZERO).unwrap();
        w.push(unposted(1, 0x1));
        w.done(n, true);
        assert_eq!(next_to(&w), Some((1, 0x1)));
    }

    #[test]
    fn a_newer_order_waits_for_an_older_one_being_tried() {
        let w = std::sync::Arc::new(Waiting::default());
        w.push(unposted(1, 0x5));
        let (n, _) = w.next(Duration::ZERO).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let forgetting = {
            let w = w.clone();
            std::thread::spawn(move || {
                w.forget(1);
                tx.send(()).unwrap();
            })
        };
        // Still in flight: the newer order is not posted yet.
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        w.done(n, true);
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        forgetting.join().unwrap();
        assert!(w.is_empty());
    }

    #[test]
    fn a_full_queue_lets_the_oldest_go() {
        let w = Waiting::default();
        for id in 0..(MAX_WAITING as u64 + 3) {
            w.push(unposted(id, 0));
        }
        assert_eq!(w.len(), MAX_WAITING);
        assert_eq!(next_to(&w).map(|(id, _)| id), Some(3));
    }
}
