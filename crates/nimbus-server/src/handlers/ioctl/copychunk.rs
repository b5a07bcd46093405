//! Server-side copy (MS-SMB2 3.3.5.15.5, 3.3.5.15.6): the client asks for a
//! resume key naming the source open, then sends FSCTL_SRV_COPYCHUNK (or
//! _WRITE) on the target open with the ranges to copy. The data moves
//! inside the server with copy_file_range (extents are shared where the
//! file system can), never over the wire: Explorer and Finder copy within a
//! share this way.

use std::sync::Arc;

use nimbus_wire::fscc::access;
use nimbus_wire::fsctl::{
    encode_resume_key_response, CopyChunkCopy, CopyChunkResponse, RESUME_KEY_LEN,
    RESUME_KEY_RESPONSE_LEN,
};
use nimbus_wire::ioctl::{ctl_code, encode_ioctl_response, IoctlRequest};
use nimbus_wire::NtStatus;

use crate::ctx::{Ctx, HandlerResult};
use crate::errors::vfs_status;
use crate::handlers::write::{change_data, MAX_FILE_SIZE};
use crate::session::Open;

/// MS-SMB2 3.3.1.5 ServerSideCopyMaxNumberofChunks, ServerSideCopyMaxChunkSize
/// and ServerSideCopyMaxDataSize, as Windows sets them: a client learns them
/// from a refused request and splits its copies to fit.
pub const MAX_CHUNKS: u32 = 256;
pub const MAX_CHUNK_SIZE: u32 = 1 << 20;
pub const MAX_DATA_SIZE: u32 = 16 << 20;

/// The last 8 bytes of every resume key. A key names an open by its FileId
/// and is looked up among the opens of the session presenting it only, so a
/// key is no capability: another session's key, or a made-up one, names
/// nothing it could not already use.
const KEY_TAG: [u8; 8] = *b"nimbusRK";

fn resume_key(open: &Open) -> [u8; RESUME_KEY_LEN] {
    let mut key = [0u8; RESUME_KEY_LEN];
    key[..8].copy_from_slice(&open.open_id.to_le_bytes());
    key[8..16].copy_from_slice(&open.volatile_id().to_le_bytes());
    key[16..].copy_from_slice(&KEY_TAG);
    key
}

/// The open a resume key names, in the requesting session (any of its tree
/// connects: smbtorture copy_chunk_across_shares).
fn source_of(ctx: &Ctx<'_>, key: &[u8; RESUME_KEY_LEN]) -> Option<Arc<Open>> {
    if key[16..] != KEY_TAG {
        return None;
    }
    let persistent = u64::from_le_bytes(key[..8].try_into().ok()?);
    let volatile = u64::from_le_bytes(key[8..16].try_into().ok()?);
    let open = ctx.session.as_ref()?.open(volatile)?;
    (open.open_id == persistent).then_some(open)
}

