//! The caching part of a CREATE response (MS-SMB2 2.2.14): the
//! OplockLevel, and the lease context in the version the client asked in.
//! Answered alike by a new open and by a durable reconnect or replay; and
//! whether the breaks an open is sent later are sealed.

use std::sync::Arc;

use nimbus_state::caching::Granted;
use nimbus_wire::create::{context_name, CreateContext};
use nimbus_wire::oplock::{lease_flags, oplock_level, LeaseContext};

use crate::security::SessionCipher;
use crate::session::{Session, SessionState, Tree};
use crate::sync::lock;

/// The OplockLevel of a CREATE response for what the open caches, and the
/// lease context to answer with when that is a lease.
pub fn caching_response(
    requested: &[CreateContext],
    granted: &Granted,
) -> (u8, Option<CreateContext>) {
    match *granted {
        Granted::Oplock(level) => (level, None),
        Granted::Lease {
            state,
            epoch,
            breaking,
            version,
        } => (
            oplock_level::LEASE,
            lease_response(requested, state, epoch, breaking, version),
        ),
    }
}

/// The lease context of the response (MS-SMB2 2.2.14.2.10/11), in the
/// version the client asked in.
pub fn lease_response(
    requested: &[CreateContext],
    state: u32,
    epoch: u16,
    breaking: bool,
    version: u8,
) -> Option<CreateContext> {
    let c = requested
        .iter()
        .find(|c| c.name.as_slice() == context_name::REQUEST_LEASE)?;
    let asked = LeaseContext::parse(&c.data).ok()?;
    let version = if version == 2 { 2 } else { 1 };
    let mut flags = 0;
    if breaking {
        flags |= lease_flags::BREAK_IN_PROGRESS;
    }
    if version == 2 && asked.flags & lease_flags::PARENT_LEASE_KEY_SET != 0 {
        flags |= lease_flags::PARENT_LEASE_KEY_SET;
    }
    let mut data = Vec::with_capacity(LeaseContext::V2_LEN);
    LeaseContext {
        version,
        lease_key: asked.lease_key,
        state,
        flags,
        duration: 0,
        parent_key: if flags & lease_flags::PARENT_LEASE_KEY_SET != 0 {
            asked.parent_key
        } else {
            [0; 16]
        },
        epoch: if version == 2 { epoch } else { 0 },
    }
    .encode(&mut data);
    Some(CreateContext {
        name: c.name.clone(),
        data,
    })
}

/// Breaks to this open's holder are sealed when its session or tree
/// requires encryption.
pub fn break_cipher(session: &Session, tree: &Tree) -> Option<Arc<SessionCipher>> {
    match &*lock(&session.state) {
        SessionState::Valid(auth) if auth.encrypt_data || tree.encrypt_data => auth.cipher.clone(),
        _ => None,
    }
}
