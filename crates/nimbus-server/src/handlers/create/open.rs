//! CREATE, stage 4: the file opened, or made, on disk, and only the file
//! whose share modes were checked (MS-SMB2 3.3.5.9).

use nimbus_state::FileKey;
use nimbus_vfs::{CreateMode, FileHandle, Identity, Kind, OpenOptions, OwnChange, Stat, VfsError};
use nimbus_wire::create::CreateDisposition;
use nimbus_wire::fscc::access;
use nimbus_wire::NtStatus;

use super::contend::Admitted;
use super::found::Found;
use super::request::Create;
use super::{undo, Failed, WRITE_RIGHTS};
use crate::ctx::Ctx;
use crate::errors::{sharing_status, vfs_status};
use crate::open_files::OpenFileSlot;

/// The file a CREATE opened.
pub struct Opened {
    pub handle: FileHandle,
    /// As opened.
    pub st: Stat,
    /// Made by this CREATE.
    pub created: bool,
    pub key: FileKey,
    /// Its place among the server's open files.
    pub file_slot: OpenFileSlot,
    /// What this CREATE does to the disk (the file, its DOS attributes,
    /// its allocation) is reported by `finish`, not again by the disk
    /// watch (crate::notify::disk), until this goes.
    pub own: Option<OwnChange>,
}

/// Opens or makes the file `c` names, as `f` and `a` decided.
pub fn open(ctx: &Ctx<'_>, c: &Create<'_>, f: &Found, a: &Admitted<'_>) -> Result<Opened, Failed> {
    let (share, fs, path, disposition, truncating, want_file) = (
        c.share,
        c.fs,
        &c.path,
        c.disposition,
        c.truncating,
        c.want_file,
    );
    let (base, stream_name, existing, creating, is_dir, readonly_attr, granted) = (
        &f.base,
        &f.stream_name,
        &f.existing,
        f.creating,
        f.is_dir,
        f.readonly_attr,
        f.granted,
    );
    let (registered, recorded, record) = (a.registered, a.recorded, a.record);
    let unregister = |key: FileKey| undo::unregister(ctx, c, f, a.open_id, key);
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
        write: granted & WRITE_RIGHTS != 0 || truncating,
        mode,
        kind,
        perm,
        // MS-FSA 2.1.5.3: data written through an open that may append but
        // not write goes to the end of the file, whatever offset it names.
        append_only: granted & WRITE_RIGHTS == access::FILE_APPEND_DATA,
        // Act (truncation included) only on the file whose share modes were
        // checked above; if the name was replaced meanwhile, look again.
        expect: existing.as_ref().map(Identity::of),
    };
    // A place among the server's open files before a descriptor is taken.
    let Some(file_slot) = ctx.server.open_files.reserve() else {
        if let Some(key) = registered {
            unregister(key);
        }
        return Err(NtStatus::TOO_MANY_OPENED_FILES.into());
    };
    // What this CREATE does to the disk (the file, its DOS attributes, its
    // allocation) is reported by `finish`, not again by the disk
    // watch (crate::notify::disk). Opening what exists changes nothing.
    let own = (mode != CreateMode::OpenExisting)
        .then(|| ctx.server.notify.own_change(share, &[path]))
        .flatten();
    // A regular file made here may be held with no take, under a claim
    // on its directory (`crate::directory_scope`); asked before the file
    // exists, as the claim must stand by then.
    let making = match c.directory {
        Some(dir) if creating && !is_dir && stream_name.is_none() && registered.is_none() => {
            ctx.server.share_modes.before_making(dir).map(|t| (dir, t))
        }
        _ => None,
    };
    let opened = match (&base, &stream_name) {
        (Some(b), Some(name)) => match &b.streams {
            Some(streams) => streams.open(name, &opts),
            None => Err(VfsError::NotFound),
        },
        // Made only in the directory claimed, not in one renamed into its
        // place since it was read (`Changed`: looked up again).
        _ => match making {
            Some((dir, _)) => {
                fs.open_making_in(path, &opts, &Identity::new(dir.dev, dir.ino, dir.gen))
            }
            None => fs.open(path, &opts),
        },
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
                // The directory claimed was replaced since it was read.
                VfsError::Changed if making.is_some() => Failed::Raced,
                e => vfs_status(&e).into(),
            });
        }
    };
    let key = FileKey {
        dev: st.dev,
        ino: st.ino,
        gen: st.gen,
    };
    // Only a file whose generation is known: a reused inode with none
    // would key another node's file (docs/SCALING.md, "Inode reuse").
    // (A file missing when looked up is opened with `CreateNew`: one made
    // meanwhile fails with `Exists` above and is looked up again, so a
    // file opened here was either found at the lookup or made by this
    // open, in the directory claimed.)
    if let (Some((dir, token)), true) = (making, created && key.gen != 0) {
        ctx.server.share_modes.made(key, dir, token);
    }
    // Made here: no other node's claim covers it (`nimbus_state::made_here`).
    let _made_here = created.then(nimbus_state::made_here);
    if registered.is_none() && recorded {
        ctx.server
            .share_modes
            .add_open(key, record)
            .map_err(|e| sharing_status(&e))?;
    }

    Ok(Opened {
        handle,
        st,
        created,
        key,
        file_slot,
        own,
    })
}
