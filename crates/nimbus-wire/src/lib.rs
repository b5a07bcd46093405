//! Codecs for the SMB2/3 wire format: MS-SMB2 messages, MS-FSCC information
//! classes and MS-DTYP security descriptors. No I/O and no crypto here:
//! every function turns bytes into typed values or back.

pub mod apple;
pub mod apple_double;
pub mod close;
pub mod codec;
pub mod create;
pub mod dtyp;
pub mod durable;
pub mod ea;
pub mod file_id;
pub mod fscc;
pub mod fsctl;
pub mod header;
pub mod info;
pub mod ioctl;
pub mod lock;
pub mod nbss;
pub mod negotiate;
pub mod notify;
pub mod oplock;
pub mod posix_descriptor;
pub mod query_directory;
pub mod read;
pub mod security_descriptor;
pub mod session_setup;
pub mod simple;
pub mod smb1;
pub mod status;
pub mod transform;
pub mod tree_connect;
pub mod write;

pub use codec::{WireError, WireResult, HEADER_SIZE};
pub use file_id::FileId;
pub use header::{Command, Header};
pub use status::NtStatus;
