//! The release of an open that every way of closing shares (a CLOSE, a
//! session's end, a durable handle's expiry, failover, a share removed on
//! reload): its share modes, locks, caching and watch go, and the last
//! open of a delete-pending file deletes it (MS-SMB2 3.3.5.10, 3.3.4.16).

use nimbus_state::FileKey;
use nimbus_vfs::{Identity, VfsError};

use crate::open::Open;
use crate::server::{Server, Share};

/// A handle that wrote sets the write time as it goes (this node's memory
/// of it ends with its last writer). A change through SMB (reported at
/// the close, or already when the time was set), not one for the disk
/// watch to report again, later, after the client heard the close
/// answered.
pub fn settle_write_time(server: &Server, open: &Open) {
    let _own = server.notify.own_change_of(open);
    server.write_times.closing(open);
}

/// Drops an open from the share-mode table; when it was the last open of a
/// delete-pending file, deletes the file.
pub fn release(server: &Server, open: &Open) {
    release_with(server, open, false);
}

/// `release` for a client's CLOSE of the open: the last member of a group
/// of alike opens may wait a moment for another client's open to take its
/// entry over (`ShareModes::entry_to_leave_closing`). Other ways of
/// closing (a session's or tree's end, a share removed, failover) do not
/// wait: nobody waits for their answer, and some run on threads other
/// work waits for (the cluster inbox's). True: the open deleted its file
/// on close and other leases still cache handles to it (asked to let go,
/// they have not answered yet).
pub fn release_on_close(server: &Server, open: &Open) -> bool {
    release_with(server, open, true)
}

/// The release; see `release_on_close` for what it answers.
fn release_with(server: &Server, open: &Open, on_close: bool) -> bool {
    settle_write_time(server, open);
    // Its byte-range locks go with the handle; its waiting LOCKs end.
    server.locks.release_open(open.file_key, open.open_id);
    server.opens.forget(open.open_id);
    server.durables.closed(open);
    crate::persist::forget(server, open);
    // Its changes kept for the close are reported; its watch ends.
    server.notify.closed(open);
    if !open.recorded {
        // An attribute-only open left out of its file's records (see
        // ShareModes::attribute_open): it never sets delete-on-close
        // (that needs DELETE), holds no caching and is in no record, so
        // its close changes nothing another open could see. Its break
        // route (a session's end marks it disconnected) goes.
        server.oplocks.let_go(open.open_id);
        return false;
    }
    let sm = &server.share_modes;
    let deletes = open
        .delete_on_close
        .load(std::sync::atomic::Ordering::SeqCst);
    // Asked while the open still counts as its own lease's: its own lease
    // is spared, others' are broken.
    let mut others_cache = false;
    if deletes {
        crate::errors::sharing_cleanup(
            format_args!("marking the file of open {} delete-pending", open.open_id),
            sm.set_delete_pending(open.file_key, true),
        );
        // Others' cached handles keep the file; ask them to let go.
        others_cache = server.oplocks.contend_handles(open.file_key, open.open_id);
    }
    // The entry the open leaves in its file's records: its own, or its
    // group's (nimbus_state::grouped_opens) when it is the group's last
    // member. A member that leaves others writes nothing: the group's
    // entry stands for them as it did for it.
    // Its lease through its group's, if it had one, goes first (a break
    // that waited only for it is answered for the group).
    server.oplocks.leave_member(open.open_id);
    let entry = match on_close {
        true => sm.entry_to_leave_closing(open.file_key, open.open_id),
        false => sm.grouped().entry_to_leave(open.open_id),
    };
    if entry != Some(open.open_id) {
        // Its break route is under its own id, not its group's.
        server.oplocks.let_go(open.open_id);
    }
    // A file's open leaves its share modes and its caching in one write
    // where they would be two etcd transactions (a file cluster nodes
    // share); the last open of a delete-pending file, and a stream's
    // (whose file's record is left too), go step by step.
    let forgotten = match entry {
        None => true,
        Some(entry) => {
            open.stream.is_none()
                && matches!(
                    server.oplocks.forget_closing(open.file_key, entry, sm),
                    Some(Ok(true))
                )
        }
    };
    let removed = match entry {
        Some(entry) if !forgotten => {
            leave_record(server, open.file_key, entry, || match open.stream {
                Some(_) => {
                    delete_stream(server, open);
                    false
                }
                None => delete_file(server, open),
            })
        }
        _ => Ok(None),
    };
    let deleted = match removed {
        Ok(Some(deleted)) => {
            if open.stream.is_none() {
                server.notify.deleted(open);
            }
            deleted
        }
        Ok(None) => {
            server
                .notify
                .still_open(&|key| server.delete_pending(key), open);
            // A Mac's AfpInfo created and never written goes with its last
            // handle (crate::apple::afp_info).
            if crate::apple::open_kind(open) == Some(crate::apple::AppleStream::AfpInfo)
                && crate::apple::afp_info::holds_no_record(open)
                && sm.record(open.file_key).is_ok_and(|r| r.opens.is_empty())
            {
                delete_stream(server, open);
            }
            false
        }
        Err(e) => {
            tracing::error!("releasing open {}: {:?}; retried", open.open_id, e);
            sm.release_later(open.file_key, entry.unwrap_or(open.open_id));
            false
        }
    };
    // A stream's open was also one of its file's: the last of those of a
    // delete-pending file deletes the file.
    let deleted = deleted || release_base(server, open);
    if deleted || open.wrote.load(std::sync::atomic::Ordering::Relaxed) {
        crate::dir_leases::open_changed(&server.oplocks, open);
    }
    // Its oplock or its share of a lease goes last (or with its share
    // modes, above): CREATEs waiting for its break acknowledgement go on,
    // and must find its share modes gone.
    if let Some(entry) = entry.filter(|_| !forgotten) {
        server.oplocks.forget(open.file_key, entry);
    }
    others_cache
}

