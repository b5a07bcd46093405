//! MS-SMB2 3.3.5.12 Receiving an SMB2 READ Request. The file is read
//! straight into the response buffer after the 16-byte READ body: no copy.

use nimbus_wire::fscc::access;
use nimbus_wire::read::{encode_read_response_head, ReadRequest};
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::ctx::{Ctx, HandlerResult};
use crate::errors::vfs_status;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = ReadRequest::parse(body).map_err(malformed)?;
    if super::pipe::on_ipc(ctx) {
        return super::pipe::read(ctx, &req, out);
    }
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    if open.access & (access::FILE_READ_DATA | access::FILE_EXECUTE) == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    check_credit_charge(ctx, req.length)?;
    if req
        .offset
        .checked_add(req.length as u64)
        .is_none_or(|end| end > i64::MAX as u64)
    {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // MS-FSA 2.1.5.2: a range another open holds exclusively is not read.
    let locks = &ctx.server.locks;
    if locks.io_conflicts(
        open.file_key,
        open.open_id,
        req.offset,
        req.length as u64,
        false,
    ) {
        return Err(NtStatus::FILE_LOCK_CONFLICT);
    }
    let head = out.len();
    encode_read_response_head(out, 0);
    // A Mac's AfpInfo is read as a whole record (crate::apple::afp_info).
    if crate::apple::open_kind(&open) == Some(crate::apple::AppleStream::AfpInfo) {
        let data = crate::apple::afp_info::read(&open, req.offset, req.length)?;
        if (data.is_empty() && req.length > 0) || data.len() < req.minimum_count as usize {
            out.truncate(head);
            return Err(NtStatus::END_OF_FILE);
        }
        out.extend_from_slice(&data);
        out[head + 4..head + 8].copy_from_slice(&(data.len() as u32).to_le_bytes());
        return Ok(NtStatus::SUCCESS);
    }
    let n = match read_cached_first(&open.handle, out, req.length as usize, req.offset) {
        Ok(n) => n,
        Err(e) => {
            out.truncate(head);
            return Err(vfs_status(&e));
        }
    };
    if (n == 0 && req.length > 0) || (n as u64) < req.minimum_count as u64 {
        out.truncate(head);
        return Err(NtStatus::END_OF_FILE);
    }
    out[head + 4..head + 8].copy_from_slice(&(n as u32).to_le_bytes());
    // Samba, like Windows for synchronous opens, reports the byte after the
    // last read as FilePositionInformation.
    open.position
        .store(req.offset + n as u64, std::sync::atomic::Ordering::Relaxed);
    open.share.counters.read(n);
    Ok(NtStatus::SUCCESS)
}

/// Reads `len` bytes at `offset` onto `out`: what the page cache holds at
/// once, the rest (a read that would wait for the disk) off the runtime's
/// worker. A small READ runs on the connection's task
/// (`frames::is_quick` in nimbus-node), so a cached one costs a plain pread and
/// no thread hand-over; one that must wait lets the worker's other tasks
/// move to another thread meanwhile (`nimbus_state::blocking`).
fn read_cached_first(
    handle: &nimbus_vfs::FileHandle,
    out: &mut Vec<u8>,
    len: usize,
    offset: u64,
) -> nimbus_vfs::VfsResult<usize> {
    let (n, short) = handle.read_append_cached(out, len, offset)?;
    if !short {
        return Ok(n);
    }
    let rest =
        nimbus_state::blocking::off_worker(|| handle.read_append(out, len - n, offset + n as u64))?;
    Ok(n + rest)
}
