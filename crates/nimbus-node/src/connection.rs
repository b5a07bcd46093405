//! One TCP connection: a reader task that frames messages and answers
//! the quick ones itself, a bounded set of requests processed on the
//! blocking pool, and a writer task that sends their responses in the
//! order they complete (`send`).

mod delivery;
pub mod frames;
mod read_ahead;
mod send;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use nimbus_wire::nbss::frame_length;
use nimbus_wire::NtStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::timeout;

use crate::admission::ConnectionSlot;
use crate::credits::CreditWindow;
use crate::dir_budget::EntryBudget;
use crate::drain::Stage;
use crate::held_bytes::HeldBytes;
use crate::limits::Limits;
pub use crate::negotiated::Negotiated;
use crate::pending::PendingTable;
use crate::server::Server;
use crate::session::{Session, SigningKey};
use crate::sync::lock;
use frames::Unsealed;

/// A connection that has sent nothing for this long gives its spare
/// buffers back, so idle connections hold little memory.
const IDLE_TRIM: Duration = Duration::from_secs(5);
/// How long queued responses may take to go out once the connection is
/// closing, before they are dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// What handles a connection's requests: the SMB2 dispatcher, in the crate
/// above. The connection loop frames, schedules and sends; it knows no
/// handler, so another transport can sit beside it.
pub trait Dispatch: Send + Sync + 'static {
    /// Processes one received frame and returns the frame to send back, if
    /// any. A protocol violation that the spec answers with a disconnect
    /// calls `conn.close()` and returns None. `allowance` bounds the bytes
    /// of the responses (reserved by the caller: `frames::response_allowance`);
    /// `arrival` is the frame's arrival number when it runs on the
    /// blocking pool (`crate::arrivals`); `unsealed`, a sealed frame already
    /// opened by the reader (`frames::unseal_small`).
    fn process_frame(
        &self,
        conn: &Arc<Connection>,
        frame: &mut [u8],
        allowance: usize,
        arrival: Option<u64>,
        unsealed: Option<Unsealed>,
    ) -> Option<Outgoing>;
}

/// Payload buffers reused across requests of one connection, so that steady
/// reading and writing allocate nothing per request: received frames and
/// built responses come from here and go back after use. Bounded by count
/// and by bytes (the connection's memory budget: no more can be in flight,
/// so no more is ever needed), and emptied when the connection goes idle.
pub struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Buffers larger than this (capacity) are not kept.
    largest: usize,
    /// Spare capacity kept at most, in bytes.
    max_bytes: usize,
}

impl BufferPool {
    const MAX_BUFFERS: usize = 8;

    fn new(max_frame: usize, max_bytes: usize) -> Self {
        BufferPool {
            free: Mutex::new(Vec::new()),
            largest: max_frame + 64 * 1024,
            max_bytes,
        }
    }

    /// Frees every spare buffer (the connection went idle).
    fn trim(&self) {
        lock(&self.free).clear();
    }

    /// An empty buffer, preferably one with room for `size` bytes (see
    /// `pick`); the caller grows it if needed.
    pub fn take(&self, size: usize) -> Vec<u8> {
        let mut buf = self.pick(size);
        buf.clear();
        buf
    }

    /// The smallest spare buffer that holds `size` bytes, else the largest
    /// (which grows), else a new one. Picking by size keeps small requests
    /// from taking the buffers that big READ responses and WRITE frames
    /// need: a fresh multi-MiB buffer costs a page fault per 4 KiB.
    fn pick(&self, size: usize) -> Vec<u8> {
        let mut free = lock(&self.free);
        let capacity = |i: &usize| free[*i].capacity();
        let fits = (0..free.len())
            .filter(|i| capacity(i) >= size)
            .min_by_key(capacity);
        let pick = fits.or_else(|| (0..free.len()).max_by_key(capacity));
        pick.map(|i| free.swap_remove(i)).unwrap_or_default()
    }

