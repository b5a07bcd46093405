//! Messages between cluster nodes for a logon that names its
//! PreviousSessionId (MS-SMB2 3.3.5.5.3) when the previous session lives
//! on another node: the node of the new logon asks the node the session id
//! names (its incarnation is in the id's top bits, as an open id's) to end
//! that session, and waits for the answer before it answers the logon, so
//! that the client's next request on the old connection already finds the
//! session gone (smbtorture smb2.session.reconnect1) and its durable opens
//! wait to be reclaimed (smb2.durable-open.reopen1a).
//!
//! The node asked ends the session only when it is logged on as the same
//! user (name and domain, compared without case), as one node does; it
//! answers either way, so that the asker never waits out its bound for a
//! session that is not there.
//!
//! Written by hand, of `crate::node_message`'s pieces: a few fixed fields
//! and bounded strings, as the other node-to-node messages are.

use crate::node_message::{answer, put_strings, take_answer, take_strings, take_u64};

/// Message tag of a request to end a session (beside breaks, notify
/// changes and requests to let go of an open: `crate::let_go_handover`).
pub const END_SESSION_V1: u8 = 0x26;
/// Message tag of its answer.
pub const SESSION_ENDED_V1: u8 = 0x27;

/// A request to end session `session_id` of `user` in `domain`, from
/// node `reply_to`, numbered `nonce` there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndSession {
    pub session_id: u64,
    pub nonce: u64,
    pub reply_to: String,
    pub user: String,
    pub domain: String,
}

pub fn encode_end_session(r: &EndSession) -> Vec<u8> {
    let mut v = vec![END_SESSION_V1];
    v.extend_from_slice(&r.session_id.to_le_bytes());
    v.extend_from_slice(&r.nonce.to_le_bytes());
    put_strings(&mut v, &[&r.reply_to, &r.user, &r.domain]);
    v
}

/// None for anything but a whole, well-formed request.
pub fn decode_end_session(msg: &[u8]) -> Option<EndSession> {
    let rest = msg.strip_prefix(&[END_SESSION_V1])?;
    let (session_id, rest) = take_u64(rest)?;
    let (nonce, rest) = take_u64(rest)?;
    let [reply_to, user, domain] = take_strings::<3>(rest)?;
    Some(EndSession {
        session_id,
        nonce,
        reply_to,
        user,
        domain,
    })
}

/// The answer to request `nonce`: whether the session was ended.
pub fn encode_answer(nonce: u64, ended: bool) -> Vec<u8> {
    answer(SESSION_ENDED_V1, nonce, ended)
}

pub fn decode_answer(msg: &[u8]) -> Option<(u64, bool)> {
    take_answer(msg.strip_prefix(&[SESSION_ENDED_V1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> EndSession {
        EndSession {
            session_id: 0x0000_0300_1234_0001,
            nonce: 7,
            reply_to: "n2".into(),
            user: "alice".into(),
            domain: "NIMBUS".into(),
        }
    }

    #[test]
    fn requests_and_answers_round_trip() {
        assert_eq!(
            decode_end_session(&encode_end_session(&request())),
            Some(request())
        );
        assert_eq!(decode_answer(&encode_answer(9, true)), Some((9, true)));
        assert_eq!(decode_answer(&encode_answer(9, false)), Some((9, false)));
    }

    #[test]
    fn anything_cut_short_or_longer_is_refused() {
        use crate::node_message::assert_refuses_cuts_and_extras;
        assert_refuses_cuts_and_extras(&encode_end_session(&request()), decode_end_session);
        assert_refuses_cuts_and_extras(&encode_answer(1, true), decode_answer);
        assert_eq!(
            decode_answer(&[SESSION_ENDED_V1, 0, 0, 0, 0, 0, 0, 0, 0, 2]),
            None
        );
    }

    #[test]
    fn a_name_longer_than_the_bound_is_refused() {
        let mut msg = vec![END_SESSION_V1];
        msg.extend_from_slice(&[0; 16]);
        msg.extend_from_slice(&((crate::node_message::MAX_STRING + 1) as u16).to_le_bytes());
        msg.extend_from_slice(&vec![b'a'; crate::node_message::MAX_STRING + 1]);
        msg.extend_from_slice(&[0; 4]);
        assert_eq!(decode_end_session(&msg), None);
    }
}
