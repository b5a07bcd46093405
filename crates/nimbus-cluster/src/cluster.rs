//! Cluster membership (`[cluster]`): this node's record in etcd,
//! `nodes/<name>` holding the address clients reach it at, under a lease
//! of `node_ttl_secs` that a task renews every third of it. A node that
//! dies stops renewing, and its record (and everything else under the
//! same lease: its incarnation record, and with it the ownership of the
//! files it held, `ClusterStore`) goes when the lease expires. SIGTERM
//! revokes the lease: the node leaves at once.
//!
//! A node whose lease is not proven within its TTL (etcd out of reach), or
//! that finds etcd ended it, has lost it: other nodes may have taken its
//! files and decided over its opens by then. It drops its clients'
//! connections (they reconnect and reclaim their handles, through any
//! node, as after a crash), forgets what it held, and decides nothing
//! until it has joined again, without a restart, as a new incarnation:
//! what remains in etcd of the old one is then a gone node's to every
//! node, itself included. Every write a node makes for its clients is
//! conditioned in etcd on its incarnation record, which lives under its
//! lease (`EtcdStore::fence_on`), so a write that arrives late fails.
//!
//! Each run of a node is an incarnation, numbered from a counter in etcd
//! and registered as `incarnations/<n>` under the node's lease: open ids
//! (the persistent half of FileIds) are `n << 40 | counter`, unique across
//! the cluster and its restarts, and an open whose incarnation record is
//! gone belongs to a node that died (`is_gone`).
//!
//! Share modes, byte-range locks, oplocks and leases are decided through
//! `ClusterStore` (per-file ownership over etcd). A break for an open of
//! another node is a message to it: `msg/<node>/<sender incarnation>-<n>`
//! (the node named by the open's incarnation record),
//! under the sender's lease, which the receiver watches, delivers to its
//! client and deletes. Requests a client's request waits on (ending a
//! session, closing an application's opens, applying a lease break's
//! acknowledgement) go the same way and are answered (`ask_nodes`).
//! Directory leases (`crate::dir_leases`), change notify
//! (`crate::cluster_notify`) and the failover of durable and persistent
//! handles (`nimbus_node::failover`) build on these.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use nimbus_state::cluster_store::ClusterStore;
use nimbus_state::etcd_store::{Cmp, Op, Txns, MAX_TXNS_PER_REQUEST};
use nimbus_state::{EtcdStore, StateError, StateStore, Versioned};

use crate::config::ClusterConfig;

/// Every key of a Nimbus cluster starts with this in etcd.
pub const KEY_PREFIX: &[u8] = b"/nimbus/";

/// Key prefix of the membership records.
pub const NODES_PREFIX: &[u8] = b"nodes/";

/// Key prefix of the incarnation records; the counter they are drawn from.
pub const INCARNATIONS_PREFIX: &[u8] = b"incarnations/";
const INCARNATION_COUNTER: &[u8] = b"incarnation-counter";

/// The layout of the cluster's records, which every node must share: a
/// node that keys files otherwise sees none of the others' records of a
/// file, and two clients on two nodes could both hold it exclusively.
/// Each node writes its layout as `layouts/<node>`, under its lease, in
/// the transaction that registers it: what a running node writes, not
/// what some node once wrote (a cluster key would outlive a rollback).
const LAYOUTS_PREFIX: &[u8] = b"layouts/";
/// Files keyed by device, inode and generation, and held under directory
/// claims (`newin/`), which a take compares (2026-12-05). Releases before
/// wrote "file-key-with-generation" (no claims: they would take a file
/// held under one), or no layout (files keyed by device and inode).
const LAYOUT: &[u8] = b"file-key-with-generation;directory-claims";

/// Key prefix of the messages between nodes: `msg/<node>/...`.
pub const MSG_PREFIX: &[u8] = b"msg/";

/// What resumes a reconnect that waits for another node to let go of its
/// open.
pub type LetGoWait = Box<dyn FnOnce() + Send>;

/// Requests to let go that may wait for an answer at once, node-wide;
/// beyond, a reconnect that would ask fails as if nothing held its open.
const MAX_LET_GO_WAITS: usize = 4096;
/// Requests to let go one session may make in `LET_GO_ASK_WINDOW`: a
/// client reconnects its handles once each after a move, so a few dozen
/// is generous, and more is a client probing FileIds.
const LET_GO_ASKS_PER_SESSION: u32 = 64;
const LET_GO_ASK_WINDOW: Duration = Duration::from_secs(10);

/// Lease break acknowledgements this node sends on to the other nodes in
/// each second, whoever sent them: a client acknowledges on another
/// node's connection rarely (two connections under one ClientGuid), and
/// each forward costs etcd writes on every node, so acknowledgements of
/// made-up leases from any number of sessions cannot become a flood.
const ACK_FORWARDS_PER_SECOND: u32 = 16;

/// Open ids are `incarnation << OPEN_ID_SHIFT | random bits`.
pub const OPEN_ID_SHIFT: u32 = 40;
/// Incarnations fit in the 24 bits above the counter.
const MAX_INCARNATION: u64 = (1 << (64 - OPEN_ID_SHIFT)) - 1;

/// The incarnation an open id was made by (0: a node without a cluster).
pub fn incarnation_of(open_id: u64) -> u64 {
    open_id >> OPEN_ID_SHIFT
}

pub(crate) fn message_box(node: &str) -> Vec<u8> {
    let mut k = MSG_PREFIX.to_vec();
    k.extend_from_slice(node.as_bytes());
    k.push(b'/');
    k
}

fn incarnation_key(n: u64) -> Vec<u8> {
    let mut k = INCARNATIONS_PREFIX.to_vec();
    k.extend_from_slice(n.to_string().as_bytes());
    k
}

/// How long one etcd call may take at most, all endpoints tried.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// How long one etcd call may take with a lease of `ttl`: within it, so
/// that a renewal that fails leaves time for another. (A call made for a
/// client also ends when the proof of the lease does: `EtcdStore`.)
fn call_timeout(ttl: Duration) -> Duration {
    CALL_TIMEOUT.min(ttl * 3 / 4)
}

pub struct Membership {
    /// For the node's decisions: fenced on its lease.
    pub store: Arc<EtcdStore>,
    /// For the lease itself and the node's registration, which must go
    /// on when the lease is not proven.
    control: EtcdStore,
    pub node: String,
    pub advertise: SocketAddr,
    ttl: Duration,
    /// The lease the membership record lives under (0: none).
    lease: AtomicI64,
    /// This run's number (see the module's comment).
    incarnation: AtomicU64,
    /// Incarnations of earlier runs whose persistent opens this node
    /// restored: registered under its lease, alive while it is.
    adopted: Mutex<HashSet<u64>>,
    /// Incarnations found gone: they never come back.
    gone: Mutex<HashSet<u64>>,
    /// Incarnations found alive, and when: a file shared between nodes
    /// checks the other nodes' opens on every change, and an answer a
    /// moment old only delays dropping a dead node's entries by that much.
    alive: Mutex<std::collections::HashMap<u64, Instant>>,
    /// The live incarnations as a watch on `incarnations/` last showed
    /// them (`follow_incarnations`): an incarnation found there is alive
    /// without a read. With many nodes' opens in one shared file's
    /// records, the 1-second look-ups above were some N reads a second
    /// per node (issue 49).
    live: Mutex<LiveIncarnations>,
    /// Bumped whenever the copy of `incarnations/` changes (a run joined
    /// or went), for those who follow the membership
    /// (`Membership::membership_changes`).
    changed: tokio::sync::watch::Sender<u64>,
    /// The store whose ownerships end with the lease (through the
    /// incarnation record on it).
    owned: OnceLock<Arc<ClusterStore>>,
    /// When the last registration or renewal that etcd answered was sent:
    /// the lease lasts at least the TTL from then.
    last_proof: Mutex<Option<Instant>>,
    /// The lease is lost (see the module comment) and the node has not
    /// joined again yet.
    lost: AtomicBool,
    /// Run (on the lease thread) when the lease is lost, before the node
    /// joins again: what drops the clients' connections.
    on_lease_lost: Mutex<Vec<LeaseLost>>,
    /// Set at shutdown: the ownership threads end.
    stopping: Arc<AtomicBool>,
    /// Numbers the messages this run sends.
    next_message: AtomicU64,
    /// Run after the node registered again under a new lease (what lived
    /// under the old one is gone from etcd).
    on_new_lease: Mutex<Vec<NewLease>>,
    /// This node's persistent opens: their files' records stay in etcd
    /// (never owned), so that they outlive the node.
    pinned: Mutex<HashSet<u64>>,
    /// Durable opens of this node (its incarnation's, or an adopted one's)
    /// it let go of for their clients on other nodes while it lives
    /// (`nimbus_node::failover::let_go`): another node serves them now, whose
    /// breaks this node forwards, and their entries are not this node's to
    /// decide from memory. Each is kept until its record is gone.
    released: Mutex<HashSet<u64>>,
    /// This node's requests to let go of an open that wait for the other
    /// node's answer (open id, request number), each with what resumes
    /// its reconnect (`nimbus_node::failover::reclaim`).
    let_go_waits: Mutex<std::collections::HashMap<(u64, u64), (LetGoWait, tokio::runtime::Handle)>>,
    /// Requests to let go asked for each session lately: one session may
    /// not make this node flood other nodes with them.
    let_go_asks: Mutex<std::collections::HashMap<u64, (Instant, u32)>>,
    /// Acknowledgements sent on in the current second, and when it began.
    ack_forwards: Mutex<(Instant, u32)>,
    /// Requests to other nodes a client's request waits on the answers
    /// to, by request number (`ask_nodes`).
    answer_waits: Mutex<std::collections::HashMap<u64, std::sync::mpsc::SyncSender<u8>>>,
    /// Opens of gone nodes found with a persistent record, and when.
    with_record: Mutex<std::collections::HashMap<u64, Instant>>,
    /// Opens of gone nodes found without one: it never comes back.
    without_record: Mutex<HashSet<u64>>,
    /// Break orders etcd did not take, to be posted again
    /// (`post_unposted`).
    unposted: crate::unposted::Waiting,
    /// Keys of the messages this node took lately (`first_take`).
    taken: Mutex<crate::unposted::TakenKeys>,
    /// Test hook: the next rejoin, once registered under its new lease,
    /// says so on the first channel and goes on when the second hears.
    #[cfg(test)]
    rejoin_gate: nimbus_state::test_gate::TestGate,
}

/// Puts back what a node keeps under its lease, given the new lease.
pub type NewLease = Box<dyn Fn(i64) + Send + Sync>;