    pub fn give(&self, buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > self.largest {
            return;
        }
        let mut free = lock(&self.free);
        let held: usize = free.iter().map(Vec::capacity).sum();
        if free.len() < Self::MAX_BUFFERS && held + buf.capacity() <= self.max_bytes {
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
    /// Requests whose interim STATUS_PENDING response is in this frame:
    /// once it is written, their final responses may follow (never before,
    /// or the client would see an interim for a finished request).
    pub interims: Vec<Arc<crate::pending::PendingRequest>>,
    /// Run once the frame is written.
    pub on_sent: Vec<frames::OnSent>,
}

impl From<crate::pending::Frame> for Outgoing {
    fn from(frame: crate::pending::Frame) -> Outgoing {
        Outgoing::new(frame.buf, frame.start)
    }
}

/// What a pending request's final response and a break need of their
/// connection (`pending::ResponseChannel`).
impl crate::pending::ResponseChannel for Connection {
    fn send_frame(&self, frame: crate::pending::Frame) {
        self.send_unsolicited(frame.into());
    }

    fn send_frame_watched(&self, frame: crate::pending::Frame) {
        let me = self.me.clone();
        let watch: frames::OnSent = Box::new(move || delivery::watch(me));
        self.send_unsolicited(Outgoing::from(frame).with_on_sent(vec![watch]));
    }

    fn forget_pending(&self, async_id: u64) {
        self.pending.remove(async_id);
    }

    fn is_closing(&self) -> bool {
        Connection::is_closing(self)
    }

    fn close_unsendable(&self) {
        tracing::warn!("{}: cannot encrypt a message; closing", self.peer);
        self.close();
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }
}

/// What a session needs of the connections of its channels.
impl crate::session::Channel for Connection {
    fn client_gone(&self) -> bool {
        Connection::client_gone(self)
    }

    fn drop_now(&self) {
        Connection::drop_now(self)
    }

    fn has_ended(&self) -> bool {
        Connection::has_ended(self)
    }

    fn forget_session(&self, session: &Session) {
        let mut sessions = lock(&self.sessions);
        if sessions
            .get(&session.id)
            .is_some_and(|e| std::ptr::eq(Arc::as_ptr(&e.session), session))
        {
            sessions.remove(&session.id);
        }
        drop(sessions);
        lock(&self.bindings).remove(&session.id);
    }

    fn end_requests_of(&self, session_id: u64) {
        self.pending
            .end_all(NtStatus::CANCELLED, |p| p.session_id() == session_id);
    }
}

impl Outgoing {
    pub fn new(buf: Vec<u8>, start: usize) -> Outgoing {
        Outgoing {
            buf,
            start,
            interims: Vec::new(),
            on_sent: Vec::new(),
        }
    }

    pub fn with_interims(mut self, interims: Vec<Arc<crate::pending::PendingRequest>>) -> Outgoing {
        self.interims = interims;
        self
    }

    pub fn with_on_sent(mut self, on_sent: Vec<frames::OnSent>) -> Outgoing {
        self.on_sent = on_sent;
        self
    }
}

/// An entry of Connection.SessionTable: the session and, on a channel bound
/// to it, Channel.SigningKey (MS-SMB2 3.3.1.14). None on the connection
/// that made the session: its channel signs with Session.SigningKey.
#[derive(Clone)]
pub struct ChannelEntry {
    pub session: Arc<Session>,
    pub signer: Option<SigningKey>,
}

impl ChannelEntry {
    pub fn first(session: Arc<Session>) -> Self {
        ChannelEntry {
            session,
            signer: None,
        }
    }
}

/// A session binding under way on a connection: its authentication
/// exchange and the 3.1.1 preauth hash of this connection's exchange,
/// which the channel's signing key derives from (MS-SMB2 3.3.5.5.3).
pub struct Binding {
    pub exchange: nimbus_auth::AuthExchange,
    pub preauth: [u8; 64],
}

pub struct Connection {
    pub server: Arc<Server>,
    /// What handles the requests this connection reads.
    dispatch: Arc<dyn Dispatch>,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub negotiated: Mutex<Option<Arc<Negotiated>>>,
    /// 3.1.1 Connection.PreauthIntegrityHashValue.
    pub preauth: Mutex<[u8; 64]>,
    pub credits: Mutex<CreditWindow>,
    /// Connection.SessionTable: the sessions reachable on this connection,
    /// with this channel's signing key.
    pub sessions: Mutex<HashMap<u64, ChannelEntry>>,
    /// Session bindings whose exchange is under way on this connection
    /// (MS-SMB2 3.3.5.5), by session id.
    pub bindings: Mutex<HashMap<u64, Binding>>,
    pub pool: BufferPool,
    /// Directory entries this connection's enumerations hold.
    pub dir_entries: Arc<EntryBudget>,
    /// Requests answered STATUS_PENDING whose final response is owed.
    pub pending: PendingTable,
    next_async_id: AtomicU64,
    /// The writer's queue for messages that answer no frame being
    /// processed: final responses of pending requests, oplock and lease
    /// breaks.
    /// None until `serve` starts the writer (and in the fuzz harness).
    unsolicited: Mutex<Option<mpsc::UnboundedSender<Outgoing>>>,
    /// Messages handed to the writer task and not yet written: while any
    /// is, the reader queues its answers behind them rather than write
    /// them itself (`send`).
    queued_out: AtomicUsize,
    /// What that queue and this connection's named pipes hold, at most
    /// `limits.max_connection_memory_bytes` (`crate::held_bytes`). Each
    /// message on the queue answers something the client holds (an open's
    /// oplock or lease, a pending request), but a client that stops reading
    /// would have up to one break per open pile up for as long as it holds
    /// them (10,000 lease breaks hold ~2.4 MB of buffers).
    pub held: Arc<HeldBytes>,
    /// Counts this connection in the server's admission limits.
    slot: ConnectionSlot,
    /// The socket, while the reader has it (-1 after): looked at, never
    /// read, by `client_gone` and `delivery`.
    socket: std::sync::atomic::AtomicI32,
    /// A watched break went unacknowledged by the client's TCP
    /// (`delivery`): the reader resets the connection as it ends, on the
    /// socket it owns.
    reset_requested: AtomicBool,
    /// This connection, for what outlives a call on it (`delivery`).
    me: Weak<Connection>,
    closing: AtomicBool,
    /// Closed because the client does not read: what is queued for it is
    /// not waited for.
    not_reading: AtomicBool,
    close_notify: Notify,
    /// The connection has ended: its sessions and opens are released.
    ended: AtomicBool,
    /// A cluster node's metadata requests of this connection that wait on
    /// the blocking pool, run one after another in the order they came.
    serial: Arc<Serial>,
    /// The frames on the blocking pool, for the commands that end handles
    /// to wait for those that came before them (`crate::arrivals`).
    pub arrivals: Arc<crate::arrivals::Arrivals>,
    /// What a Mac negotiated with the AAPL create context (crate::apple).
    pub apple: crate::apple::AppleState,
    /// Every log line of this connection's requests names the client's
    /// address (`client{addr=...}`), and once a session is logged on, its
    /// id and user (`session{id=... user=...}`, `session_span`).
    pub span: tracing::Span,
    session_spans: Mutex<HashMap<u64, tracing::Span>>,
}

/// A job of the serial queue.
type Job = Box<dyn FnOnce() + Send>;

/// Runs jobs on the blocking pool one at a time, in the order submitted,
/// with no thread of its own while idle. On a cluster node, a CREATE or
/// LOCK on a continuously available share waits for etcd on the pool
/// (`frames::is_quick`); the metadata requests that follow it on the
/// connection queue behind it rather than overtake it, which keeps what a
/// client sees the same as on a single node (a rename's break is sent
/// before a later CREATE of the same connection is answered, as smbtorture
/// smb2.lease.rename_wait expects).
#[derive(Default)]
struct Serial {
    queue: Mutex<(std::collections::VecDeque<Job>, bool)>,
}

impl Serial {
    /// Whether no job is queued or running: a request run now elsewhere
    /// overtakes none.
    fn is_idle(&self) -> bool {
        !lock(&self.queue).1
    }

    fn submit(self: &Arc<Self>, job: Job) {
        {
            let mut q = lock(&self.queue);
            q.0.push_back(job);
            if q.1 {
                return;
            }
            q.1 = true;
        }
        let me = self.clone();
        tokio::task::spawn_blocking(move || loop {
            let job = {
                let mut q = lock(&me.queue);
                match q.0.pop_front() {
                    Some(j) => j,
                    None => {
                        q.1 = false;
                        return;
                    }
                }
            };
            job();
        });
    }
}

impl Connection {
    pub fn new(
        server: Arc<Server>,
        dispatch: Arc<dyn Dispatch>,
        peer: SocketAddr,
        local: SocketAddr,
        slot: ConnectionSlot,
    ) -> Arc<Connection> {
        Self::in_span(server, dispatch, peer, local, slot, client_span(peer))
    }

    /// The same, with the span its lines go in.
    fn in_span(
        server: Arc<Server>,
        dispatch: Arc<dyn Dispatch>,
        peer: SocketAddr,
        local: SocketAddr,
        slot: ConnectionSlot,
        span: tracing::Span,
    ) -> Arc<Connection> {
        let limits = &server.config().limits;
        Arc::new_cyclic(|me| Connection {
            me: me.clone(),
            reset_requested: AtomicBool::new(false),
            credits: Mutex::new(CreditWindow::new(limits.max_credits)),
            dir_entries: EntryBudget::new(limits.max_directory_entries),
            pending: PendingTable::default(),
            next_async_id: AtomicU64::new(1),
            unsolicited: Mutex::new(None),
            queued_out: AtomicUsize::new(0),
            held: HeldBytes::new(limits.max_connection_memory_bytes),
            pool: BufferPool::new(limits.max_frame_bytes, limits.max_connection_memory_bytes),
            server,
            dispatch,
            peer,
            local,
            negotiated: Mutex::new(None),
            preauth: Mutex::new([0u8; 64]),
            sessions: Mutex::new(HashMap::new()),
            bindings: Mutex::new(HashMap::new()),
            slot,
            closing: AtomicBool::new(false),
            socket: std::sync::atomic::AtomicI32::new(-1),
            not_reading: AtomicBool::new(false),
            close_notify: Notify::new(),
            ended: AtomicBool::new(false),
            serial: Arc::default(),
            arrivals: Arc::default(),
            apple: Default::default(),
            span,
            session_spans: Mutex::new(HashMap::new()),
        })
    }

    /// The span of a logged-on session's requests on this connection,
    /// made at its first request here. Spans of sessions that left the
    /// connection are dropped as new ones come, so the map stays within
    /// the connection's session limit.
    pub fn session_span(&self, session: &Session) -> tracing::Span {
        let id = session.id;
        if let Some(span) = lock(&self.session_spans).get(&id) {
            return span.clone();
        }
        let user = match &*lock(&session.state) {
            crate::session::SessionState::Valid(a) if a.domain.is_empty() => a.user.clone(),
            crate::session::SessionState::Valid(a) => format!("{}\\{}", a.domain, a.user),
            crate::session::SessionState::InProgress { .. } => return tracing::Span::none(),
        };
        let span = tracing::info_span!(parent: &self.span, "session", id = %format_args!("{id:#x}"), user = %user);
        let here: Vec<u64> = lock(&self.sessions).keys().copied().collect();
        let mut spans = lock(&self.session_spans);
        spans.retain(|s, _| here.contains(s));
        spans.insert(id, span.clone());
        span
    }

    /// A session logged on: the connection is no longer unauthenticated.
    pub fn logged_on(&self) {
        self.slot.logged_on();
    }

    pub fn negotiated(&self) -> Option<Arc<Negotiated>> {
        lock(&self.negotiated).clone()
    }

    /// The reason a session has no encryption keys, for the log line.
    pub fn why_no_encryption(&self, guest: bool) -> String {
        match self.negotiated() {
            _ if guest => "guest and anonymous sessions have no key".into(),
            Some(n) if !n.dialect.is_smb3() => {
                format!("dialect {:?} has no encryption; SMB 3 is needed", n.dialect)
            }
            Some(n) if n.cipher.is_none() => {
                format!(
                    "the client offered none of the configured ciphers ({:?})",
                    n.dialect
                )
            }
            _ => "no cipher negotiated".into(),
        }
    }

    /// Asks the reader to stop; in-flight requests finish but the socket closes.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        self.close_notify.notify_one();
    }

    /// Drops the connection at once: no request is read after the one
    /// being read, and nothing queued for the client is sent (a cluster
    /// node that lost its lease can stand by nothing it was about to say).
    pub fn drop_now(&self) {
        self.not_reading.store(true, Ordering::SeqCst);
        self.close();
    }

    /// Whether the connection has ended, its sessions and opens released.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Whether none of this connection's ordered requests is queued or
    /// running (`frames::is_ordered`).
    pub fn ordered_queue_is_empty(&self) -> bool {
        self.serial.is_idle()
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Whether the client has closed this connection, though the reader
    /// may not have seen it yet: the socket's end of stream is waiting to
    /// be read (a look with MSG_PEEK takes nothing from it). Data waiting,
    /// or nothing yet: not gone. Requests the reader has read ahead
    /// (`read_ahead`) and not yet served do not count: a client that sent
    /// them and closed is gone.
    pub fn client_gone(&self) -> bool {
        if self.is_closing() {
            return true;
        }
        let fd = self.socket.load(Ordering::SeqCst);
        if fd < 0 {
            return false;
        }
        let mut byte = 0u8;
        // SAFETY: a one-byte buffer of ours; the descriptor is the
        // reader's socket, open until the reader ends (it clears `socket`
        // first). Should it have been closed and its number reused since
        // it was loaded, the look is at another socket and only decides
        // whether a refused CREATE waits (briefly) before it answers.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n == 0
    }

    /// A fresh AsyncId (MS-SMB2 3.3.4.2: unique among the connection's
    /// async requests).
    pub fn new_async_id(&self) -> u64 {
        self.next_async_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues a message to the client outside any request's response (the
    /// final response of a pending request, an oplock or lease break). A
    /// client that lets more than its memory budget of these (with what its
    /// pipes hold unread) wait (`limits.max_connection_memory_bytes`,
    /// counted apart from requests and their responses) is taken as not
    /// reading: the connection closes,
    /// which releases its opens and so ends every wait on its breaks at
    /// once, rather than each after `oplock_break_timeout_secs`.
    pub fn send_unsolicited(&self, out: Outgoing) {
        // Counted by capacity: what the queued buffer holds in memory.
        let size = out.buf.capacity();
        {
            let queue = lock(&self.unsolicited);
            let Some(tx) = queue.as_ref() else {
                return;
            };
            if self.held.charge(size) {
                self.queued_out.fetch_add(1, Ordering::SeqCst);
                if tx.send(out).is_err() {
                    self.queued_out.fetch_sub(1, Ordering::SeqCst);
                    self.held.release(size);
                }
                return;
            }
        }
        if !self.not_reading.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "{}: more than {} bytes of breaks, responses and pipe answers wait unread \
                 (limits.max_connection_memory_bytes): the client is not reading; closing",
                self.peer,
                self.held.max()
            );
        }
        self.close();
    }

    pub fn session(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.sessions).get(&id).map(|e| e.session.clone())
    }

