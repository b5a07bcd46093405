//! MS-SMB2 3.3.5.9 Receiving an SMB2 CREATE Request.

use std::sync::Arc;

use nimbus_state::caching::{Granted, LeaseId, OpenAsk, Want};
use nimbus_state::{AttributeOpen, FileKey, OpenRecord, SharingError};
use nimbus_vfs::{CreateMode, Kind, OpenOptions, Stat, VfsError};
use nimbus_wire::create::{
    context_name, create_options as opt, CreateAction, CreateContext, CreateDisposition,
    CreateRequest, CreateResponse, IMPERSONATION_DELEGATE,
};
use nimbus_wire::fscc::{access, attributes};
use nimbus_wire::negotiate::capabilities;
use nimbus_wire::oplock::{lease_flags, oplock_level, LeaseContext};
use nimbus_wire::{FileId, NtStatus};

use super::create_durable::{self, DurableAsk};
use super::create_security;
use super::create_stream;
use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::dosinfo::{DosInfo, STORED_ATTRIBUTES};
use crate::errors::{sharing_status, vfs_status};
use crate::fileinfo::{file_info, is_readonly, stream_info, times_and_sizes};
use crate::oplocks::Route;
use crate::session::{NewOpen, Open, ReplayOf, Session, StreamOf};
use crate::sync::lock;
use nimbus_vfs::names::{to_vfs_path_and_stream, Stream};

/// Why one attempt at a CREATE did not finish.
enum Failed {
    /// The answer to the client.
    Status(NtStatus),
    /// The name changed between our check and our open (another client
    /// created, replaced or removed it): look again.
    Raced,
}

impl From<NtStatus> for Failed {
    fn from(s: NtStatus) -> Failed {
        Failed::Status(s)
    }
}

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    for attempt in 0..3 {
        match open_or_create(ctx, body, out, attempt == 0) {
            Ok(status) => return Ok(status),
            Err(Failed::Status(status)) => return Err(status),
            Err(Failed::Raced) => continue,
        }
    }
    Err(NtStatus::SHARING_VIOLATION)
}

