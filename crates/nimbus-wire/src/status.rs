//! NTSTATUS values (MS-ERREF 2.3.1) that the server returns.

use core::fmt;

/// A 32-bit NTSTATUS code as carried in the SMB2 header's Status field.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NtStatus(pub u32);

macro_rules! statuses {
    ($($name:ident = $value:expr,)*) => {
        impl NtStatus {
            $(pub const $name: NtStatus = NtStatus($value);)*

            /// The spec's name, for logs.
            pub fn name(self) -> Option<&'static str> {
                match self.0 {
                    $($value => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

statuses! {
    SUCCESS = 0x0000_0000,
    PENDING = 0x0000_0103,
    NOTIFY_CLEANUP = 0x0000_010B,
    NOTIFY_ENUM_DIR = 0x0000_010C,
    BUFFER_OVERFLOW = 0x8000_0005,
    NO_MORE_FILES = 0x8000_0006,
    NO_MORE_EAS = 0x8000_0012,
    INVALID_EA_NAME = 0x8000_0013,
    EA_LIST_INCONSISTENT = 0x8000_0014,
    UNSUCCESSFUL = 0xC000_0001,
    NOT_IMPLEMENTED = 0xC000_0002,
    INVALID_INFO_CLASS = 0xC000_0003,
    INFO_LENGTH_MISMATCH = 0xC000_0004,
    INVALID_HANDLE = 0xC000_0008,
    INVALID_PARAMETER = 0xC000_000D,
    NO_SUCH_FILE = 0xC000_000F,
    INVALID_DEVICE_REQUEST = 0xC000_0010,
    END_OF_FILE = 0xC000_0011,
    MORE_PROCESSING_REQUIRED = 0xC000_0016,
    NO_MEMORY = 0xC000_0017,
    INVALID_VIEW_SIZE = 0xC000_001F,
    ACCESS_DENIED = 0xC000_0022,
    BUFFER_TOO_SMALL = 0xC000_0023,
    OBJECT_NAME_INVALID = 0xC000_0033,
    OBJECT_NAME_NOT_FOUND = 0xC000_0034,
    OBJECT_NAME_COLLISION = 0xC000_0035,
    OBJECT_PATH_INVALID = 0xC000_0039,
    OBJECT_PATH_NOT_FOUND = 0xC000_003A,
    OBJECT_PATH_SYNTAX_BAD = 0xC000_003B,
    SHARING_VIOLATION = 0xC000_0043,
    EAS_NOT_SUPPORTED = 0xC000_004F,
    EA_TOO_LARGE = 0xC000_0050,
    NO_EAS_ON_FILE = 0xC000_0052,
    FILE_LOCK_CONFLICT = 0xC000_0054,
    LOCK_NOT_GRANTED = 0xC000_0055,
    DELETE_PENDING = 0xC000_0056,
    INVALID_OWNER = 0xC000_005A,
    INVALID_PRIMARY_GROUP = 0xC000_005B,
    PRIVILEGE_NOT_HELD = 0xC000_0061,
    LOGON_FAILURE = 0xC000_006D,
    INVALID_ACL = 0xC000_0077,
    INVALID_SID = 0xC000_0078,
    INVALID_SECURITY_DESCR = 0xC000_0079,
    RANGE_NOT_LOCKED = 0xC000_007E,
    DISK_FULL = 0xC000_007F,
    ALLOTTED_SPACE_EXCEEDED = 0xC000_0099,
    INSUFFICIENT_RESOURCES = 0xC000_009A,
    MEDIA_WRITE_PROTECTED = 0xC000_00A2,
    BAD_IMPERSONATION_LEVEL = 0xC000_00A5,
    PIPE_DISCONNECTED = 0xC000_00B0,
    FILE_IS_A_DIRECTORY = 0xC000_00BA,
    NOT_SUPPORTED = 0xC000_00BB,
    NETWORK_NAME_DELETED = 0xC000_00C9,
    BAD_NETWORK_NAME = 0xC000_00CC,
    REQUEST_NOT_ACCEPTED = 0xC000_00D0,
    NOT_SAME_DEVICE = 0xC000_00D4,
    PIPE_EMPTY = 0xC000_00D9,
    INVALID_OPLOCK_PROTOCOL = 0xC000_00E3,
    INTERNAL_ERROR = 0xC000_00E5,
    DIRECTORY_NOT_EMPTY = 0xC000_0101,
    NOT_A_DIRECTORY = 0xC000_0103,
    NAME_TOO_LONG = 0xC000_0106,
    TOO_MANY_OPENED_FILES = 0xC000_011F,
    CANCELLED = 0xC000_0120,
    CANNOT_DELETE = 0xC000_0121,
    FILE_CLOSED = 0xC000_0128,
    INVALID_DEVICE_STATE = 0xC000_0184,
    INVALID_LOCK_RANGE = 0xC000_01A1,
    USER_SESSION_DELETED = 0xC000_0203,
    NOT_FOUND = 0xC000_0225,
    DUPLICATE_OBJECTID = 0xC000_022A,
    ACCOUNT_LOCKED_OUT = 0xC000_0234,
    NOT_A_REPARSE_POINT = 0xC000_0275,
    NETWORK_SESSION_EXPIRED = 0xC000_035C,
    REQUEST_OUT_OF_SEQUENCE = 0xC000_042A,
    FILE_NOT_AVAILABLE = 0xC000_0467,
    NO_PREAUTH_INTEGRITY_HASH_OVERLAP = 0xC05D_0000,
}

impl NtStatus {
    /// Errors have severity 3 (top two bits set); warnings such as
    /// BUFFER_OVERFLOW still carry a body.
    pub fn is_error(self) -> bool {
        self.0 >> 30 == 3
    }
}

impl fmt::Debug for NtStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "STATUS_{n}"),
            None => write!(f, "NTSTATUS(0x{:08X})", self.0),
        }
    }
}

impl fmt::Display for NtStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_severity() {
        assert_eq!(
            format!("{}", NtStatus::ACCESS_DENIED),
            "STATUS_ACCESS_DENIED"
        );
        assert!(NtStatus::ACCESS_DENIED.is_error());
        assert!(!NtStatus::BUFFER_OVERFLOW.is_error());
        assert!(!NtStatus::SUCCESS.is_error());
    }
}
