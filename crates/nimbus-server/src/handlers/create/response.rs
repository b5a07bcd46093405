//! CREATE, stage 6: the open joins its session, and the answer goes out
//! with its contexts (MS-SMB2 3.3.5.9, 2.2.14).

use std::sync::Arc;

use nimbus_wire::create::{CreateContext, CreateResponse};
use nimbus_wire::NtStatus;

use super::super::create_durable;
use super::finish::Finished;
use super::request::Create;
use crate::ctx::Ctx;
use crate::session::{Open, Session};

/// Answers `c` with the open `fin` made.
pub fn answer(
    ctx: &mut Ctx<'_>,
    c: Create<'_>,
    fin: Finished,
    out: &mut Vec<u8>,
) -> Result<NtStatus, NtStatus> {
    let Finished {
        open,
        file_id,
        create_action,
        info,
        contexts,
        caching: granted_caching,
    } = fin;
    let (aapl_reply, durable, session, req) = (c.aapl_reply, c.durable, c.session, &c.req);
    let mut contexts = contexts;
    contexts.extend(aapl_reply.map(|data| CreateContext {
        name: nimbus_wire::apple::CONTEXT_NAME.to_vec(),
        data,
    }));
    let (oplock_level, lease) =
        super::super::create_caching::caching_response(&req.contexts, &granted_caching);
    contexts.extend(lease);
    // Opens of named streams are not made durable: a reconnect, a restart
    // or another cluster node reopens a file by its name alone.
    if open.stream.is_none() {
        contexts.extend(create_durable::grant(
            ctx,
            &open,
            &durable,
            &granted_caching,
        ));
    }
    join_session(ctx.server, session, &open)?;
    ctx.chain_file_id = Some(file_id);
    CreateResponse {
        oplock_level,
        create_action,
        info,
        file_id,
        contexts,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

/// Puts a new open in its session, last: until then the end of the
/// session (its last channel lost, a LOGOFF on another) cannot find it
/// half made, its caching granted after the session let its opens go and
/// its breaks routed to a connection that is gone (a break nobody could
/// acknowledge held the next CREATE of its file for the whole break
/// timeout). A session that ended meanwhile gets what its end would have
/// done to the open: kept for a reconnect if durable, closed otherwise.
/// Its CreateGuid names it only once it is in the session: a replay on
/// another channel that finds it looks for it there (until then the
/// replay is told FILE_NOT_AVAILABLE, as while the CREATE waited).
fn join_session(
    server: &crate::server::Server,
    session: &Session,
    open: &Arc<Open>,
) -> Result<(), NtStatus> {
    let joined = session.add_open(open);
    // Opens of named streams are not made durable (see `answer`).
    if open.stream.is_none() {
        server.durables.name_open(open);
        // Released meanwhile (the session's end took it, and it was not
        // durable): its name goes too, as its release took it before.
        if !server.opens.contains(open.open_id) {
            server.durables.closed(open);
        }
    }
    if joined {
        return Ok(());
    }
    crate::disconnected::keep_or_close(server, open);
    if open.share.is_removed() {
        return Err(NtStatus::NETWORK_NAME_DELETED);
    }
    Err(NtStatus::USER_SESSION_DELETED)
}
