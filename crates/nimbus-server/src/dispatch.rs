//! Dispatch: walks a frame's compound chain (MS-SMB2 3.3.5.2.7), checks the
//! credit window, session, signature and tree once per request from one
//! table of command specs, calls the command's handler, and assembles the
//! (signed) responses. Handlers never see signing or credits.

use std::sync::Arc;
use std::time::Instant;

use nimbus_wire::codec::Put;
use nimbus_wire::header::{
    chain_offsets, flags, Command, Header, PROTOCOL_ID, SMB1_PROTOCOL_ID, TRANSFORM_PROTOCOL_ID,
};
use nimbus_wire::simple::encode_error;
use nimbus_wire::smb1::{smb1_negotiate_offer, Smb1Offer};
use nimbus_wire::transform::{TransformHeader, TRANSFORM_HEADER_SIZE};
use nimbus_wire::{FileId, NtStatus, HEADER_SIZE};

use crate::connection::{Connection, Outgoing};
use crate::handlers;
use crate::limits::Limits;
use crate::pending::{Canceller, PendingRequest, Reply};
use crate::security::SessionCipher;
use crate::server::Server;
use crate::session::{Open, Session, SessionState, SigningKey, Tree};
use crate::sync::lock;

/// Handlers append their response body to `out` and return the status to
/// put in the header: SUCCESS, or a warning / MORE_PROCESSING_REQUIRED that
/// still carries a body. An `Err` becomes an SMB2 ERROR response.
pub type HandlerResult = Result<NtStatus, NtStatus>;
type Handler = fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> HandlerResult;
/// Something to do once a response is on its way to the client.
pub type OnSent = Box<dyn FnOnce() + Send>;

/// What a command needs before its handler may run (MS-SMB2 3.3.5.2.9,
/// 3.3.5.2.11): a valid session, and a tree connect.
struct Spec {
    needs_session: bool,
    needs_tree: bool,
    handler: Handler,
}

fn spec(cmd: Command) -> Spec {
    use handlers::*;
    let (needs_session, needs_tree, handler): (bool, bool, Handler) = match cmd {
        Command::Negotiate => (false, false, negotiate::handle),
        Command::SessionSetup => (false, false, session_setup::handle),
        Command::Logoff => (true, false, logoff::handle),
        Command::TreeConnect => (true, false, tree_connect::handle),
        Command::TreeDisconnect => (true, true, tree_connect::handle_disconnect),
        Command::Create => (true, true, create::handle),
        Command::Close => (true, true, close::handle),
        Command::Flush => (true, true, flush::handle),
        Command::Read => (true, true, read::handle),
        Command::Write => (true, true, write::handle),
        Command::Ioctl => (true, true, ioctl::handle),
        Command::Echo => (false, false, echo::handle),
        Command::QueryDirectory => (true, true, query_directory::handle),
        Command::QueryInfo => (true, true, query_info::handle),
        Command::SetInfo => (true, true, set_info::handle),
        Command::Lock => (true, true, lock::handle),
        Command::ChangeNotify => (true, true, change_notify::handle),
        // A lease acknowledgement names no tree (MS-SMB2 3.3.5.22.2); an
        // oplock one finds its open through the request's tree id.
        Command::OplockBreak => (true, false, oplock_break::handle),
        Command::Cancel => (false, false, echo::handle),
    };
    Spec {
        needs_session,
        needs_tree,
        handler,
    }
}

/// Everything a handler may use about the request it serves.
/// The 3.1.1 preauth hash a SESSION_SETUP exchange folds its messages
/// into (MS-SMB2 3.3.5.5): a new session's, or a binding's on this
/// connection (by session id).
pub enum PreauthTarget {
    Session(Arc<Session>),
    Binding(u64),
}

pub struct Ctx<'a> {
    pub conn: &'a Arc<Connection>,
    pub server: &'a Arc<Server>,
    pub hdr: &'a Header,
    /// The whole request message (header and body), for the preauth hash.
    pub msg: &'a [u8],
    pub session: Option<Arc<Session>>,
    pub tree: Option<Arc<Tree>>,
    /// The file the previous request of a related chain used or created.
    pub chain_file_id: Option<FileId>,
    pub related: bool,
    /// Session id to put in the response (SESSION_SETUP assigns one).
    pub response_session_id: u64,
    /// Tree id to put in the response (TREE_CONNECT assigns one).
    pub response_tree_id: Option<u32>,
    /// Sign the response with this session even if the request was not
    /// signed (the final SESSION_SETUP response).
    pub sign_with: Option<SigningKey>,
    /// After the response is built, fold it into this exchange's preauth
    /// hash (a non-final SESSION_SETUP response, MS-SMB2 3.3.5.5).
    pub preauth_session: Option<PreauthTarget>,
    /// Close the connection after this request, without a response.
    pub disconnect: bool,
    /// ErrorData for an error response (e.g. the size BUFFER_TOO_SMALL needs).
    pub error_data: Vec<u8>,
    /// Bytes this request's response may still take from the room the
    /// connection reserved for the frame (see `response_allowance`).
    pub response_room: usize,
    /// The key that verified the request's signature.
    pub signed_by: Option<SigningKey>,
    /// The session and cipher that decrypted the request's frame.
    pub sealed_by: Option<(u64, Arc<SessionCipher>)>,
    /// Set by `go_async`: the request is answered STATUS_PENDING with this
    /// AsyncId now and completes later.
    pub went_async: Option<u64>,
    /// The request `go_async` registered.
    pub interim: Option<Arc<PendingRequest>>,
    /// Run once this request's response has been written to the socket
    /// (a persistent open's record is marked answered), on the writer's
    /// runtime thread: they must not wait for the disk.
    pub on_sent: Vec<OnSent>,
    /// A request already answered STATUS_PENDING that is being run again
    /// (a CREATE retried once the breaks it waited for ended): if it must
    /// wait once more, it waits as this same request.
    pub resumed: Option<Arc<PendingRequest>>,
    /// When the handling of this request began (for its latency metric).
    pub started: std::time::Instant,
}

