//! Messages between cluster nodes for a durable CREATE under an
//! AppInstanceId (MS-SMB2 3.3.5.9.13): the opens of the same file made
//! under the same id by another client of the same user are closed
//! without a break, wherever they are. The node of the CREATE asks every
//! other node to close theirs and waits for the answers before it goes on
//! with the CREATE, so that the old opens' share modes and oplocks are gone
//! when the CREATE meets them (smbtorture
//! smb2.durable-v2-open.app-instance: the second open is granted a batch
//! oplock, and the first client hears of no break).
//!
//! Written by hand, of `crate::node_message`'s pieces, as
//! `crate::session_handover` is.

use crate::node_message::{answer, put_strings, take_answer, take_strings};

/// Message tag of a request to close an application's old opens. Layout
/// 2 names the file with its generation; layout 1 (0x28) did not, and a
/// node refuses it as unknown.
pub const CLOSE_APP_INSTANCE_V2: u8 = 0x35;
/// Message tag of its answer.
pub const APP_INSTANCE_CLOSED_V1: u8 = 0x29;

/// Close the opens of file (`dev`, `ino`, `gen`) on share `share` made under
/// `app_instance` by a client other than `client_guid` for user
/// `owner_sid`; answer node `reply_to`, quoting `nonce`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseAppInstance {
    pub nonce: u64,
    pub dev: u64,
    pub ino: u64,
    pub gen: u64,
    pub app_instance: [u8; 16],
    pub client_guid: [u8; 16],
    pub reply_to: String,
    pub share: String,
    pub owner_sid: String,
}

pub fn encode_request(r: &CloseAppInstance) -> Vec<u8> {
    let mut v = vec![CLOSE_APP_INSTANCE_V2];
    for n in [r.nonce, r.dev, r.ino, r.gen] {
        v.extend_from_slice(&n.to_le_bytes());
    }
    v.extend_from_slice(&r.app_instance);
    v.extend_from_slice(&r.client_guid);
    put_strings(&mut v, &[&r.reply_to, &r.share, &r.owner_sid]);
    v
}

/// None for anything but a whole, well-formed request.
pub fn decode_request(msg: &[u8]) -> Option<CloseAppInstance> {
    let rest = msg.strip_prefix(&[CLOSE_APP_INSTANCE_V2])?;
    let (nonce, rest) = rest.split_first_chunk::<8>()?;
    let (dev, rest) = rest.split_first_chunk::<8>()?;
    let (ino, rest) = rest.split_first_chunk::<8>()?;
    let (gen, rest) = rest.split_first_chunk::<8>()?;
    let (app_instance, rest) = rest.split_first_chunk::<16>()?;
    let (client_guid, rest) = rest.split_first_chunk::<16>()?;
    let [reply_to, share, owner_sid] = take_strings::<3>(rest)?;
    Some(CloseAppInstance {
        nonce: u64::from_le_bytes(*nonce),
        dev: u64::from_le_bytes(*dev),
        ino: u64::from_le_bytes(*ino),
        gen: u64::from_le_bytes(*gen),
        app_instance: *app_instance,
        client_guid: *client_guid,
        reply_to,
        share,
        owner_sid,
    })
}

/// The answer to request `nonce`: whether any open was closed.
pub fn encode_answer(nonce: u64, closed: bool) -> Vec<u8> {
    answer(APP_INSTANCE_CLOSED_V1, nonce, closed)
}

pub fn decode_answer(msg: &[u8]) -> Option<(u64, bool)> {
    take_answer(msg.strip_prefix(&[APP_INSTANCE_CLOSED_V1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> CloseAppInstance {
        CloseAppInstance {
            nonce: 11,
            dev: 0x803,
            ino: 77,
            gen: 5,
            app_instance: [1; 16],
            client_guid: [2; 16],
            reply_to: "n3".into(),
            share: "vms".into(),
            owner_sid: "S-1-5-21-4-5-6-1104".into(),
        }
    }

    #[test]
    fn requests_and_answers_round_trip() {
        assert_eq!(decode_request(&encode_request(&request())), Some(request()));
        assert_eq!(decode_answer(&encode_answer(4, true)), Some((4, true)));
        assert_eq!(decode_answer(&encode_answer(4, false)), Some((4, false)));
    }

    #[test]
    fn anything_cut_short_or_longer_is_refused() {
        use crate::node_message::assert_refuses_cuts_and_extras;
        assert_refuses_cuts_and_extras(&encode_request(&request()), decode_request);
        assert_refuses_cuts_and_extras(&encode_answer(1, false), decode_answer);
    }
}
