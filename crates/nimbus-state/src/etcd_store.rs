//! The cluster's backend: records in etcd, through etcd's native gRPC API
//! (`crate::etcd_rpc`: the `etcd-client` crate on one runtime of its own).
//!
//! Versions are etcd's `mod_revision`: unique and rising across the whole
//! cluster, so a compare-and-set on it detects any other writer on any
//! node. Reads are linearizable (etcd's default), so a decision made on a
//! read is made on the cluster's latest state. A whole call, every member
//! it tries included, is bounded by `timeout`; a member that fails is
//! skipped for the next one, and when none answers in time the call fails
//! `Unavailable`.
//!
//! A node's decisions go through a fenced store (`fence_on`,
//! `proven_until`): every write is conditioned, in the same transaction, on
//! a record that lives only under the node's lease, so a write that
//! reaches etcd after the lease ended fails there, whatever the node's
//! clock says; and no call starts, or runs, past the time until which the
//! node's lease is proven, so a node cut off from etcd answers its clients
//! within its TTL instead of deciding late. The node's own lease keeping
//! (grants, renewals, its registration) goes through a store without a
//! fence.
//!
//! With a record key (`sealed`), every value is written with a tag and
//! read only with a valid one (`crate::etcd_seal`): what a node acts on
//! was written by a node of its cluster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};

pub use crate::etcd_rpc::{check_ca, check_identity, Access, PemFile, PemProblem};
use crate::etcd_rpc::{Members, Retry};
use crate::etcd_seal::{RecordKey, FORGED};
use crate::store::{StateError, StateStore, Versioned};

use crate::etcd_rpc::MAX_RESPONSE;

pub struct EtcdStore {
    members: Arc<Members>,
    /// Prepended to every key: one etcd cluster may serve several Nimbus
    /// clusters, or other users.
    prefix: Vec<u8>,
    /// How long one call may take, all members included.
    timeout: Duration,
    fence: Mutex<Fence>,
    /// Calls made so far (what a change of the call pattern is measured
    /// by).
    calls: AtomicU64,
    /// Tags every value written and checks every value read.
    seal: Option<Arc<RecordKey>>,
}

/// What proves that the node may still decide (see the module comment).
#[derive(Default)]
struct Fence {
    /// A record (full key) that lives only under the node's lease: every
    /// write is made only if it still exists.
    key: Option<Vec<u8>>,
    /// Until when the node's lease is proven (None: no bound yet).
    until: Option<Instant>,
}

/// Why a fenced store refuses a call past the proof of its lease.
pub const CUT_OFF: &str = "cut off from etcd: this node's lease is not proven, so it decides \
                           nothing until etcd answers again";
/// Why a fenced write failed in etcd.
pub const LEASE_ENDED: &str = "this node's lease has ended in etcd, so it decides nothing until \
                               it has joined the cluster again";

/// Why an endpoint could not be used: a message for the operator.
#[derive(Debug)]
pub struct EndpointError(pub String);

impl std::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A client URL's scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// Checks a client URL, `http://host:port` or `https://host:port`;
/// returns its scheme and `host:port`.
pub fn parse_endpoint(url: &str) -> Result<(Scheme, String), EndpointError> {
    let (scheme, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(r), _) => (Scheme::Http, r),
        (_, Some(r)) => (Scheme::Https, r),
        _ => {
            return Err(EndpointError(format!(
                "\"{url}\": expected https://HOST:PORT (or http://HOST:PORT)"
            )))
        }
    };
    let hostport = rest.trim_end_matches('/');
    let port_ok = hostport
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !port_ok || hostport.contains('/') {
        return Err(EndpointError(format!(
            "\"{url}\": expected https://HOST:PORT (or http://HOST:PORT)"
        )));
    }
    Ok((scheme, hostport.to_string()))
}

fn unavailable(why: impl std::fmt::Display) -> StateError {
    StateError::Unavailable(why.to_string())
}