impl Ctx<'_> {
    /// Turns this request into one that completes later (MS-SMB2 3.3.4.2):
    /// registers it in the connection's pending table with `cancel` (made
    /// from the request, it ends the wait and completes the request with the
    /// status it is given) and returns it. The handler then returns
    /// Ok(STATUS_PENDING); dispatch sends the interim response. None when
    /// the connection already has `limits.max_pending_requests` waiting.
    pub fn go_async(
        &mut self,
        cancel: impl FnOnce(&Arc<PendingRequest>) -> Canceller,
    ) -> Option<Arc<PendingRequest>> {
        let limit = self.server.config().limits.max_pending_requests;
        if self.conn.pending.len() >= limit {
            tracing::warn!(
                "{}: {} requests already pending (limits.max_pending_requests); refused",
                self.conn.peer,
                limit
            );
            return None;
        }
        let async_id = self.conn.new_async_id();
        let request = PendingRequest::new(
            Reply {
                message_id: self.hdr.message_id,
                async_id,
                command: self.hdr.command,
                credit_charge: self.hdr.credit_charge,
                session_id: self.hdr.session_id,
                priority: self.hdr.flags & flags::PRIORITY_MASK,
                sign_with: self.signed_by.clone(),
                seal_with: self.sealed_by.clone(),
                started: self.started,
            },
            self.conn,
        );
        self.conn.pending.insert(request.clone(), cancel(&request));
        self.went_async = Some(async_id);
        self.interim = Some(request.clone());
        Some(request)
    }

    pub fn session(&self) -> Result<&Arc<Session>, NtStatus> {
        self.session.as_ref().ok_or(NtStatus::USER_SESSION_DELETED)
    }

    pub fn tree(&self) -> Result<&Arc<Tree>, NtStatus> {
        self.tree.as_ref().ok_or(NtStatus::NETWORK_NAME_DELETED)
    }

    /// A request's FileId, the "previous file" id of a related compound
    /// request (MS-SMB2 3.3.5.2.7.2) resolved to the file it stands for.
    pub fn resolve_file_id(&self, id: FileId) -> Result<FileId, NtStatus> {
        if id != FileId::RELATED {
            return Ok(id);
        }
        match (self.related, self.chain_file_id) {
            (true, Some(prev)) => Ok(prev),
            _ => Err(NtStatus::FILE_CLOSED),
        }
    }

    /// Resolves a request's FileId, including the "previous file" id of a
    /// related compound request (MS-SMB2 3.3.5.2.7.2).
    pub fn open(&mut self, id: FileId) -> Result<Arc<Open>, NtStatus> {
        let id = self.resolve_file_id(id)?;
        let open = self
            .session()?
            .open(id.volatile)
            .ok_or(NtStatus::FILE_CLOSED)?;
        // The open must belong to the tree the request runs on, related or
        // not: that tree's rules (read-only, encryption) were the ones
        // checked, so an open of another tree would slip past them.
        if open.open_id != id.persistent || open.tree_id() != self.hdr.tree_id {
            return Err(NtStatus::FILE_CLOSED);
        }
        // Written only on the first request after the CREATE: every READ
        // and WRITE must not dirty a shared cache line for it.
        if open
            .replay_eligible
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            open.replay_eligible
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        self.check_channel_sequence(&open)?;
        self.chain_file_id = Some(id);
        Ok(open)
    }
}

impl Ctx<'_> {
    /// MS-SMB2 3.3.5.2.10: a WRITE, SET_INFO or IOCTL whose ChannelSequence
    /// is older than the open's (more than 0x7FFF behind, in 16-bit
    /// arithmetic) comes from a channel the client has since failed over
    /// from, and must not overwrite what the newer channel did:
    /// FILE_NOT_AVAILABLE. A newer one, on any request, becomes the open's
    /// (as Samba does: a READ after a failover moves the open on too, and
    /// smbtorture smb2.replay.replay4 expects a stale WRITE after it to
    /// fail); an older one on a request that changes nothing is served.
    fn check_channel_sequence(&self, open: &Open) -> Result<(), NtStatus> {
        use std::sync::atomic::Ordering;
        let asked = self.hdr.channel_sequence();
        // The usual case, and every 2.x request (whose Status field is 0,
        // as the CREATE's was): the open's own sequence, nothing to check.
        if open.channel_sequence.load(Ordering::Acquire) == asked {
            return Ok(());
        }
        if !self.conn.negotiated().is_some_and(|n| n.dialect.is_smb3()) {
            return Ok(());
        }
        let modifies = matches!(
            Command::from_u16(self.hdr.command),
            Some(Command::Write | Command::SetInfo | Command::Ioctl)
        );
        let r =
            open.channel_sequence
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
                    (asked.wrapping_sub(current) <= 0x7FFF).then_some(asked)
                });
        match r {
            Err(_) if modifies => Err(NtStatus::FILE_NOT_AVAILABLE),
            _ => Ok(()),
        }
    }
}

/// Where the first response of a frame starts in the output buffer: after
/// the NBSS header and a slot for the TRANSFORM header, so that an encrypted
/// response is sealed in place and a clear one is sent from the slot's end.
const RESPONSE_START: usize = 4 + TRANSFORM_HEADER_SIZE;

/// Room reserved for any one response beyond its payload: headers, error
/// responses and the small responses of most commands.
const RESPONSE_OVERHEAD: usize = 64 * 1024;

/// How many bytes the responses to a received frame may take, reserved
/// from the connection's memory budget before the frame is processed. A
/// request that moves data is charged one credit per 64 KiB (MS-SMB2
/// 3.3.5.2.5), so its charge bounds its response; an encrypted frame
/// cannot be looked into yet and may hold one request of the largest size.
pub fn response_allowance(frame: &[u8], limits: &Limits) -> usize {
    let max_io = limits.max_io() as usize;
    if frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return max_io + RESPONSE_OVERHEAD;
    }
    let total: usize = chain_offsets(frame, limits.max_compound_requests)
        .map(|off| {
            let charge = u16::from_le_bytes([frame[off + 6], frame[off + 7]]).max(1) as usize;
            (charge * 65536).min(max_io) + RESPONSE_OVERHEAD
        })
        .sum();
    total.max(RESPONSE_OVERHEAD)
}

