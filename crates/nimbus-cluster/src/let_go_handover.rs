//! A reconnect's request to the node that holds its durable open to let
//! go of it, and that node's answer (the failover in
//! `nimbus_node::failover` sends and acts on them). Written by hand, as
//! the other node-to-node messages: a tag byte, fixed fields
//! little-endian, then strings each a 16-bit length and UTF-8; a message
//! cut short or with bytes to spare is refused whole.

use nimbus_services::durable_handle::Owner;

/// Message tag of a request to let go of an open (`let_go`), beside
/// breaks (`nimbus_state::records::encode_break`) and notify changes
/// (`crate::cluster_notify`). 0x20, 0x21 and 0x23 were earlier layouts
/// (without an owner; with the owner's user and domain names; without the
/// reconnect's version), refused.
pub const LET_GO_V4: u8 = 0x25;

/// What a reconnect on another node asks of the node holding its open.
#[derive(Debug, PartialEq, Eq)]
pub struct LetGo {
    pub open_id: u64,
    /// The CreateGuid a v2 reconnect names; None for a v1 reconnect.
    pub create_guid: Option<[u8; 16]>,
    /// The user reconnecting (as `Durable::owner` holds it).
    pub owner: Owner,
}

/// A `LetGo` as sent: with the node to tell of a refusal, and the
/// number that names this request in the refusal.
#[derive(Debug, PartialEq, Eq)]
pub struct Asked {
    pub req: LetGo,
    pub reply_to: String,
    pub nonce: u64,
}

/// Message tag of a refusal to let go of an open: no open the request
/// could name waits for its client on the node asked (it is still
/// connected there, or another user's, or not there), so the asking
/// reconnect fails at once.
pub const LET_GO_REFUSED_V1: u8 = 0x22;
/// Message tag of the answer that the node asked let go of the open: the
/// asking reconnect may claim it now.
pub const LET_GO_DONE_V1: u8 = 0x24;

/// What the node asked to let go of an open answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LetGoAnswer {
    Refused,
    Done,
}

/// `LET_GO_V4`, the reconnect's version (1 or 2), the open id, the
/// CreateGuid (zero for version 1), the request's number, then the owner's
/// SID and name and the node to answer, each a 16-bit length and UTF-8.
pub fn encode_let_go(a: &Asked) -> Vec<u8> {
    let owner = &a.req.owner;
    let texts = [
        owner.sid.as_bytes(),
        owner.name.as_bytes(),
        a.reply_to.as_bytes(),
    ];
    let mut m = Vec::with_capacity(40 + texts.iter().map(|t| t.len()).sum::<usize>());
    m.push(LET_GO_V4);
    m.push(if a.req.create_guid.is_some() { 2 } else { 1 });
    m.extend_from_slice(&a.req.open_id.to_le_bytes());
    m.extend_from_slice(&a.req.create_guid.unwrap_or_default());
    m.extend_from_slice(&a.nonce.to_le_bytes());
    for t in texts {
        let len = u16::try_from(t.len()).unwrap_or(u16::MAX);
        m.extend_from_slice(&len.to_le_bytes());
        m.extend_from_slice(&t[..len as usize]);
    }
    m
}

pub fn decode_let_go(msg: &[u8]) -> Option<Asked> {
    let [LET_GO_V4, version, rest @ ..] = msg else {
        return None;
    };
    let open_id = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
    let guid: [u8; 16] = rest.get(8..24)?.try_into().ok()?;
    let create_guid = match version {
        1 if guid == [0; 16] => None,
        2 => Some(guid),
        _ => return None,
    };
    let nonce = u64::from_le_bytes(rest.get(24..32)?.try_into().ok()?);
    let mut at = 32;
    let mut text = || {
        let len = u16::from_le_bytes(rest.get(at..at + 2)?.try_into().ok()?) as usize;
        let s = std::str::from_utf8(rest.get(at + 2..at + 2 + len)?).ok()?;
        at += 2 + len;
        Some(s.to_owned())
    };
    let (sid, name, reply_to) = (text()?, text()?, text()?);
    (at == rest.len()).then_some(Asked {
        req: LetGo {
            open_id,
            create_guid,
            owner: Owner { sid, name },
        },
        reply_to,
        nonce,
    })
}

