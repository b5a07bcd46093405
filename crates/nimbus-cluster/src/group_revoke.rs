//! Messages between cluster nodes that revoke groups of alike opens before
//! a file is set delete-pending (`nimbus_state::grouped_opens`): a node
//! whose group of a file is licensed lets its clients join it without
//! reading the file's records, so it would not see the flag. The setter
//! asks each node whose group entry the record names to revoke its groups
//! of the file, and writes the flag once they have answered
//! (`ShareModes::set_delete_pending`).
//!
//! Written by hand, of `crate::node_message`'s pieces, as
//! `crate::lease_ack_handover` is.

use nimbus_state::FileKey;

use crate::node_message::{put_strings, take_strings, take_u64};

/// Message tag of a request to revoke a file's groups. Layout 2 names
/// the file with its generation; layout 1 (0x32) did not, and a node
/// refuses it as unknown.
pub const REVOKE_GROUPS_V2: u8 = 0x34;
/// Message tag of its answer.
pub const GROUPS_REVOKED_V1: u8 = 0x33;

/// Revoke this node's groups of alike opens of `file`; answer node
/// `reply_to`, quoting `nonce`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevokeGroups {
    pub nonce: u64,
    pub file: FileKey,
    pub reply_to: String,
}

pub fn encode_request(r: &RevokeGroups) -> Vec<u8> {
    let mut v = vec![REVOKE_GROUPS_V2];
    v.extend_from_slice(&r.nonce.to_le_bytes());
    v.extend_from_slice(&r.file.dev.to_le_bytes());
    v.extend_from_slice(&r.file.ino.to_le_bytes());
    v.extend_from_slice(&r.file.gen.to_le_bytes());
    put_strings(&mut v, &[&r.reply_to]);
    v
}

/// None for anything but a whole, well-formed request.
pub fn decode_request(msg: &[u8]) -> Option<RevokeGroups> {
    let rest = msg.strip_prefix(&[REVOKE_GROUPS_V2])?;
    let (nonce, rest) = take_u64(rest)?;
    let (dev, rest) = take_u64(rest)?;
    let (ino, rest) = take_u64(rest)?;
    let (gen, rest) = take_u64(rest)?;
    let [reply_to] = take_strings::<1>(rest)?;
    Some(RevokeGroups {
        nonce,
        file: FileKey { dev, ino, gen },
        reply_to,
    })
}

/// The answer to request `nonce`: the groups are revoked.
pub fn encode_answer(nonce: u64) -> Vec<u8> {
    let mut v = vec![GROUPS_REVOKED_V1];
    v.extend_from_slice(&nonce.to_le_bytes());
    v
}

pub fn decode_answer(msg: &[u8]) -> Option<u64> {
    match take_u64(msg.strip_prefix(&[GROUPS_REVOKED_V1])?)? {
        (nonce, []) => Some(nonce),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RevokeGroups {
        RevokeGroups {
            nonce: 12,
            file: FileKey::new(0x801, 42, 7),
            reply_to: "n2".into(),
        }
    }

    #[test]
    fn requests_and_answers_round_trip() {
        assert_eq!(decode_request(&encode_request(&request())), Some(request()));
        assert_eq!(decode_answer(&encode_answer(5)), Some(5));
    }

    #[test]
    fn anything_cut_short_longer_or_unknown_is_refused() {
        use crate::node_message::assert_refuses_cuts_and_extras;
        assert_refuses_cuts_and_extras(&encode_request(&request()), decode_request);
        assert_refuses_cuts_and_extras(&encode_answer(1), decode_answer);
    }
}
