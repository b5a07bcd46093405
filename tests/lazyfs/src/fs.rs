//! The file system: every call passes through to a backing directory,
//! except file data. Data written to a file stays in its `Dirty` cache
//! until an fsync or fdatasync of the file (or a write on an `O_SYNC` /
//! `O_DSYNC` descriptor) writes it to the backing file. Killing the
//! process is then a power loss: what was synced is in the backing
//! directory, what was not is gone.
//!
//! Namespace and metadata changes (create, rename, unlink, truncate,
//! fallocate, mode, times, extended attributes) reach the backing
//! directory at once. The layer tests what a crash does to data, not to
//! directory entries, which is where the state store's and the data
//! path's promises lie (both write into files that exist).

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::dirty::{Dirty, PAGE};

/// The kernel keeps no attributes or names: a file's size is the cache's,
/// which only this process knows.
const TTL: Duration = Duration::ZERO;

/// Acknowledge fsync without writing anything back: the mutation that
/// shows a power-loss test can fail. Set at start or by SIGUSR1.
pub static IGNORE_FSYNC: AtomicBool = AtomicBool::new(false);

fn ignoring_fsync() -> bool {
    IGNORE_FSYNC.load(Ordering::SeqCst)
}

pub struct LazyFs {
    root: PathBuf,
    /// The backing directory's inode number; it is the FUSE root (1), and
    /// a backing inode numbered 1, if any, takes its number.
    root_ino: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// FUSE inode -> its backing path, as last looked up.
    paths: HashMap<u64, PathBuf>,
    files: HashMap<u64, OpenFile>,
    dirs: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    next_handle: u64,
    /// Backing inode -> its unsynced data.
    dirty: HashMap<u64, Dirty>,
}

struct OpenFile {
    file: File,
    backing: u64,
    writable: bool,
    /// Opened `O_SYNC` or `O_DSYNC`: every write is written back at once.
    sync: bool,
}