    pub fn channel(&self, id: u64) -> Option<ChannelEntry> {
        lock(&self.sessions).get(&id).cloned()
    }

    /// The key that signs for session `id` on this connection: the
    /// channel's own, or Session.SigningKey on the session's first one.
    pub fn signing_key(&self, id: u64) -> Option<SigningKey> {
        let entry = self.channel(id)?;
        entry.signer.or_else(|| entry.session.signing_key())
    }

    /// Releases every open of every session that has no other channel:
    /// share modes, delete-on-close. A session bound to other connections
    /// too lives on there with its opens (MS-SMB2 3.3.7.1).
    pub fn teardown(&self) {
        lock(&self.bindings).clear();
        let sessions: Vec<_> = lock(&self.sessions)
            .drain()
            .map(|(_, e)| e.session)
            .collect();
        let (ended, survivors): (Vec<_>, Vec<_>) =
            sessions.into_iter().partition(|s| s.leave(self));
        let survivors: Vec<_> = survivors.into_iter().filter(|s| !s.has_ended()).collect();
        // Nothing pending is answered here any more; each waiter is let
        // go. A replayable CREATE waiting for breaks in a session that
        // lives on goes on waiting and opens its file: the client replays
        // it on another channel, and is told FILE_NOT_AVAILABLE until it
        // has, then gets the open (smbtorture
        // smb2.replay.dhv2-pending2*-sane). One the client cannot replay
        // would only leave an open it never hears of.
        self.pending.end_all(NtStatus::CANCELLED, |p| {
            !p.is_replayable() || !survivors.iter().any(|s| s.id == p.session_id())
        });
        for s in &ended {
            crate::session_end::end_session(&self.server, s);
        }
        for s in &survivors {
            // Said once per session, not by each of its channels closing
            // together (a client that goes away with all of them).
            if s.connections().iter().any(|c| !c.is_closing()) {
                tracing::info!(
                    "{}: channel of session {:#x} lost; the session goes on on its other channels",
                    self.peer,
                    s.id
                );
                let opens: Vec<_> = crate::sync::lock(&s.opens).values().cloned().collect();
                crate::oplocks::redeliver_breaks(&self.server.oplocks, &opens, self);
            }
        }
    }
}

