//! Connections whose client has gone while their opens are still being
//! released.
//!
//! When a client closes a connection, the server releases its opens only
//! after the connection's writer and requests in flight have finished
//! (`connection::serve`), a few task hops later. A client that closes one
//! connection and at once opens the same file on another (smbtorture does
//! between tests; so does a program that reconnects) could otherwise be
//! refused by its own abandoned handles: SHARING_VIOLATION, or
//! DELETE_PENDING when its first request on the new connection deleted the
//! file those handles still hold. A CREATE refused for either reason while
//! other connections are being torn down waits (briefly, `WAIT`) for those
//! teardowns (`crate::leaving`) and looks again. So does a durable
//! reconnect that finds no disconnected open: the open it names may be on
//! its way there from the connection the client just left
//! (`look_after_others`).

use std::collections::HashSet;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::session::Channel;
use crate::sync::lock;

/// How long a refused CREATE waits for teardowns under way: they take
/// milliseconds; a longer wait would only delay a refusal that stands.
pub const WAIT: Duration = Duration::from_millis(500);

#[derive(Default)]
pub struct Teardowns {
    /// Connections being torn down, by address.
    under_way: Mutex<HashSet<usize>>,
    ended: Condvar,
    /// CREATEs waiting now (for tests: a wait that has begun).
    waiting: std::sync::atomic::AtomicUsize,
}

/// A connection's name here: its address (a connection that ends and
/// another made at the same address share it, which costs at most a wait
/// for the newer one).
pub fn id(conn: &dyn Channel) -> usize {
    conn as *const dyn Channel as *const () as usize
}

struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A teardown under way; it ends when dropped.
pub struct Mark<'a> {
    teardowns: &'a Teardowns,
    id: usize,
}

impl Drop for Mark<'_> {
    fn drop(&mut self) {
        lock(&self.teardowns.under_way).remove(&self.id);
        self.teardowns.ended.notify_all();
    }
}

impl Teardowns {
    /// `conn`'s client has gone; its opens are about to be released.
    pub fn begin(&self, conn: usize) -> Mark<'_> {
        lock(&self.under_way).insert(conn);
        Mark {
            teardowns: self,
            id: conn,
        }
    }

    /// Waits up to `limit` for the teardowns of connections other than
    /// `conn` under way now. Whether there were any and they all ended.
    pub fn wait_for_others(&self, conn: usize, limit: Duration) -> bool {
        let me = conn;
        let g = lock(&self.under_way);
        let those: Vec<usize> = g.iter().copied().filter(|c| *c != me).collect();
        if those.is_empty() {
            return false;
        }
        let deadline = Instant::now() + limit;
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _waited = Waiting(&self.waiting);
        nimbus_state::blocking::off_worker(|| {
            let mut g = g;
            loop {
                if those.iter().all(|c| !g.contains(c)) {
                    return true;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                g = self
                    .ended
                    .wait_timeout(g, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        })
    }
}

impl Teardowns {
    /// `look`s for what a teardown under way may be about to put in place
    /// (a durable open on its way to the disconnected table): when nothing
    /// is found while connections other than `conn` are being torn down,
    /// waits for them (up to `limit`) and looks once more.
    pub fn look_after_others<T>(
        &self,
        conn: usize,
        limit: Duration,
        mut look: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        look().or_else(|| self.wait_for_others(conn, limit).then(look).flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_create_waits_for_other_connections_teardowns_only() {
        let t = Teardowns::default();
        // Nothing under way, or only its own connection: no wait.
        assert!(!t.wait_for_others(1, WAIT));
        let own = t.begin(1);
        assert!(!t.wait_for_others(1, WAIT));
        drop(own);

        // Another connection's teardown: waited for until it ends.
        let other = t.begin(2);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| t.wait_for_others(1, Duration::from_secs(30)));
            // Ended once the wait has begun (its count is taken under the
            // lock the ending needs, so the wait sees the end).
            let deadline = Instant::now() + Duration::from_secs(10);
            while t.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the wait never began");
                std::thread::yield_now();
            }
            drop(other);
            assert!(waiter.join().unwrap());
        });

        // One that does not end within the limit: not waited for longer.
        let _stuck = t.begin(3);
        let start = Instant::now();
        assert!(!t.wait_for_others(1, Duration::from_millis(50)));
        assert!(start.elapsed() >= Duration::from_millis(50));
    }

    #[test]
    fn a_reconnect_finds_what_another_connections_teardown_puts_in_place() {
        let t = Teardowns::default();
        let kept = Mutex::new(None);
        let look = || *lock(&kept);
        // Nothing under way: not found, at once.
        assert_eq!(t.look_after_others(1, WAIT, look), None);

        // The open is put in place by a teardown under way: found once it
        // ends, though the first look came before.
        let other = t.begin(2);
        std::thread::scope(|s| {
            let reconnect = s.spawn(|| t.look_after_others(1, Duration::from_secs(30), look));
            let deadline = Instant::now() + Duration::from_secs(10);
            while t.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
                assert!(Instant::now() < deadline, "the wait never began");
                std::thread::yield_now();
            }
            *lock(&kept) = Some(7u64);
            drop(other);
            assert_eq!(reconnect.join().unwrap(), Some(7));
        });
    }
}
