//! `nimbus witness move`: an administrator moves a client to another
//! node (MS-SWN CLIENT_MOVE), or a share's clients (SHARE_MOVE). The command puts one message in every
//! node's box, since any node's witness service may hold the client's
//! registration; a node that holds one tells the client, the others drop
//! the message. Each message lives under a short lease of its own, so
//! that one a node never takes (it left meanwhile) does not stay in etcd.
//!
//! Messages are sealed with the cluster key like every other, but a seal
//! does not stop a value from being put back later by someone with etcd
//! access. So each carries the time it was sent and is refused once
//! `MESSAGE_TTL_SECS` old; a drain also names the incarnation it stops,
//! so that an old one cannot stop the node's next run.

use std::net::IpAddr;

use nimbus_state::etcd_store::{EtcdStore, Op};
use nimbus_state::StateError;

use crate::node_message::{put_strings, take_strings};

/// The messages' first bytes: a client's move, the moves of every
/// client of a draining node, and the drain itself for that node.
pub const WITNESS_MOVE_V1: u8 = 0x2c;
pub const WITNESS_DRAIN_V1: u8 = 0x2d;
pub const DRAIN_V1: u8 = 0x2e;
/// A share's move: its registered clients (of one address, or all).
pub const WITNESS_SHARE_MOVE_V1: u8 = 0x2f;
/// How long an undelivered move stays in a box.
const MESSAGE_TTL_SECS: i64 = 60;
/// Most addresses a move names (a node's interfaces).
const MAX_TARGETS: usize = 16;

/// Move the witness clients at `client` to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessMove {
    pub client: IpAddr,
    pub to: Vec<IpAddr>,
    /// When it was sent (Unix seconds).
    pub sent: u64,
}

/// Move the witness clients registered for `share` (RegisterEx with a
/// share name), those at `client` only when it is named, to `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareMove {
    pub share: String,
    pub client: Option<IpAddr>,
    pub to: Vec<IpAddr>,
    pub sent: u64,
}

/// The longest share name a move names (MS-SRVS: 80 characters).
pub const MAX_SHARE_NAME: usize = 80;

/// Move every witness client registered for `node`'s interface to `to`:
/// `node` is draining.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessDrain {
    pub node: String,
    pub to: Vec<IpAddr>,
    pub sent: u64,
}

/// The drain of the receiving node's run `incarnation`: stop once its
/// clients have gone, or after `within_secs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drain {
    pub incarnation: u64,
    pub within_secs: u32,
    pub sent: u64,
}

/// Now, in Unix seconds.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A message sent at `sent` may still be acted on: it is not older than
/// its lease, nor from the future (clocks a little apart).
pub fn fresh(sent: u64) -> bool {
    now().abs_diff(sent) <= MESSAGE_TTL_SECS as u64
}

fn addresses(to: &[IpAddr]) -> String {
    let to: Vec<String> = to.iter().take(MAX_TARGETS).map(|a| a.to_string()).collect();
    to.join(",")
}

fn parse_addresses(s: &str) -> Option<Vec<IpAddr>> {
    let to: Vec<IpAddr> = s
        .split(',')
        .map(|a| a.parse().ok())
        .collect::<Option<Vec<_>>>()?;
    (!to.is_empty() && to.len() <= MAX_TARGETS).then_some(to)
}

pub fn encode(m: &WitnessMove) -> Vec<u8> {
    let mut v = vec![WITNESS_MOVE_V1];
    put_strings(
        &mut v,
        &[
            &m.client.to_string(),
            &addresses(&m.to),
            &m.sent.to_string(),
        ],
    );
    v
}

/// Decodes a move; None for anything else (addresses that do not parse,
/// too many, none).
pub fn decode(msg: &[u8]) -> Option<WitnessMove> {
    let rest = msg.strip_prefix(&[WITNESS_MOVE_V1])?;
    let [client, to, sent] = take_strings::<3>(rest)?;
    Some(WitnessMove {
        client: client.parse().ok()?,
        to: parse_addresses(&to)?,
        sent: sent.parse().ok()?,
    })
}

pub fn encode_share(m: &ShareMove) -> Vec<u8> {
    let mut v = vec![WITNESS_SHARE_MOVE_V1];
    let client = m.client.map(|c| c.to_string()).unwrap_or_default();
    put_strings(
        &mut v,
        &[&m.share, &client, &addresses(&m.to), &m.sent.to_string()],
    );
    v
}

