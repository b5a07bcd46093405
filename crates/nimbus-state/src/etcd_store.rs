//! The cluster's backend: records in etcd, through the JSON gateway every
//! etcd v3 server offers on its client URLs (`POST /v3/kv/range`,
//! `/v3/kv/txn`, `/v3/lease/...`), over plain HTTP/1.1 with keep-alive.
//!
//! Why the gateway and not gRPC: the `StateStore` interface is synchronous
//! (its callers are request handlers on the blocking pool), the Rust gRPC
//! clients for etcd (etcd-client on tonic) need their own async runtime
//! and protoc at build time, and the calls that reach etcd are few by
//! design (ownership caching keeps the common case local). The JSON
//! encoding costs microseconds; etcd's Raft round trip costs milliseconds.
//!
//! Versions are etcd's `mod_revision`: unique and rising across the whole
//! cluster, so a compare-and-set on it detects any other writer on any
//! node. Reads are linearizable (etcd's default), so a decision made on a
//! read is made on the cluster's latest state. A whole call, every
//! endpoint it tries included, is bounded by `timeout`; an endpoint that
//! fails is skipped for the next one, and when none answers in time the
//! call fails `Unavailable`.
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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use serde_json::{json, Value};

use crate::store::{StateError, StateStore, Versioned};

/// Largest gateway response read (a scan of many records); beyond it the
/// call fails rather than allocate without bound.
const MAX_RESPONSE: usize = 64 << 20;

/// Keep-alive connections kept per store.
const POOL: usize = 16;

pub struct EtcdStore {
    endpoints: Vec<Endpoint>,
    /// Prepended to every key: one etcd cluster may serve several Nimbus
    /// clusters, or other users.
    prefix: Vec<u8>,
    /// How long one call may take, all endpoints included.
    timeout: Duration,
    fence: Mutex<Fence>,
    idle: Mutex<Vec<Conn>>,
    /// The endpoint the next new connection tries first: connections are
    /// spread over the members, so that the work of the JSON gateway (the
    /// larger part of etcd's CPU per call) is shared among them instead
    /// of all landing on the first member configured.
    next_dial: std::sync::atomic::AtomicUsize,
    /// Calls made so far (what a change of the call pattern is measured
    /// by).
    calls: std::sync::atomic::AtomicU64,
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

#[derive(Clone, Debug)]
struct Endpoint {
    /// As configured, for messages.
    url: String,
    host: String,
    addr: SocketAddr,
}

struct Conn {
    endpoint: usize,
    stream: BufReader<TcpStream>,
}

/// Why an endpoint could not be used: a message for the operator.
#[derive(Debug)]
pub struct EndpointError(pub String);

impl std::fmt::Display for EndpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Parses `http://host:port` (the only scheme the store speaks so far).
pub fn parse_endpoint(url: &str) -> Result<(String, SocketAddr), EndpointError> {
    let rest = match url.strip_prefix("http://") {
        Some(r) => r,
        None if url.starts_with("https://") => {
            return Err(EndpointError(format!(
                "\"{url}\": TLS to etcd is not supported yet; use an http:// client URL \
                 on a trusted network"
            )))
        }
        None => {
            return Err(EndpointError(format!(
                "\"{url}\": expected http://HOST:PORT"
            )))
        }
    };
    let hostport = rest.trim_end_matches('/');
    if hostport.is_empty() || hostport.contains('/') {
        return Err(EndpointError(format!(
            "\"{url}\": expected http://HOST:PORT"
        )));
    }
    let addr = hostport
        .to_socket_addrs()
        .map_err(|e| EndpointError(format!("\"{url}\": {e}")))?
        .next()
        .ok_or_else(|| EndpointError(format!("\"{url}\": no address")))?;
    Ok((hostport.to_string(), addr))
}

fn unavailable(why: impl std::fmt::Display) -> StateError {
    StateError::Unavailable(why.to_string())
}

/// An int64 field of a gateway response: a JSON string (proto3 JSON), a
/// number, or absent (zero).
pub(crate) fn int(v: &Value) -> Result<i64, StateError> {
    match v {
        Value::Null => Ok(0),
        Value::String(s) => s
            .parse()
            .map_err(|_| StateError::Corrupt("etcd: integer field not a number")),
        Value::Number(n) => n
            .as_i64()
            .ok_or(StateError::Corrupt("etcd: integer field out of range")),
        _ => Err(StateError::Corrupt("etcd: integer field of another type")),
    }
}

pub(crate) fn bytes(v: &Value) -> Result<Vec<u8>, StateError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => B64
            .decode(s)
            .map_err(|_| StateError::Corrupt("etcd: bytes field not base64")),
        _ => Err(StateError::Corrupt("etcd: bytes field of another type")),
    }
}

