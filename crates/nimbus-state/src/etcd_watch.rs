//! Watching a key range of etcd through the JSON gateway: `POST /v3/watch`
//! answers with a chunked HTTP/1.1 stream of JSON messages, one per batch
//! of changes. A cluster node watches what other nodes ask of it (an
//! ownership it must hand back).
//!
//! The stream is read with a short timeout per call and parsed from our
//! own buffers, so that a timeout never loses a half-read message. A
//! connection that fails or ends is dialled again (the next endpoint in
//! turn) from the revision after the last change delivered: nothing is
//! missed and nothing is delivered twice. When etcd has compacted that
//! revision away, the batch says `resync` and the caller reads the range
//! afresh.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};

use crate::etcd_store::{bytes, int};
use crate::store::StateError;

/// Largest message or chunk buffered; a stream beyond it is dropped.
const MAX_BUFFERED: usize = 16 << 20;

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

pub struct Watch {
    endpoints: Vec<(String, SocketAddr)>,
    store_prefix: Vec<u8>,
    key: String,
    range_end: String,
    next_revision: u64,
    timeout: Duration,
    next_endpoint: usize,
    stream: Option<Stream>,
}

struct Stream {
    sock: TcpStream,
    /// Bytes read and not yet parsed as HTTP.
    raw: Vec<u8>,
    headers_done: bool,
    /// Chunk payloads not yet parsed as JSON messages.
    json: Vec<u8>,
}

