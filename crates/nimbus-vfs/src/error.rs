//! Errors returned by the VFS.

use std::fmt;
use std::io;

/// What went wrong with a file system call, in terms the server can turn into a status code.
#[derive(Debug)]
#[non_exhaustive]
pub enum VfsError {
    /// The final component of the path does not exist.
    NotFound,
    /// An intermediate component is missing or is not a directory.
    PathNotFound,
    /// The name already exists.
    Exists,
    /// A directory was required but the object is something else.
    NotADirectory,
    /// A non-directory was required but the object is a directory.
    IsADirectory,
    /// The directory is not empty.
    NotEmpty,
    /// Permission denied (by the file system or by the handle's access).
    AccessDenied,
    /// The path would leave the share root (`..`, absolute path, symlink pointing outside).
    Escape,
    /// Out of space or quota, or the file would be too large.
    NoSpace,
    /// The path or name is malformed (empty name, NUL byte, too long).
    NameInvalid,
    /// The file system is mounted read-only.
    ReadOnlyFs,
    /// The object is in use (busy mount point, running executable, lease conflict).
    Busy,
    /// An argument is out of range (offset or length above `i64::MAX`, renaming a
    /// directory beneath itself, ...).
    InvalidParameter,
    /// A directory has more entries than the caller will hold.
    TooManyEntries,
    /// The name no longer refers to the object the caller expected: it was
    /// replaced or renamed meanwhile.
    Changed,
    /// The file system cannot do this (share extents, for one).
    Unsupported,
    /// Any other I/O error.
    Io(io::Error),
}

/// Result type of every VFS call.
pub type VfsResult<T> = Result<T, VfsError>;

impl VfsError {
    /// Maps a raw errno value.
    pub fn from_errno(errno: i32) -> VfsError {
        match errno {
            libc::ENOENT => VfsError::NotFound,
            libc::ENOTDIR => VfsError::NotADirectory,
            libc::EEXIST => VfsError::Exists,
            libc::EISDIR => VfsError::IsADirectory,
            libc::ENOTEMPTY => VfsError::NotEmpty,
            libc::EACCES | libc::EPERM => VfsError::AccessDenied,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => VfsError::NoSpace,
            libc::ENAMETOOLONG | libc::EILSEQ => VfsError::NameInvalid,
            libc::EROFS => VfsError::ReadOnlyFs,
            libc::EBUSY | libc::ETXTBSY | libc::EWOULDBLOCK => VfsError::Busy,
            libc::EINVAL => VfsError::InvalidParameter,
            _ => VfsError::Io(io::Error::from_raw_os_error(errno)),
        }
    }

    /// The error of the last failed libc call.
    pub(crate) fn last() -> VfsError {
        VfsError::from(io::Error::last_os_error())
    }
}

impl From<io::Error> for VfsError {
    fn from(e: io::Error) -> VfsError {
        match e.raw_os_error() {
            Some(errno) => VfsError::from_errno(errno),
            None => match e.kind() {
                io::ErrorKind::NotFound => VfsError::NotFound,
                io::ErrorKind::AlreadyExists => VfsError::Exists,
                io::ErrorKind::PermissionDenied => VfsError::AccessDenied,
                io::ErrorKind::InvalidInput => VfsError::InvalidParameter,
                _ => VfsError::Io(e),
            },
        }
    }
}

impl fmt::Display for VfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VfsError::NotFound => f.write_str("no such file or directory"),
            VfsError::PathNotFound => f.write_str("path not found"),
            VfsError::Exists => f.write_str("name already exists"),
            VfsError::NotADirectory => f.write_str("not a directory"),
            VfsError::IsADirectory => f.write_str("is a directory"),
            VfsError::NotEmpty => f.write_str("directory not empty"),
            VfsError::AccessDenied => f.write_str("access denied"),
            VfsError::Escape => f.write_str("path leads outside the share"),
            VfsError::NoSpace => f.write_str("no space left"),
            VfsError::NameInvalid => f.write_str("invalid name"),
            VfsError::ReadOnlyFs => f.write_str("read-only file system"),
            VfsError::Busy => f.write_str("resource busy"),
            VfsError::InvalidParameter => f.write_str("invalid parameter"),
            VfsError::TooManyEntries => f.write_str("too many directory entries"),
            VfsError::Changed => f.write_str("the name now refers to another object"),
            VfsError::Unsupported => f.write_str("not supported by the file system"),
            VfsError::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for VfsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            VfsError::Io(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert!(matches!(
            VfsError::from_errno(libc::ENOENT),
            VfsError::NotFound
        ));
        assert!(matches!(
            VfsError::from_errno(libc::ENOTEMPTY),
            VfsError::NotEmpty
        ));
        assert!(matches!(
            VfsError::from_errno(libc::EROFS),
            VfsError::ReadOnlyFs
        ));
        assert!(matches!(
            VfsError::from(io::Error::from_raw_os_error(libc::EACCES)),
            VfsError::AccessDenied
        ));
        assert!(matches!(VfsError::from_errno(libc::EIO), VfsError::Io(_)));
        assert_eq!(VfsError::Escape.to_string(), "path leads outside the share");
    }
}
