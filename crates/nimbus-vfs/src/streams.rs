//! Named data streams (MS-FSCC 2.1.5.3, `file:name:$DATA`).
//!
//! A Linux file has one stream of data. The others a Windows or macOS
//! client gives a file (Zone.Identifier, AFP_Resource, ...) are kept as
//! plain files, one directory of them per file, in a store hidden at the
//! share root: `.nimbus-streams/<2 hex>/<32 hex>/`. Not in extended
//! attributes: one of those holds at most 64 KiB (ext4 without ea_inode: a
//! block), and a resource fork or a downloaded file's streams can be much
//! larger; a plain file also reads, writes, locks and copies like any
//! other.
//!
//! The directory is named by a random id the file keeps in its
//! `user.nimbus.streams` extended attribute, not by its inode number: the
//! id goes with the file through renames and hard links, and a number the
//! file system reuses once the file is deleted (outside Nimbus, say) cannot
//! hand one file's streams to another. The directory records the inode
//! number of its file, so a copy made with its extended attributes
//! (`cp -a`) does not share the original's streams: it has none, until it
//! gets a directory of its own.
//!
//! Removing a file's last name through this crate removes its streams.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::error::{VfsError, VfsResult};
use crate::handle::{Access, FileHandle};
use crate::local::LocalFs;
use crate::sys::{self, openat2_beneath, resolve_error, RETRIES};
use crate::{Identity, OpenOptions, Stat};

/// The directory at the share root that holds the streams. The server
/// keeps clients out of it.
pub const STORE_DIR: &str = ".nimbus-streams";
/// A file's stream id: names its directory in the store.
const ID_XATTR: &str = "user.nimbus.streams";
/// On a store directory: the inode number of the file it belongs to.
const OWNER_XATTR: &str = "user.nimbus.streams.owner";
/// Starts every stream's file name, so that no stream name ("." or "..")
/// means anything to the file system.
const PREFIX: &str = ":";
/// Permissions of the store's directories and files: they are the
/// server's, never a client's or another local user's.
const STORE_PERM: u32 = 0o700;
const STREAM_PERM: u32 = 0o600;

type StreamId = [u8; 16];

fn store_path(id: &StreamId) -> String {
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    format!("{STORE_DIR}/{}/{hex}", &hex[..2])
}

fn disk_name(stream: &str) -> VfsResult<CString> {
    if stream.is_empty() || stream.contains('/') {
        return Err(VfsError::NameInvalid);
    }
    sys::cstring(&format!("{PREFIX}{stream}"))
}

/// The stream id a file carries, if any (a value of another length is no
/// id of ours).
fn stream_id(file: &FileHandle) -> VfsResult<Option<StreamId>> {
    Ok(file
        .get_xattr(ID_XATTR)?
        .and_then(|v| StreamId::try_from(v.as_slice()).ok()))
}

fn random_id() -> VfsResult<StreamId> {
    let mut id = [0u8; 16];
    let mut filled = 0;
    while filled < id.len() {
        // SAFETY: the pointer and length describe the unfilled rest of `id`.
        let n = unsafe { libc::getrandom(id[filled..].as_mut_ptr().cast(), id.len() - filled, 0) };
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            return Err(VfsError::last());
        }
        filled += n as usize;
    }
    Ok(id)
}

