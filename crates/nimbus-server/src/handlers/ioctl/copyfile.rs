//! SUPPORTS_OSX_COPYFILE: a Mac copies a file within a share by sending
//! FSCTL_SRV_COPYCHUNK without any chunk; the server copies the whole
//! file, its named streams too (Finder information, resource fork,
//! extended attributes), in one request, and reports the data's size.

use nimbus_vfs::CreateMode;
use nimbus_wire::NtStatus;

use crate::apple::{file_options, stream_listed, AppleState};
use crate::ctx::Ctx;
use crate::errors::vfs_status;
use crate::handlers::write::change_data;
use crate::session::Open;

/// Copies `source` whole over `target` (which ends as long as the source)
/// and, when both are files rather than streams, every named stream the
/// source lists to a stream of the same name of the target. Returns the
/// bytes of data copied.
pub fn copy_whole(ctx: &Ctx<'_>, source: &Open, target: &Open) -> Result<u64, NtStatus> {
    let vfs = |e: nimbus_vfs::VfsError| vfs_status(&e);
    let size = source.handle.stat().map_err(vfs)?.size;
    if ctx
        .server
        .locks
        .io_conflicts(source.file_key, source.open_id, 0, size, false)
    {
        return Err(NtStatus::FILE_LOCK_CONFLICT);
    }
    change_data(ctx, target, 0, size.max(1), || {
        let copied = target
            .handle
            .copy_from(&source.handle, 0, 0, size)
            .map_err(vfs)?;
        if copied != size {
            // The source shrank meanwhile.
            return Err(NtStatus::INVALID_VIEW_SIZE);
        }
        target.handle.set_len(size).map_err(vfs)
    })?;
    if source.stream.is_none() && target.stream.is_none() {
        copy_streams(ctx, &ctx.conn.apple, source, target)?;
    }
    Ok(size)
}

fn copy_streams(
    ctx: &Ctx<'_>,
    state: &AppleState,
    source: &Open,
    target: &Open,
) -> Result<(), NtStatus> {
    let vfs = |e: nimbus_vfs::VfsError| vfs_status(&e);
    let Some(fs) = target.share.fs.as_ref() else {
        return Ok(());
    };
    let Some(from) = fs.streams(source.meta(), false).map_err(vfs)? else {
        return Ok(());
    };
    let names: Vec<(String, u64)> = from
        .list()
        .map_err(vfs)?
        .into_iter()
        .filter(|(name, st)| stream_listed(state, &source.share, name, st.size))
        .map(|(name, st)| (name, st.size))
        .collect();
    if names.is_empty() {
        return Ok(());
    }
    let Some(to) = fs.streams(target.meta(), true).map_err(vfs)? else {
        return Ok(());
    };
    let read = file_options(CreateMode::OpenExisting, true, false);
    let write = file_options(CreateMode::OpenOrCreate, false, true);
    let path = target.path();
    for (name, size) in names {
        let (src, _, _) = match from.open(&name, &read) {
            Ok(s) => s,
            // Deleted since it was listed.
            Err(nimbus_vfs::VfsError::NotFound) => continue,
            Err(e) => return Err(vfs(e)),
        };
        let (dst, _, created) = to.open(&name, &write).map_err(vfs)?;
        dst.set_len(0).map_err(vfs)?;
        dst.copy_from(&src, 0, 0, size).map_err(vfs)?;
        if created {
            ctx.server
                .notify
                .stream_named(&target.share, &path, &name, true);
        }
    }
    Ok(())
}
