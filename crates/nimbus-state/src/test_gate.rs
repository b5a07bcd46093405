//! A point in the code where a test holds a thread until it lets it go,
//! having learnt that the thread got there: a race made deterministic by
//! an explicit wait, not by a sleep.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Mutex;
use std::time::Duration;

/// Armed by a test (`arm`); the code under test passes it (`pass`).
#[derive(Default)]
pub struct TestGate(Mutex<Option<(SyncSender<()>, Receiver<()>)>>);

/// The test's side of an armed gate.
pub struct Held {
    reached: Receiver<()>,
    go: SyncSender<()>,
}

impl TestGate {
    /// The next `pass` stops until the returned `Held` lets it go.
    pub fn arm(&self) -> Held {
        let (reached_tx, reached) = sync_channel(0);
        let (go, go_rx) = sync_channel(0);
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some((reached_tx, go_rx));
        Held { reached, go }
    }

    /// Stops here when armed: says so, and waits to be let go.
    pub fn pass(&self) {
        let armed = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((reached, go)) = armed {
            let _ = reached.send(());
            let _ = go.recv();
        }
    }
}

impl Held {
    /// Waits until a thread is at the gate; panics after `within`.
    pub fn reached(&self, within: Duration) {
        self.reached
            .recv_timeout(within)
            .expect("no thread reached the gate");
    }

    /// Lets the thread at the gate go on.
    pub fn release(self) {
        let _ = self.go.send(());
    }
}
