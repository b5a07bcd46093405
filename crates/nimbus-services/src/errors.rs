//! Maps VFS and state errors onto the NTSTATUS a Windows server would send,
//! and logs the state errors no client is told of.

use nimbus_state::SharingError;
use nimbus_vfs::VfsError;
use nimbus_wire::NtStatus;

pub fn vfs_status(e: &VfsError) -> NtStatus {
    match e {
        VfsError::NotFound => NtStatus::OBJECT_NAME_NOT_FOUND,
        VfsError::PathNotFound => NtStatus::OBJECT_PATH_NOT_FOUND,
        VfsError::Exists => NtStatus::OBJECT_NAME_COLLISION,
        VfsError::NotADirectory => NtStatus::NOT_A_DIRECTORY,
        VfsError::IsADirectory => NtStatus::FILE_IS_A_DIRECTORY,
        VfsError::NotEmpty => NtStatus::DIRECTORY_NOT_EMPTY,
        VfsError::AccessDenied | VfsError::Escape | VfsError::ReadOnlyFs => NtStatus::ACCESS_DENIED,
        VfsError::NoSpace => NtStatus::DISK_FULL,
        VfsError::NameInvalid => NtStatus::OBJECT_NAME_INVALID,
        VfsError::Busy => NtStatus::SHARING_VIOLATION,
        VfsError::InvalidParameter => NtStatus::INVALID_PARAMETER,
        VfsError::TooManyEntries => NtStatus::INSUFFICIENT_RESOURCES,
        VfsError::Unsupported => NtStatus::NOT_SUPPORTED,
        // The name the open knew now names another file (changed outside
        // SMB): the file the client means is not found under it.
        VfsError::Changed => NtStatus::OBJECT_NAME_NOT_FOUND,
        _ => NtStatus::UNSUCCESSFUL,
    }
}

pub fn sharing_status(e: &SharingError) -> NtStatus {
    match e {
        SharingError::Violation => NtStatus::SHARING_VIOLATION,
        SharingError::DeletePending => NtStatus::DELETE_PENDING,
        SharingError::Store(err) => {
            tracing::error!("state store: {err}");
            NtStatus::INSUFFICIENT_RESOURCES
        }
    }
}

/// A clean-up write to the state store whose failure harms no request:
/// the record it would drop is looked at again by a later sweep (or goes
/// with its node's lease). Its failure is logged, never dropped unseen.
pub fn cleanup<T>(what: std::fmt::Arguments<'_>, r: Result<T, nimbus_state::StateError>) {
    if let Err(e) = r {
        tracing::warn!("state store: {what}: {e}; left for a later sweep");
    }
}

/// A share-mode write whose failure no client is told of (its request is
/// answered already, or is undoing a step that failed) and that nothing
/// writes again: its failure is logged, at most once per interval
/// (`crate::log_limit`), so that an administrator sees what was lost.
pub fn sharing_cleanup<T>(what: std::fmt::Arguments<'_>, r: Result<T, nimbus_state::SharingError>) {
    if let Err(e) = r {
        if let Some(n) = crate::log_limit::occurred("share-mode write failed") {
            tracing::warn!("share modes: {what}: {e:?}; not written ({n} such failure(s))");
        }
    }
}
