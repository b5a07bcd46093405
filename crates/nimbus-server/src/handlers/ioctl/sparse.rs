//! Sparse files (MS-FSA 2.1.5.10: FSCTL_SET_SPARSE, FSCTL_SET_ZERO_DATA,
//! FSCTL_QUERY_ALLOCATED_RANGES) and compression, which the file systems
//! Nimbus serves from do not offer per file: it is answered as Windows
//! answers on a volume without it.
//!
//! The sparse flag is the file's FILE_ATTRIBUTE_SPARSE_FILE, kept with its
//! other DOS attributes. It decides what zeroing does (a sparse file's
//! range is deallocated, a hole punched; another file's is written with
//! zeros and stays allocated) and what the allocated ranges are (a sparse
//! file's from SEEK_DATA/SEEK_HOLE; another file is allocated throughout,
//! as Windows reports it).

use nimbus_wire::fscc::{access, attributes};
use nimbus_wire::fsctl::{
    compression, parse_compression_state, set_sparse_requested, AllocatedRange, ZeroDataInformation,
};
use nimbus_wire::ioctl::IoctlRequest;
use nimbus_wire::notify::completion_filter as cf;
use nimbus_wire::NtStatus;

use crate::ctx::Ctx;
use crate::dosinfo::DosInfo;
use crate::errors::vfs_status;
use crate::handlers::require;
use crate::handlers::write::change_data;
use crate::session::Open;

pub(super) fn is_sparse(open: &Open) -> bool {
    DosInfo::load(&open.handle).stored_or_default(false) & attributes::SPARSE_FILE != 0
}

/// FSCTL_SET_SPARSE: any of WRITE_DATA, APPEND_DATA or WRITE_ATTRIBUTES
/// allows it (smbtorture sparse_perms); directories cannot be sparse.
/// Clearing the flag leaves the file's holes as they are: they read as
/// zeros either way, and the file reports itself allocated throughout from
/// then on.
pub fn set_sparse(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>) -> Result<(), NtStatus> {
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    require(
        &open,
        access::FILE_WRITE_DATA | access::FILE_APPEND_DATA | access::FILE_WRITE_ATTRIBUTES,
    )?;
    if open.share.read_only() {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let mut dos = DosInfo::load(&open.handle);
    let before = dos.stored_or_default(false);
    let after = if set_sparse_requested(req.input) {
        before | attributes::SPARSE_FILE
    } else {
        before & !attributes::SPARSE_FILE
    };
    if after == before {
        return Ok(());
    }
    dos.attributes = Some(after);
    dos.save(&open.handle).map_err(|e| vfs_status(&e))?;
    ctx.server.notify.modified(&open, cf::ATTRIBUTES);
    crate::dir_leases::open_changed(&ctx.server.oplocks, &open);
    Ok(())
}

/// FSCTL_SET_ZERO_DATA: needs WRITE_DATA. Only the part before end of file
/// is zeroed; the size never changes (MS-FSA 2.1.5.10.39).
pub fn set_zero_data(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>) -> Result<(), NtStatus> {
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    require(&open, access::FILE_WRITE_DATA)?;
    if open.share.read_only() {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let z = ZeroDataInformation::parse(req.input).map_err(|_| NtStatus::INVALID_PARAMETER)?;
    if z.file_offset < 0 || z.beyond_final_zero < 0 || z.file_offset > z.beyond_final_zero {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let (start, end) = (z.file_offset as u64, z.beyond_final_zero as u64);
    let size = open.handle.stat().map_err(|e| vfs_status(&e))?.size;
    let end = end.min(size);
    if start >= end {
        return Ok(());
    }
    let sparse = is_sparse(&open);
    change_data(ctx, &open, start, end - start, || {
        let r = if sparse {
            open.handle.punch_hole(start, end - start)
        } else {
            open.handle.zero_range(start, end - start)
        };
        r.map_err(|e| vfs_status(&e))
    })
}

/// FSCTL_QUERY_ALLOCATED_RANGES: needs READ_DATA. The ranges are clipped to
/// the range asked about and to end of file; an output buffer too small
/// for all of them gets those that fit and STATUS_BUFFER_OVERFLOW, too
/// small for one STATUS_BUFFER_TOO_SMALL.
pub fn query_allocated_ranges(
    ctx: &mut Ctx<'_>,
    req: &IoctlRequest<'_>,
    output: &mut Vec<u8>,
) -> Result<NtStatus, NtStatus> {
    let open = ctx.open(req.file_id)?;
    if open.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    require(&open, access::FILE_READ_DATA)?;
    let q = AllocatedRange::parse(req.input).map_err(|_| NtStatus::INVALID_PARAMETER)?;
    if q.file_offset < 0 || q.length < 0 || q.file_offset.checked_add(q.length).is_none() {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let start = q.file_offset as u64;
    let size = open.handle.stat().map_err(|e| vfs_status(&e))?.size;
    let end = (start + q.length as u64).min(size);
    if start >= end {
        return Ok(NtStatus::SUCCESS);
    }
    let room = req.max_output_response as usize / AllocatedRange::LEN;
    let (ranges, more) = if is_sparse(&open) {
        open.handle
            .data_ranges(start, end, room)
            .map_err(|e| vfs_status(&e))?
    } else if room == 0 {
        (Vec::new(), true)
    } else {
        (vec![(start, end - start)], false)
    };
    if more && ranges.is_empty() {
        return Err(NtStatus::BUFFER_TOO_SMALL);
    }
    for (offset, length) in ranges {
        AllocatedRange {
            file_offset: offset as i64,
            length: length as i64,
        }
        .encode(output);
    }
    Ok(if more {
        NtStatus::BUFFER_OVERFLOW
    } else {
        NtStatus::SUCCESS
    })
}

/// FSCTL_GET_COMPRESSION: nothing is compressed (smbtorture
/// compress_notsup_get, as Windows Server 2016 answers).
pub fn get_compression(
    ctx: &mut Ctx<'_>,
    req: &IoctlRequest<'_>,
    output: &mut Vec<u8>,
) -> Result<(), NtStatus> {
    ctx.open(req.file_id)?;
    if req.max_output_response < 2 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    output.extend_from_slice(&compression::NONE.to_le_bytes());
    Ok(())
}

/// FSCTL_SET_COMPRESSION: "not compressed" is what every file already is;
/// compressing is not supported (compress_notsup_set, like ReFS).
pub fn set_compression(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>) -> Result<(), NtStatus> {
    ctx.open(req.file_id)?;
    match parse_compression_state(req.input).map_err(|_| NtStatus::INVALID_PARAMETER)? {
        compression::NONE => Ok(()),
        compression::DEFAULT | compression::LZNT1 => Err(NtStatus::NOT_SUPPORTED),
        _ => Err(NtStatus::INVALID_PARAMETER),
    }
}
