//! Stopping on SIGTERM (or Ctrl-C) without leaving clients worse off than
//! a lost connection would.
//!
//! The order matters, so it is kept in one place:
//! 1. **Draining**: the listeners close, and every connection stops reading
//!    requests; those already read are answered, their responses written,
//!    then the connection's sessions end, which leaves its durable opens
//!    disconnected, waiting for their clients. The sockets stay open.
//! 2. The server does what must happen before clients learn anything: a
//!    cluster node hands its durable opens back to etcd and leaves
//!    (`crate::failover::hand_back`, `Membership::leave`).
//! 3. **Released**: the sockets close. A client that now reconnects to
//!    another node finds its handles there; had the socket closed first, it
//!    could have come back before they were.
//!
//! Requests a client sends after step 1 are never read: it sends them
//! again after its reconnect (as it does after any lost connection), so
//! nothing it was told is lost and nothing is done twice that it does not
//! know of.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{watch, Notify};

/// Where the server is in stopping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    Serving,
    Draining,
    Released,
}

pub struct Drain {
    stage: watch::Sender<Stage>,
    /// `nimbus drain`: new connections are closed at once while the
    /// node's clients move to other nodes.
    refusing: std::sync::atomic::AtomicBool,
    stop_requested: Notify,
    /// Connections whose sessions have not ended yet.
    live: AtomicUsize,
    idle: Notify,
}

/// A connection counted until its sessions have ended.
pub struct Live<'a>(&'a Drain);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        if self.0.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            stage: watch::Sender::new(Stage::Serving),
            refusing: std::sync::atomic::AtomicBool::new(false),
            stop_requested: Notify::new(),
            live: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

impl Drain {
    pub fn stage(&self) -> Stage {
        *self.stage.borrow()
    }

    pub fn watch(&self) -> watch::Receiver<Stage> {
        self.stage.subscribe()
    }

    pub fn connection_started(&self) -> Live<'_> {
        self.live.fetch_add(1, Ordering::SeqCst);
        Live(self)
    }

    /// Step 1; returns once every connection's sessions have ended, or
    /// after `within` (a request that does not finish does not hold the
    /// stop up for ever). Whether all did.
    pub async fn begin(&self, within: Duration) -> bool {
        self.stage.send_replace(Stage::Draining);
        let all_ended = async {
            loop {
                let idle = self.idle.notified();
                if self.live.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(within, all_ended).await.is_ok()
    }

    /// Step 3.
    pub fn release(&self) {
        self.stage.send_replace(Stage::Released);
    }

    /// How many connections have not ended their sessions yet.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// From now on new connections are closed at once (`nimbus drain`);
    /// false if they already were.
    pub fn refuse_new(&self) -> bool {
        !self.refusing.swap(true, Ordering::SeqCst)
    }

    /// Asks the process to stop as at SIGTERM (`nimbus drain`, its
    /// clients gone), once, and only while it serves: a stop already under
    /// way is left to finish. What `nimbus serve` waits on beside signals.
    pub fn request_stop(&self) {
        if self.stage() == Stage::Serving {
            self.stop_requested.notify_one();
        }
    }

    /// Resolves when `request_stop` was called.
    pub async fn stop_requested(&self) {
        self.stop_requested.notified().await
    }

    pub fn refusing_new(&self) -> bool {
        self.refusing.load(Ordering::SeqCst)
    }
}

/// Waits until `rx` reaches `stage` (or its sender is gone).
pub async fn reached(rx: &mut watch::Receiver<Stage>, stage: Stage) {
    let _ = rx.wait_for(|s| *s >= stage).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn begin_waits_for_every_connection_and_no_longer_than_asked() {
        let drain = Drain::default();
        assert!(
            drain.begin(Duration::from_millis(10)).await,
            "no connection"
        );
        let drain = std::sync::Arc::new(Drain::default());
        let d2 = drain.clone();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let conn = tokio::spawn(async move {
            let live = d2.connection_started();
            let mut rx = d2.watch();
            let _ = started_tx.send(());
            reached(&mut rx, Stage::Draining).await;
            drop(live);
            reached(&mut rx, Stage::Released).await;
        });
        started_rx.await.unwrap();
        assert!(drain.begin(Duration::from_secs(30)).await);
        assert_eq!(drain.live(), 0);
        assert!(!conn.is_finished(), "the socket is held until released");
        drain.release();
        conn.await.unwrap();
        // One that never ends is given up on.
        let stuck = drain.connection_started();
        assert!(!drain.begin(Duration::from_millis(20)).await);
        drop(stuck);
    }
}
