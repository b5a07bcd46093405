//! Requests that complete later (MS-SMB2 3.3.4.2 "Sending an Interim
//! Response for an Asynchronous Operation", 3.3.5.16 CANCEL). A handler that
//! must wait (a blocking byte-range lock; later change notify and CREATEs
//! held for a break) turns its request into a `PendingRequest`: dispatch
//! answers at once with an interim STATUS_PENDING carrying an AsyncId, the
//! request's slot and memory go back to the connection, and whoever ends the
//! wait calls `complete`, which builds the final response (signed or sealed
//! as the request was) and queues it on the connection's writer. Every
//! pending request sits in its connection's table until then, so CANCEL,
//! closing its handle, logoff and disconnect can find and end it; nothing
//! waits on a runtime thread.
//!
//! A request sees its connection only as a `ResponseChannel`, so that the
//! services whose waits end requests (locks, notify, durable handles,
//! oplocks) reach neither the socket writer nor the connection's state.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use nimbus_wire::header::{flags, Header};
use nimbus_wire::simple::encode_error;
use nimbus_wire::transform::TRANSFORM_HEADER_SIZE;
use nimbus_wire::{FileId, NtStatus, HEADER_SIZE};

use crate::security::{SessionCipher, SigningKey};
use crate::sync::lock;

/// The connection a pending request answers on, as the request sees it.
/// The connection layer implements it.
pub trait ResponseChannel: Send + Sync {
    /// Queues a framed message, `frame.buf[frame.start..]`, on the writer.
    fn send_frame(&self, frame: Frame);
    /// `send_frame` for a break that awaits acknowledgement, on a channel
    /// of a session that has others: a connection that can tell whether
    /// the client's TCP acknowledged the bytes closes itself as a failed
    /// channel when it has not within six retransmission timeouts, so that
    /// the break goes out again on another channel (MS-SMB2 3.3.4.6-7;
    /// `crate::oplocks::redeliver_breaks`). Others just send it.
    fn send_frame_watched(&self, frame: Frame) {
        self.send_frame(frame)
    }
    /// Takes an ended request out of the connection's pending table.
    fn forget_pending(&self, async_id: u64);
    /// Whether the connection is going: what it would send is dropped.
    fn is_closing(&self) -> bool;
    /// Closes the connection, which cannot be sent a message it needs:
    /// one that could not be sealed.
    fn close_unsendable(&self);
    /// The client's address, for the log.
    fn peer(&self) -> std::net::SocketAddr;
}

/// A message framed for the wire: its NetBIOS length at `start`, the bytes
/// before it unused (room left for a transform header).
pub struct Frame {
    pub buf: Vec<u8>,
    pub start: usize,
}

/// What the final response of a request needs from the request.
pub struct Reply {
    pub message_id: u64,
    pub async_id: u64,
    pub command: u16,
    pub credit_charge: u16,
    pub session_id: u64,
    /// Priority bits of the request, echoed.
    pub priority: u32,
    /// Sign the final response with this key, the one that verified the
    /// request (the request was signed).
    pub sign_with: Option<SigningKey>,
    /// Seal it for this session instead (the request came encrypted).
    pub seal_with: Option<(u64, Arc<SessionCipher>)>,
    /// When the handling of the request began.
    pub started: std::time::Instant,
}

/// A request answered STATUS_PENDING whose final response is still owed.
pub struct PendingRequest {
    reply: Reply,
    conn: Weak<dyn ResponseChannel>,
    done: AtomicBool,
    /// A CREATE the client can replay (a durable v2 CREATE with a
    /// CreateGuid): it goes on if its channel is lost and its session
    /// lives on another (`Connection::teardown`).
    replayable: AtomicBool,
    /// The final response waits here until the interim response has been
    /// written: a request can finish (a break acknowledged at once) while
    /// its interim is still on its way to the writer.
    gate: std::sync::Mutex<Gate>,
}

#[derive(Default)]
struct Gate {
    interim_written: bool,
    held: Option<Frame>,
    /// The rest of a compound chain, run after the final response.
    then: Option<Continuation>,
    /// How the request ended, for `then`: the FileId a CREATE produced.
    outcome: Option<(Option<FileId>, NtStatus)>,
}

/// Runs the requests of a compound chain that followed a request which
/// went async, once it completes: given the FileId it produced (if any)
/// and its status.
pub type Continuation = Box<dyn FnOnce(Option<FileId>, NtStatus) + Send>;

/// How a pending request is ended from outside its waiter (CANCEL, close,
/// logoff, disconnect): the owner of the wait drops it, then completes the
/// request with the status given.
pub type Canceller = Box<dyn Fn(NtStatus) + Send + Sync>;