/// The smallest key above every key that starts with `prefix` (etcd's
/// range_end for a prefix scan); all 0xFF (or empty): to the end.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdStore {
    /// A store on the etcd cluster at `urls` (client URLs), its keys under
    /// `prefix`. Connects lazily; `check` proves the cluster answers.
    pub fn new(
        urls: &[String],
        prefix: &[u8],
        timeout: Duration,
    ) -> Result<EtcdStore, EndpointError> {
        if urls.is_empty() {
            return Err(EndpointError("no etcd endpoints".into()));
        }
        let endpoints = urls
            .iter()
            .map(|u| {
                let (host, addr) = parse_endpoint(u)?;
                Ok(Endpoint {
                    url: u.clone(),
                    host,
                    addr,
                })
            })
            .collect::<Result<Vec<_>, EndpointError>>()?;
        Ok(EtcdStore {
            endpoints,
            prefix: prefix.to_vec(),
            timeout,
            fence: Mutex::new(Fence::default()),
            idle: Mutex::new(Vec::new()),
            next_dial: std::sync::atomic::AtomicUsize::new(0),
            calls: std::sync::atomic::AtomicU64::new(0),
        })
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

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<Conn>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn connect(&self, endpoint: usize, within: Duration) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&self.endpoints[endpoint].addr, within)?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            endpoint,
            stream: BufReader::new(stream),
        })
    }

    /// POSTs `body` to `path` and returns the decoded answer: on a pooled
    /// connection when one is idle (a stale one, closed by the server
    /// meanwhile, is replaced by a fresh one), then on each endpoint in
    /// turn. A call that is not `idempotent` (a transaction) moves on to
    /// another endpoint only when it cannot have been applied (no
    /// connection, or closed before any answer): after a timeout or an
    /// error answer its outcome is unknown, and it fails `Unavailable`
    /// rather than risk applying it twice.
    pub fn call(&self, path: &str, body: &Value, idempotent: bool) -> Result<Value, StateError> {
        self.calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let body = serde_json::to_vec(body).map_err(unavailable)?;
        let deadline = self.deadline()?;
        crate::blocking::off_worker(|| self.call_blocking(path, &body, idempotent, deadline))
    }

    fn call_blocking(
        &self,
        path: &str,
        body: &[u8],
        idempotent: bool,
        deadline: Instant,
    ) -> Result<Value, StateError> {
        let mut errors = Vec::new();
        let pooled = self.lock_idle().pop();
        let n = self.endpoints.len();
        let first = pooled.as_ref().map(|c| c.endpoint).unwrap_or_else(|| {
            self.next_dial
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                % n
        });
        let dials = (0..n).map(|i| Attempt::Dial((first + i) % n));
        let attempts: Vec<Attempt> = pooled
            .map(Attempt::Pooled)
            .into_iter()
            .chain(dials)
            .collect();
        let last = attempts.len() - 1;
        for (i, attempt) in attempts.into_iter().enumerate() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                errors.push("no time left".into());
                break;
            }
            // An attempt takes at most half the time left, unless it is the
            // last: a member that never answers does not leave the others
            // none.
            let share = if i == last { left } else { left / 2 };
            let by = Instant::now() + share;
            let mut conn = match attempt {
                Attempt::Pooled(conn) => conn,
                Attempt::Dial(endpoint) => match self.connect(endpoint, share) {
                    Ok(conn) => conn,
                    Err(e) => {
                        errors.push(format!("{}: {e}", self.endpoints[endpoint].url));
                        continue;
                    }
                },
            };
            let url = &self.endpoints[conn.endpoint].url;
            let unknown = |why: String| {
                unavailable(format!(
                    "etcd {url}: {why}; the request's outcome is unknown"
                ))
            };
            match self.exchange(&mut conn, path, body, by) {
                Ok(Answer::Ok(v)) => {
                    self.give_back(conn);
                    return Ok(v);
                }
                Ok(Answer::Refused(why)) if !idempotent => return Err(unknown(why)),
                Err(e) if !idempotent && !nothing_applied(&e) => {
                    return Err(unknown(e.to_string()))
                }
                // etcd answered with an error (no leader, say): another
                // member may do better; a pooled connection that fails
                // this way was one the server had closed: dial afresh.
                Ok(Answer::Refused(why)) => errors.push(format!("{url}: {why}")),
                Err(e) => errors.push(format!("{url}: {e}")),
            }
        }
        Err(unavailable(format!(
            "etcd: no endpoint answered ({})",
            errors.join("; ")
        )))
    }

    fn give_back(&self, conn: Conn) {
        let mut idle = self.lock_idle();
        if idle.len() < POOL {
            idle.push(conn);
        }
    }

    fn exchange(
        &self,
        conn: &mut Conn,
        path: &str,
        body: &[u8],
        deadline: Instant,
    ) -> std::io::Result<Answer> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        conn.stream.get_ref().set_read_timeout(Some(left))?;
        conn.stream.get_ref().set_write_timeout(Some(left))?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            self.endpoints[conn.endpoint].host,
            body.len()
        );
        let s = conn.stream.get_mut();
        s.write_all(head.as_bytes())?;
        s.write_all(body)?;
        let (status, payload) = read_response(&mut conn.stream)?;
        let value: Value = serde_json::from_slice(&payload)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        if status == 200 {
            Ok(Answer::Ok(value))
        } else {
            let msg = value
                .get("error")
                .or_else(|| value.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .to_string();
            Ok(Answer::Refused(format!("HTTP {status}: {msg}")))
        }
    }

    /// Grants a lease of `ttl_secs`; records put under it go when it
    /// expires (a node's membership and ownership keys).
    pub fn grant_lease(&self, ttl_secs: i64) -> Result<i64, StateError> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl_secs }), false)?;
        let id = int(&v["ID"])?;
        if id == 0 {
            return Err(unavailable(format!("etcd granted no lease: {v}")));
        }
        Ok(id)
    }

    /// Renews lease `id`; Ok(false) when it had already expired.
    pub fn keep_alive(&self, id: i64) -> Result<bool, StateError> {
        let v = self.call(
            "/v3/lease/keepalive",
            &json!({ "ID": id.to_string() }),
            true,
        )?;
        Ok(int(&v["result"]["TTL"])? > 0)
    }

    pub fn revoke_lease(&self, id: i64) -> Result<(), StateError> {
        self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }), true)
            .map(|_| ())
    }

    /// Creates `key` with `value` under lease `lease` if no live record
    /// has it: Ok(false) when one does.
    pub fn create_with_lease(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<bool, StateError> {
        let k = B64.encode(self.full_key(key));
        let v = self.call(
            "/v3/kv/txn",
            &json!({
                "compare": [{"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": k, "value": B64.encode(value), "lease": lease.to_string()}}],
            }),
            false,
        )?;
        Ok(v["succeeded"].as_bool().unwrap_or(false))
    }
}

