//! How much of the disk a file's data takes: MS-FSCC 2.4.41
//! FileStandardInformation's AllocationSize is the data stream's, while
//! `st_blocks` also counts the block a file system gives extended
//! attributes that do not fit in the inode (ext4, XFS). Nimbus keeps a
//! file's DOS attributes, EAs and security descriptor in extended
//! attributes, so without this an empty file with EAs would show 4 KiB
//! allocated (smbtorture smb2.setinfo sets AllocationSize 0 on such a file
//! and reads it back).
//!
//! `st_blocks` is taken as it is unless it exceeds the file's size rounded
//! up to a block: only then can a block be something else than data (an
//! extended-attribute block, or space preallocated past the end). The data
//! extents are then counted with FS_IOC_FIEMAP, a few ioctls at most; a
//! file with more extents than that, or a file system without FIEMAP
//! (tmpfs, which counts no attribute blocks anyway), keeps `st_blocks`.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::handle::FileHandle;
use crate::Stat;

/// FS_IOC_FIEMAP, `_IOWR('f', 11, struct fiemap)` (linux/fs.h).
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
/// fiemap_extent.fe_flags: the file's last extent (linux/fiemap.h).
const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// Extents asked for per ioctl, and ioctls at most.
const BATCH: usize = 32;
const ROUNDS: usize = 4;
/// The rounding of sizes when deciding whether to look (ext4's and XFS's
/// usual block).
const BLOCK: u64 = 4096;

/// struct fiemap_extent (linux/fiemap.h).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Extent {
    logical: u64,
    physical: u64,
    length: u64,
    reserved64: [u64; 2],
    flags: u32,
    reserved: [u32; 3],
}

/// struct fiemap with room for BATCH extents.
#[repr(C)]
struct Request {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [Extent; BATCH],
}

/// Whether `st_blocks` may count more than data (see the module's comment).
fn may_hold_more_than_data(st: &Stat) -> bool {
    !st.is_dir && !st.is_symlink && st.alloc_size > st.size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

impl FileHandle {
    /// The bytes of disk the file's data takes: `st.alloc_size` without
    /// blocks that hold no data (see the module's comment). `st` is this
    /// handle's own stat. An attribute-only handle (O_PATH) cannot be
    /// mapped: the file is opened again for reading through it.
    pub fn data_allocation(&self, st: &Stat) -> u64 {
        if !may_hold_more_than_data(st) {
            return st.alloc_size;
        }
        let mapped = mapped_bytes(self.raw()).or_else(|| {
            let path = std::ffi::CString::new(format!("/proc/self/fd/{}", self.raw())).ok()?;
            // The magic link names this very file; no name is looked up.
            let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
            // SAFETY: path is NUL-terminated.
            let fd = unsafe { libc::open(path.as_ptr(), flags) };
            if fd < 0 {
                return None;
            }
            // SAFETY: a fresh descriptor owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            mapped_bytes(fd.as_raw_fd())
        });
        mapped.map_or(st.alloc_size, |mapped| mapped.min(st.alloc_size))
    }
}

/// The total length of the data extents (written, unwritten or delayed)
/// of the file open as `fd`, if FIEMAP gives them all within ROUNDS calls.
fn mapped_bytes(fd: RawFd) -> Option<u64> {
    {
        let mut start = 0u64;
        let mut total = 0u64;
        for _ in 0..ROUNDS {
            let mut req = Request {
                start,
                length: u64::MAX - start,
                flags: 0,
                mapped_extents: 0,
                extent_count: BATCH as u32,
                reserved: 0,
                extents: [Extent::default(); BATCH],
            };
            // SAFETY: the descriptor is ours and open; `req` is a struct
            // fiemap followed by room for the `extent_count` extents the
            // kernel may fill, and lives across the call.
            let r = unsafe { libc::ioctl(fd, FS_IOC_FIEMAP, &mut req) };
            if r < 0 {
                return None;
            }
            let n = (req.mapped_extents as usize).min(BATCH);
            if n == 0 {
                return Some(total);
            }
            for e in &req.extents[..n] {
                total = total.saturating_add(e.length);
                if e.flags & FIEMAP_EXTENT_LAST != 0 {
                    return Some(total);
                }
            }
            let last = req.extents[n - 1];
            start = last.logical.saturating_add(last.length);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;

    use crate::{CreateMode, Kind, LocalFs, OpenOptions};

    fn set_xattr(path: &std::path::Path, name: &str, value: &[u8]) -> bool {
        let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        let n = std::ffi::CString::new(name).unwrap();
        // SAFETY: both strings are NUL-terminated; the value is a slice.
        let r = unsafe {
            libc::setxattr(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        r == 0
    }

    #[test]
    fn an_attribute_block_is_not_data() {
        let dir = std::env::temp_dir().join(format!("nimbus-alloc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fs = LocalFs::new(&dir).unwrap();
        let opts = OpenOptions {
            read: true,
            write: true,
            mode: CreateMode::OpenOrCreate,
            kind: Kind::File,
            perm: 0o644,
            append_only: false,
            expect: None,
        };
        let (h, _, _) = fs.open("f", &opts).unwrap();
        // More than fits in an ext4 inode: a block of its own there.
        if !set_xattr(&dir.join("f"), "user.big", &[7u8; 3000]) {
            let _ = std::fs::remove_dir_all(&dir);
            return; // no user xattrs on this file system: nothing to tell
        }
        let st = h.stat().unwrap();
        assert_eq!(h.data_allocation(&st), 0, "stat says {}", st.alloc_size);
        h.allocate(4096).unwrap();
        let st = h.stat().unwrap();
        let data = h.data_allocation(&st);
        // Preallocated past the end is data's (where the file system can
        // preallocate at all).
        assert!(data == 4096 || data == 0, "{data} of {}", st.alloc_size);
        h.write_at(&[1u8; 10000], 0).unwrap();
        h.sync().unwrap();
        let st = h.stat().unwrap();
        assert_eq!(h.data_allocation(&st), 12288, "stat says {}", st.alloc_size);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