/// A connection's pending requests by AsyncId.
#[derive(Default)]
pub struct PendingTable {
    entries: std::sync::Mutex<HashMap<u64, Entry>>,
    /// CANCELs by MessageId that found nothing yet: (session, message).
    /// The request may still be running on the blocking pool (a request
    /// waiting on the disk or on etcd, an encrypted frame): when it goes
    /// async, it is cancelled at once. MessageIds are never reused on a
    /// connection; the oldest are forgotten past `EARLY_CANCELS`.
    early: std::sync::Mutex<std::collections::VecDeque<(u64, u64)>>,
}

/// How many unmatched CANCELs a connection remembers.
const EARLY_CANCELS: usize = 64;

struct Entry {
    request: Arc<PendingRequest>,
    cancel: Arc<dyn Fn(NtStatus) + Send + Sync>,
}

impl PendingTable {
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.entries).is_empty()
    }

    pub fn insert(&self, request: Arc<PendingRequest>, cancel: Canceller) {
        lock(&self.entries).insert(
            request.reply.async_id,
            Entry {
                request,
                cancel: Arc::from(cancel),
            },
        );
    }

    pub fn remove(&self, async_id: u64) {
        lock(&self.entries).remove(&async_id);
    }

    /// Whether a CANCEL by MessageId came for this request before it went
    /// async (it is then cancelled as soon as its interim is on its way).
    pub fn cancelled_early(&self, session_id: u64, message_id: u64) -> bool {
        let mut early = lock(&self.early);
        match early.iter().position(|e| *e == (session_id, message_id)) {
            Some(i) => {
                early.remove(i);
                true
            }
            None => false,
        }
    }

    /// CANCEL of an async request (by AsyncId), or of one still known by
    /// its MessageId (MS-SMB2 3.3.5.16); only requests of `session_id`.
    /// Whether one was found; a CANCEL by MessageId that finds nothing is
    /// remembered for a request still running (`cancelled_early`).
    pub fn cancel(&self, session_id: u64, async_id: Option<u64>, message_id: u64) -> bool {
        let found = {
            let entries = lock(&self.entries);
            entries
                .values()
                .find(|e| {
                    e.request.reply.session_id == session_id
                        && match async_id {
                            Some(id) => e.request.reply.async_id == id,
                            None => e.request.reply.message_id == message_id,
                        }
                })
                .map(|e| e.cancel.clone())
        };
        match found {
            Some(cancel) => {
                cancel(NtStatus::CANCELLED);
                true
            }
            None => {
                if async_id.is_none() {
                    let mut early = lock(&self.early);
                    if early.len() >= EARLY_CANCELS {
                        early.pop_front();
                    }
                    early.push_back((session_id, message_id));
                }
                false
            }
        }
    }

    /// Ends every pending request that `matches` (a session logging off, a
    /// connection going) with `status`.
    pub fn end_all(&self, status: NtStatus, matches: impl Fn(&PendingRequest) -> bool) {
        let cancels: Vec<_> = lock(&self.entries)
            .values()
            .filter(|e| matches(&e.request))
            .map(|e| e.cancel.clone())
            .collect();
        for cancel in cancels {
            cancel(status);
        }
    }
}

