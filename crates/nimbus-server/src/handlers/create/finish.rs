//! CREATE, stage 5: what follows the open. A file made or overwritten
//! gets its attributes, descriptor and EAs; change notifications go out;
//! the open is registered and its caching granted (MS-SMB2 3.3.5.9,
//! MS-FSA 2.1.5.1).

use std::sync::Arc;

use nimbus_state::caching::{Granted, Want};
use nimbus_vfs::Stat;
use nimbus_wire::create::{
    context_name, create_options as opt, CreateAction, CreateContext, CreateDisposition,
    FileTimesAndSizes,
};
use nimbus_wire::fscc::{access, attributes};
use nimbus_wire::oplock::oplock_level;
use nimbus_wire::{FileId, NtStatus};

use super::contend::Admitted;
use super::found::Found;
use super::open::Opened;
use super::request::Create;
use super::{undo, Failed};
use crate::ctx::Ctx;
use crate::dosinfo::{DosInfo, STORED_ATTRIBUTES};
use crate::fileinfo::{file_info, is_readonly, stream_info, times_and_sizes};
use crate::oplocks::Route;
use crate::session::{NewOpen, Open, ReplayOf, StreamOf};
use crate::sync::lock;

/// An open made, registered, its caching granted; not yet in its session.
pub struct Finished {
    pub open: Arc<Open>,
    pub file_id: FileId,
    pub create_action: CreateAction,
    pub info: FileTimesAndSizes,
    /// The contexts answered so far (MS-SMB2 2.2.14.2).
    pub contexts: Vec<CreateContext>,
    pub caching: Granted,
}

