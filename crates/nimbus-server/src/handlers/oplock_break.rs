//! MS-SMB2 3.3.5.22 Receiving an SMB2 OPLOCK_BREAK Acknowledgment: the
//! client lowers an oplock (3.3.5.22.1) or a lease (3.3.5.22.2) it was
//! told to break; CREATEs waiting for it go on.

use nimbus_state::caching::{self, AckError, LeaseId};
use nimbus_wire::oplock::{oplock_level, BreakAck, LeaseBreakAck, OplockBreak};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::lease_ack_handover::{self, AckLease, Found};
use crate::oplocks::AckOutcome;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    match BreakAck::parse(body).map_err(malformed)? {
        BreakAck::Oplock(ack) => oplock_ack(ctx, ack, out),
        BreakAck::Lease(ack) => lease_ack(ctx, ack, out),
    }
}

fn oplock_ack(ctx: &mut Ctx<'_>, ack: OplockBreak, out: &mut Vec<u8>) -> HandlerResult {
    let open = ctx.open(ack.file_id)?;
    // An oplock is lowered to level II or none; anything else (a lease
    // level on an oplock, or a raise) is not an acknowledgement.
    if ack.oplock_level != oplock_level::NONE && ack.oplock_level != oplock_level::II {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let outcome = ctx
        .server
        .oplocks
        .ack_oplock(open.file_key, open.open_id, ack.oplock_level);
    let state = match outcome {
        AckOutcome::Done(acked) => acked.state,
        // No break was sent to this open (Windows: the same status).
        AckOutcome::Refused(
            AckError::NotBreaking | AckError::Unknown | AckError::NotALeaseState,
        ) => return Err(NtStatus::INVALID_OPLOCK_PROTOCOL),
        // Level II acknowledged for a break to none: the open ends at none.
        AckOutcome::Refused(AckError::TooMuch) => {
            match ctx
                .server
                .oplocks
                .ack_oplock(open.file_key, open.open_id, oplock_level::NONE)
            {
                AckOutcome::Done(acked) => acked.state,
                AckOutcome::Refused(_) => return Err(NtStatus::INVALID_OPLOCK_PROTOCOL),
            }
        }
    };
    OplockBreak {
        oplock_level: caching::oplock_level(state),
        file_id: ack.file_id,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

fn lease_ack(ctx: &mut Ctx<'_>, ack: LeaseBreakAck, out: &mut Vec<u8>) -> HandlerResult {
    let Some(negotiated) = ctx.conn.negotiated() else {
        return Err(NtStatus::INVALID_PARAMETER);
    };
    if negotiated.dialect == nimbus_wire::negotiate::Dialect::Smb202 {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    let id = LeaseId {
        client: negotiated.client_guid,
        key: ack.lease_key,
    };
    let found = match ctx.server.oplocks.ack_lease(id, ack.lease_state) {
        Some(outcome) => crate::lease_ack_handover::found(outcome),
        None => on_other_nodes(ctx, id, ack.lease_state),
    };
    match found {
        Found::Acked => {}
        Found::NotHere => return Err(NtStatus::OBJECT_NAME_NOT_FOUND),
        Found::NotBreaking => return Err(NtStatus::UNSUCCESSFUL),
        Found::Refused => return Err(NtStatus::REQUEST_NOT_ACCEPTED),
    }
    // MS-SMB2 2.2.25.2: the response repeats the key and the state the
    // client acknowledged.
    LeaseBreakAck {
        flags: 0,
        lease_key: ack.lease_key,
        lease_state: ack.lease_state,
        lease_duration: 0,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

/// How long an acknowledgement waits for the other nodes' answers. A node
/// answers as soon as its inbox watch delivers the request; one that does
/// not answer within this has lost its leases with its own lease.
const OTHER_NODES_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// A lease this node does not hold: on a cluster node, the other nodes are
/// asked to apply the acknowledgement (`crate::lease_ack_handover`), and
/// the one holding the lease answers what it found; the wait ends with
/// that answer. Past `Membership::may_forward_ack`'s node-wide budget an
/// acknowledgement is not sent on (the lease is then not found).
fn on_other_nodes(ctx: &Ctx<'_>, id: LeaseId, state: u32) -> Found {
    let Some(m) = &ctx.server.cluster else {
        return Found::NotHere;
    };
    if !m.may_forward_ack() {
        return Found::NotHere;
    }
    let nodes = match m.other_nodes() {
        Ok(nodes) => nodes,
        Err(e) => {
            tracing::warn!("lease break acknowledgement: listing the other nodes: {e}");
            return Found::NotHere;
        }
    };
    let request = |nonce| {
        lease_ack_handover::encode_request(&AckLease {
            nonce,
            client_guid: id.client,
            lease_key: id.key,
            lease_state: state,
            reply_to: m.node.clone(),
        })
    };
    let found_it = |a: u8| Found::from_u8(a).is_some_and(|f| f != Found::NotHere);
    let answers = m.ask_nodes_until(&nodes, request, OTHER_NODES_WAIT, found_it);
    answers
        .into_iter()
        .filter_map(Found::from_u8)
        .find(|f| *f != Found::NotHere)
        .unwrap_or(Found::NotHere)
}
