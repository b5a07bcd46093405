//! MS-SMB2 3.3.5.5.2 Reauthenticating an Existing Session: a SESSION_SETUP
//! naming a session that is already valid runs a new authentication
//! exchange on it (Windows does so when a Kerberos ticket nears its end;
//! smbtorture smb2.session.reauth*). The session stays usable meanwhile,
//! and its keys stay those of its first logon ("the existing
//! Session.SessionKey will be retained"), so signing and encryption go on
//! unchanged.
//!
//! The same user must log on again. Another identity (another user, a
//! guest, anonymous) ends the session (MS-SMB 3.3.5.3 lets a server tear a
//! session down when re-authentication names another user; Nimbus does,
//! rather than hand a session and its open files to someone else), and so
//! does a failed exchange (MS-SMB2 3.3.5.5.3: the session is removed):
//! its opens close as at LOGOFF and later requests on it get
//! STATUS_USER_SESSION_DELETED.
//!
//! Re-authentication is a logon like any other for the logon guard: a
//! backed-off name or address is refused even with the right password,
//! and a right password for another user is answered exactly as a wrong
//! one (LOGON_FAILURE, counted as a failure), so that re-authenticating a
//! guest session cannot be used to test passwords past the back-off.

use std::sync::Arc;
use std::time::Instant;

use nimbus_auth::AuthStep;
use nimbus_wire::session_setup::{session_flags, SessionSetupResponse};
use nimbus_wire::NtStatus;

use crate::ctx::{Ctx, HandlerResult};
use crate::session::{Session, SessionState};
use crate::sync::lock;

pub fn handle(
    ctx: &mut Ctx<'_>,
    session: Arc<Session>,
    token: &[u8],
    out: &mut Vec<u8>,
) -> HandlerResult {
    let mut exchange = lock(&session.reauth)
        .take()
        .unwrap_or_else(|| ctx.server.auth.start_at(ctx.conn.local.ip()));
    match exchange.step(token) {
        Ok(AuthStep::Continue(token)) => {
            *lock(&session.reauth) = Some(exchange);
            SessionSetupResponse {
                session_flags: 0,
                security_buffer: token,
            }
            .encode(out);
            Ok(NtStatus::MORE_PROCESSING_REQUIRED)
        }
        Ok(AuthStep::Complete(res)) => {
            let real_user = !res.guest && !res.anonymous;
            if real_user {
                if let Err(status) = super::logon_checks::backed_off(ctx, &res.user) {
                    end(ctx, &session);
                    return Err(status);
                }
            }
            let (who, flags) = match &mut *lock(&session.state) {
                SessionState::Valid(a) => {
                    let same = !a.guest && super::logon_checks::is_user(&res, &a.user);
                    let flags = if a.encrypt_data {
                        session_flags::ENCRYPT_DATA
                    } else {
                        0
                    };
                    if same {
                        // A new ticket, a new end (MS-SMB2 3.3.5.5.3).
                        a.expires = res.expires_in.map(|d| Instant::now() + d);
                    }
                    (same.then(|| format!("{}\\{}", a.domain, a.user)), flags)
                }
                _ => (None, 0),
            };
            let Some(who) = who else {
                tracing::warn!(
                    "{}: session re-authentication as {:?} ended the session: not its user",
                    ctx.conn.peer,
                    super::logon_checks::shown_name(&res)
                );
                if real_user {
                    ctx.server.logon_guard.failed(
                        &res.user,
                        ctx.conn.peer.ip(),
                        Instant::now(),
                        &ctx.server.config().limits,
                    );
                }
                end(ctx, &session);
                return Err(NtStatus::LOGON_FAILURE);
            };
            ctx.server
                .logon_guard
                .succeeded(&res.user, ctx.conn.peer.ip());
            // Proves the (unchanged) key to the client, as a first logon's
            // final response does.
            ctx.sign_with = ctx.conn.signing_key(session.id);
            tracing::info!(
                "session re-authenticated: user {who} from {}",
                ctx.conn.peer
            );
            SessionSetupResponse {
                session_flags: flags,
                security_buffer: res.output,
            }
            .encode(out);
            Ok(NtStatus::SUCCESS)
        }
        Err(e) => {
            let status = super::logon_checks::refused(ctx, &e);
            if let Some(times) = super::logon_checks::logged_times(&e, "re-authentication failed") {
                tracing::warn!(
                    "{}: session re-authentication failed, session ended: {e}{times}",
                    ctx.conn.peer
                );
            }
            end(ctx, &session);
            Err(status)
        }
    }
}

/// Ends the session as LOGOFF does, on all its channels; the response
/// still goes out signed with this channel's key, which the client holds.
fn end(ctx: &mut Ctx<'_>, session: &Arc<Session>) {
    ctx.sign_with = ctx.conn.signing_key(session.id);
    crate::session_end::end_everywhere(ctx.server, session);
}
