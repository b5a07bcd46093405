//! nimbus-vfs: the file system seam of the Nimbus SMB server.
//!
//! The VFS knows nothing about SMB's messages. Its one SMB piece is where
//! paths enter it: [`names`] checks the names clients send (MS-FSCC 2.1.5),
//! turns them into VFS paths and matches search patterns (MS-FSA 2.1.4.4),
//! answering with the NTSTATUS the client is told. Calls are synchronous (the server runs them on a blocking
//! thread pool) and take typed arguments. The [`LocalFs`] backend confines every path beneath a
//! share root with `openat2(2)` and `RESOLVE_BENEATH`, so `..`, absolute paths and symlinks that
//! lead outside the share are refused with [`VfsError::Escape`].
//!
//! Paths are relative to the share root, '/'-separated, without a leading '/'; `""` is the root.
//!
//! [`DirWatcher`] watches directories for changes made outside the process (Linux inotify), for
//! change notify.

mod allocation;
mod error;
mod extents;
mod handle;
mod local;
mod name_index;
pub mod names;
mod path;
mod streams;
mod sys;
mod watch;

#[cfg(test)]
mod tests;

pub use error::{VfsError, VfsResult};
pub use handle::FileHandle;
pub use local::{LocalFs, Lookup};
pub use name_index::{fold, DirKey, NameIndex, MIN_ENTRIES};
pub use streams::{Streams, STORE_DIR};
pub use watch::{DirWatcher, FsChange, FsEvent, Notice, OwnChange, Subscription};

/// A point in time as seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

/// Metadata of a file system object.
#[derive(Clone, Debug)]
pub struct Stat {
    pub size: u64,
    /// Bytes allocated on disk (`st_blocks * 512`).
    pub alloc_size: u64,
    pub is_dir: bool,
    pub is_symlink: bool,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub ino: u64,
    pub dev: u64,
    /// Tells apart files that had the same inode number one after
    /// another: a digest of the handle `name_to_handle_at(2)` gives the
    /// file (the handle NFS exports, which carries the inode's generation
    /// on ext4, XFS, Btrfs and tmpfs). 0 where the file system gives no
    /// handle, and in a directory listing's entries
    /// ([`FileHandle::read_dir`]), which do not read it: key no record by
    /// a listed entry's stat.
    pub gen: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// Birth time, when the file system records it.
    pub btime: Option<Timespec>,
}

/// Which file a caller checked, for the calls that act on a name only if
/// it still names that file ([`OpenOptions::expect`],
/// [`LocalFs::remove_if`], [`LocalFs::rename_if`]): device, inode and
/// generation ([`Stat::gen`]). The generation tells a file from a later
/// one that reused its inode; a generation of 0 on either side (not read,
/// or a file system without handles) compares device and inode only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub gen: u64,
}

impl Identity {
    pub const fn new(dev: u64, ino: u64, gen: u64) -> Identity {
        Identity { dev, ino, gen }
    }

    /// The identity of the file `st` describes.
    pub const fn of(st: &Stat) -> Identity {
        Identity::new(st.dev, st.ino, st.gen)
    }

    /// Whether the file found (`dev`, `ino`, and its generation, read only
    /// when asked for: `gen`) is this one.
    pub(crate) fn matches(&self, dev: u64, ino: u64, gen: impl FnOnce() -> u64) -> bool {
        if (dev, ino) != (self.dev, self.ino) {
            return false;
        }
        if self.gen == 0 {
            return true;
        }
        let found = gen();
        found == 0 || found == self.gen
    }
}

/// What [`LocalFs::open`] does when the name exists or is missing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateMode {
    /// Open; fail with `NotFound` if missing.
    OpenExisting,
    /// Create; fail with `Exists` if present.
    CreateNew,
    /// Open if present, otherwise create.
    OpenOrCreate,
    /// Open and truncate; fail with `NotFound` if missing.
    TruncateExisting,
    /// Truncate if present, otherwise create.
    CreateOrTruncate,
}

impl CreateMode {
    fn creates(self) -> bool {
        matches!(
            self,
            CreateMode::CreateNew | CreateMode::OpenOrCreate | CreateMode::CreateOrTruncate
        )
    }

    fn truncates(self) -> bool {
        matches!(
            self,
            CreateMode::TruncateExisting | CreateMode::CreateOrTruncate
        )
    }
}

/// Which kind of object an open expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Any,
    File,
    Directory,
}

/// Arguments of [`LocalFs::open`].
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    pub read: bool,
    pub write: bool,
    pub mode: CreateMode,
    pub kind: Kind,
    /// Permission bits for created objects (the process umask still applies).
    pub perm: u32,
    /// Every write lands at the end of the file, whatever offset it names
    /// (`O_APPEND`): an open granted FILE_APPEND_DATA without
    /// FILE_WRITE_DATA may add data but never overwrite it.
    pub append_only: bool,
    /// Open an existing object only if it is this one (device, inode,
    /// generation); otherwise fail with `Changed` before anything
    /// (truncation included) is done to it. Lets a caller that checked a
    /// file by name be sure it acts on the file it checked, not on a new
    /// file that took its name and reused its inode.
    pub expect: Option<Identity>,
}

/// One entry of [`FileHandle::read_dir`].
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: String,
    /// lstat-like: a symlink is described, not its target; `gen` is 0
    /// (not read for a listing).
    pub stat: Stat,
}

/// File system totals, from `statvfs`.
#[derive(Clone, Copy, Debug)]
pub struct FsStat {
    /// Size in bytes of the blocks counted below (`f_frsize`).
    pub block_size: u64,
    pub total_blocks: u64,
    pub free_blocks: u64,
    /// Free blocks available to unprivileged users.
    pub avail_blocks: u64,
    pub max_name_len: u64,
    pub fs_id: u64,
}
