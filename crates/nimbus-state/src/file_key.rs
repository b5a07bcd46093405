//! A file's identity in the state records, below every module that keys
//! records by file.

/// Identifies a file independent of its name: device, inode, and a digest
/// of the file's handle that tells apart files that reused one inode
/// number one after another (`nimbus_vfs::Stat::gen`; 0 where the file
/// system gives no handle).
///
/// The generation matters for what outlives an open: another node's
/// ownership of a deleted file, a durable handle's record. Without it, a
/// new file that reuses the inode would be taken for the old one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub gen: u64,
}

impl FileKey {
    /// The key of a file from its three parts (tests, and records that
    /// carry them).
    pub const fn new(dev: u64, ino: u64, gen: u64) -> FileKey {
        FileKey { dev, ino, gen }
    }
}
