//! MS-SMB2 3.3.5.19 Receiving an SMB2 CHANGE_NOTIFY Request: wait for
//! changes beneath an open directory (the watch itself is `crate::notify`).
//! A request that finds changes buffered, or the watch overflowed, is
//! answered at once; otherwise it goes async (interim STATUS_PENDING) until
//! a change, CANCEL, or the close of its handle.

use std::sync::Arc;

use nimbus_wire::fscc::access;
use nimbus_wire::notify::{encode_change_notify_response, ChangeNotifyRequest};
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::ctx::{Ctx, HandlerResult};
use crate::notify::Answer;

/// MS-SMB2 2.2.13.1.2: on a directory, FILE_READ_DATA is FILE_LIST_DIRECTORY.
const FILE_LIST_DIRECTORY: u32 = access::FILE_READ_DATA;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = ChangeNotifyRequest::parse(body).map_err(malformed)?;
    // OutputBufferLength is bounded by MaxTransactSize and paid for in
    // credits like a read (MS-SMB2 3.3.5.2.5, 3.3.5.19).
    check_credit_charge(ctx, req.output_buffer_length)?;
    let open = ctx.open(req.file_id)?;
    if !open.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // MS-FSA 2.1.5.10: watching needs the right to list the directory.
    if open.access & FILE_LIST_DIRECTORY == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    // A directory on its way out has nothing more to report.
    if ctx
        .server
        .share_modes
        .record(open.file_key)
        .is_ok_and(|r| r.delete_pending)
    {
        return Err(NtStatus::DELETE_PENDING);
    }
    // Whose watch it is: it reports only what this session could list
    // (crate::notify).
    let token = ctx
        .session()?
        .token()
        .ok_or(NtStatus::USER_SESSION_DELETED)?;
    let server = ctx.server.clone();
    let open_id = open.open_id;
    // Only the last request of a compound may go async: one before it
    // fails with STATUS_INTERNAL_ERROR instead, as on Windows (MS-SMB2
    // 3.3.5.2.7 note; smbtorture smb2.compound.interim2).
    let last_in_compound = ctx.hdr.next_command == 0;
    let mut wait = || {
        if !last_in_compound {
            return Err(NtStatus::INTERNAL_ERROR);
        }
        let server = server.clone();
        ctx.go_async(move |request: &Arc<_>| {
            let request = Arc::downgrade(request);
            Box::new(move |status| {
                if let Some(request) = request.upgrade() {
                    // Only a request still on its watch is answered here;
                    // one the watch already took is being answered with
                    // its changes.
                    if server.notify.withdraw(open_id, request.async_id()) {
                        request.complete(status, |out| encode_change_notify_response(out, &[]));
                    }
                }
            })
        })
        .ok_or(NtStatus::INSUFFICIENT_RESOURCES)
    };
    let answer = server.notify.request(
        &|open_id| server.opens.contains(open_id),
        &open,
        token,
        req.completion_filter,
        req.watch_tree(),
        req.output_buffer_length as usize,
        &mut wait,
    )?;
    match answer {
        Answer::Now(status, data) => {
            encode_change_notify_response(out, &data);
            Ok(status)
        }
        Answer::Waiting => {
            // The directory may have become delete-pending while this
            // request was being set up (the close that would have ended it
            // found no request waiting yet): it ends now, after its
            // interim response.
            server
                .notify
                .still_open(&|key| server.delete_pending(key), &open);
            Ok(NtStatus::PENDING)
        }
    }
}
