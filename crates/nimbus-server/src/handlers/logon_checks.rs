//! What every kind of SESSION_SETUP (a logon, a re-authentication, a
//! channel binding: MS-SMB2 3.3.5.5) checks and refuses alike: the
//! session limits, the failed-logon back-off, and how a refusal is
//! logged and answered.

use std::time::Instant;

use nimbus_auth::AuthError;
use nimbus_wire::NtStatus;

use crate::ctx::Ctx;
use crate::logon_guard::BackedOff;
use crate::sync::lock;

/// Whether a refusal is logged now, and the count suffix of its line: a
/// wrong password or an unknown user (what a guesser causes, over and
/// over) is aggregated under `reason` (`crate::log_limit`); any other
/// refusal, a misconfiguration worth seeing each time, is always logged.
pub fn logged_times(e: &AuthError, reason: &'static str) -> Option<String> {
    match e {
        AuthError::LogonFailure { .. } => {
            crate::log_limit::occurred(reason).map(crate::log_limit::times)
        }
        _ => Some(String::new()),
    }
}

/// The status a failed exchange gets; a wrong password counts against the
/// user and address (and a backed-off one is told so).
pub fn refused(ctx: &Ctx<'_>, e: &AuthError) -> NtStatus {
    let status = match e {
        AuthError::Malformed(_) => NtStatus::INVALID_PARAMETER,
        AuthError::NotSupported(_) => NtStatus::NOT_SUPPORTED,
        _ => NtStatus::LOGON_FAILURE,
    };
    if let AuthError::LogonFailure { user, .. } = e {
        let blocked = backed_off(ctx, user);
        ctx.server.logon_guard.failed(
            user,
            ctx.conn.peer.ip(),
            Instant::now(),
            &ctx.server.config().limits,
        );
        if let Err(s) = blocked {
            return s;
        }
    }
    status
}

/// `limits.max_sessions_per_connection` and `limits.max_logons_in_progress`:
/// a new SESSION_SETUP exchange, a logon or a binding, is refused beyond
/// them (each unfinished one holds its authentication state until the
/// connection closes; a binding under way is a session in the making).
pub fn refuse_beyond_session_limits(ctx: &Ctx<'_>) -> Result<(), NtStatus> {
    let limits = &ctx.server.config().limits;
    let (total, in_progress) = {
        let sessions = lock(&ctx.conn.sessions);
        let bindings = lock(&ctx.conn.bindings).len();
        let logging_on = sessions.values().filter(|e| !e.session.is_valid()).count();
        (sessions.len() + bindings, logging_on + bindings)
    };
    let key = if total >= limits.max_sessions_per_connection {
        "max_sessions_per_connection"
    } else if in_progress >= limits.max_logons_in_progress {
        "max_logons_in_progress"
    } else {
        return Ok(());
    };
    tracing::warn!(
        "{}: new session refused: {total} sessions, {in_progress} still logging on \
         (limits.{key})",
        ctx.conn.peer
    );
    Err(NtStatus::REQUEST_NOT_ACCEPTED)
}

/// The name an exchange authenticated, as the log shows it.
pub fn shown_name(res: &nimbus_auth::AuthResult) -> &str {
    if res.anonymous {
        "(anonymous)"
    } else {
        &res.user
    }
}

/// Whether an exchange authenticated `user` itself: not a guest, not
/// anonymous (a re-authentication or a binding must, MS-SMB2 3.3.5.5.3).
pub fn is_user(res: &nimbus_auth::AuthResult, user: &str) -> bool {
    !res.guest
        && !res.anonymous
        && nimbus_auth::UserDb::canonical_key(&res.user) == nimbus_auth::UserDb::canonical_key(user)
}

/// Refuses a logon while its user name or the client's address is backed
/// off after failed logons (`limits.max_failed_logons_per_*`).
pub fn backed_off(ctx: &Ctx<'_>, user: &str) -> Result<(), NtStatus> {
    let limits = &ctx.server.config().limits;
    let peer = ctx.conn.peer;
    let (scope, key, status, remaining) =
        match ctx
            .server
            .logon_guard
            .check(user, peer.ip(), Instant::now(), limits)
        {
            Ok(()) => return Ok(()),
            Err(BackedOff::User { remaining }) => (
                "user",
                "max_failed_logons_per_user",
                NtStatus::ACCOUNT_LOCKED_OUT,
                remaining,
            ),
            Err(BackedOff::Address { remaining }) => (
                "address",
                "max_failed_logons_per_address",
                NtStatus::LOGON_FAILURE,
                remaining,
            ),
        };
    if let Some(n) = crate::log_limit::occurred(key) {
        tracing::warn!(
            "logon of user {user:?} from {peer} refused: too many failed logons for this {scope} \
             (limits.{key}); allowed again in {}s{}",
            remaining.as_secs_f64().ceil(),
            crate::log_limit::times(n)
        );
    }
    Err(status)
}