impl LazyFs {
    pub fn new(root: PathBuf) -> io::Result<LazyFs> {
        let root_ino = std::fs::metadata(&root)?.ino();
        let mut state = State::default();
        state.paths.insert(1, root.clone());
        Ok(LazyFs {
            root,
            root_ino,
            state: Mutex::new(state),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Backing inode <-> FUSE inode; the map is its own inverse.
    fn swap_root(&self, ino: u64) -> u64 {
        if ino == self.root_ino {
            1
        } else if ino == 1 {
            self.root_ino
        } else {
            ino
        }
    }

    fn attr(&self, st: &State, md: &Metadata) -> FileAttr {
        let time = |secs: i64, nanos: i64| {
            let secs = u64::try_from(secs).unwrap_or(0);
            UNIX_EPOCH + Duration::new(secs, u32::try_from(nanos).unwrap_or(0))
        };
        let ft = md.file_type();
        let kind = if ft.is_dir() {
            FileType::Directory
        } else if ft.is_symlink() {
            FileType::Symlink
        } else if ft.is_fifo() {
            FileType::NamedPipe
        } else if ft.is_socket() {
            FileType::Socket
        } else if ft.is_char_device() {
            FileType::CharDevice
        } else if ft.is_block_device() {
            FileType::BlockDevice
        } else {
            FileType::RegularFile
        };
        FileAttr {
            ino: INodeNo(self.swap_root(md.ino())),
            size: st.dirty.get(&md.ino()).map_or(md.size(), Dirty::size),
            blocks: md.blocks(),
            atime: time(md.atime(), md.atime_nsec()),
            mtime: time(md.mtime(), md.mtime_nsec()),
            ctime: time(md.ctime(), md.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind,
            perm: (md.mode() & 0o7777) as u16,
            nlink: md.nlink() as u32,
            uid: md.uid(),
            gid: md.gid(),
            rdev: md.rdev() as u32,
            blksize: PAGE as u32,
            flags: 0,
        }
    }

    fn path(&self, st: &State, ino: INodeNo) -> Result<PathBuf, Errno> {
        st.paths.get(&ino.0).cloned().ok_or(Errno::ESTALE)
    }

    fn child(&self, st: &State, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(self.path(st, parent)?.join(name))
    }

    /// Looks `path` up and remembers it as its inode's path.
    fn entry(&self, st: &mut State, path: PathBuf) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(&path)?;
        let attr = self.attr(st, &md);
        st.paths.insert(attr.ino.0, path);
        Ok(attr)
    }

    /// Makes a new name `name` in `parent` with `make`, and looks it up.
    fn make(
        &self,
        parent: INodeNo,
        name: &OsStr,
        make: impl FnOnce(&Path) -> Result<(), Errno>,
    ) -> Result<FileAttr, Errno> {
        let mut st = self.state();
        let path = self.child(&st, parent, name)?;
        make(&path)?;
        self.entry(&mut st, path)
    }

    /// The attributes of `ino` through its path, refused if the path now
    /// names another file.
    fn stat(&self, st: &State, ino: INodeNo) -> Result<FileAttr, Errno> {
        let md = std::fs::symlink_metadata(self.path(st, ino)?)?;
        let attr = self.attr(st, &md);
        if attr.ino != ino {
            return Err(Errno::ESTALE);
        }
        Ok(attr)
    }

    /// Forgets the unsynced data of a file whose last name went, unless it
    /// is still open (then its last release does).
    fn unlinked(&self, st: &mut State, md: Option<Metadata>) {
        if let Some(md) = md.filter(|m| m.is_file() && m.nlink() <= 1) {
            if !st.files.values().any(|f| f.backing == md.ino()) {
                st.dirty.remove(&md.ino());
            }
        }
    }

    fn open_file(
        &self,
        st: &mut State,
        path: &Path,
        flags: i32,
        mode: u32,
    ) -> Result<(u64, FileAttr), Errno> {
        let acc = flags & libc::O_ACCMODE;
        let writable = acc != libc::O_RDONLY;
        // Reads fill pages from the backing file: a write-only open reads too.
        let base = if writable {
            libc::O_RDWR
        } else {
            libc::O_RDONLY
        };
        let keep = flags & (libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOFOLLOW);
        let c = cpath(path)?;
        // SAFETY: a NUL-terminated path and plain flags; the descriptor is owned below.
        let fd = unsafe { libc::open(c.as_ptr(), base | keep | libc::O_CLOEXEC, mode) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` was just opened and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        let md = file.metadata()?;
        if flags & libc::O_TRUNC != 0 {
            if let Some(d) = st.dirty.get_mut(&md.ino()) {
                d.truncate(0);
            }
        }
        let attr = self.attr(st, &md);
        st.paths.insert(attr.ino.0, path.to_path_buf());
        st.next_handle += 1;
        let fh = st.next_handle;
        st.files.insert(
            fh,
            OpenFile {
                file,
                backing: md.ino(),
                writable,
                sync: flags & (libc::O_SYNC | libc::O_DSYNC) != 0,
            },
        );
        Ok((fh, attr))
    }

    /// Writes the unsynced data of `fh`'s file to the backing file.
    fn write_back(&self, st: &mut State, fh: FileHandle) -> Result<(), Errno> {
        let f = st.files.get(&fh.0).ok_or(Errno::EBADF)?;
        let Some(dirty) = st.dirty.get(&f.backing) else {
            return Ok(());
        };
        // fsync is allowed on a read-only descriptor: write through a new one.
        let reopened;
        let file = if f.writable {
            &f.file
        } else {
            reopened = std::fs::OpenOptions::new()
                .write(true)
                .open(format!("/proc/self/fd/{}", f.file.as_raw_fd()))?;
            &reopened
        };
        for (at, bytes) in dirty.pages() {
            file.write_all_at(bytes, at)?;
        }
        if file.metadata()?.len() < dirty.size() {
            file.set_len(dirty.size())?;
        }
        let backing = f.backing;
        st.dirty.remove(&backing);
        Ok(())
    }
}

fn cpath(path: &Path) -> Result<CString, Errno> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

fn cname(name: &OsStr) -> Result<CString, Errno> {
    CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

/// Turns a libc return value into a result, reading errno on failure.
fn check(r: libc::c_int) -> Result<(), Errno> {
    if r < 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

fn check_len(r: libc::ssize_t) -> Result<usize, Errno> {
    usize::try_from(r).map_err(|_| io::Error::last_os_error().into())
}

/// Reads as much of `buf` as the file holds from `at` on; the rest stays zero.
fn read_full(file: &File, at: u64, buf: &mut [u8]) {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
}

fn timespec(t: Option<TimeOrNow>) -> libc::timespec {
    let (tv_sec, tv_nsec) = match t {
        None => (0, libc::UTIME_OMIT),
        Some(TimeOrNow::Now) => (0, libc::UTIME_NOW),
        Some(TimeOrNow::SpecificTime(t)) => {
            let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
            (
                d.as_secs() as libc::time_t,
                d.subsec_nanos() as libc::c_long,
            )
        }
    };
    libc::timespec { tv_sec, tv_nsec }
}

impl Filesystem for LazyFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.state();
        match self
            .child(&st, parent, name)
            .and_then(|p| self.entry(&mut st, p))
        {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.state();
        let attr = match fh.and_then(|fh| st.files.get(&fh.0)) {
            Some(f) => f
                .file
                .metadata()
                .map(|md| self.attr(&st, &md))
                .map_err(Errno::from),
            None => self.stat(&st, ino),
        };
        match attr {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut st = self.state();
        let result = (|| {
            let path = self.path(&st, ino)?;
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            }
            if uid.is_some() || gid.is_some() {
                std::os::unix::fs::lchown(&path, uid, gid)?;
            }
            if let Some(size) = size {
                let len = i64::try_from(size).map_err(|_| Errno::EFBIG)?;
                let backing = match fh.and_then(|fh| st.files.get(&fh.0)) {
                    Some(f) if f.writable => {
                        // SAFETY: plain call on a descriptor we own.
                        check(unsafe { libc::ftruncate(f.file.as_raw_fd(), len) })?;
                        f.backing
                    }
                    _ => {
                        let c = cpath(&path)?;
                        // SAFETY: a NUL-terminated path.
                        check(unsafe { libc::truncate(c.as_ptr(), len) })?;
                        std::fs::symlink_metadata(&path)?.ino()
                    }
                };
                if let Some(d) = st.dirty.get_mut(&backing) {
                    d.truncate(size);
                }
            }
            if atime.is_some() || mtime.is_some() {
                let times = [timespec(atime), timespec(mtime)];
                let c = cpath(&path)?;
                // SAFETY: a NUL-terminated path and two timespecs.
                check(unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                })?;
            }
            match fh.and_then(|fh| st.files.get(&fh.0)) {
                Some(f) => Ok(self.attr(&st, &f.file.metadata()?)),
                None => self.stat(&st, ino),
            }
        })();
        reply_attr(result, reply);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let st = self.state();
        match self.path(&st, ino).and_then(|p| Ok(std::fs::read_link(p)?)) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(
            self.make(parent, name, |path| {
                let c = cpath(path)?;
                // SAFETY: a NUL-terminated path and plain arguments.
                check(unsafe { libc::mknod(c.as_ptr(), mode, libc::dev_t::from(rdev)) })
            }),
            reply,
        );
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply_entry(
            self.make(parent, name, |path| {
                use std::os::unix::fs::DirBuilderExt;
                Ok(std::fs::DirBuilder::new().mode(mode).create(path)?)
            }),
            reply,
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.state();
        let result = self.child(&st, parent, name).and_then(|path| {
            let md = std::fs::symlink_metadata(&path).ok();
            std::fs::remove_file(&path)?;
            self.unlinked(&mut st, md);
            Ok(())
        });
        reply_empty(result, reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let st = self.state();
        match self
            .child(&st, parent, name)
            .and_then(|p| Ok(std::fs::remove_dir(p)?))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        reply_entry(
            self.make(parent, link_name, |path| {
                Ok(std::os::unix::fs::symlink(target, path)?)
            }),
            reply,
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        let result = (|| {
            let from = self.child(&st, parent, name)?;
            let to = self.child(&st, newparent, newname)?;
            let replaced = std::fs::symlink_metadata(&to).ok();
            let (f, t) = (cpath(&from)?, cpath(&to)?);
            // SAFETY: NUL-terminated paths and the kernel's own flags.
            check(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    f.as_ptr(),
                    libc::AT_FDCWD,
                    t.as_ptr(),
                    flags.bits(),
                )
            })?;
            let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
            for path in st.paths.values_mut() {
                if let Ok(rest) = path.strip_prefix(&from) {
                    *path = to.join(rest);
                } else if let Ok(rest) = path.strip_prefix(&to).map(Path::to_path_buf) {
                    if exchange {
                        *path = from.join(rest);
                    }
                }
            }
            if !exchange {
                self.unlinked(&mut st, replaced);
            }
            Ok(())
        })();
        reply_empty(result, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut st = self.state();
        let result = (|| {
            let from = self.path(&st, ino)?;
            let to = self.child(&st, newparent, newname)?;
            std::fs::hard_link(&from, &to)?;
            self.entry(&mut st, to)
        })();
        reply_entry(result, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.state();
        let opened = self.path(&st, ino).and_then(|path| {
            // Truncation on open comes as its own setattr.
            self.open_file(
                &mut st,
                &path,
                flags.0 & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC),
                0,
            )
        });
        match opened {
            Ok((fh, _)) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = self.state();
        let result = (|| {
            let f = st.files.get(&fh.0).ok_or(Errno::EBADF)?;
            let dirty = st.dirty.get(&f.backing);
            let len = match dirty {
                Some(d) => d.size(),
                None => f.file.metadata()?.len(),
            };
            let n = len.saturating_sub(offset).min(u64::from(size)) as usize;
            let mut buf = vec![0u8; n];
            read_full(&f.file, offset, &mut buf);
            if let Some(d) = dirty {
                d.overlay(offset, &mut buf);
            }
            Ok(buf)
        })();
        match result {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = self.state();
        let result = (|| {
            let State { files, dirty, .. } = &mut *st;
            let f = files.get(&fh.0).ok_or(Errno::EBADF)?;
            if !f.writable {
                return Err(Errno::EBADF);
            }
            let d = match dirty.entry(f.backing) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(Dirty::new(f.file.metadata()?.len()))
                }
            };
            d.write(offset, data, |at, page| read_full(&f.file, at, page));
            // A write changes the modification time, as the disk's would.
            let times = [timespec(None), timespec(Some(TimeOrNow::Now))];
            // SAFETY: plain call on a descriptor we own.
            check(unsafe { libc::futimens(f.file.as_raw_fd(), times.as_ptr()) })?;
            let sync = f.sync;
            if sync && !ignoring_fsync() {
                self.write_back(&mut st, fh)?;
            }
            Ok(data.len() as u32)
        })();
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() syncs nothing, on a disk as here.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        if let Some(f) = st.files.remove(&fh.0) {
            let gone = f.file.metadata().is_ok_and(|m| m.nlink() == 0);
            if gone && !st.files.values().any(|o| o.backing == f.backing) {
                st.dirty.remove(&f.backing);
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if ignoring_fsync() {
            return reply.ok();
        }
        let mut st = self.state();
        match self.write_back(&mut st, fh) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.state();
        let listing = self.path(&st, ino).and_then(|path| {
            let mut entries = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (1, FileType::Directory, OsString::from("..")),
            ];
            for e in std::fs::read_dir(path)? {
                use std::os::unix::fs::DirEntryExt;
                let e = e?;
                let ft = e.file_type()?;
                let kind = if ft.is_dir() {
                    FileType::Directory
                } else if ft.is_symlink() {
                    FileType::Symlink
                } else {
                    FileType::RegularFile
                };
                entries.push((self.swap_root(e.ino()), kind, e.file_name()));
            }
            Ok(entries)
        });
        match listing {
            Ok(entries) => {
                st.next_handle += 1;
                let fh = st.next_handle;
                st.dirs.insert(fh, entries);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let st = self.state();
        let Some(entries) = st.dirs.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.state().dirs.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory changes were made on the backing directory already.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let result = (|| {
            let c = cpath(&self.root)?;
            // SAFETY: all-zero is a valid statvfs, filled in by the call.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: a NUL-terminated path and a statvfs to fill.
            check(unsafe { libc::statvfs(c.as_ptr(), &mut s) })?;
            Ok(s)
        })();
        match result {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let st = self.state();
        let result = (|| {
            let (c, n) = (cpath(&self.path(&st, ino)?)?, cname(name)?);
            // SAFETY: NUL-terminated path and name, and a buffer with its length.
            check(unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    flags,
                )
            })
        })();
        reply_empty(result, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let st = self.state();
        let result = (|| {
            let (c, n) = (cpath(&self.path(&st, ino)?)?, cname(name)?);
            let mut buf = vec![0u8; size as usize];
            // SAFETY: NUL-terminated path and name, and a buffer with its length.
            let len = check_len(unsafe {
                libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            })?;
            buf.truncate(len);
            Ok((len, buf))
        })();
        xattr_reply(result, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let st = self.state();
        let result = (|| {
            let c = cpath(&self.path(&st, ino)?)?;
            let mut buf = vec![0u8; size as usize];
            // SAFETY: a NUL-terminated path and a buffer with its length.
            let len = check_len(unsafe {
                libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
            })?;
            buf.truncate(len);
            Ok((len, buf))
        })();
        xattr_reply(result, size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let st = self.state();
        let result = (|| {
            let (c, n) = (cpath(&self.path(&st, ino)?)?, cname(name)?);
            // SAFETY: NUL-terminated path and name.
            check(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
        })();
        reply_empty(result, reply);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The backing directory's own permissions apply on every call.
        reply.ok();
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut st = self.state();
        let result = self
            .child(&st, parent, name)
            .and_then(|path| self.open_file(&mut st, &path, flags | libc::O_CREAT, mode));
        match result {
            Ok((fh, attr)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = self.state();
        let result = (|| {
            let State { files, dirty, .. } = &mut *st;
            let f = files.get(&fh.0).ok_or(Errno::EBADF)?;
            let (off, len) = (
                i64::try_from(offset).map_err(|_| Errno::EFBIG)?,
                i64::try_from(length).map_err(|_| Errno::EFBIG)?,
            );
            // SAFETY: plain call on a descriptor we own.
            check(unsafe { libc::fallocate(f.file.as_raw_fd(), mode, off, len) })?;
            if let Some(d) = dirty.get_mut(&f.backing) {
                if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
                    d.zero(offset, length);
                }
                if mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
                    d.grow(offset.saturating_add(length));
                }
            }
            Ok(())
        })();
        reply_empty(result, reply);
    }
}

/// With `size` 0 the caller asks how long the value is (the call was
/// made with an empty buffer, which returns the length); else for it.
fn reply_entry(result: Result<FileAttr, Errno>, reply: ReplyEntry) {
    match result {
        Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
        Err(e) => reply.error(e),
    }
}

fn reply_attr(result: Result<FileAttr, Errno>, reply: ReplyAttr) {
    match result {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(e) => reply.error(e),
    }
}

fn reply_empty(result: Result<(), Errno>, reply: ReplyEmpty) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn xattr_reply(result: Result<(usize, Vec<u8>), Errno>, size: u32, reply: ReplyXattr) {
    match result {
        Ok((len, _)) if size == 0 => reply.size(len as u32),
        Ok((_, buf)) => reply.data(&buf),
        Err(e) => reply.error(e),
    }
}