/// Frames larger than this always go to the blocking pool.
const QUICK_FRAME_MAX: usize = 16 * 1024;

/// READs of at most this many bytes run in place (`is_quick`): a read from
/// the page cache costs little more than the copy, 64 KiB in some 5 µs, so
/// less than the hand-over it saves; larger ones (streaming) still spread
/// over the pool's threads.
const QUICK_READ_MAX: u32 = 64 * 1024;

/// The Length of the READ request at `off` (MS-SMB2 2.2.19: after the
/// 64-byte header, StructureSize (2), Padding (1), Flags (1), Length (4)).
fn read_length(frame: &[u8], off: usize) -> Option<u32> {
    let at = off.checked_add(64 + 4)?;
    let bytes = frame.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Whether a frame may be processed on the connection's reader task rather
/// than handed to the blocking pool. Handing over costs two thread wake-ups
/// per request (to a pool thread, and back to the writer), which on small
/// metadata requests was most of the server's CPU (BENCHMARKS.md);
/// requests that only touch metadata finish in microseconds on a local
/// file system, so they run in place. So do small READs (up to
/// `QUICK_READ_MAX`): they read what the page cache holds without waiting
/// and hand only a read that must wait for the disk off the worker
/// (`handlers::read`). Other data transfer (WRITE, FLUSH, larger READs),
/// directory listings, IOCTLs and encrypted frames (which cannot be looked
/// into before decryption, and may ask for a read of any size) still go to
/// the pool, where a slow disk blocks nobody else. The cost: a metadata
/// call that is slow after all (unlinking a huge file on delete-on-close,
/// truncating one on overwrite, a hung network file system) holds one
/// runtime worker meanwhile; the other workers take over its queued tasks.
/// CREATE and LOCK on a continuously available share go to the pool:
/// they may wait for the state store's fsync (a persistent handle's record
/// is on disk before the client hears of it), and many of them waiting
/// together is what lets one commit serve them all.
///
/// A cluster node decides the files it owns from memory, so its metadata
/// commands run in place too; when one needs etcd after all, it waits off
/// the worker (`nimbus_state::blocking`). They stay in order with the
/// connection's requests queued before them (`is_ordered`): while that
/// queue holds any, they join it.
pub fn is_quick(frame: &[u8], limits: &Limits, conn: &Connection) -> bool {
    if frame.len() > QUICK_FRAME_MAX || frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return false;
    }
    chain_offsets(frame, limits.max_compound_requests).all(|off| {
        let command = u16::from_le_bytes([frame[off + 12], frame[off + 13]]);
        match Command::from_u16(command) {
            Some(Command::Read) => read_length(frame, off).is_some_and(|n| n <= QUICK_READ_MAX),
            Some(Command::Write | Command::Flush | Command::QueryDirectory | Command::Ioctl) => {
                false
            }
            Some(Command::Create | Command::Lock)
                if conn.server.offers_persistent_handles() && on_ca_share(frame, off, conn) =>
            {
                false
            }
            // CANCEL must reach what waits in the queue; ECHO keeps the
            // connection alive.
            Some(Command::Cancel | Command::Echo) => true,
            _ if conn.server.cluster.is_some() => conn.ordered_queue_is_empty(),
            _ => true,
        }
    })
}

/// Whether a frame that is not quick must run after the connection's
/// earlier such frames (`Connection`'s serial queue): on a cluster node,
/// a frame of metadata commands only, which would run in place, in order,
/// on a single node. Data transfer, listings and IOCTLs, and encrypted
/// frames (which cannot be looked into), run side by side.
pub fn is_ordered(frame: &[u8], limits: &Limits, conn: &Connection) -> bool {
    if conn.server.cluster.is_none() || frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return false;
    }
    chain_offsets(frame, limits.max_compound_requests).all(|off| !is_data_command(frame, off))
}

/// Whether the request at `off` of a chain moves data or lists (READ,
/// WRITE, FLUSH, QUERY_DIRECTORY, IOCTL): it never waits on another client.
fn is_data_command(frame: &[u8], off: usize) -> bool {
    matches!(
        Command::from_u16(u16::from_le_bytes([frame[off + 12], frame[off + 13]])),
        Some(
            Command::Read
                | Command::Write
                | Command::Flush
                | Command::QueryDirectory
                | Command::Ioctl
        )
    )
}

/// Whether the request at `off` (or, for a related request naming no tree,
/// the frame's first) is on a tree of a continuously available share.
fn on_ca_share(frame: &[u8], off: usize, conn: &Connection) -> bool {
    let ids = |at: usize| {
        let mut tree = [0u8; 4];
        let mut session = [0u8; 8];
        tree.copy_from_slice(&frame[at + 36..at + 40]);
        session.copy_from_slice(&frame[at + 40..at + 48]);
        (u32::from_le_bytes(tree), u64::from_le_bytes(session))
    };
    let ca = |(tree, session): (u32, u64)| {
        conn.session(session)
            .and_then(|s| lock(&s.trees).get(&tree).cloned())
            .map(|t| t.share.continuous_availability)
    };
    ca(ids(off)).or_else(|| ca(ids(0))).unwrap_or(false)
}

/// The session whose keys decrypted a request frame; they encrypt the
/// response.
struct Encrypted {
    session_id: u64,
    cipher: Arc<SessionCipher>,
}

/// State carried from one request of a compound chain to the next.
#[derive(Default)]
pub(crate) struct Chain {
    /// Session id of the TRANSFORM header, if the frame was encrypted.
    encrypted_for: Option<u64>,
    /// The cipher that decrypted the frame (final responses of requests
    /// that go async are sealed with it).
    sealed_by: Option<Arc<SessionCipher>>,
    session_id: u64,
    tree_id: u32,
    file_id: Option<FileId>,
    /// A failed CREATE makes the related requests after it fail the same way.
    create_error: Option<NtStatus>,
    /// The frame's first request claimed to follow another: it and the
    /// related requests after it fail INVALID_PARAMETER (MS-SMB2
    /// 3.3.5.2.7.2).
    refused: bool,
    /// The previous request had a valid session (related requests use it).
    session_ok: bool,
    /// Requests of the chain answered with an interim response.
    interims: Vec<Arc<PendingRequest>>,
    /// What the chain's handlers asked to run once the frame is sent.
    on_sent: Vec<OnSent>,
    /// The frame's arrival number, if it runs on the blocking pool
    /// (`crate::arrivals`).
    arrival: Option<u64>,
}

