//! The lease and oplock states and access-mask sets that both the checks
//! of single calls (`calls`) and of the whole state (`check`) are written
//! in, from MS-SMB2's definitions.

use nimbus_state::caching::{Holder, HANDLE, READ, WRITE};

use crate::input::{READ_ATTRIBUTES, READ_CONTROL, SYNCHRONIZE, WRITE_ATTRIBUTES};

/// MS-SMB2 2.2.13.2.8: the lease states a server may hold.
pub(crate) const LEASE_STATES: [u32; 5] =
    [0, READ, READ | HANDLE, READ | WRITE, READ | WRITE | HANDLE];
/// Oplocks held as lease states: level II, exclusive, batch.
pub(crate) const OPLOCK_STATES: [u32; 3] = [READ, READ | WRITE, READ | WRITE | HANDLE];

/// Rights of an open that no caching holder minds (Windows' stat open);
/// a lease holder also ignores a read of the security descriptor.
pub(crate) const STAT: u32 = READ_ATTRIBUTES | WRITE_ATTRIBUTES | SYNCHRONIZE;
pub(crate) const LEASE_STAT: u32 = STAT | READ_CONTROL;

pub(crate) fn subset(a: u32, b: u32) -> bool {
    a & !b == 0
}

pub(crate) fn only(access: u32, rights: u32) -> bool {
    access != 0 && subset(access, rights)
}

pub(crate) fn is_lease(h: Holder) -> bool {
    matches!(h, Holder::Lease(_))
}