/// Gives up what a node's clients hold, its lease lost.
pub type LeaseLost = Box<dyn Fn() + Send + Sync>;

/// How often ownerships of files nobody has open are looked for, and how
/// long such a file is kept (a file opened again soon costs no etcd call).
const SWEEP_EVERY: Duration = Duration::from_secs(5);
const SWEEP_IDLE: Duration = Duration::from_secs(30);

/// How often the ownership records of node runs that are gone are looked
/// for and deleted (`ClusterStore::clear_gone_owners`; also at start):
/// a file's lookup clears its own, so these are only of files nobody
/// opened since, and a pass reads every ownership record.
const CLEAR_GONE_OWNERS_EVERY: Duration = Duration::from_secs(600);

/// How long an incarnation found alive is taken to be, without asking.
const ALIVE_FOR: Duration = Duration::from_secs(1);

/// How long the watch of `incarnations/` may go without answering before
/// its copy is no longer trusted (`is_gone` reads etcd again).
const LIVE_FRESH: Duration = Duration::from_secs(3);

/// Waits up to `every` on `watch` and hands its changes to `changed`; a
/// watch that fell behind etcd's compaction is dropped (None), for the
/// caller to read the range whole and start it again.
pub(crate) fn deliver_next(
    watch: &mut Option<nimbus_state::etcd_watch::Watch>,
    every: Duration,
    name: &str,
    changed: &dyn Fn(&nimbus_state::etcd_watch::Event),
) {
    let Some(w) = watch.as_mut() else {
        return;
    };
    match w.next(every) {
        Ok(batch) => {
            if batch.resync {
                *watch = None;
            }
            for e in &batch.events {
                changed(e);
            }
        }
        Err(e) => {
            tracing::warn!("cluster: watching {name}: {e}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// How often the copy of `incarnations/` is read whole though its watch
/// keeps it.
const LIVE_COPY_AGAIN: Duration = Duration::from_secs(60);

/// The copy of `incarnations/` (`Membership::follow_incarnations`).
#[derive(Default)]
struct LiveIncarnations {
    numbers: HashSet<u64>,
    /// When the watch last answered (None: no copy yet, or it was lost).
    heard: Option<Instant>,
}

impl LiveIncarnations {
    fn says_alive(&self, incarnation: u64) -> bool {
        self.heard.is_some_and(|at| at.elapsed() < LIVE_FRESH)
            && self.numbers.contains(&incarnation)
    }
}

/// The incarnation an `incarnations/<n>` key names.
fn incarnation_of_key(key: &[u8]) -> Option<u64> {
    std::str::from_utf8(key.strip_prefix(INCARNATIONS_PREFIX)?)
        .ok()?
        .parse()
        .ok()
}

/// How long an operation waits for another node to hand a file over:
/// past it, that node's lease has expired, and its ownership with the
/// incarnation record on the lease.
fn handover_timeout(ttl: Duration) -> Duration {
    ttl * 2 + Duration::from_secs(2)
}

/// The store share modes, byte-range locks, oplocks and leases are decided
/// in: per-file ownership over etcd, naming this node's incarnation. A file may be
/// taken when every open its records name (opens in the share-mode record,
/// lock holders in the lock record, opens and holders in the caching
/// record) is this node's or a gone node's, and no break is under way (a
/// request on another node waits for its acknowledgement, and hears of it
/// through etcd).
pub fn owned_store(m: &Arc<Membership>) -> Arc<ClusterStore> {
    use nimbus_state::caching::FileCaching;
    use nimbus_state::records::{LockList, Record, CACHING_PREFIX, LOCKS_PREFIX};
    use nimbus_state::share_modes::OPENS_PREFIX;
    let me = m.clone();
    let claimable: nimbus_state::cluster_store::Claimable = Box::new(move |key, value| {
        // A persistent open, this node's or a gone node's waiting for its
        // client, keeps its file's records in etcd: they must outlive any
        // one node.
        let ours = |open_id: u64| {
            if incarnation_of(open_id) == me.incarnation() {
                !me.is_pinned(open_id)
            } else {
                me.open_is_gone(open_id)
            }
        };
        if key.starts_with(OPENS_PREFIX) {
            nimbus_state::FileRecord::decode(value)
                .is_ok_and(|r| r.opens.iter().all(|o| ours(o.open_id)))
        } else if key.starts_with(LOCKS_PREFIX) {
            LockList::decode(value).is_ok_and(|l| l.0.iter().all(|l| ours(l.owner)))
        } else if key.starts_with(CACHING_PREFIX) {
            FileCaching::decode(value).is_ok_and(|c| {
                !c.breaking()
                    && c.opens.iter().all(|o| ours(o.open_id))
                    && c.grants.iter().all(|g| g.opens.iter().all(|o| ours(*o)))
            })
        } else {
            false
        }
    });
    Arc::new(ClusterStore::new(
        m.store.clone(),
        CLUSTERED.to_vec(),
        INCARNATIONS_PREFIX,
        &m.incarnation().to_string(),
        m.lease(),
        claimable,
        handover_timeout(m.ttl),
    ))
}

/// Why this node could not reach or join its cluster. Each names the
/// `[cluster]` key concerned and, where there is one, the fix: the
/// operator reads it at start (`nimbus serve`, `nimbus status`).
#[derive(Debug)]
pub enum JoinError {
    /// A file `[cluster]` names cannot be read.
    File {
        key: &'static str,
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    PasswordNotText(std::path::PathBuf),
    PasswordEmpty {
        path: std::path::PathBuf,
        user: String,
    },
    /// No etcd client from `[cluster] etcd` and its TLS files.
    Client(nimbus_state::etcd_store::EndpointError),
    /// `secret_file` holds no usable cluster key.
    Secret {
        path: std::path::PathBuf,
        why: String,
    },
    /// etcd refused this node's user its keys.
    Denied(StateError),
    /// etcd does not answer.
    Unreachable(StateError),
    /// Writing to etcd failed otherwise.
    Writing(StateError),
    /// The members refuse as many transactions in one request as the
    /// node sends together (their `--max-txn-ops` is too low).
    TxnOps(StateError),
    /// The node's record or its run's number could not be written.
    Registering {
        what: &'static str,
        error: StateError,
    },
    /// Another running node has this node's name.
    NameTaken(String),
    /// The running nodes key their records another way (another release).
    Layout(String),
}

impl JoinError {
    /// `error` of a call to etcd: a refusal of this node's user, or
    /// `otherwise`.
    fn of(error: StateError, otherwise: fn(StateError) -> JoinError) -> JoinError {
        if error.to_string().contains("permission denied") {
            JoinError::Denied(error)
        } else {
            otherwise(error)
        }
    }
}

impl std::fmt::Display for JoinError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinError::File { key, path, error } => {
                write!(f, "[cluster] {key}: {}: {error}", path.display())
            }
            JoinError::PasswordNotText(path) => write!(
                f,
                "[cluster] password_file: {} is not UTF-8 text",
                path.display()
            ),
            JoinError::PasswordEmpty { path, user } => write!(
                f,
                "[cluster] password_file: {} is empty; write the etcd password of user \"{user}\" in it",
                path.display()
            ),
            JoinError::Client(e) => write!(f, "[cluster] etcd: {e}"),
            JoinError::Secret { path, why } => {
                write!(f, "[cluster] secret_file: {}: {why}", path.display())
            }
            JoinError::Denied(e) => {
                let prefix = String::from_utf8_lossy(KEY_PREFIX);
                write!(
                    f,
                    "[cluster] etcd: this node's etcd user may not read and write the keys under \
                     {prefix} ({e}); grant its role readwrite on that prefix, e.g. `etcdctl role \
                     grant-permission nimbus --prefix=true readwrite {prefix}` (see docs/SECURITY.md)"
                )
            }
            JoinError::Unreachable(e) => write!(
                f,
                "[cluster] etcd: the cluster does not answer ({e}); start etcd, or fix the \
                 client URLs in [cluster] etcd"
            ),
            JoinError::Writing(e) => write!(f, "[cluster] etcd: writing: {e}"),
            JoinError::TxnOps(e) => write!(
                f,
                "[cluster] etcd: the members refuse {MAX_TXNS_PER_REQUEST} transactions sent \
                 together ({e}); this node sends the takes of files opened at once that way: \
                 start each etcd member with --max-txn-ops={TXN_OPS_NEEDED} or more (etcd's \
                 default, 128, is enough; see docs/SCALING.md)"
            ),
            JoinError::Registering {
                what,
                error: error @ StateError::Corrupt(nimbus_state::etcd_seal::FORGED),
            } => write!(
                f,
                "[cluster] secret_file: {what}: {error}; every node of a cluster needs the same \
                 secret: copy the running nodes' secret_file to this node (see docs/SECURITY.md)"
            ),
            JoinError::Registering { what, error } => write!(f, "[cluster]: {what}: {error}"),
            JoinError::NameTaken(node) => write!(
                f,
                "[cluster] node: another running node is registered as \"{node}\" (its record \
                 outlived node_ttl_secs); give this node a name of its own"
            ),
            JoinError::Layout(why) => write!(
                f,
                "[cluster] etcd: {why}; nodes that key files differently would not see each \
                 other's opens and locks: stop every node, then start them all on one release \
                 (see docs/CLUSTER.md, \"Upgrades\")"
            ),
        }
    }
}

/// How this node reaches etcd, from the files `[cluster]` names.
fn etcd_access(cfg: &ClusterConfig) -> Result<nimbus_state::etcd_store::Access, JoinError> {
    let read = |key: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|error| JoinError::File {
            key,
            path: path.to_path_buf(),
            error,
        })
    };
    let mut access = nimbus_state::etcd_store::Access::default();
    if let Some(tls) = &cfg.tls {
        access.ca_pem = Some(read("ca_file", &tls.ca_file)?);
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            access.identity = Some((read("cert_file", cert)?, read("key_file", key)?));
        }
    }
    if let Some((user, file)) = &cfg.user {
        let password = String::from_utf8(read("password_file", file)?)
            .map_err(|_| JoinError::PasswordNotText(file.clone()))?;
        // One line; the newline an editor adds is not part of it.
        let password = password.trim_end_matches(['\r', '\n']).to_string();
        if password.is_empty() {
            return Err(JoinError::PasswordEmpty {
                path: file.clone(),
                user: user.clone(),
            });
        }
        access.user = Some((user.clone(), password));
    }
    Ok(access)
}

/// How soon a lease renewal that failed is tried again.
const RENEW_RETRY: Duration = Duration::from_millis(250);

/// Key prefix of the write a node makes at start to prove its etcd user
/// may write the cluster's keys.
const PROBE_PREFIX: &[u8] = b"probe/";

