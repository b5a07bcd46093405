//! MS-SMB2 3.3.5.10 Receiving an SMB2 CLOSE Request. The release of the
//! open itself, which every way of closing shares, is `crate::release`.

use nimbus_wire::close::{CloseRequest, CloseResponse, FLAG_POSTQUERY_ATTRIB};
use nimbus_wire::create::FileTimesAndSizes;
use nimbus_wire::NtStatus;

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
