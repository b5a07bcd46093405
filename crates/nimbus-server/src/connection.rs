//! One TCP connection: a reader task that frames messages, a bounded set of
//! requests processed on the blocking pool, and a writer task that sends
//! responses in the order they complete.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use nimbus_crypto::{CipherAlgorithm, SigningAlgorithm};
use nimbus_wire::nbss::frame_length;
use nimbus_wire::negotiate::Dialect;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, Semaphore};

use crate::credits::CreditWindow;
use crate::server::Server;
use crate::session::{lock, Session};

/// Largest frame accepted: an 8 MiB WRITE plus headers. Longer length
/// prefixes close the connection before anything is allocated.
pub const MAX_FRAME: usize = 8 * 1024 * 1024 + 64 * 1024;
/// Largest READ/WRITE/transact size offered with LARGE_MTU (2.1+).
pub const MAX_IO_SIZE: u32 = 8 * 1024 * 1024;
/// Frames processed at once per connection; the reader waits for a slot,
/// which bounds memory per connection at about this many frames.
const MAX_IN_FLIGHT: usize = 32;

/// What NEGOTIATE settled (MS-SMB2 3.3.1.7 Connection).
pub struct Negotiated {
    pub dialect: Dialect,
    pub client_guid: [u8; 16],
    pub client_security_mode: u16,
    pub client_capabilities: u32,
    pub client_dialects: Vec<u16>,
    pub server_security_mode: u16,
    pub server_capabilities: u32,
    pub signing_algorithm: SigningAlgorithm,
    /// Connection.CipherId: None if the client cannot encrypt.
    pub cipher: Option<CipherAlgorithm>,
    pub max_io: u32,
}

/// Payload buffers reused across requests of one connection, so that steady
/// reading and writing allocate nothing per request: received frames and
/// built responses come from here and go back after use. Bounded by count
/// and by bytes, so an idle connection keeps little.
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    const MAX_BUFFERS: usize = 8;
    const MAX_BYTES: usize = 24 * 1024 * 1024;

    fn new() -> Self {
        BufferPool {
            free: Mutex::new(Vec::new()),
        }
    }

    /// An empty buffer, with the capacity of an earlier one when available.
    pub fn take(&self) -> Vec<u8> {
        lock(&self.free).pop().unwrap_or_default()
    }

    /// A buffer of `len` bytes (contents unspecified: the caller overwrites
    /// them all, as a frame read does).
    pub fn take_len(&self, len: usize) -> Vec<u8> {
        let mut buf = lock(&self.free).pop().unwrap_or_default();
        // Shrinking keeps the old bytes; only growth beyond the previous
        // length writes zeros.
        buf.resize(len, 0);
        buf
    }

    pub fn give(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > MAX_FRAME + 64 * 1024 {
            return;
        }
        let mut free = lock(&self.free);
        let held: usize = free.iter().map(Vec::capacity).sum();
        if free.len() < Self::MAX_BUFFERS && held + buf.capacity() <= Self::MAX_BYTES {
            free.push(buf);
        }
    }
}

/// A response frame ready to send: `buf[start..]`, NBSS header included.
/// Responses are built after a reserved TRANSFORM header slot so that
/// encryption happens in place; clear responses start after that slot.
pub struct Outgoing {
    pub buf: Vec<u8>,
    pub start: usize,
}

pub struct Connection {
    pub server: Arc<Server>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub negotiated: Mutex<Option<Arc<Negotiated>>>,
    /// 3.1.1 Connection.PreauthIntegrityHashValue.
    pub preauth: Mutex<[u8; 64]>,
    pub credits: Mutex<CreditWindow>,
    pub sessions: Mutex<HashMap<u64, Arc<Session>>>,
    pub pool: BufferPool,
    closing: AtomicBool,
    close_notify: Notify,
}

impl Connection {
    pub fn negotiated(&self) -> Option<Arc<Negotiated>> {
        lock(&self.negotiated).clone()
    }

    /// Asks the reader to stop; in-flight requests finish but the socket closes.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.close_notify.notify_one();
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    pub fn session(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.sessions).get(&id).cloned()
    }

    /// Releases every open of every session: share modes, delete-on-close.
    fn teardown(&self) {
        let sessions: Vec<_> = lock(&self.sessions).drain().map(|(_, s)| s).collect();
        for s in sessions {
            crate::handlers::logoff::close_session(&self.server, &s);
        }
    }
}

pub async fn serve(server: Arc<Server>, stream: TcpStream, peer: SocketAddr) {
    let local = stream.local_addr().unwrap_or(peer);
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Outgoing>(MAX_IN_FLIGHT);
    let conn = Arc::new(Connection {
        server,
        peer,
        local,
        negotiated: Mutex::new(None),
        preauth: Mutex::new([0u8; 64]),
        credits: Mutex::new(CreditWindow::default()),
        sessions: Mutex::new(HashMap::new()),
        pool: BufferPool::new(),
        closing: AtomicBool::new(false),
        close_notify: Notify::new(),
    });
    tracing::debug!("connection from {peer}");

    let writer_conn = conn.clone();
    let writer = tokio::spawn(async move {
        while let Some(out) = rx.recv().await {
            if wr.write_all(&out.buf[out.start..]).await.is_err() {
                break;
            }
            writer_conn.pool.give(out.buf);
        }
        let _ = wr.shutdown().await;
    });

    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let mut head = [0u8; 4];
        let read = tokio::select! {
            r = rd.read_exact(&mut head) => r,
            _ = conn.close_notify.notified() => break,
        };
        if read.is_err() || conn.is_closing() {
            break;
        }
        let len = match frame_length(head, MAX_FRAME) {
            Ok(Some(len)) => len,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("{peer}: refused frame ({e:?}); closing connection");
                break;
            }
        };
        let mut frame = conn.pool.take_len(len);
        let read = tokio::select! {
            r = rd.read_exact(&mut frame) => r,
            _ = conn.close_notify.notified() => break,
        };
        if read.is_err() {
            break;
        }
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let conn2 = conn.clone();
        let tx2 = tx.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::dispatch::process_frame(&conn2, &mut frame)
            }));
            conn2.pool.give(frame);
            match result {
                Ok(Some(out)) => {
                    if tx2.blocking_send(out).is_err() {
                        conn2.close();
                    }
                }
                Ok(None) => {}
                Err(_) => {
                    tracing::error!(
                        "{}: request handling panicked; closing this connection",
                        conn2.peer
                    );
                    conn2.close();
                }
            }
        });
    }
    conn.close();
    drop(tx);
    // Wait for in-flight requests before releasing the connection's opens.
    let _ = slots.acquire_many(MAX_IN_FLIGHT as u32).await;
    let conn2 = conn.clone();
    let _ = tokio::task::spawn_blocking(move || conn2.teardown()).await;
    let _ = writer.await;
    tracing::debug!("connection from {peer} closed");
}