/// The smallest key above every key that starts with `prefix` (etcd's
/// range_end for a prefix scan); all 0xFF (or empty): to the end.
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Keys (without the store's prefix) and their values, in key order.
pub type Scanned = Vec<(Vec<u8>, Versioned)>;

impl EtcdStore {
    /// A store on the etcd cluster at `urls` (client URLs), its keys under
    /// `prefix`. Connects lazily; `check` proves the cluster answers.
    pub fn new(
        urls: &[String],
        prefix: &[u8],
        timeout: Duration,
    ) -> Result<EtcdStore, EndpointError> {
        EtcdStore::with_access(urls, prefix, timeout, Access::default())
    }

    /// `new`, reaching etcd as `access` says (TLS, a client certificate,
    /// a user). https:// endpoints need the CA; http:// ones take none.
    pub fn with_access(
        urls: &[String],
        prefix: &[u8],
        timeout: Duration,
        access: Access,
    ) -> Result<EtcdStore, EndpointError> {
        if urls.is_empty() {
            return Err(EndpointError("no etcd endpoints".into()));
        }
        for u in urls {
            let (scheme, _) = parse_endpoint(u)?;
            match (scheme, access.ca_pem.is_some()) {
                (Scheme::Https, false) => {
                    return Err(EndpointError(format!(
                        "\"{u}\": an https:// endpoint needs the CA that signed the members' \
                         certificates"
                    )))
                }
                (Scheme::Http, true) => {
                    return Err(EndpointError(format!(
                        "\"{u}\": TLS is configured, so every endpoint is https://"
                    )))
                }
                _ => {}
            }
        }
        let members = Members::new(urls, access)
            .map_err(|e| EndpointError(format!("starting the etcd client: {e}")))?;
        let members = Arc::new(members);
        members.follow();
        Ok(EtcdStore {
            members,
            prefix: prefix.to_vec(),
            timeout,
            fence: Mutex::new(Fence::default()),
            calls: AtomicU64::new(0),
            seal: None,
        })
    }

    /// This store, its values tagged with `key` when written and refused
    /// without a valid tag when read.
    pub fn sealed(mut self, key: Arc<RecordKey>) -> EtcdStore {
        self.seal = Some(key);
        self
    }

    /// A value as written under `full_key`.
    fn seal_value(&self, full_key: &[u8], value: &[u8]) -> Vec<u8> {
        match &self.seal {
            Some(k) => k.seal(full_key, value),
            None => value.to_vec(),
        }
    }

    /// etcd's answer to a read of every key under `prefix`, in key order
    /// (`keys_only`: without their values).
    /// From `start` on (a key under `prefix`, or `prefix` itself), at
    /// most `limit` keys (0: all).
    fn range(
        &self,
        prefix: &[u8],
        start: &[u8],
        keys_only: bool,
        limit: i64,
    ) -> Result<etcd_client::GetResponse, StateError> {
        let full = self.full_key(start);
        let end = prefix_end(&self.full_key(prefix));
        self.call("Range", Retry::Anywhere, move |c| {
            let (full, end) = (full.clone(), end.clone());
            async move {
                let mut options = GetOptions::new()
                    .with_range(end)
                    .with_limit(limit)
                    .with_sort(SortTarget::Key, SortOrder::Ascend);
                if keys_only {
                    options = options.with_keys_only();
                }
                c.kv_client()
                    .max_decoding_message_size(MAX_RESPONSE)
                    .get(full, Some(options))
                    .await
            }
        })
    }

    /// Every key under `prefix`; with `skip_forged`, a value that fails
    /// its seal is left out and counted (logged by `versioned`) instead of
    /// failing the whole read: for listings, where one forged record must
    /// not hide the others.
    fn scan(&self, prefix: &[u8], skip_forged: bool) -> Result<(Scanned, usize), StateError> {
        let r = self.range(prefix, prefix, false, 0)?;
        self.scanned(&r, skip_forged)
    }

    /// A page of `scan_prefix_skipping_forged`: at most `limit` keys from
    /// `start` on (a key under `prefix`, or `prefix` itself), the number
    /// of values refused, and whether keys are left after the page.
    pub fn scan_page_skipping_forged(
        &self,
        prefix: &[u8],
        start: &[u8],
        limit: i64,
    ) -> Result<(Scanned, usize, bool), StateError> {
        let r = self.range(prefix, start, false, limit)?;
        let (page, refused) = self.scanned(&r, true)?;
        Ok((page, refused, r.more()))
    }

    /// The records of a range read.
    fn scanned(
        &self,
        r: &etcd_client::GetResponse,
        skip_forged: bool,
    ) -> Result<(Scanned, usize), StateError> {
        let (mut out, mut refused) = (Vec::new(), 0);
        for kv in r.kvs() {
            let Some(key) = kv.key().strip_prefix(self.prefix.as_slice()) else {
                return Err(StateError::Corrupt(
                    "etcd: a key outside the store's prefix",
                ));
            };
            match self.versioned(kv) {
                Ok(v) => out.push((key.to_vec(), v)),
                Err(_) if skip_forged => refused += 1,
                Err(e) => return Err(e),
            }
        }
        Ok((out, refused))
    }

    /// Every key under `prefix` with the revision its record was created
    /// at (`created`), keys only: in key order.
    pub fn scan_created(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, u64)>, StateError> {
        let r = self.range(prefix, prefix, true, 0)?;
        r.kvs()
            .iter()
            .map(|kv| match kv.key().strip_prefix(self.prefix.as_slice()) {
                Some(key) => Ok((key.to_vec(), kv.create_revision() as u64)),
                None => Err(StateError::Corrupt(
                    "etcd: a key outside the store's prefix",
                )),
            })
            .collect()
    }

    /// `scan_prefix`, leaving out (and counting) values that fail their
    /// seal.
    pub fn scan_prefix_skipping_forged(
        &self,
        prefix: &[u8],
    ) -> Result<(Scanned, usize), StateError> {
        self.scan(prefix, true)
    }

    /// A record as etcd gave it; refused when its tag is not valid.
    fn versioned(&self, kv: &etcd_client::KeyValue) -> Result<Versioned, StateError> {
        let value = match &self.seal {
            Some(k) => k.open(kv.key(), kv.value()).ok_or_else(|| {
                tracing::warn!("etcd: {FORGED}: {}; refused", kv.key().escape_ascii());
                StateError::Corrupt(FORGED)
            })?,
            None => kv.value(),
        };
        Ok(Versioned {
            version: kv.mod_revision() as u64,
            value: value.to_vec(),
        })
    }

    /// The client URLs calls go to now (the configured ones, or the
    /// members' own once members were replaced).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.urls()
    }

    /// One linearizable read, to prove the cluster is reachable and has a
    /// leader (a read of a missing key is fine).
    pub fn check(&self) -> Result<(), StateError> {
        self.get(b"\0check").map(|_| ())
    }

    /// Fences this store on `key` (a record under the node's lease, as
    /// this store names it): from now on every write is made only while
    /// it exists.
    pub fn fence_on(&self, key: &[u8]) {
        let full = self.full_key(key);
        self.lock_fence().key = Some(full);
    }

    /// The node's lease is proven until `until`: no call starts, or runs,
    /// past it.
    pub fn proven_until(&self, until: Instant) {
        self.lock_fence().until = Some(until);
    }

    fn lock_fence(&self) -> std::sync::MutexGuard<'_, Fence> {
        self.fence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When a call starting now must be over by, or why it may not start.
    fn deadline(&self) -> Result<Instant, StateError> {
        let now = Instant::now();
        let by = now + self.timeout;
        let until = self.lock_fence().until;
        match until {
            Some(until) if until <= now => Err(StateError::Unavailable(CUT_OFF.into())),
            Some(until) => Ok(by.min(until)),
            None => Ok(by),
        }
    }

    fn full_key(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k
    }

    /// Makes one call (see `Members::call`), counted, and for the
    /// Prometheus endpoint by `kind` (etcd's own name of the RPC: "Range",
    /// "Txn", "LeaseGrant", ...) with its outcome and latency.
    fn call<T, F, Fut>(&self, kind: &'static str, retry: Retry, op: F) -> Result<T, StateError>
    where
        T: Send + 'static,
        F: Fn(etcd_client::Client) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        self.calls.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        CALLS_ON_THIS_THREAD.with(|c| c.set(c.get() + 1));
        let deadline = self.deadline()?;
        let started = Instant::now();
        let r = self.members.call(deadline, retry, op);
        crate::metrics_names::etcd_call(kind, r.is_ok(), started);
        r
    }

    /// Grants a lease of `ttl_secs`; records put under it go when it
    /// expires (a node's membership and ownership keys).
    pub fn grant_lease(&self, ttl_secs: i64) -> Result<i64, StateError> {
        let r = self.call("LeaseGrant", Retry::IfNotSent, move |mut c| async move {
            c.lease_grant(ttl_secs, None).await
        })?;
        if r.id() == 0 || !r.error().is_empty() {
            return Err(unavailable(format!("etcd granted no lease: {}", r.error())));
        }
        Ok(r.id())
    }

    /// The etcd version the member that answers runs ("3.4.23"), as its
    /// Status call reports it.
    pub fn server_version(&self) -> Result<String, StateError> {
        self.call("Status", Retry::Anywhere, move |mut c| async move {
            c.status().await.map(|s| s.version().to_string())
        })
    }

    /// Renews lease `id`; Ok(false) when it had already expired.
    pub fn keep_alive(&self, id: i64) -> Result<bool, StateError> {
        self.call("LeaseKeepAlive", Retry::Anywhere, move |mut c| async move {
            match c.lease_keep_alive(id).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(_)) => Ok(false),
                Err(e) => Err(e),
            }
        })
    }

    pub fn revoke_lease(&self, id: i64) -> Result<(), StateError> {
        self.call("LeaseRevoke", Retry::Anywhere, move |mut c| async move {
            c.lease_revoke(id).await.map(|_| ())
        })
    }

    /// The revision at which `key`'s record was created (None: no live
    /// record has it), read linearizably. A record deleted and put again
    /// has a new one, so this tells a lease's record from a later one of
    /// the same name (`ClusterStore`'s dead owners).
    pub fn created(&self, key: &[u8]) -> Result<Option<u64>, StateError> {
        let full = self.full_key(key);
        let r = self.call("Range", Retry::Anywhere, move |mut c| {
            let full = full.clone();
            async move { c.get(full, None).await }
        })?;
        Ok(r.kvs().first().map(|kv| kv.create_revision() as u64))
    }

    /// Creates `key` with `value` under lease `lease` if no live record
    /// has it: Ok(false) when one does.
    pub fn create_with_lease(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<bool, StateError> {
        let t = self.txn(&[Cmp::Absent(key)], &[Op::Put(key, value, lease)], &[])?;
        Ok(t.succeeded)
    }
}

