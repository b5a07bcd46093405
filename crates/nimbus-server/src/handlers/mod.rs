//! One module per SMB2 command. Each handler parses its request body,
//! checks it, acts through the VFS and state services, and appends its
//! response body, or returns the NTSTATUS to fail with.

pub mod change_notify;
pub mod close;
pub mod create;
mod create_caching;
pub mod create_durable;
pub mod create_security;
pub mod create_stream;
pub mod deferred;
pub mod echo;
pub mod flush;
pub mod ioctl;
pub mod lock;
pub mod logoff;
mod logon_checks;
pub mod negotiate;
pub mod oplock_break;
pub mod pipe;
pub mod query_directory;
pub mod query_info;
pub mod read;
pub mod security_info;
pub mod session_bind;
pub mod session_reauth;
pub mod session_setup;
pub mod set_info;
pub mod stream_to_data;
pub mod tree_connect;
pub mod write;

use nimbus_wire::{NtStatus, WireError};

/// The open was granted one of `rights`, or the request is ACCESS_DENIED.
pub fn require(open: &crate::session::Open, rights: u32) -> Result<(), NtStatus> {
    if open.access & rights == 0 {
        Err(NtStatus::ACCESS_DENIED)
    } else {
        Ok(())
    }
}

/// Malformed request bodies are STATUS_INVALID_PARAMETER (MS-SMB2 3.3.5.2.6).
pub fn malformed(_: WireError) -> NtStatus {
    NtStatus::INVALID_PARAMETER
}

/// MS-SMB2 3.3.5.2.5: a request moving `len` bytes must be charged one
/// credit per 64 KiB, and never exceed the negotiated maximum. The room
/// reserved for the frame's responses must hold it too (a compound of many
/// large reads, or an encrypted one, may ask for more than was reserved).
pub fn check_credit_charge(ctx: &crate::ctx::Ctx<'_>, len: u32) -> Result<(), NtStatus> {
    let neg = ctx.conn.negotiated().ok_or(NtStatus::INVALID_PARAMETER)?;
    if len > neg.max_io {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if neg.dialect != nimbus_wire::negotiate::Dialect::Smb202 {
        let needed = (len.max(1) as u64).div_ceil(65536);
        if (ctx.hdr.credit_charge.max(1) as u64) < needed {
            return Err(NtStatus::INVALID_PARAMETER);
        }
    }
    if len as usize > ctx.response_room {
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    Ok(())
}