/// FSCTL_SRV_REQUEST_RESUME_KEY: any open of a file may be a source (the
/// access to read is checked when it is used).
pub fn request_resume_key(
    ctx: &mut Ctx<'_>,
    req: &IoctlRequest<'_>,
    output: &mut Vec<u8>,
) -> Result<(), NtStatus> {
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    if (req.max_output_response as usize) < RESUME_KEY_RESPONSE_LEN {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    encode_resume_key_response(output, &resume_key(&open));
    Ok(())
}

/// FSCTL_SRV_COPYCHUNK and FSCTL_SRV_COPYCHUNK_WRITE. Failures after the
/// request was understood still carry a SRV_COPYCHUNK_RESPONSE: the limits
/// for a request over them, the progress made for a copy that stopped.
pub fn copy_chunk(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>, out: &mut Vec<u8>) -> HandlerResult {
    let target = ctx.open(req.file_id)?;
    let reply = |out: &mut Vec<u8>, r: CopyChunkResponse, status: NtStatus| {
        let mut body = Vec::with_capacity(CopyChunkResponse::LEN);
        r.encode(&mut body);
        encode_ioctl_response(out, req.ctl_code, req.file_id, &body);
        Ok(status)
    };
    let limits = CopyChunkResponse {
        chunks_written: MAX_CHUNKS,
        chunk_bytes_written: MAX_CHUNK_SIZE,
        total_bytes_written: MAX_DATA_SIZE,
    };
    let room_for_reply = req.max_output_response as usize >= CopyChunkResponse::LEN;
    let Ok(copy) = CopyChunkCopy::parse(req.input) else {
        if !room_for_reply {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        return reply(out, limits, NtStatus::INVALID_PARAMETER);
    };
    let source = source_of(ctx, &copy.source_key).ok_or(NtStatus::OBJECT_NAME_NOT_FOUND)?;
    if !room_for_reply {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if !within_limits(&copy) {
        return reply(out, limits, NtStatus::INVALID_PARAMETER);
    }
    check_access(req.ctl_code, &source, &target)?;
    // A Mac's whole-file copy (`super::copyfile`).
    if copy.chunk_count == 0 && ctx.conn.apple.copyfile(&target.share) {
        return match super::copyfile::copy_whole(ctx, &source, &target) {
            Ok(n) => {
                let total = CopyChunkResponse {
                    total_bytes_written: n.min(u64::from(u32::MAX)) as u32,
                    ..CopyChunkResponse::default()
                };
                reply(out, total, NtStatus::SUCCESS)
            }
            Err(status) => reply(out, CopyChunkResponse::default(), status),
        };
    }

    let mut done = CopyChunkResponse::default();
    for chunk in copy.chunks() {
        let len = u64::from(chunk.length);
        let status = match copy_one(
            ctx,
            &source,
            &target,
            chunk.source_offset,
            chunk.target_offset,
            len,
        ) {
            Ok(n) if n == len => None,
            // The source shrank while the chunk was copied.
            Ok(n) => {
                done.chunk_bytes_written = n as u32;
                done.total_bytes_written += n as u32;
                Some(NtStatus::INVALID_VIEW_SIZE)
            }
            Err(status) => Some(status),
        };
        if let Some(status) = status {
            return reply(out, done, status);
        }
        done.chunks_written += 1;
        done.total_bytes_written += chunk.length;
    }
    reply(out, done, NtStatus::SUCCESS)
}

/// MS-SMB2 3.3.5.15.6: every chunk present, none empty or over the chunk
/// size, no more of them than the limit, and not more data in all.
fn within_limits(copy: &CopyChunkCopy<'_>) -> bool {
    if copy.chunk_count > MAX_CHUNKS || !copy.has_all_chunks() {
        return false;
    }
    let mut total = 0u64;
    for c in copy.chunks() {
        if c.length == 0 || c.length > MAX_CHUNK_SIZE {
            return false;
        }
        total += u64::from(c.length);
    }
    total <= u64::from(MAX_DATA_SIZE)
}

/// The source is read (READ_DATA or EXECUTE), the target written
/// (WRITE_DATA or APPEND_DATA); FSCTL_SRV_COPYCHUNK, unlike _WRITE, also
/// needs the target readable (MS-SMB2 3.3.5.15.6).
fn check_access(ctl: u32, source: &Open, target: &Open) -> Result<(), NtStatus> {
    if source.is_dir || target.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    let readable = |o: &Open| o.access & (access::FILE_READ_DATA | access::FILE_EXECUTE) != 0;
    if !readable(source)
        || target.access & (access::FILE_WRITE_DATA | access::FILE_APPEND_DATA) == 0
        || (ctl == ctl_code::FSCTL_SRV_COPYCHUNK && target.access & access::FILE_READ_DATA == 0)
        || target.share.read_only()
    {
        return Err(NtStatus::ACCESS_DENIED);
    }
    Ok(())
}

/// One chunk: within the source's size (else STATUS_INVALID_VIEW_SIZE, as
/// from Windows), not where another open holds a lock on either side (the
/// copy reads and writes like READ and WRITE do). Returns the bytes copied.
fn copy_one(
    ctx: &Ctx<'_>,
    source: &Open,
    target: &Open,
    src_offset: u64,
    dst_offset: u64,
    len: u64,
) -> Result<u64, NtStatus> {
    let size = source.handle.stat().map_err(|e| vfs_status(&e))?.size;
    if src_offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(NtStatus::INVALID_VIEW_SIZE);
    }
    if dst_offset
        .checked_add(len)
        .is_none_or(|end| end > MAX_FILE_SIZE)
    {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if ctx
        .server
        .locks
        .io_conflicts(source.file_key, source.open_id, src_offset, len, false)
    {
        return Err(NtStatus::FILE_LOCK_CONFLICT);
    }
    change_data(ctx, target, dst_offset, len, || {
        target
            .handle
            .copy_from(&source.handle, src_offset, dst_offset, len)
            .map_err(|e| vfs_status(&e))
    })
}