/// Finishes what `o` opened for `c`.
pub fn finish(
    ctx: &Ctx<'_>,
    c: &Create<'_>,
    f: Found,
    a: Admitted<'_>,
    o: Opened,
) -> Result<Finished, Failed> {
    let (share, fs, tree, session, req) = (c.share, c.fs, c.tree, c.session, &c.req);
    let (disposition, options, truncating, delete_on_close, replay_key) = (
        c.disposition,
        c.options,
        c.truncating,
        c.delete_on_close,
        c.replay_key,
    );
    let path = c.path.clone();
    let (open_id, existing_key, recorded, counted, app_instance) = (
        a.open_id,
        a.existing_key,
        a.recorded,
        a.counted,
        a.app_instance,
    );
    let mut ask = a.ask;
    let group_lease = a.group_lease;
    let (base, stream_name, security) = (&f.base, &f.stream_name, &f.security);
    let (max, granted, parent_lease) = (f.max, f.granted, f.parent_lease);
    // Bound in the order the stages made them, so that an early return
    // drops them in reverse: the descriptor, then the open-file slot, then
    // a stream's entry among its file's opens.
    let base_entry = a.base_entry;
    let file_slot = o.file_slot;
    let own = o.own;
    let (handle, st, created) = (o.handle, o.st, o.created);
    let key = o.key;
    // What the file's metadata is read and written through: for a stream,
    // its file's handle (the stream has none of its own).
    let meta = base.as_ref().map_or(&handle, |b| &b.handle);
    let dos = match &base {
        Some(b) => settle_dos_info(&b.handle, b.stat.is_dir, req.file_attributes, b.created),
        None => settle_dos_info(
            &handle,
            st.is_dir,
            req.file_attributes,
            created || truncating,
        ),
    };
    // A new file's descriptor, before any other client can open it by name
    // and be checked against it.
    if let Some(sd) = &security.assign {
        if base.as_ref().map_or(created, |b| b.created) {
            if let Err(e) = crate::acl::store::write(meta, sd) {
                tracing::warn!("{}: security descriptor of {path}: {e}", ctx.conn.peer);
            }
        }
    }
    // Overwriting or superseding a file leaves it only its unnamed stream.
    if truncating && !created && base.is_none() {
        if let Err(e) = fs.remove_streams(&handle) {
            tracing::warn!("{}: streams of an overwritten file: {e}", ctx.conn.peer);
        }
    }
    if created || truncating {
        let ea_buffer = req
            .contexts
            .iter()
            .find(|c| c.name.as_slice() == context_name::EA_BUFFER && !c.data.is_empty());
        if let Some(c) = ea_buffer {
            // Decoded and its names checked above.
            if let Ok(list) = nimbus_wire::ea::parse_full_ea_list(&c.data) {
                if let Err(status) = crate::eas::apply(meta, &list) {
                    tracing::debug!("{}: EAs of a new file not set: {status}", ctx.conn.peer);
                }
            }
        }
    }
    let contexts = response_contexts(
        &req.contexts,
        base.as_ref().map_or(&st, |b| &b.stat),
        granted,
        max,
        &handle,
        created || truncating,
    );
    if truncating && !created && base.is_none() {
        overwritten_readonly(&handle, &st, req.file_attributes);
    }
    // An allocation size context (or READONLY just set) may have changed
    // what the file shows.
    let st = handle.stat().unwrap_or(st);
    // A stream's changes are its file's only when the file was made for
    // it: streams have no names in their directory.
    let (dir_changed, file_created) = match &base {
        Some(b) => (b.created, b.created),
        None => (created || truncating, created),
    };
    if base.is_none() || dir_changed {
        ctx.server.notify.opened(
            share,
            &path,
            st.is_dir,
            file_created,
            truncating && base.is_none(),
        );
    }
    if let (true, Some(name)) = (created, &stream_name) {
        ctx.server.notify.stream_named(share, &path, name, true);
    }
    drop(own);
    if dir_changed {
        crate::dir_leases::child_changed(&ctx.server.oplocks, fs, &path, parent_lease);
    }

    let mut st = st;
    // The data's allocation, as a query of the open reports it.
    st.alloc_size = handle.data_allocation(&st);
    let mut info = match &base {
        Some(b) => stream_info(&b.stat, &dos, &st, false),
        None => file_info(&st, &dos, false),
    };
    share.settings().hide.apply(&path, &mut info);
    // Another open's write may not have moved the write time yet.
    let file = base.as_ref().map_or(key, |b| b.key);
    ctx.server.write_times.adjust(file, &mut info);
    let create_action = if created {
        CreateAction::Created
    } else {
        match disposition {
            CreateDisposition::Supersede => CreateAction::Superseded,
            CreateDisposition::Overwrite | CreateDisposition::OverwriteIf => {
                CreateAction::Overwritten
            }
            _ => CreateAction::Opened,
        }
    };
    let volatile_id = {
        let opens = lock(&session.opens);
        if session.has_ended() {
            // Logged off on another channel while this CREATE ran (its
            // opens already released): none is added to it now.
            drop(opens);
            if recorded {
                undo::unregister(ctx, c, &f, open_id, key);
            }
            return Err(NtStatus::USER_SESSION_DELETED.into());
        }
        ctx.server
            .new_volatile_id(open_id, |id| opens.contains_key(&id))
    };
    let open = Arc::new(Open::new(NewOpen {
        volatile_id,
        open_id,
        tree_id: tree.id,
        share: share.clone(),
        handle,
        path,
        is_dir: st.is_dir,
        access: granted,
        file_key: key,
        delete_on_close,
        mode: options
            & (opt::WRITE_THROUGH
                | opt::SEQUENTIAL_ONLY
                | opt::NO_INTERMEDIATE_BUFFERING
                | opt::SYNCHRONOUS_IO_ALERT
                | opt::SYNCHRONOUS_IO_NONALERT
                | opt::DELETE_ON_CLOSE),
        parent_lease,
        file_slot,
        replay: replay_key.map(|key| ReplayOf { key, create_action }),
        channel_sequence: ctx.hdr.channel_sequence(),
        app_instance,
        session_id: session.id,
        share_access: req.share_access & 0x7,
        stream: f.base.map(|b| StreamOf {
            name: std::sync::Mutex::new(f.stream_name.unwrap_or_default()),
            base: b.handle,
            base_key: b.key,
            base_is_dir: b.stat.is_dir,
        }),
        recorded,
    }));
    if let Some(entry) = base_entry {
        entry.keep();
    }
    ctx.server.opens.register(&open);
    let file_id = FileId {
        persistent: open_id,
        volatile: volatile_id,
    };
    let route = Route {
        conn: std::sync::Arc::<crate::connection::Connection>::downgrade(ctx.conn),
        session: std::sync::Arc::<crate::session::Session>::downgrade(session),
        session_id: session.id,
        file_id,
        seal: super::super::create_caching::break_cipher(session, tree),
    };
    let granted_caching = if let Some(group) = group_lease.filter(|_| counted) {
        // Its lease through its group's: from memory, or through the
        // record as the group's entry's.
        ctx.server
            .oplocks
            .admit_member(key, group, &ask, route, &ctx.server.share_modes)
    } else if counted {
        // Whether the file holds byte-range locks is read by the write of
        // the admit, once for all the admits written with it.
        ctx.server
            .oplocks
            .admit_counted(key, &ask, route, &ctx.server.share_modes)
    } else if recorded {
        // Locks only take read and handle caching away: an open that asks
        // for none need not know (on a file other cluster nodes share,
        // knowing is a read of the lock record). A file this CREATE made
        // has none.
        ask.has_byte_range_locks = existing_key.is_some()
            && !matches!(ask.want, Want::Nothing)
            && !ask.overwrite
            && ctx.server.locks.has_locks(key);
        ctx.server.oplocks.admit(key, &ask, route)
    } else {
        Granted::Oplock(oplock_level::NONE)
    };
    if delete_on_close && !created {
        // The file goes when this handle closes: others' cached handles
        // would keep it, so they are asked to let go now, before the
        // client hears back (the close asks again for what is left).
        ctx.server.oplocks.contend_handles(key, open_id);
    }
    Ok(Finished {
        open,
        file_id,
        create_action,
        info: times_and_sizes(&info),
        contexts,
        caching: granted_caching,
    })
}

