//! MS-SMB2 3.3.5.5 with SMB2_SESSION_FLAG_BINDING: multichannel. A client
//! that logged on over one connection binds further connections to the
//! same session; requests of the session may then arrive on any of them,
//! and the loss of one connection leaves the session, its trees and its
//! opens to the others (3.3.7.1).
//!
//! The binding is a new authentication of the session's user on the new
//! connection. Its exchange gives the channel its own signing key
//! (Channel.SigningKey, derived from the new exchange's key and, on 3.1.1,
//! this connection's preauth hash); encryption keys stay the session's.
//! Dispatch has already found the session in the GlobalSessionTable and
//! checked the request's signature with Session.SigningKey.
//!
//! The checks run in the order Samba 4.17 runs them, because smbtorture
//! (smb2.session.bind_negative_*) pins the status each case gets. A
//! failed binding leaves the session as it was on its other channels.
//!
//! Nimbus, like Samba, requires the binding connection to have the
//! session's ClientGuid (the spec allows it): leases and CREATE replays
//! are keyed by ClientGuid, and a channel of another client could neither
//! acknowledge the session's lease breaks nor replay its creates.

use std::sync::Arc;

use nimbus_auth::AuthStep;
use nimbus_crypto::SigningAlgorithm;
use nimbus_wire::negotiate::{capabilities, Dialect};
use nimbus_wire::session_setup::{SessionSetupRequest, SessionSetupResponse};
use nimbus_wire::NtStatus;

use crate::connection::{Binding, ChannelEntry};
use crate::ctx::{Ctx, HandlerResult, PreauthTarget};
use crate::security::session_signer;
use crate::session::{Session, SessionState, SigningKey};
use crate::sync::lock;

pub fn handle(
    ctx: &mut Ctx<'_>,
    session: Arc<Session>,
    req: &SessionSetupRequest<'_>,
    out: &mut Vec<u8>,
) -> HandlerResult {
    let id = session.id;
    let result = bind(ctx, session, req, out);
    if result.is_err() {
        // A refused leg ends the exchange: a later binding starts afresh.
        lock(&ctx.conn.bindings).remove(&id);
    }
    result
}

fn bind(
    ctx: &mut Ctx<'_>,
    session: Arc<Session>,
    req: &SessionSetupRequest<'_>,
    out: &mut Vec<u8>,
) -> HandlerResult {
    let user = admissible(ctx, &session).inspect_err(|status| {
        tracing::debug!(
            "{}: binding to session {:#x} refused: {status}",
            ctx.conn.peer,
            session.id
        );
    })?;
    let neg = ctx.conn.negotiated().ok_or(NtStatus::INVALID_PARAMETER)?;
    let id = session.id;
    let taken = lock(&ctx.conn.bindings).remove(&id);
    let mut binding = match taken {
        Some(b) => b,
        None => {
            super::logon_checks::refuse_beyond_session_limits(ctx)?;
            Binding {
                exchange: ctx.server.auth.start_at(ctx.conn.local.ip()),
                preauth: *lock(&ctx.conn.preauth),
            }
        }
    };
    if neg.dialect == Dialect::Smb311 {
        binding.preauth = ctx.server.provider.sha512(&[&binding.preauth[..], ctx.msg]);
    }
    match binding.exchange.step(req.security_buffer) {
        Ok(AuthStep::Continue(token)) => {
            lock(&ctx.conn.bindings).insert(id, binding);
            SessionSetupResponse {
                session_flags: 0,
                security_buffer: token,
            }
            .encode(out);
            ctx.preauth_session = Some(PreauthTarget::Binding(id));
            Ok(NtStatus::MORE_PROCESSING_REQUIRED)
        }
        Ok(AuthStep::Complete(res)) => {
            if !super::logon_checks::is_user(&res, &user) {
                // MS-SMB2 3.3.5.5.3: the binding must authenticate the
                // session's own user (Samba, Windows: ACCESS_DENIED).
                tracing::warn!(
                    "{}: binding to session {id:#x} of {user} authenticated {:?} instead; refused",
                    ctx.conn.peer,
                    super::logon_checks::shown_name(&res)
                );
                return Err(NtStatus::ACCESS_DENIED);
            }
            super::logon_checks::backed_off(ctx, &res.user)?;
            ctx.server
                .logon_guard
                .succeeded(&res.user, ctx.conn.peer.ip());
            let signer = session_signer(
                &ctx.server.provider,
                neg.dialect,
                neg.signing_algorithm,
                &res.session_key,
                &binding.preauth,
            )
            .map(SigningKey::from)
            .map_err(|e| {
                tracing::error!(
                    "{}: cannot derive a channel signing key: {e}",
                    ctx.conn.peer
                );
                NtStatus::LOGON_FAILURE
            })?;
            let max = ctx.server.config().limits.max_channels_per_session;
            if !session.add_channel(ctx.conn, max) {
                return Err(if session.has_ended() {
                    NtStatus::USER_SESSION_DELETED
                } else {
                    NtStatus::INSUFFICIENT_RESOURCES
                });
            }
            lock(&ctx.conn.sessions).insert(
                id,
                ChannelEntry {
                    session: session.clone(),
                    signer: Some(signer.clone()),
                },
            );
            if session.has_ended() {
                // Logged off on another channel meanwhile.
                lock(&ctx.conn.sessions).remove(&id);
                return Err(NtStatus::USER_SESSION_DELETED);
            }
            ctx.conn.logged_on();
            tracing::info!(
                "session bind: user {user} from {} (channel {} of session {id:#x}, {:?}, signing {:?})",
                ctx.conn.peer,
                session.channel_count(),
                neg.dialect,
                neg.signing_algorithm
            );
            SessionSetupResponse {
                session_flags: 0,
                security_buffer: res.output,
            }
            .encode(out);
            // MS-SMB2 3.3.4.1.1: the successful binding's response is
            // signed with the new channel's key, which proves it.
            ctx.sign_with = Some(signer);
            Ok(NtStatus::SUCCESS)
        }
        Err(e) => {
            if let Some(times) = super::logon_checks::logged_times(&e, "binding refused") {
                tracing::warn!(
                    "{}: binding to session {id:#x} refused: {e}{times}",
                    ctx.conn.peer
                );
            }
            Err(super::logon_checks::refused(ctx, &e))
        }
    }
}

