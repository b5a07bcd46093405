//! Where a file's data lies and how it moves without passing through the
//! server's memory: server-side copy (`copy_file_range`, which shares
//! extents on file systems that can), hole punching and zeroing
//! (`fallocate`), and the allocated ranges `SEEK_DATA`/`SEEK_HOLE` report.

use crate::error::{VfsError, VfsResult};
use crate::handle::{check_offset, FileHandle};
use crate::sys;

/// The piece size of a copy that cannot be done in the kernel, and of
/// zeroing by writing.
const COPY_PIECE: usize = 1 << 20;

/// A buffer for `len` bytes moved in pieces: one piece at most.
fn piece_buffer(len: u64) -> Vec<u8> {
    vec![0u8; usize::try_from(len).map_or(COPY_PIECE, |l| l.min(COPY_PIECE))]
}

/// Errors after which a copy is done by reading and writing instead:
/// the kernel cannot copy between these two files (another file system,
/// overlapping ranges of one file, an old kernel).
fn copy_unsupported(errno: i32) -> bool {
    matches!(
        errno,
        libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP
    )
}

/// Errors after which an `fallocate` mode is emulated by writing zeros.
fn fallocate_unsupported(errno: i32) -> bool {
    matches!(errno, libc::EOPNOTSUPP | libc::ENOSYS)
}

impl FileHandle {
    /// Copies `len` bytes of `src` at `src_offset` to this file at
    /// `dst_offset`, as if the whole range were read before any of it is
    /// written (so overlapping ranges of one file copy correctly). Returns
    /// the bytes copied: fewer than `len` only where `src` ends first.
    /// Needs read access on `src` and write access here.
    pub fn copy_from(
        &self,
        src: &FileHandle,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> VfsResult<u64> {
        src.check_io(src.access.can_read())?;
        self.check_io(self.access.can_write())?;
        let src_start = check_offset(src_offset)?;
        let dst_start = check_offset(dst_offset)?;
        let len_i = check_offset(len)?;
        if src_start.checked_add(len_i).is_none() || dst_start.checked_add(len_i).is_none() {
            return Err(VfsError::InvalidParameter);
        }
        if len == 0 {
            return Ok(0);
        }
        let overlap = src_offset < dst_offset + len && dst_offset < src_offset + len;
        if overlap && self.same_file(src)? {
            return self.copy_overlapping(src, src_offset, dst_offset, len);
        }
        let mut done = 0u64;
        while done < len {
            let mut from = src_start + done as i64;
            let mut to = dst_start + done as i64;
            let want = usize::try_from(len - done).unwrap_or(usize::MAX);
            // SAFETY: both descriptors are ours and open; the offsets are
            // plain integers the kernel updates.
            let n = unsafe {
                libc::copy_file_range(src.raw(), &mut from, self.raw(), &mut to, want, 0)
            };
            if n < 0 {
                let e = sys::errno();
                if e == libc::EINTR {
                    continue;
                }
                if copy_unsupported(e) {
                    return Ok(done
                        + self.copy_by_pieces(
                            src,
                            src_offset + done,
                            dst_offset + done,
                            len - done,
                        )?);
                }
                return Err(VfsError::from_errno(e));
            }
            if n == 0 {
                break; // end of the source
            }
            done += n as u64;
        }
        Ok(done)
    }

    /// Makes `len` bytes of this file at `dst_offset` share the extents of
    /// `src` at `src_offset` (FICLONERANGE): a copy that costs no space and
    /// no I/O, on a file system that shares extents (XFS with reflink,
    /// Btrfs). Elsewhere the error is `VfsError::Unsupported`; offsets and
    /// lengths not aligned to the file system's block are
    /// `InvalidParameter`. Needs read access on `src`, write access here.
    pub fn clone_from(
        &self,
        src: &FileHandle,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> VfsResult<()> {
        src.check_io(src.access.can_read())?;
        self.check_io(self.access.can_write())?;
        for v in [src_offset, dst_offset, len] {
            check_offset(v)?;
        }
        if len == 0 {
            return Ok(());
        }
        let range = libc::file_clone_range {
            src_fd: i64::from(src.raw()),
            src_offset,
            src_length: len,
            dest_offset: dst_offset,
        };
        // SAFETY: both descriptors are ours and open; `range` is a valid
        // file_clone_range the kernel only reads.
        let r = sys::cvt_retry(|| unsafe { libc::ioctl(self.raw(), libc::FICLONERANGE, &range) });
        match r {
            Ok(_) => Ok(()),
            Err(VfsError::Io(e))
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EXDEV) | Some(libc::ENOTTY)
                ) =>
            {
                Err(VfsError::Unsupported)
            }
            Err(e) => Err(e),
        }
    }

    fn same_file(&self, other: &FileHandle) -> VfsResult<bool> {
        let (a, b) = (self.stat()?, other.stat()?);
        Ok(a.dev == b.dev && a.ino == b.ino)
    }