/// One condition of a transaction (`EtcdStore::txn`), on a key of the
/// store (its prefix added).
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

/// What a transaction did.
#[derive(Debug)]
pub struct TxnOutcome {
    pub succeeded: bool,
    /// The store's revision after it (a write's records carry it).
    pub revision: u64,
    /// The records the branch taken read, one per `Op::Get`, in order.
    pub reads: Vec<Option<Versioned>>,
}

impl EtcdStore {
    /// How many calls this store has made to etcd.
    pub fn calls(&self) -> u64 {
        self.calls.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// One atomic transaction: if every condition of `cmps` holds, the
    /// `success` operations, otherwise the `failure` ones. Never sent twice
    /// (see `call`). On a fenced store a transaction that writes is made
    /// only while the fence's record exists; when that is what failed, the
    /// call fails `Unavailable` (`LEASE_ENDED`).
    pub fn txn(
        &self,
        cmps: &[Cmp<'_>],
        success: &[Op<'_>],
        failure: &[Op<'_>],
    ) -> Result<TxnOutcome, StateError> {
        let key = |k: &[u8]| B64.encode(self.full_key(k));
        let mut compare: Vec<Value> = cmps
            .iter()
            .map(|c| match c {
                Cmp::Absent(k) | Cmp::Version(k, None) => {
                    json!({"key": key(k), "target": "CREATE", "result": "EQUAL", "create_revision": "0"})
                }
                Cmp::Version(k, Some(v)) => {
                    json!({"key": key(k), "target": "MOD", "result": "EQUAL", "mod_revision": v.to_string()})
                }
                Cmp::Value(k, v) => {
                    json!({"key": key(k), "target": "VALUE", "result": "EQUAL", "value": B64.encode(v)})
                }
            })
            .collect();
        let ops = |ops: &[Op<'_>]| -> Vec<Value> {
            ops.iter()
                .map(|o| match o {
                    Op::Put(k, v, 0) => json!({"request_put": {"key": key(k), "value": B64.encode(v)}}),
                    Op::Put(k, v, lease) => json!({"request_put": {"key": key(k), "value": B64.encode(v), "lease": lease.to_string()}}),
                    Op::Delete(k) => json!({"request_delete_range": {"key": key(k)}}),
                    Op::Get(k) => json!({"request_range": {"key": key(k)}}),
                })
                .collect()
        };
        let mut failure = ops(failure);
        let writes = success.iter().any(|o| !matches!(o, Op::Get(_)));
        let fence = if writes {
            self.lock_fence().key.clone()
        } else {
            None
        };
        if let Some(fence) = &fence {
            let fence = B64.encode(fence);
            compare.push(
                json!({"key": fence, "target": "CREATE", "result": "GREATER", "create_revision": "0"}),
            );
            failure.push(json!({"request_range": {"key": fence}}));
        }
        let v = self.call(
            "/v3/kv/txn",
            &json!({ "compare": compare, "success": ops(success), "failure": failure }),
            false,
        )?;
        let mut reads = Vec::new();
        for r in v["responses"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            if let Some(range) = r.get("response_range") {
                reads.push(first_record(range)?);
            }
        }
        let succeeded = v["succeeded"].as_bool().unwrap_or(false);
        if fence.is_some() && !succeeded && reads.pop().flatten().is_none() {
            return Err(StateError::Unavailable(LEASE_ENDED.into()));
        }
        Ok(TxnOutcome {
            succeeded,
            revision: int(&v["header"]["revision"])? as u64,
            reads,
        })
    }

    /// The store's current revision (a watch started after it sees every
    /// later change).
    pub fn revision(&self) -> Result<u64, StateError> {
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": B64.encode(self.full_key(b"\0revision")) }),
            true,
        )?;
        Ok(int(&v["header"]["revision"])? as u64)
    }

    /// Changes to the keys under `prefix` from `start_revision` on; see
    /// `Watch::next`.
    pub fn watch(&self, prefix: &[u8], start_revision: u64) -> crate::etcd_watch::Watch {
        let full = self.full_key(prefix);
        crate::etcd_watch::Watch::new(
            self.endpoints
                .iter()
                .map(|e| (e.host.clone(), e.addr))
                .collect(),
            self.prefix.clone(),
            B64.encode(&full),
            B64.encode(prefix_end(&full)),
            start_revision,
            self.timeout,
        )
    }
}

/// The first record of a range answer.
fn first_record(range: &Value) -> Result<Option<Versioned>, StateError> {
    match range["kvs"].as_array().and_then(|kvs| kvs.first()) {
        None => Ok(None),
        Some(kv) => Ok(Some(Versioned {
            version: int(&kv["mod_revision"])? as u64,
            value: bytes(&kv["value"])?,
        })),
    }
}

/// Whether a failed exchange cannot have reached etcd: the connection was
/// refused, or closed before the first byte of an answer (a keep-alive
/// connection the server had closed). `read_response` reports a cut-short
/// answer as `InvalidData`, never as one of these.
fn nothing_applied(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof
            | ConnectionReset
            | ConnectionAborted
            | ConnectionRefused
            | BrokenPipe
            | NotConnected
    )
}

/// Where a call tries its request: an idle kept-alive connection first,
/// then a fresh one to each endpoint in turn.
enum Attempt {
    Pooled(Conn),
    Dial(usize),
}

enum Answer {
    Ok(Value),
    /// etcd answered with an error status.
    Refused(String),
}

fn bad(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string())
}

/// Reads one HTTP/1.1 response: status and body (Content-Length or
/// chunked), bounded by `MAX_RESPONSE`.
fn read_response(r: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<u8>)> {
    let mut line = String::new();
    let read_line = |r: &mut BufReader<TcpStream>, line: &mut String| -> std::io::Result<()> {
        line.clear();
        let n = r.by_ref().take(8192).read_line(line)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        Ok(())
    };
    // Closed before the first byte: the request was not taken (see
    // `nothing_applied`).
    read_line(r, &mut line)?;
    // From here on, anything cut short is an answer lost half-way.
    let cut = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => e,
        _ => bad(&format!("answer cut short: {e}")),
    };
    let read_line =
        |r: &mut BufReader<TcpStream>, line: &mut String| read_line(r, line).map_err(cut);
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad HTTP status line"))?;
    let mut length = None;
    let mut chunked = false;
    loop {
        read_line(r, &mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((name, value)) = l.split_once(':') {
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(
                    value
                        .parse::<usize>()
                        .map_err(|_| bad("bad Content-Length"))?,
                );
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            read_line(r, &mut line)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| bad("bad chunk size"))?;
            if size > MAX_RESPONSE - body.len() {
                return Err(bad("etcd response too large"));
            }
            if size == 0 {
                // Trailers, then the blank line.
                loop {
                    read_line(r, &mut line)?;
                    if line.trim_end().is_empty() {
                        break;
                    }
                }
                break;
            }
            let start = body.len();
            body.resize(start + size, 0);
            r.read_exact(&mut body[start..]).map_err(cut)?;
            read_line(r, &mut line)?;
        }
    } else {
        let length = length.ok_or_else(|| bad("response without a length"))?;
        if length > MAX_RESPONSE {
            return Err(bad("etcd response too large"));
        }
        body.resize(length, 0);
        r.read_exact(&mut body).map_err(cut)?;
    }
    Ok((status, body))
}

