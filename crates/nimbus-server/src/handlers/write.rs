//! MS-SMB2 3.3.5.13 Receiving an SMB2 WRITE Request. The data is written to
//! the file from the received frame: no copy.

use nimbus_wire::create::create_options::WRITE_THROUGH;
use nimbus_wire::fscc::access;
use nimbus_wire::write::{encode_write_response, WriteRequest, WRITEFLAG_WRITE_THROUGH};
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::ctx::{Ctx, HandlerResult};
use crate::errors::vfs_status;
use crate::session::Open;

/// The largest file size NTFS supports (0xFFFFFFF0000); writes that would
/// end beyond it fail as they do on Windows.
pub(super) const MAX_FILE_SIZE: u64 = 0xFFF_FFFF_0000;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = WriteRequest::parse(body).map_err(malformed)?;
    if super::pipe::on_ipc(ctx) {
        return super::pipe::write(ctx, &req, out);
    }
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    if open.access & (access::FILE_WRITE_DATA | access::FILE_APPEND_DATA) == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    check_credit_charge(ctx, req.data.len() as u32)?;
    // Offsets beyond what NTFS allows are refused before any I/O
    // (MS-FSA 2.1.5.3: no append-at-EOF offset over SMB2).
    let end = req.offset.checked_add(req.data.len() as u64);
    if req.offset > i64::MAX as u64
        || (!req.data.is_empty() && end.is_none_or(|e| e > MAX_FILE_SIZE))
    {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let offset = req.offset;
    // A Mac's AfpInfo is written as a whole record (crate::apple::afp_info).
    if crate::apple::open_kind(&open) == Some(crate::apple::AppleStream::AfpInfo) {
        let n = change_data(ctx, &open, 0, req.data.len() as u64, || {
            crate::apple::afp_info::write(&open, offset, req.data)
        })?;
        encode_write_response(out, n as u32);
        return Ok(NtStatus::SUCCESS);
    }
    let n = change_data(ctx, &open, offset, req.data.len() as u64, || {
        let n = write_cached_first(&open.handle, req.data, offset).map_err(|e| vfs_status(&e))?;
        // Written through when the WRITE asks (MS-SMB2 3.3.5.13) or the
        // open was made, or set, write-through (FILE_WRITE_THROUGH, MS-FSA
        // 2.1.5.3): on the disk before it is answered.
        let open_through =
            open.mode.load(std::sync::atomic::Ordering::Relaxed) & WRITE_THROUGH != 0;
        if req.flags & WRITEFLAG_WRITE_THROUGH != 0 || open_through {
            nimbus_state::blocking::off_worker(|| open.handle.sync())
                .map_err(|e| vfs_status(&e))?;
        }
        open.position
            .store(offset + n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    })?;
    open.share.counters.written(n);
    encode_write_response(out, n as u32);
    Ok(NtStatus::SUCCESS)
}

/// Writes `data` at `offset`: into the page cache at once what need not
/// wait, the rest (a write that must wait for the disk or the writeback)
/// off the runtime's worker. A small WRITE runs on the connection's task
/// when its file system lets it (`frames::is_quick` in nimbus-node), so a
/// write to memory costs a plain pwrite and no thread hand-over; on a pool
/// thread `off_worker` just runs.
fn write_cached_first(
    handle: &nimbus_vfs::FileHandle,
    data: &[u8],
    offset: u64,
) -> nimbus_vfs::VfsResult<usize> {
    let (n, short) = handle.write_at_cached(data, offset)?;
    if !short {
        return Ok(n);
    }
    let rest =
        nimbus_state::blocking::off_worker(|| handle.write_at(&data[n..], offset + n as u64))?;
    Ok(n + rest)
}

/// Every change to a file's data goes through here, WRITE or FSCTL (server
/// side copy, zeroing): nothing is written where another open holds any
/// lock, or where a shared lock (its own included) stands (MS-FSA
/// 2.1.5.3); other holders' cached reads go stale (MS-FSA 2.1.4.12); the
/// change is reported when the open closes (`wrote`), not again by the
/// disk watch.
pub(crate) fn change_data<T>(
    ctx: &Ctx<'_>,
    open: &Open,
    offset: u64,
    len: u64,
    write: impl FnOnce() -> Result<T, NtStatus>,
) -> Result<T, NtStatus> {
    if ctx
        .server
        .locks
        .io_conflicts(open.file_key, open.open_id, offset, len, true)
    {
        return Err(NtStatus::FILE_LOCK_CONFLICT);
    }
    change_data_past_locks(ctx, open, write)
}

/// `change_data` without the byte-range lock check: block cloning
/// (FSCTL_DUPLICATE_EXTENTS_TO_FILE) is not held up by locks, on Windows
/// and Samba alike.
pub(super) fn change_data_past_locks<T>(
    ctx: &Ctx<'_>,
    open: &Open,
    write: impl FnOnce() -> Result<T, NtStatus>,
) -> Result<T, NtStatus> {
    ctx.server
        .oplocks
        .contend_readers(open.file_key, open.open_id);
    let own = ctx.server.notify.own_change_of(open);
    // The write time clients see moves later, not with the data.
    ctx.server.write_times.before_write(open);
    let result = write()?;
    drop(own);
    ctx.server.notify.wrote(open);
    if !open.wrote.load(std::sync::atomic::Ordering::Relaxed) {
        open.wrote.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    Ok(result)
}
