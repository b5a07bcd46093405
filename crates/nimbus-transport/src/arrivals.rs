//! The order of a connection's requests, for the commands that end
//! handles. Data requests (READ, WRITE, IOCTL, QUERY_DIRECTORY, FLUSH) and
//! encrypted frames run on the blocking pool, side by side; a CLOSE, a
//! TREE_DISCONNECT or a LOGOFF that arrives after one of them must not end
//! a handle that request has not reached yet, or the request the client
//! sent first fails with FILE_CLOSED (smbtorture smb2.ioctl.bug14769 sends
//! an IOCTL and a CLOSE together). So every frame handed to the pool gets
//! an arrival number, and those commands wait until every frame of data
//! commands that arrived before theirs has finished. Frames that may wait
//! on another client (a CREATE held for a break, a blocking LOCK) and
//! encrypted frames, which cannot be looked into before they run, are not
//! waited for: a CLOSE held behind a CREATE that waits for a break this
//! very CLOSE would settle would wait out the break timeout.

use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a command that ends handles waits for earlier frames at most:
/// a frame stuck on a hung file system must not hold the CLOSE (and the
/// client's handle) for ever.
const LONGEST_WAIT: Duration = Duration::from_secs(30);

#[derive(Default)]
pub struct Arrivals {
    state: Mutex<State>,
    finished: Condvar,
}

#[derive(Default)]
struct State {
    next: u64,
    running: BTreeSet<u64>,
}

/// A frame on the pool; finished when dropped.
pub struct Arrival {
    arrivals: Arc<Arrivals>,
    seq: u64,
}

impl Arrival {
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        let mut s = self.arrivals.lock();
        s.running.remove(&self.seq);
        drop(s);
        self.arrivals.finished.notify_all();
    }
}

impl Arrivals {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers a frame about to be handed to the pool.
    pub fn start(self: &Arc<Self>) -> Arrival {
        let mut s = self.lock();
        let seq = s.next;
        s.next += 1;
        s.running.insert(seq);
        Arrival {
            arrivals: self.clone(),
            seq,
        }
    }

    /// A number for a frame that is not waited for (see `data_only`), so
    /// that it can wait for those before it.
    pub fn number(&self) -> u64 {
        let mut s = self.lock();
        let seq = s.next;
        s.next += 1;
        seq
    }

    /// Whether any frame is on the pool now: a frame that ends handles,
    /// which would run in place, is handed to the pool too then, to wait
    /// there.
    pub fn any_running(&self) -> bool {
        !self.lock().running.is_empty()
    }

    /// Blocks until no frame that arrived before `seq` is still running.
    /// Only ever called on the blocking pool.
    pub fn wait_for_earlier(&self, seq: u64) {
        let deadline = Instant::now() + LONGEST_WAIT;
        let mut s = self.lock();
        while s.running.first().is_some_and(|&first| first < seq) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    "a request that ends handles waited {LONGEST_WAIT:?} for earlier requests of its connection; it goes ahead"
                );
                return;
            }
            s = match self.finished.wait_timeout(s, left) {
                Ok((s, _)) => s,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_earlier_frames_only() {
        let a = Arc::new(Arrivals::default());
        assert!(!a.any_running());
        let first = a.start();
        let second = a.start();
        let third = a.start();
        assert!(a.any_running());
        // Nothing came before the first.
        a.wait_for_earlier(first.seq());
        let waiter = {
            let a = a.clone();
            let seq = third.seq();
            std::thread::spawn(move || a.wait_for_earlier(seq))
        };
        drop(first);
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "the second frame still runs");
        drop(second);
        waiter.join().unwrap();
        drop(third);
        assert!(!a.any_running());
    }
}