/// Takes `open_id` out of `file`'s record. When it is the last open of a
/// delete-pending file (or stream), `delete` runs first, while the record
/// still names the open, and the entry goes after: an open that comes
/// meanwhile is told DELETE_PENDING, as a moment before, instead of
/// opening what is about to go. What `delete` returned, if it ran.
pub fn leave_record<T>(
    server: &Server,
    file: FileKey,
    open_id: u64,
    delete: impl FnOnce() -> T,
) -> Result<Option<T>, nimbus_state::SharingError> {
    let sm = &server.share_modes;
    if !sm.remove_open_unless_last_of_deleted(file, open_id)? {
        return Ok(None);
    }
    let done = delete();
    // Out of the record now, which ends delete-pending.
    if let Err(e) = sm.remove_open(file, open_id) {
        tracing::error!("releasing open {open_id}: {e:?}; retried");
        sm.release_later(file, open_id);
    }
    Ok(Some(done))
}

/// A CREATE that was counted among a file's opens and then did not go on
/// (it waits for breaks, or failed after) found itself the last open of a
/// delete-pending file: the file goes now, as it would have at the close
/// of the open before it.
pub fn delete_abandoned(server: &Server, share: &Share, path: &str, is_dir: bool, file: FileKey) {
    let Some(fs) = share.fs.as_ref() else {
        return;
    };
    let _own = server.notify.own_change(share, &[path]);
    match fs.remove_if(path, is_dir, Identity::new(file.dev, file.ino, file.gen)) {
        Ok(()) => server.notify.removed(share, path, is_dir),
        Err(VfsError::Changed) | Err(VfsError::NotFound) => {}
        Err(e) => tracing::warn!("delete-on-close of {path} failed: {e}"),
    }
}

/// Takes a stream's open out of its file's opens (create_stream::BaseEntry);
/// returns whether that deleted the file.
fn release_base(server: &Server, open: &Open) -> bool {
    let Some(stream) = &open.stream else {
        return false;
    };
    let removed = leave_record(server, stream.base_key, open.open_id, || {
        delete_abandoned(
            server,
            &open.share,
            &open.path(),
            stream.base_is_dir,
            stream.base_key,
        )
    });
    match removed {
        Ok(deleted) => deleted.is_some(),
        Err(e) => {
            tracing::error!("releasing open {} of a stream: {:?}", open.open_id, e);
            false
        }
    }
}

/// Deletes a delete-pending stream at its last close; its file stays.
fn delete_stream(server: &Server, open: &Open) {
    let (Some(fs), Some(stream)) = (open.share.fs.as_ref(), &open.stream) else {
        return;
    };
    let name = crate::sync::lock(&stream.name).clone();
    // A macOS server ignores a request to delete a resource fork that
    // holds data (Finder sends one when it did not mean to); an empty
    // one goes.
    if crate::apple::stream_kind(&open.share, &name) == Some(crate::apple::AppleStream::Resource)
        && open.handle.stat().is_ok_and(|st| st.size > 0)
    {
        return;
    }
    let identity = Identity::new(open.file_key.dev, open.file_key.ino, open.file_key.gen);
    let removed = fs
        .streams(&stream.base, false)
        .and_then(|s| s.map_or(Ok(()), |s| s.remove_if(&name, identity)));
    match removed {
        Ok(()) => server
            .notify
            .stream_named(&open.share, &open.path(), &name, false),
        Err(VfsError::Changed) | Err(VfsError::NotFound) => {}
        Err(e) => tracing::warn!("delete-on-close of stream {name}: {e}"),
    }
}

/// Returns whether the file was removed.
fn delete_file(server: &Server, open: &Open) -> bool {
    let Some(fs) = open.share.fs.as_ref() else {
        return false;
    };
    let path = open.path();
    // Reported by `deleted`, not again by the disk watch.
    let _own = server.notify.own_change(&open.share, &[&path]);
    // The name may have been renamed by another open since, or now name
    // another file: delete only if it still names this very file, checked
    // right before the unlink.
    let identity = Identity::new(open.file_key.dev, open.file_key.ino, open.file_key.gen);
    match fs.remove_if(&path, open.is_dir, identity) {
        Ok(()) => true,
        Err(VfsError::Changed) | Err(VfsError::NotFound) => false,
        Err(e) => {
            tracing::warn!("delete-on-close of {path} failed: {e}");
            false
        }
    }
}