/// Decodes a share's move; None for anything else (no share name or one
/// too long, an address that does not parse).
pub fn decode_share(msg: &[u8]) -> Option<ShareMove> {
    let rest = msg.strip_prefix(&[WITNESS_SHARE_MOVE_V1])?;
    let [share, client, to, sent] = take_strings::<4>(rest)?;
    if share.is_empty() || share.chars().count() > MAX_SHARE_NAME {
        return None;
    }
    let client = match client.as_str() {
        "" => None,
        c => Some(c.parse().ok()?),
    };
    Some(ShareMove {
        share,
        client,
        to: parse_addresses(&to)?,
        sent: sent.parse().ok()?,
    })
}

pub fn encode_drain(m: &WitnessDrain) -> Vec<u8> {
    let mut v = vec![WITNESS_DRAIN_V1];
    put_strings(&mut v, &[&m.node, &addresses(&m.to), &m.sent.to_string()]);
    v
}

pub fn decode_drain(msg: &[u8]) -> Option<WitnessDrain> {
    let rest = msg.strip_prefix(&[WITNESS_DRAIN_V1])?;
    let [node, to, sent] = take_strings::<3>(rest)?;
    Some(WitnessDrain {
        node,
        to: parse_addresses(&to)?,
        sent: sent.parse().ok()?,
    })
}

pub fn encode_stop(d: &Drain) -> Vec<u8> {
    let mut v = vec![DRAIN_V1];
    v.extend_from_slice(&d.incarnation.to_le_bytes());
    v.extend_from_slice(&d.within_secs.to_le_bytes());
    v.extend_from_slice(&d.sent.to_le_bytes());
    v
}

pub fn decode_stop(msg: &[u8]) -> Option<Drain> {
    let rest: &[u8; 20] = msg.strip_prefix(&[DRAIN_V1])?.try_into().ok()?;
    let (incarnation, rest) = rest.split_first_chunk::<8>()?;
    let (within, sent) = rest.split_first_chunk::<4>()?;
    Some(Drain {
        incarnation: u64::from_le_bytes(*incarnation),
        within_secs: u32::from_le_bytes(*within),
        sent: u64::from_le_bytes(sent.try_into().ok()?),
    })
}

/// Puts `value` in the box of each of `nodes`; how many took it.
pub fn post(store: &EtcdStore, nodes: &[String], value: &[u8]) -> Result<usize, StateError> {
    let lease = store.grant_lease(MESSAGE_TTL_SECS)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut posted = 0;
    for node in nodes {
        let mut key = crate::cluster::message_box(node);
        key.extend_from_slice(format!("witness-move-{stamp}").as_bytes());
        store.txn(&[], &[Op::Put(&key, value, lease)], &[])?;
        posted += 1;
    }
    Ok(posted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_round_trips_and_bad_ones_are_refused() {
        let m = WitnessMove {
            client: "192.0.2.7".parse().unwrap(),
            to: vec!["127.0.0.3".parse().unwrap(), "::1".parse().unwrap()],
            sent: now(),
        };
        assert_eq!(decode(&encode(&m)), Some(m.clone()));
        let enc = encode(&m);
        for cut in 0..enc.len() {
            assert_eq!(decode(&enc[..cut]), None, "{cut}");
        }
        let mut bad = vec![WITNESS_MOVE_V1];
        put_strings(&mut bad, &["192.0.2.7", "not-an-address", "1"]);
        assert_eq!(decode(&bad), None);
        let mut none = vec![WITNESS_MOVE_V1];
        put_strings(&mut none, &["192.0.2.7", "", "1"]);
        assert_eq!(decode(&none), None);
        let d = WitnessDrain {
            node: "n1".into(),
            to: vec!["127.0.0.3".parse().unwrap()],
            sent: 5,
        };
        assert_eq!(decode_drain(&encode_drain(&d)), Some(d));
        let stop = Drain {
            incarnation: 7,
            within_secs: 60,
            sent: now(),
        };
        assert_eq!(decode_stop(&encode_stop(&stop)), Some(stop.clone()));
        let enc = encode_stop(&stop);
        for cut in 0..enc.len() {
            assert_eq!(decode_stop(&enc[..cut]), None, "{cut}");
        }
        let share = ShareMove {
            share: "projects".into(),
            client: None,
            to: vec!["127.0.0.3".parse().unwrap()],
            sent: 9,
        };
        assert_eq!(decode_share(&encode_share(&share)), Some(share.clone()));
        let one = ShareMove {
            client: Some("192.0.2.7".parse().unwrap()),
            ..share.clone()
        };
        let enc = encode_share(&one);
        assert_eq!(decode_share(&enc), Some(one));
        for cut in 0..enc.len() {
            assert_eq!(decode_share(&enc[..cut]), None, "{cut}");
        }
        let long = ShareMove {
            share: "s".repeat(81),
            ..share
        };
        assert_eq!(decode_share(&encode_share(&long)), None);
        assert!(fresh(stop.sent));
        assert!(!fresh(stop.sent - 61) && !fresh(stop.sent + 61));
    }
}
