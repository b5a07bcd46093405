//! MS-SMB2 3.3.5.10 Receiving an SMB2 CLOSE Request. The release of the
//! open itself, which every way of closing shares, is `crate::release`.
//!
//! The close of a handle that deletes its file waits first for other
//! clients to give up the handles they keep open only for caching (their
//! leases' handle caching), as Samba has since 4.22: a client that deletes
//! a file hears back once the others were told and answered, so the file
//! goes with the last of their handles rather than staying for as long as
//! they cache one (smbtorture smb2.lease.unlink).

use nimbus_wire::close::{CloseRequest, CloseResponse, FLAG_POSTQUERY_ATTRIB};
use nimbus_wire::create::FileTimesAndSizes;
use nimbus_wire::NtStatus;

use std::sync::atomic::Ordering;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::fileinfo::{open_info, times_and_sizes};
use crate::sync::lock;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = CloseRequest::parse(body).map_err(malformed)?;
    if super::pipe::on_ipc(ctx) {
        return super::pipe::close(ctx, &req, out);
    }
    let open = ctx.open(req.file_id)?;
    // Only the first run waits: the run after the breaks ended closes
    // whatever holders came since (their breaks are sent, not awaited).
    if ctx.resumed.is_none() && waits_for_cached_handles(ctx, &open) {
        return super::deferred::defer(ctx, open.file_key, body, handle);
    }
    lock(&ctx.session()?.opens).remove(&open.volatile_id());
    crate::release::release_on_close(ctx.server, &open);
    // After the release: the write time a close sets is in its answer.
    let info = if req.flags & FLAG_POSTQUERY_ATTRIB != 0 {
        match open_info(&open, false) {
            Ok(mut info) => {
                // Another writer's update may still be pending.
                ctx.server.write_times.adjust(open.meta_key(), &mut info);
                times_and_sizes(&info)
            }
            Err(_) => FileTimesAndSizes::default(),
        }
    } else {
        FileTimesAndSizes::default()
    };
    CloseResponse {
        flags: req.flags & FLAG_POSTQUERY_ATTRIB,
        info,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

/// Whether `open` deletes its file when it closes and other leases still
/// cache handles to it: they are told to give handle caching up (MS-FSA
/// 2.1.5.14.3, breaks to R), and the close waits for their answers, or
/// for the break timeout. Breaks that went to disconnected durable
/// handles close them instead: nothing is left to wait for then.
fn waits_for_cached_handles(ctx: &Ctx<'_>, open: &crate::session::Open) -> bool {
    let oplocks = &ctx.server.oplocks;
    open.delete_on_close.load(Ordering::SeqCst)
        && oplocks.contend_handles(open.file_key, open.open_id)
        && oplocks.is_breaking(open.file_key)
}
