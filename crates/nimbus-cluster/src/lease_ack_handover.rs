//! Messages between cluster nodes for a lease break acknowledged on
//! another node (MS-SMB2 3.3.5.22.2): a client with connections to two
//! nodes under one ClientGuid may acknowledge a break on either, while the
//! lease lives on the node whose open holds it (smbtorture
//! smb2.lease.v2_complex2). The node that got the acknowledgement and does
//! not know the lease asks the other nodes to apply it, and answers the
//! client with what the lease's node found.
//!
//! Written by hand, of `crate::node_message`'s pieces, as
//! `crate::session_handover` is.

use nimbus_services::oplocks::AckOutcome;
use nimbus_state::caching::AckError;

use crate::node_message::{put_strings, take_strings, take_u64};

/// Message tag of a request to apply an acknowledgement.
pub const ACK_LEASE_V1: u8 = 0x2a;
/// Message tag of its answer.
pub const LEASE_ACKED_V1: u8 = 0x2b;

/// Lease (`client_guid`, `lease_key`) is acknowledged at `lease_state`;
/// answer node `reply_to`, quoting `nonce`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AckLease {
    pub nonce: u64,
    pub client_guid: [u8; 16],
    pub lease_key: [u8; 16],
    pub lease_state: u32,
    pub reply_to: String,
}

/// What the asked node found: each answer is one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Found {
    /// No such lease on that node.
    NotHere = 0,
    /// Acknowledged: the lease is at the state the client gave.
    Acked = 1,
    /// The lease is not breaking (STATUS_UNSUCCESSFUL).
    NotBreaking = 2,
    /// A state beyond the break, or no lease state at all
    /// (STATUS_REQUEST_NOT_ACCEPTED).
    Refused = 3,
}

/// What an acknowledgement of a lease this node holds came to, as the
/// client is answered (MS-SMB2 3.3.5.22.2) and as another node is told
/// (this module's requests).
pub fn found(outcome: AckOutcome) -> Found {
    match outcome {
        AckOutcome::Done(_) => Found::Acked,
        AckOutcome::Refused(AckError::NotBreaking) => Found::NotBreaking,
        // A state beyond the break is answered so; a state no lease can
        // be in (W or H without R) is refused the same way.
        AckOutcome::Refused(AckError::TooMuch | AckError::NotALeaseState) => Found::Refused,
        AckOutcome::Refused(AckError::Unknown) => Found::NotHere,
    }
}

impl Found {
    pub fn from_u8(b: u8) -> Option<Found> {
        [
            Found::NotHere,
            Found::Acked,
            Found::NotBreaking,
            Found::Refused,
        ]
        .into_iter()
        .find(|f| *f as u8 == b)
    }
}

pub fn encode_request(r: &AckLease) -> Vec<u8> {
    let mut v = vec![ACK_LEASE_V1];
    v.extend_from_slice(&r.nonce.to_le_bytes());
    v.extend_from_slice(&r.client_guid);
    v.extend_from_slice(&r.lease_key);
    v.extend_from_slice(&r.lease_state.to_le_bytes());
    put_strings(&mut v, &[&r.reply_to]);
    v
}

/// None for anything but a whole, well-formed request.
pub fn decode_request(msg: &[u8]) -> Option<AckLease> {
    let rest = msg.strip_prefix(&[ACK_LEASE_V1])?;
    let (nonce, rest) = take_u64(rest)?;
    let (client_guid, rest) = rest.split_first_chunk::<16>()?;
    let (lease_key, rest) = rest.split_first_chunk::<16>()?;
    let (state, rest) = rest.split_first_chunk::<4>()?;
    let [reply_to] = take_strings::<1>(rest)?;
    Some(AckLease {
        nonce,
        client_guid: *client_guid,
        lease_key: *lease_key,
        lease_state: u32::from_le_bytes(*state),
        reply_to,
    })
}

/// The answer to request `nonce`.
pub fn encode_answer(nonce: u64, found: Found) -> Vec<u8> {
    let mut v = vec![LEASE_ACKED_V1];
    v.extend_from_slice(&nonce.to_le_bytes());
    v.push(found as u8);
    v
}

pub fn decode_answer(msg: &[u8]) -> Option<(u64, Found)> {
    let (nonce, rest) = take_u64(msg.strip_prefix(&[LEASE_ACKED_V1])?)?;
    match rest {
        [b] => Some((nonce, Found::from_u8(*b)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> AckLease {
        AckLease {
            nonce: 12,
            client_guid: [3; 16],
            lease_key: [4; 16],
            lease_state: 0x3,
            reply_to: "n2".into(),
        }
    }

    #[test]
    fn requests_and_answers_round_trip() {
        assert_eq!(decode_request(&encode_request(&request())), Some(request()));
        for found in [
            Found::NotHere,
            Found::Acked,
            Found::NotBreaking,
            Found::Refused,
        ] {
            assert_eq!(decode_answer(&encode_answer(5, found)), Some((5, found)));
        }
    }

    #[test]
    fn anything_cut_short_longer_or_unknown_is_refused() {
        use crate::node_message::assert_refuses_cuts_and_extras;
        assert_refuses_cuts_and_extras(&encode_request(&request()), decode_request);
        let mut answer = encode_answer(1, Found::Acked);
        assert_refuses_cuts_and_extras(&answer, decode_answer);
        answer[9] = 4;
        assert_eq!(decode_answer(&answer), None, "no such answer");
    }
}