/// One condition of a transaction (`EtcdStore::txn`), on a key of the
/// store (its prefix added).
#[derive(Clone, Copy)]
pub enum Cmp<'a> {
    /// No live record has the key.
    Absent(&'a [u8]),
    /// The key's record is at this version (mod_revision); None: absent.
    Version(&'a [u8], Option<u64>),
    /// The key's record holds this value.
    Value(&'a [u8], &'a [u8]),
}

/// One operation of a transaction.
#[derive(Clone, Copy)]
pub enum Op<'a> {
    /// Writes the record, under a lease when `lease` is not 0.
    Put(&'a [u8], &'a [u8], i64),
    Delete(&'a [u8]),
    /// Reads the record; its answer is in `TxnOutcome::reads`.
    Get(&'a [u8]),
}

/// One transaction of several sent together (`EtcdStore::txns`).
pub struct Txns<'a> {
    pub cmps: &'a [Cmp<'a>],
    pub success: &'a [Op<'a>],
    pub failure: &'a [Op<'a>],
}

/// How many transactions `EtcdStore::txns` sends in one request. etcd
/// refuses a transaction with more than `--max-txn-ops` (128 by default)
/// compares or operations in a branch, and checks a nested transaction
/// against that limit less its parent's count: 64 transactions sent
/// together leave each 64 (a cluster node's take has 4: see
/// docs/SCALING.md for the members' `--max-txn-ops`, which must be at
/// least 68, and the node's check at start).
pub const MAX_TXNS_PER_REQUEST: usize = 64;

/// At most this many reads go in one request (`get_many`): within the 68
/// operations a branch the members' `--max-txn-ops` must allow (above).
pub const MAX_READS_PER_REQUEST: usize = 64;

/// What a transaction did.
#[derive(Debug)]
pub struct TxnOutcome {
    pub succeeded: bool,
    /// The store's revision after it (a write's records carry it).
    pub revision: u64,
    /// The records the branch taken read, one per `Op::Get`, in order.
    pub reads: Vec<Option<Versioned>>,
}

// Tests count the calls one operation makes on the thread that makes it:
// `calls` also counts the node's own threads (a hand-over watch that etcd
// made start again, say), which run whenever they must.
#[cfg(test)]
thread_local! {
    static CALLS_ON_THIS_THREAD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many etcd calls this thread has made, through any store.
#[cfg(test)]
pub(crate) fn calls_on_this_thread() -> u64 {
    CALLS_ON_THIS_THREAD.with(|c| c.get())
}

/// How a transaction is sent, decided from what its branches write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SendRule {
    /// On a fenced store, made only while the fence's record exists: the
    /// branch taken when the conditions hold writes. (A failed fence runs
    /// the other branch, so its writes are not fenced.)
    fenced: bool,
    /// After a reset: one that writes nothing in either branch changes
    /// nothing, so anywhere; one that writes only when it surely was not
    /// sent, since etcd may have applied it.
    retry: Retry,
}

/// How a transaction whose branches are `then` and `or_else` is sent.
/// Transactions sent together (`txns`) are all the outer `then`.
fn sending<'o>(
    then: impl IntoIterator<Item = &'o Op<'o>>,
    or_else: impl IntoIterator<Item = &'o Op<'o>>,
) -> SendRule {
    let writes = |o: &Op<'_>| !matches!(o, Op::Get(_));
    let fenced = then.into_iter().any(writes);
    let writes = fenced || or_else.into_iter().any(writes);
    SendRule {
        fenced,
        retry: if writes {
            Retry::IfNotSent
        } else {
            Retry::Anywhere
        },
    }
}

/// Checks that etcd answered each of the `sent` operations of a request
/// (`what`: "reads", say) with one response.
fn answered_each<T>(responses: &[T], sent: usize, what: &str) -> Result<(), StateError> {
    if responses.len() == sent {
        Ok(())
    } else {
        Err(unavailable(format!(
            "etcd answered {} of {sent} {what} sent together",
            responses.len()
        )))
    }
}