/// Processes one received frame; returns the frame to send back (if any).
/// Protocol violations that the spec answers with a disconnect call
/// `conn.close()` and return None. `allowance` bounds the bytes of the
/// responses (reserved by the caller, see `response_allowance`).
pub fn process_frame(
    conn: &Arc<Connection>,
    frame: &mut [u8],
    allowance: usize,
    arrival: Option<u64>,
    unsealed: Option<Unsealed>,
) -> Option<Outgoing> {
    if frame.starts_with(&SMB1_PROTOCOL_ID) {
        return smb1_negotiate(conn, frame);
    }
    let mut encrypted = None;
    let mut frame = frame;
    if let Some(Unsealed(e)) = unsealed {
        encrypted = Some(e);
        frame = &mut frame[TRANSFORM_HEADER_SIZE..];
    } else if frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        let e = decrypt(conn, frame)?;
        encrypted = Some(e);
        frame = &mut frame[TRANSFORM_HEADER_SIZE..];
    }
    if !frame.starts_with(&PROTOCOL_ID) {
        return refuse(conn, "message with unknown protocol id");
    }
    let chain = Chain {
        encrypted_for: encrypted.as_ref().map(|e| e.session_id),
        sealed_by: encrypted.as_ref().map(|e| e.cipher.clone()),
        arrival,
        ..Chain::default()
    };
    run_chain(conn, frame, chain, allowance, true)
}

/// Runs the requests of a chain (all of a frame, or what follows a request
/// that went async in the middle of it) and builds their responses.
/// `from_start`: the chain's first request is the frame's first.
fn run_chain(
    conn: &Arc<Connection>,
    frame: &mut [u8],
    mut chain: Chain,
    allowance: usize,
    from_start: bool,
) -> Option<Outgoing> {
    // A buffer sized for what the requests may return. The allowance counts
    // payload in either direction (a WRITE's credit charge covers the data
    // it sends), so the frame's own size comes off: a READ gets a big
    // buffer, a WRITE a small one.
    let payload = allowance.saturating_sub(RESPONSE_OVERHEAD + frame.len());
    let mut out = conn.pool.take(payload);
    out.resize(RESPONSE_START, 0);
    // (start of each response, session to sign it with)
    let mut responses: Vec<(usize, Option<SigningKey>)> = Vec::new();
    let mut offset = 0usize;
    let mut requests = 0usize;
    loop {
        requests += 1;
        if requests > conn.server.config().limits.max_compound_requests {
            return refuse(
                conn,
                "compound chain longer than limits.max_compound_requests",
            );
        }
        let remaining = frame.len() - offset;
        if remaining < HEADER_SIZE {
            return refuse(conn, "message shorter than an SMB2 header");
        }
        let next = u32::from_le_bytes([
            frame[offset + 20],
            frame[offset + 21],
            frame[offset + 22],
            frame[offset + 23],
        ]) as usize;
        let len = if next == 0 {
            remaining
        } else if next < HEADER_SIZE || !next.is_multiple_of(8) || next > remaining {
            return refuse(conn, "bad NextCommand in compound chain");
        } else {
            next
        };
        let msg = &mut frame[offset..offset + len];
        let Ok(hdr) = Header::parse(msg) else {
            return refuse(conn, "unparsable SMB2 header");
        };
        if hdr.flags & flags::SERVER_TO_REDIR != 0 {
            return refuse(conn, "response received from client");
        }
        if hdr.command == Command::Cancel as u16 {
            // MS-SMB2 3.3.5.16: CANCEL takes no credit and gets no response;
            // the request it names (by AsyncId, or by MessageId while not
            // yet async) completes with STATUS_CANCELLED.
            let async_id = (hdr.flags & flags::ASYNC_COMMAND != 0).then_some(hdr.async_id);
            let session_id = if hdr.is_related() {
                chain.session_id
            } else {
                hdr.session_id
            };
            if !conn.pending.cancel(session_id, async_id, hdr.message_id) {
                tracing::debug!(
                    "{}: CANCEL of message {} / async {:?}: nothing pending",
                    conn.peer,
                    hdr.message_id,
                    async_id
                );
            }
        } else {
            let consumed = lock(&conn.credits).consume(hdr.message_id, hdr.credit_charge);
            if let Err(e) = consumed {
                tracing::warn!(
                    "{}: message id {} (charge {}) outside the credit window: {e:?}; closing",
                    conn.peer,
                    hdr.message_id,
                    hdr.credit_charge
                );
                conn.close();
                return None;
            }
            // 8-byte align the previous response and link it to this one.
            if let Some((prev_start, _)) = responses.last() {
                let prev_start = *prev_start;
                out.align_to_from(RESPONSE_START, 8);
                let next_off = (out.len() - prev_start) as u32;
                out[prev_start + 20..prev_start + 24].copy_from_slice(&next_off.to_le_bytes());
            }
            let start = out.len();
            let room = allowance.saturating_sub(start - RESPONSE_START);
            let waiting = chain.interims.len();
            let first = from_start && offset == 0;
            let signer = handle_one(conn, msg, &hdr, &mut chain, &mut out, first, room);
            if conn.is_closing() {
                return None;
            }
            responses.push((start, signer));
            if next != 0 && chain.interims.len() > waiting {
                // A request in the middle of a chain must wait (a CREATE
                // held for an oplock break): the rest of the chain runs
                // once it completes, with the FileId it produced
                // (MS-SMB2 3.3.5.2.7; Windows and Samba split the chain
                // the same way).
                if let Some(request) = chain.interims.last() {
                    let rest = frame[offset + len..].to_vec();
                    request.then(continuation(conn, &chain, rest, allowance));
                }
                break;
            }
        }
        offset += len;
        if next == 0 {
            break;
        }
    }
    if responses.is_empty() {
        return None;
    }
    // The last response of a compound is padded to 8 bytes like the others
    // (as Windows and Samba send it; smbtorture smb2.compound.compound-padding).
    if requests > 1 {
        out.align_to_from(RESPONSE_START, 8);
    }
    if let (Some(session_id), Some(cipher)) = (chain.encrypted_for, chain.sealed_by.as_ref()) {
        // Encrypted responses are not also signed (MS-SMB2 3.3.4.1.4).
        if let Err(err) = cipher.seal(session_id, &mut out[4..]) {
            return refuse(conn, &format!("cannot encrypt the response: {err}"));
        }
        let len = out.len() - 4;
        out[..4].copy_from_slice(&nimbus_wire::nbss::frame_header(len));
        return Some(
            Outgoing::new(out, 0)
                .with_interims(chain.interims)
                .with_on_sent(chain.on_sent),
        );
    }
    // Sign each response over its bytes including its padding.
    for i in 0..responses.len() {
        let start = responses[i].0;
        let end = responses.get(i + 1).map(|r| r.0).unwrap_or(out.len());
        if let Some(signer) = &responses[i].1 {
            crate::security::sign(signer.as_ref(), &mut out[start..end]);
        }
    }
    let len = out.len() - RESPONSE_START;
    let start = RESPONSE_START - 4;
    out[start..RESPONSE_START].copy_from_slice(&nimbus_wire::nbss::frame_header(len));
    Some(
        Outgoing::new(out, start)
            .with_interims(chain.interims)
            .with_on_sent(chain.on_sent),
    )
}

