//! Watching a key range of etcd: a gRPC watch stream (`crate::etcd_rpc`),
//! kept open by a task on the store's runtime, its changes handed to the
//! synchronous caller in batches. A cluster node watches what other nodes
//! ask of it (an ownership it must hand back) and the records its waiting
//! requests depend on.
//!
//! A stream that fails or ends is opened again (on the next member in
//! turn) from the revision after the last change delivered: nothing is
//! missed and nothing is delivered twice. When etcd has compacted that
//! revision away, the batch says `resync` and the caller reads the range
//! afresh.
//!
//! On a sealed store (`crate::etcd_seal`), a change whose value has no
//! valid tag is not delivered: the watcher keeps what it knew, and a read
//! of the record itself is refused.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::WatchOptions;

use crate::etcd_rpc::Members;
use crate::etcd_seal::{RecordKey, FORGED};
use crate::store::StateError;

/// One change of a watched key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The key, without the store's prefix.
    pub key: Vec<u8>,
    /// The new value; None: deleted (or its lease expired).
    pub value: Option<Vec<u8>>,
    pub revision: u64,
}

/// What one wait brought.
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<Event>,
    /// Changes were compacted away before they could be delivered: the
    /// caller must read the whole range again.
    pub resync: bool,
}

/// How long the task waits before it opens a stream again after every
/// member failed.
const RETRY_AFTER: Duration = Duration::from_millis(200);

/// etcd's event types (mvccpb.Event.EventType).
const DELETE: i32 = 1;

pub struct Watch {
    batches: std::sync::mpsc::Receiver<Result<Batch, StateError>>,
    next_revision: Arc<AtomicU64>,
    /// An error is waiting in `batches`, not yet taken by `next`: the task
    /// sends no other until it is (see `Follow::error_waiting`).
    error_waiting: Arc<AtomicBool>,
    /// Dropped with the watch: its task ends.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Watch {
    /// Takes every error waiting, unread, and says how many there were
    /// (the test of `error_waiting`, in etcd_store.rs).
    #[cfg(test)]
    pub(crate) fn take_waiting_errors(&mut self) -> usize {
        let mut waiting = 0;
        while let Ok(Err(_)) = self.batches.try_recv() {
            waiting += 1;
        }
        waiting
    }

    pub(crate) fn new(
        members: Arc<Members>,
        store_prefix: Vec<u8>,
        key: Vec<u8>,
        range_end: Vec<u8>,
        start_revision: u64,
        timeout: Duration,
        seal: Option<Arc<RecordKey>>,
    ) -> Watch {
        let (tx, batches) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let next_revision = Arc::new(AtomicU64::new(start_revision));
        let error_waiting = Arc::new(AtomicBool::new(false));
        let task = Follow {
            error_waiting: error_waiting.clone(),
            members: members.clone(),
            store_prefix,
            key,
            range_end,
            next_revision: next_revision.clone(),
            timeout,
            seal,
            tx,
        };
        members.spawn(async move {
            tokio::select! {
                _ = stopped => {}
                _ = task.run() => {}
            }
        });
        Watch {
            batches,
            next_revision,
            error_waiting,
            _stop: stop,
        }
    }

    /// The revision the next change delivered will be at or after.
    pub fn next_revision(&self) -> u64 {
        self.next_revision.load(Ordering::SeqCst)
    }

    /// Waits up to `wait` for changes. An empty batch: none came. Err: no
    /// member could be reached (the watch goes on trying).
    pub fn next(&mut self, wait: Duration) -> Result<Batch, StateError> {
        let until = Instant::now() + wait;
        let first = crate::blocking::off_worker(|| self.batches.recv_timeout(wait));
        let mut batch = match first {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                self.error_waiting.store(false, Ordering::SeqCst);
                return Err(e);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(Batch::default()),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(StateError::Unavailable("etcd watch: ended".into()))
            }
        };
        // What else has come meanwhile goes in the same batch.
        while Instant::now() < until {
            match self.batches.try_recv() {
                Ok(Ok(more)) => {
                    batch.events.extend(more.events);
                    batch.resync |= more.resync;
                }
                // An error after changes: the changes go now, and the
                // task may tell of the next failure.
                Ok(Err(_)) => {
                    self.error_waiting.store(false, Ordering::SeqCst);
                    break;
                }
                Err(_) => break,
            }
        }
        Ok(batch)
    }
}

