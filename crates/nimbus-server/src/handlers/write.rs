//! MS-SMB2 3.3.5.13 Receiving an SMB2 WRITE Request. The data is written to
//! the file from the received frame: no copy.

use nimbus_wire::fscc::access;
use nimbus_wire::write::{encode_write_response, WriteRequest, WRITEFLAG_WRITE_THROUGH};
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::dispatch::{Ctx, HandlerResult};
use crate::errors::vfs_status;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = WriteRequest::parse(body).map_err(malformed)?;
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    if open.access & (access::FILE_WRITE_DATA | access::FILE_APPEND_DATA) == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    check_credit_charge(ctx, req.data.len() as u32)?;
    // An offset of all ones means "at the end of file" (MS-FSA 2.1.5.3).
    let offset = if req.offset == u64::MAX {
        open.handle.stat().map_err(|e| vfs_status(&e))?.size
    } else {
        req.offset
    };
    if offset.checked_add(req.data.len() as u64).is_none_or(|end| end > i64::MAX as u64) {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let n = open.handle.write_at(req.data, offset).map_err(|e| vfs_status(&e))?;
    if req.flags & WRITEFLAG_WRITE_THROUGH != 0 {
        open.handle.sync().map_err(|e| vfs_status(&e))?;
    }
    encode_write_response(out, n as u32);
    Ok(NtStatus::SUCCESS)
}
