//! The local backend: a directory tree confined beneath a share root.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::error::{VfsError, VfsResult};
use crate::handle::{Access, FileHandle};
use crate::path::SharePath;
use crate::sys::{self, openat2_beneath, resolve_error, RETRIES};
use crate::{FsStat, Identity, Kind, OpenOptions, Stat};

/// Symlinks followed in one lookup at most (the kernel's own bound).
const MAX_SYMLINKS_FOLLOWED: usize = 40;

fn parent_c(path: &[u8]) -> VfsResult<CString> {
    CString::new(path).map_err(|_| VfsError::NameInvalid)
}

/// A share backed by a local directory.
///
/// Every lookup goes through `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`
/// relative to an `O_PATH` descriptor of the root, so nothing outside the root is reachable.
/// Symlinks that stay inside the share are followed (relative ones only: the kernel refuses
/// absolute symlinks under `RESOLVE_BENEATH`).
#[derive(Debug)]
pub struct LocalFs {
    root_fd: OwnedFd,
    root: PathBuf,
    /// Whether the file system shares extents, found out once, when first
    /// asked.
    clones: std::sync::OnceLock<bool>,
    /// The case-blind index of large directories (`crate::name_index`),
    /// made when first asked for, where the file system allows one.
    names: std::sync::OnceLock<Option<crate::name_index::NameIndex>>,
}

