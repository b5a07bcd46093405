//! MS-FSA 2.1.5.15.11.1 (Algorithm for Performing Stream Rename) with an
//! empty new stream name: a named stream renamed to `::$DATA` becomes the
//! file's data, and the open that renamed it an open of that data
//! (smbtorture smb2.streams.rename2).
//!
//! Nimbus keeps a named stream in a file of its own (nimbus_vfs::Streams)
//! while the file's data is the file itself, whose inode carries the file
//! id, attributes, security descriptor and EAs. So the stream's bytes are
//! copied into the file (copy_file_range, which shares extents where the
//! file system can), the stream is removed, and the open is rebuilt as an
//! open of the file under the same FileId, with the same access, sharing
//! and position; its entries among the file's opens and caching move from
//! the stream's key to the file's.
//!
//! As for any stream rename, the target must be replaceable: the request
//! must say ReplaceIfExists (OBJECT_NAME_COLLISION otherwise), nobody may
//! have the file's data open (SHARING_VIOLATION) and it must be empty
//! (INVALID_PARAMETER). Nimbus adds that nobody else has the stream open
//! (SHARING_VIOLATION: their handles would have to follow it), and that
//! the renaming open caches nothing, holds no byte-range lock and is not
//! durable (NOT_SUPPORTED: its oplock or lease, locks and reconnect record
//! belong to the stream, and moving them to another file is not done).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use nimbus_state::caching::{Granted, OpenAsk, Want, OPLOCK_NONE};
use nimbus_state::share_modes::STREAM_OPEN;
use nimbus_state::{FileKey, OpenRecord};
use nimbus_vfs::{CreateMode, FileHandle, Identity, Kind, OpenOptions, VfsError};
use nimbus_wire::fscc::access;
use nimbus_wire::{FileId, NtStatus};

use crate::ctx::Ctx;
use crate::errors::{sharing_status, vfs_status};
use crate::oplocks::Route;
use crate::session::{NewOpen, Open, ReplayOf, StreamOf};
use crate::sync::lock;