/// What runs the rest of a chain after its request `request` completes:
/// related requests get the FileId it produced, or fail with its error.
fn continuation(
    conn: &Arc<Connection>,
    chain: &Chain,
    mut rest: Vec<u8>,
    allowance: usize,
) -> crate::pending::Continuation {
    let conn = Arc::downgrade(conn);
    let mut next = Chain {
        encrypted_for: chain.encrypted_for,
        sealed_by: chain.sealed_by.clone(),
        session_id: chain.session_id,
        tree_id: chain.tree_id,
        session_ok: chain.session_ok,
        ..Chain::default()
    };
    Box::new(move |file_id, status| {
        let Some(conn) = conn.upgrade() else {
            return;
        };
        next.file_id = file_id;
        if status.is_error() {
            next.create_error = Some(status);
        }
        if let Some(out) = run_chain(&conn, &mut rest, next, allowance, false) {
            conn.send_unsolicited(out);
        }
    })
}

/// MS-SMB2 3.3.5.2.1.1: a TRANSFORM message is decrypted with the keys of
/// the session it names. Anything wrong (too short, unknown session, no
/// keys, bad size, failed authentication) closes the connection.
fn decrypt(conn: &Connection, frame: &mut [u8]) -> Option<Encrypted> {
    let Ok(hdr) = TransformHeader::parse(frame) else {
        refuse(conn, "encrypted message shorter than its TRANSFORM header");
        return None;
    };
    let cipher = conn
        .session(hdr.session_id)
        .and_then(|s| match &*lock(&s.state) {
            SessionState::Valid(auth) => auth.cipher.clone(),
            SessionState::InProgress { .. } => None,
        });
    let Some(cipher) = cipher else {
        refuse(
            conn,
            &format!(
                "encrypted message for session {:#x}, which has no encryption keys",
                hdr.session_id
            ),
        );
        return None;
    };
    if let Err(e) = cipher.open(&hdr, frame) {
        refuse(
            conn,
            &format!(
                "encrypted message for session {:#x} not accepted: {e:?}",
                hdr.session_id
            ),
        );
        return None;
    }
    Some(Encrypted {
        session_id: hdr.session_id,
        cipher,
    })
}

/// A sealed frame opened on the connection's reader (`unseal_small`):
/// its messages follow the TRANSFORM header in plaintext.
pub struct Unsealed(Encrypted);

/// Opens a sealed frame of at most QUICK_FRAME_MAX bytes where it was
/// read: a few microseconds of AES, after which it is looked into like a
/// frame that came in the clear (run in place when quick, in order with
/// the frames around it). Unopened it went to the pool, where a request
/// could overtake the CANCEL before it: smbtorture smb2.session.expire2e
/// saw a NOTIFY's answer before the CANCELLED of the NOTIFY it had
/// cancelled first. Ok(None): not sealed, or big (opened on the pool);
/// Err: refused, the connection closes.
pub fn unseal_small(conn: &Connection, frame: &mut [u8]) -> Result<Option<Unsealed>, ()> {
    if frame.len() > QUICK_FRAME_MAX || !frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return Ok(None);
    }
    decrypt(conn, frame).map(|e| Some(Unsealed(e))).ok_or(())
}

/// The SMB2 messages of a frame: after its TRANSFORM header once opened.
pub fn messages<'a>(frame: &'a [u8], unsealed: &Option<Unsealed>) -> &'a [u8] {
    match unsealed {
        Some(_) => &frame[TRANSFORM_HEADER_SIZE..],
        None => frame,
    }
}

/// Fills a response's reserved 64-byte header slot.
fn write_header(resp: &Header, slot: &mut [u8]) {
    if let Ok(slot) = <&mut [u8; HEADER_SIZE]>::try_from(slot) {
        resp.write_into(slot);
    }
}

fn refuse(conn: &Connection, why: &str) -> Option<Outgoing> {
    tracing::warn!("{}: {why}; closing connection", conn.peer);
    conn.close();
    None
}