/// The task behind a `Watch`.
struct Follow {
    members: Arc<Members>,
    store_prefix: Vec<u8>,
    key: Vec<u8>,
    range_end: Vec<u8>,
    next_revision: Arc<AtomicU64>,
    timeout: Duration,
    seal: Option<Arc<RecordKey>>,
    tx: std::sync::mpsc::Sender<Result<Batch, StateError>>,
    /// Set when an error is sent, cleared when the caller takes it: while
    /// etcd is out of reach the task fails every `RETRY_AFTER`, faster than
    /// a caller that waits after each error reads them, and errors left
    /// in the channel would pile up for as long as the outage lasts.
    error_waiting: Arc<AtomicBool>,
}

impl Follow {
    async fn run(self) {
        let mut member = self.members.first_for_watch(&self.members.endpoints());
        let mut failures: Vec<String> = Vec::new();
        loop {
            let list = self.members.endpoints();
            let n = list.len();
            let endpoint = list[member % n].clone();
            match self.follow(&endpoint).await {
                Ok(()) => failures.clear(),
                Err(e) => failures.push(format!("{}: {e}", endpoint.url)),
            }
            member += 1;
            if failures.len() >= n {
                if !self.error_waiting.swap(true, Ordering::SeqCst) {
                    let why = format!("etcd watch: no member answered ({})", failures.join("; "));
                    if self.tx.send(Err(StateError::Unavailable(why))).is_err() {
                        return;
                    }
                }
                failures.clear();
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }

    /// Follows the stream of one member until it fails. Ok: it delivered
    /// something before it ended.
    async fn follow(&self, endpoint: &crate::etcd_rpc::Endpoint) -> Result<(), String> {
        let mut client = self
            .members
            .client(endpoint, self.timeout)
            .await
            .map_err(|e| e.to_string())?
            .watch_client()
            .max_decoding_message_size(crate::etcd_rpc::MAX_RESPONSE);
        let options = WatchOptions::new()
            .with_range(self.range_end.clone())
            .with_start_revision(self.next_revision.load(Ordering::SeqCst) as i64);
        let opened =
            tokio::time::timeout(self.timeout, client.watch(self.key.clone(), Some(options)));
        let mut stream = match opened.await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("no answer within {:?}", self.timeout)),
        };
        let mut delivered = false;
        loop {
            let message = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) if delivered => return Ok(()),
                Ok(None) => return Err("stream ended".into()),
                Err(_) if delivered => return Ok(()),
                Err(e) => return Err(e.to_string()),
            };
            delivered = true;
            let mut batch = Batch::default();
            if message.canceled() {
                let compacted = message.compact_revision();
                if compacted > 0 {
                    // The next stream starts where etcd still has history;
                    // the caller reads the range afresh.
                    self.next_revision.store(compacted as u64, Ordering::SeqCst);
                    batch.resync = true;
                    let _ = self.tx.send(Ok(batch));
                    return Ok(());
                }
                return Err(format!("watch canceled: {}", message.cancel_reason()));
            }
            for e in message.events() {
                let Some(kv) = e.kv() else { continue };
                let Some(key) = kv.key().strip_prefix(self.store_prefix.as_slice()) else {
                    continue;
                };
                let revision = kv.mod_revision().max(0) as u64;
                self.next_revision.fetch_max(revision + 1, Ordering::SeqCst);
                let value = match (e.0.r#type != DELETE, &self.seal) {
                    (false, _) => None,
                    (true, None) => Some(kv.value().to_vec()),
                    (true, Some(seal)) => match seal.open(kv.key(), kv.value()) {
                        Some(v) => Some(v.to_vec()),
                        None => {
                            tracing::warn!(
                                "etcd watch: {FORGED}: {}; not delivered",
                                kv.key().escape_ascii()
                            );
                            continue;
                        }
                    },
                };
                batch.events.push(Event {
                    key: key.to_vec(),
                    value,
                    revision,
                });
            }
            if !batch.events.is_empty() && self.tx.send(Ok(batch)).is_err() {
                return Ok(());
            }
        }
    }
}
