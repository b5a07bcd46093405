//! Dispatch: walks a frame's compound chain (MS-SMB2 3.3.5.2.7), checks the
//! credit window, session, signature and tree once per request from one
//! table of command specs, calls the command's handler, and assembles the
//! (signed) responses. Handlers never see signing or credits.

use std::sync::Arc;
use std::time::Instant;

use nimbus_wire::codec::Put;
use nimbus_wire::header::{
    flags, Command, Header, PROTOCOL_ID, SMB1_PROTOCOL_ID, TRANSFORM_PROTOCOL_ID,
};
use nimbus_wire::simple::encode_error;
use nimbus_wire::smb1::{smb1_negotiate_offer, Smb1Offer};
use nimbus_wire::transform::TRANSFORM_HEADER_SIZE;
use nimbus_wire::{FileId, NtStatus, HEADER_SIZE};

use crate::connection::{Connection, Outgoing};
use crate::ctx::{Ctx, HandlerResult, PreauthTarget};
use crate::frames::{decrypt, ends_handles_command, refuse, OnSent, Unsealed, RESPONSE_OVERHEAD};
use crate::handlers;
use crate::pending::PendingRequest;
use crate::security::SessionCipher;
use crate::session::{SessionState, SigningKey};
use crate::sync::lock;

type Handler = fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> HandlerResult;

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

/// Where the first response of a frame starts in the output buffer: after
/// the NBSS header and a slot for the TRANSFORM header, so that an encrypted
/// response is sealed in place and a clear one is sent from the slot's end.
const RESPONSE_START: usize = 4 + TRANSFORM_HEADER_SIZE;

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

/// The SMB2 dispatcher the connection loop hands each frame to.
pub struct Smb2;

/// Protocol violations that the spec answers with a disconnect close the
/// connection (`frames::refuse`).
impl crate::connection::Dispatch for Smb2 {
    fn process_frame(
        &self,
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

/// Fills a response's reserved 64-byte header slot.
fn write_header(resp: &Header, slot: &mut [u8]) {
    if let Ok(slot) = <&mut [u8; HEADER_SIZE]>::try_from(slot) {
        resp.write_into(slot);
    }
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
