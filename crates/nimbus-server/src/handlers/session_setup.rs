//! MS-SMB2 3.3.5.5 Receiving an SMB2 SESSION_SETUP Request: runs the
//! SPNEGO/NTLM exchange, folds each request (and each non-final response,
//! in dispatch) into the 3.1.1 preauth hash, and derives the signing key.

use std::sync::Arc;
use std::time::Instant;

use nimbus_auth::AuthStep;
use nimbus_wire::negotiate::{security_mode, Dialect};
use nimbus_wire::session_setup::{
    session_flags, SessionSetupRequest, SessionSetupResponse, FLAG_BINDING,
};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::config::SigningPolicy;
use crate::connection::ChannelEntry;
use crate::ctx::{Ctx, HandlerResult};
use crate::security::{session_signer, SessionCipher};
use crate::session::{Authenticated, Session, SessionState, SigningKey};
use crate::sync::lock;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = SessionSetupRequest::parse(body).map_err(malformed)?;
    let neg = ctx.conn.negotiated().ok_or(NtStatus::INVALID_PARAMETER)?;
    if req.flags & FLAG_BINDING != 0 {
        // A new channel for an existing session (multichannel). Binding
        // "to" no session is malformed, as Samba answers it.
        let Some(session) = ctx.session.clone() else {
            return Err(NtStatus::INVALID_PARAMETER);
        };
        ctx.response_session_id = session.id;
        return super::session_bind::handle(ctx, session, &req, out);
    }
    let session = match &ctx.session {
        None => {
            super::logon_checks::refuse_beyond_session_limits(ctx)?;
            let id = ctx.server.new_session_id();
            let preauth = *lock(&ctx.conn.preauth);
            // The local address lets the NTLM acceptor tell whether an
            // MsvAvTargetName naming an IP address names this server.
            let exchange = ctx.server.auth.start_at(ctx.conn.local.ip());
            let s = Arc::new(Session::new(id, exchange, preauth, neg.clone(), ctx.conn));
            lock(&ctx.conn.sessions).insert(id, ChannelEntry::first(s.clone()));
            ctx.server.sessions.register(&s);
            s
        }
        Some(s) if s.is_valid() => {
            let s = s.clone();
            ctx.response_session_id = s.id;
            return super::session_reauth::handle(ctx, s, req.security_buffer, out);
        }
        Some(s) => s.clone(),
    };
    ctx.response_session_id = session.id;
    let mut state = lock(&session.state);
    let SessionState::InProgress { exchange, preauth } = &mut *state else {
        return Err(NtStatus::REQUEST_NOT_ACCEPTED);
    };
    if neg.dialect == Dialect::Smb311 {
        *preauth = ctx.server.provider.sha512(&[&preauth[..], ctx.msg]);
    }
    let step = exchange.step(req.security_buffer);
    match step {
        Ok(AuthStep::Continue(token)) => {
            SessionSetupResponse {
                session_flags: 0,
                security_buffer: token,
            }
            .encode(out);
            drop(state);
            ctx.preauth_session = Some(crate::ctx::PreauthTarget::Session(session));
            Ok(NtStatus::MORE_PROCESSING_REQUIRED)
        }
        Ok(AuthStep::Complete(res)) => {
            let unauthenticated = res.guest || res.anonymous;
            if !unauthenticated {
                // A backed-off name or address is refused even with the
                // right password, so that guessing learns nothing.
                if let Err(status) = super::logon_checks::backed_off(ctx, &res.user) {
                    drop(state);
                    forget_session(ctx, session.id);
                    return Err(status);
                }
                ctx.server
                    .logon_guard
                    .succeeded(&res.user, ctx.conn.peer.ip());
            }
            let signer = if unauthenticated {
                None
            } else {
                match session_signer(
                    &ctx.server.provider,
                    neg.dialect,
                    neg.signing_algorithm,
                    &res.session_key,
                    preauth,
                ) {
                    Ok(s) => Some(SigningKey::from(s)),
                    Err(e) => {
                        tracing::error!("{}: cannot derive signing key: {e}", ctx.conn.peer);
                        drop(state);
                        forget_session(ctx, session.id);
                        return Err(NtStatus::LOGON_FAILURE);
                    }
                }
            };
            let cipher = match neg.cipher {
                Some(alg) if !unauthenticated => {
                    // MS-SMB2 3.3.5.5.3: AES-256 keys derive from the whole
                    // key the mechanism agreed on (32 bytes for a Kerberos
                    // AES-256 subkey), the others from its first 16 bytes.
                    let key = if alg.key_len() == 32 {
                        &res.full_session_key[..]
                    } else {
                        &res.session_key[..]
                    };
                    match SessionCipher::derive(
                        &ctx.server.provider,
                        neg.dialect,
                        alg,
                        key,
                        preauth,
                    ) {
                        Ok(c) => Some(Arc::new(c)),
                        Err(e) => {
                            tracing::error!(
                                "{}: cannot derive encryption keys: {e}",
                                ctx.conn.peer
                            );
                            drop(state);
                            forget_session(ctx, session.id);
                            return Err(NtStatus::LOGON_FAILURE);
                        }
                    }
                }
                _ => None,
            };
            if cipher.is_none() && ctx.server.config().refuse_clear_sessions() {
                drop(state);
                forget_session(ctx, session.id);
                tracing::warn!(
                    "session logon of {}\\{} from {} refused: encryption is required and this \
                     session cannot encrypt ({})",
                    res.domain,
                    res.user,
                    ctx.conn.peer,
                    ctx.conn.why_no_encryption(unauthenticated)
                );
                return Err(NtStatus::ACCESS_DENIED);
            }
            let encrypt_data = cipher.is_some() && ctx.server.config().encrypt_whole_session();
            let signing_required = !unauthenticated
                && (ctx.server.config().signing == SigningPolicy::Required
                    || (req.security_mode as u16 | neg.client_security_mode)
                        & security_mode::SIGNING_REQUIRED
                        != 0);
            let mut flags = 0;
            if res.anonymous {
                flags |= session_flags::IS_NULL;
            } else if res.guest {
                flags |= session_flags::IS_GUEST;
            }
            if encrypt_data {
                flags |= session_flags::ENCRYPT_DATA;
            }
            tracing::info!(
                "session logon: user {}\\{} from {} ({:?}, signing {}, encryption {}{})",
                res.domain,
                super::logon_checks::shown_name(&res),
                ctx.conn.peer,
                neg.dialect,
                if signer.is_some() {
                    format!("{:?}", neg.signing_algorithm)
                } else {
                    "off".into()
                },
                match (&cipher, encrypt_data) {
                    (Some(c), true) => format!("{:?} required", c.algorithm()),
                    (Some(c), false) => format!("{:?} available", c.algorithm()),
                    (None, _) => "off".into(),
                },
                match (res.expires_in, &res.key_type) {
                    (Some(d), Some(key)) => format!(", ticket ends in {}s, key {key}", d.as_secs()),
                    (Some(d), None) => format!(", ticket ends in {}s", d.as_secs()),
                    (None, _) => String::new(),
                },
            );
            let final_signer = signer.clone();
            // An anonymous (null) session proves nothing about the client:
            // the connection stays under the logon deadline and counts as
            // unauthenticated until a user (or guest) logs on.
            if !res.anonymous {
                ctx.conn.logged_on();
            }
            let method = if res.anonymous {
                "anonymous"
            } else if res.guest {
                "guest"
            } else if res.key_type.is_some() || res.expires_in.is_some() {
                "kerberos"
            } else {
                "ntlm"
            };
            crate::metrics::logon(method, true);
            let token = std::sync::Arc::new(logon_token(ctx, &res));
            *state = SessionState::Valid(Authenticated {
                token,
                user: res.user,
                domain: res.domain,
                guest: unauthenticated,
                signer,
                signing_required,
                cipher,
                encrypt_data,
                expires: res.expires_in.map(|d| Instant::now() + d),
            });
            drop(state);
            if !unauthenticated {
                end_previous_session(ctx, &session, req.previous_session_id);
            }
            SessionSetupResponse {
                session_flags: flags,
                security_buffer: res.output,
            }
            .encode(out);
            // The final response proves the key to the client (required for
            // 3.1.1, where it also seals the preauth hash).
            ctx.sign_with = final_signer;
            Ok(NtStatus::SUCCESS)
        }
        Err(e) => {
            drop(state);
            forget_session(ctx, session.id);
            if let Some(times) = super::logon_checks::logged_times(&e, "logon refused") {
                tracing::warn!("session logon refused from {}: {e}{times}", ctx.conn.peer);
            }
            crate::metrics::logon("unknown", false);
            Err(super::logon_checks::refused(ctx, &e))
        }
    }
}

