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

use std::sync::Arc;
use std::time::Instant;

use nimbus_auth::{AuthStep, UserDb};
use nimbus_wire::session_setup::{session_flags, SessionSetupResponse};
use nimbus_wire::NtStatus;

use crate::dispatch::{Ctx, HandlerResult};
use crate::session::{lock, Session, SessionState};

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
            let (who, flags) = match &mut *lock(&session.state) {
                SessionState::Valid(a) => {
                    let same = !a.guest
                        && !res.guest
                        && !res.anonymous
                        && UserDb::canonical_key(&a.user) == UserDb::canonical_key(&res.user);
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
                    if res.anonymous {
                        "(anonymous)"
                    } else {
                        res.user.as_str()
                    }
                );
                end(ctx, &session);
                return Err(NtStatus::ACCESS_DENIED);
            };
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
            let status = super::session_setup::refused(ctx, &e);
            tracing::warn!(
                "{}: session re-authentication failed, session ended: {e}",
                ctx.conn.peer
            );
            end(ctx, &session);
            Err(status)
        }
    }
}

/// Ends the session as LOGOFF does; the response still goes out signed
/// with its key, which the client holds.
fn end(ctx: &mut Ctx<'_>, session: &Arc<Session>) {
    ctx.sign_with = Some(session.clone());
    lock(&ctx.conn.sessions).remove(&session.id);
    super::logoff::end_session(ctx.server, session);
    ctx.conn
        .pending
        .end_all(NtStatus::CANCELLED, |p| p.session_id() == session.id);
}
