//! Open file and directory handles.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};

use crate::error::{VfsError, VfsResult};
use crate::sys;
use crate::{DirEntry, OpenOptions, Stat, Timespec};

/// What a handle was opened for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// Attribute-only, backed by a real descriptor (`O_RDONLY`, or a directory).
    None,
    /// Attribute-only, backed by an `O_PATH` descriptor.
    Path,
    Read,
    Write,
    ReadWrite,
}

impl Access {
    pub(crate) fn from_opts(opts: &OpenOptions) -> Access {
        match (opts.read, opts.write) {
            (false, false) => Access::None,
            (true, false) => Access::Read,
            (false, true) => Access::Write,
            (true, true) => Access::ReadWrite,
        }
    }

    pub(crate) fn open_flags(self) -> i32 {
        match self {
            Access::None | Access::Read => libc::O_RDONLY,
            Access::Path => libc::O_PATH,
            Access::Write => libc::O_WRONLY,
            Access::ReadWrite => libc::O_RDWR,
        }
    }

    pub(crate) fn can_read(self) -> bool {
        matches!(self, Access::Read | Access::ReadWrite)
    }

    pub(crate) fn can_write(self) -> bool {
        matches!(self, Access::Write | Access::ReadWrite)
    }
}

/// An open file or directory. Dropping it closes the descriptor.
#[derive(Debug)]
pub struct FileHandle {
    fd: OwnedFd,
    is_dir: bool,
    pub(crate) access: Access,
    /// Whether the file lives in memory (tmpfs, ramfs), learnt at the
    /// first read or write that needs it: 0 not known yet, 1 yes, 2 no.
    in_memory: AtomicU8,
    /// Whether its file system takes buffered writes with RWF_NOWAIT,
    /// learnt at the first write that tries: 0 not known yet, 1 yes, 2 no
    /// (ext4 and tmpfs on Linux 6.18; XFS and btrfs take them).
    nowait_writes: AtomicU8,
}

/// tmpfs's and ramfs's `f_type` (statfs(2)).
const MEMORY_FS: [i64; 2] = [0x0102_1994, 0x8584_58F6];

pub(crate) fn check_offset(offset: u64) -> VfsResult<i64> {
    i64::try_from(offset).map_err(|_| VfsError::InvalidParameter)
}

fn timespec(t: Option<Timespec>) -> libc::timespec {
    match t {
        Some(t) => libc::timespec {
            tv_sec: t.sec,
            tv_nsec: i64::from(t.nsec),
        },
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    }
}

impl FileHandle {
    pub(crate) fn new(fd: OwnedFd, is_dir: bool, access: Access) -> FileHandle {
        FileHandle {
            fd,
            is_dir,
            access,
            in_memory: AtomicU8::new(0),
            nowait_writes: AtomicU8::new(0),
        }
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// `/proc/self/fd/N`, to reach the object of an `O_PATH` descriptor with calls that refuse
    /// such descriptors. It names our own descriptor, so following it cannot escape.
    fn proc_path(&self) -> CString {
        // Digits hold no NUL, so this cannot fail; were it to, the empty path
        // makes the syscall fail with ENOENT instead of panicking.
        CString::new(format!("/proc/self/fd/{}", self.raw())).unwrap_or_default()
    }

    /// Whether this handle is a directory.
    pub fn is_dir(&self) -> bool {
        self.is_dir
    }

    pub(crate) fn check_io(&self, allowed: bool) -> VfsResult<()> {
        if self.is_dir {
            Err(VfsError::IsADirectory)
        } else if !allowed {
            Err(VfsError::AccessDenied)
        } else {
            Ok(())
        }
    }

    /// Reads at `offset` until `buf` is full or end of file; returns the bytes read.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> VfsResult<usize> {
        // SAFETY: buf is a valid writable buffer of buf.len() bytes.
        unsafe { self.pread_full(buf.as_mut_ptr(), buf.len(), offset) }
    }