/// MS-SMB2 3.3.5.5.3: a logon that names its PreviousSessionId replaces
/// that session of the same user, on whichever connection holds it (a
/// client that lost its connection often reconnects before the server
/// notices the loss). The old session ends as at LOGOFF: later requests on
/// it get USER_SESSION_DELETED, its durable opens are kept for the client
/// to reclaim, its other opens close and what waits on them ends (a
/// pending CHANGE_NOTIFY with STATUS_NOTIFY_CLEANUP, smbtorture
/// smb2.notify.session-reconnect). A session of another user stays.
fn end_previous_session(ctx: &Ctx<'_>, session: &Session, previous_id: u64) {
    if previous_id == 0 || previous_id == session.id {
        return;
    }
    let who = crate::session_end::logged_on_as;
    let Some(previous) = ctx.server.sessions.find(previous_id) else {
        if let Some((user, domain)) = who(session) {
            end_on_another_node(ctx, previous_id, &user, &domain);
        }
        return;
    };
    if who(&previous).is_none() || who(&previous) != who(session) {
        return;
    }
    crate::session_end::end_everywhere(ctx.server, &previous);
}

/// How long a logon waits for the node of its previous session to end it.
/// A node answers as soon as its inbox watch delivers the request
/// (milliseconds); a node that does not answer within this is taken to
/// have lost the session with its lease, and the logon goes on.
const PREVIOUS_SESSION_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A cluster node's logon whose previous session is not here: the session
/// id names the node that made it (`Server::new_session_id`), which is
/// asked to end it (`crate::session_handover`), and answered before the
/// logon is: the client's next request on its old connection finds the
/// session gone, and its durable opens wait there for a reconnect.
fn end_on_another_node(ctx: &Ctx<'_>, previous_id: u64, user: &str, domain: &str) {
    let Some(m) = &ctx.server.cluster else {
        return;
    };
    let incarnation = crate::cluster::incarnation_of(previous_id);
    if incarnation == 0 || m.runs(incarnation) {
        return;
    }
    let node = match m.node_of(incarnation) {
        Ok(Some(node)) if node != m.node => node,
        Ok(_) => return, // that run of a node is over: so are its sessions
        Err(e) => {
            tracing::warn!("previous session {previous_id:#x}: finding its node: {e}");
            return;
        }
    };
    let request = |nonce| {
        crate::session_handover::encode_end_session(&crate::session_handover::EndSession {
            session_id: previous_id,
            nonce,
            reply_to: m.node.clone(),
            user: user.to_string(),
            domain: domain.to_string(),
        })
    };
    match m.ask_nodes(std::slice::from_ref(&node), request, PREVIOUS_SESSION_WAIT)[..] {
        [1] => tracing::debug!("previous session {previous_id:#x} ended on {node}"),
        [_] => {}
        _ => tracing::warn!(
            "previous session {previous_id:#x}: {node} did not answer within {}s",
            PREVIOUS_SESSION_WAIT.as_secs()
        ),
    }
}