impl StateStore for EtcdStore {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": B64.encode(self.full_key(key)) }),
            true,
        )?;
        first_record(&v)
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
        let full = self.full_key(prefix);
        let v = self.call(
            "/v3/kv/range",
            &json!({
                "key": B64.encode(&full),
                "range_end": B64.encode(prefix_end(&full)),
                "sort_order": "ASCEND",
                "sort_target": "KEY",
            }),
            true,
        )?;
        let mut out = Vec::new();
        for kv in v["kvs"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let key = bytes(&kv["key"])?;
            let Some(key) = key.strip_prefix(self.prefix.as_slice()) else {
                return Err(StateError::Corrupt(
                    "etcd: a key outside the store's prefix",
                ));
            };
            out.push((
                key.to_vec(),
                Versioned {
                    version: int(&kv["mod_revision"])? as u64,
                    value: bytes(&kv["value"])?,
                },
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd_test_cluster::Cluster;

    #[test]
    fn endpoints_parse_or_say_why_not() {
        assert_eq!(
            parse_endpoint("http://127.0.0.1:2379").unwrap().1,
            "127.0.0.1:2379".parse().unwrap()
        );
        assert!(parse_endpoint("http://127.0.0.1:2379/").is_ok());
        let e = parse_endpoint("https://127.0.0.1:2379").unwrap_err();
        assert!(e.0.contains("TLS"), "{e}");
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
        // Accepts and holds its connections, answering nothing.
        let held = std::thread::spawn(move || {
            let mut kept = Vec::new();
            for _ in 0..2 {
                kept.push(silent.accept().unwrap().0);
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
                why.contains("no endpoint answered")
                    && urls.iter().all(|u| why.contains(u.as_str())),
                "{why}"
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(
            other.accept().is_ok(),
            "the read was not tried on the next member"
        );
        drop(held.join().unwrap());
    }

    /// A fenced store writes only while its fence record (under a lease)
    /// lives, in etcd's own transaction, and calls nothing once the proof
    /// of the lease has run out.
    #[test]
    fn a_fenced_store_writes_only_while_its_lease_record_lives() {
        let cluster = Cluster::start("fence");
        let control = EtcdStore::new(&cluster.urls, b"/t/", Duration::from_secs(5)).unwrap();
        let store = EtcdStore::new(&cluster.urls, b"/t/", Duration::from_secs(5)).unwrap();
        let lease = control.grant_lease(30).unwrap();
        assert!(control.create_with_lease(b"me", b"1", lease).unwrap());
        store.fence_on(b"me");
        store.proven_until(Instant::now() + Duration::from_secs(30));
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

    #[test]
    fn new_connections_are_spread_over_the_members() {
        let cluster = Cluster::start("spread");
        let store = EtcdStore::new(&cluster.urls, b"/t/", Duration::from_secs(5)).unwrap();
        let mut dialled = Vec::new();
        for _ in 0..cluster.urls.len() * 2 {
            store.get(b"k").unwrap();
            // Take the connection out of the pool: the next call dials.
            let conn = store.lock_idle().pop().unwrap();
            dialled.push(conn.endpoint);
        }
        assert_eq!(dialled, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn prefix_ends_are_the_next_key() {
        assert_eq!(prefix_end(b"/n/a"), b"/n/b");
        assert_eq!(prefix_end(&[1, 0xFF]), vec![2]);
        assert_eq!(prefix_end(&[0xFF, 0xFF]), vec![0]);
    }

    #[test]
    fn gateway_integers_come_as_strings_numbers_or_nothing() {
        assert_eq!(int(&json!("42")).unwrap(), 42);
        assert_eq!(int(&json!(42)).unwrap(), 42);
        assert_eq!(int(&Value::Null).unwrap(), 0);
        assert!(int(&json!("x")).is_err());
        assert!(int(&json!([1])).is_err());
        assert_eq!(bytes(&json!("aGk=")).unwrap(), b"hi");
        assert!(bytes(&json!("!!")).is_err());
    }

    /// The conformance suite against a real cluster, each member's
    /// endpoint first in turn of one store (reads and writes go through
    /// different members), and a second store under another prefix that
    /// sees none of it.
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
                why.contains("no endpoint answered")
                    && cluster.urls.iter().all(|u| why.contains(u.as_str())),
                "{why}"
            ),
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(10));
    }
}
