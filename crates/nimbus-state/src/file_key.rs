//! A file's identity in the state records, below every module that keys
//! records by file.

/// Identifies a file independent of its name: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileKey {
    pub dev: u64,
    pub ino: u64,
}