/// What a request holds while it is processed and until its response has
/// been sent: one of the connection's outstanding-request slots and its
/// share of the connection's memory budget.
struct InFlight {
    _slot: OwnedSemaphorePermit,
    _memory: OwnedSemaphorePermit,
}

/// Why the reader stopped.
enum ReadEnd {
    /// The client closed the connection (or the socket failed).
    Closed,
    /// The client broke a rule; logged, then the connection closes.
    Refused(String),
}

impl From<std::io::Error> for ReadEnd {
    fn from(_: std::io::Error) -> Self {
        ReadEnd::Closed
    }
}

/// The memory budget is counted in KiB so that it fits a semaphore.
fn kib(bytes: usize) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as usize) as u32
}

/// The per-connection limits on requests in flight.
struct Budget {
    slots: Arc<Semaphore>,
    /// One permit per KiB of `limits.max_connection_memory_bytes`.
    memory: Arc<Semaphore>,
    memory_kib: u32,
}

/// Reads until `buf` holds `len` bytes, straight into its spare capacity:
/// no zero-filling of a buffer the socket is about to overwrite (for 8 MiB
/// WRITE frames that memset cost 4% of the server's CPU), and never a byte
/// beyond `len`, which belongs to the next frame.
async fn read_to_len(rd: &mut OwnedReadHalf, buf: &mut Vec<u8>, len: usize) -> std::io::Result<()> {
    use bytes::BufMut;
    while buf.len() < len {
        let want = len - buf.len();
        if rd.read_buf(&mut buf.limit(want)).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Takes `n` permits of one of the connection's budgets, waiting for
/// answers to go out if they are all in use. The answers the reader made
/// itself and holds are sent first: they may hold the very permits it
/// waits for, and the client may wait for them before it sends more. A
/// wait is counted by the
/// configuration key (`limits.<limit>`) that bounds the budget, so that an
/// administrator sees which limit holds clients back.
async fn room(
    conn: &Connection,
    answers: &mut send::Answers,
    budget: &Arc<Semaphore>,
    n: u32,
    limit: &'static str,
) -> Result<OwnedSemaphorePermit, ReadEnd> {
    match budget.clone().try_acquire_many_owned(n) {
        Ok(permit) => Ok(permit),
        Err(tokio::sync::TryAcquireError::Closed) => Err(ReadEnd::Closed),
        Err(tokio::sync::TryAcquireError::NoPermits) => {
            answers.send(conn).await.map_err(|_| ReadEnd::Closed)?;
            if let Ok(permit) = budget.clone().try_acquire_many_owned(n) {
                return Ok(permit);
            }
            crate::metrics::reader_waited(limit);
            budget
                .clone()
                .acquire_many_owned(n)
                .await
                .map_err(|_| ReadEnd::Closed)
        }
    }
}

/// Reads one frame: waits as long as needed for its first byte, then
/// within `frame_timeout` for the rest. Room in the connection's budget is
/// taken for the frame before it is allocated, and for its answers once it
/// is read (and, if small and sealed, opened). Ok(None): a keep-alive.
/// What was read ahead (`read_ahead`) is taken first.
async fn read_frame(
    conn: &Connection,
    rd: &mut OwnedReadHalf,
    ahead: &mut read_ahead::ReadAhead,
    limits: &Limits,
    budget: &Budget,
    answers: &mut send::Answers,
) -> Result<Option<(Vec<u8>, InFlight, usize, Option<Unsealed>)>, ReadEnd> {
    if ahead.is_empty() {
        match timeout(IDLE_TRIM, ahead.fill(rd)).await {
            Ok(r) => r?,
            Err(_) => {
                conn.pool.trim();
                ahead.release();
                ahead.fill(rd).await?;
            }
        }
    }
    let slow = || {
        ReadEnd::Refused(format!(
            "frame not complete within {:?}",
            limits.frame_timeout
        ))
    };
    // One allowance for the whole frame, header and body, from its first
    // byte: a client trickling bytes gets frame_timeout, not one per part.
    let first_byte = tokio::time::Instant::now();
    while ahead.bytes().len() < 4 {
        let left = limits.frame_timeout.saturating_sub(first_byte.elapsed());
        timeout(left, ahead.fill(rd)).await.map_err(|_| slow())??;
    }
    let mut head = [0u8; 4];
    head.copy_from_slice(&ahead.bytes()[..4]);
    ahead.consume(4);
    let left = limits.frame_timeout.saturating_sub(first_byte.elapsed());
    let len = match frame_length(head, limits.max_frame_bytes) {
        Ok(Some(len)) => len,
        Ok(None) => return Ok(None),
        Err(e) => return Err(ReadEnd::Refused(format!("refused frame ({e:?})"))),
    };
    if len > send::HOLD_MAX_FRAME {
        answers.send(conn).await.map_err(|_| ReadEnd::Closed)?;
    }
    let slot = room(conn, answers, &budget.slots, 1, "max_outstanding_requests").await?;
    // Never more than the whole budget, or the wait would never end (the
    // limits are validated so that a largest frame fits).
    let frame_kib = kib(len).min(budget.memory_kib);
    let mut memory = room(
        conn,
        answers,
        &budget.memory,
        frame_kib,
        "max_connection_memory_bytes",
    )
    .await?;
    let mut frame = conn.pool.take(len);
    frame.reserve_exact(len);
    let have = len.min(ahead.bytes().len());
    frame.extend_from_slice(&ahead.bytes()[..have]);
    ahead.consume(have);
    // The wait for budget above is the server's, not the client's: only
    // the time the client itself took counts against it.
    timeout(left, read_to_len(rd, &mut frame, len))
        .await
        .map_err(|_| slow())??;
    // A small sealed frame is opened here, before its responses' room is
    // reserved: unopened, it could hold a READ of any size and took the
    // largest allowance, so a 32 MiB budget let only three small encrypted
    // requests be in flight, and the reader waited on the writer.
    let Ok(unsealed) = frames::unseal_small(conn, &mut frame) else {
        conn.pool.give(frame);
        return Err(ReadEnd::Closed);
    };
    // Room for the responses, as much as the requests may ask for (never
    // more than the budget, so that every frame can proceed).
    let asked = frames::response_allowance(frames::messages(&frame, &unsealed), limits);
    let wanted_kib = kib(asked).min(budget.memory_kib - frame_kib);
    if wanted_kib > 0 {
        memory.merge(
            room(
                conn,
                answers,
                &budget.memory,
                wanted_kib,
                "max_connection_memory_bytes",
            )
            .await?,
        );
    }
    let wanted = wanted_kib as usize * 1024;
    Ok(Some((
        frame,
        InFlight {
            _slot: slot,
            _memory: memory,
        },
        wanted,
        unsealed,
    )))
}

/// Processes one frame, gives its buffer back to the pool and returns the
/// response to send. A panic in request handling closes this connection
/// only.
fn run_frame(
    conn: &Arc<Connection>,
    mut frame: Vec<u8>,
    allowance: usize,
    arrival: Option<u64>,
    unsealed: Option<Unsealed>,
) -> Option<Outgoing> {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _client = conn.span.enter();
        conn.dispatch
            .process_frame(conn, &mut frame, allowance, arrival, unsealed)
    }));
    conn.pool.give(frame);
    result.unwrap_or_else(|_| {
        tracing::error!(
            "{}: request handling panicked; closing this connection",
            conn.peer
        );
        conn.close();
        None
    })
}

