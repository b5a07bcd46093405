//! MS-SMB2 3.3.5.10 Receiving an SMB2 CLOSE Request. The release of the
//! open itself, which every way of closing shares, is `crate::release`.
//!
//! The CLOSE of a handle opened delete-on-close is answered only once the
//! other clients gave up the handles they keep open for caching (their
//! leases' handle caching, broken to R), or after the break timeout, as
//! Samba has since 4.22: a client that deleted a file hears back once the
//! others were told and answered (smbtorture smb2.lease.unlink, whose
//! break otherwise raced the answer when it crossed nodes through etcd).
//! Unlike Samba, the handle is closed before the wait, not after it: a
//! CANCEL, a logoff or a full queue of pending requests then only answers
//! sooner, and never leaves the open behind.

use std::sync::Arc;
use std::time::Instant;

use nimbus_state::FileKey;
use nimbus_wire::close::{CloseRequest, CloseResponse, FLAG_POSTQUERY_ATTRIB};
use nimbus_wire::create::FileTimesAndSizes;
use nimbus_wire::NtStatus;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::fileinfo::{open_info, times_and_sizes};
use crate::pending::PendingRequest;
use crate::server::Server;
use crate::sync::lock;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = CloseRequest::parse(body).map_err(malformed)?;
    if super::pipe::on_ipc(ctx) {
        return super::pipe::close(ctx, &req, out);
    }
    let open = ctx.open(req.file_id)?;
    lock(&ctx.session()?.opens).remove(&open.volatile_id());
    let others_cache = crate::release::release_on_close(ctx.server, &open);
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
    let body_at = out.len();
    CloseResponse {
        flags: req.flags & FLAG_POSTQUERY_ATTRIB,
        info,
    }
    .encode(out);
    if others_cache && ctx.server.oplocks.is_breaking(open.file_key) {
        let answer = out[body_at..].to_vec();
        if answer_once_handles_go(ctx, open.file_key, answer) {
            return Ok(NtStatus::PENDING);
        }
    }
    Ok(NtStatus::SUCCESS)
}

/// Goes async and answers with the CLOSE response body `answer` once
/// nothing on `file` is breaking any more, or the break timeout after the
/// request arrived. False: no room for another pending request; the CLOSE
/// is answered now.
fn answer_once_handles_go(ctx: &mut Ctx<'_>, file: FileKey, answer: Vec<u8>) -> bool {
    let server = ctx.server.clone();
    let answer = Arc::new(answer);
    let (early, early_server) = (answer.clone(), server.clone());
    let request = ctx.go_async(move |request: &Arc<PendingRequest>| {
        let request = Arc::downgrade(request);
        // CANCEL, logoff and disconnect: the handle is closed already;
        // the CLOSE is answered as done.
        Box::new(move |_status| {
            if let Some(request) = request.upgrade() {
                early_server.oplocks.withdraw(file, request.async_id());
                request.complete(NtStatus::SUCCESS, |o| o.extend_from_slice(&early));
            }
        })
    });
    let Some(request) = request else {
        return false;
    };
    let deadline = ctx.started + server.oplocks.break_timeout();
    wait_then_answer(server, file, request, answer, deadline);
    true
}

/// Waits (with the file's other waiting requests) until nothing on `file`
/// breaks: the wait ends whenever one break ends, so the file is looked at
/// again until all have, or `deadline` passed.
fn wait_then_answer(
    server: Arc<Server>,
    file: FileKey,
    request: Arc<PendingRequest>,
    answer: Arc<Vec<u8>>,
    deadline: Instant,
) {
    let async_id = request.async_id();
    let waits_on = server.clone();
    waits_on.oplocks.wait(
        file,
        async_id,
        Box::new(move || {
            if request.is_done() {
                return;
            }
            if Instant::now() < deadline && server.oplocks.is_breaking(file) {
                return wait_then_answer(server, file, request, answer, deadline);
            }
            request.complete(NtStatus::SUCCESS, |o| o.extend_from_slice(&answer));
        }),
    );
}