/// Handles one request of a chain and appends its response to `out`.
/// Returns the key that signs the response, if it is to be signed.
fn handle_one(
    conn: &Arc<Connection>,
    msg: &mut [u8],
    hdr: &Header,
    chain: &mut Chain,
    out: &mut Vec<u8>,
    first: bool,
    response_room: usize,
) -> Option<SigningKey> {
    let started = std::time::Instant::now();
    let start = out.len();
    out.resize(start + HEADER_SIZE, 0);
    let body_start = out.len();
    let related = hdr.is_related() && !first;
    let (session_id, tree_id) = if related {
        (chain.session_id, chain.tree_id)
    } else {
        (hdr.session_id, hdr.tree_id)
    };
    let effective = Header {
        session_id,
        tree_id,
        ..hdr.clone()
    };
    let mut ctx = Ctx {
        conn,
        server: &conn.server,
        hdr: &effective,
        msg: &[],
        session: None,
        tree: None,
        chain_file_id: if related { chain.file_id } else { None },
        related,
        response_session_id: session_id,
        response_tree_id: None,
        sign_with: None,
        preauth_session: None,
        disconnect: false,
        error_data: Vec::new(),
        response_room: response_room.saturating_sub(HEADER_SIZE),
        signed_by: None,
        sealed_by: chain.encrypted_for.zip(chain.sealed_by.clone()),
        went_async: None,
        interim: None,
        resumed: None,
        on_sent: Vec::new(),
        started,
    };
    let mut sign_session: Option<SigningKey> = None;
    let result = check_and_run(
        &mut ctx,
        msg,
        hdr,
        chain,
        first,
        related,
        session_id,
        tree_id,
        &mut sign_session,
        out,
    );
    if ctx.disconnect {
        conn.close();
        return None;
    }
    if hdr.command == Command::Create as u16 {
        chain.create_error = result.err();
    }
    chain.session_ok = ctx.session.as_ref().is_some_and(|s| s.is_valid());
    let status = match result {
        Ok(status) => status,
        Err(status) => {
            out.truncate(body_start);
            encode_error(out, &ctx.error_data);
            if status != NtStatus::OBJECT_NAME_NOT_FOUND && status != NtStatus::NO_MORE_FILES {
                tracing::debug!("{}: command {:#x} failed: {status}", conn.peer, hdr.command);
            }
            status
        }
    };
    // A request that went async is answered now with an interim
    // STATUS_PENDING (an ERROR body, the AsyncId, the credits it earns); its
    // final response follows on its own (MS-SMB2 3.3.4.2).
    let async_id = ctx.went_async.filter(|_| status == NtStatus::PENDING);
    if let (Some(_), Some(request)) = (async_id, ctx.interim.take()) {
        chain.interims.push(request);
    }
    // A CANCEL that came while this request ran (on the blocking pool)
    // ends it now that it waits; its final response follows the interim.
    if let Some(id) = async_id {
        if conn.pending.cancelled_early(hdr.session_id, hdr.message_id) {
            conn.pending
                .cancel(hdr.session_id, Some(id), hdr.message_id);
        }
    }
    chain.on_sent.append(&mut ctx.on_sent);
    if async_id.is_some() {
        out.truncate(body_start);
        encode_error(out, &[]);
    } else {
        crate::metrics::request_answered(hdr.command, status, started);
    }
    let granted = lock(&conn.credits).grant(hdr.credits);
    let resp = Header {
        credit_charge: hdr.credit_charge,
        status,
        command: hdr.command,
        credits: granted,
        flags: flags::SERVER_TO_REDIR
            | (hdr.flags & (flags::RELATED_OPERATIONS | flags::PRIORITY_MASK))
            | if async_id.is_some() {
                flags::ASYNC_COMMAND
            } else {
                0
            },
        next_command: 0,
        message_id: hdr.message_id,
        async_id: async_id.unwrap_or(0),
        tree_id: ctx.response_tree_id.unwrap_or(hdr.tree_id),
        // The request's own value (see the field).
        reserved: hdr.reserved,
        session_id: ctx.response_session_id,
        signature: [0; 16],
    };
    write_header(&resp, &mut out[start..body_start]);
    let keyless_error = status == NtStatus::USER_SESSION_DELETED
        || (status == NtStatus::INVALID_PARAMETER && related && sign_session.is_none())
        || (hdr.command == Command::SessionSetup as u16
            && sign_session.is_none()
            && matches!(
                status,
                NtStatus::ACCESS_DENIED
                    | NtStatus::NOT_SUPPORTED
                    | NtStatus::REQUEST_OUT_OF_SEQUENCE
            ));
    if keyless_error && hdr.is_signed() && chain.encrypted_for.is_none() {
        // No session key is at hand to sign with (the session is gone, or a
        // related request follows one without a session). The message stays
        // unsigned, but it carries the SIGNED flag: Samba's client, which
        // signs, refuses any response without that flag as ACCESS_DENIED
        // before it looks at the status, and skips verification for exactly
        // these statuses (smbXcli_base.c). Without the flag smbtorture
        // smb2.connect fails (logoff of a deleted session reads as
        // ACCESS_DENIED; a binding signed with the wrong key, smbtorture
        // smb2.session.bind_negative_*, would cost the client its
        // connection). The flag protects nothing here, and the client
        // knows it: it never verifies these.
        let fl = resp.flags | flags::SIGNED;
        out[start + 16..start + 20].copy_from_slice(&fl.to_le_bytes());
    }
    chain.session_id = ctx.response_session_id;
    chain.tree_id = ctx.response_tree_id.unwrap_or(tree_id);
    chain.file_id = ctx.chain_file_id;
    // 3.1.1 preauth hash: negotiate response into the connection's hash,
    // non-final session setup responses into the session's.
    if hdr.command == Command::Negotiate as u16 && status == NtStatus::SUCCESS {
        if let Some(n) = conn.negotiated() {
            if n.dialect == nimbus_wire::negotiate::Dialect::Smb311 {
                let mut p = lock(&conn.preauth);
                *p = conn.server.provider.sha512(&[&p[..], &out[start..]]);
            }
        }
    }
    if let Some(target) = ctx.preauth_session.take() {
        if status == NtStatus::MORE_PROCESSING_REQUIRED {
            let response = &out[start..];
            let fold = |preauth: &mut [u8; 64]| {
                *preauth = conn.server.provider.sha512(&[&preauth[..], response]);
            };
            match target {
                PreauthTarget::Session(session) => {
                    if let SessionState::InProgress { preauth, .. } = &mut *lock(&session.state) {
                        fold(preauth);
                    }
                }
                PreauthTarget::Binding(id) => {
                    // The client hashes the response it receives, which
                    // (unlike a new logon's) is signed with the session's
                    // key: hash it as it will go out.
                    let mut signed = response.to_vec();
                    if let Some(key) = &sign_session {
                        crate::security::sign(key.as_ref(), &mut signed);
                    }
                    if let Some(b) = lock(&conn.bindings).get_mut(&id) {
                        b.preauth = conn.server.provider.sha512(&[&b.preauth[..], &signed]);
                    }
                }
            }
        }
    }
    ctx.sign_with.take().or(sign_session)
}