pub fn rename(
    ctx: &mut Ctx<'_>,
    open: &Open,
    stream: &StreamOf,
    replace: bool,
) -> Result<(), NtStatus> {
    let server = ctx.server;
    let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
    let vfs = |e: VfsError| vfs_status(&e);
    if stream.base_is_dir {
        // A directory has no unnamed data stream.
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if !replace {
        return Err(NtStatus::OBJECT_NAME_COLLISION);
    }
    let session = ctx.session()?.clone();
    let tree = ctx.tree()?.clone();
    // The Arc the session holds, to put the rebuilt open in its place.
    let current = session
        .open(open.volatile_id())
        .filter(|o| std::ptr::eq(Arc::as_ptr(o), open))
        .ok_or(NtStatus::FILE_CLOSED)?;
    let (granted, lease) = server.oplocks.held_by(open.file_key, open.open_id);
    if open.is_durable()
        || lease.is_some()
        || granted != Granted::Oplock(OPLOCK_NONE)
        || !server.locks.held_by(open.file_key, open.open_id).is_empty()
    {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    let others = |key: FileKey, counts: &dyn Fn(&OpenRecord) -> bool| {
        server
            .share_modes
            .record(key)
            .map(|r| {
                r.opens
                    .iter()
                    .any(|o| o.open_id != open.open_id && counts(o))
            })
            .map_err(|e| sharing_status(&e))
    };
    if others(open.file_key, &|_| true)?
        || others(stream.base_key, &|o| o.share_access & STREAM_OPEN == 0)?
    {
        return Err(NtStatus::SHARING_VIOLATION);
    }
    let path = open.path();
    let name = lock(&stream.name).clone();
    let streams = fs
        .streams(&stream.base, false)
        .map_err(vfs)?
        .ok_or(NtStatus::OBJECT_NAME_NOT_FOUND)?;
    let base_identity = Identity::new(
        stream.base_key.dev,
        stream.base_key.ino,
        stream.base_key.gen,
    );
    let open_base = |read: bool, write: bool| {
        let opts = OpenOptions {
            read,
            write,
            mode: CreateMode::OpenExisting,
            kind: Kind::File,
            perm: 0o644,
            append_only: false,
            expect: Some(base_identity),
        };
        fs.open(&path, &opts)
            .map(|(h, st, _)| (h, st))
            .map_err(|e| match e {
                VfsError::Changed => NtStatus::OBJECT_NAME_NOT_FOUND,
                e => vfs_status(&e),
            })
    };
    let write_rights = access::FILE_WRITE_DATA | access::FILE_APPEND_DATA;
    let (handle, st) = open_base(
        open.access & (access::FILE_READ_DATA | access::FILE_EXECUTE) != 0,
        open.access & write_rights != 0,
    )?;
    if st.size != 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let file_slot = server
        .open_files
        .reserve()
        .ok_or(NtStatus::INSUFFICIENT_RESOURCES)?;
    // The open becomes one of the file's data: checked against the file's
    // other opens (replacing its stream entry), before any byte moves.
    let entry = OpenRecord {
        open_id: open.open_id,
        access: open.access,
        share_access: open.share_access,
    };
    server
        .share_modes
        .add_open(stream.base_key, entry)
        .map_err(|e| sharing_status(&e))?;
    if let Err(status) = move_data(&streams, &name, open.file_key, &open_base) {
        // Back to a stream open of an untouched file.
        let _ = open_base(false, true).map(|(h, _)| h.set_len(0));
        let marker = OpenRecord {
            open_id: open.open_id,
            access: 0,
            share_access: STREAM_OPEN | open.share_access,
        };
        crate::errors::sharing_cleanup(
            format_args!("putting back the stream mark of open {}", open.open_id),
            server.share_modes.add_open(stream.base_key, marker),
        );
        return Err(status);
    }
    crate::errors::sharing_cleanup(
        format_args!("the stream entry of open {}", open.open_id),
        server.share_modes.remove_open(open.file_key, open.open_id),
    );
    server.oplocks.forget(open.file_key, open.open_id);
    let rebuilt = Arc::new(rebuilt_open(open, stream, handle, path.clone(), file_slot));
    let ask = OpenAsk {
        open_id: open.open_id,
        access: open.access,
        overwrite: false,
        sharing_violation: false,
        is_dir: false,
        has_byte_range_locks: false,
        want: Want::Nothing,
    };
    let route = Route {
        conn: Arc::<crate::connection::Connection>::downgrade(ctx.conn),
        session: Arc::<crate::session::Session>::downgrade(&session),
        session_id: session.id,
        file_id: FileId {
            persistent: open.open_id,
            volatile: open.volatile_id(),
        },
        seal: super::create_caching::break_cipher(&session, &tree),
    };
    server.oplocks.admit(stream.base_key, &ask, route);
    server.opens.register(&rebuilt);
    if !session.replace_open(&current, rebuilt.clone()) {
        // Closed meanwhile (its session ended): the rebuilt open goes too.
        crate::release::release(server, &rebuilt);
    }
    // The file's data changed and a stream went.
    server.notify.stream_named(&open.share, &path, &name, false);
    server.notify.wrote(&rebuilt);
    crate::dir_leases::child_changed(&server.oplocks, fs, &path, open.parent_lease);
    Ok(())
}

/// Copies the stream's bytes into the (empty) file and removes the stream.
fn move_data(
    streams: &nimbus_vfs::Streams,
    name: &str,
    stream_key: FileKey,
    open_base: &dyn Fn(bool, bool) -> Result<(FileHandle, nimbus_vfs::Stat), NtStatus>,
) -> Result<(), NtStatus> {
    let vfs = |e: VfsError| vfs_status(&e);
    let reading = OpenOptions {
        read: true,
        write: false,
        mode: CreateMode::OpenExisting,
        kind: Kind::File,
        perm: 0o644,
        append_only: false,
        expect: Some(Identity::new(
            stream_key.dev,
            stream_key.ino,
            stream_key.gen,
        )),
    };
    let (src, src_st, _) = streams.open(name, &reading).map_err(vfs)?;
    let (dst, _) = open_base(false, true)?;
    let copied = dst.copy_from(&src, 0, 0, src_st.size).map_err(vfs)?;
    if copied != src_st.size {
        // The stream shrank meanwhile: whoever did it wins; try nothing.
        return Err(NtStatus::SHARING_VIOLATION);
    }
    streams
        .remove_if(
            name,
            Identity::new(stream_key.dev, stream_key.ino, stream_key.gen),
        )
        .map_err(vfs)
}

/// The open of the file's data the stream open turns into: the same ids,
/// access, sharing, position and flags.
fn rebuilt_open(
    open: &Open,
    stream: &StreamOf,
    handle: FileHandle,
    path: String,
    file_slot: crate::open_files::OpenFileSlot,
) -> Open {
    let rebuilt = Open::new(NewOpen {
        volatile_id: open.volatile_id(),
        open_id: open.open_id,
        tree_id: open.tree_id(),
        share: open.share.clone(),
        handle,
        path,
        is_dir: false,
        access: open.access,
        file_key: stream.base_key,
        delete_on_close: open.delete_on_close.load(Ordering::SeqCst),
        mode: open.mode.load(Ordering::Relaxed),
        parent_lease: open.parent_lease,
        file_slot,
        replay: open.replay.as_ref().map(|r| ReplayOf {
            key: r.key,
            create_action: r.create_action,
        }),
        channel_sequence: open.channel_sequence.load(Ordering::Relaxed),
        app_instance: open.app_instance,
        session_id: open.session_id(),
        share_access: open.share_access,
        stream: None,
        recorded: true,
    });
    rebuilt
        .position
        .store(open.position.load(Ordering::Relaxed), Ordering::Relaxed);
    rebuilt.replay_eligible.store(
        open.replay_eligible.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    *lock(&rebuilt.lock_sequences) = *lock(&open.lock_sequences);
    rebuilt.wrote.store(true, Ordering::Relaxed);
    rebuilt
}
