//! Cluster membership (`[cluster]`): this node's record in etcd,
//! `nodes/<name>` holding the address clients reach it at, under a lease
//! of `node_ttl_secs` that a task renews every third of it. A node that
//! dies stops renewing, and its record (and, in later steps, everything it
//! owns under the same lease) goes when the lease expires; a node cut off
//! from etcd that finds its lease expired when it comes back registers
//! again without a restart. SIGTERM revokes the lease: the node leaves at
//! once.
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
//! client and deletes. What is not here yet (issue 15, later steps):
//! directory leases and notify across nodes, and failover of persistent
//! handles.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use nimbus_state::cluster_store::ClusterStore;
use nimbus_state::{EtcdStore, StateError, StateStore};

use crate::config::ClusterConfig;

/// Every key of a Nimbus cluster starts with this in etcd.
pub const KEY_PREFIX: &[u8] = b"/nimbus/";

/// Key prefix of the membership records.
pub const NODES_PREFIX: &[u8] = b"nodes/";

/// Key prefix of the incarnation records; the counter they are drawn from.
pub const INCARNATIONS_PREFIX: &[u8] = b"incarnations/";
const INCARNATION_COUNTER: &[u8] = b"incarnation-counter";

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

/// Open ids are `incarnation << OPEN_ID_SHIFT | random bits`.
pub const OPEN_ID_SHIFT: u32 = 40;
/// Incarnations fit in the 24 bits above the counter.
const MAX_INCARNATION: u64 = (1 << (64 - OPEN_ID_SHIFT)) - 1;

/// The incarnation an open id was made by (0: a node without a cluster).
pub fn incarnation_of(open_id: u64) -> u64 {
    open_id >> OPEN_ID_SHIFT
}

fn message_box(node: &str) -> Vec<u8> {
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

/// How long one etcd call may take on one endpoint.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Membership {
    pub store: Arc<EtcdStore>,
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
    /// The store whose ownerships live under the lease.
    owned: OnceLock<Arc<ClusterStore>>,
    /// When the last registration or renewal that etcd answered was sent:
    /// the lease lasts at least the TTL from then.
    last_proof: Mutex<Option<Instant>>,
    /// Registered again under a new lease, and what was kept under the
    /// old one not yet settled (`settle_new_lease`): the new lease proves
    /// nothing until it is.
    settling: AtomicBool,
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
    /// (`crate::failover::let_go`): another node serves them now, whose
    /// breaks this node forwards, and their entries are not this node's to
    /// decide from memory. Each is kept until its record is gone.
    released: Mutex<HashSet<u64>>,
    /// This node's requests to let go of an open that wait for the other
    /// node's answer (open id, request number), each with what resumes
    /// its reconnect (`crate::failover::reclaim`).
    let_go_waits: Mutex<std::collections::HashMap<(u64, u64), (LetGoWait, tokio::runtime::Handle)>>,
    /// Requests to let go asked for each session lately: one session may
    /// not make this node flood other nodes with them.
    let_go_asks: Mutex<std::collections::HashMap<u64, (Instant, u32)>>,
    /// Opens of gone nodes found with a persistent record, and when.
    with_record: Mutex<std::collections::HashMap<u64, Instant>>,
    /// Opens of gone nodes found without one: it never comes back.
    without_record: Mutex<HashSet<u64>>,
}

/// Puts back what a node keeps under its lease, given the new lease.
pub type NewLease = Box<dyn Fn(i64) + Send + Sync>;

/// How often ownerships of files nobody has open are looked for, and how
/// long such a file is kept (a file opened again soon costs no etcd call).
const SWEEP_EVERY: Duration = Duration::from_secs(5);
const SWEEP_IDLE: Duration = Duration::from_secs(30);

/// How long an incarnation found alive is taken to be, without asking.
const ALIVE_FOR: Duration = Duration::from_secs(1);