/// `first`: the CREATE's first look (a refusal by opens of clients that
/// have gone is waited out once).
fn open_or_create(
    ctx: &mut Ctx<'_>,
    body: &[u8],
    out: &mut Vec<u8>,
    first: bool,
) -> Result<NtStatus, Failed> {
    let req = CreateRequest::parse(body).map_err(malformed)?;
    let tree = ctx.tree()?.clone();
    let session = ctx.session()?.clone();
    let share = tree.share.clone();
    let Some(fs) = share.fs.as_ref() else {
        // IPC$: its names are named pipes.
        return Ok(super::pipe::create(ctx, &req, out)?);
    };
    let smb3 = ctx.conn.negotiated().is_some_and(|n| n.dialect.is_smb3());
    let durable = DurableAsk::parse(&req, smb3)?;
    // A reconnect acts on nothing else the request says: not even its
    // fixed fields are checked (clients send them zeroed).
    if let DurableAsk::Reconnect(how) = durable {
        return Ok(create_durable::reconnect(
            ctx, &req, how, body, out, handle,
        )?);
    }
    let replay_key = match (durable, ctx.conn.negotiated()) {
        (DurableAsk::V2(r), Some(n)) => Some((n.client_guid, r.create_guid)),
        _ => None,
    };
    if let Some(key) = replay_key {
        if let Some(status) = create_durable::replay(ctx, &req, key, out)? {
            return Ok(status);
        }
    }
    check_request(&req)?;
    let options = req.create_options;
    let disposition =
        CreateDisposition::from_u32(req.create_disposition).ok_or(NtStatus::INVALID_PARAMETER)?;
    let want_dir = options & opt::DIRECTORY_FILE != 0;
    let want_file = options & opt::NON_DIRECTORY_FILE != 0;
    let truncating = matches!(
        disposition,
        CreateDisposition::Supersede
            | CreateDisposition::Overwrite
            | CreateDisposition::OverwriteIf
    );
    if want_dir && truncating {
        return Err(NtStatus::INVALID_PARAMETER.into());
    }
    let desired = access::map_generic(req.desired_access);
    let delete_on_close = options & opt::DELETE_ON_CLOSE != 0;
    if delete_on_close && desired & (access::DELETE | access::MAXIMUM_ALLOWED) == 0 {
        return Err(NtStatus::ACCESS_DENIED.into());
    }
    if lock(&session.opens).len() >= ctx.server.config().limits.max_open_files_per_session {
        return Err(NtStatus::TOO_MANY_OPENED_FILES.into());
    }
    for c in &req.contexts {
        match c.name.as_slice() {
            // Previous versions (snapshots) are not served.
            context_name::TIMEWARP_TOKEN => return Err(NtStatus::OBJECT_NAME_NOT_FOUND.into()),
            // The EAs a new or overwritten file gets: checked here, before
            // anything is created, set once it is.
            context_name::EA_BUFFER if !c.data.is_empty() => {
                let list = nimbus_wire::ea::parse_full_ea_list(&c.data)
                    .map_err(|_| NtStatus::EA_LIST_INCONSISTENT)?;
                if list.iter().any(|ea| !crate::eas::valid_name(ea.name)) {
                    return Err(NtStatus::INVALID_EA_NAME.into());
                }
                if list.iter().any(|ea| crate::eas::reserved_name(ea.name)) {
                    return Err(NtStatus::ACCESS_DENIED.into());
                }
            }
            _ => {}
        }
    }
    // A Mac's AAPL query: answered (and the connection's Apple semantics
    // set) before anything is made, so that a bad one is refused cleanly.
    let aapl_reply = crate::apple::negotiate(
        &ctx.server.config().apple_model,
        &ctx.conn.apple,
        &share,
        &req.contexts,
    )?;
    // The descriptor a new file is to get (checked before anything is made).
    let given_sd = create_security::given(&req.contexts)?;
    let mut want = requested_caching(ctx, &req)?;
    let (path, stream) = to_vfs_path_and_stream(&req.name)?;
    let path = crate::lookup::resolve(fs, &path, ctx.server.config().limits.max_directory_entries);
    // A stream is a file's data, never a directory.
    if want_dir && stream != Stream::Unnamed {
        return Err(NtStatus::NOT_A_DIRECTORY.into());
    }

    // For a named stream: the file it belongs to (made now if missing and
    // the stream is to be created), and the stream as spelled on disk.
    let mut base = None;
    let mut stream_name = None;
    let mut known_sds: (create_security::Known, create_security::Known) = (None, None);
    let existing = if let Stream::Named(name) = &stream {
        let may_create = !share.read_only() && tree.maximal_access() & access::FILE_WRITE_DATA != 0;
        // A Mac's stream of a file copied with an AppleDouble companion
        // (`._name`) is that companion's content (crate::apple), put there
        // only for a session that may write it into the file.
        if may_create && crate::apple::stream_kind(&share, name).is_some() {
            let token = session.token().ok_or(NtStatus::USER_SESSION_DELETED)?;
            let writer = crate::apple::apple_double::Writer {
                token: &token,
                tree_max: tree.maximal_access(),
            };
            crate::apple::apple_double::convert(ctx.server, &share, fs, &path, writer);
        }
        let mut b = create_stream::open_base(fs, &path, disposition, may_create)?;
        let found = b.find(name)?;
        // A stream that exists on disk but not for this client (an AfpInfo
        // never written, an empty stream for a Mac: crate::apple) is not
        // found by an open that does not create; one that creates gets it.
        if let Some((spelled, st)) = &found {
            if matches!(
                disposition,
                CreateDisposition::Open | CreateDisposition::Overwrite
            ) && !crate::apple::stream_exists(&ctx.conn.apple, &share, spelled, st.size)
            {
                return Err(NtStatus::OBJECT_NAME_NOT_FOUND.into());
            }
        }
        if found.is_none() && may_create && disposition.creates() {
            b.make_streams(fs)?;
        }
        stream_name = Some(found.as_ref().map_or(name.clone(), |(n, _)| n.clone()));
        base = Some(b);
        found.map(|(_, st)| st)
    } else {
        // The file and its stored descriptor (or, when it is missing, its
        // directory's) in one lookup.
        let found = fs
            .lookup(&path, crate::acl::store::XATTR_NAME)
            .map_err(|e| vfs_status(&e))?;
        let parent_read = found.stat.is_none();
        known_sds = (Some(found.xattr), parent_read.then_some(found.parent_xattr));
        found.stat
    };
    if let Some(st) = &existing {
        // A directory has no unnamed data stream.
        if st.is_dir && stream == Stream::UnnamedData {
            return Err(NtStatus::FILE_IS_A_DIRECTORY.into());
        }
        if st.is_dir && want_file {
            return Err(NtStatus::FILE_IS_A_DIRECTORY.into());
        }
        // MS-FSA 2.1.5.1.2: a directory asked for where a file is. FILE_CREATE
        // fails for the name being taken before the file's type is looked
        // at (Windows and Samba answer OBJECT_NAME_COLLISION); an open of
        // what exists (FILE_OPEN, FILE_OPEN_IF) finds a file that is not a
        // directory.
        if disposition == CreateDisposition::Create {
            return Err(NtStatus::OBJECT_NAME_COLLISION.into());
        }
        if !st.is_dir && want_dir {
            return Err(NtStatus::NOT_A_DIRECTORY.into());
        }
        if st.is_dir && truncating {
            return Err(NtStatus::FILE_IS_A_DIRECTORY.into());
        }
    } else if matches!(
        disposition,
        CreateDisposition::Open | CreateDisposition::Overwrite
    ) {
        return Err(NtStatus::OBJECT_NAME_NOT_FOUND.into());
    }
    let creating = existing.is_none();
    let is_dir = existing.as_ref().map(|s| s.is_dir).unwrap_or(want_dir);
    // Directories never get oplocks, and are leased only on a connection
    // whose NEGOTIATE answered SMB2_GLOBAL_CAP_DIRECTORY_LEASING (3.x, and
    // only to a client that announced it, handlers::negotiate). Otherwise
    // the lease context is ignored (MS-SMB2 3.3.5.9.11): the CREATE
    // succeeds with OplockLevel NONE and no lease context.
    let directory_leasing = ctx
        .conn
        .negotiated()
        .is_some_and(|n| n.server_capabilities & capabilities::DIRECTORY_LEASING != 0);
    if is_dir && !(directory_leasing && matches!(want, Want::Lease { .. })) {
        want = Want::Nothing;
    }
    // The directory lease the client keeps for this file's parent: changes
    // made through this open leave it alone.
    let parent_lease = match want {
        Want::Lease {
            id,
            parent_key: Some(key),
            ..
        } => Some(LeaseId {
            client: id.client,
            key,
        }),
        _ => None,
    };
    // READONLY is the file's, whichever of its streams is opened.
    let readonly_attr = match (&base, &existing) {
        (Some(b), _) => !b.stat.is_dir && is_readonly(b.stat.mode),
        (None, Some(st)) => is_readonly(st.mode),
        (None, None) => req.file_attributes & attributes::READONLY != 0,
    };

    // Windows permissions: what the file's stored descriptor grants (for a
    // stream, its file's), or for a new file what its directory allows and
    // the descriptor it gets.
    let token = session.token().ok_or(NtStatus::USER_SESSION_DELETED)?;
    let security = create_security::decide(
        fs,
        &create_security::Ask {
            path: &path,
            is_new: base.as_ref().map_or(creating, |b| b.created),
            is_dir: base.as_ref().map_or(is_dir, |b| b.stat.is_dir),
            desired,
            truncating,
            adds_stream: base.as_ref().is_some_and(|b| !b.created) && creating,
            given: given_sd.as_ref(),
            own: known_sds.0,
            parent: known_sds.1,
        },
        &token,
    )?;

    // Access: what was asked (MAXIMUM_ALLOWED: all the tree and the
    // descriptor allow), never more than they allow, and no data writes to
    // a read-only file.
    let write_rights = access::FILE_WRITE_DATA | access::FILE_APPEND_DATA;
    let max = tree.maximal_access() & security.limit;
    let mut granted = if desired & access::MAXIMUM_ALLOWED != 0 {
        let mut g = (desired & !access::MAXIMUM_ALLOWED) | max;
        if readonly_attr && !creating && !is_dir {
            g &= !write_rights;
        }
        g
    } else {
        desired
    };
    if granted & !max != 0 || (share.read_only() && (creating || truncating)) {
        return Err(NtStatus::ACCESS_DENIED.into());
    }
    // Delete-on-close needs DELETE among the rights granted, not merely
    // asked for: MAXIMUM_ALLOWED on a read-only share grants no DELETE, and
    // the file must survive the close (MS-FSA 2.1.5.1.2.1: Windows answers
    // ACCESS_DENIED).
    if delete_on_close && granted & access::DELETE == 0 {
        return Err(NtStatus::ACCESS_DENIED.into());
    }
    if readonly_attr && !creating && !is_dir {
        if granted & write_rights != 0 || truncating {
            return Err(NtStatus::ACCESS_DENIED.into());
        }
        if delete_on_close {
            return Err(NtStatus::CANNOT_DELETE.into());
        }
    }
    // MS-FSA 2.1.5.1.1: nor is a new file created READONLY and
    // delete-on-close at once (smbtorture smb2.delete-on-close-perms.READONLY).
    if readonly_attr && creating && !is_dir && delete_on_close {
        return Err(NtStatus::CANNOT_DELETE.into());
    }
    if truncating && !creating && base.is_none() {
        overwrite_keeps_attributes(fs, &path, req.file_attributes)?;
    }
    if is_dir {
        // Data rights mean nothing on a directory; keep them for sharing only.
        granted &= !access::SYNCHRONIZE;
    }

    let open_id = ctx.server.new_open_id();
    let record = OpenRecord {
        open_id,
        access: granted,
        share_access: req.share_access & 0x7,
    };
    let existing_key = existing.as_ref().map(|st| FileKey {
        dev: st.dev,
        ino: st.ino,
    });
    if let Want::Lease { id, .. } = want {
        // MS-SMB2 3.3.5.9.8: a lease key names one file.
        if !ctx.server.oplocks.lease_fits(id, existing_key) {
            return Err(NtStatus::INVALID_PARAMETER.into());
        }
    }
    let mut ask = OpenAsk {
        open_id,
        // Creating or overwriting writes the file, whatever was asked for:
        // such an open is never an attribute-only one to oplocks.
        access: if creating || truncating {
            granted | access::FILE_WRITE_DATA
        } else {
            granted
        },
        overwrite: truncating,
        sharing_violation: false,
        is_dir,
        has_byte_range_locks: false,
        want,
    };
    // Check sharing before touching an existing file, so an overwrite never
    // truncates a file another client holds without write sharing. Other
    // clients' oplocks and leases are broken first where the open needs it
    // (their cached writes flushed, their cached handles closed), and the
    // CREATE waits for their acknowledgements.
    let mut registered = None;
    // Whether the open's caching entry was written with its share modes
    // (`Oplocks::contend_opening`): its admit then writes nothing more.
    let mut counted = false;
    // A stream's open is also one of its file's (create_stream::BaseEntry).
    let base_entry = match &base {
        Some(b) => Some(create_stream::BaseEntry::add(
            ctx.server,
            &share,
            &path,
            b,
            open_id,
            req.share_access,
        )?),
        None => None,
    };
    let app_instance = create_durable::app_instance(&req, &durable);
    if let (Some(key), Some(id)) = (existing_key, app_instance) {
        create_durable::close_app_instance(ctx, key, id);
    }
    // An open of an existing file for attributes only, with no lease and
    // no durability: it conflicts with no open and caches nothing, so a
    // cluster node that does not hold the file's record lets it go on
    // without one (only delete-pending can refuse it).
    let attribute_only = base.is_none()
        && !creating
        && !truncating
        && !delete_on_close
        && nimbus_state::caching::stat_open(ask.access)
        && !matches!(want, Want::Lease { .. })
        && matches!(durable, DurableAsk::None);
    let recorded = match existing_key {
        Some(key) if attribute_only => {
            ctx.server
                .share_modes
                .attribute_open(key)
                .map_err(|e| sharing_status(&e))?
                == AttributeOpen::Record
        }
        _ => true,
    };
    if let Some(key) = existing_key.filter(|_| recorded) {
        // Share modes and caching in one write where they would be two
        // etcd transactions (a file cluster nodes share), else one by one.
        let together =
            ctx.server
                .oplocks
                .contend_opening(key, &ask, &ctx.server.share_modes, record);
        let added = match together {
            Some(r) => r.map(Some),
            None => ctx.server.share_modes.add_open(key, record).map(|()| None),
        };
        let contended = match added {
            Ok(contended) => contended,
            // A persistent open waits for its client to reclaim it after a
            // restart or a lost connection: it is not taken from it
            // (MS-SMB2 3.3.5.9: STATUS_FILE_NOT_AVAILABLE).
            Err(SharingError::Violation)
                if ctx.server.durables.persistent_waits(key)
                    || crate::failover::waits_for_reclaim(ctx.server, key) =>
            {
                return Err(NtStatus::FILE_NOT_AVAILABLE.into())
            }
            // Refused perhaps by opens of clients that have gone, still
            // being released (`crate::teardowns`): once they are, look
            // again from the name (the file may be gone with them).
            Err(SharingError::Violation | SharingError::DeletePending)
                if first
                    && crate::leaving::waited_for_leaving(
                        ctx.server,
                        key,
                        ctx.conn,
                        crate::teardowns::WAIT,
                    ) =>
            {
                return Err(Failed::Raced)
            }
            Err(SharingError::Violation) => {
                ask.sharing_violation = true;
                None
            }
            Err(e) => return Err(sharing_status(&e).into()),
        };
        let contention = match contended {
            Some(c) => {
                // Counted among the file's caching opens in the same write
                // (unless it waits).
                counted = !c.wait;
                c
            }
            None => ctx.server.oplocks.contend(key, &ask),
        };
        if contention.wait {
            if !ask.sharing_violation {
                abandon(ctx, &share, &path, is_dir, key, open_id);
            }
            // The breaks went to disconnected durable opens, which closed
            // instead: nothing is left to wait for.
            if !ctx.server.oplocks.is_breaking(key) {
                return Err(Failed::Raced);
            }
            let status = super::deferred::defer(ctx, key, body, handle).map_err(Failed::Status)?;
            // A replay of this CREATE while it waits is told to come back.
            if let (Some(k), Some(request)) =
                (replay_key, ctx.resumed.as_ref().or(ctx.interim.as_ref()))
            {
                ctx.server.durables.name_pending(k, request);
                request.mark_replayable();
            }
            return Ok(status);
        }
        if ask.sharing_violation {
            return Err(NtStatus::SHARING_VIOLATION.into());
        }
        registered = Some(key);
    }
    let unregister = |key: FileKey| {
        match (&base, &stream_name) {
            (Some(b), Some(name)) => abandon_stream(ctx, b, name, key, open_id),
            _ => abandon(ctx, &share, &path, is_dir, key, open_id),
        }
        ctx.server.oplocks.forget(key, open_id);
    };

    let mode = match (&existing, truncating) {
        (Some(_), true) => CreateMode::TruncateExisting,
        (Some(_), false) => CreateMode::OpenExisting,
        (None, _) => CreateMode::CreateNew,
    };
    let kind = if is_dir {
        Kind::Directory
    } else if creating || want_file {
        Kind::File
    } else {
        Kind::Any
    };
    let perm = match (is_dir, readonly_attr) {
        (true, _) => 0o755,
        (false, true) => 0o444,
        (false, false) => 0o644,
    };
    let opts = OpenOptions {
        read: granted & (access::FILE_READ_DATA | access::FILE_EXECUTE) != 0,
        // Overwriting needs a writable descriptor even for an open that
        // asked only for attributes (Windows allows that open).
        write: granted & write_rights != 0 || truncating,
        mode,
        kind,
        perm,
        // MS-FSA 2.1.5.3: data written through an open that may append but
        // not write goes to the end of the file, whatever offset it names.
        append_only: granted & write_rights == access::FILE_APPEND_DATA,
        // Act (truncation included) only on the file whose share modes were
        // checked above; if the name was replaced meanwhile, look again.
        expect: existing.as_ref().map(|st| (st.dev, st.ino)),
    };
    // A place among the server's open files before a descriptor is taken.
    let Some(file_slot) = ctx.server.open_files.reserve() else {
        if let Some(key) = registered {
            unregister(key);
        }
        return Err(NtStatus::TOO_MANY_OPENED_FILES.into());
    };
    // What this CREATE does to the disk (the file, its DOS attributes, its
    // allocation) is reported by `opened` below, not again by the disk
    // watch (crate::notify::disk). Opening what exists changes nothing.
    let own = (mode != CreateMode::OpenExisting)
        .then(|| ctx.server.notify.own_change(&share, &[&path]))
        .flatten();
    let opened = match (&base, &stream_name) {
        (Some(b), Some(name)) => match &b.streams {
            Some(streams) => streams.open(name, &opts),
            None => Err(VfsError::NotFound),
        },
        _ => fs.open(&path, &opts),
    };
    let (handle, st, created) = match opened {
        Ok(r) => r,
        Err(e) => {
            if let Some(key) = registered {
                unregister(key);
            }
            return Err(match e {
                // Another creator won: open what it made instead.
                VfsError::Exists if creating && disposition != CreateDisposition::Create => {
                    Failed::Raced
                }
                // The file checked was replaced or removed meanwhile.
                VfsError::Changed | VfsError::NotFound if !creating => Failed::Raced,
                e => vfs_status(&e).into(),
            });
        }
    };
    let key = FileKey {
        dev: st.dev,
        ino: st.ino,
    };
    if registered.is_none() && recorded {
        ctx.server
            .share_modes
            .add_open(key, record)
            .map_err(|e| sharing_status(&e))?;
    }

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
            &share,
            &path,
            st.is_dir,
            file_created,
            truncating && base.is_none(),
        );
    }
    if let (true, Some(name)) = (created, &stream_name) {
        ctx.server.notify.stream_named(&share, &path, name, true);
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
                unregister(key);
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
        stream: base.map(|b| StreamOf {
            name: std::sync::Mutex::new(stream_name.unwrap_or_default()),
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
        session: std::sync::Arc::<crate::session::Session>::downgrade(&session),
        session_id: session.id,
        file_id,
        seal: super::create_caching::break_cipher(&session, &tree),
    };
    let granted_caching = if counted {
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
    let mut contexts = contexts;
    contexts.extend(aapl_reply.map(|data| CreateContext {
        name: nimbus_wire::apple::CONTEXT_NAME.to_vec(),
        data,
    }));
    let (oplock_level, lease) =
        super::create_caching::caching_response(&req.contexts, &granted_caching);
    contexts.extend(lease);
    // Opens of named streams are not made durable: a reconnect, a restart
    // or another cluster node reopens a file by its name alone.
    if open.stream.is_none() {
        contexts.extend(create_durable::grant(
            ctx,
            &open,
            &durable,
            &granted_caching,
        ));
    }
    join_session(ctx.server, &session, &open)?;
    ctx.chain_file_id = Some(file_id);
    CreateResponse {
        oplock_level,
        create_action,
        info: times_and_sizes(&info),
        file_id,
        contexts,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

/// Puts a new open in its session, last: until then the end of the
/// session (its last channel lost, a LOGOFF on another) cannot find it
/// half made, its caching granted after the session let its opens go and
/// its breaks routed to a connection that is gone (a break nobody could
/// acknowledge held the next CREATE of its file for the whole break
/// timeout). A session that ended meanwhile gets what its end would have
/// done to the open: kept for a reconnect if durable, closed otherwise.
/// Its CreateGuid names it only once it is in the session: a replay on
/// another channel that finds it looks for it there (until then the
/// replay is told FILE_NOT_AVAILABLE, as while the CREATE waited).
fn join_session(
    server: &crate::server::Server,
    session: &Session,
    open: &Arc<Open>,
) -> Result<(), NtStatus> {
    let joined = session.add_open(open);
    // Opens of named streams are not made durable (see `handle`).
    if open.stream.is_none() {
        server.durables.name_open(open);
        // Released meanwhile (the session's end took it, and it was not
        // durable): its name goes too, as its release took it before.
        if !server.opens.contains(open.open_id) {
            server.durables.closed(open);
        }
    }
    if joined {
        return Ok(());
    }
    crate::disconnected::keep_or_close(server, open);
    if open.share.is_removed() {
        return Err(NtStatus::NETWORK_NAME_DELETED);
    }
    Err(NtStatus::USER_SESSION_DELETED)
}

/// Takes a CREATE that did not go on out of the file's opens; if that left
/// a delete-pending file without opens, the file goes (as at a close).
fn abandon(
    ctx: &Ctx<'_>,
    share: &crate::server::Share,
    path: &str,
    is_dir: bool,
    key: FileKey,
    open_id: u64,
) {
    let _ = crate::release::leave_record(ctx.server, key, open_id, || {
        crate::release::delete_abandoned(ctx.server, share, path, is_dir, key)
    });
}

/// `abandon` for a stream: its file's entry goes with the guard that holds
/// it; a delete-pending stream left without opens goes now.
fn abandon_stream(
    ctx: &Ctx<'_>,
    base: &create_stream::Base,
    name: &str,
    key: FileKey,
    open_id: u64,
) {
    let _ = crate::release::leave_record(ctx.server, key, open_id, || {
        if let Some(streams) = &base.streams {
            let _ = streams.remove_if(name, (key.dev, key.ino));
        }
    });
}

/// Access bits no object type defines (MS-DTYP 2.4.3 ACCESS_MASK: bits
/// 9-15, 21-23 and 26-27); asking for one is refused like any right the
/// caller does not hold.
const RESERVED_ACCESS: u32 = 0x0CE0_FE00;

/// Create contexts one CREATE may carry (MS-SMB2 defines fewer than 20).
const MAX_CREATE_CONTEXTS: usize = 64;

/// MS-SMB2 2.2.13 FILE_CREATE_TREE_CONNECTION, which has no meaning over SMB2.
const CREATE_TREE_CONNECTION: u32 = 0x0000_0080;

/// Attributes a CREATE may carry (MS-FSCC 2.6); the others, e.g. DEVICE,
/// VOLUME or INTEGRITY_STREAM, make it STATUS_INVALID_PARAMETER.
const CREATE_ATTRIBUTES: u32 = 0x0000_7FB7;

/// The checks of MS-SMB2 3.3.5.9 that need only the request, in the order
/// Windows applies them (access before attributes).
fn check_request(req: &CreateRequest) -> Result<(), NtStatus> {
    if req.impersonation_level > IMPERSONATION_DELEGATE {
        return Err(NtStatus::BAD_IMPERSONATION_LEVEL);
    }
    // MS-SMB2 3.3.5.9: a name starting with a separator is invalid.
    if req.name.starts_with('\\') {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let options = req.create_options;
    if options & !opt::VALID_MASK != 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // MS-SMB2 3.3.5.9: opening by file id and reserving an oplock filter are
    // not supported over SMB2; neither is a tree connection "open".
    if options & (opt::OPEN_BY_FILE_ID | opt::RESERVE_OPFILTER | CREATE_TREE_CONNECTION) != 0 {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    if options & opt::DIRECTORY_FILE != 0 && options & opt::NON_DIRECTORY_FILE != 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let desired = access::map_generic(req.desired_access);
    if desired & RESERVED_ACCESS != 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if desired & access::ACCESS_SYSTEM_SECURITY != 0 {
        return Err(NtStatus::PRIVILEGE_NOT_HELD);
    }
    let attrs = req.file_attributes;
    if attrs & !CREATE_ATTRIBUTES != 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // MS-FSA 2.1.5.1: a directory cannot be temporary.
    if options & opt::DIRECTORY_FILE != 0 && attrs & attributes::TEMPORARY != 0 {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // Without EFS, encrypted files cannot be created (as on a Windows
    // server outside a domain).
    if attrs & attributes::ENCRYPTED != 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    // MS-SMB2 2.2.13.2: a context name is at least four bytes.
    if req.contexts.iter().any(|c| c.name.len() < 4) {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // Clients send a handful (durable handle, lease, MxAc, QFid, ...); a
    // request with more is not one a client makes.
    if req.contexts.len() > MAX_CREATE_CONTEXTS {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    Ok(())
}

/// MS-FSA 2.1.5.1.2.1: overwriting or superseding a HIDDEN or SYSTEM file
/// must ask for those attributes again, or it is ACCESS_DENIED (as from
/// Windows and Samba: smbtorture smb2.dosmode), so that a program
/// rewriting a file does not strip them unawares. The file's attributes
/// are read through an attribute-only open; a file that cannot be opened
/// so is left to the open proper to report.
fn overwrite_keeps_attributes(
    fs: &nimbus_vfs::LocalFs,
    path: &str,
    requested: u32,
) -> Result<(), NtStatus> {
    let probe = OpenOptions {
        read: false,
        write: false,
        mode: CreateMode::OpenExisting,
        kind: Kind::File,
        perm: 0,
        append_only: false,
        expect: None,
    };
    let Ok((handle, _, _)) = fs.open(path, &probe) else {
        return Ok(());
    };
    let held = DosInfo::load(&handle).stored_or_default(false);
    if held & (attributes::HIDDEN | attributes::SYSTEM) & !requested != 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    Ok(())
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

/// What the CREATE asks to cache (MS-SMB2 3.3.5.9): an oplock level, or a
/// lease (RequestedOplockLevel LEASE and an RqLs context; 2.1 and later,
/// version 2 on 3.x only).
fn requested_caching(ctx: &Ctx<'_>, req: &CreateRequest) -> Result<Want, NtStatus> {
    let negotiated = ctx.conn.negotiated();
    let level = req.requested_oplock_level;
    match level {
        oplock_level::II | oplock_level::EXCLUSIVE | oplock_level::BATCH => {
            return Ok(Want::Oplock(level))
        }
        oplock_level::LEASE => {}
        _ => return Ok(Want::Nothing),
    }
    let Some(n) = negotiated else {
        return Ok(Want::Nothing);
    };
    if n.dialect == nimbus_wire::negotiate::Dialect::Smb202 {
        return Ok(Want::Nothing);
    }
    let Some(c) = req
        .contexts
        .iter()
        .find(|c| c.name.as_slice() == context_name::REQUEST_LEASE)
    else {
        return Ok(Want::Nothing);
    };
    let lease = LeaseContext::parse(&c.data).map_err(|_| NtStatus::INVALID_PARAMETER)?;
    let version = if lease.version == 2 && n.dialect.is_smb3() {
        2
    } else {
        1
    };
    Ok(Want::Lease {
        id: LeaseId {
            client: n.client_guid,
            key: lease.lease_key,
        },
        state: lease.state,
        version,
        parent_key: (version == 2 && lease.flags & lease_flags::PARENT_LEASE_KEY_SET != 0)
            .then_some(lease.parent_key),
        epoch: if version == 2 { lease.epoch } else { 0 },
    })
}