impl LocalFs {
    /// Opens a share rooted at `root`, which must exist and be a directory.
    pub fn new(root: &Path) -> VfsResult<LocalFs> {
        let c = CString::new(root.as_os_str().as_bytes()).map_err(|_| VfsError::NameInvalid)?;
        let fd = sys::cvt_retry(|| {
            // SAFETY: c is NUL-terminated.
            unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            }
        })?;
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        let root_fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(LocalFs {
            root_fd,
            root: root.to_path_buf(),
            clones: std::sync::OnceLock::new(),
            names: std::sync::OnceLock::new(),
        })
    }

    /// The case-blind index of this share's large directories; None where
    /// the file system's changes are not all seen by this machine's kernel
    /// (`crate::name_index`), or without inotify.
    pub fn name_index(&self) -> Option<&crate::name_index::NameIndex> {
        self.names
            .get_or_init(|| {
                if crate::name_index::local_fs(self.root()) {
                    crate::name_index::NameIndex::new()
                } else {
                    None
                }
            })
            .as_ref()
    }

    /// Whether files here can share extents (`FileHandle::clone_from`): the
    /// file system's FILE_SUPPORTS_BLOCK_REFCOUNTING.
    pub fn can_clone(&self) -> bool {
        *self
            .clones
            .get_or_init(|| crate::extents::can_clone_in(self.root()))
    }

    /// The directory this share was created on.
    pub fn root_path(&self) -> &Path {
        &self.root
    }

    pub(crate) fn root(&self) -> RawFd {
        self.root_fd.as_raw_fd()
    }

    /// The root's `O_PATH` descriptor, for the directory watches.
    pub(crate) fn root_fd(&self) -> &OwnedFd {
        &self.root_fd
    }

    /// Opens the parent directory (relative to the root) as `O_PATH`. A missing or non-directory
    /// component is `PathNotFound`.
    fn open_parent(&self, parent: &CStr) -> VfsResult<OwnedFd> {
        openat2_beneath(self.root(), parent, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|e| {
            match e {
                libc::ENOENT | libc::ENOTDIR => VfsError::PathNotFound,
                e => resolve_error(e),
            }
        })
    }

    /// Splits `path` into an opened parent directory and the final name; `None` for the root.
    fn parent_and_name(&self, path: &str) -> VfsResult<Option<(OwnedFd, CString)>> {
        let p = SharePath::parse(path)?;
        match p.split_last()? {
            None => Ok(None),
            Some((parent, name)) => Ok(Some((self.open_parent(&parent)?, name))),
        }
    }

    /// Opens (and per `opts.mode` creates or truncates) a file or directory.
    ///
    /// Returns the handle, its stat after the open, and whether the object was created.
    pub fn open(&self, path: &str, opts: &OpenOptions) -> VfsResult<(FileHandle, Stat, bool)> {
        self.open_in(path, opts, None)
    }

    /// As [`LocalFs::open`], except that a new object is made only in
    /// directory `dir`: when the name's directory is another one by then
    /// (renamed into its place since `dir` was read, even if `dir` came
    /// back meanwhile), nothing is made and the answer is `Changed`. For a
    /// caller that decided about a new file by its directory (a cluster
    /// node holding the files it makes under a claim on the directory).
    pub fn open_making_in(
        &self,
        path: &str,
        opts: &OpenOptions,
        dir: &Identity,
    ) -> VfsResult<(FileHandle, Stat, bool)> {
        self.open_in(path, opts, Some(dir))
    }

    fn open_in(
        &self,
        path: &str,
        opts: &OpenOptions,
        made_in: Option<&Identity>,
    ) -> VfsResult<(FileHandle, Stat, bool)> {
        let p = SharePath::parse(path)?;
        let full = p.full()?;
        let split = p.split_last()?;
        let parent = match &split {
            Some((parent, name)) => Some((self.open_parent(parent)?, name)),
            None => None,
        };
        for _ in 0..RETRIES {
            match openat2_beneath(self.root(), &full, libc::O_PATH, 0) {
                Ok(probe) => {
                    if let Some(h) = self.open_existing(&full, probe, opts)? {
                        let st = h.stat()?;
                        return Ok((h, st, false));
                    }
                }
                Err(libc::ENOENT) => {
                    let Some((parent, name)) = &parent else {
                        return Err(VfsError::NotFound);
                    };
                    if !opts.mode.creates() {
                        return Err(VfsError::NotFound);
                    }
                    // The directory a new object is made in is the one
                    // `parent` was opened as, whatever the name's is now.
                    // Exactly, unlike `Identity::matches`: a generation
                    // that cannot be read (0) proves nothing here.
                    if let Some(dir) = made_in {
                        let fd = parent.as_raw_fd();
                        let st = sys::fstat_raw(fd)?;
                        let same = (st.st_dev, st.st_ino) == (dir.dev, dir.ino)
                            && (dir.gen == 0 || sys::gen_of_fd(fd) == dir.gen);
                        if !same {
                            return Err(VfsError::Changed);
                        }
                    }
                    if let Some(h) = create(parent.as_raw_fd(), name, opts)? {
                        let st = h.stat()?;
                        return Ok((h, st, true));
                    }
                }
                // The parent exists, so a non-directory was met while following a symlink.
                Err(libc::ENOTDIR) => return Err(VfsError::PathNotFound),
                Err(e) => return Err(resolve_error(e)),
            }
        }
        // Something keeps racing with us; report the name as taken.
        Err(VfsError::Exists)
    }

    /// Opens an object the `O_PATH` probe found. `Ok(None)` means it changed under us: retry.
    fn open_existing(
        &self,
        full: &CStr,
        probe: OwnedFd,
        opts: &OpenOptions,
    ) -> VfsResult<Option<FileHandle>> {
        if opts.mode == crate::CreateMode::CreateNew {
            return Err(VfsError::Exists);
        }
        let st = sys::fstat_raw(probe.as_raw_fd())?;
        if opts.expect.is_some_and(|id| {
            !id.matches(st.st_dev, st.st_ino, || sys::gen_of_fd(probe.as_raw_fd()))
        }) {
            return Err(VfsError::Changed);
        }
        let truncate = opts.mode.truncates();
        let reopen = |flags: i32| -> VfsResult<Option<OwnedFd>> {
            match openat2_beneath(self.root(), full, flags, 0) {
                Ok(fd) => {
                    let now = sys::fstat_raw(fd.as_raw_fd())?;
                    // The file probed, and still the one expected: a file
                    // that took the name between the probe and this open
                    // may have reused the probed inode.
                    let same = now.st_dev == st.st_dev && now.st_ino == st.st_ino;
                    if same
                        && opts.expect.is_none_or(|id| {
                            id.matches(now.st_dev, now.st_ino, || sys::gen_of_fd(fd.as_raw_fd()))
                        })
                    {
                        Ok(Some(fd))
                    } else {
                        Ok(None)
                    }
                }
                Err(libc::ENOENT) => Ok(None),
                Err(e) => Err(resolve_error(e)),
            }
        };
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                if opts.kind == Kind::File || truncate {
                    return Err(VfsError::IsADirectory);
                }
                Ok(reopen(libc::O_RDONLY | libc::O_DIRECTORY)?
                    .map(|fd| FileHandle::new(fd, true, Access::None)))
            }
            libc::S_IFREG => {
                if opts.kind == Kind::Directory {
                    return Err(VfsError::NotADirectory);
                }
                let access = Access::from_opts(opts);
                let mut flags = access.open_flags() | libc::O_NONBLOCK;
                if opts.append_only {
                    flags |= libc::O_APPEND;
                }
                // No O_TRUNC: that would cut whatever the name reaches by
                // the time of the open. Truncate only once the descriptor
                // is known to be the object probed (and expected).
                match reopen(flags) {
                    Ok(Some(fd)) => {
                        if truncate {
                            sys::cvt_retry(|| {
                                // SAFETY: plain call on a descriptor we own.
                                unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }
                            })?;
                        }
                        Ok(Some(FileHandle::new(fd, false, access)))
                    }
                    // Replaced since the probe: with an expected identity
                    // the caller must look again; without, retry here.
                    Ok(None) if opts.expect.is_some() => Err(VfsError::Changed),
                    Ok(None) => Ok(None),
                    // Attribute-only open of a file we may not read: keep the O_PATH probe.
                    Err(VfsError::AccessDenied) if access == Access::None && !truncate => {
                        Ok(Some(FileHandle::new(probe, false, Access::Path)))
                    }
                    Err(e) => Err(e),
                }
            }
            _ => {
                // FIFOs, sockets and devices: never opened for I/O (an open could block or have
                // side effects); attribute-only handles are allowed.
                if opts.kind == Kind::Directory {
                    return Err(VfsError::NotADirectory);
                }
                if opts.read || opts.write || truncate {
                    return Err(VfsError::AccessDenied);
                }
                Ok(Some(FileHandle::new(probe, false, Access::Path)))
            }
        }
    }

    /// Stats `path`. A final symlink that resolves inside the share describes its target (with
    /// `is_symlink` set); one that dangles or escapes describes the link itself.
    pub fn stat(&self, path: &str) -> VfsResult<Stat> {
        let p = SharePath::parse(path)?;
        let Some((parent, name)) = p.split_last()? else {
            return sys::stat_fd(self.root());
        };
        let parent = self.open_parent(&parent)?;
        let lst = sys::stat_at(parent.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW)
            .map_err(VfsError::from_errno)?;
        if !lst.is_symlink {
            return Ok(lst);
        }
        match openat2_beneath(self.root(), &p.full()?, libc::O_PATH, 0) {
            Ok(fd) => {
                let mut st = sys::stat_fd(fd.as_raw_fd())?;
                st.is_symlink = true;
                Ok(st)
            }
            Err(_) => Ok(lst),
        }
    }

    /// The directory whose entry `path`'s final name is, following a final
    /// symlink that stays inside the share to its target's directory (as
    /// an open of `path` would): a missing name's is the directory it
    /// would be made in; a symlink to a directory by "/", "." or ".."
    /// gives that directory. None for the share's root, which is no
    /// directory's entry. A symlink that escapes is refused (`Escape`),
    /// as is a chain longer than the kernel follows.
    pub fn entry_directory(&self, path: &str) -> VfsResult<Option<Stat>> {
        let p = SharePath::parse(path)?;
        let Some((parent, name)) = p.split_last()? else {
            return Ok(None);
        };
        let mut dir_path = parent.into_bytes();
        let mut dir = self.open_parent(&parent_c(&dir_path)?)?;
        let mut name = name;
        // The kernel follows as many, then the name is the last.
        for _ in 0..=MAX_SYMLINKS_FOLLOWED {
            let target = match sys::readlink_at(dir.as_raw_fd(), &name) {
                Ok(t) => t,
                Err(libc::EINVAL | libc::ENOENT) => return sys::stat_fd(dir.as_raw_fd()).map(Some),
                Err(e) => return Err(VfsError::from_errno(e)),
            };
            if target.first() == Some(&b'/') {
                return Err(VfsError::Escape);
            }
            let (within, last) = match target.iter().rposition(|&b| b == b'/') {
                Some(i) => (Some(&target[..i]), &target[i + 1..]),
                None => (None, &target[..]),
            };
            if last.is_empty() || last == b"." || last == b".." {
                dir_path.push(b'/');
                dir_path.extend_from_slice(&target);
                let dir = self.open_parent(&parent_c(&dir_path)?)?;
                return sys::stat_fd(dir.as_raw_fd()).map(Some);
            }
            if let Some(within) = within {
                dir_path.push(b'/');
                dir_path.extend_from_slice(within);
                dir = self.open_parent(&parent_c(&dir_path)?)?;
            }
            name = CString::new(last).map_err(|_| VfsError::NameInvalid)?;
        }
        // As `resolve_error` answers a loop met by `openat2`.
        Err(VfsError::Escape)
    }

    /// What a CREATE looks up about `path` before it decides: the entry's
    /// stat (None: there is none), its extended attribute `xattr`, and when
    /// the entry is missing that of its directory, which decides about a
    /// new file. Three system calls on the way of `stat` alone (the parent
    /// lookup, statx, getxattrat): the attributes come from the descriptor
    /// of the parent already open.
    pub fn lookup(&self, path: &str, xattr: &str) -> VfsResult<Lookup> {
        self.lookup_noting(path, xattr, false)
    }

    /// As [`LocalFs::lookup`], and also the stat of the directory the
    /// entry was looked up in ([`Lookup::directory`]), read from the same
    /// descriptor: the directory the entry really came from, even one
    /// renamed into the name's place for a moment, which no read of the
    /// name before or after could tell (a cluster node compares that
    /// directory's claim). Two system calls more (statx and the handle of
    /// the directory).
    pub fn lookup_in_directory(&self, path: &str, xattr: &str) -> VfsResult<Lookup> {
        self.lookup_noting(path, xattr, true)
    }

    fn lookup_noting(&self, path: &str, xattr: &str, note_directory: bool) -> VfsResult<Lookup> {
        let cx = sys::cstring(xattr)?;
        let p = SharePath::parse(path)?;
        let Some((parent, name)) = p.split_last()? else {
            return Ok(Lookup {
                stat: Some(sys::stat_fd(self.root())?),
                xattr: sys::getxattr_at(self.root(), c".", &cx)?,
                parent_xattr: None,
                directory: None,
            });
        };
        let parent = self.open_parent(&parent)?;
        let directory = |parent: &OwnedFd| -> VfsResult<Option<Stat>> {
            if note_directory {
                sys::stat_fd(parent.as_raw_fd()).map(Some)
            } else {
                Ok(None)
            }
        };
        match sys::stat_at(parent.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if !st.is_symlink => Ok(Lookup {
                xattr: sys::getxattr_at(parent.as_raw_fd(), &name, &cx)?,
                stat: Some(st),
                parent_xattr: None,
                directory: directory(&parent)?,
            }),
            // A symlink: described (and its attribute read) as `stat`
            // describes it, through the target when it stays inside. Its
            // file's directory is the target's, not noted.
            Ok(_) => Ok(Lookup {
                stat: Some(self.stat(path)?),
                xattr: match self.get_xattr(path, xattr) {
                    Err(VfsError::NotFound | VfsError::PathNotFound | VfsError::Escape) => None,
                    r => r?,
                },
                parent_xattr: None,
                directory: None,
            }),
            Err(libc::ENOENT) => Ok(Lookup {
                stat: None,
                xattr: None,
                parent_xattr: sys::getxattr_at(parent.as_raw_fd(), c".", &cx)?,
                directory: directory(&parent)?,
            }),
            Err(e) => Err(VfsError::from_errno(e)),
        }
    }

    /// Reads the extended attribute `name` of what `path` names (a final
    /// symlink inside the share is followed, as `stat` does); `None` when
    /// it has none. One lookup, for checks made before a file is opened.
    pub fn get_xattr(&self, path: &str, name: &str) -> VfsResult<Option<Vec<u8>>> {
        let p = SharePath::parse(path)?;
        let fd = match p.split_last()? {
            None => openat2_beneath(self.root(), c".", libc::O_PATH, 0),
            Some(_) => openat2_beneath(self.root(), &p.full()?, libc::O_PATH, 0),
        }
        .map_err(|e| match e {
            libc::ENOENT => VfsError::NotFound,
            libc::ENOTDIR => VfsError::PathNotFound,
            e => resolve_error(e),
        })?;
        sys::getxattr_at(fd.as_raw_fd(), c"", &sys::cstring(name)?)
    }

    /// Removes a non-directory (a symlink itself, never its target).
    pub fn unlink(&self, path: &str) -> VfsResult<()> {
        let Some((parent, name)) = self.parent_and_name(path)? else {
            return Err(VfsError::IsADirectory);
        };
        let going = self.streams_going(parent.as_raw_fd(), &name);
        sys::cvt_retry(|| {
            // SAFETY: name is NUL-terminated; parent is a valid directory descriptor.
            unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), 0) }
        })?;
        self.streams_gone(going);
        Ok(())
    }

    /// Removes an empty directory. The share root cannot be removed.
    pub fn rmdir(&self, path: &str) -> VfsResult<()> {
        let Some((parent, name)) = self.parent_and_name(path)? else {
            return Err(VfsError::AccessDenied);
        };
        let going = self.streams_going(parent.as_raw_fd(), &name);
        sys::cvt_retry(|| {
            // SAFETY: name is NUL-terminated; parent is a valid directory descriptor.
            unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) }
        })
        .map_err(|e| match e {
            VfsError::Exists => VfsError::NotEmpty,
            e => e,
        })?;
        self.streams_gone(going);
        Ok(())
    }

    /// Removes `path` (an empty directory when `is_dir`) only if the name still refers to
    /// `identity` (device, inode, generation), else `Changed`. The name is checked through the opened parent
    /// right before `unlinkat`; no call unlinks by inode, so the window left is the one between
    /// those two calls, not the one since the caller last looked.
    pub fn remove_if(&self, path: &str, is_dir: bool, identity: Identity) -> VfsResult<()> {
        let Some((parent, name)) = self.parent_and_name(path)? else {
            return Err(VfsError::AccessDenied);
        };
        let st = sys::fstat_raw_at(parent.as_raw_fd(), &name)?;
        if !identity.matches(st.st_dev, st.st_ino, || {
            sys::gen_at(parent.as_raw_fd(), &name)
        }) {
            return Err(VfsError::Changed);
        }
        let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
        let going = self.streams_going(parent.as_raw_fd(), &name);
        sys::cvt_retry(|| {
            // SAFETY: name is NUL-terminated; parent is a valid directory descriptor.
            unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), flags) }
        })
        .map_err(|e| match e {
            VfsError::Exists if is_dir => VfsError::NotEmpty,
            e => e,
        })?;
        self.streams_gone(going);
        Ok(())
    }

    /// Renames `from` to `to`. Without `replace` an existing target is `Exists`; with `replace`
    /// an existing file is replaced, but an existing directory is never replaced
    /// (`AccessDenied`), as on Windows.
    pub fn rename(&self, from: &str, to: &str, replace: bool) -> VfsResult<()> {
        self.rename_checked(from, to, replace, None)
    }

    /// [`LocalFs::rename`] of the object `identity` (device, inode, generation): `Changed` if `from` names
    /// another object by now (checked through the opened parent right before `renameat2`).
    pub fn rename_if(
        &self,
        from: &str,
        to: &str,
        replace: bool,
        identity: Identity,
    ) -> VfsResult<()> {
        self.rename_checked(from, to, replace, Some(identity))
    }

    fn rename_checked(
        &self,
        from: &str,
        to: &str,
        replace: bool,
        identity: Option<Identity>,
    ) -> VfsResult<()> {
        let Some((fparent, fname)) = self.parent_and_name(from)? else {
            return Err(VfsError::AccessDenied);
        };
        let Some((tparent, tname)) = self.parent_and_name(to)? else {
            return Err(if replace {
                VfsError::AccessDenied
            } else {
                VfsError::Exists
            });
        };
        let (fp, tp) = (fparent.as_raw_fd(), tparent.as_raw_fd());
        let src = sys::fstat_raw_at(fp, &fname)?;
        if identity
            .is_some_and(|id| !id.matches(src.st_dev, src.st_ino, || sys::gen_at(fp, &fname)))
        {
            return Err(VfsError::Changed);
        }
        if replace {
            let mut going = None;
            if let Ok(dst) = sys::fstat_raw_at(tp, &tname) {
                let same = dst.st_dev == src.st_dev && dst.st_ino == src.st_ino;
                if dst.st_mode & libc::S_IFMT == libc::S_IFDIR && !same {
                    return Err(VfsError::AccessDenied);
                }
                if !same {
                    going = self.streams_going(tp, &tname);
                }
            }
            renameat2(fp, &fname, tp, &tname, 0).map_err(rename_error)?;
            // The file replaced is gone, and its streams with it.
            self.streams_gone(going);
            return Ok(());
        }
        match renameat2(fp, &fname, tp, &tname, libc::RENAME_NOREPLACE) {
            Ok(()) => Ok(()),
            // The file system does not support RENAME_NOREPLACE: check, then rename (racy).
            Err(libc::EINVAL) => {
                if sys::file_type_at(tp, &tname, libc::AT_SYMLINK_NOFOLLOW).is_ok() {
                    return Err(VfsError::Exists);
                }
                renameat2(fp, &fname, tp, &tname, 0).map_err(rename_error)
            }
            Err(e) => Err(rename_error(e)),
        }
    }

    /// File system totals of the share.
    pub fn statfs(&self) -> VfsResult<FsStat> {
        // SAFETY: zeroed statvfs is a valid value for this plain C struct.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        sys::cvt_retry(|| {
            // SAFETY: s is a valid out pointer; fstatvfs accepts O_PATH descriptors.
            unsafe { libc::fstatvfs(self.root(), &mut s) }
        })?;
        let block_size = if s.f_frsize != 0 {
            s.f_frsize
        } else {
            s.f_bsize
        };
        Ok(FsStat {
            block_size,
            total_blocks: s.f_blocks,
            free_blocks: s.f_bfree,
            avail_blocks: s.f_bavail,
            max_name_len: s.f_namemax,
            fs_id: s.f_fsid,
        })
    }
}