impl EtcdStore {
    /// How many calls this store has made to etcd.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn txn_op(&self, o: &Op<'_>) -> TxnOp {
        match o {
            Op::Put(k, v, lease) => {
                let full = self.full_key(k);
                let value = self.seal_value(&full, v);
                let lease = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
                TxnOp::put(full, value, lease)
            }
            Op::Delete(k) => TxnOp::delete(self.full_key(k), None),
            Op::Get(k) => TxnOp::get(self.full_key(k), None),
        }
    }

    fn compares(&self, cmps: &[Cmp<'_>]) -> Vec<Compare> {
        cmps.iter()
            .map(|c| match c {
                Cmp::Absent(k) | Cmp::Version(k, None) => {
                    Compare::create_revision(self.full_key(k), CompareOp::Equal, 0)
                }
                Cmp::Version(k, Some(v)) => {
                    Compare::mod_revision(self.full_key(k), CompareOp::Equal, *v as i64)
                }
                Cmp::Value(k, v) => {
                    // Tags are deterministic: the value as written compares.
                    let full = self.full_key(k);
                    let value = self.seal_value(&full, v);
                    Compare::value(full, CompareOp::Equal, value)
                }
            })
            .collect()
    }

    /// The records a transaction's branch read, one per `Op::Get`.
    fn reads_of(&self, responses: &[TxnOpResponse]) -> Result<Vec<Option<Versioned>>, StateError> {
        let mut reads = Vec::new();
        for op in responses {
            if let TxnOpResponse::Get(g) = op {
                reads.push(g.kvs().first().map(|kv| self.versioned(kv)).transpose()?);
            }
        }
        Ok(reads)
    }

    /// Sends a transaction as `how` says (`sending`); its answer, and
    /// whether the fence's read was added at the end of `or_else`.
    fn fenced_txn(
        &self,
        compare: Vec<Compare>,
        then: Vec<TxnOp>,
        mut or_else: Vec<TxnOp>,
        how: SendRule,
    ) -> Result<(etcd_client::TxnResponse, bool), StateError> {
        let mut compare = compare;
        let fence = if how.fenced {
            self.lock_fence().key.clone()
        } else {
            None
        };
        if let Some(fence) = &fence {
            compare.push(Compare::create_revision(
                fence.clone(),
                CompareOp::Greater,
                0,
            ));
            or_else.push(TxnOp::get(fence.clone(), None));
        }
        let txn = Txn::new().when(compare).and_then(then).or_else(or_else);
        let r = self.call("Txn", how.retry, move |c| {
            let txn = txn.clone();
            // Reads of many records, or many transactions' answers
            // (`txns`), may pass tonic's 4 MiB default.
            async move {
                c.kv_client()
                    .max_decoding_message_size(MAX_RESPONSE)
                    .txn(txn)
                    .await
            }
        })?;
        if fence.is_some() && !r.succeeded() {
            let fence_read = r.op_responses().last().map(|op| match op {
                TxnOpResponse::Get(g) => !g.kvs().is_empty(),
                _ => false,
            });
            if fence_read != Some(true) {
                return Err(StateError::Unavailable(LEASE_ENDED.into()));
            }
        }
        Ok((r, fence.is_some()))
    }

    /// One atomic transaction: if every condition of `cmps` holds, the
    /// `success` operations, otherwise the `failure` ones. Sent again
    /// after a reset only when it is made of reads alone (`sending`,
    /// `Members::call`). On a fenced store a transaction whose `success`
    /// writes is made only while the fence's record exists; when that is
    /// what failed, the call fails `Unavailable` (`LEASE_ENDED`). A failed
    /// fence runs `failure`, so writes there are not fenced: only writes
    /// harmless after the lease ended belong there (the deletion of a
    /// request a write-back answered, say).
    pub fn txn(
        &self,
        cmps: &[Cmp<'_>],
        success: &[Op<'_>],
        failure: &[Op<'_>],
    ) -> Result<TxnOutcome, StateError> {
        let then: Vec<TxnOp> = success.iter().map(|o| self.txn_op(o)).collect();
        let or_else: Vec<TxnOp> = failure.iter().map(|o| self.txn_op(o)).collect();
        let (r, fenced) = self.fenced_txn(
            self.compares(cmps),
            then,
            or_else,
            sending(success, failure),
        )?;
        let mut reads = self.reads_of(&r.op_responses())?;
        if fenced && !r.succeeded() {
            // The fence's own read, added after `failure`'s.
            reads.pop();
        }
        Ok(TxnOutcome {
            succeeded: r.succeeded(),
            revision: r.header().map_or(0, |h| h.revision()) as u64,
            reads,
        })
    }

    /// Several transactions in one request, each deciding on its own
    /// conditions as if sent alone (etcd's nested transactions, since
    /// etcd 3.3), applied together; their outcomes in order. etcd's cost
    /// is mostly per request (its permission checks, a raft entry, the
    /// apply), so threads whose transactions arrive together share one
    /// (`crate::group_commit`). The transactions must write distinct keys
    /// (etcd refuses a request that writes one key twice) and be at most
    /// `MAX_TXNS_PER_REQUEST`. Fenced as `txn`: when the fence failed,
    /// none was made and the call fails `LEASE_ENDED`. Each outcome is
    /// its own: a record one read that does not decode (forged, say)
    /// fails that transaction's outcome, not the others'.
    pub fn txns(
        &self,
        each: &[Txns<'_>],
    ) -> Result<Vec<Result<TxnOutcome, StateError>>, StateError> {
        if each.len() > MAX_TXNS_PER_REQUEST {
            return Err(unavailable(format!(
                "{} transactions in one request: at most {MAX_TXNS_PER_REQUEST} are sent together",
                each.len()
            )));
        }
        let nested: Vec<TxnOp> = each
            .iter()
            .map(|t| {
                let then: Vec<TxnOp> = t.success.iter().map(|o| self.txn_op(o)).collect();
                let or_else: Vec<TxnOp> = t.failure.iter().map(|o| self.txn_op(o)).collect();
                TxnOp::txn(
                    Txn::new()
                        .when(self.compares(t.cmps))
                        .and_then(then)
                        .or_else(or_else),
                )
            })
            .collect();
        // Every nested branch is the outer `then`: a failed fence makes
        // none of them.
        let how = sending(
            each.iter().flat_map(|t| t.success.iter().chain(t.failure)),
            [],
        );
        let (r, _) = self.fenced_txn(Vec::new(), nested, Vec::new(), how)?;
        let revision = r.header().map_or(0, |h| h.revision()) as u64;
        let responses = r.op_responses();
        answered_each(&responses, each.len(), "transactions")?;
        Ok(responses
            .iter()
            .map(|op| match op {
                TxnOpResponse::Txn(t) => Ok(TxnOutcome {
                    succeeded: t.succeeded(),
                    revision,
                    reads: self.reads_of(&t.op_responses())?,
                }),
                _ => Err(unavailable(
                    "etcd answered a nested transaction with something else".to_string(),
                )),
            })
            .collect())
    }

    /// `keys`' records, read in one transaction of reads alone: a
    /// linearizable read to etcd, not a raft proposal (no log entry, no
    /// apply on each member), and sent again after a connection reset,
    /// since it changes nothing. Each record is decoded on its own: one
    /// that does not decode (forged, say) fails its own read only.
    pub fn get_many(
        &self,
        keys: &[&[u8]],
    ) -> Result<Vec<Result<Option<Versioned>, StateError>>, StateError> {
        if keys.len() > MAX_READS_PER_REQUEST {
            return Err(unavailable(format!(
                "{} reads in one request: at most {MAX_READS_PER_REQUEST} are sent together",
                keys.len()
            )));
        }
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(self.full_key(k), None))
            .collect();
        let (r, _) = self.fenced_txn(Vec::new(), gets, Vec::new(), sending([], []))?;
        let responses = r.op_responses();
        answered_each(&responses, keys.len(), "reads")?;
        Ok(responses
            .iter()
            .map(|op| match op {
                TxnOpResponse::Get(g) => g.kvs().first().map(|kv| self.versioned(kv)).transpose(),
                _ => Err(unavailable(
                    "etcd answered a read with something else".to_string(),
                )),
            })
            .collect())
    }

    /// The store's current revision (a watch started after it sees every
    /// later change).
    pub fn revision(&self) -> Result<u64, StateError> {
        let key = self.full_key(b"\0revision");
        let r = self.call("Range", Retry::Anywhere, move |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        Ok(r.header().map_or(0, |h| h.revision()) as u64)
    }

    /// Changes to the keys under `prefix` from `start_revision` on; see
    /// `Watch::next`.
    pub fn watch(&self, prefix: &[u8], start_revision: u64) -> crate::etcd_watch::Watch {
        let full = self.full_key(prefix);
        crate::etcd_watch::Watch::new(
            self.members.clone(),
            self.prefix.clone(),
            full.clone(),
            prefix_end(&full),
            start_revision,
            self.timeout,
            self.seal.clone(),
        )
    }
}

impl StateStore for EtcdStore {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let key = self.full_key(key);
        let r = self.call("Range", Retry::Anywhere, move |mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        })?;
        r.kvs().first().map(|kv| self.versioned(kv)).transpose()
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        let cmp = match expected {
            None => Cmp::Absent(key),
            Some(v) => Cmp::Version(key, Some(v)),
        };
        let op = match &value {
            Some(value) => Op::Put(key, value, 0),
            None => Op::Delete(key),
        };
        let t = self.txn(&[cmp], &[op], &[])?;
        if !t.succeeded {
            return Ok(None);
        }
        // The transaction's revision is the key's new mod_revision.
        Ok(Some(if value.is_some() { t.revision } else { 0 }))
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError> {
        self.scan(prefix, false).map(|(found, _)| found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd_test_cluster::Cluster;

    #[test]
    fn endpoints_parse_or_say_why_not() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:2379").unwrap(),
            (Scheme::Http, "127.0.0.1:2379".to_string())
        );
        assert_eq!(
            parse_endpoint("https://etcd1:2379").unwrap(),
            (Scheme::Https, "etcd1:2379".to_string())
        );
        assert!(parse_endpoint("http://127.0.0.1:2379/").is_ok());
        // An https:// endpoint without the CA, or http:// with TLS on.
        let https = ["https://127.0.0.1:2379".to_string()];
        let e = EtcdStore::new(&https, b"/n/", Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.0.contains("needs the CA"), "{e}");
        let tls = Access {
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----".to_vec()),
            ..Access::default()
        };
        let http = ["http://127.0.0.1:2379".to_string()];
        let e = EtcdStore::with_access(&http, b"/n/", Duration::from_secs(1), tls)
            .err()
            .unwrap();
        assert!(e.0.contains("every endpoint is https://"), "{e}");
        assert!(parse_endpoint("127.0.0.1:2379").is_err());
        assert!(parse_endpoint("http://").is_err());
        assert!(parse_endpoint("http://h:1/v3").is_err());
        assert!(EtcdStore::new(&[], b"/n/", Duration::from_secs(1)).is_err());
    }

    /// A transaction sent to a member that never answers may have been
    /// applied: it fails "outcome unknown" and is not sent to another
    /// member; a read, which may be repeated, is.
    #[test]
    fn a_write_without_an_answer_is_not_sent_again_elsewhere() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        other.set_nonblocking(true).unwrap();
        let urls = [&silent, &other].map(|l| format!("http://{}", l.local_addr().unwrap()));
        // Accepts and holds its connections, answering nothing, for as
        // long as the test takes.
        silent.set_nonblocking(true).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let over = done.clone();
        let held = std::thread::spawn(move || {
            let mut kept = Vec::new();
            while !over.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok((c, _)) = silent.accept() {
                    kept.push(c);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            kept
        });
        let store = EtcdStore::new(&urls, b"/t/", Duration::from_millis(300)).unwrap();
        match store.compare_and_set(b"k", None, Some(b"v".to_vec())) {
            Err(StateError::Unavailable(why)) => {
                assert!(why.contains("outcome is unknown"), "{why}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(other.accept().is_err(), "the write went to a second member");
        match store.get(b"k") {
            // Tried on both members (connections start at each in turn).
            Err(StateError::Unavailable(why)) => assert!(
                why.contains("no member answered") && urls.iter().all(|u| why.contains(u.as_str())),
                "{why}"
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(
            other.accept().is_ok(),
            "the read was not tried on the next member"
        );
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(!held.join().unwrap().is_empty());
    }

    /// A store without a fence, and a store fenced on its record `me`
    /// under the lease given, proven for 30 s.
    fn fenced_store(cluster: &Cluster) -> (EtcdStore, EtcdStore, i64) {
        let control = EtcdStore::new(&cluster.urls, b"/t/", Duration::from_secs(5)).unwrap();
        let store = EtcdStore::new(&cluster.urls, b"/t/", Duration::from_secs(5)).unwrap();
        let lease = control.grant_lease(30).unwrap();
        assert!(control.create_with_lease(b"me", b"1", lease).unwrap());
        store.fence_on(b"me");
        store.proven_until(Instant::now() + Duration::from_secs(30));
        (control, store, lease)
    }

    /// A fenced store writes only while its fence record (under a lease)
    /// lives, in etcd's own transaction, and calls nothing once the proof
    /// of the lease has run out.
    #[test]
    fn a_fenced_store_writes_only_while_its_lease_record_lives() {
        let cluster = Cluster::start("fence");
        let (control, store, lease) = fenced_store(&cluster);
        let put = |k: &[u8]| store.compare_and_set(k, None, Some(b"v".to_vec()));
        assert!(put(b"k").unwrap().is_some());
        // A condition of the caller's that fails is no error.
        assert!(put(b"k").unwrap().is_none());
        control.revoke_lease(lease).unwrap();
        match put(b"k2") {
            Err(StateError::Unavailable(why)) => assert_eq!(why, LEASE_ENDED),
            other => panic!("a write after the lease ended: {other:?}"),
        }
        assert!(control.get(b"k2").unwrap().is_none());
        // Reads decide nothing by themselves: they go on.
        assert!(store.get(b"k").unwrap().is_some());
        store.proven_until(Instant::now());
        match store.get(b"k") {
            Err(StateError::Unavailable(why)) => assert_eq!(why, CUT_OFF),
            other => panic!("a call past the proof of the lease: {other:?}"),
        }
        // A store without a fence (the node's lease keeping) is not held.
        assert!(control.get(b"k").unwrap().is_some());
    }

    /// Transactions sent together each decide on their own conditions, in
    /// one call; on a fenced store whose lease ended none is made.
    #[test]
    fn transactions_sent_together_each_decide_alone_in_one_call() {
        let cluster = Cluster::start("txns");
        let (control, store, lease) = fenced_store(&cluster);
        assert!(control.create_with_lease(b"taken", b"other", 0).unwrap());
        let (a, b, taken) = (
            [Cmp::Absent(b"a")],
            [Cmp::Absent(b"b")],
            [Cmp::Absent(b"taken")],
        );
        let (put_a, put_b, put_t) = (
            [Op::Put(b"a", b"va", 0)],
            [Op::Put(b"b", b"vb", 0)],
            [Op::Put(b"taken", b"mine", 0)],
        );
        let read_t = [Op::Get(b"taken")];
        let each = [
            Txns {
                cmps: &a,
                success: &put_a,
                failure: &[],
            },
            Txns {
                cmps: &taken,
                success: &put_t,
                failure: &read_t,
            },
            Txns {
                cmps: &b,
                success: &put_b,
                failure: &[],
            },
        ];
        let calls = store.calls();
        let out: Vec<TxnOutcome> = store
            .txns(&each)
            .unwrap()
            .into_iter()
            .map(|t| t.unwrap())
            .collect();
        assert_eq!(store.calls() - calls, 1);
        let decided: Vec<bool> = out.iter().map(|t| t.succeeded).collect();
        assert_eq!(decided, [true, false, true]);
        assert_eq!(out[1].reads.len(), 1);
        assert_eq!(
            out[1].reads[0].as_ref().map(|r| r.value.clone()),
            Some(b"other".to_vec())
        );
        assert!(out[0].reads.is_empty() && out[2].reads.is_empty());
        assert_eq!(
            control.get(b"a").unwrap().map(|r| r.value),
            Some(b"va".to_vec())
        );
        assert_eq!(
            control.get(b"b").unwrap().map(|r| r.value),
            Some(b"vb".to_vec())
        );
        assert_eq!(
            control.get(b"taken").unwrap().map(|r| r.value),
            Some(b"other".to_vec())
        );
        // Too many for one request: refused before anything is sent.
        let many: Vec<Txns<'_>> = (0..=MAX_TXNS_PER_REQUEST)
            .map(|_| Txns {
                cmps: &[],
                success: &[],
                failure: &[],
            })
            .collect();
        assert!(store.txns(&many).is_err());
        // The fence holds for all of them.
        control.revoke_lease(lease).unwrap();
        let (c, p) = ([Cmp::Absent(b"c")], [Op::Put(b"c", b"vc", 0)]);
        let after = [
            Txns {
                cmps: &c,
                success: &p,
                failure: &[],
            },
            Txns {
                cmps: &[],
                success: &[],
                failure: &[],
            },
        ];
        match store.txns(&after) {
            Err(StateError::Unavailable(why)) => assert_eq!(why, LEASE_ENDED),
            other => panic!("writes after the lease ended: {other:?}"),
        }
        assert!(control.get(b"c").unwrap().is_none());
    }

    /// Once the store looked at the members, its calls go to the leader
    /// first. A leader that falls silent (SIGSTOP: its connections stay
    /// open and unanswered, as behind a silent network) is forgotten by the
    /// first call that waited for it, and a later look finds the new one,
    /// which writes go to: a write is sent to one member only, so one sent
    /// to the silent member would fail.
    #[test]
    fn calls_go_to_the_leader_first_and_forget_one_that_falls_silent() {
        let cluster = Cluster::start("leader");
        let store = EtcdStore::new(&cluster.urls, b"/l/", Duration::from_secs(5)).unwrap();
        // The member that answered a read.
        let answered_by = || {
            store
                .call("Range", Retry::Anywhere, |mut c| async move {
                    c.get("/l/k", None).await
                })
                .map(|r| r.header().map_or(0, |h| h.member_id()))
        };
        // Waits until every call goes to the member that leads (read again
        // when an election moved it meanwhile); its place and id. The first
        // look is made at start, the next ones every FOLLOW_EVERY (5 s).
        let leads = || {
            let until = Instant::now() + Duration::from_secs(30);
            'again: loop {
                assert!(Instant::now() < until, "calls do not go to the leader");
                let leader = cluster.leader();
                let Some((at, id)) = leader else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                if store.members.leader().as_deref() != Some(cluster.urls[at].as_str()) {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                // Not one call in turn: every one. A call that went
                // elsewhere because an election moved the leader, or a
                // look or a slow answer left it unmarked, starts over.
                for _ in 0..3 * cluster.urls.len() {
                    if answered_by().ok() != Some(id) {
                        let marked = store.members.leader();
                        if cluster.leader() != leader
                            || marked.as_deref() != Some(cluster.urls[at].as_str())
                        {
                            continue 'again;
                        }
                        panic!("a call went to a follower");
                    }
                }
                return (at, id);
            }
        };
        let (first, id) = leads();
        let pid = cluster.members[first].id().to_string();
        let signal = |sig: &str| {
            let ok = std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill {sig} {pid}");
        };
        signal("-STOP");
        // Answered by another member after the leader's share of the time.
        assert_ne!(answered_by().unwrap(), id);
        assert_ne!(
            store.members.leader().as_deref(),
            Some(cluster.urls[first].as_str()),
            "a leader that did not answer is still tried first"
        );
        let (mut next, _) = leads();
        assert_ne!(next, first);
        // Six writes in a row: one sent to the silent member would fail.
        // A look that failed meanwhile (the new leader unmarked, calls
        // spread again) lets a write reach the silent member: that write
        // starts the six over, once the mark is back.
        let mut written = 0;
        let mut restarts = 0;
        while written < 6 {
            let value = format!("v{written}");
            let marked_before = store.members.leader();
            let put = store.call("Txn", Retry::IfNotSent, move |mut c| {
                let value = value.clone();
                async move { c.put("/l/w", value, None).await }
            });
            match put {
                Ok(_) => written += 1,
                Err(e) => {
                    // Marked before and after the write: the write
                    // went to the leader, and failed.
                    let leader = Some(cluster.urls[next].as_str());
                    let marked = marked_before.as_deref() == leader
                        && store.members.leader().as_deref() == leader;
                    assert!(
                        !marked && restarts < 3,
                        "a write failed while the leader was marked: {e}"
                    );
                    restarts += 1;
                    (next, _) = leads();
                    assert_ne!(next, first);
                    written = 0;
                }
            }
        }
        signal("-CONT");
    }

    /// With one member down, every call still succeeds, writes included:
    /// a member that refuses the connection got nothing, so a write goes
    /// on to the next one (calls start at the leader, or at each member in
    /// turn, so some start at the one that is down).
    #[test]
    fn a_member_that_is_down_is_skipped_by_reads_and_writes() {
        let mut cluster = Cluster::start("skip");
        let store = EtcdStore::new(&cluster.urls, b"/t/", Duration::from_secs(5)).unwrap();
        cluster.members[0].kill().unwrap();
        cluster.members[0].wait().unwrap();
        // The other two elect a leader if the killed member was it (writes
        // wait for one meanwhile).
        let until = Instant::now() + Duration::from_secs(20);
        while store
            .compare_and_set(b"elected", None, Some(b"v".to_vec()))
            .is_err()
        {
            assert!(
                Instant::now() < until,
                "no leader after a member was killed"
            );
        }
        for i in 0..cluster.urls.len() * 2 {
            let key = format!("k{i}");
            assert!(store
                .compare_and_set(key.as_bytes(), None, Some(b"v".to_vec()))
                .unwrap()
                .is_some());
            assert!(store.get(key.as_bytes()).unwrap().is_some());
        }
    }

    /// Members that serve TLS only and ask for client certificates: a
    /// node with the cluster's CA and a certificate it signed gets in (the
    /// conformance suite passes); one without a certificate, or trusting
    /// another CA, is refused, with a message that says so.
    #[test]
    fn tls_with_client_certificates_lets_in_only_the_nodes_it_should() {
        let cluster = Cluster::start_tls("tls");
        let timeout = Duration::from_secs(3);
        let store =
            EtcdStore::with_access(&cluster.urls, b"/t/", timeout, cluster.access.clone()).unwrap();
        crate::conformance::run_all(&store);
        let no_certificate = Access {
            identity: None,
            ..cluster.access.clone()
        };
        let refused = |access: Access| {
            let store = EtcdStore::with_access(&cluster.urls, b"/t/", timeout, access).unwrap();
            match store.get(b"k") {
                Err(StateError::Unavailable(why)) => why,
                other => panic!("let in: {other:?}"),
            }
        };
        let why = refused(no_certificate);
        assert!(why.contains("it wants a client certificate"), "{why}");
        let other_ca = Access {
            ca_pem: Some(std::fs::read(cluster.dir.join("other-ca.pem")).unwrap()),
            ..cluster.access.clone()
        };
        let why = refused(other_ca);
        assert!(
            why.contains("not signed by the CA of [cluster] ca_file"),
            "{why}"
        );
    }

    #[test]
    fn prefix_ends_are_the_next_key() {
        assert_eq!(prefix_end(b"/n/a"), b"/n/b");
        assert_eq!(prefix_end(&[1, 0xFF]), vec![2]);
        assert_eq!(prefix_end(&[0xFF, 0xFF]), vec![0]);
    }

    /// The conformance suite against a real cluster, each member's
    /// endpoint first in turn of one store (reads and writes go through
    /// different members), and a second store under another prefix that
    /// sees none of it.
    #[test]
    fn a_sealed_store_reads_only_what_a_node_with_its_secret_wrote() {
        let cluster = Cluster::start("sealed");
        let open = |secret: u8| {
            let key = RecordKey::from_secret(&[secret; 32]).unwrap();
            EtcdStore::new(&cluster.urls, b"/s/", Duration::from_secs(5))
                .unwrap()
                .sealed(Arc::new(key))
        };
        let (store, other_secret) = (open(1), open(2));
        let raw = EtcdStore::new(&cluster.urls, b"/s/", Duration::from_secs(5)).unwrap();
        // What a node of the cluster wrote reads back, through every kind
        // of read, and compares by value.
        crate::conformance::run_all(&store);
        let v = store
            .compare_and_set(b"open/1", None, Some(b"rec".to_vec()))
            .unwrap();
        assert_eq!(store.get(b"open/1").unwrap().unwrap().value, b"rec");
        let same = store.txn(&[Cmp::Value(b"open/1", b"rec")], &[Op::Get(b"open/1")], &[]);
        assert!(same.unwrap().succeeded);
        // etcd holds the tag after the value.
        assert_eq!(raw.get(b"open/1").unwrap().unwrap().value.len(), 3 + 32);
        let mut watch = store.watch(b"open/", v.unwrap() + 1);
        // A value written without the secret, or with another one, or moved
        // from another key, is refused by every read, and not delivered by
        // a watch.
        raw.compare_and_set(b"open/2", None, Some(b"forged".to_vec()))
            .unwrap();
        other_secret
            .compare_and_set(b"open/3", None, Some(b"x".to_vec()))
            .unwrap();
        let moved = raw.get(b"open/1").unwrap().unwrap().value;
        raw.compare_and_set(b"open/4", None, Some(moved)).unwrap();
        let last = store
            .compare_and_set(b"open/5", None, Some(b"ok".to_vec()))
            .unwrap();
        for k in [&b"open/2"[..], b"open/3", b"open/4"] {
            let forged = |r: Result<_, StateError>| matches!(r, Err(StateError::Corrupt(FORGED)));
            assert!(forged(store.get(k).map(|_| ())), "{k:?}");
            assert!(
                forged(store.txn(&[], &[Op::Get(k)], &[]).map(|_| ())),
                "{k:?}"
            );
        }
        assert!(matches!(
            store.scan_prefix(b"open/"),
            Err(StateError::Corrupt(FORGED))
        ));
        // Sent together, a transaction that reads a forged record fails
        // alone: the others are made and answered.
        let (free_a, forged_at, free_b) = (
            [Cmp::Absent(b"new/a")],
            [Cmp::Absent(b"open/2")],
            [Cmp::Absent(b"new/b")],
        );
        let (put_a, read_forged, put_b) = (
            [Op::Put(b"new/a", b"a", 0)],
            [Op::Get(b"open/2")],
            [Op::Put(b"new/b", b"b", 0)],
        );
        let together = [
            Txns {
                cmps: &free_a,
                success: &put_a,
                failure: &[],
            },
            Txns {
                cmps: &forged_at,
                success: &[],
                failure: &read_forged,
            },
            Txns {
                cmps: &free_b,
                success: &put_b,
                failure: &[],
            },
        ];
        let out = store.txns(&together).unwrap();
        assert!(out[0].as_ref().unwrap().succeeded);
        assert!(matches!(out[1], Err(StateError::Corrupt(FORGED))));
        assert!(out[2].as_ref().unwrap().succeeded);
        assert_eq!(store.get(b"new/b").unwrap().unwrap().value, b"b");
        // Read together, a forged record fails its own read only, in one
        // request.
        let calls = store.calls();
        let reads = store
            .get_many(&[b"new/a", b"open/2", b"missing", b"new/b"])
            .unwrap();
        assert_eq!(store.calls() - calls, 1, "four reads, one request");
        assert_eq!(reads[0].as_ref().unwrap().as_ref().unwrap().value, b"a");
        assert!(matches!(reads[1], Err(StateError::Corrupt(FORGED))));
        assert_eq!(*reads[2].as_ref().unwrap(), None);
        assert_eq!(reads[3].as_ref().unwrap().as_ref().unwrap().value, b"b");
        let too_many = vec![&b"new/a"[..]; MAX_READS_PER_REQUEST + 1];
        assert!(store.get_many(&too_many).is_err());
        let mut seen = Vec::new();
        while !seen
            .iter()
            .any(|e: &crate::etcd_watch::Event| e.key == b"open/5")
        {
            let batch = watch.next(Duration::from_secs(5)).unwrap();
            assert!(!batch.events.is_empty(), "the watch delivered nothing");
            seen.extend(batch.events);
        }
        let keys: Vec<&[u8]> = seen.iter().map(|e| e.key.as_slice()).collect();
        assert_eq!(keys, [&b"open/5"[..]]);
        assert_eq!(seen[0].value.as_deref(), Some(&b"ok"[..]));
        assert_eq!(seen[0].revision, last.unwrap());
    }

    #[test]
    fn writes_on_success_are_fenced_and_a_transaction_that_writes_is_sent_once() {
        let (get, put, delete) = (Op::Get(b"a"), Op::Put(b"a", b"v", 0), Op::Delete(b"a"));
        let reads = SendRule {
            fenced: false,
            retry: Retry::Anywhere,
        };
        assert_eq!(sending([&get, &get], [&get]), reads);
        assert_eq!(sending([], []), reads);
        for writes in [[&get, &put], [&delete, &get]] {
            // Fenced when the branch taken on success writes; sent again
            // only if surely not sent whichever branch writes.
            assert_eq!(
                sending(writes, []),
                SendRule {
                    fenced: true,
                    retry: Retry::IfNotSent
                }
            );
            assert_eq!(
                sending([&get], writes),
                SendRule {
                    fenced: false,
                    retry: Retry::IfNotSent
                }
            );
        }
    }

    #[test]
    fn a_certificate_is_checked_against_its_key() {
        let dir = std::env::temp_dir().join(format!("nimbus-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        crate::etcd_test_cluster::make_certificates(&dir);
        let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
        assert_eq!(
            check_identity(&read("client.pem"), &read("client.key")),
            Ok(())
        );
        let at_fault = |cert: &[u8], key: &[u8]| check_identity(cert, key).unwrap_err().file();
        // Another certificate's key, a certificate for a key, no certificate.
        assert_eq!(
            at_fault(&read("client.pem"), &read("member.key")),
            PemFile::Key
        );
        assert_eq!(
            at_fault(&read("client.pem"), &read("client.pem")),
            PemFile::Key
        );
        assert_eq!(at_fault(b"junk", &read("client.key")), PemFile::Cert);
        assert_eq!(check_ca(&read("ca.pem")), Ok(()));
        assert!(check_ca(&read("client.key")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Waits (30 s at most) until `store`'s calls go to `urls`, in any order.
    fn calls_go_to(store: &EtcdStore, urls: &[String]) {
        let until = Instant::now() + Duration::from_secs(30);
        let mut want = urls.to_vec();
        want.sort();
        while store.endpoints() != want {
            assert!(
                Instant::now() < until,
                "{:?}, not {want:?}",
                store.endpoints()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn a_store_follows_the_members_when_they_are_replaced() {
        let mut cluster = Cluster::start("replace");
        // Told of two members of three: it learns the third.
        let store = EtcdStore::new(&cluster.urls[..2], b"/r/", Duration::from_secs(3)).unwrap();
        store
            .compare_and_set(b"k", None, Some(b"1".to_vec()))
            .unwrap();
        let follows = |urls: &[String]| calls_go_to(&store, urls);
        follows(&cluster.urls);
        // Both members it was told of are replaced, one after the other:
        // it goes on with the new ones, without being told.
        for i in 0..2 {
            cluster.replace_member(i);
            follows(&cluster.urls);
        }
        let v = store.get(b"k").unwrap().unwrap();
        assert_eq!(v.value, b"1");
        assert!(store
            .compare_and_set(b"k", Some(v.version), Some(b"2".to_vec()))
            .unwrap()
            .is_some());
    }

    /// A node whose configuration still names a member replaced before it
    /// started (or before its first look) follows the members all the
    /// same: the configuration names members, so the list decides.
    #[test]
    fn a_store_told_of_a_member_already_replaced_follows_the_rest() {
        let mut cluster = Cluster::start("replaced-before");
        let configured = cluster.urls.clone();
        cluster.replace_member(0);
        let store = EtcdStore::new(&configured, b"/r/", Duration::from_secs(3)).unwrap();
        calls_go_to(&store, &cluster.urls);
        // Writes go through the members it follows. The cluster has just
        // changed its members and may still elect a leader on a loaded
        // machine: a write whose outcome is unknown is tried again (a
        // second try of an applied one finds the key there).
        let until = Instant::now() + Duration::from_secs(30);
        while let Err(e) = store.compare_and_set(b"k", None, Some(b"1".to_vec())) {
            assert!(Instant::now() < until, "no write went through: {e}");
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(store.get(b"k").unwrap().unwrap().value, b"1");
    }

    #[test]
    fn conforms_on_a_real_three_member_cluster() {
        let cluster = Cluster::start("conformance");
        let store =
            EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        crate::conformance::run_all(&store);
        let mut rotated = cluster.urls.clone();
        rotated.rotate_left(1);
        let other_member =
            EtcdStore::new(&rotated, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        assert_eq!(
            other_member.scan_prefix(b"").unwrap(),
            store.scan_prefix(b"").unwrap()
        );
        let elsewhere = EtcdStore::new(&cluster.urls, b"/other/", Duration::from_secs(5)).unwrap();
        assert!(elsewhere.scan_prefix(b"").unwrap().is_empty());
    }

    /// A record under a lease is there while the lease is kept alive and
    /// gone once it is revoked; a second create of a live key is refused.
    #[test]
    fn leases_hold_records_and_take_them_along() {
        let cluster = Cluster::start("leases");
        let store =
            EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_secs(5)).unwrap();
        let lease = store.grant_lease(30).unwrap();
        assert!(store
            .create_with_lease(b"nodes/n1", b"127.0.0.2:4450", lease)
            .unwrap());
        assert!(!store
            .create_with_lease(b"nodes/n1", b"elsewhere", lease)
            .unwrap());
        assert!(store.keep_alive(lease).unwrap());
        assert_eq!(
            store.get(b"nodes/n1").unwrap().unwrap().value,
            b"127.0.0.2:4450"
        );
        store.revoke_lease(lease).unwrap();
        assert_eq!(store.get(b"nodes/n1").unwrap(), None);
        assert!(!store.keep_alive(lease).unwrap());
    }

    /// With every member gone, calls fail `Unavailable` within the
    /// timeout, never hang.
    #[test]
    fn a_cluster_that_is_gone_is_unavailable_not_a_hang() {
        let mut cluster = Cluster::start("gone");
        let store =
            EtcdStore::new(&cluster.urls, b"/nimbus-test/", Duration::from_millis(500)).unwrap();
        store
            .compare_and_set(b"k", None, Some(b"v".to_vec()))
            .unwrap();
        for m in &mut cluster.members {
            m.kill().unwrap();
            m.wait().unwrap();
        }
        let t = std::time::Instant::now();
        match store.get(b"k") {
            // Tried on every member.
            Err(StateError::Unavailable(why)) => assert!(
                why.contains("no member answered")
                    && cluster.urls.iter().all(|u| why.contains(u.as_str())),
                "{why}"
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    /// A watch of a store that etcd is out of reach of: one error waits
    /// for the caller however long the outage lasts (`etcd_watch`).
    #[test]
    fn an_outage_leaves_one_watch_error_waiting_however_long_it_lasts() {
        // Nothing listens there: every attempt fails at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let store = EtcdStore::new(
            &[format!("http://127.0.0.1:{port}")],
            b"/t/",
            Duration::from_millis(300),
        )
        .unwrap();
        let mut watch = store.watch(b"k/", 1);
        // The first error is told.
        assert!(watch.next(Duration::from_secs(10)).is_err());
        // Unread while the task fails again and again (every 200 ms), a
        // second error is sent once the first is taken, and no more.
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while std::time::Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            watch.take_waiting_errors(),
            1,
            "errors left waiting after a 2 s outage"
        );
    }
}