/// A logon that failed leaves no session behind.
fn forget_session(ctx: &Ctx<'_>, id: u64) {
    lock(&ctx.conn.sessions).remove(&id);
    ctx.server.sessions.forget(id);
}

/// The SIDs the session acts with (crate::acl::token): a user of the user
/// database is S-1-5-21-<machine>-<RID>, with the groups of the database it
/// is a member of at logon (as a Windows token, a change of membership
/// counts from the next logon), and BUILTIN\Administrators when
/// `[security] admins` names it or one of those groups; one removed since
/// it logged on acts as a guest.
fn logon_token(ctx: &Ctx<'_>, res: &nimbus_auth::AuthResult) -> crate::acl::Token {
    use crate::acl::Token;
    let auth = &ctx.server.auth;
    if res.anonymous {
        return Token::anonymous();
    }
    let Some(rid) = auth.user_rid(&res.user).filter(|_| !res.guest) else {
        return Token::guest(auth.machine_sid());
    };
    let groups = auth.group_rids_of(&res.user);
    let token = Token::member(auth.machine_sid(), rid, &groups);
    let user_key = nimbus_auth::UserDb::canonical_key(&res.user);
    let admin = ctx.server.config().admins.iter().any(|name| {
        nimbus_auth::UserDb::canonical_key(name) == user_key
            || auth.group_rid(name).is_some_and(|g| groups.contains(&g))
    });
    if admin {
        token.with_administrators()
    } else {
        token
    }
}