fn mkdir_at(dir: RawFd, name: &CString) -> VfsResult<bool> {
    match sys::cvt_retry(|| {
        // SAFETY: name is NUL-terminated; dir is a directory descriptor.
        unsafe { libc::mkdirat(dir, name.as_ptr(), STORE_PERM) }
    }) {
        Ok(_) => Ok(true),
        Err(VfsError::Exists) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The named streams of one file (or directory).
#[derive(Debug)]
pub struct Streams {
    dir: FileHandle,
}

impl LocalFs {
    /// The named streams of `base`: `None` when it has none and `create`
    /// is false; with `create`, its (new, empty) store directory is made.
    pub fn streams(&self, base: &FileHandle, create: bool) -> VfsResult<Option<Streams>> {
        let ino = base.stat()?.ino;
        if let Some(id) = stream_id(base)? {
            if let Some(dir) = self.open_store_dir(&id, ino)? {
                return Ok(Some(Streams { dir }));
            }
        }
        if !create {
            return Ok(None);
        }
        self.create_store_dir(base, ino)
            .map(|dir| Some(Streams { dir }))
    }

    /// Removes every named stream of `base` (an overwrite or supersede of
    /// a file leaves it only its unnamed stream).
    pub fn remove_streams(&self, base: &FileHandle) -> VfsResult<()> {
        let Some(id) = stream_id(base)? else {
            return Ok(());
        };
        self.forget_streams(&id, base.stat()?.ino)?;
        base.remove_xattr(ID_XATTR)
    }

    /// The store directory `id` names, if it belongs to inode `ino`.
    fn open_store_dir(&self, id: &StreamId, ino: u64) -> VfsResult<Option<FileHandle>> {
        let path = sys::cstring(&store_path(id))?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        match openat2_beneath(self.root(), &path, flags, 0) {
            Ok(fd) => {
                let dir = FileHandle::new(fd, true, Access::None);
                let owner = dir.get_xattr(OWNER_XATTR)?;
                Ok((owner.as_deref() == Some(&ino.to_le_bytes()[..])).then_some(dir))
            }
            Err(libc::ENOENT) => Ok(None),
            Err(e) => Err(resolve_error(e)),
        }
    }

    /// Makes a store directory for `base` and gives `base` its id. Of two
    /// racing creators (two clients, or two cluster nodes) the first to
    /// set the id wins; the other removes its directory and uses the
    /// winner's.
    fn create_store_dir(&self, base: &FileHandle, ino: u64) -> VfsResult<FileHandle> {
        for _ in 0..RETRIES {
            let id = random_id()?;
            let path = store_path(&id);
            let (bucket, _) = path.rsplit_once('/').unwrap_or((STORE_DIR, ""));
            mkdir_at(self.root(), &sys::cstring(STORE_DIR)?)?;
            mkdir_at(self.root(), &sys::cstring(bucket)?)?;
            if !mkdir_at(self.root(), &sys::cstring(&path)?)? {
                // 2^-128: a clash means a broken random source; try again.
                continue;
            }
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            let fd = openat2_beneath(self.root(), &sys::cstring(&path)?, flags, 0)
                .map_err(resolve_error)?;
            let dir = FileHandle::new(fd, true, Access::None);
            dir.set_xattr(OWNER_XATTR, &ino.to_le_bytes())?;
            match base.set_xattr_with(ID_XATTR, &id, libc::XATTR_CREATE) {
                Ok(()) => return Ok(dir),
                Err(VfsError::Exists) => {}
                Err(e) => {
                    let _ = self.forget_streams(&id, ino);
                    return Err(e);
                }
            }
            // Another creator won, or the file carries an id that names no
            // directory of its own (copied with the file's attributes).
            let _ = self.forget_streams(&id, ino);
            if let Some(theirs) = stream_id(base)? {
                if let Some(dir) = self.open_store_dir(&theirs, ino)? {
                    return Ok(dir);
                }
            }
            base.remove_xattr(ID_XATTR)?;
        }
        Err(VfsError::Busy)
    }

    /// Removes the store directory `id` and the streams in it, if it
    /// belongs to inode `ino`.
    pub(crate) fn forget_streams(&self, id: &StreamId, ino: u64) -> VfsResult<()> {
        let Some(dir) = self.open_store_dir(id, ino)? else {
            return Ok(());
        };
        for name in dir.read_dir_names()? {
            let c = sys::cstring(&name)?;
            match sys::cvt_retry(|| {
                // SAFETY: c is NUL-terminated; dir is a directory descriptor.
                unsafe { libc::unlinkat(dir.raw(), c.as_ptr(), 0) }
            }) {
                Ok(_) | Err(VfsError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        let path = sys::cstring(&store_path(id))?;
        match sys::cvt_retry(|| {
            // SAFETY: path is NUL-terminated and relative to the root descriptor.
            unsafe { libc::unlinkat(self.root(), path.as_ptr(), libc::AT_REMOVEDIR) }
        }) {
            Ok(_) | Err(VfsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Before the entry `name` of `parent` is removed or replaced: the
    /// streams that go with it, if this is its last name (a directory, or
    /// a file of one link).
    pub(crate) fn streams_going(&self, parent: RawFd, name: &CString) -> Option<(StreamId, u64)> {
        let fd = sys::cvt_retry(|| {
            // SAFETY: name is NUL-terminated; parent is a directory descriptor.
            unsafe {
                libc::openat(
                    parent,
                    name.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            }
        })
        .ok()?;
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let st = sys::fstat_raw(fd.as_raw_fd()).ok()?;
        let kind = st.st_mode & libc::S_IFMT;
        let last = kind == libc::S_IFDIR || (kind == libc::S_IFREG && st.st_nlink == 1);
        if !last {
            return None;
        }
        let handle = FileHandle::new(fd, kind == libc::S_IFDIR, Access::Path);
        let id = stream_id(&handle).ok()??;
        Some((id, st.st_ino))
    }

    /// After the removal `streams_going` was asked about: the streams go.
    pub(crate) fn streams_gone(&self, going: Option<(StreamId, u64)>) {
        if let Some((id, ino)) = going {
            if let Err(e) = self.forget_streams(&id, ino) {
                tracing::warn!("removing the streams of a removed file: {e}");
            }
        }
    }
}

impl Streams {
    /// Each stream's name (as created) and metadata, in no particular
    /// order.
    pub fn list(&self) -> VfsResult<Vec<(String, Stat)>> {
        Ok(self
            .dir
            .read_dir()?
            .into_iter()
            .filter_map(|e| {
                let name = e.name.strip_prefix(PREFIX)?.to_string();
                Some((name, e.stat))
            })
            .collect())
    }

    /// The streams' names, without their metadata.
    pub fn names(&self) -> VfsResult<Vec<String>> {
        Ok(self
            .dir
            .find_names(|n| n.starts_with(PREFIX))?
            .into_iter()
            .map(|n| n[PREFIX.len()..].to_string())
            .collect())
    }

    pub fn stat(&self, name: &str) -> VfsResult<Stat> {
        sys::stat_at(self.dir.raw(), &disk_name(name)?, libc::AT_SYMLINK_NOFOLLOW)
            .map_err(VfsError::from_errno)
    }

    /// Opens (and per `opts.mode` creates or truncates) the stream `name`,
    /// exactly as spelled. Returns the handle, its stat and whether it was
    /// created.
    pub fn open(&self, name: &str, opts: &OpenOptions) -> VfsResult<(FileHandle, Stat, bool)> {
        let c = disk_name(name)?;
        let access = Access::from_opts(opts);
        let mut flags = access.open_flags() | libc::O_NOFOLLOW;
        if opts.append_only {
            flags |= libc::O_APPEND;
        }
        for _ in 0..RETRIES {
            if opts.mode != crate::CreateMode::CreateNew {
                match openat2_beneath(self.dir.raw(), &c, flags, 0) {
                    Ok(fd) => {
                        let h = FileHandle::new(fd, false, access);
                        let mut st = h.stat()?;
                        if opts
                            .expect
                            .is_some_and(|id| !id.matches(st.dev, st.ino, || st.gen))
                        {
                            return Err(VfsError::Changed);
                        }
                        if opts.mode.truncates() {
                            h.set_len(0)?;
                            st = h.stat()?;
                        }
                        return Ok((h, st, false));
                    }
                    Err(libc::ENOENT) if opts.mode.creates() => {}
                    Err(e) => return Err(resolve_error(e)),
                }
            }
            let create = flags | libc::O_CREAT | libc::O_EXCL;
            match openat2_beneath(self.dir.raw(), &c, create, STREAM_PERM) {
                Ok(fd) => {
                    let h = FileHandle::new(fd, false, access);
                    let st = h.stat()?;
                    return Ok((h, st, true));
                }
                Err(libc::EEXIST) if opts.mode != crate::CreateMode::CreateNew => continue,
                Err(e) => return Err(resolve_error(e)),
            }
        }
        Err(VfsError::Exists)
    }

    /// Removes the stream `name` if it is still the object `identity`
    /// (device, inode, generation), else `Changed`.
    pub fn remove_if(&self, name: &str, identity: Identity) -> VfsResult<()> {
        let c = disk_name(name)?;
        let st = sys::fstat_raw_at(self.dir.raw(), &c)?;
        if !identity.matches(st.st_dev, st.st_ino, || sys::gen_at(self.dir.raw(), &c)) {
            return Err(VfsError::Changed);
        }
        sys::cvt_retry(|| {
            // SAFETY: c is NUL-terminated; the descriptor is a directory.
            unsafe { libc::unlinkat(self.dir.raw(), c.as_ptr(), 0) }
        })?;
        Ok(())
    }

    /// Renames the stream `from` to `to`; an existing `to` is replaced
    /// with `replace`, else `Exists`.
    pub fn rename(&self, from: &str, to: &str, replace: bool) -> VfsResult<()> {
        let (f, t) = (disk_name(from)?, disk_name(to)?);
        let flags = if replace { 0 } else { libc::RENAME_NOREPLACE };
        loop {
            // SAFETY: both names are NUL-terminated; the descriptor is a directory.
            let r = unsafe {
                libc::renameat2(
                    self.dir.raw(),
                    f.as_ptr(),
                    self.dir.raw(),
                    t.as_ptr(),
                    flags,
                )
            };
            if r == 0 {
                return Ok(());
            }
            match sys::errno() {
                libc::EINTR => continue,
                e => return Err(VfsError::from_errno(e)),
            }
        }
    }
}