fn bad(why: impl std::fmt::Display) -> StateError {
    StateError::Unavailable(format!("etcd watch: {why}"))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Watch {
    pub(crate) fn new(
        endpoints: Vec<(String, SocketAddr)>,
        store_prefix: Vec<u8>,
        key: String,
        range_end: String,
        start_revision: u64,
        timeout: Duration,
    ) -> Watch {
        Watch {
            endpoints,
            store_prefix,
            key,
            range_end,
            next_revision: start_revision,
            timeout,
            next_endpoint: 0,
            stream: None,
        }
    }

    /// The revision the next change delivered will be at or after.
    pub fn next_revision(&self) -> u64 {
        self.next_revision
    }

    /// Waits up to `wait` for changes. An empty batch: none came (or the
    /// stream was lost and is dialled again on the next call). Err: no
    /// endpoint could be reached.
    pub fn next(&mut self, wait: Duration) -> Result<Batch, StateError> {
        if self.stream.is_none() {
            self.stream = Some(self.dial()?);
        }
        let mut batch = Batch::default();
        let wait = wait.max(Duration::from_millis(1));
        loop {
            match self.parse(&mut batch) {
                Ok(()) => {}
                Err(e) => {
                    tracing::debug!("{e}; dialling again");
                    self.stream = None;
                    return Ok(batch);
                }
            }
            if !batch.events.is_empty() || batch.resync || self.stream.is_none() {
                return Ok(batch);
            }
            let Some(s) = self.stream.as_mut() else {
                return Ok(batch);
            };
            let _ = s.sock.set_read_timeout(Some(wait));
            let mut buf = [0u8; 16 * 1024];
            match s.sock.read(&mut buf) {
                Ok(0) => {
                    self.stream = None;
                    return Ok(batch);
                }
                Ok(n) => {
                    if s.raw.len() + n > MAX_BUFFERED {
                        self.stream = None;
                        return Err(bad("message too large"));
                    }
                    s.raw.extend_from_slice(&buf[..n]);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(batch)
                }
                Err(_) => {
                    self.stream = None;
                    return Ok(batch);
                }
            }
        }
    }

    fn dial(&mut self) -> Result<Stream, StateError> {
        let body = serde_json::to_vec(&json!({
            "create_request": {
                "key": self.key,
                "range_end": self.range_end,
                "start_revision": self.next_revision.to_string(),
            }
        }))
        .map_err(bad)?;
        let mut errors = Vec::new();
        for _ in 0..self.endpoints.len() {
            let (host, addr) = &self.endpoints[self.next_endpoint % self.endpoints.len()];
            self.next_endpoint = self.next_endpoint.wrapping_add(1);
            let attempt = (|| -> std::io::Result<TcpStream> {
                let mut sock = TcpStream::connect_timeout(addr, self.timeout)?;
                sock.set_write_timeout(Some(self.timeout))?;
                sock.set_nodelay(true)?;
                let head = format!(
                    "POST /v3/watch HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\n\r\n",
                    body.len()
                );
                sock.write_all(head.as_bytes())?;
                sock.write_all(&body)?;
                Ok(sock)
            })();
            match attempt {
                Ok(sock) => {
                    return Ok(Stream {
                        sock,
                        raw: Vec::new(),
                        headers_done: false,
                        json: Vec::new(),
                    })
                }
                Err(e) => errors.push(format!("{host}: {e}")),
            }
        }
        Err(bad(format!("no endpoint answered ({})", errors.join("; "))))
    }

    /// Takes what the buffers hold apart: the HTTP head, chunks, messages.
    fn parse(&mut self, batch: &mut Batch) -> Result<(), StateError> {
        let Some(s) = self.stream.as_mut() else {
            return Ok(());
        };
        if !s.headers_done {
            let Some(end) = find(&s.raw, b"\r\n\r\n") else {
                return Ok(());
            };
            let head = String::from_utf8_lossy(&s.raw[..end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 200") {
                return Err(bad(head.lines().next().unwrap_or("").to_string()));
            }
            if !head.contains("transfer-encoding: chunked") {
                return Err(bad("answer not chunked"));
            }
            s.raw.drain(..end + 4);
            s.headers_done = true;
        }
        let mut ended = false;
        while let Some(eol) = find(&s.raw, b"\r\n") {
            let line = std::str::from_utf8(&s.raw[..eol]).map_err(bad)?;
            let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| bad("bad chunk size"))?;
            if size > MAX_BUFFERED || s.json.len() + size > MAX_BUFFERED {
                return Err(bad("message too large"));
            }
            if size == 0 {
                ended = true;
                break;
            }
            if s.raw.len() < eol + 2 + size + 2 {
                break;
            }
            s.json.extend_from_slice(&s.raw[eol + 2..eol + 2 + size]);
            s.raw.drain(..eol + 2 + size + 2);
        }
        let mut messages = Vec::new();
        let mut used = 0;
        {
            let mut it = serde_json::Deserializer::from_slice(&s.json).into_iter::<Value>();
            loop {
                match it.next() {
                    Some(Ok(v)) => {
                        used = it.byte_offset();
                        messages.push(v);
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => return Err(bad(e)),
                    None => break,
                }
            }
        }
        s.json.drain(..used);
        for m in messages {
            self.message(&m, batch)?;
        }
        if ended {
            return Err(bad("stream ended"));
        }
        Ok(())
    }

    fn message(&mut self, m: &Value, batch: &mut Batch) -> Result<(), StateError> {
        if let Some(e) = m.get("error") {
            return Err(bad(e));
        }
        let r = &m["result"];
        if r["canceled"].as_bool().unwrap_or(false) {
            let compacted = int(&r["compact_revision"])? as u64;
            if compacted > 0 {
                self.next_revision = compacted;
                batch.resync = true;
            }
            return Err(bad(format!(
                "watch canceled: {}",
                r["cancel_reason"].as_str().unwrap_or("compacted")
            )));
        }
        for e in r["events"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let kv = &e["kv"];
            let full = bytes(&kv["key"])?;
            let Some(key) = full.strip_prefix(self.store_prefix.as_slice()) else {
                continue;
            };
            let revision = int(&kv["mod_revision"])? as u64;
            // proto3 JSON leaves the default (PUT) out.
            let value = match e["type"].as_str() {
                Some("DELETE") => None,
                _ => Some(bytes(&kv["value"])?),
            };
            self.next_revision = self.next_revision.max(revision + 1);
            batch.events.push(Event {
                key: key.to_vec(),
                value,
                revision,
            });
        }
        Ok(())
    }
}
