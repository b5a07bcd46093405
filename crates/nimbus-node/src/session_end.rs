//! The end of a session, which LOGOFF, the loss of its last connection, a
//! logon that replaces it and another node's request share: its trees and
//! pipes go, its durable opens are kept for a reconnect and the others
//! close (MS-SMB2 3.3.5.6, 3.3.7.1).

use crate::server::Server;
use crate::session::{Session, SessionState};
use crate::sync::lock;

/// Ends a session as LOGOFF does (also a failed or foreign
/// re-authentication, a logon naming it as its PreviousSessionId): gone
/// from every connection it is bound to (MS-SMB2 3.3.5.6: the session is
/// removed with all its channels), its opens released, and what still
/// waits in it (on its kept durable opens) ended. Nothing if it already
/// ended.
pub fn end_everywhere(server: &Server, session: &Session) {
    let Some(conns) = session.end_channels() else {
        return;
    };
    for conn in &conns {
        conn.forget_session(session);
    }
    end_session(server, session);
    for conn in &conns {
        conn.end_requests_of(session.id);
    }
}

/// Ends a session (LOGOFF, the loss of its connection, a logon that
/// replaces it): its durable opens are kept for a reconnect (MS-SMB2
/// 3.3.5.6, 3.3.7.1), the others close, and its trees go.
pub fn end_session(server: &Server, session: &Session) {
    server.sessions.forget(session.id);
    let opens: Vec<_> = lock(&session.opens).drain().map(|(_, o)| o).collect();
    for open in opens {
        crate::disconnected::keep_or_close(server, &open);
    }
    lock(&session.trees).clear();
    // What the pipes hold goes back to their connections' budgets now,
    // not when the last request holding the session ends.
    lock(&session.pipes).clear();
}

/// Who a session is logged on as, for PreviousSessionId (MS-SMB2
/// 3.3.5.5.3): user and domain without case; None for a guest, an
/// anonymous session or one not logged on yet.
pub fn logged_on_as(s: &Session) -> Option<(String, String)> {
    match &*lock(&s.state) {
        SessionState::Valid(a) if !a.guest => {
            Some((a.user.to_lowercase(), a.domain.to_lowercase()))
        }
        _ => None,
    }
}

/// Another node's logon names a session of this node as its
/// PreviousSessionId (`crate::session_handover`): the session ends as a
/// local one would, if it is logged on as the same user, and the asking
/// node is answered either way.
pub fn end_for_another_node(server: &Server, req: &crate::session_handover::EndSession) {
    let Some(m) = &server.cluster else {
        return;
    };
    let asker = Some((req.user.to_lowercase(), req.domain.to_lowercase()));
    let ended = match server.sessions.find(req.session_id) {
        Some(session) if logged_on_as(&session).is_some() && logged_on_as(&session) == asker => {
            tracing::info!(
                "session {:#x} ends: its client logged on again through {}",
                req.session_id,
                req.reply_to
            );
            end_everywhere(server, &session);
            true
        }
        _ => false,
    };
    let answer = crate::session_handover::encode_answer(req.nonce, ended);
    if let Err(e) = m.post(&req.reply_to, &answer) {
        tracing::warn!(
            "cluster: answering {} about session {:#x}: {e}",
            req.reply_to,
            req.session_id
        );
    }
}
