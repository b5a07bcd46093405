//! FSCTL_DUPLICATE_EXTENTS_TO_FILE (MS-FSCC 2.3.8, MS-FSA 2.1.5.10.7):
//! block cloning. The target's range comes to share the source's extents,
//! a copy that takes neither space nor I/O, where the share's file system
//! can (XFS with reflink, Btrfs: FILE_SUPPORTS_BLOCK_REFCOUNTING is then in
//! the volume's attributes). The rules are those Windows (ReFS) and Samba
//! apply, as smbtorture's dup_extents tests check them: both ranges within
//! their files, no overlap within one file, a sparse source only into a
//! sparse target, and byte-range locks do not hold it up.

use nimbus_wire::fscc::access;
use nimbus_wire::fsctl::DuplicateExtents;
use nimbus_wire::ioctl::IoctlRequest;
use nimbus_wire::NtStatus;

use super::sparse::is_sparse;
use crate::ctx::Ctx;
use crate::errors::vfs_status;
use crate::handlers::write::change_data_past_locks;

pub fn duplicate_extents(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>) -> Result<(), NtStatus> {
    let target = ctx.open(req.file_id)?;
    let fs = target
        .share
        .fs
        .as_ref()
        .ok_or(NtStatus::INVALID_DEVICE_REQUEST)?;
    if !fs.can_clone() {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    let d = DuplicateExtents::parse(req.input).map_err(|_| NtStatus::INVALID_PARAMETER)?;
    // The source is an open of the same session, named by its FileId.
    let source = ctx
        .session()?
        .open(d.source.volatile)
        .filter(|o| o.open_id == d.source.persistent)
        .ok_or(NtStatus::INVALID_HANDLE)?;
    if source.is_dir || target.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if source.access & access::FILE_READ_DATA == 0
        || target.access & (access::FILE_WRITE_DATA | access::FILE_APPEND_DATA) == 0
        || target.share.read_only()
    {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if d.source_offset < 0 || d.target_offset < 0 || d.byte_count < 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let (from, to, len) = (
        d.source_offset as u64,
        d.target_offset as u64,
        d.byte_count as u64,
    );
    if len == 0 {
        return Ok(());
    }
    // Within the files' sizes, and not overlapping within one file. (Files
    // on two file systems, through two shares, cannot share extents: the
    // kernel refuses, NOT_SUPPORTED.)
    let src = source.handle.stat().map_err(|e| vfs_status(&e))?;
    let dst = target.handle.stat().map_err(|e| vfs_status(&e))?;
    let beyond = |off: u64, size: u64| off.checked_add(len).is_none_or(|end| end > size);
    if beyond(from, src.size) || beyond(to, dst.size) {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    if src.dev == dst.dev && src.ino == dst.ino && from < to + len && to < from + len {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    if is_sparse(&source) && !is_sparse(&target) {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    change_data_past_locks(ctx, &target, || {
        target
            .handle
            .clone_from(&source.handle, from, to, len)
            .map_err(|e| vfs_status(&e))
    })
}