/// The kinds of records a node takes a file's ownership of together
/// (`ClusterStore`).
const CLUSTERED: [&[u8]; 3] = [
    nimbus_state::share_modes::OPENS_PREFIX,
    nimbus_state::records::LOCKS_PREFIX,
    nimbus_state::records::CACHING_PREFIX,
];

/// The `--max-txn-ops` etcd needs for the largest request a node sends:
/// `MAX_TXNS_PER_REQUEST` takes together, etcd checking each nested
/// transaction's operations (a compare and a read of the ownership and of
/// each record) against the limit less the outer count.
const TXN_OPS_NEEDED: usize = MAX_TXNS_PER_REQUEST + 1 + CLUSTERED.len();

/// Sends, reading only, a request of the shape of the largest a node
/// sends (`TXN_OPS_NEEDED`), so that members that would refuse it are
/// found at start, not when many clients open files at once.
fn takes_fit(store: &EtcdStore, probe: &[u8]) -> Result<(), StateError> {
    let cmps = [Cmp::Absent(probe); 1 + CLUSTERED.len()];
    let reads = [Op::Get(probe); 1 + CLUSTERED.len()];
    let each: Vec<Txns<'_>> = (0..MAX_TXNS_PER_REQUEST)
        .map(|_| Txns {
            cmps: &cmps,
            success: &[],
            failure: &reads,
        })
        .collect();
    store.txns(&each).map(|_| ())
}

/// The cluster's store, as `[cluster]` says to reach it and to tag its
/// records; each call within `timeout`.
fn open_store(
    cfg: &ClusterConfig,
    access: nimbus_state::etcd_store::Access,
    timeout: Duration,
) -> Result<EtcdStore, JoinError> {
    let store = EtcdStore::with_access(&cfg.etcd, KEY_PREFIX, timeout, access)
        .map_err(JoinError::Client)?;
    let Some(file) = &cfg.secret_file else {
        return Ok(store);
    };
    let secret = std::fs::read(file).map_err(|e| JoinError::Secret {
        path: file.clone(),
        why: e.to_string(),
    })?;
    let key = nimbus_state::etcd_seal::RecordKey::from_secret(&secret).map_err(|why| {
        JoinError::Secret {
            path: file.clone(),
            why: why.to_string(),
        }
    })?;
    Ok(store.sealed(Arc::new(key)))
}

/// `open_store` for a command that reads the cluster (`nimbus status`).
pub fn reader_store(cfg: &ClusterConfig, timeout: Duration) -> Result<EtcdStore, JoinError> {
    open_store(cfg, etcd_access(cfg)?, timeout)
}

/// A member as etcd lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    pub advertise: String,
}

fn node_key(node: &str) -> Vec<u8> {
    let mut k = NODES_PREFIX.to_vec();
    k.extend_from_slice(node.as_bytes());
    k
}

fn layout_key(node: &str) -> Vec<u8> {
    [LAYOUTS_PREFIX, node.as_bytes()].concat()
}