    /// Reads and writes in pieces, front to back.
    fn copy_by_pieces(
        &self,
        src: &FileHandle,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> VfsResult<u64> {
        let mut buf = piece_buffer(len);
        let mut done = 0u64;
        while done < len {
            let want = usize::try_from(len - done)
                .unwrap_or(buf.len())
                .min(buf.len());
            let n = src.read_at(&mut buf[..want], src_offset + done)?;
            if n == 0 {
                break;
            }
            self.write_at(&buf[..n], dst_offset + done)?;
            done += n as u64;
        }
        Ok(done)
    }

    /// Overlapping ranges of one file, like memmove: pieces are taken from
    /// the end when the target lies after the source, so no piece is read
    /// after it was overwritten.
    fn copy_overlapping(
        &self,
        src: &FileHandle,
        src_offset: u64,
        dst_offset: u64,
        len: u64,
    ) -> VfsResult<u64> {
        if dst_offset <= src_offset {
            return self.copy_by_pieces(src, src_offset, dst_offset, len);
        }
        // Only what the source holds is copied: clip to its end first.
        let size = src.stat()?.size;
        let len = len.min(size.saturating_sub(src_offset));
        let mut buf = piece_buffer(len);
        let mut left = len;
        while left > 0 {
            let piece = left.min(buf.len() as u64);
            let at = left - piece;
            let n = src.read_at(&mut buf[..piece as usize], src_offset + at)?;
            if (n as u64) < piece {
                return Err(VfsError::Changed); // the source shrank meanwhile
            }
            self.write_at(&buf[..n], dst_offset + at)?;
            left = at;
        }
        Ok(len)
    }

    /// Frees the storage of `len` bytes at `offset` (they read as zeros
    /// afterwards) without changing the file's size. Where the file system
    /// cannot punch holes, the range is zeroed by writing. Needs write
    /// access.
    pub fn punch_hole(&self, offset: u64, len: u64) -> VfsResult<()> {
        self.fallocate_or_write_zeros(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    }

    /// Sets `len` bytes at `offset` to zero and keeps them allocated,
    /// without changing the file's size. Needs write access.
    pub fn zero_range(&self, offset: u64, len: u64) -> VfsResult<()> {
        self.fallocate_or_write_zeros(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    }

    fn fallocate_or_write_zeros(&self, mode: i32, offset: u64, len: u64) -> VfsResult<()> {
        self.check_io(self.access.can_write())?;
        let start = check_offset(offset)?;
        let len_i = check_offset(len)?;
        if start.checked_add(len_i).is_none() {
            return Err(VfsError::InvalidParameter);
        }
        if len == 0 {
            return Ok(());
        }
        let r = sys::cvt_retry(|| {
            // SAFETY: plain call on our descriptor.
            unsafe { libc::fallocate(self.raw(), mode, start, len_i) }
        });
        match r {
            Ok(_) => Ok(()),
            Err(VfsError::Io(e)) if e.raw_os_error().is_some_and(fallocate_unsupported) => {
                self.write_zeros(offset, len)
            }
            Err(e) => Err(e),
        }
    }

    fn write_zeros(&self, offset: u64, len: u64) -> VfsResult<()> {
        let zeros = piece_buffer(len);
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }

    /// The ranges holding data (not holes) between `offset` and `end`, as
    /// (offset, length), at most `max` of them; the flag says whether more
    /// followed. A file system without `SEEK_DATA` reports the whole range.
    pub fn data_ranges(
        &self,
        offset: u64,
        end: u64,
        max: usize,
    ) -> VfsResult<(Vec<(u64, u64)>, bool)> {
        if self.is_dir() {
            return Err(VfsError::IsADirectory);
        }
        check_offset(offset)?;
        check_offset(end)?;
        let mut ranges = Vec::new();
        let mut pos = offset;
        while pos < end {
            let data = match self.seek(pos, libc::SEEK_DATA)? {
                Seek::At(d) => d,
                Seek::Beyond => break,
                Seek::Unsupported => pos,
            };
            if data >= end {
                break;
            }
            let hole = match self.seek(data, libc::SEEK_HOLE)? {
                Seek::At(h) => h.min(end),
                Seek::Beyond | Seek::Unsupported => end,
            };
            if ranges.len() == max {
                return Ok((ranges, true));
            }
            ranges.push((data, hole - data));
            if hole <= data {
                break; // no progress: the file changed under us
            }
            pos = hole;
        }
        Ok((ranges, false))
    }

    fn seek(&self, offset: u64, whence: i32) -> VfsResult<Seek> {
        let off = check_offset(offset)?;
        // SAFETY: plain call on our descriptor. The file position it moves
        // is used by nothing else: all I/O is positional.
        let r = unsafe { libc::lseek(self.raw(), off, whence) };
        if r >= 0 {
            return Ok(Seek::At(r as u64));
        }
        match sys::errno() {
            libc::ENXIO => Ok(Seek::Beyond),
            libc::EINVAL => Ok(Seek::Unsupported),
            e => Err(VfsError::from_errno(e)),
        }
    }
}

enum Seek {
    At(u64),
    /// ENXIO: no data (or hole) at or after the offset.
    Beyond,
    /// The file system does not know SEEK_DATA/SEEK_HOLE.
    Unsupported,
}

/// Whether the file system of directory `dir` shares extents between
/// files: two unnamed temporary files (O_TMPFILE, so nothing appears in the
/// directory, nothing is left behind) are cloned one onto the other.
pub(crate) fn can_clone_in(dir: std::os::fd::RawFd) -> bool {
    use std::os::fd::{FromRawFd, OwnedFd};
    let tmp = || {
        // SAFETY: "." is NUL-terminated; the descriptor returned is owned
        // by the OwnedFd made of it at once.
        let fd = unsafe {
            libc::openat(
                dir,
                c".".as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        // SAFETY: a fresh descriptor nobody else owns.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let (Some(a), Some(b)) = (tmp(), tmp()) else {
        return false;
    };
    use std::os::fd::AsRawFd;
    // SAFETY: both descriptors are open; FICLONE takes the source's.
    unsafe { libc::ioctl(b.as_raw_fd(), libc::FICLONE, a.as_raw_fd()) == 0 }
}