/// Whether a SESSION_SETUP request asks to bind its session to this
/// connection (SMB2_SESSION_FLAG_BINDING, MS-SMB2 2.2.5).
fn is_binding(msg: &[u8]) -> bool {
    msg.get(HEADER_SIZE + 2)
        .is_some_and(|f| f & nimbus_wire::session_setup::FLAG_BINDING != 0)
}

/// MS-SMB2 3.3.5.2.4 for a binding request, whose session is not (yet) on
/// this connection: it is found in the GlobalSessionTable and its signature
/// checked with Session.SigningKey. Every answer before the binding ends
/// (errors, MORE_PROCESSING legs) is signed with that key too (3.3.4.1.1).
/// A binding request is never encrypted: the connection has no keys for
/// the session yet; the session's encryption rule applies once bound.
fn binding_session(
    ctx: &mut Ctx<'_>,
    msg: &mut [u8],
    hdr: &Header,
    session_id: u64,
    encrypted: bool,
    sign_session: &mut Option<SigningKey>,
) -> Result<(), NtStatus> {
    // A refused leg ends a binding exchange under way on this connection.
    let refuse = |status: NtStatus| {
        lock(&ctx.conn.bindings).remove(&session_id);
        status
    };
    let session = ctx
        .server
        .sessions
        .find(session_id)
        .ok_or_else(|| refuse(NtStatus::USER_SESSION_DELETED))?;
    if let (Some(key), true, false) = (session.signing_key(), hdr.is_signed(), encrypted) {
        if !crate::security::verify(key.as_ref(), msg) {
            tracing::warn!(
                "{}: bad signature on a binding to session {session_id:#x}; refused",
                ctx.conn.peer
            );
            return Err(refuse(NtStatus::ACCESS_DENIED));
        }
        *sign_session = Some(key.clone());
        ctx.signed_by = Some(key);
    }
    ctx.session = Some(session);
    Ok(())
}

