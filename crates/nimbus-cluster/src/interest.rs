//! Watches that a node holds only while it has a use for them.
//!
//! A node hears of another node's unlocks and break acknowledgements
//! through a watch on every shared file's lock or caching records. Held
//! all the time by every node, that watch sends each change of such a
//! record to all N nodes, though only a node with a request waiting on
//! that file does anything with it: the fan-out grows with N for nothing
//! (docs/SCALING.md). So the watch runs only while the node has waiting
//! requests, and `KEEP_FOR` after the last one, to spare a node whose
//! requests wait now and then the cost of starting it each time.
//!
//! The service that parks a request says so at once (the `Wake` returned),
//! and the watch starts from etcd's current revision after one look at
//! every waiting file (`tick(true)`): a change before that look is seen by
//! the look, one after by the watch. While the watch runs, `tick(false)`
//! looks at every waiting file once per `every`, as before.

use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::etcd_watch::Event;

use crate::cluster::Membership;

/// How long a watch stays after the node's last waiting request.
pub const KEEP_FOR: Duration = Duration::from_secs(10);

/// What a service calls when it parks a request on a file.
pub type Wake = Box<dyn Fn() + Send + Sync>;

/// Starts a thread (named `name`) that watches `prefix` while `waiting()`
/// says the node has requests waiting (and `KEEP_FOR` after), calling
/// `changed` with every change and `tick` as `watch_records` does. Returns
/// what the service calls when it parks a request.
pub fn watch_while_waiting(
    m: Arc<Membership>,
    name: &str,
    prefix: Vec<u8>,
    every: Duration,
    waiting: impl Fn() -> bool + Send + 'static,
    changed: impl Fn(&Event) + Send + 'static,
    tick: impl Fn(bool) + Send + 'static,
) -> Wake {
    let (tx, rx): (Sender<()>, Receiver<()>) = std::sync::mpsc::channel();
    let thread = name.to_owned();
    let spawned = std::thread::Builder::new()
        .name(thread.clone())
        .spawn(move || follow(&m, &thread, &prefix, every, &rx, &waiting, &changed, &tick));
    if let Err(e) = spawned {
        tracing::error!("cluster: cannot start the {name} thread: {e}");
    }
    Box::new(move || {
        let _ = tx.send(());
    })
}

#[allow(clippy::too_many_arguments)]
fn follow(
    m: &Membership,
    name: &str,
    prefix: &[u8],
    every: Duration,
    wake: &Receiver<()>,
    waiting: &dyn Fn() -> bool,
    changed: &dyn Fn(&Event),
    tick: &dyn Fn(bool),
) {
    let mut watch = None;
    let mut last_tick = Instant::now();
    let mut idle_since: Option<Instant> = None;
    while !m.is_stopping() {
        if watch.is_none() {
            // Nothing waits: sleep until a service parks a request (or,
            // once per `every`, look anyway: a request parked before the
            // service could tell).
            if !waiting() {
                if let Err(std::sync::mpsc::RecvTimeoutError::Disconnected) =
                    wake.recv_timeout(every)
                {
                    return;
                }
                while wake.try_recv().is_ok() {}
                continue;
            }
            match m.store.revision() {
                Ok(r) => {
                    tick(true);
                    last_tick = Instant::now();
                    idle_since = None;
                    watch = Some(m.store.watch(prefix, r + 1));
                }
                Err(e) => {
                    tracing::warn!("cluster: watching {name}: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            }
        }
        crate::cluster::deliver_next(&mut watch, every, name, changed);
        // The watch runs already: a parked request needs nothing more.
        while wake.try_recv().is_ok() {}
        if last_tick.elapsed() >= every {
            tick(false);
            last_tick = Instant::now();
            if waiting() {
                idle_since = None;
            } else if idle_since.get_or_insert_with(Instant::now).elapsed() >= KEEP_FOR {
                watch = None;
            }
        }
    }
}