/// MS-FSA 2.1.5.1.2.1: an overwrite or supersede gives the file the
/// attributes its request names, READONLY among them (Windows and Samba
/// answer 0x21 for READONLY). READONLY is the permission bits (crate::
/// fileinfo::is_readonly), cleared last: the DOS attributes, EAs and
/// streams an overwrite sets are written while the file is still
/// writable. The open itself keeps the write access it was granted.
fn overwritten_readonly(handle: &nimbus_vfs::FileHandle, st: &Stat, requested: u32) {
    if st.is_dir || requested & attributes::READONLY == 0 || is_readonly(st.mode) {
        return;
    }
    if let Err(e) = handle.set_mode(st.mode & 0o7777 & !0o222) {
        tracing::warn!("READONLY of an overwritten file: {e}");
    }
}

/// The attributes a file gets when created or overwritten (MS-FSA 2.1.5.1.1,
/// 2.1.5.1.2.1): those asked for, plus ARCHIVE on files. READONLY goes to the
/// permission bits instead.
fn new_dos_info(requested: u32, is_dir: bool, keep: DosInfo) -> DosInfo {
    let mut a = requested & STORED_ATTRIBUTES;
    if !is_dir {
        a |= attributes::ARCHIVE;
    }
    DosInfo {
        attributes: Some(a),
        ..keep
    }
}

/// The DOS information of an open file; a file just created or overwritten
/// gets the requested attributes (written only when they differ from what
/// an object without stored information reports anyway).
fn settle_dos_info(
    handle: &nimbus_vfs::FileHandle,
    is_dir: bool,
    requested: u32,
    fresh: bool,
) -> DosInfo {
    let current = DosInfo::load(handle);
    if !fresh {
        return current;
    }
    let new = new_dos_info(requested, is_dir, current);
    if new.stored_or_default(is_dir) == current.stored_or_default(is_dir) {
        return current;
    }
    if let Err(e) = new.save(handle) {
        tracing::warn!("storing DOS attributes: {e}");
        return current;
    }
    new
}

/// Answers the create contexts the server implements (MS-SMB2 2.2.14.2);
/// the others (durable handles, leases, security descriptors) are ignored
/// as MS-SMB2 3.3.5.9 allows, which tells the client they were not granted.
fn response_contexts(
    requested: &[CreateContext],
    st: &Stat,
    granted: u32,
    max: u32,
    handle: &nimbus_vfs::FileHandle,
    fresh: bool,
) -> Vec<CreateContext> {
    let mut out: Vec<CreateContext> = Vec::new();
    for c in requested {
        // Each context is answered once, however often it was asked for:
        // a response must stay within the room reserved for it.
        if out.iter().any(|answered| answered.name == c.name) {
            continue;
        }
        match c.name.as_slice() {
            context_name::QUERY_MAXIMAL_ACCESS => {
                let mut data = Vec::with_capacity(8);
                data.extend_from_slice(&0u32.to_le_bytes());
                let maximal = if is_readonly(st.mode) && !st.is_dir {
                    max & !(access::FILE_WRITE_DATA | access::FILE_APPEND_DATA)
                } else {
                    max
                };
                data.extend_from_slice(&(maximal | granted).to_le_bytes());
                out.push(CreateContext {
                    name: c.name.clone(),
                    data,
                });
            }
            context_name::QUERY_ON_DISK_ID => {
                let mut data = Vec::with_capacity(32);
                data.extend_from_slice(&st.ino.to_le_bytes());
                data.extend_from_slice(&st.dev.to_le_bytes());
                data.extend_from_slice(&[0u8; 16]);
                out.push(CreateContext {
                    name: c.name.clone(),
                    data,
                });
            }
            // MS-SMB2 2.2.13.2.6: applies to a file being created or overwritten.
            context_name::ALLOCATION_SIZE if fresh && !st.is_dir => {
                if let Ok(size) = nimbus_wire::fscc::parse_u64(&c.data) {
                    let _ = handle.allocate(size);
                }
            }
            _ => {}
        }
    }
    out
}