impl Membership {
    /// Connects to etcd and registers this node. A record of the same
    /// name that is still alive may be this node's own from before a
    /// crash (its lease not yet expired): it is waited out, up to one
    /// TTL; one that outlives that belongs to a running node, and this
    /// one refuses to start.
    pub fn join(cfg: &ClusterConfig) -> Result<Membership, JoinError> {
        let ttl = Duration::from_secs(cfg.node_ttl_secs as u64);
        let access = etcd_access(cfg)?;
        if access.ca_pem.is_none() {
            tracing::warn!(
                "[cluster] etcd: plain http://, without TLS or credentials: anyone who reaches \
                 etcd can read and forge this cluster's state; see docs/SECURITY.md"
            );
        }
        if cfg.secret_file.is_none() {
            tracing::warn!(
                "[cluster] secret_file: none, so the records nodes write to etcd are not \
                 authenticated: whoever can write to etcd can make this node act for them; \
                 see docs/SECURITY.md"
            );
        }
        let store = open_store(cfg, access.clone(), call_timeout(ttl))?;
        let control = open_store(cfg, access, call_timeout(ttl))?;
        store
            .check()
            .map_err(|e| JoinError::of(e, JoinError::Unreachable))?;
        // Reading is not enough: a role that may only read would fail at
        // the first client's open instead.
        let probe = [PROBE_PREFIX, cfg.node.as_bytes()].concat();
        control
            .txn(&[], &[Op::Put(&probe, b"", 0)], &[])
            .and_then(|_| control.txn(&[], &[Op::Delete(&probe)], &[]))
            .map_err(|e| JoinError::of(e, JoinError::Writing))?;
        takes_fit(&control, &probe).map_err(|e| JoinError::of(e, JoinError::TxnOps))?;
        // For the operator, who reads which etcd this cluster runs on in
        // the start log (docs/SCALING.md, "Which etcd").
        match control.server_version() {
            Ok(v) => tracing::info!("cluster: etcd {v} answered"),
            Err(e) => tracing::debug!("cluster: asking etcd its version: {e}"),
        }
        let m = Membership {
            store: Arc::new(store),
            control,
            node: cfg.node.clone(),
            advertise: cfg.advertise,
            ttl,
            lease: AtomicI64::new(0),
            incarnation: AtomicU64::new(0),
            adopted: Mutex::new(HashSet::new()),
            gone: Mutex::new(HashSet::new()),
            alive: Mutex::new(std::collections::HashMap::new()),
            live: Mutex::new(LiveIncarnations::default()),
            changed: tokio::sync::watch::Sender::new(0),
            owned: OnceLock::new(),
            last_proof: Mutex::new(None),
            lost: AtomicBool::new(false),
            on_lease_lost: Mutex::new(Vec::new()),
            stopping: Arc::new(AtomicBool::new(false)),
            next_message: AtomicU64::new(1),
            on_new_lease: Mutex::new(Vec::new()),
            pinned: Mutex::new(HashSet::new()),
            released: Mutex::new(HashSet::new()),
            let_go_waits: Mutex::new(std::collections::HashMap::new()),
            answer_waits: Mutex::new(std::collections::HashMap::new()),
            let_go_asks: Mutex::new(std::collections::HashMap::new()),
            ack_forwards: Mutex::new((Instant::now(), 0)),
            with_record: Mutex::new(std::collections::HashMap::new()),
            without_record: Mutex::new(HashSet::new()),
            unposted: crate::unposted::Waiting::default(),
            taken: Mutex::new(crate::unposted::TakenKeys::default()),
            #[cfg(test)]
            rejoin_gate: Default::default(),
        };
        // A node with another secret refuses what the others wrote, and
        // they what it writes: told here, before it writes anything (its
        // registration would fail the other nodes' listings of the
        // members until its lease ran out).
        m.control
            .get(INCARNATION_COUNTER)
            .map_err(|error| JoinError::Registering {
                what: "reading the cluster's run counter",
                error,
            })?;
        m.check_layout()?;
        let until = Instant::now() + m.ttl + Duration::from_secs(1);
        loop {
            if m.register().map_err(|error| JoinError::Registering {
                what: "registering node",
                error,
            })? {
                break;
            }
            if Instant::now() >= until {
                return Err(JoinError::NameTaken(m.node.clone()));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Err(e) = m.check_layout() {
            let _ = m.control.revoke_lease(m.lease.load(Ordering::SeqCst));
            return Err(e);
        }
        let n = m
            .new_incarnation()
            .map_err(|error| JoinError::Registering {
                what: "numbering this run",
                error,
            })?;
        m.incarnation.store(n, Ordering::SeqCst);
        m.put_incarnations()
            .map_err(|error| JoinError::Registering {
                what: "registering this run",
                error,
            })?;
        m.store.fence_on(&incarnation_key(n));
        tracing::info!(
            "cluster: joined as node \"{}\" (clients reach it at {}), lease {}s, incarnation {n}",
            m.node,
            m.advertise,
            m.ttl.as_secs()
        );
        Ok(m)
    }

    /// Refuses to join nodes of a release that keys the cluster's records
    /// another way: each live node (other than this node's own record from
    /// before a restart) must have written this release's layout beside
    /// its registration. Releases before the layout wrote none. Checked
    /// before this node registers, and again after: a node of another
    /// release that registered meanwhile is seen then.
    fn check_layout(&self) -> Result<(), JoinError> {
        let reading = |error| JoinError::Registering {
            what: "reading the other nodes' record layouts",
            error,
        };
        let mut older = Vec::new();
        let mut other = Vec::new();
        for member in self.members().map_err(reading)? {
            if member.node == self.node {
                continue;
            }
            match self
                .control
                .get(&layout_key(&member.node))
                .map_err(reading)?
            {
                Some(v) if v.value == LAYOUT => {}
                Some(v) => other.push(format!(
                    "{} (layout \"{}\")",
                    member.node,
                    String::from_utf8_lossy(&v.value)
                )),
                None => older.push(member.node),
            }
        }
        if older.is_empty() && other.is_empty() {
            return Ok(());
        }
        let mut why = Vec::new();
        if !older.is_empty() {
            why.push(format!(
                "node(s) {} run a release older than this one, which keys files by device and \
                 inode alone",
                older.join(", ")
            ));
        }
        if !other.is_empty() {
            why.push(format!(
                "node(s) {} key files otherwise than this release (layout \"{}\")",
                other.join(", "),
                String::from_utf8_lossy(LAYOUT)
            ));
        }
        Err(JoinError::Layout(format!(
            "{}; a node stopped less than node_ttl_secs ({}s) ago still counts until its \
             lease runs out",
            why.join("; "),
            self.ttl.as_secs()
        )))
    }

    /// Draws the next number from the cluster's counter.
    fn new_incarnation(&self) -> Result<u64, StateError> {
        loop {
            let current = self.control.get(INCARNATION_COUNTER)?;
            let last = match &current {
                Some(v) => std::str::from_utf8(&v.value)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or(StateError::Corrupt("incarnation counter"))?,
                None => 0,
            };
            let next = last + 1;
            if next > MAX_INCARNATION {
                return Err(StateError::Unavailable(format!(
                    "the cluster's incarnation counter is exhausted ({last}); \
                     reset key {}incarnation-counter in etcd with every node stopped",
                    String::from_utf8_lossy(KEY_PREFIX)
                )));
            }
            if self
                .control
                .compare_and_set(
                    INCARNATION_COUNTER,
                    current.map(|v| v.version),
                    Some(next.to_string().into_bytes()),
                )?
                .is_some()
            {
                return Ok(next);
            }
        }
    }

    /// This run's incarnation record, and those of the runs it adopted,
    /// under the current lease.
    fn put_incarnations(&self) -> Result<(), StateError> {
        let lease = self.lease.load(Ordering::SeqCst);
        if lease == 0 {
            // The node left (`leave` took the lease): a record on no
            // lease would keep the incarnation alive for good.
            return Err(StateError::Unavailable("the node left the cluster".into()));
        }
        let mut all = vec![self.incarnation()];
        all.extend(crate::sync::lock(&self.adopted).iter().copied());
        for n in all {
            self.control.txn(
                &[],
                &[nimbus_state::etcd_store::Op::Put(
                    &incarnation_key(n),
                    self.node.as_bytes(),
                    lease,
                )],
                &[],
            )?;
        }
        Ok(())
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::SeqCst)
    }

    pub fn lease(&self) -> i64 {
        self.lease.load(Ordering::SeqCst)
    }

    /// Sets the store whose ownerships end with the lease; once.
    pub fn set_owned_store(&self, store: Arc<ClusterStore>) {
        {
            // Under the proof's lock, as `proved` and `leave`: a node that
            // left proves nothing.
            let proof = crate::sync::lock(&self.last_proof);
            if let Some(sent) = *proof {
                if !self.is_stopping() {
                    store.lease_proven_until(sent + self.ttl);
                }
            }
        }
        let _ = self.owned.set(store);
    }

    /// Etcd answered a registration or renewal sent at `sent`: the node
    /// may decide until the TTL from then.
    fn proved(&self, sent: Instant) {
        // Under the proof's lock, which `leave` ends the proof under: a
        // renewal etcd answers after the node left proves nothing.
        let mut proof = crate::sync::lock(&self.last_proof);
        if self.lost.load(Ordering::SeqCst) || self.is_stopping() {
            return;
        }
        *proof = Some(sent);
        crate::metrics::lease_proven(true);
        self.store.proven_until(sent + self.ttl);
        if let Some(s) = self.owned.get() {
            s.lease_proven_until(sent + self.ttl);
        }
    }

    /// Until when the lease is proven (None: not yet registered).
    fn proven_until(&self) -> Option<Instant> {
        let proof = *crate::sync::lock(&self.last_proof);
        proof.map(|sent| sent + self.ttl)
    }

    /// How long a node that sets a file delete-pending asks other nodes
    /// to revoke their groups of its opens (`ShareModes::with_revoker`):
    /// past it, a node that did not answer has lost its lease.
    pub fn revoke_wait(&self) -> Duration {
        handover_timeout(self.ttl)
    }

    /// Whether the node has lost its lease and not joined again yet.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Runs `f` whenever the lease is lost.
    pub fn on_lease_lost(&self, f: LeaseLost) {
        crate::sync::lock(&self.on_lease_lost).push(f);
    }

    /// The lease is lost (see the module comment): nothing is decided
    /// from now on, what the node held is forgotten, and its clients are
    /// dropped. Once.
    fn lose(&self, why: &str) {
        // A renewal under way when the node left finds its lease revoked:
        // not a loss, and its clients were drained.
        if self.is_stopping() || self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        self.store.proven_until(Instant::now());
        crate::metrics::lease_proven(false);
        tracing::error!(
            "cluster: node \"{}\" lost its lease ({why}): other nodes may take its files; it drops \
             its clients' connections and decides nothing until it has joined the cluster again",
            self.node
        );
        if let Some(s) = self.owned.get() {
            s.forget_all();
        }
        for f in crate::sync::lock(&self.on_lease_lost).iter() {
            f();
        }
    }

    /// After the lease was lost: ends the old lease if it still runs (so
    /// its incarnation is gone at once to every node), registers under a
    /// new one, and takes a new incarnation. Ok(false): another running
    /// node holds this node's name.
    fn rejoin(&self) -> Result<bool, StateError> {
        let joined = self.join_again();
        if self.is_stopping() {
            // The node left while it joined again, perhaps before the new
            // lease was stored (`leave` then revoked the old one): the new
            // lease goes too, whichever of the two swaps it out.
            let lease = self.lease.swap(0, Ordering::SeqCst);
            if lease != 0 {
                let _ = self.control.revoke_lease(lease);
            }
        }
        joined
    }

    /// `rejoin`'s steps.
    fn join_again(&self) -> Result<bool, StateError> {
        let old = self.lease.load(Ordering::SeqCst);
        if old != 0 {
            if let Err(e) = self.control.revoke_lease(old) {
                // Already expired, or etcd does not answer: the
                // registration below tells which.
                tracing::debug!("cluster: ending the lost lease: {e}");
            }
        }
        let sent = Instant::now();
        if !self.register()? {
            return Ok(false);
        }
        #[cfg(test)]
        self.rejoin_gate.pass();
        let n = self.new_incarnation()?;
        self.incarnation.store(n, Ordering::SeqCst);
        // The runs it had adopted went with the old lease, as its own.
        crate::sync::lock(&self.adopted).clear();
        self.put_incarnations()?;
        // The store names the new incarnation before the fence moves to
        // it: a take fenced on the new record must name it, or its
        // ownership would look dead (the old incarnation is gone).
        let lease = self.lease();
        if let Some(s) = self.owned.get() {
            s.rejoined(&n.to_string(), lease);
        }
        self.store.fence_on(&incarnation_key(n));
        self.lost.store(false, Ordering::SeqCst);
        self.proved(sent);
        if self.is_stopping() {
            // The node left while it joined again (`proved` proved
            // nothing): `rejoin` ends the new lease.
            return Ok(true);
        }
        for f in crate::sync::lock(&self.on_new_lease).iter() {
            f(lease);
        }
        tracing::warn!(
            "cluster: node \"{}\" joined the cluster again as incarnation {n}, lease {}s",
            self.node,
            self.ttl.as_secs()
        );
        Ok(true)
    }

    /// Takes an earlier run's opens over (persistent handles restored at
    /// start): its incarnation lives on under this node's lease.
    pub fn adopt(&self, incarnation: u64) -> Result<(), StateError> {
        if incarnation == 0 || incarnation == self.incarnation() {
            return Ok(());
        }
        if crate::sync::lock(&self.adopted).insert(incarnation) {
            self.put_incarnations()?;
        }
        Ok(())
    }

    /// Whether the opens of `incarnation` belong to a run that is over
    /// (its node died or left, and nobody adopted them). An etcd that does
    /// not answer proves nothing: not gone.
    pub fn is_gone(&self, incarnation: u64) -> bool {
        self.is_gone_trusting(incarnation, true)
    }

    /// `is_gone`; without `trust_copies`, an incarnation is read from etcd
    /// even if the watch's copy or a look-up of the last second says it
    /// is alive.
    fn is_gone_trusting(&self, incarnation: u64, trust_copies: bool) -> bool {
        if incarnation == 0
            || incarnation == self.incarnation()
            || crate::sync::lock(&self.adopted).contains(&incarnation)
        {
            return false;
        }
        if crate::sync::lock(&self.gone).contains(&incarnation) {
            return true;
        }
        if trust_copies && crate::sync::lock(&self.live).says_alive(incarnation) {
            return false;
        }
        let fresh = |at: &Instant| at.elapsed() < ALIVE_FOR;
        if trust_copies
            && crate::sync::lock(&self.alive)
                .get(&incarnation)
                .is_some_and(fresh)
        {
            return false;
        }
        match self.store.get(&incarnation_key(incarnation)) {
            Ok(None) => {
                crate::sync::lock(&self.alive).remove(&incarnation);
                crate::sync::lock(&self.gone).insert(incarnation);
                true
            }
            Ok(Some(v)) => {
                tracing::debug!(
                    "cluster: incarnation {incarnation} alive ({})",
                    String::from_utf8_lossy(&v.value)
                );
                let mut alive = crate::sync::lock(&self.alive);
                alive.retain(|_, at| fresh(at));
                alive.insert(incarnation, Instant::now());
                false
            }
            Err(e) => {
                // Taken as alive for as long as a seen one is, so that a
                // record of many opens does not cost one etcd timeout each.
                tracing::debug!("cluster: is incarnation {incarnation} gone? etcd: {e}");
                crate::sync::lock(&self.alive).insert(incarnation, Instant::now());
                false
            }
        }
    }

    /// `is_gone` without trusting that `incarnation` was seen alive in the
    /// last second: a client reconnects right after its node left.
    pub fn is_gone_now(&self, incarnation: u64) -> bool {
        crate::sync::lock(&self.alive).remove(&incarnation);
        self.is_gone_trusting(incarnation, false)
    }

    /// Starts the thread that keeps the copy of `incarnations/` (which
    /// runs are alive) by a watch, for as long as the process runs. Only
    /// "alive" is taken from it: "gone" is always read from etcd once
    /// (and remembered, since a run never comes back), so a copy that
    /// lags can delay dropping a dead node's entries, never drop a live
    /// one's.
    pub fn follow_incarnations(self: Arc<Self>) {
        let stop = self.stopping.clone();
        let spawned = std::thread::Builder::new()
            .name("nimbus-incarnations".into())
            .spawn(move || {
                let mut watch = None;
                let mut copied = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    // Read whole again now and then: a watch stream that
                    // hangs without failing would otherwise keep a dead
                    // run alive in the copy until it fails.
                    if copied.elapsed() >= LIVE_COPY_AGAIN {
                        watch = None;
                    }
                    let Some(w) = watch.as_mut() else {
                        match self.copy_incarnations() {
                            Ok(r) => {
                                copied = Instant::now();
                                watch = Some(self.store.watch(INCARNATIONS_PREFIX, r + 1));
                            }
                            Err(e) => {
                                tracing::debug!("cluster: reading the incarnations: {e}");
                                std::thread::sleep(Duration::from_millis(200));
                            }
                        }
                        continue;
                    };
                    match w.next(Duration::from_secs(1)) {
                        Ok(batch) => {
                            let mut live = crate::sync::lock(&self.live);
                            for e in &batch.events {
                                let Some(n) = incarnation_of_key(&e.key) else {
                                    continue;
                                };
                                if e.value.is_some() {
                                    live.numbers.insert(n);
                                } else {
                                    live.numbers.remove(&n);
                                }
                            }
                            live.heard = (!batch.resync).then(Instant::now);
                            drop(live);
                            // Told once the copy shows the change: a
                            // waiter woken reads it (`await_let_go`).
                            if !batch.events.is_empty() {
                                self.changed.send_modify(|n| *n += 1);
                            }
                            if batch.resync {
                                watch = None;
                            }
                        }
                        Err(e) => {
                            crate::sync::lock(&self.live).heard = None;
                            tracing::debug!("cluster: watching the incarnations: {e}");
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the incarnations thread: {e}");
        }
    }

    /// Reads `incarnations/` whole into the copy; the revision it was
    /// read after (the watch starts past it).
    fn copy_incarnations(&self) -> Result<u64, StateError> {
        let revision = self.store.revision()?;
        let numbers = self
            .store
            .scan_prefix(INCARNATIONS_PREFIX)?
            .into_iter()
            .filter_map(|(k, _)| incarnation_of_key(&k))
            .collect();
        *crate::sync::lock(&self.live) = LiveIncarnations {
            numbers,
            heard: Some(Instant::now()),
        };
        // What changed while the watch was down is in this copy.
        self.changed.send_modify(|n| *n += 1);
        Ok(revision)
    }

    /// Wakes (`changed()`) when a run joins or goes, as the watch of
    /// `incarnations/` sees it; then read `members`.
    pub fn membership_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// `open_id` is a persistent open of this node: its file's records
    /// stay in etcd.
    pub fn pin(&self, open_id: u64) {
        crate::sync::lock(&self.pinned).insert(open_id);
    }

    /// How many files this node owns (decides in its memory).
    pub fn owned_files(&self) -> usize {
        self.owned.get().map_or(0, |s| s.owned())
    }

    /// Makes sure `file`'s records are in etcd, not owned by this node.
    pub fn share_file(&self, file: nimbus_state::FileKey) -> Result<(), StateError> {
        match self.owned.get() {
            Some(s) if s.owns(&file.record_key(&[])) => s.release(&file.record_key(&[])),
            _ => Ok(()),
        }
    }

    /// Whether the node is leaving (its threads end).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// `open_id` closed for good.
    pub fn unpin(&self, open_id: u64) {
        crate::sync::lock(&self.pinned).remove(&open_id);
    }

    pub fn is_pinned(&self, open_id: u64) -> bool {
        crate::sync::lock(&self.pinned).contains(&open_id)
    }

    /// Whether this node runs `incarnation`: its own, or one it adopted.
    pub fn runs(&self, incarnation: u64) -> bool {
        incarnation == self.incarnation() || crate::sync::lock(&self.adopted).contains(&incarnation)
    }

    /// This node let go of its own open `open_id` for its client on
    /// another node: it stays pinned (its entries name this node, and its
    /// file's records stay in etcd for whoever holds it).
    pub fn mark_released(&self, open_id: u64) {
        self.pin(open_id);
        crate::sync::lock(&self.released).insert(open_id);
    }

    /// Whether `open_id` is an open of this node's that it let go of.
    pub fn is_released(&self, open_id: u64) -> bool {
        crate::sync::lock(&self.released).contains(&open_id)
    }

    /// The opens this node let go of.
    pub fn released(&self) -> Vec<u64> {
        crate::sync::lock(&self.released).iter().copied().collect()
    }

    /// Whether a reconnect may wait for another node's answer now: the
    /// runtime to run it again on, while fewer than `MAX_LET_GO_WAITS`
    /// wait.
    pub fn let_go_room(&self) -> Option<tokio::runtime::Handle> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        (crate::sync::lock(&self.let_go_waits).len() < MAX_LET_GO_WAITS).then_some(runtime)
    }

    /// Waits for the answer to request `nonce` for `open_id`: `resume`
    /// runs when it comes, when the asked node's run `asked` ends, or when
    /// `wait_at_most` has passed without either, on `runtime`'s blocking
    /// pool (the reconnect asks etcd again).
    pub fn await_let_go(
        self: &Arc<Self>,
        open_id: u64,
        nonce: u64,
        resume: LetGoWait,
        runtime: tokio::runtime::Handle,
        wait_at_most: Duration,
        asked: u64,
    ) {
        crate::sync::lock(&self.let_go_waits).insert((open_id, nonce), (resume, runtime.clone()));
        let me = Arc::downgrade(self);
        let mut changes = self.membership_changes();
        runtime.spawn(async move {
            // The asked node's run ending is an answer too: the reconnect
            // runs again at once and takes the open over, rather than at
            // the end of the wait (a kill's clients would otherwise wait
            // up to `wait_at_most` past the node's lease).
            // The copy is a hint; etcd decides (a run the copy has not
            // seen yet is not gone).
            let gone = |me: Weak<Membership>| async move {
                let Some(m) = me.upgrade() else { return false };
                if !m.copy_says_gone(asked) {
                    return false;
                }
                tokio::task::spawn_blocking(move || m.is_gone_now(asked))
                    .await
                    .unwrap_or(false)
            };
            let until = tokio::time::sleep(wait_at_most);
            tokio::pin!(until);
            // Its run may have ended before the watch was subscribed to.
            let mut ended = gone(me.clone()).await;
            while !ended {
                tokio::select! {
                    _ = &mut until => break,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            (&mut until).await;
                            break;
                        }
                        ended = gone(me.clone()).await;
                    }
                }
            }
            if let Some(m) = me.upgrade() {
                if ended {
                    tracing::info!(
                        "cluster: open {open_id:#x}: the run asked to let go of it (incarnation \
                         {asked}) ended; its reconnect runs again"
                    );
                }
                m.let_go_answered(open_id, nonce);
            }
        });
    }

    /// The watched copy of `incarnations/` is current and lacks
    /// `incarnation`: its run has most likely ended. A hint read without
    /// etcd; what acts on it decides from etcd again (`is_gone`).
    fn copy_says_gone(&self, incarnation: u64) -> bool {
        let live = crate::sync::lock(&self.live);
        live.heard.is_some_and(|at| at.elapsed() < LIVE_FRESH)
            && !live.numbers.contains(&incarnation)
    }

    /// The answer to request `nonce` for `open_id` came (or its wait ran
    /// out): what waits on it runs.
    pub fn let_go_answered(&self, open_id: u64, nonce: u64) {
        let waiting = crate::sync::lock(&self.let_go_waits).remove(&(open_id, nonce));
        if let Some((resume, runtime)) = waiting {
            runtime.spawn_blocking(resume);
        }
    }

    /// A reconnect cancelled while it waited: nothing runs for it.
    pub fn forget_let_go(&self, open_id: u64, nonce: u64) {
        crate::sync::lock(&self.let_go_waits).remove(&(open_id, nonce));
    }

    /// Whether session `session_id` may ask another node to let go of an
    /// open now: at most `LET_GO_ASKS_PER_SESSION` in each
    /// `LET_GO_ASK_WINDOW`.
    pub fn may_ask_to_let_go(&self, session_id: u64) -> bool {
        let now = Instant::now();
        let mut asks = crate::sync::lock(&self.let_go_asks);
        if asks.len() >= MAX_LET_GO_WAITS {
            asks.retain(|_, (since, _)| now.duration_since(*since) < LET_GO_ASK_WINDOW);
        }
        let (since, n) = asks.entry(session_id).or_insert((now, 0));
        if now.duration_since(*since) >= LET_GO_ASK_WINDOW {
            *since = now;
            *n = 0;
        }
        *n += 1;
        *n <= LET_GO_ASKS_PER_SESSION
    }

    /// Whether a lease break acknowledgement may be sent on to the other
    /// nodes now: at most `ACK_FORWARDS_PER_SECOND` a second, node-wide.
    pub fn may_forward_ack(&self) -> bool {
        let now = Instant::now();
        let mut w = crate::sync::lock(&self.ack_forwards);
        if now.duration_since(w.0) >= Duration::from_secs(1) {
            *w = (now, 0);
        }
        w.1 += 1;
        w.1 <= ACK_FORWARDS_PER_SECOND
    }

    /// Sends each of `nodes` the request `message(nonce)` makes and waits,
    /// at most `wait_at_most`, for their answers (`answered` with the same
    /// number): what they answered, as many as came in time. Empty when
    /// too many requests wait already. For requests a client's request
    /// waits on: ending a previous session (`crate::session_handover`),
    /// closing an application's old opens (`crate::app_instance_handover`),
    /// applying a lease break's acknowledgement
    /// (`crate::lease_ack_handover`, through `ask_nodes_until`).
    pub fn ask_nodes(
        &self,
        nodes: &[String],
        message: impl Fn(u64) -> Vec<u8>,
        wait_at_most: Duration,
    ) -> Vec<u8> {
        self.ask_nodes_until(nodes, message, wait_at_most, |_| false)
    }

    /// `ask_nodes`, done waiting as soon as an answer is `enough`.
    pub fn ask_nodes_until(
        &self,
        nodes: &[String],
        message: impl Fn(u64) -> Vec<u8>,
        wait_at_most: Duration,
        enough: impl Fn(u8) -> bool,
    ) -> Vec<u8> {
        if nodes.is_empty() {
            return Vec::new();
        }
        // This run's incarnation above the counter: an answer left in the
        // box for an earlier run of this node matches no request of this one.
        let counted = self.next_message.fetch_add(1, Ordering::Relaxed);
        let nonce = (self.incarnation() << OPEN_ID_SHIFT) | (counted & ((1 << OPEN_ID_SHIFT) - 1));
        let (tx, rx) = std::sync::mpsc::sync_channel(nodes.len());
        {
            let mut waits = crate::sync::lock(&self.answer_waits);
            if waits.len() >= MAX_LET_GO_WAITS {
                return Vec::new();
            }
            waits.insert(nonce, tx);
        }
        let msg = message(nonce);
        let mut expected = 0;
        for node in nodes {
            match self.post(node, &msg) {
                Ok(()) => expected += 1,
                Err(e) => tracing::warn!("cluster: asking {node}: {e}"),
            }
        }
        let deadline = Instant::now() + wait_at_most;
        let mut answers = Vec::with_capacity(expected);
        while answers.len() < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(a) => {
                    answers.push(a);
                    if enough(a) {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
        crate::sync::lock(&self.answer_waits).remove(&nonce);
        answers
    }

    /// An answer to request `nonce` of `ask_nodes` came: a yes or no (1
    /// or 0), or one of the values its message kind defines.
    pub fn answered(&self, nonce: u64, value: u8) {
        let waiting = crate::sync::lock(&self.answer_waits).get(&nonce).cloned();
        if let Some(tx) = waiting {
            let _ = tx.try_send(value);
        }
    }

    /// Open `open_id` closed: its claim, and the mark of its node letting
    /// go of it, go with it, where this node may drop them (it runs the
    /// open's incarnation and never let go of it, or its node is gone).
    pub fn closed(&self, open_id: u64) {
        self.unpin(open_id);
        let origin = incarnation_of(open_id);
        if !self.runs(origin) || self.is_released(open_id) || self.is_gone(origin) {
            let (holder, marker) = (
                crate::claims::holder_key(open_id),
                crate::claims::released_key(open_id),
            );
            crate::errors::cleanup(
                format_args!("dropping the claim of closed open {open_id:#x}"),
                self.store
                    .txn(&[], &[Op::Delete(&holder), Op::Delete(&marker)], &[]),
            );
            self.forget_released(open_id);
        }
    }

    /// `open_id` closed for good (or was never let go of after all).
    pub fn forget_released(&self, open_id: u64) {
        if crate::sync::lock(&self.released).remove(&open_id) {
            self.unpin(open_id);
        }
    }

    /// Whether an open is over for good: its node is gone, and it is not a
    /// persistent open whose record waits in etcd for its client (those
    /// keep their share modes, locks and caching until reclaimed or
    /// expired: `nimbus_node::failover`). An etcd that does not answer proves
    /// nothing: not gone.
    pub fn open_is_gone(&self, open_id: u64) -> bool {
        if !self.is_gone(incarnation_of(open_id)) {
            return false;
        }
        if crate::sync::lock(&self.without_record).contains(&open_id) {
            return true;
        }
        let fresh = |at: &Instant| at.elapsed() < ALIVE_FOR;
        if crate::sync::lock(&self.with_record)
            .get(&open_id)
            .is_some_and(fresh)
        {
            return false;
        }
        let key = nimbus_state::durable_record::DurableOpen::key(open_id);
        match self.store.get(&key) {
            Ok(None) => {
                crate::sync::lock(&self.with_record).remove(&open_id);
                let mut without = crate::sync::lock(&self.without_record);
                // Bounded: forgetting costs one more look-up, nothing else.
                if without.len() >= 1 << 16 {
                    without.clear();
                }
                without.insert(open_id);
                true
            }
            Ok(Some(_)) => {
                let mut with = crate::sync::lock(&self.with_record);
                with.retain(|_, at| fresh(at));
                with.insert(open_id, Instant::now());
                false
            }
            Err(_) => false,
        }
    }

    /// One try: a new lease and the record under it. Ok(false): a live
    /// record of this name exists (the new lease is revoked again).
    fn register(&self) -> Result<bool, StateError> {
        let sent = Instant::now();
        let lease = self.control.grant_lease(self.ttl.as_secs() as i64)?;
        let value = self.advertise.to_string();
        let key = node_key(&self.node);
        let layout = layout_key(&self.node);
        let registered = self.control.txn(
            &[Cmp::Absent(&key)],
            &[
                Op::Put(&key, value.as_bytes(), lease),
                Op::Put(&layout, LAYOUT, lease),
            ],
            &[],
        )?;
        if registered.succeeded {
            self.lease.store(lease, Ordering::SeqCst);
            if !self.lost.load(Ordering::SeqCst) {
                *crate::sync::lock(&self.last_proof) = Some(sent);
                crate::metrics::lease_proven(true);
                self.store.proven_until(sent + self.ttl);
            }
            return Ok(true);
        }
        let _ = self.control.revoke_lease(lease);
        Ok(false)
    }

    /// Renews the lease every third of the TTL, for as long as the server
    /// runs; a lease lost (not proven within the TTL, or ended by etcd)
    /// is given up and the node joins again (see the module comment).
    ///
    /// On a thread of its own, not the async runtime: a request waiting on
    /// etcd while it holds a lock others want can keep the runtime's workers
    /// busy for as long as a hand-over takes (up to twice the TTL), and the
    /// lease must not lapse meanwhile.
    pub fn keep_alive(self: Arc<Self>) {
        let period = self.ttl / 3;
        let poster = self.clone();
        let spawned = std::thread::Builder::new()
            .name("nimbus-lease".into())
            .spawn(move || self.renew_every(period));
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the lease renewal thread: {e}");
        }
        let spawned = std::thread::Builder::new()
            .name("nimbus-unposted".into())
            .spawn(move || poster.post_unposted());
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the thread that posts breaks again: {e}");
        }
    }

    /// Posts again the break orders etcd did not take (`crate::unposted`),
    /// one at a time, for as long as the process runs.
    fn post_unposted(self: Arc<Self>) {
        while !self.is_stopping() {
            let Some((n, u)) = self.unposted.next(Duration::from_secs(1)) else {
                continue;
            };
            // An open of an incarnation this node now runs (it took the
            // opens over) has its breaks decided here.
            if self.runs(u.to) {
                self.unposted.done(n, true);
                continue;
            }
            if Instant::now() >= u.until {
                tracing::warn!(
                    "cluster: break for open {:#x} not posted in time: its breaker waits for the \
                     break timeout",
                    u.open_id
                );
                self.unposted.done(n, true);
                continue;
            }
            match self.try_post_break(u.to, u.open_id, &u.order, &u.key) {
                Ok(posted) => {
                    tracing::debug!(
                        "cluster: break for open {:#x} posted again: {posted}",
                        u.open_id
                    );
                    self.unposted.done(n, true);
                }
                Err(e) => {
                    tracing::debug!(
                        "cluster: break for open {:#x} not posted yet: {e}",
                        u.open_id
                    );
                    self.unposted.done(n, false);
                    std::thread::sleep(crate::unposted::RETRY_EVERY);
                }
            }
        }
    }

    /// Break orders waiting to be posted again.
    pub fn unposted_breaks(&self) -> usize {
        self.unposted.len()
    }

    fn renew_every(self: Arc<Self>, period: Duration) {
        let mut next_renewal = Instant::now() + period;
        loop {
            // Awake when the next renewal is due, or when the proof of the
            // lease runs out if that comes first.
            let now = Instant::now();
            let mut wake = next_renewal;
            if !self.is_lost() {
                if let Some(until) = self.proven_until() {
                    wake = wake.min(until);
                }
            }
            std::thread::sleep(wake.saturating_duration_since(now));
            if self.is_stopping() {
                // The node left: its lease is revoked, not to be renewed or
                // replaced by a new registration.
                return;
            }
            let now = Instant::now();
            if !self.is_lost() && self.proven_until().is_some_and(|until| until <= now) {
                self.lose("not renewed within node_ttl_secs: etcd out of reach");
            }
            if now < next_renewal {
                continue;
            }
            next_renewal = now + period;
            if self.is_lost() {
                match self.rejoin() {
                    Ok(true) => {}
                    Ok(false) => tracing::error!(
                        "cluster: node \"{}\" cannot join again: another running node holds its \
                         name",
                        self.node
                    ),
                    Err(e) => tracing::warn!("cluster: joining again: {e}"),
                }
                continue;
            }
            let lease = self.lease.load(Ordering::SeqCst);
            let renewed = self.control.keep_alive(lease);
            crate::metrics::lease_renewal(match &renewed {
                Ok(true) => "ok",
                Ok(false) => "lost",
                Err(_) => "failed",
            });
            match renewed {
                Ok(true) => self.proved(now),
                Ok(false) => {
                    self.lose("etcd ended it: out of reach for longer than node_ttl_secs");
                    // At once: the old lease is gone already.
                    next_renewal = now;
                }
                Err(e) => {
                    tracing::warn!("cluster: lease renewal failed: {e}");
                    // Tried again soon rather than a third of the TTL later:
                    // an etcd election ends within a second or two, and the
                    // lease must be proven again before its proof runs out.
                    next_renewal = Instant::now() + RENEW_RETRY.min(period);
                }
            }
        }
    }

    /// Starts the threads that hand files over to other nodes on request
    /// and give back ownerships nobody uses, for as long as the process
    /// runs.
    pub fn serve_ownership(self: Arc<Self>) {
        let Some(store) = self.owned.get().cloned() else {
            return;
        };
        let s = store.clone();
        let stop = self.stopping.clone();
        let spawned = std::thread::Builder::new()
            .name("nimbus-handover".into())
            .spawn(move || s.serve_releases(&stop));
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the hand-over thread: {e}");
        }
        let stop = self.stopping.clone();
        let spawned = std::thread::Builder::new()
            .name("nimbus-sweep".into())
            .spawn(move || {
                let mut cleared: Option<Instant> = None;
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(SWEEP_EVERY);
                    store.sweep(SWEEP_IDLE);
                    if cleared.is_none_or(|at| at.elapsed() >= CLEAR_GONE_OWNERS_EVERY) {
                        cleared = Some(Instant::now());
                        match store.clear_gone_owners() {
                            Ok(0) => {}
                            Ok(n) => tracing::info!(
                                "cluster: {n} ownerships of files by node runs that are gone \
                                 deleted from etcd"
                            ),
                            Err(e) => tracing::warn!(
                                "cluster: deleting ownerships of node runs that are gone: {e}"
                            ),
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the ownership sweep: {e}");
        }
    }

    /// Starts a thread (named `name`) that calls `changed` with the change
    /// (key, new value) of every record under `prefix` another node (or
    /// this one) changes in etcd, and `tick` once per `every`, for as long
    /// as the process runs. `tick(true)`: the watch (re)started, and
    /// changes before it may have been missed (at the start, or the watch
    /// fell behind etcd's compaction): read the range whole.
    pub fn watch_records(
        self: Arc<Self>,
        name: &str,
        prefix: Vec<u8>,
        every: Duration,
        changed: impl Fn(&nimbus_state::etcd_watch::Event) + Send + 'static,
        tick: impl Fn(bool) + Send + 'static,
    ) {
        let stop = self.stopping.clone();
        let thread = name.to_owned();
        let name = name.to_owned();
        let spawned = std::thread::Builder::new()
            .name(thread.clone())
            .spawn(move || {
                let mut watch = None;
                let mut last_tick = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    if watch.is_none() {
                        match self.store.revision() {
                            // From now on; what came before is covered by
                            // the tick.
                            Ok(r) => {
                                tick(true);
                                last_tick = Instant::now();
                                watch = Some(self.store.watch(&prefix, r + 1));
                            }
                            Err(e) => {
                                tracing::warn!("cluster: watching {}: {e}", name);
                                std::thread::sleep(Duration::from_millis(200));
                                continue;
                            }
                        }
                    }
                    deliver_next(&mut watch, every, &name, &changed);
                    if last_tick.elapsed() >= every {
                        tick(false);
                        last_tick = Instant::now();
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the {thread} thread: {e}");
        }
    }

    /// Adds what to run after the node registered again under a new lease.
    pub fn on_new_lease(&self, f: NewLease) {
        crate::sync::lock(&self.on_new_lease).push(f);
    }

    /// This node's message box, `msg/<node>/`: messages for the opens of
    /// this run and of the runs it adopted.
    pub fn inbox(&self) -> Vec<u8> {
        message_box(&self.node)
    }

    /// Sends a break for `open_id` to the node serving it. Under this
    /// node's lease: if this node dies first, the break goes with it (the
    /// request that caused it died too, and any other waiter ends the
    /// break itself after the timeout). An open of this run, or of one it
    /// adopted, has no other node to go to: nothing is sent.
    /// Returns false when no node serves the open (see `Forward`).
    /// An order etcd does not take is posted again for up to half
    /// `break_timeout` (`crate::unposted`).
    pub fn send_break(
        &self,
        open_id: u64,
        order: &nimbus_state::caching::BreakOrder,
        break_timeout: Duration,
    ) -> bool {
        let mut to = incarnation_of(open_id);
        // A gone node's open another node took over, or one this node let
        // go of for its client on another node.
        if self.is_gone(to) || self.is_released(open_id) {
            match crate::claims::holder_of(self.store.as_ref(), open_id) {
                Some(h) => to = h,
                None => return self.open_is_gone(open_id),
            }
        }
        if to == 0 || self.runs(to) {
            return true;
        }
        // Posted, or kept to be posted again: either way the holder may
        // still cache, and its acknowledgement is waited for.
        self.post_break(to, open_id, order, break_timeout);
        true
    }

    /// Puts a break for `open_id` into the box of the node that runs (or
    /// adopted) incarnation `to`. A gone one gets nothing: its opens are
    /// dropped where in the way, or taken over by a node whose take-over
    /// ends the break. One etcd did not take is kept and posted again,
    /// for up to half `break_timeout` and at most the node's TTL
    /// (`crate::unposted`). Whether it was posted or kept.
    pub fn post_break(
        &self,
        to: u64,
        open_id: u64,
        order: &nimbus_state::caching::BreakOrder,
        break_timeout: Duration,
    ) -> bool {
        self.unposted.forget(open_id);
        let key = self.next_message_key();
        match self.try_post_break(to, open_id, order, &key) {
            Ok(posted) => posted,
            Err(e) => {
                tracing::warn!("cluster: break for open {open_id:#x} not posted, tried again: {e}");
                self.unposted.push(crate::unposted::Unposted {
                    to,
                    open_id,
                    order: *order,
                    key,
                    until: Instant::now() + (break_timeout / 2).min(self.ttl),
                });
                true
            }
        }
    }

    /// `post_break` once, under message key `key`: whether it was posted
    /// (false: incarnation `to` is gone), or what etcd answered.
    fn try_post_break(
        &self,
        to: u64,
        open_id: u64,
        order: &nimbus_state::caching::BreakOrder,
        key: &str,
    ) -> Result<bool, StateError> {
        match self.node_of(to)? {
            Some(node) => {
                let value = nimbus_state::records::encode_break(open_id, order);
                self.post_as(&node, key, &value).map(|()| true)
            }
            None => Ok(false),
        }
    }

    /// The node that runs (or adopted) incarnation `n`; None once it is
    /// gone.
    pub fn node_of(&self, n: u64) -> Result<Option<String>, StateError> {
        Ok(self
            .store
            .get(&incarnation_key(n))?
            .map(|v| String::from_utf8_lossy(&v.value).into_owned()))
    }

    /// Puts a message into `node`'s box, under this node's lease.
    pub fn post(&self, node: &str, value: &[u8]) -> Result<(), StateError> {
        self.post_as(node, &self.next_message_key(), value)
    }

    /// A key for a new message of this run: unique to it, whatever box it
    /// goes to.
    fn next_message_key(&self) -> String {
        let n = self.next_message.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n}", self.incarnation())
    }

    /// `post`, under the message key `name` (`next_message_key`).
    fn post_as(&self, node: &str, name: &str, value: &[u8]) -> Result<(), StateError> {
        let mut key = message_box(node);
        key.extend_from_slice(name.as_bytes());
        let put = nimbus_state::etcd_store::Op::Put(&key, value, self.lease());
        self.store.txn(&[], &[put], &[]).map(|_| ())
    }

    /// Whether the message under `key`, just taken, was not taken before:
    /// one its sender wrote again after an answer it did not get is
    /// acted on once (`crate::unposted`).
    fn first_take(&self, key: &[u8]) -> bool {
        crate::sync::lock(&self.taken).first(key)
    }

    /// Takes the message a watch of this node's box delivered, once (one
    /// another thread took already, or a deletion, gives None): deleted
    /// if it is still the version the watch saw, without reading it
    /// again. Err: etcd did not answer, and the message may still be
    /// there.
    pub fn take_delivered(
        &self,
        e: &nimbus_state::etcd_watch::Event,
    ) -> Result<Option<Versioned>, StateError> {
        let Some(value) = &e.value else {
            return Ok(None);
        };
        Ok(self
            .store
            .compare_and_set(&e.key, Some(e.revision), None)?
            .filter(|_| self.first_take(&e.key))
            .map(|_| Versioned {
                version: e.revision,
                value: value.clone(),
            }))
    }

    /// Takes the message under `key` out of this node's box, once (a
    /// message another thread took already gives None), with the store's
    /// revision of its writing (what it was posted after).
    pub fn take_message(&self, key: &[u8]) -> Option<Versioned> {
        self.try_take_message(key).ok().flatten()
    }

    /// `take_message`; Err: etcd did not answer (the message may still be
    /// there).
    pub fn try_take_message(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let Some(v) = self.store.get(key)? else {
            return Ok(None);
        };
        Ok(self
            .store
            .compare_and_set(key, Some(v.version), None)?
            .filter(|_| self.first_take(key))
            .map(|_| v))
    }

    /// The keys of the messages waiting in this node's box.
    pub fn pending_messages(&self) -> Vec<Vec<u8>> {
        self.try_pending_messages().unwrap_or_else(|e| {
            tracing::warn!("cluster: reading messages: {e}");
            Vec::new()
        })
    }

    /// `pending_messages`; Err: etcd did not answer.
    pub fn try_pending_messages(&self) -> Result<Vec<Vec<u8>>, StateError> {
        Ok(self
            .store
            .scan_prefix(&self.inbox())?
            .into_iter()
            .map(|(k, _)| k)
            .collect())
    }

    /// Leaves the cluster (at shutdown): the record goes at once.
    ///
    /// The node stops deciding before it revokes its lease: once etcd
    /// drops the incarnation record, other nodes take this node's files
    /// for free at once (its ownerships name the incarnation), so a
    /// decision from memory after that could stand beside theirs. Its
    /// store's calls and its files held in memory are cut off first, as
    /// at a lost lease, but its clients are not dropped here: a stopping
    /// server has drained them (`Server::stop`).
    pub fn leave(&self) {
        {
            let _proof = crate::sync::lock(&self.last_proof);
            self.stopping.store(true, Ordering::SeqCst);
            let now = Instant::now();
            self.store.proven_until(now);
        }
        // Outside the proof's lock (the groups' lock is taken under it
        // elsewhere): the files held in memory are cut off, and a decision
        // that passed its check before the cut is over once this returns.
        if let Some(s) = self.owned.get() {
            s.end_proof();
        }
        crate::metrics::lease_proven(false);
        let lease = self.lease.swap(0, Ordering::SeqCst);
        if lease != 0 {
            match self.control.revoke_lease(lease) {
                Ok(()) => tracing::info!("cluster: node \"{}\" left", self.node),
                Err(e) => tracing::warn!(
                    "cluster: leaving: {e}; the record goes with its lease in {}s",
                    self.ttl.as_secs()
                ),
            }
        }
    }

    /// The live members, by name.
    pub fn members(&self) -> Result<Vec<Member>, StateError> {
        Ok(self
            .store
            .scan_prefix(NODES_PREFIX)?
            .into_iter()
            .map(|(k, v)| Member {
                node: String::from_utf8_lossy(&k[NODES_PREFIX.len()..]).into_owned(),
                advertise: String::from_utf8_lossy(&v.value).into_owned(),
            })
            .collect())
    }

    /// The names of the other registered nodes, for requests to all of
    /// them (`ask_nodes`).
    pub fn other_nodes(&self) -> Result<Vec<String>, StateError> {
        Ok(self
            .members()?
            .into_iter()
            .map(|x| x.node)
            .filter(|n| *n != self.node)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn wait_for(what: &str, within: Duration, check: impl Fn() -> bool) {
        let until = Instant::now() + within;
        while !check() {
            assert!(Instant::now() < until, "not within {within:?}: {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn the_copy_of_the_incarnations_says_alive_only_while_fresh() {
        assert_eq!(incarnation_of_key(b"incarnations/42"), Some(42));
        assert_eq!(incarnation_of_key(b"incarnations/4x"), None);
        assert_eq!(incarnation_of_key(b"nodes/42"), None);
        let mut live = LiveIncarnations::default();
        live.numbers.insert(42);
        // No copy yet: it says nothing.
        assert!(!live.says_alive(42));
        live.heard = Some(Instant::now());
        assert!(live.says_alive(42));
        assert!(!live.says_alive(43));
        // A watch that has not answered for a while: nothing either.
        live.heard = Instant::now().checked_sub(LIVE_FRESH + Duration::from_millis(10));
        assert!(!live.says_alive(42));
    }

    /// Sends SIGSTOP (`freeze`) or SIGCONT to every member of `etcd`: it
    /// stops answering, without closing a connection.
    fn signal_members(etcd: &nimbus_state::etcd_test_cluster::Cluster, signal: &str) {
        for member in &etcd.members {
            let sent = std::process::Command::new("kill")
                .args([signal, &member.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success(), "kill {signal} {}", member.id());
        }
    }

    /// A test node's `[cluster]` settings on `etcd`, its records tagged
    /// with a secret of that cluster's, as a production node's are.
    fn test_config(
        etcd: &nimbus_state::etcd_test_cluster::Cluster,
        node: &str,
        ttl_secs: u32,
    ) -> ClusterConfig {
        let secret = etcd.dir.join("cluster.secret");
        std::fs::write(&secret, [7; 32]).unwrap();
        ClusterConfig {
            etcd: etcd.urls.clone(),
            node: node.into(),
            advertise: "127.0.0.1:4450".parse().unwrap(),
            node_ttl_secs: ttl_secs,
            tls: None,
            user: None,
            group_leases: false,
            secret_file: Some(secret),
        }
    }

    /// A break order etcd does not take while its members are frozen is
    /// kept, and posted into the holder node's box once they answer again:
    /// the breaker does not wait out the break timeout for a second's
    /// outage.
    #[test]
    fn a_break_etcd_did_not_take_is_posted_once_it_answers_again() {
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start("unposted");
        // A TTL that outlasts the freeze: the nodes keep their leases.
        let join = |node: &str| {
            let m = Arc::new(Membership::join(&test_config(&etcd, node, 20)).unwrap());
            m.clone().keep_alive();
            m
        };
        let (breaker, holder) = (join("breaker"), join("holder"));
        let open_id = holder.incarnation() << OPEN_ID_SHIFT | 5;
        let order = nimbus_state::caching::BreakOrder {
            holder: nimbus_state::caching::Holder::Oplock(open_id),
            from: 0x7,
            to: 0x1,
            ack_required: true,
            epoch: 0,
            version: 0,
        };
        // Polled: right after the thaw a read may find no leader yet.
        let holders_box = || {
            holder
                .store
                .scan_prefix(&holder.inbox())
                .unwrap_or_default()
        };
        signal_members(&etcd, "-STOP");
        let sent = breaker.send_break(open_id, &order, Duration::from_secs(35));
        let kept = breaker.unposted_breaks();
        signal_members(&etcd, "-CONT");
        assert!(
            sent,
            "an order etcd did not take counts as sent: the holder may still cache"
        );
        assert_eq!(kept, 1, "the order etcd did not take is kept");
        wait_for(
            "the order is in the holder's box",
            Duration::from_secs(15),
            || !holders_box().is_empty(),
        );
        let boxed = holders_box();
        assert_eq!(boxed.len(), 1);
        let posted = nimbus_state::records::decode_break(&boxed[0].1.value).unwrap();
        assert_eq!(posted, (open_id, order));
        wait_for("the order leaves the queue", Duration::from_secs(5), || {
            breaker.unposted_breaks() == 0
        });
        // The holder takes it once; the same key written again (as a try
        // after an answer that never came would) is not taken again.
        let key = boxed[0].0.clone();
        assert!(holder.try_take_message(&key).unwrap().is_some());
        holder
            .store
            .txn(
                &[],
                &[nimbus_state::etcd_store::Op::Put(
                    &key,
                    &boxed[0].1.value,
                    0,
                )],
                &[],
            )
            .unwrap();
        assert!(holder.try_take_message(&key).unwrap().is_none());
        breaker.leave();
        holder.leave();
    }

    /// A node that leaves decides nothing more from memory: other nodes
    /// take its files for free as soon as its incarnation record is gone,
    /// so its proof ends before its lease is revoked, and a renewal
    /// answered after that does not prove it again.
    #[test]
    fn a_node_that_leaves_decides_nothing_more_from_memory() {
        use nimbus_state::share_modes::OPENS_PREFIX;
        use nimbus_state::StateStore;
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start("leave");
        let m = Arc::new(Membership::join(&test_config(&etcd, "t1", 10)).unwrap());
        let store = owned_store(&m);
        m.set_owned_store(store.clone());
        m.clone().keep_alive();
        // A look at a file nobody has records of takes it: its new record
        // is kept in memory.
        let key = nimbus_state::FileKey::new(1, 2, 1).record_key(OPENS_PREFIX);
        assert_eq!(store.get(&key).unwrap(), None);
        let v = store
            .compare_and_set(&key, None, Some(b"first".to_vec()))
            .unwrap()
            .expect("a new record is written");
        assert_eq!(m.owned_files(), 1, "the file is held in memory");
        assert!(store.lease_proven());

        m.leave();
        assert!(
            !store.lease_proven(),
            "the node still decides from memory after it left"
        );
        let after = store.compare_and_set(&key, Some(v), Some(b"after".to_vec()));
        assert!(
            matches!(after, Err(StateError::Unavailable(_))),
            "a write to a file held in memory after leaving: {after:?}"
        );
        // Its lease is gone from etcd, and with it its incarnation.
        assert!(m.control.get(&node_key("t1")).unwrap().is_none());
        // A renewal answered now (as one sent before the leave would be)
        // proves nothing.
        m.proved(Instant::now());
        assert!(!store.lease_proven());
        assert!(m.store.get(b"probe").is_err(), "the store still calls etcd");
    }

    /// Nodes of one record layout join each other; a node refuses to join
    /// running nodes of a release that keys files otherwise (no layout
    /// written beside their registration, as before 2026-12-05, or
    /// another one), naming them, and joins once they are gone.
    #[test]
    fn a_node_refuses_to_join_nodes_that_key_files_otherwise() {
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start("layout");
        let first = Membership::join(&test_config(&etcd, "t1", 10)).unwrap();
        let second = Membership::join(&test_config(&etcd, "t2", 10)).unwrap();
        for node in ["t1", "t2"] {
            let written = first.control.get(&layout_key(node)).unwrap().unwrap();
            assert_eq!(written.value, LAYOUT);
        }
        // A node of an older release registers as it did: no layout.
        let old_lease = first.control.grant_lease(10).unwrap();
        assert!(first
            .control
            .create_with_lease(&node_key("old"), b"127.0.0.1:1", old_lease)
            .unwrap());
        match Membership::join(&test_config(&etcd, "t3", 10)) {
            Err(e @ JoinError::Layout(_)) => {
                let told = e.to_string();
                assert!(told.contains("node(s) old run a release older"), "{told}");
                assert!(told.contains("stop every node"), "{told}");
                assert!(told.contains("node_ttl_secs"), "{told}");
            }
            other => panic!("joined a node of an older layout: {:?}", other.err()),
        }
        assert!(first.control.get(&node_key("t3")).unwrap().is_none());
        // Running nodes see it too, when they check again.
        assert!(matches!(second.check_layout(), Err(JoinError::Layout(_))));
        // Or one of another layout.
        first
            .control
            .txn(
                &[],
                &[Op::Put(&layout_key("old"), b"some-later-layout", old_lease)],
                &[],
            )
            .unwrap();
        match Membership::join(&test_config(&etcd, "t3", 10)) {
            Err(e @ JoinError::Layout(_)) => {
                assert!(e.to_string().contains("some-later-layout"), "{e}")
            }
            other => panic!("joined a node of another layout: {:?}", other.err()),
        }
        // Once it is gone, nodes join again; what a gone node wrote
        // counts for nothing (a rollback leaves no stale mark).
        first.control.revoke_lease(old_lease).unwrap();
        assert!(first.control.get(&layout_key("old")).unwrap().is_none());
        let third = Membership::join(&test_config(&etcd, "t3", 10)).unwrap();
        third.leave();
        second.leave();
        first.leave();
    }

    /// A node that leaves while it joins again, after it registered under
    /// its new lease and before it wrote its new incarnation's record,
    /// leaves nothing behind: `leave` ends the new lease, and the record
    /// is not written on no lease (it would keep the incarnation, and the
    /// files it owns, alive for good).
    #[test]
    fn a_node_that_leaves_while_it_joins_again_leaves_no_record() {
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start("leaverejoin");
        let m = Arc::new(Membership::join(&test_config(&etcd, "t1", 2)).unwrap());
        m.set_owned_store(owned_store(&m));
        let held = m.rejoin_gate.arm();
        // The lease is lost; the node joins again (what its renewal thread
        // does then, here on a thread of the test's).
        let lease = m.lease();
        m.control.revoke_lease(lease).unwrap();
        m.lose("the test revoked the lease");
        assert!(m.is_lost());
        let joining = {
            let m = m.clone();
            std::thread::spawn(move || m.rejoin())
        };
        held.reached(Duration::from_secs(20));
        assert_ne!(m.lease(), lease);
        assert!(m.control.get(&node_key("t1")).unwrap().is_some());
        m.leave();
        held.release();
        let joined = joining.join().unwrap();
        let record = m.control.get(&incarnation_key(m.incarnation())).unwrap();
        assert!(
            record.is_none(),
            "the new incarnation's record outlives the node that left: {record:?}"
        );
        assert!(joined.is_err(), "{joined:?}");
        assert!(m.control.get(&node_key("t1")).unwrap().is_none());
        assert_eq!(m.lease(), 0);
    }

    /// Counts `m`'s lost leases in `losses`.
    fn count_losses(m: &Membership, losses: &Arc<AtomicUsize>) {
        let counted = losses.clone();
        m.on_lease_lost(Box::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
    }

    /// A renewal under way when the node leaves finds its lease revoked:
    /// not a lost lease. Nothing that runs at a loss runs (it would drop
    /// clients a stopping server drains), and the node is not marked
    /// lost, so nothing joins it again.
    #[test]
    fn a_node_that_left_does_not_lose_its_lease() {
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start("leftnotlost");
        let m = Arc::new(Membership::join(&test_config(&etcd, "t1", 2)).unwrap());
        m.set_owned_store(owned_store(&m));
        let losses = Arc::new(AtomicUsize::new(0));
        count_losses(&m, &losses);
        m.leave();
        m.lose("the renewal found the lease revoked");
        assert!(!m.is_lost(), "a node that left is marked lost");
        assert_eq!(losses.load(Ordering::SeqCst), 0, "a loss ran after leaving");
        // A node that did not leave loses it.
        let other = Membership::join(&test_config(&etcd, "t2", 2)).unwrap();
        count_losses(&other, &losses);
        other.lose("the test revoked the lease");
        assert!(other.is_lost());
        assert_eq!(losses.load(Ordering::SeqCst), 1);
        other.leave();
    }

    /// A node whose lease etcd ended joins again under a new lease and a
    /// new incarnation, renews the new lease as it did the first, and
    /// decides again: the renewal thread does not stop (nor deadlock) at
    /// the new registration.
    #[test]
    fn a_node_that_lost_its_lease_joins_again_and_renews_the_new_one() {
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start("rejoin");
        let ttl = Duration::from_secs(2);
        let m = Arc::new(Membership::join(&test_config(&etcd, "t1", 2)).unwrap());
        m.set_owned_store(owned_store(&m));
        let losses = Arc::new(AtomicUsize::new(0));
        count_losses(&m, &losses);
        m.clone().keep_alive();
        let (lease, incarnation) = (m.lease(), m.incarnation());
        m.control.revoke_lease(lease).unwrap();
        wait_for("the node joins again", ttl * 3, || {
            m.lease() != lease && !m.is_lost()
        });
        assert_eq!(losses.load(Ordering::SeqCst), 1);
        assert_ne!(m.incarnation(), incarnation);
        assert!(m.is_gone(incarnation), "the old incarnation lives on");
        let renewed = m.lease();
        // Three TTLs later the node is still registered under the new
        // lease: it was renewed all along.
        let until = Instant::now() + ttl * 3;
        while Instant::now() < until {
            assert!(
                m.control.get(&node_key("t1")).unwrap().is_some(),
                "the new lease was not renewed"
            );
            assert_eq!(m.lease(), renewed);
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(losses.load(Ordering::SeqCst), 1);
        // And its writes, fenced on the new incarnation, go through.
        let put = m.store.txn(
            &[],
            &[nimbus_state::etcd_store::Op::Put(b"probe", b"1", 0)],
            &[],
        );
        assert!(put.unwrap().succeeded);
        m.leave();
    }
}