/// `LET_GO_REFUSED_V1` or `LET_GO_DONE_V1`, the open id and the request's
/// number.
pub fn encode_answer(answer: LetGoAnswer, open_id: u64, nonce: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(17);
    m.push(match answer {
        LetGoAnswer::Refused => LET_GO_REFUSED_V1,
        LetGoAnswer::Done => LET_GO_DONE_V1,
    });
    m.extend_from_slice(&open_id.to_le_bytes());
    m.extend_from_slice(&nonce.to_le_bytes());
    m
}

/// An answer to a request to let go: what it says, the open id and the
/// request's number.
pub fn decode_answer(msg: &[u8]) -> Option<(LetGoAnswer, u64, u64)> {
    let answer = match *msg.first()? {
        LET_GO_REFUSED_V1 => LetGoAnswer::Refused,
        LET_GO_DONE_V1 => LetGoAnswer::Done,
        _ => return None,
    };
    let rest = &msg[1..];
    if rest.len() != 16 {
        return None;
    }
    let open_id = u64::from_le_bytes(rest[..8].try_into().ok()?);
    Some((
        answer,
        open_id,
        u64::from_le_bytes(rest[8..].try_into().ok()?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> Asked {
        Asked {
            req: LetGo {
                open_id: 0x0000_0300_0000_002a,
                create_guid: Some([7; 16]),
                owner: Owner {
                    sid: "S-1-5-21-1-2-3-1000".into(),
                    name: "alice".into(),
                },
            },
            reply_to: "n2".into(),
            nonce: 9,
        }
    }

    #[test]
    fn a_request_to_let_go_names_the_open_its_create_guid_its_owner_and_whom_to_answer() {
        let msg = encode_let_go(&asked());
        assert_eq!(msg[0], LET_GO_V4);
        assert_eq!(decode_let_go(&msg), Some(asked()));
        // A v1 reconnect names no CreateGuid.
        let mut v1 = asked();
        v1.req.create_guid = None;
        assert_eq!(decode_let_go(&encode_let_go(&v1)), Some(v1));
        for answer in [LetGoAnswer::Refused, LetGoAnswer::Done] {
            let m = encode_answer(answer, 0x0000_0300_0000_002a, 9);
            assert_eq!(decode_answer(&m), Some((answer, 0x0000_0300_0000_002a, 9)));
        }
    }

    #[test]
    fn a_malformed_request_or_refusal_is_refused_whole() {
        let msg = encode_let_go(&asked());
        // Cut anywhere, or with a byte too many, or with the first layout's
        // tag: nothing is read from it.
        for len in 0..msg.len() {
            assert_eq!(decode_let_go(&msg[..len]), None, "cut at {len}");
        }
        let mut longer = msg.clone();
        longer.push(0);
        assert_eq!(decode_let_go(&longer), None);
        for earlier in [0x20, 0x21, 0x23] {
            let mut earlier_layout = msg.clone();
            earlier_layout[0] = earlier;
            assert_eq!(decode_let_go(&earlier_layout), None);
        }
        // A version that is neither 1 nor 2, and a version 1 request that
        // names a CreateGuid.
        for version in [0, 1, 3] {
            let mut other = msg.clone();
            other[1] = version;
            assert_eq!(decode_let_go(&other), None, "version {version}");
        }
        // A length past the end.
        let mut overlong = msg;
        overlong[34] = 0xff;
        assert_eq!(decode_let_go(&overlong), None);
        let refusal = encode_answer(LetGoAnswer::Refused, 1, 2);
        for len in 0..refusal.len() {
            assert_eq!(decode_answer(&refusal[..len]), None, "cut at {len}");
        }
        assert_eq!(decode_answer(&[refusal.as_slice(), &[0]].concat()), None);
        let mut other_tag = refusal;
        other_tag[0] = 0x23;
        assert_eq!(decode_answer(&other_tag), None);
    }
}