/// Closes a connection that has not logged a session on in time.
fn start_logon_deadline(conn: Weak<Connection>, after: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        if let Some(conn) = conn.upgrade() {
            if !conn.slot.is_logged_on() && !conn.is_closing() {
                tracing::warn!(
                    "{}: no session logged on within {after:?} (limits.unauthenticated_timeout_secs); closing",
                    conn.peer
                );
                conn.close();
            }
        }
    });
}

/// The span of a connection's log lines: the client's address.
fn client_span(peer: SocketAddr) -> tracing::Span {
    tracing::info_span!("client", addr = %peer)
}

/// Serves one client connection until it ends; every line it logs names
/// the client (`Connection::span`).
pub async fn serve(
    server: Arc<Server>,
    dispatch: Arc<dyn Dispatch>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: ConnectionSlot,
) {
    use tracing::Instrument;
    let span = client_span(peer);
    serve_in(server, dispatch, stream, peer, slot, span.clone())
        .instrument(span)
        .await
}

async fn serve_in(
    server: Arc<Server>,
    dispatch: Arc<dyn Dispatch>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: ConnectionSlot,
    span: tracing::Span,
) {
    let local = stream.local_addr().unwrap_or(peer);
    let (mut rd, wr) = stream.into_split();
    let limits = server.config().limits.clone();
    let stopping = server.clone();
    let live = stopping.drain.connection_started();
    // One wait for the server's stop per connection, not one per frame.
    let mut stage = stopping.drain.watch();
    let mut until_drain = stopping.drain.watch();
    let draining = async move { crate::drain::reached(&mut until_drain, Stage::Draining).await };
    tokio::pin!(draining);
    let (tx, rx) = mpsc::channel::<(Outgoing, InFlight)>(limits.max_outstanding_requests);
    let conn = Connection::in_span(server, dispatch, peer, local, slot, span);
    {
        use std::os::fd::AsRawFd;
        conn.socket.store(rd.as_ref().as_raw_fd(), Ordering::SeqCst);
    }
    tracing::debug!("connection from {peer}");
    start_logon_deadline(Arc::downgrade(&conn), limits.unauthenticated_timeout);

    let (async_tx, async_rx) = mpsc::unbounded_channel::<Outgoing>();
    *lock(&conn.unsolicited) = Some(async_tx);
    let sender = send::Sender::new(wr);
    let mut writer = tokio::spawn(send::writer(conn.clone(), sender.clone(), rx, async_rx));

    let memory_kib = kib(limits.max_connection_memory_bytes);
    let budget = Budget {
        slots: Arc::new(Semaphore::new(limits.max_outstanding_requests)),
        memory: Arc::new(Semaphore::new(memory_kib as usize)),
        memory_kib,
    };
    // Answers made in place, sent every few and whenever the reader would
    // wait for the client (`send`).
    let mut answers = send::Answers::new(sender.clone(), tx.clone());
    let mut ahead = read_ahead::ReadAhead::default();
    loop {
        // Whether the next frame is here already, without waiting: read
        // ahead, or in the socket now.
        let here = if ahead.is_empty() {
            match ahead.try_fill(&rd) {
                Ok(here) => here,
                Err(_) => break,
            }
        } else {
            true
        };
        if !here {
            answers.caught_up();
        }
        if !answers.is_empty() && (!here || answers.enough()) && answers.send(&conn).await.is_err()
        {
            break;
        }
        let read = tokio::select! {
            r = read_frame(&conn, &mut rd, &mut ahead, &limits, &budget, &mut answers) => r,
            _ = conn.close_notify.notified() => break,
            // Closed to make room for a newcomer (`crate::admission`).
            _ = conn.slot.evicted() => {
                tracing::debug!("{peer}: closed to admit a new connection; it had not logged on");
                break;
            }
            // The server stops: no more requests are read (`crate::drain`).
            _ = &mut draining => break,
        };
        let (frame, in_flight, allowance, unsealed) = match read {
            Ok(Some(f)) => f,
            Ok(None) => continue,
            Err(ReadEnd::Closed) => break,
            Err(ReadEnd::Refused(why)) => {
                tracing::warn!("{peer}: {why}; closing connection");
                break;
            }
        };
        if conn.is_closing() {
            break;
        }
        let messages = frames::messages(&frame, &unsealed);
        // A CLOSE, TREE_DISCONNECT or LOGOFF waits for the frames already on
        // the pool (`crate::arrivals`): on the pool too, not here.
        if frames::is_quick(messages, &limits, &conn)
            && !(conn.arrivals.any_running() && frames::ends_handles(messages, &limits))
        {
            // In place, on this task: no thread hand-over (see is_quick).
            if let Some(out) = run_frame(&conn, frame, allowance, None, unsealed) {
                answers.push(out, in_flight);
            }
            continue;
        }
        // Looked at only for a frame that goes to the pool, before it does.
        let ordered = frames::is_ordered(messages, &limits, &conn);
        let data_only = frames::data_only(messages, &limits);
        let conn2 = conn.clone();
        let tx2 = tx.clone();
        // Only frames of data commands are waited for: they never wait on
        // another client themselves, so a CLOSE behind them cannot be held
        // by something that needs the CLOSE (a CREATE waiting for a break
        // this connection's CLOSE would settle). Every frame still gets its
        // number, to wait for those before it.
        let arrival = if data_only {
            Ok(conn.arrivals.start())
        } else {
            Err(conn.arrivals.number())
        };
        let job = move || {
            let seq = match &arrival {
                Ok(a) => a.seq(),
                Err(seq) => *seq,
            };
            let out = run_frame(&conn2, frame, allowance, Some(seq), unsealed);
            // Finished: commands that end handles stop waiting for it.
            drop(arrival);
            if let Some(out) = out {
                conn2.queued_out.fetch_add(1, Ordering::SeqCst);
                if tx2.blocking_send((out, in_flight)).is_err() {
                    conn2.close();
                }
            }
        };
        if ordered {
            conn.serial.submit(Box::new(job));
        } else {
            tokio::task::spawn_blocking(job);
        }
    }
    // What was answered goes out in the close's grace, behind the rest.
    let _ = answers.send(&conn).await;
    drop(answers);
    conn.close();
    conn.socket.store(-1, Ordering::SeqCst);
    if conn.reset_requested.load(Ordering::SeqCst) {
        use std::os::fd::AsRawFd;
        delivery::reset(rd.as_ref().as_raw_fd());
    }
    // CREATEs other connections' clients send meanwhile and that these
    // opens refuse wait for them to go (`crate::teardowns`).
    let server = conn.server.clone();
    let tearing_down = server.teardowns.begin(crate::teardowns::id(&*conn));
    drop(tx);
    // The writer ends when both its queues are closed.
    lock(&conn.unsolicited).take();
    // Responses still queued go out if the client takes them soon; a client
    // that stopped reading does not keep the connection alive, and one
    // already known not to read (see `send_unsolicited`) is not waited for:
    // its opens, and the breaks others wait on, are released at once.
    let grace = if conn.not_reading.load(Ordering::SeqCst) {
        Duration::ZERO
    } else {
        CLOSE_GRACE
    };
    if timeout(grace, &mut writer).await.is_err() {
        writer.abort();
        let _ = writer.await;
    }
    // The writer has ended: a message left part written is dropped with
    // the room it held (the wait below needs that room back), and the
    // socket is closed only further down, as a stopping server needs.
    let mut wr = sender.into_write_half();
    // Wait for requests still being processed before releasing the
    // connection's opens.
    let _ = budget
        .slots
        .acquire_many(limits.max_outstanding_requests as u32)
        .await;
    let conn2 = conn.clone();
    let _ = tokio::task::spawn_blocking(move || conn2.teardown()).await;
    conn.ended.store(true, Ordering::SeqCst);
    drop(tearing_down);
    drop(live);
    // A stopping server closes the socket only once it has done what must
    // come before the client reconnects elsewhere (`crate::drain`).
    if stopping.drain.stage() != Stage::Serving {
        crate::drain::reached(&mut stage, Stage::Released).await;
    }
    if let Some(wr) = wr.as_mut() {
        let _ = wr.shutdown().await;
    }
    tracing::debug!("connection from {peer} closed");
}
