//! MS-SMB2 3.3.5.22 Receiving an SMB2 OPLOCK_BREAK Acknowledgment: the
//! client lowers an oplock (3.3.5.22.1) or a lease (3.3.5.22.2) it was
//! told to break; CREATEs waiting for it go on.

use nimbus_state::caching::{self, AckError, LeaseId};
use nimbus_wire::oplock::{oplock_level, BreakAck, LeaseBreakAck, OplockBreak};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::dispatch::{Ctx, HandlerResult};
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
    let state = match ctx.server.oplocks.ack_lease(id, ack.lease_state) {
        None => return Err(NtStatus::OBJECT_NAME_NOT_FOUND),
        Some(AckOutcome::Done(_)) => ack.lease_state,
        Some(AckOutcome::Refused(AckError::NotBreaking)) => return Err(NtStatus::UNSUCCESSFUL),
        // MS-SMB2 3.3.5.22.2 answers a state beyond the break so; a state
        // no lease can be in (W or H without R) is refused the same way.
        Some(AckOutcome::Refused(AckError::TooMuch | AckError::NotALeaseState)) => {
            return Err(NtStatus::REQUEST_NOT_ACCEPTED)
        }
        Some(AckOutcome::Refused(AckError::Unknown)) => {
            return Err(NtStatus::OBJECT_NAME_NOT_FOUND)
        }
    };
    // MS-SMB2 2.2.25.2: the response repeats the key and the state the
    // client acknowledged.
    LeaseBreakAck {
        flags: 0,
        lease_key: ack.lease_key,
        lease_state: state,
        lease_duration: 0,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}
