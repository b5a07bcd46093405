//! What becomes of a durable open whose session ended (MS-SMB2 3.3.7.1,
//! 3.3.5.9.13): kept in the table of disconnected opens
//! (`crate::durable::DurableOpens`) for its client to reclaim, or closed:
//! when it is not durable, when its timeout runs out (the scavenger), when
//! another client's open needs what it holds, or when an application
//! instance takes over its file.

use std::sync::Arc;
use std::time::Instant;

use crate::durable::Owner;
use crate::open::Open;
use crate::server::Server;
use crate::sync::lock;

/// Closes the disconnected open `open_id` (its timeout ran out, or
/// another client's open needs what it holds). False when it is not
/// disconnected (reclaimed meanwhile, or closed already).
pub fn purge(server: &Server, open_id: u64) -> bool {
    let Some(open) = server.durables.claim(open_id) else {
        return false;
    };
    tracing::debug!(
        "durable open {open_id} ({}) closed while disconnected",
        open.path()
    );
    crate::release::release(server, &open);
    true
}

/// Closes disconnected opens as their timeouts run out, for as long as
/// the server runs.
pub async fn scavenge(server: Arc<Server>) {
    let this = &server.durables;
    loop {
        // Registered before the table is read, so an earlier expiry
        // added meanwhile wakes the wait below.
        let wake = this.woken();
        let expired = this.expired(Instant::now());
        if !expired.is_empty() {
            // Closing may wait on the state store (etcd on a cluster
            // node, the disk for persistent records).
            let s = server.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for id in expired {
                    if let Some(open) = s.durables.find_disconnected(id) {
                        if purge(&s, id) {
                            tracing::info!(
                                "durable open {id:#x} of {} expired: its client did not \
                                 reconnect in time",
                                open.path()
                            );
                        }
                    }
                }
            })
            .await;
        }
        match this.next_expiry() {
            Some(at) => {
                let _ = tokio::time::timeout_at(at.into(), wake).await;
            }
            None => wake.await,
        }
    }
}

/// An open whose session ended: kept for a reconnect if it is durable (and
/// the limits allow), closed otherwise.
pub fn keep_or_close(server: &Server, open: &Arc<Open>) {
    // Breaks to it from now on close it instead of waiting for a client.
    server.oplocks.detach(open.open_id);
    match server.durables.disconnect(open, Instant::now()) {
        Ok(()) => {
            // A break sent before the loss can no longer be acknowledged,
            // and whoever waits for it should not wait out the timeout: a
            // durable open is closed, as a break that reaches it now would
            // close it; a persistent one stays for its client and the break
            // is taken as acknowledged, as a break that reaches it now
            // would be (crate::server's disconnected-break handler).
            if open.is_persistent() {
                server
                    .oplocks
                    .acknowledge_pending_for(open.file_key, open.open_id);
            } else if server.oplocks.open_breaking(open.file_key, open.open_id) {
                purge(server, open.open_id);
            }
        }
        Err(_) => crate::release::release(server, open),
    }
}

/// Who a session is logged on as, for the opens it makes durable: None
/// for a guest or an anonymous session.
pub fn session_owner(session: &crate::session::Session) -> Option<Owner> {
    match &*lock(&session.state) {
        crate::session::SessionState::Valid(a) if !a.guest && a.token.is_authenticated_user() => {
            Some(Owner {
                sid: a.token.user.to_string(),
                name: a.user.clone(),
            })
        }
        _ => None,
    }
}

/// Whose `open` is: its durable owner, or else its session's user (None
/// for a guest's or anonymous session's open).
pub fn open_owner(server: &Server, open: &Open) -> Option<Owner> {
    if let Some(d) = lock(&open.durable).as_ref() {
        return Some(d.owner.clone());
    }
    session_owner(&*server.sessions.find(open.session_id())?)
}

/// MS-SMB2 3.3.5.9.13 (the durable CREATE handler asks for it):
/// closes this node's opens of `file` on share `share` made under
/// AppInstanceId `id` by a client other than `client_guid` for user `me`:
/// how many.
pub fn close_app_instance_opens(
    server: &Server,
    file: nimbus_state::FileKey,
    id: [u8; 16],
    share: &str,
    client_guid: [u8; 16],
    me: &Owner,
) -> usize {
    let old = server.opens.matching(|o| {
        o.file_key == file
            && o.app_instance == Some(id)
            && o.share.name.eq_ignore_ascii_case(share)
            && o.replay.as_ref().is_some_and(|r| r.key.0 != client_guid)
    });
    let mut closed = 0;
    for open in old {
        if open_owner(server, &open).is_none_or(|o| &o != me) {
            continue;
        }
        if purge(server, open.open_id) {
            closed += 1;
            continue;
        }
        let Some(session) = server.sessions.find(open.session_id()) else {
            continue;
        };
        if let Some(open) = session.take_open(&open) {
            tracing::debug!(
                "open {} closed by a CREATE of its AppInstanceId",
                open.open_id
            );
            crate::release::release(server, &open);
            closed += 1;
        }
    }
    closed
}

/// Another node's durable CREATE under an AppInstanceId asks this node to
/// close the application's old opens here; answered either way.
pub fn close_app_instance_for_node(
    server: &Server,
    req: &crate::app_instance_handover::CloseAppInstance,
) {
    let Some(m) = &server.cluster else {
        return;
    };
    let file = nimbus_state::FileKey {
        dev: req.dev,
        ino: req.ino,
        gen: req.gen,
    };
    let me = Owner {
        sid: req.owner_sid.clone(),
        name: String::new(),
    };
    let closed = close_app_instance_opens(
        server,
        file,
        req.app_instance,
        &req.share,
        req.client_guid,
        &me,
    );
    if closed > 0 {
        tracing::info!(
            "{closed} open(s) closed by a CREATE of their AppInstanceId on {}",
            req.reply_to
        );
    }
    let answer = crate::app_instance_handover::encode_answer(req.nonce, closed > 0);
    if let Err(e) = m.post(&req.reply_to, &answer) {
        tracing::warn!(
            "cluster: answering {} about an AppInstanceId: {e}",
            req.reply_to
        );
    }
}