impl PendingRequest {
    pub fn new<C: ResponseChannel + 'static>(reply: Reply, conn: &Arc<C>) -> Arc<PendingRequest> {
        let conn: Weak<dyn ResponseChannel> = Arc::downgrade(conn) as Weak<dyn ResponseChannel>;
        Arc::new(PendingRequest {
            reply,
            conn,
            done: AtomicBool::new(false),
            replayable: AtomicBool::new(false),
            gate: std::sync::Mutex::new(Gate::default()),
        })
    }

    pub fn async_id(&self) -> u64 {
        self.reply.async_id
    }

    /// The writer has sent the interim response: a final response held
    /// back goes out now, and later ones at once.
    pub fn interim_written(&self) {
        let (held, then) = {
            let mut gate = lock(&self.gate);
            gate.interim_written = true;
            let held = gate.held.take();
            let then = if held.is_some() {
                gate.then.take().zip(gate.outcome.take())
            } else {
                None
            };
            (held, then)
        };
        if let (Some(out), Some(conn)) = (held, self.conn.upgrade()) {
            conn.send_frame(out);
        }
        if let Some((then, (file_id, status))) = then {
            run_later(then, file_id, status);
        }
    }

    /// Sets what runs after the final response (the rest of a chain).
    pub fn then(&self, then: Continuation) {
        lock(&self.gate).then = Some(then);
    }

    /// Records the FileId the request produced, for the rest of its chain.
    pub fn set_file_id(&self, file_id: FileId) {
        let mut gate = lock(&self.gate);
        gate.outcome = Some((Some(file_id), NtStatus::SUCCESS));
    }

    /// Whether the final response went out (or the request was ended).
    pub fn started(&self) -> std::time::Instant {
        self.reply.started
    }

    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    pub fn session_id(&self) -> u64 {
        self.reply.session_id
    }

    pub fn mark_replayable(&self) {
        self.replayable.store(true, Ordering::Relaxed);
    }

    pub fn is_replayable(&self) -> bool {
        self.replayable.load(Ordering::Relaxed)
    }

    /// Sends the final response: `status` and, for a success, the body
    /// `body` writes (an error gets the SMB2 ERROR body). Only the first
    /// call sends; it returns whether it was this one.
    pub fn complete(&self, status: NtStatus, body: impl FnOnce(&mut Vec<u8>)) -> bool {
        if self.done.swap(true, Ordering::SeqCst) {
            return false;
        }
        crate::metrics::request_answered(self.reply.command, status, self.reply.started);
        let Some(conn) = self.conn.upgrade() else {
            return true;
        };
        conn.forget_pending(self.reply.async_id);
        if conn.is_closing() {
            return true;
        }
        let r = &self.reply;
        let header = Header {
            credit_charge: r.credit_charge,
            status,
            command: r.command,
            // The credits for this request went out with the interim
            // response (MS-SMB2 3.3.4.2).
            credits: 0,
            flags: flags::SERVER_TO_REDIR | flags::ASYNC_COMMAND | r.priority,
            next_command: 0,
            message_id: r.message_id,
            async_id: r.async_id,
            tree_id: 0,
            reserved: 0,
            session_id: r.session_id,
            signature: [0; 16],
        };
        let error = status.is_error();
        let Some(out) = build_message(
            conn.as_ref(),
            &header,
            |out| {
                if error {
                    encode_error(out, &[]);
                } else {
                    body(out);
                }
            },
            r.sign_with.as_ref(),
            r.seal_with.as_ref(),
        ) else {
            return true;
        };
        let mut gate = lock(&self.gate);
        let file_id = gate.outcome.take().and_then(|(id, _)| id);
        let file_id = if status.is_error() { None } else { file_id };
        if gate.interim_written {
            let then = gate.then.take();
            drop(gate);
            conn.send_frame(out);
            if let Some(then) = then {
                run_later(then, file_id, status);
            }
        } else {
            gate.held = Some(out);
            gate.outcome = Some((file_id, status));
        }
        true
    }
}

/// Runs the rest of a chain on the runtime, not inside whatever completed
/// the request (which may hold a service's state).
fn run_later(then: Continuation, file_id: Option<FileId>, status: NtStatus) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move { then(file_id, status) });
        }
        Err(_) => then(file_id, status),
    }
}

/// Frames one message the server sends outside the reader's flow (the
/// final response of an async request, an oplock or lease break): header,
/// body, then signed with `sign_with` or sealed with `seal_with`'s
/// cipher, and queued on the connection's writer.
pub fn send_message(
    conn: &dyn ResponseChannel,
    header: &Header,
    body: impl FnOnce(&mut Vec<u8>),
    sign_with: Option<&SigningKey>,
    seal_with: Option<&(u64, Arc<SessionCipher>)>,
) {
    if let Some(out) = build_message(conn, header, body, sign_with, seal_with) {
        conn.send_frame(out);
    }
}

/// The framed message `send_message` sends; None when it cannot be sealed
/// (the connection is then closed).
pub(crate) fn build_message(
    conn: &dyn ResponseChannel,
    header: &Header,
    body: impl FnOnce(&mut Vec<u8>),
    sign_with: Option<&SigningKey>,
    seal_with: Option<&(u64, Arc<SessionCipher>)>,
) -> Option<Frame> {
    let start = 4 + TRANSFORM_HEADER_SIZE;
    let mut out = vec![0u8; start + HEADER_SIZE];
    body(&mut out);
    if let Ok(slot) = <&mut [u8; HEADER_SIZE]>::try_from(&mut out[start..start + HEADER_SIZE]) {
        header.write_into(slot);
    }
    let outgoing = if let Some((session_id, cipher)) = seal_with {
        if cipher.seal(*session_id, &mut out[4..]).is_err() {
            conn.close_unsendable();
            return None;
        }
        let len = out.len() - 4;
        out[..4].copy_from_slice(&nimbus_wire::nbss::frame_header(len));
        Frame { buf: out, start: 0 }
    } else {
        if let Some(signer) = sign_with {
            crate::security::sign(signer.as_ref(), &mut out[start..]);
        }
        let len = out.len() - start;
        out[start - 4..start].copy_from_slice(&nimbus_wire::nbss::frame_header(len));
        Frame {
            buf: out,
            start: start - 4,
        }
    };
    Some(outgoing)
}
