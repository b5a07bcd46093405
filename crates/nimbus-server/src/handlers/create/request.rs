//! CREATE, stage 1: the request and its contexts, read and checked before
//! anything on disk is looked at (MS-SMB2 3.3.5.9).

use std::sync::Arc;

use nimbus_state::caching::{LeaseId, Want};
use nimbus_state::FileKey;
use nimbus_vfs::names::{to_vfs_path_and_stream, Stream};
use nimbus_vfs::LocalFs;
use nimbus_wire::create::{
    context_name, create_options as opt, CreateDisposition, CreateRequest, IMPERSONATION_DELEGATE,
};
use nimbus_wire::fscc::{access, attributes};
use nimbus_wire::oplock::{lease_flags, oplock_level, LeaseContext};
use nimbus_wire::security_descriptor::SecurityDescriptor;
use nimbus_wire::NtStatus;

use super::super::create_durable::DurableAsk;
use super::super::create_security;
use crate::ctx::Ctx;
use crate::durable::GuidKey;
use crate::errors::vfs_status;
use crate::server::Share;
use crate::session::{Session, Tree};
use crate::sync::lock;

/// What a CREATE is made on: its tree, session and share, and the share's
/// file system.
pub struct On<'a> {
    pub tree: &'a Arc<Tree>,
    pub session: &'a Arc<Session>,
    pub share: &'a Arc<Share>,
    pub fs: &'a LocalFs,
}

/// What a CREATE asks, read from its request: what every later stage reads.
pub struct Create<'a> {
    pub req: CreateRequest,
    pub tree: &'a Arc<Tree>,
    pub session: &'a Arc<Session>,
    pub share: &'a Arc<Share>,
    pub fs: &'a LocalFs,
    pub durable: DurableAsk,
    /// ClientGuid and CreateGuid of a DH2Q request.
    pub replay_key: Option<GuidKey>,
    /// CreateOptions.
    pub options: u32,
    pub disposition: CreateDisposition,
    /// FILE_DIRECTORY_FILE.
    pub want_dir: bool,
    /// FILE_NON_DIRECTORY_FILE.
    pub want_file: bool,
    /// Supersede, overwrite or overwrite-if.
    pub truncating: bool,
    /// DesiredAccess, generic rights mapped.
    pub desired: u32,
    pub delete_on_close: bool,
    /// The answer to a Mac's AAPL context.
    pub aapl_reply: Option<Vec<u8>>,
    /// The descriptor a new file is to get (an SecD context).
    pub given_sd: Option<SecurityDescriptor>,
    /// The caching asked for.
    pub want: Want,
    /// The file's share-relative path, in the case it has on disk.
    pub path: String,
    pub stream: Stream,
    /// The directory the path resolves through, on a cluster node
    /// (`crate::directory_scope`): for a named stream read here, before
    /// its lookup, and compared with a read after it; for other names set
    /// once the name is looked up, from the directory the lookup went
    /// through (`super::directory_looked_in`).
    pub directory: Option<FileKey>,
}

/// Reads `req` (neither a reconnect nor a replay), refusing what no
/// CREATE may ask before anything is looked up.
pub fn read<'a>(
    ctx: &Ctx<'_>,
    req: CreateRequest,
    on: On<'a>,
    durable: DurableAsk,
    replay_key: Option<GuidKey>,
) -> Result<Create<'a>, NtStatus> {
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
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let desired = access::map_generic(req.desired_access);
    let delete_on_close = options & opt::DELETE_ON_CLOSE != 0;
    if delete_on_close && desired & (access::DELETE | access::MAXIMUM_ALLOWED) == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if lock(&on.session.opens).len() >= ctx.server.config().limits.max_open_files_per_session {
        return Err(NtStatus::TOO_MANY_OPENED_FILES);
    }
    for c in &req.contexts {
        match c.name.as_slice() {
            // Previous versions (snapshots) are not served.
            context_name::TIMEWARP_TOKEN => return Err(NtStatus::OBJECT_NAME_NOT_FOUND),
            // The EAs a new or overwritten file gets: checked here, before
            // anything is created, set once it is.
            context_name::EA_BUFFER if !c.data.is_empty() => {
                let list = nimbus_wire::ea::parse_full_ea_list(&c.data)
                    .map_err(|_| NtStatus::EA_LIST_INCONSISTENT)?;
                if list.iter().any(|ea| !crate::eas::valid_name(ea.name)) {
                    return Err(NtStatus::INVALID_EA_NAME);
                }
                if list.iter().any(|ea| crate::eas::reserved_name(ea.name)) {
                    return Err(NtStatus::ACCESS_DENIED);
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
        on.share,
        &req.contexts,
    )?;
    // The descriptor a new file is to get (checked before anything is made).
    let given_sd = create_security::given(&req.contexts)?;
    let want = requested_caching(ctx, &req)?;
    let (path, stream) = to_vfs_path_and_stream(&req.name)?;
    let path = crate::lookup::resolve(
        on.fs,
        &path,
        ctx.server.config().limits.max_directory_entries,
    );
    // A stream is a file's data, never a directory.
    if want_dir && stream != Stream::Unnamed {
        return Err(NtStatus::NOT_A_DIRECTORY);
    }
    Ok(Create {
        req,
        tree: on.tree,
        session: on.session,
        share: on.share,
        fs: on.fs,
        durable,
        replay_key,
        options,
        disposition,
        want_dir,
        want_file,
        truncating,
        desired,
        delete_on_close,
        aapl_reply,
        given_sd,
        want,
        directory: match stream {
            Stream::Named(_) => crate::directory_scope::directory_of(ctx.server, on.fs, &path)
                .map_err(|e| vfs_status(&e))?,
            _ => None,
        },
        path,
        stream,
    })
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