/// The checks of MS-SMB2 3.3.5.2 that every request goes through, then the
/// command's handler.
#[allow(clippy::too_many_arguments)]
fn check_and_run<'a>(
    ctx: &mut Ctx<'a>,
    msg: &'a mut [u8],
    hdr: &Header,
    chain: &mut Chain,
    first: bool,
    related: bool,
    session_id: u64,
    tree_id: u32,
    sign_session: &mut Option<SigningKey>,
    out: &mut Vec<u8>,
) -> HandlerResult {
    let conn = ctx.conn;
    let cmd = Command::from_u16(hdr.command);
    let negotiated = conn.negotiated();
    if cmd != Some(Command::Negotiate) && negotiated.is_none() {
        tracing::warn!(
            "{}: command {:#x} before NEGOTIATE; closing",
            conn.peer,
            hdr.command
        );
        ctx.disconnect = true;
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if related && !chain.session_ok {
        // The request this one relates to had no usable session.
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // Session lookup and signature check first (MS-SMB2 3.3.5.2.4,
    // 3.3.5.2.9), so that even an error about the request itself goes back
    // signed to a client that signs.
    let encrypted = chain.encrypted_for.is_some();
    if encrypted && !related && chain.encrypted_for != Some(session_id) {
        // A request may only use the session whose key encrypted it.
        tracing::warn!(
            "{}: request for session {session_id:#x} inside a message encrypted for another; refused",
            conn.peer
        );
        return Err(NtStatus::ACCESS_DENIED);
    }
    let channel = if cmd != Some(Command::Negotiate) && session_id != 0 {
        match conn.channel(session_id) {
            Some(channel) => Some(channel),
            None if cmd == Some(Command::SessionSetup) && is_binding(msg) => {
                binding_session(ctx, msg, hdr, session_id, encrypted, sign_session)?;
                None
            }
            None => return Err(NtStatus::USER_SESSION_DELETED),
        }
    } else {
        None
    };
    // Lines logged while this request runs name its session and user.
    let mut _in_session = None;
    if let Some(channel) = channel {
        let session = channel.session;
        let state = lock(&session.state);
        match &*state {
            SessionState::Valid(auth) => {
                // This channel's key (MS-SMB2 3.3.5.2.4: Channel.SigningKey
                // on 3.x; the session's own on its first connection).
                let key = channel.signer.as_ref().or(auth.signer.as_ref());
                // Encrypted requests are not signed: the AEAD tag already
                // authenticated them (MS-SMB2 3.3.5.2.4).
                if let (Some(signer), false) = (key, encrypted) {
                    if hdr.is_signed() {
                        if !crate::security::verify(signer.as_ref(), msg) {
                            tracing::warn!(
                                "{}: bad signature on command {:#x} (session {:#x}, user {}); refused",
                                conn.peer,
                                hdr.command,
                                session_id,
                                auth.user
                            );
                            return Err(NtStatus::ACCESS_DENIED);
                        }
                        *sign_session = Some(signer.clone());
                        ctx.signed_by = Some(signer.clone());
                    } else if auth.signing_required {
                        tracing::warn!(
                            "{}: unsigned command {:#x} on a session that requires signing; refused",
                            conn.peer,
                            hdr.command
                        );
                        return Err(NtStatus::ACCESS_DENIED);
                    }
                }
                // MS-SMB2 3.3.5.2.9: once the logon's ticket has ended, the
                // client must re-authenticate; what only lets go of state
                // still runs, as on Windows (smbtorture
                // smb2.session.expire2s: an unlock succeeds, a new lock is
                // EXPIRED). The answer is signed: the keys stay good.
                if auth.expires.is_some_and(|t| Instant::now() >= t) && !lets_go(cmd, msg) {
                    return Err(NtStatus::NETWORK_SESSION_EXPIRED);
                }
                if auth.encrypt_data && !encrypted {
                    // MS-SMB2 3.3.5.2.9: Session.EncryptData and
                    // RejectUnencryptedAccess.
                    tracing::debug!(
                        "{}: unencrypted command {:#x} on a session that requires encryption; refused",
                        conn.peer,
                        hdr.command
                    );
                    return Err(NtStatus::ACCESS_DENIED);
                }
                drop(state);
                _in_session = Some(conn.session_span(&session).entered());
                session.touch();
                ctx.session = Some(session);
            }
            SessionState::InProgress { .. } => {
                drop(state);
                if cmd != Some(Command::SessionSetup) {
                    return Err(NtStatus::USER_SESSION_DELETED);
                }
                ctx.session = Some(session);
            }
        }
    }
    let cmd = cmd.ok_or(NtStatus::INVALID_PARAMETER)?;
    if hdr.is_related() && first {
        chain.refused = true;
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if related && chain.refused {
        // Windows fails the related requests after it too, whatever they
        // name (smbtorture smb2.compound.related9: a CLOSE and a SET_INFO
        // of an open handle are not run); an unrelated one in the same
        // frame is run (compound.invalid1).
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if related {
        if let Some(err) = chain.create_error {
            return Err(err);
        }
    }
    let spec = spec(cmd);
    if ctx.session.is_none() && spec.needs_session {
        return Err(NtStatus::USER_SESSION_DELETED);
    }
    if spec.needs_tree {
        let session = ctx.session()?;
        let tree = lock(&session.trees).get(&tree_id).cloned();
        // A share a reload took away: its tree connects are going, and
        // one a request still names is as gone (MS-SMB2 3.3.5.2.11).
        let tree = tree
            .filter(|t| !t.share.is_removed())
            .ok_or(NtStatus::NETWORK_NAME_DELETED)?;
        if tree.encrypt_data && !encrypted {
            // MS-SMB2 3.3.5.2.11: the share requires encrypted requests.
            tracing::debug!(
                "{}: unencrypted command {:#x} on share \"{}\", which requires encryption; refused",
                conn.peer,
                hdr.command,
                tree.share.name
            );
            return Err(NtStatus::ACCESS_DENIED);
        }
        ctx.tree = Some(tree);
    }
    ctx.msg = msg;
    let body = &msg[HEADER_SIZE..];
    if ends_handles_command(Some(cmd)) {
        if let Some(seq) = chain.arrival {
            conn.arrivals.wait_for_earlier(seq);
        }
    }
    (spec.handler)(ctx, body, out)
}

fn ends_handles_command(cmd: Option<Command>) -> bool {
    matches!(
        cmd,
        Some(Command::Close | Command::TreeDisconnect | Command::Logoff)
    )
}

/// Whether a plaintext frame holds only data commands (READ, WRITE, FLUSH,
/// QUERY_DIRECTORY, IOCTL), which never wait on another client: the
/// frames a CLOSE behind them waits for (`crate::arrivals`).
pub fn data_only(frame: &[u8], limits: &Limits) -> bool {
    !frame.starts_with(&TRANSFORM_PROTOCOL_ID)
        && chain_offsets(frame, limits.max_compound_requests).all(|off| is_data_command(frame, off))
}

/// Whether a frame holds a CLOSE, TREE_DISCONNECT or LOGOFF, which must
/// not overtake the connection's frames already on the blocking pool
/// (`crate::arrivals`). An encrypted frame cannot be looked into: it runs
/// on the pool, and waits there if it holds one.
pub fn ends_handles(frame: &[u8], limits: &Limits) -> bool {
    !frame.starts_with(&TRANSFORM_PROTOCOL_ID)
        && chain_offsets(frame, limits.max_compound_requests).any(|off| {
            ends_handles_command(Command::from_u16(u16::from_le_bytes([
                frame[off + 12],
                frame[off + 13],
            ])))
        })
}

/// The commands an expired session still serves: re-authentication,
/// LOGOFF, CLOSE, a LOCK that only unlocks, ECHO and CANCEL.
fn lets_go(cmd: Option<Command>, msg: &[u8]) -> bool {
    use nimbus_wire::lock::{lock_flags, LockRequest};
    match cmd {
        Some(
            Command::SessionSetup
            | Command::Logoff
            | Command::Close
            | Command::Echo
            | Command::Cancel,
        ) => true,
        Some(Command::Lock) => LockRequest::parse(&msg[HEADER_SIZE..])
            .is_ok_and(|r| r.locks.iter().all(|l| l.flags & lock_flags::UNLOCK != 0)),
        _ => false,
    }
}

/// MS-SMB2 3.3.5.3.1: an SMB1 negotiate that offers SMB2 gets an SMB2
/// NEGOTIATE response; SMB1 itself is never served.
fn smb1_negotiate(conn: &Arc<Connection>, frame: &[u8]) -> Option<Outgoing> {
    let offer = smb1_negotiate_offer(frame);
    if offer == Smb1Offer::None || conn.negotiated().is_some() {
        return refuse(conn, "SMB1 request (SMB1 is not served)");
    }
    if lock(&conn.credits).consume(0, 1).is_err() {
        return refuse(conn, "SMB1 negotiate after other requests");
    }
    let mut out = vec![0u8; 4 + HEADER_SIZE];
    let status = handlers::negotiate::smb1_upgrade(conn, offer == Smb1Offer::Wildcard, &mut out);
    let granted = lock(&conn.credits).grant(1);
    let resp = Header {
        credit_charge: 0,
        status,
        command: Command::Negotiate as u16,
        credits: granted,
        flags: flags::SERVER_TO_REDIR,
        next_command: 0,
        message_id: 0,
        async_id: 0,
        tree_id: 0,
        reserved: nimbus_wire::header::DEFAULT_RESERVED,
        session_id: 0,
        signature: [0; 16],
    };
    write_header(&resp, &mut out[4..4 + HEADER_SIZE]);
    let len = out.len() - 4;
    out[..4].copy_from_slice(&nimbus_wire::nbss::frame_header(len));
    Some(Outgoing::new(out, 0))
}
