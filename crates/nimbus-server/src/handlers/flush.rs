//! MS-SMB2 3.3.5.11 Receiving an SMB2 FLUSH Request.

use nimbus_wire::close::FlushRequest;
use nimbus_wire::fscc::access;
use nimbus_wire::simple::encode_empty;
use nimbus_wire::NtStatus;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::errors::vfs_status;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = FlushRequest::parse(body).map_err(malformed)?;
    let open = ctx.open(req.file_id)?;
    if !open.is_dir && open.access & (access::FILE_WRITE_DATA | access::FILE_APPEND_DATA) == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    // Acknowledged data must survive a crash once FLUSH succeeds.
    open.handle.sync().map_err(|e| vfs_status(&e))?;
    // A pending write-time update is made too.
    ctx.server.write_times.flush(&open);
    encode_empty(out);
    Ok(NtStatus::SUCCESS)
}