/// Creates `name` in `parent` per `opts`. `Ok(None)` means it appeared meanwhile: retry.
fn create(parent: RawFd, name: &CStr, opts: &OpenOptions) -> VfsResult<Option<FileHandle>> {
    let exists = || -> VfsResult<Option<FileHandle>> {
        // A dangling symlink looks missing to the probe but blocks creation: stop retrying.
        let is_link = sys::file_type_at(parent, name, libc::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|t| t == libc::S_IFLNK);
        if opts.mode == crate::CreateMode::CreateNew || is_link {
            Err(VfsError::Exists)
        } else {
            Ok(None)
        }
    };
    if opts.kind == Kind::Directory {
        let r = sys::cvt_retry(|| {
            // SAFETY: name is NUL-terminated; parent is a valid directory descriptor.
            unsafe { libc::mkdirat(parent, name.as_ptr(), opts.perm & 0o7777) }
        });
        match r {
            Ok(_) => {}
            Err(VfsError::Exists) => return exists(),
            Err(e) => return Err(e),
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        let fd = openat2_beneath(parent, name, flags, 0).map_err(resolve_error)?;
        return Ok(Some(FileHandle::new(fd, true, Access::None)));
    }
    let access = Access::from_opts(opts);
    let mut flags = access.open_flags() | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    if opts.append_only {
        flags |= libc::O_APPEND;
    }
    match openat2_beneath(parent, name, flags, opts.perm) {
        Ok(fd) => Ok(Some(FileHandle::new(fd, false, access))),
        Err(libc::EEXIST) => exists(),
        Err(e) => Err(resolve_error(e)),
    }
}

fn renameat2(fp: RawFd, fname: &CStr, tp: RawFd, tname: &CStr, flags: u32) -> Result<(), i32> {
    loop {
        // SAFETY: names are NUL-terminated; fp and tp are valid directory descriptors.
        let r = unsafe { libc::renameat2(fp, fname.as_ptr(), tp, tname.as_ptr(), flags) };
        if r == 0 {
            return Ok(());
        }
        let e = sys::errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
}

fn rename_error(errno: i32) -> VfsError {
    match errno {
        // A file onto a directory (or a directory onto a non-empty directory).
        libc::EISDIR => VfsError::AccessDenied,
        libc::EEXIST | libc::ENOTEMPTY => VfsError::Exists,
        e => VfsError::from_errno(e),
    }
}

/// What [`LocalFs::lookup`] found.
#[derive(Debug)]
pub struct Lookup {
    pub stat: Option<Stat>,
    pub xattr: Option<Vec<u8>>,
    /// The directory's attribute, read when the entry is missing.
    pub parent_xattr: Option<Vec<u8>>,
    /// The directory the entry was looked up in (the one holding it, or
    /// that would hold it when it is missing), from
    /// [`LocalFs::lookup_in_directory`]; None from [`LocalFs::lookup`],
    /// for the share's root, and for a symlink.
    pub directory: Option<Stat>,
}