    /// Reads up to `len` bytes at `offset` onto the end of `buf`, straight
    /// into its spare capacity: unlike `read_at` into a resized Vec, the
    /// buffer is not zero-filled first (for an 8 MiB READ that memset was a
    /// tenth of the server's CPU). Returns the bytes read; `buf` grows by
    /// exactly that many.
    pub fn read_append(&self, buf: &mut Vec<u8>, len: usize, offset: u64) -> VfsResult<usize> {
        // Exact: amortised growth could double a pooled buffer past the
        // size the connection's pool keeps, and it would be dropped.
        buf.reserve_exact(len);
        let spare = buf.spare_capacity_mut();
        // SAFETY: spare has at least `len` writable bytes; pread_full writes
        // only through the pointer, and reports how many bytes it wrote.
        let n = unsafe { self.pread_full(spare.as_mut_ptr().cast(), len, offset)? };
        // SAFETY: the first n bytes of the spare capacity were just written
        // by the kernel, so they are initialised.
        unsafe { buf.set_len(buf.len() + n) };
        Ok(n)
    }

    /// [`FileHandle::read_append`] of what the page cache holds now, without
    /// waiting for the disk: preadv2(2) with RWF_NOWAIT. Returns the bytes
    /// appended, and whether the read stopped short for want of cached
    /// pages (or because the file system cannot say: EOPNOTSUPP), in which
    /// case the caller reads the rest with `read_append` where it may wait.
    /// A caller on an async runtime's worker reads a cached range here at
    /// the cost of a plain pread, and hands only a read that would wait to
    /// a thread that may block.
    pub fn read_append_cached(
        &self,
        buf: &mut Vec<u8>,
        len: usize,
        offset: u64,
    ) -> VfsResult<(usize, bool)> {
        self.check_io(self.access.can_read())?;
        let start = check_offset(offset)?;
        buf.reserve_exact(len);
        let spare = buf.spare_capacity_mut();
        let dst: *mut u8 = spare.as_mut_ptr().cast();
        let mut done = 0usize;
        let mut short = false;
        // A file system found to keep files in memory at an earlier
        // refusal of RWF_NOWAIT (tmpfs, on Linux 6.18 still) has no disk to
        // wait for: read at once, without a call that fails.
        if self.in_memory.load(Ordering::Relaxed) == 1 {
            // SAFETY: dst .. dst + len lies within the spare capacity
            // reserved above.
            done = unsafe { self.pread_full(dst, len, offset)? };
        }
        while done < len && self.in_memory.load(Ordering::Relaxed) != 1 {
            let Some(pos) = start.checked_add(done as i64) else {
                break;
            };
            let iov = libc::iovec {
                // SAFETY: dst + done .. dst + len lies within the spare
                // capacity reserved above.
                iov_base: unsafe { dst.add(done) }.cast(),
                iov_len: len - done,
            };
            // SAFETY: one iovec over writable memory of iov_len bytes.
            let n = unsafe { libc::preadv2(self.raw(), &iov, 1, pos, libc::RWF_NOWAIT) };
            if n < 0 {
                match sys::errno() {
                    libc::EINTR => continue,
                    // A file system without RWF_NOWAIT that keeps files
                    // in memory (tmpfs, on Linux 6.18 still) has no disk to
                    // wait for: read the rest here.
                    libc::EOPNOTSUPP if self.in_memory() => {
                        // SAFETY: as above, within the reserved capacity.
                        let pos = offset + done as u64;
                        done += unsafe { self.pread_full(dst.add(done), len - done, pos)? };
                        break;
                    }
                    libc::EAGAIN | libc::EOPNOTSUPP => {
                        short = true;
                        break;
                    }
                    e => return Err(VfsError::from_errno(e)),
                }
            }
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        // SAFETY: the kernel wrote the first `done` bytes of the spare
        // capacity.
        unsafe { buf.set_len(buf.len() + done) };
        Ok((done, short))
    }

    /// Whether the file's file system keeps it in memory (asked once).
    fn in_memory(&self) -> bool {
        match self.in_memory.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                // SAFETY: zeroed statfs is a valid value for this plain C
                // struct.
                let mut st: libc::statfs = unsafe { std::mem::zeroed() };
                // SAFETY: st is a valid out pointer for this descriptor.
                let known = unsafe { libc::fstatfs(self.raw(), &mut st) } == 0;
                let yes = known && MEMORY_FS.contains(&(st.f_type as i64));
                self.in_memory
                    .store(if yes { 1 } else { 2 }, Ordering::Relaxed);
                yes
            }
        }
    }

    /// pread(2) until `len` bytes or end of file.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes.
    unsafe fn pread_full(&self, dst: *mut u8, len: usize, offset: u64) -> VfsResult<usize> {
        self.check_io(self.access.can_read())?;
        let start = check_offset(offset)?;
        let mut done = 0usize;
        while done < len {
            let Some(pos) = start.checked_add(done as i64) else {
                break;
            };
            // SAFETY: dst + done .. dst + len is within the caller's buffer.
            let n = unsafe { libc::pread(self.raw(), dst.add(done).cast(), len - done, pos) };
            if n < 0 {
                let e = sys::errno();
                if e == libc::EINTR {
                    continue;
                }
                return Err(VfsError::from_errno(e));
            }
            if n == 0 {
                break;
            }
            done += n as usize;
        }
        Ok(done)
    }

    /// Writes all of `buf` at `offset`; returns the bytes written (`buf.len()`).
    pub fn write_at(&self, buf: &[u8], offset: u64) -> VfsResult<usize> {
        let start = self.check_write(buf, offset)?;
        match self.pwrite_from(buf, start, 0) {
            (done, None) => Ok(done),
            (_, Some(e)) => Err(VfsError::from_errno(e)),
        }
    }

    /// [`FileHandle::write_at`] of what can be written now without waiting
    /// for the disk: the whole of `buf` on a file system that keeps files
    /// in memory, else pwritev2(2) with RWF_NOWAIT, which copies into the
    /// page cache only what needs neither a read of the disk nor room the
    /// writeback has to make first. Returns the bytes written and whether
    /// it stopped short (the caller writes the rest with `write_at` where
    /// it may wait). A file system that refuses RWF_NOWAIT for buffered
    /// writes is remembered, and each later call stops short at once
    /// (`writes_without_waiting` tells callers beforehand).
    pub fn write_at_cached(&self, buf: &[u8], offset: u64) -> VfsResult<(usize, bool)> {
        let start = self.check_write(buf, offset)?;
        let written = |(done, failed): (usize, Option<i32>)| match failed {
            None => Ok(done),
            Some(e) => Err(VfsError::from_errno(e)),
        };
        if self.in_memory.load(Ordering::Relaxed) == 1 {
            return written(self.pwrite_from(buf, start, 0)).map(|n| (n, false));
        }
        if self.nowait_writes.load(Ordering::Relaxed) == 2 {
            return Ok((0, true));
        }
        match self.pwrite_from(buf, start, libc::RWF_NOWAIT) {
            (done, None) => {
                self.nowait_writes.store(1, Ordering::Relaxed);
                Ok((done, false))
            }
            (done, Some(libc::EAGAIN)) => Ok((done, true)),
            (done, Some(libc::EOPNOTSUPP)) => {
                // tmpfs refuses RWF_NOWAIT (Linux 6.18) but has no disk to
                // wait for: write the rest here.
                if self.in_memory() {
                    let rest = written(self.pwrite_from(&buf[done..], start + done as i64, 0))?;
                    return Ok((done + rest, false));
                }
                self.nowait_writes.store(2, Ordering::Relaxed);
                Ok((done, true))
            }
            (_, Some(e)) => Err(VfsError::from_errno(e)),
        }
    }

    /// Whether a write through this handle may be made where waiting is
    /// costly (an async runtime's worker) with `write_at_cached`: false
    /// only once the handle has learnt that its file system neither keeps
    /// files in memory nor takes RWF_NOWAIT writes, so every write would
    /// have to be handed on.
    pub fn writes_without_waiting(&self) -> bool {
        self.in_memory.load(Ordering::Relaxed) == 1
            || self.nowait_writes.load(Ordering::Relaxed) != 2
    }

    /// The checks of a write of `buf` at `offset`; its start as an offset.
    fn check_write(&self, buf: &[u8], offset: u64) -> VfsResult<i64> {
        self.check_io(self.access.can_write())?;
        let start = check_offset(offset)?;
        if start.checked_add(buf.len() as i64).is_none() {
            return Err(VfsError::InvalidParameter);
        }
        Ok(start)
    }

    /// pwritev2(2) of `buf` at `start` with `flags` until it is all
    /// written or a call fails: the bytes written, and the errno that
    /// stopped it (ENOSPC for a call that wrote nothing).
    fn pwrite_from(&self, buf: &[u8], start: i64, flags: i32) -> (usize, Option<i32>) {
        let mut done = 0usize;
        while done < buf.len() {
            let rest = &buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_ptr().cast_mut().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: one iovec over rest, readable for iov_len bytes
            // (the kernel only reads through it for a write).
            let n = unsafe { libc::pwritev2(self.raw(), &iov, 1, start + done as i64, flags) };
            if n < 0 {
                match sys::errno() {
                    libc::EINTR => continue,
                    e => return (done, Some(e)),
                }
            }
            if n == 0 {
                return (done, Some(libc::ENOSPC));
            }
            done += n as usize;
        }
        (done, None)
    }

    /// Flushes data and metadata to stable storage (`fsync`). A no-op on `O_PATH` handles.
    pub fn sync(&self) -> VfsResult<()> {
        if self.access == Access::Path {
            return Ok(());
        }
        sys::cvt_retry(|| {
            // SAFETY: plain call on our descriptor.
            unsafe { libc::fsync(self.raw()) }
        })?;
        Ok(())
    }

    /// Truncates or extends the file to `len` bytes. Needs write access.
    pub fn set_len(&self, len: u64) -> VfsResult<()> {
        self.check_io(self.access.can_write())?;
        let len = check_offset(len)?;
        sys::cvt_retry(|| {
            // SAFETY: plain call on our descriptor.
            unsafe { libc::ftruncate(self.raw(), len) }
        })?;
        Ok(())
    }

    /// Reserves space for `len` bytes without changing the size (`FALLOC_FL_KEEP_SIZE`).
    /// Best effort: succeeds where the file system cannot preallocate. Needs write access.
    pub fn allocate(&self, len: u64) -> VfsResult<()> {
        self.check_io(self.access.can_write())?;
        let len = check_offset(len)?;
        if len == 0 {
            return Ok(());
        }
        let r = sys::cvt_retry(|| {
            // SAFETY: plain call on our descriptor.
            unsafe { libc::fallocate(self.raw(), libc::FALLOC_FL_KEEP_SIZE, 0, len) }
        });
        match r {
            Ok(_) => Ok(()),
            Err(VfsError::Io(e))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
                ) =>
            {
                Ok(())
            }
            Err(VfsError::InvalidParameter) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Metadata of the open object.
    pub fn stat(&self) -> VfsResult<Stat> {
        sys::stat_fd(self.raw())
    }

    /// Sets access and modification times; `None` leaves a time unchanged.
    pub fn set_times(&self, atime: Option<Timespec>, mtime: Option<Timespec>) -> VfsResult<()> {
        if atime.is_none() && mtime.is_none() {
            return Ok(());
        }
        if atime
            .iter()
            .chain(mtime.iter())
            .any(|t| t.nsec >= 1_000_000_000)
        {
            return Err(VfsError::InvalidParameter);
        }
        let times = [timespec(atime), timespec(mtime)];
        if self.access == Access::Path {
            let p = self.proc_path();
            sys::cvt_retry(|| {
                // SAFETY: p is NUL-terminated, times has two entries.
                unsafe { libc::utimensat(libc::AT_FDCWD, p.as_ptr(), times.as_ptr(), 0) }
            })?;
        } else {
            sys::cvt_retry(|| {
                // SAFETY: times has two entries.
                unsafe { libc::futimens(self.raw(), times.as_ptr()) }
            })?;
        }
        Ok(())
    }

    /// Sets the permission bits (`fchmod`).
    pub fn set_mode(&self, perm: u32) -> VfsResult<()> {
        let perm = perm & 0o7777;
        if self.access == Access::Path {
            let p = self.proc_path();
            sys::cvt_retry(|| {
                // SAFETY: p is NUL-terminated.
                unsafe { libc::fchmodat(libc::AT_FDCWD, p.as_ptr(), perm, 0) }
            })?;
        } else {
            sys::cvt_retry(|| {
                // SAFETY: plain call on our descriptor.
                unsafe { libc::fchmod(self.raw(), perm) }
            })?;
        }
        Ok(())
    }

    /// Reads the extended attribute `name` (e.g. `user.x`); `None` when the object has none
    /// of that name or the file system keeps no extended attributes.
    pub fn get_xattr(&self, name: &str) -> VfsResult<Option<Vec<u8>>> {
        let cname = sys::cstring(name)?;
        if self.access == Access::Path {
            let p = self.proc_path();
            sys::read_xattr(|buf, len| {
                // SAFETY: p and cname are NUL-terminated; buf has len writable bytes (or is null with len 0).
                unsafe { libc::getxattr(p.as_ptr(), cname.as_ptr(), buf, len) }
            })
        } else {
            sys::read_xattr(|buf, len| {
                // SAFETY: cname is NUL-terminated; buf has len writable bytes (or is null with len 0).
                unsafe { libc::fgetxattr(self.raw(), cname.as_ptr(), buf, len) }
            })
        }
    }

    /// Sets the extended attribute `name` to `value`, creating or replacing it.
    pub fn set_xattr(&self, name: &str, value: &[u8]) -> VfsResult<()> {
        self.set_xattr_with(name, value, 0)
    }

    /// [`FileHandle::set_xattr`] with `setxattr(2)` flags: `XATTR_CREATE`
    /// fails with `Exists` when the attribute is already there.
    pub(crate) fn set_xattr_with(&self, name: &str, value: &[u8], flags: i32) -> VfsResult<()> {
        let cname = sys::cstring(name)?;
        let ptr = value.as_ptr().cast();
        if self.access == Access::Path {
            let p = self.proc_path();
            sys::cvt_retry(|| {
                // SAFETY: p and cname are NUL-terminated; value is readable for its length.
                unsafe { libc::setxattr(p.as_ptr(), cname.as_ptr(), ptr, value.len(), flags) }
            })?;
        } else {
            sys::cvt_retry(|| {
                // SAFETY: cname is NUL-terminated; value is readable for its length.
                unsafe { libc::fsetxattr(self.raw(), cname.as_ptr(), ptr, value.len(), flags) }
            })?;
        }
        Ok(())
    }

    /// Removes the extended attribute `name`; one that is not there is no
    /// error.
    pub fn remove_xattr(&self, name: &str) -> VfsResult<()> {
        let cname = sys::cstring(name)?;
        let r = if self.access == Access::Path {
            let p = self.proc_path();
            sys::cvt_retry(|| {
                // SAFETY: p and cname are NUL-terminated.
                unsafe { libc::removexattr(p.as_ptr(), cname.as_ptr()) }
            })
        } else {
            sys::cvt_retry(|| {
                // SAFETY: cname is NUL-terminated.
                unsafe { libc::fremovexattr(self.raw(), cname.as_ptr()) }
            })
        };
        match r {
            Ok(_) => Ok(()),
            Err(VfsError::Io(e)) if e.raw_os_error() == Some(libc::ENODATA) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The names of the extended attributes that start with `prefix`, in
    /// the order the file system lists them.
    pub fn list_xattrs(&self, prefix: &str) -> VfsResult<Vec<String>> {
        let raw = if self.access == Access::Path {
            let p = self.proc_path();
            sys::read_xattr(|buf, len| {
                // SAFETY: p is NUL-terminated; buf has len writable bytes (or is null with len 0).
                unsafe { libc::listxattr(p.as_ptr(), buf.cast(), len) }
            })?
        } else {
            sys::read_xattr(|buf, len| {
                // SAFETY: buf has len writable bytes (or is null with len 0).
                unsafe { libc::flistxattr(self.raw(), buf.cast(), len) }
            })?
        };
        Ok(raw
            .unwrap_or_default()
            .split(|b| *b == 0)
            .filter_map(|n| std::str::from_utf8(n).ok())
            .filter(|n| !n.is_empty() && n.starts_with(prefix))
            .map(str::to_string)
            .collect())
    }

    /// An attribute-only handle (`O_PATH`) of the directory entry `entry`
    /// (one component, not followed if a symlink), for its extended
    /// attributes. Needs a directory handle.
    pub fn entry(&self, entry: &str) -> VfsResult<FileHandle> {
        if !self.is_dir {
            return Err(VfsError::NotADirectory);
        }
        if entry.is_empty() || entry.contains('/') || entry == "." || entry == ".." {
            return Err(VfsError::NameInvalid);
        }
        let centry = sys::cstring(entry)?;
        let fd = sys::cvt_retry(|| {
            // SAFETY: centry is NUL-terminated; our descriptor is a directory.
            unsafe {
                libc::openat(
                    self.raw(),
                    centry.as_ptr(),
                    libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            }
        })?;
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let is_dir = sys::fstat_raw(fd.as_raw_fd())?.st_mode & libc::S_IFMT == libc::S_IFDIR;
        Ok(FileHandle::new(fd, is_dir, Access::Path))
    }

    /// All entries of a directory except "." and "..", each with an lstat-like stat.
    ///
    /// Always lists from the start; concurrent calls on one handle are safe (each call reads
    /// through its own open file description). Names that are not UTF-8 are skipped, as are
    /// entries removed between listing and stat.
    pub fn read_dir(&self) -> VfsResult<Vec<DirEntry>> {
        self.read_dir_at_most(usize::MAX)
    }

    /// Like [`FileHandle::read_dir`], but fails with
    /// [`VfsError::TooManyEntries`] rather than hold more than `max` entries.
    pub fn read_dir_at_most(&self, max: usize) -> VfsResult<Vec<DirEntry>> {
        let mut out = Vec::new();
        self.walk_dir(|fd, name, cname| {
            if out.len() >= max {
                return Err(VfsError::TooManyEntries);
            }
            match sys::stat_at_without_gen(fd, cname, libc::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => out.push(DirEntry { name, stat }),
                Err(libc::ENOENT) => {}
                Err(e) => return Err(VfsError::from_errno(e)),
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The names of a directory's entries except "." and "..", without
    /// their metadata: cheaper than [`FileHandle::read_dir`] when only names matter.
    pub fn read_dir_names(&self) -> VfsResult<Vec<String>> {
        let mut out = Vec::new();
        self.walk_dir(|_, name, _| {
            out.push(name);
            Ok(())
        })?;
        Ok(out)
    }

    /// The names of a directory's entries (except "." and "..") for which
    /// `keep` is true. Holds only those, so a large directory costs time
    /// but no memory.
    pub fn find_names(&self, mut keep: impl FnMut(&str) -> bool) -> VfsResult<Vec<String>> {
        let mut out = Vec::new();
        self.walk_dir(|_, name, _| {
            if keep(&name) {
                out.push(name);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The names of a directory's subdirectories (never a symlink to one),
    /// at most `max` of them: the file type comes from the directory entry
    /// where the file system records it, so files cost no stat.
    pub(crate) fn subdirectory_names(&self, max: usize) -> VfsResult<Vec<String>> {
        let mut out = Vec::new();
        let r = self.walk_dir_raw(|fd, cname, d_type| {
            let is_dir = match d_type {
                libc::DT_DIR => true,
                libc::DT_UNKNOWN => sys::file_type_at(fd, cname, libc::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|t| t == libc::S_IFDIR),
                _ => false,
            };
            if !is_dir {
                return Ok(());
            }
            if out.len() >= max {
                return Err(VfsError::TooManyEntries);
            }
            if let Ok(name) = std::str::from_utf8(cname.to_bytes()) {
                out.push(name.to_owned());
            }
            Ok(())
        });
        match r {
            Ok(()) | Err(VfsError::TooManyEntries) => Ok(out),
            Err(e) => Err(e),
        }
    }

    /// Whether a directory has any entry besides "." and "..", whatever its
    /// name: reads only up to the first one, so the cost does not grow with
    /// the directory.
    pub fn has_entries(&self) -> VfsResult<bool> {
        let mut found = false;
        let r = self.walk_dir_raw(|_, _, _| {
            found = true;
            // Stop the walk: the answer is known.
            Err(VfsError::TooManyEntries)
        });
        match r {
            Ok(()) => Ok(false),
            Err(VfsError::TooManyEntries) if found => Ok(true),
            Err(e) => Err(e),
        }
    }

    /// Calls `f(dirfd, name, cname)` for each UTF-8 entry other than "." and "..".
    fn walk_dir(&self, mut f: impl FnMut(RawFd, String, &CStr) -> VfsResult<()>) -> VfsResult<()> {
        self.walk_dir_raw(|fd, cname, _| {
            let Ok(name) = std::str::from_utf8(cname.to_bytes()) else {
                return Ok(());
            };
            f(fd, name.to_owned(), cname)
        })
    }

    /// Calls `f(dirfd, cname, d_type)` for each entry other than "." and "..".
    fn walk_dir_raw(&self, mut f: impl FnMut(RawFd, &CStr, u8) -> VfsResult<()>) -> VfsResult<()> {
        if !self.is_dir {
            return Err(VfsError::NotADirectory);
        }
        let fd = sys::cvt_retry(|| {
            // SAFETY: "." is NUL-terminated; our descriptor is a directory.
            unsafe {
                libc::openat(
                    self.raw(),
                    c".".as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
                )
            }
        })?;
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let stream = DirStream::new(fd)?;
        loop {
            // SAFETY: errno is thread-local; reset it to tell end-of-stream from an error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: stream.dir is a valid open DIR*.
            let ent = unsafe { libc::readdir64(stream.dir) };
            if ent.is_null() {
                let e = sys::errno();
                if e != 0 {
                    return Err(VfsError::from_errno(e));
                }
                return Ok(());
            }
            // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated; it stays
            // valid until the next readdir on this stream.
            let cname = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) };
            let bytes = cname.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            // SAFETY: as above, the entry stays valid until the next readdir.
            let d_type = unsafe { (*ent).d_type };
            let cname = cname.to_owned();
            f(stream.fd(), &cname, d_type)?;
        }
    }
}

/// An owned `DIR*`, closed (with its descriptor) on drop.
struct DirStream {
    dir: *mut libc::DIR,
}

impl DirStream {
    fn new(fd: OwnedFd) -> VfsResult<DirStream> {
        let raw = fd.as_raw_fd();
        // SAFETY: raw is an open directory descriptor; on success the DIR takes ownership.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            return Err(VfsError::last());
        }
        std::mem::forget(fd);
        Ok(DirStream { dir })
    }

    fn fd(&self) -> RawFd {
        // SAFETY: self.dir is a valid open DIR*.
        unsafe { libc::dirfd(self.dir) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: self.dir is a valid DIR* that is closed exactly once, here.
        unsafe { libc::closedir(self.dir) };
    }
}
