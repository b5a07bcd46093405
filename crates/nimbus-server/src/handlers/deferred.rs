//! Requests that wait for other clients' breaks (MS-SMB2 3.3.4.6-7): a
//! CREATE that needs another client's write or handle caching gone, a
//! rename that needs other holders to close the handles they keep cached.
//! The request is answered STATUS_PENDING, parked with the file's
//! oplocks, and run again from the start by its own handler when the
//! breaks are acknowledged, time out, or their holders close. CANCEL,
//! logoff and disconnect take it out of the queue.

use std::sync::Arc;

use nimbus_state::FileKey;
use nimbus_wire::header::{Command, Header};
use nimbus_wire::NtStatus;

use crate::connection::Connection;
use crate::ctx::{Ctx, HandlerResult};
use crate::pending::PendingRequest;
use crate::security::SessionCipher;
use crate::session::{Session, SigningKey, Tree};
use crate::sync::lock;

pub type Handler = fn(&mut Ctx<'_>, &[u8], &mut Vec<u8>) -> HandlerResult;

/// Parks the request being handled until the breaks on `file` end; it is
/// answered STATUS_PENDING now (or stays pending, if it already was), and
/// `handler` runs it again with `body` later.
pub fn defer(
    ctx: &mut Ctx<'_>,
    file: FileKey,
    body: &[u8],
    handler: Handler,
) -> Result<NtStatus, NtStatus> {
    let server = ctx.server.clone();
    let waits_on = server.clone();
    park(
        ctx,
        body,
        handler,
        move |async_id| server.oplocks.withdraw(file, async_id),
        move |async_id, resume| waits_on.oplocks.wait(file, async_id, resume),
    )
}

/// Parks the request being handled until whatever `wait` hands its
/// resumption to calls it: it is answered STATUS_PENDING now (or stays
/// pending, if it already was), and `handler` runs it again with `body`
/// then. `withdraw` takes the resumption back when the request is
/// cancelled (CANCEL, logoff, disconnect).
pub fn park(
    ctx: &mut Ctx<'_>,
    body: &[u8],
    handler: Handler,
    withdraw: impl Fn(u64) + Send + Sync + 'static,
    wait: impl FnOnce(u64, Box<dyn FnOnce() + Send>),
) -> Result<NtStatus, NtStatus> {
    let request = match ctx.resumed.clone() {
        Some(r) => r,
        None => ctx
            .go_async(move |request: &Arc<PendingRequest>| {
                let request = Arc::downgrade(request);
                Box::new(move |status| {
                    if let Some(request) = request.upgrade() {
                        withdraw(request.async_id());
                        request.complete(status, |_| {});
                    }
                })
            })
            .ok_or(NtStatus::INSUFFICIENT_RESOURCES)?,
    };
    let resume = Resume {
        conn: ctx.conn.clone(),
        hdr: ctx.hdr.clone(),
        session: ctx.session()?.clone(),
        tree: ctx.tree()?.clone(),
        chain_file_id: ctx.chain_file_id,
        related: ctx.related,
        signed_by: ctx.signed_by.clone(),
        sealed_by: ctx.sealed_by.clone(),
        body: body.to_vec(),
        handler,
        request: request.clone(),
    };
    wait(request.async_id(), Box::new(move || resume.run()));
    Ok(NtStatus::PENDING)
}

/// A request that waited, ready to run again.
struct Resume {
    conn: Arc<Connection>,
    hdr: Header,
    session: Arc<Session>,
    tree: Arc<Tree>,
    /// The FileId a compound chain handed this request (its FileId may be
    /// the "use the previous one" value).
    chain_file_id: Option<nimbus_wire::FileId>,
    related: bool,
    signed_by: Option<SigningKey>,
    sealed_by: Option<(u64, Arc<SessionCipher>)>,
    body: Vec<u8>,
    handler: Handler,
    request: Arc<PendingRequest>,
}

impl Resume {
    fn run(self) {
        if self.request.is_done() || !self.session.is_valid() || self.session.has_ended() {
            return;
        }
        // Its connection lost, a request of a session that lives on other
        // channels still runs (MS-SMB2 3.3.7.1); its answer goes nowhere,
        // and the client's replay on another channel finds what it did.
        if self.conn.is_closing() && self.session.connections().iter().all(|c| c.is_closing()) {
            return;
        }
        let server = self.conn.server.clone();
        let mut ctx = Ctx {
            conn: &self.conn,
            server: &server,
            hdr: &self.hdr,
            msg: &[],
            session: Some(self.session.clone()),
            tree: Some(self.tree.clone()),
            chain_file_id: self.chain_file_id,
            related: self.related,
            response_session_id: self.hdr.session_id,
            response_tree_id: None,
            sign_with: None,
            preauth_session: None,
            disconnect: false,
            error_data: Vec::new(),
            response_room: RESUMED_RESPONSE_ROOM,
            signed_by: self.signed_by.clone(),
            sealed_by: self.sealed_by.clone(),
            went_async: None,
            interim: None,
            resumed: Some(self.request.clone()),
            on_sent: Vec::new(),
            started: self.request.started(),
        };
        let mut out = Vec::new();
        let opens_a_file = self.hdr.command == Command::Create as u16;
        match (self.handler)(&mut ctx, &self.body, &mut out) {
            Ok(NtStatus::PENDING) => {}
            Ok(status) => {
                let opened = ctx.chain_file_id.filter(|_| opens_a_file);
                if let Some(id) = opened {
                    self.request.set_file_id(id);
                }
                if self.request.complete(status, |o| o.extend_from_slice(&out)) {
                    // Queued for the writer: as good as sent for what
                    // waits on it (the final response goes out next).
                    for f in std::mem::take(&mut ctx.on_sent) {
                        f();
                    }
                } else {
                    // Cancelled while it ran: the open it made is not the
                    // client's; close it again.
                    if let Some(id) = opened {
                        let removed = lock(&self.session.opens).remove(&id.volatile);
                        if let Some(open) = removed {
                            crate::release::release(&server, &open);
                        }
                    }
                }
            }
            Err(status) => {
                self.request.complete(status, |_| {});
            }
        }
    }
}

/// Room for the final response of a resumed request (a CREATE's contexts
/// are few and small; a SET_INFO answers with no data).
const RESUMED_RESPONSE_ROOM: usize = 64 * 1024;