/// The checks before a binding's exchange (MS-SMB2 3.3.5.5, in Samba's
/// order); the session's user name if it may go on.
fn admissible(ctx: &Ctx<'_>, session: &Session) -> Result<String, NtStatus> {
    let neg = ctx.conn.negotiated().ok_or(NtStatus::INVALID_PARAMETER)?;
    let origin = &session.origin;
    // AES-GMAC signs with a nonce from the message id; it cannot be mixed
    // with another algorithm within one session (Samba's statuses).
    let gmac = SigningAlgorithm::AesGmac;
    if origin.dialect.is_smb3() && origin.signing_algorithm == gmac && neg.signing_algorithm != gmac
    {
        return Err(NtStatus::REQUEST_OUT_OF_SEQUENCE);
    }
    if neg.dialect.is_smb3() && neg.signing_algorithm == gmac && origin.signing_algorithm != gmac {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    // A channel binds only over a connection whose NEGOTIATE answered
    // SMB2_GLOBAL_CAP_MULTI_CHANNEL (handlers::negotiate): never on 2.x,
    // nor when the server turned multichannel off, nor for a client that
    // did not announce it.
    if neg.server_capabilities & capabilities::MULTI_CHANNEL == 0 {
        return Err(NtStatus::REQUEST_NOT_ACCEPTED);
    }
    if ctx.signed_by.is_none() {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if neg.dialect != origin.dialect || neg.cipher != origin.cipher {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if session.has_ended() {
        return Err(NtStatus::USER_SESSION_DELETED);
    }
    if ctx.conn.session(session.id).is_some() {
        // Already a channel of this connection.
        return Err(NtStatus::REQUEST_NOT_ACCEPTED);
    }
    let user = match &*lock(&session.state) {
        SessionState::InProgress { .. } => return Err(NtStatus::REQUEST_NOT_ACCEPTED),
        SessionState::Valid(a) => {
            if a.expires.is_some_and(|t| std::time::Instant::now() >= t) {
                return Err(NtStatus::NETWORK_SESSION_EXPIRED);
            }
            if a.guest || a.signer.is_none() {
                return Err(NtStatus::NOT_SUPPORTED);
            }
            a.user.clone()
        }
    };
    if neg.client_guid != origin.client_guid {
        return Err(NtStatus::USER_SESSION_DELETED);
    }
    let max = ctx.server.config().limits.max_channels_per_session;
    if session.channel_count() >= max {
        tracing::warn!(
            "{}: binding to session {:#x} refused: it has {max} channels \
             (limits.max_channels_per_session)",
            ctx.conn.peer,
            session.id
        );
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    Ok(user)
}