/// How long an operation waits for another node to hand a file over:
/// past it, that node's lease has expired and etcd took its ownership.
fn handover_timeout(ttl: Duration) -> Duration {
    ttl * 2 + Duration::from_secs(2)
}

/// The store share modes, byte-range locks, oplocks and leases are decided
/// in: per-file ownership over etcd, under this node's lease. A file may be
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
        vec![OPENS_PREFIX, LOCKS_PREFIX, CACHING_PREFIX],
        &m.incarnation().to_string(),
        m.lease(),
        claimable,
        handover_timeout(m.ttl),
    ))
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

impl Membership {
    /// Connects to etcd and registers this node. A record of the same
    /// name that is still alive may be this node's own from before a
    /// crash (its lease not yet expired): it is waited out, up to one
    /// TTL; one that outlives that belongs to a running node, and this
    /// one refuses to start.
    pub fn join(cfg: &ClusterConfig) -> Result<Membership, String> {
        let store = EtcdStore::new(&cfg.etcd, KEY_PREFIX, CALL_TIMEOUT)
            .map_err(|e| format!("[cluster] etcd: {e}"))?;
        store.check().map_err(|e| {
            format!(
                "[cluster] etcd: the cluster does not answer ({e}); start etcd, or fix the \
                 client URLs in [cluster] etcd"
            )
        })?;
        let m = Membership {
            store: Arc::new(store),
            node: cfg.node.clone(),
            advertise: cfg.advertise,
            ttl: Duration::from_secs(cfg.node_ttl_secs as u64),
            lease: AtomicI64::new(0),
            incarnation: AtomicU64::new(0),
            adopted: Mutex::new(HashSet::new()),
            gone: Mutex::new(HashSet::new()),
            alive: Mutex::new(std::collections::HashMap::new()),
            owned: OnceLock::new(),
            last_proof: Mutex::new(None),
            settling: AtomicBool::new(false),
            stopping: Arc::new(AtomicBool::new(false)),
            next_message: AtomicU64::new(1),
            on_new_lease: Mutex::new(Vec::new()),
            pinned: Mutex::new(HashSet::new()),
            released: Mutex::new(HashSet::new()),
            let_go_waits: Mutex::new(std::collections::HashMap::new()),
            let_go_asks: Mutex::new(std::collections::HashMap::new()),
            with_record: Mutex::new(std::collections::HashMap::new()),
            without_record: Mutex::new(HashSet::new()),
        };
        let until = Instant::now() + m.ttl + Duration::from_secs(1);
        loop {
            if m.register()
                .map_err(|e| format!("[cluster]: registering node: {e}"))?
            {
                break;
            }
            if Instant::now() >= until {
                return Err(format!(
                    "[cluster] node: another running node is registered as \"{}\" (its record \
                     outlived node_ttl_secs); give this node a name of its own",
                    m.node
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let n = m
            .new_incarnation()
            .map_err(|e| format!("[cluster]: numbering this run: {e}"))?;
        m.incarnation.store(n, Ordering::SeqCst);
        m.put_incarnations()
            .map_err(|e| format!("[cluster]: registering this run: {e}"))?;
        tracing::info!(
            "cluster: joined as node \"{}\" (clients reach it at {}), lease {}s, incarnation {n}",
            m.node,
            m.advertise,
            m.ttl.as_secs()
        );
        Ok(m)
    }

    /// Draws the next number from the cluster's counter.
    fn new_incarnation(&self) -> Result<u64, StateError> {
        loop {
            let current = self.store.get(INCARNATION_COUNTER)?;
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
                .store
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
        let mut all = vec![self.incarnation()];
        all.extend(crate::session::lock(&self.adopted).iter().copied());
        for n in all {
            self.store.txn(
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

    /// Sets the store whose ownerships follow the lease; once.
    pub fn set_owned_store(&self, store: Arc<ClusterStore>) {
        // Read into a local first: a guard in an `if let` scrutinee would
        // live through the body.
        let proof = *crate::session::lock(&self.last_proof);
        if let Some(sent) = proof {
            store.lease_proven_until(sent + self.ttl);
        }
        let _ = self.owned.set(store);
    }

    /// After a new registration: what lived under the old lease is put
    /// under the new one (incarnations, files held, what `on_new_lease`
    /// keeps), and files other nodes took meanwhile are dropped. Until it
    /// has all been done, the new lease proves nothing.
    fn settle_new_lease(&self) -> Result<(), StateError> {
        self.put_incarnations()?;
        if let Some(s) = self.owned.get() {
            s.rebind(self.lease());
        }
        for f in crate::session::lock(&self.on_new_lease).iter() {
            f(self.lease());
        }
        self.settling.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Etcd answered a registration or renewal sent at `sent`: the files
    /// this node holds may be decided here until the TTL from then.
    fn proved(&self, sent: Instant) {
        if self.settling.load(Ordering::SeqCst) {
            return;
        }
        *crate::session::lock(&self.last_proof) = Some(sent);
        if let Some(s) = self.owned.get() {
            s.lease_proven_until(sent + self.ttl);
        }
    }

    /// Takes an earlier run's opens over (persistent handles restored at
    /// start): its incarnation lives on under this node's lease.
    pub fn adopt(&self, incarnation: u64) -> Result<(), StateError> {
        if incarnation == 0 || incarnation == self.incarnation() {
            return Ok(());
        }
        if crate::session::lock(&self.adopted).insert(incarnation) {
            self.put_incarnations()?;
        }
        Ok(())
    }

    /// Whether the opens of `incarnation` belong to a run that is over
    /// (its node died or left, and nobody adopted them). An etcd that does
    /// not answer proves nothing: not gone.
    pub fn is_gone(&self, incarnation: u64) -> bool {
        if incarnation == 0
            || incarnation == self.incarnation()
            || crate::session::lock(&self.adopted).contains(&incarnation)
        {
            return false;
        }
        if crate::session::lock(&self.gone).contains(&incarnation) {
            return true;
        }
        let fresh = |at: &Instant| at.elapsed() < ALIVE_FOR;
        if crate::session::lock(&self.alive)
            .get(&incarnation)
            .is_some_and(fresh)
        {
            return false;
        }
        match self.store.get(&incarnation_key(incarnation)) {
            Ok(None) => {
                crate::session::lock(&self.alive).remove(&incarnation);
                crate::session::lock(&self.gone).insert(incarnation);
                true
            }
            Ok(Some(v)) => {
                tracing::debug!(
                    "cluster: incarnation {incarnation} alive ({})",
                    String::from_utf8_lossy(&v.value)
                );
                let mut alive = crate::session::lock(&self.alive);
                alive.retain(|_, at| fresh(at));
                alive.insert(incarnation, Instant::now());
                false
            }
            Err(e) => {
                tracing::debug!("cluster: is incarnation {incarnation} gone? etcd: {e}");
                false
            }
        }
    }

    /// `is_gone` without trusting that `incarnation` was seen alive in the
    /// last second: a client reconnects right after its node left.
    pub fn is_gone_now(&self, incarnation: u64) -> bool {
        crate::session::lock(&self.alive).remove(&incarnation);
        self.is_gone(incarnation)
    }

    /// `open_id` is a persistent open of this node: its file's records
    /// stay in etcd.
    pub fn pin(&self, open_id: u64) {
        crate::session::lock(&self.pinned).insert(open_id);
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
        crate::session::lock(&self.pinned).remove(&open_id);
    }

    pub fn is_pinned(&self, open_id: u64) -> bool {
        crate::session::lock(&self.pinned).contains(&open_id)
    }

    /// Whether this node runs `incarnation`: its own, or one it adopted.
    pub fn runs(&self, incarnation: u64) -> bool {
        incarnation == self.incarnation()
            || crate::session::lock(&self.adopted).contains(&incarnation)
    }

    /// This node let go of its own open `open_id` for its client on
    /// another node: it stays pinned (its entries name this node, and its
    /// file's records stay in etcd for whoever holds it).
    pub fn mark_released(&self, open_id: u64) {
        self.pin(open_id);
        crate::session::lock(&self.released).insert(open_id);
    }

    /// Whether `open_id` is an open of this node's that it let go of.
    pub fn is_released(&self, open_id: u64) -> bool {
        crate::session::lock(&self.released).contains(&open_id)
    }

    /// The opens this node let go of.
    pub fn released(&self) -> Vec<u64> {
        crate::session::lock(&self.released)
            .iter()
            .copied()
            .collect()
    }

    /// Whether a reconnect may wait for another node's answer now: the
    /// runtime to run it again on, while fewer than `MAX_LET_GO_WAITS`
    /// wait.
    pub fn let_go_room(&self) -> Option<tokio::runtime::Handle> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        (crate::session::lock(&self.let_go_waits).len() < MAX_LET_GO_WAITS).then_some(runtime)
    }

    /// Waits for the answer to request `nonce` for `open_id`: `resume`
    /// runs when it comes, or when `wait_at_most` has passed without one,
    /// on `runtime`'s blocking pool (the reconnect asks etcd again).
    pub fn await_let_go(
        self: &Arc<Self>,
        open_id: u64,
        nonce: u64,
        resume: LetGoWait,
        runtime: tokio::runtime::Handle,
        wait_at_most: Duration,
    ) {
        crate::session::lock(&self.let_go_waits)
            .insert((open_id, nonce), (resume, runtime.clone()));
        let me = Arc::downgrade(self);
        runtime.spawn(async move {
            tokio::time::sleep(wait_at_most).await;
            if let Some(m) = me.upgrade() {
                m.let_go_answered(open_id, nonce);
            }
        });
    }

    /// The answer to request `nonce` for `open_id` came (or its wait ran
    /// out): what waits on it runs.
    pub fn let_go_answered(&self, open_id: u64, nonce: u64) {
        let waiting = crate::session::lock(&self.let_go_waits).remove(&(open_id, nonce));
        if let Some((resume, runtime)) = waiting {
            runtime.spawn_blocking(resume);
        }
    }

    /// A reconnect cancelled while it waited: nothing runs for it.
    pub fn forget_let_go(&self, open_id: u64, nonce: u64) {
        crate::session::lock(&self.let_go_waits).remove(&(open_id, nonce));
    }

    /// Whether session `session_id` may ask another node to let go of an
    /// open now: at most `LET_GO_ASKS_PER_SESSION` in each
    /// `LET_GO_ASK_WINDOW`.
    pub fn may_ask_to_let_go(&self, session_id: u64) -> bool {
        let now = Instant::now();
        let mut asks = crate::session::lock(&self.let_go_asks);
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

    /// `open_id` closed for good (or was never let go of after all).
    pub fn forget_released(&self, open_id: u64) {
        if crate::session::lock(&self.released).remove(&open_id) {
            self.unpin(open_id);
        }
    }

    /// Whether an open is over for good: its node is gone, and it is not a
    /// persistent open whose record waits in etcd for its client (those
    /// keep their share modes, locks and caching until reclaimed or
    /// expired: `crate::failover`). An etcd that does not answer proves
    /// nothing: not gone.
    pub fn open_is_gone(&self, open_id: u64) -> bool {
        if !self.is_gone(incarnation_of(open_id)) {
            return false;
        }
        if crate::session::lock(&self.without_record).contains(&open_id) {
            return true;
        }
        let fresh = |at: &Instant| at.elapsed() < ALIVE_FOR;
        if crate::session::lock(&self.with_record)
            .get(&open_id)
            .is_some_and(fresh)
        {
            return false;
        }
        let key = nimbus_state::durable_record::DurableOpen::key(open_id);
        match self.store.get(&key) {
            Ok(None) => {
                crate::session::lock(&self.with_record).remove(&open_id);
                let mut without = crate::session::lock(&self.without_record);
                // Bounded: forgetting costs one more look-up, nothing else.
                if without.len() >= 1 << 16 {
                    without.clear();
                }
                without.insert(open_id);
                true
            }
            Ok(Some(_)) => {
                let mut with = crate::session::lock(&self.with_record);
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
        let lease = self.store.grant_lease(self.ttl.as_secs() as i64)?;
        let value = self.advertise.to_string();
        if self
            .store
            .create_with_lease(&node_key(&self.node), value.as_bytes(), lease)?
        {
            self.lease.store(lease, Ordering::SeqCst);
            // Proves the new lease only once the caller has settled what
            // the node held under the old one (`ClusterStore::rebind`).
            *crate::session::lock(&self.last_proof) = Some(sent);
            return Ok(true);
        }
        let _ = self.store.revoke_lease(lease);
        Ok(false)
    }

    /// Renews the lease every third of the TTL, for as long as the server
    /// runs; an expired lease (etcd was out of reach for longer than the
    /// TTL) is replaced by a new registration.
    ///
    /// On a thread of its own, not the async runtime: a request waiting on
    /// etcd while it holds a lock others want can keep the runtime's workers
    /// busy for as long as a hand-over takes (up to twice the TTL), and the
    /// lease must not lapse meanwhile.
    pub fn keep_alive(self: Arc<Self>) {
        let period = self.ttl / 3;
        let spawned = std::thread::Builder::new()
            .name("nimbus-lease".into())
            .spawn(move || self.renew_every(period));
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the lease renewal thread: {e}");
        }
    }

    fn renew_every(self: Arc<Self>, period: Duration) {
        loop {
            std::thread::sleep(period);
            if self.is_stopping() {
                // The node left: its lease is revoked, not to be renewed or
                // replaced by a new registration.
                return;
            }
            let m = self.clone();
            let renewed = (move || {
                // A registration whose settling failed (etcd answered
                // again only in part) is settled before anything proves
                // the new lease.
                if m.settling.load(Ordering::SeqCst) {
                    m.settle_new_lease()?;
                }
                let lease = m.lease.load(Ordering::SeqCst);
                let sent = Instant::now();
                match m.store.keep_alive(lease) {
                    Ok(true) => {
                        m.proved(sent);
                        Ok(true)
                    }
                    Ok(false) => {
                        tracing::warn!(
                            "cluster: node \"{}\"'s lease expired (etcd out of reach for longer \
                             than node_ttl_secs); registering again",
                            m.node
                        );
                        let registered = m.register()?;
                        if registered {
                            m.settling.store(true, Ordering::SeqCst);
                            m.settle_new_lease()?;
                            // Read into a local first: `proved` takes the
                            // same lock, and a guard in an `if let`
                            // scrutinee would live through the body.
                            let proof = *crate::session::lock(&m.last_proof);
                            if let Some(sent) = proof {
                                m.proved(sent);
                            }
                        }
                        Ok(registered)
                    }
                    Err(e) => Err(e),
                }
            })();
            match renewed {
                Ok(true) => {}
                Ok(false) => tracing::error!(
                    "cluster: node \"{}\" cannot register again: another node holds its name",
                    self.node
                ),
                Err(e) => tracing::warn!("cluster: lease renewal failed: {e}"),
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
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(SWEEP_EVERY);
                    store.sweep(SWEEP_IDLE);
                }
            });
        if let Err(e) = spawned {
            tracing::error!("cluster: cannot start the ownership sweep: {e}");
        }
    }

    /// Starts a thread (named `name`) that calls `changed` with the key of
    /// every record under `prefix` another node (or this one) changes in
    /// etcd, and `tick` once per `every` and whenever changes may have been
    /// missed (the watch fell behind etcd's compaction), for as long as the
    /// process runs.
    pub fn watch_records(
        self: Arc<Self>,
        name: &str,
        prefix: Vec<u8>,
        every: Duration,
        changed: impl Fn(&[u8]) + Send + 'static,
        tick: impl Fn() + Send + 'static,
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
                    let w = match watch.as_mut() {
                        Some(w) => w,
                        None => match self.store.revision() {
                            // From now on; what came before is covered by
                            // the tick.
                            Ok(r) => {
                                tick();
                                last_tick = Instant::now();
                                watch.insert(self.store.watch(&prefix, r + 1))
                            }
                            Err(e) => {
                                tracing::warn!("cluster: watching {}: {e}", name);
                                std::thread::sleep(Duration::from_millis(200));
                                continue;
                            }
                        },
                    };
                    match w.next(every) {
                        Ok(batch) => {
                            if batch.resync {
                                watch = None;
                            }
                            for e in &batch.events {
                                changed(&e.key);
                            }
                        }
                        Err(e) => {
                            tracing::warn!("cluster: watching {}: {e}", name);
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                    if last_tick.elapsed() >= every {
                        tick();
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
        crate::session::lock(&self.on_new_lease).push(f);
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
    pub fn send_break(&self, open_id: u64, order: &nimbus_state::caching::BreakOrder) -> bool {
        let mut to = incarnation_of(open_id);
        // A gone node's open another node took over, or one this node let
        // go of for its client on another node.
        if self.is_gone(to) || self.is_released(open_id) {
            match crate::failover::holder_of(self, open_id) {
                Some(h) => to = h,
                None => return self.open_is_gone(open_id),
            }
        }
        if to == 0 || self.runs(to) {
            return true;
        }
        self.post_break(to, open_id, order);
        true
    }

    /// Puts a break for `open_id` into the box of the node that runs (or
    /// adopted) incarnation `to`. A gone one gets nothing: its opens are
    /// dropped where in the way, or taken over by a node whose take-over
    /// ends the break. Whether it was posted.
    pub fn post_break(
        &self,
        to: u64,
        open_id: u64,
        order: &nimbus_state::caching::BreakOrder,
    ) -> bool {
        let posted = self.node_of(to).and_then(|node| match node {
            Some(node) => {
                let value = nimbus_state::records::encode_break(open_id, order);
                self.post(&node, &value).map(|()| true)
            }
            None => Ok(false),
        });
        posted.unwrap_or_else(|e| {
            tracing::warn!("cluster: break for open {open_id:#x} not sent: {e}");
            false
        })
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
        let n = self.next_message.fetch_add(1, Ordering::Relaxed);
        let mut key = message_box(node);
        key.extend_from_slice(format!("{}-{n}", self.incarnation()).as_bytes());
        let put = nimbus_state::etcd_store::Op::Put(&key, value, self.lease());
        self.store.txn(&[], &[put], &[]).map(|_| ())
    }

    /// Takes the message under `key` out of this node's box, once (a
    /// message another thread took already gives None).
    pub fn take_message(&self, key: &[u8]) -> Option<Vec<u8>> {
        let v = self.store.get(key).ok()??;
        match self.store.compare_and_set(key, Some(v.version), None) {
            Ok(Some(_)) => Some(v.value),
            _ => None,
        }
    }

    /// The keys of the messages waiting in this node's box.
    pub fn pending_messages(&self) -> Vec<Vec<u8>> {
        match self.store.scan_prefix(&self.inbox()) {
            Ok(found) => found.into_iter().map(|(k, _)| k).collect(),
            Err(e) => {
                tracing::warn!("cluster: reading messages: {e}");
                Vec::new()
            }
        }
    }

    /// Leaves the cluster (at shutdown): the record goes at once.
    pub fn leave(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let lease = self.lease.swap(0, Ordering::SeqCst);
        if lease != 0 {
            match self.store.revoke_lease(lease) {
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
}
