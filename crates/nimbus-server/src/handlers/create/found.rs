//! CREATE, stage 2: what the name holds (a file, a directory, a stream of
//! a file, nothing), whether the request fits it, and what the caller may
//! do to it: the access the open gets (MS-SMB2 3.3.5.9, MS-FSA 2.1.5.1).

use nimbus_state::caching::{LeaseId, Want};
use nimbus_vfs::names::Stream;
use nimbus_vfs::{CreateMode, Kind, OpenOptions, Stat};
use nimbus_wire::create::CreateDisposition;
use nimbus_wire::fscc::{access, attributes};
use nimbus_wire::negotiate::capabilities;
use nimbus_wire::NtStatus;

use super::super::create_security::{self, Security};
use super::super::create_stream::{self, Base};
use super::request::Create;
use super::{Failed, WRITE_RIGHTS};
use crate::ctx::Ctx;
use crate::dosinfo::DosInfo;
use crate::errors::vfs_status;
use crate::fileinfo::is_readonly;

/// What a CREATE found under its name, and what it may do.
pub struct Found {
    /// For a named stream: the file it belongs to (made now if missing and
    /// the stream is to be created).
    pub base: Option<Base>,
    /// The stream as spelled on disk.
    pub stream_name: Option<String>,
    /// What the name holds (for a stream, the stream), if anything.
    pub existing: Option<Stat>,
    /// The directory the name was looked up in, on a cluster node; None
    /// for a named stream, a symlink and the share's root, whose directory
    /// (if any) is read by name.
    pub directory: Option<Stat>,
    pub creating: bool,
    pub is_dir: bool,
    /// The caching to ask for: none for a directory, unless it may be
    /// leased.
    pub want: Want,
    /// The directory lease the client keeps for this file's parent:
    /// changes made through this open leave it alone.
    pub parent_lease: Option<LeaseId>,
    /// READONLY, the file's whichever of its streams is opened.
    pub readonly_attr: bool,
    pub security: Security,
    /// The most the tree and the file's descriptor allow.
    pub max: u32,
    /// The access the open gets.
    pub granted: u32,
}

/// Looks at what `c` names and decides the access its open gets.
pub fn look(ctx: &Ctx<'_>, c: &Create<'_>) -> Result<Found, Failed> {
    let (share, fs, path, stream, session, tree, req) =
        (c.share, c.fs, &c.path, &c.stream, c.session, c.tree, &c.req);
    let (disposition, want_dir, want_file, truncating, desired, delete_on_close) = (
        c.disposition,
        c.want_dir,
        c.want_file,
        c.truncating,
        c.desired,
        c.delete_on_close,
    );
    let mut want = c.want;
    // For a named stream: the file it belongs to (made now if missing and
    // the stream is to be created), and the stream as spelled on disk.
    let mut base = None;
    let mut stream_name = None;
    let mut known_sds: (create_security::Known, create_security::Known) = (None, None);
    let mut directory = None;
    let existing = if let Stream::Named(name) = &stream {
        let may_create = !share.read_only() && tree.maximal_access() & access::FILE_WRITE_DATA != 0;
        // A Mac's stream of a file copied with an AppleDouble companion
        // (`._name`) is that companion's content (crate::apple), put there
        // only for a session that may write it into the file.
        if may_create && crate::apple::stream_kind(share, name).is_some() {
            let token = session.token().ok_or(NtStatus::USER_SESSION_DELETED)?;
            let writer = crate::apple::apple_double::Writer {
                token: &token,
                tree_max: tree.maximal_access(),
            };
            crate::apple::apple_double::convert(ctx.server, share, fs, path, writer);
        }
        let mut b = create_stream::open_base(fs, path, disposition, may_create)?;
        let found = b.find(name)?;
        // A stream that exists on disk but not for this client (an AfpInfo
        // never written, an empty stream for a Mac: crate::apple) is not
        // found by an open that does not create; one that creates gets it.
        if let Some((spelled, st)) = &found {
            if matches!(
                disposition,
                CreateDisposition::Open | CreateDisposition::Overwrite
            ) && !crate::apple::stream_exists(&ctx.conn.apple, share, spelled, st.size)
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
        // directory's) in one lookup; on a cluster node, the directory too.
        let found = if ctx.server.cluster.is_some() {
            fs.lookup_in_directory(path, crate::acl::store::XATTR_NAME)
        } else {
            fs.lookup(path, crate::acl::store::XATTR_NAME)
        }
        .map_err(|e| vfs_status(&e))?;
        directory = found.directory;
        let parent_read = found.stat.is_none();
        known_sds = (Some(found.xattr), parent_read.then_some(found.parent_xattr));
        found.stat
    };
    if let Some(st) = &existing {
        // A directory has no unnamed data stream.
        if st.is_dir && *stream == Stream::UnnamedData {
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
            path,
            is_new: base.as_ref().map_or(creating, |b| b.created),
            is_dir: base.as_ref().map_or(is_dir, |b| b.stat.is_dir),
            desired,
            truncating,
            adds_stream: base.as_ref().is_some_and(|b| !b.created) && creating,
            given: c.given_sd.as_ref(),
            own: known_sds.0,
            parent: known_sds.1,
        },
        &token,
    )?;

    // Access: what was asked (MAXIMUM_ALLOWED: all the tree and the
    // descriptor allow), never more than they allow, and no data writes to
    // a read-only file.
    let max = tree.maximal_access() & security.limit;
    let mut granted = if desired & access::MAXIMUM_ALLOWED != 0 {
        let mut g = (desired & !access::MAXIMUM_ALLOWED) | max;
        if readonly_attr && !creating && !is_dir {
            g &= !WRITE_RIGHTS;
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
        if granted & WRITE_RIGHTS != 0 || truncating {
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
        overwrite_keeps_attributes(fs, path, req.file_attributes)?;
    }
    if is_dir {
        // Data rights mean nothing on a directory; keep them for sharing only.
        granted &= !access::SYNCHRONIZE;
    }

    Ok(Found {
        base,
        stream_name,
        existing,
        directory,
        creating,
        is_dir,
        want,
        parent_lease,
        readonly_attr,
        security,
        max,
        granted,
    })
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
