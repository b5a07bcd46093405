//! What a handler is given: the request it serves (`Ctx`: its header,
//! connection, session and tree, the file a related chain carries), and
//! what it may do besides answering, such as going async (MS-SMB2 3.3.4.2).
//! Built per request by `crate::dispatch`.

use std::sync::Arc;

use nimbus_wire::header::{flags, Command, Header};
use nimbus_wire::{FileId, NtStatus};

use crate::connection::Connection;
use crate::frames::OnSent;
use crate::pending::{Canceller, PendingRequest, Reply};
use crate::security::SessionCipher;
use crate::server::Server;
use crate::session::{Open, Session, SigningKey, Tree};

/// Handlers append their response body to `out` and return the status to
/// put in the header: SUCCESS, or a warning / MORE_PROCESSING_REQUIRED that
/// still carries a body. An `Err` becomes an SMB2 ERROR response.
pub type HandlerResult = Result<NtStatus, NtStatus>;

/// The 3.1.1 preauth hash a SESSION_SETUP exchange folds its messages
/// into (MS-SMB2 3.3.5.5): a new session's, or a binding's on this
/// connection (by session id).
pub enum PreauthTarget {
    Session(Arc<Session>),
    Binding(u64),
}

/// Everything a handler may use about the request it serves.
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
