//! The witness service's registrations as etcd keeps them (MS-SWN
//! 3.1.1.1): `witness/<holder>/<handle>`, one key per registration, under
//! the holding node's lease, so that they go with the node that can reach
//! their clients. The holder answers the client's AsyncNotify from its own
//! memory; what etcd's copy is for is the rest of the cluster and its
//! administrator: `nimbus witness list` shows every node's registrations,
//! and `nimbus witness move` and `nimbus drain` post their messages only
//! to the nodes holding a registration they concern.
//!
//! Values are sealed with the cluster key like every other record, but they
//! are still read as untrusted: each field is bounded, and a value that
//! does not decode is counted and left out, never acted on.

use std::net::IpAddr;

use nimbus_state::etcd_store::EtcdStore;
use nimbus_state::StateError;

use crate::node_message::{put_strings, take_strings};

/// The registrations' key prefix.
pub const WITNESS_PREFIX: &[u8] = b"witness/";
/// A registration record's first byte (its version).
const WITNESS_RECORD_V1: u8 = 0x30;

/// One registration, as the node holding it records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WitnessRecord {
    /// The client's address, as its witness connection came from.
    pub client: IpAddr,
    /// The client's computer name (WitnessrRegister's ClientComputerName).
    pub client_name: String,
    /// The interface registered for: its node and address.
    pub node: String,
    pub addr: IpAddr,
    /// The share RegisterEx named.
    pub share: Option<String>,
    /// RegisterEx asked for IP_CHANGE.
    pub ip_notify: bool,
    /// When it was made (Unix seconds).
    pub since: u64,
}

/// A registration and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRecord {
    /// The node whose witness service holds it (and answers its client).
    pub holder: String,
    /// Its context handle, in hex.
    pub handle: String,
    pub record: WitnessRecord,
}

pub fn encode(r: &WitnessRecord) -> Vec<u8> {
    let mut v = vec![WITNESS_RECORD_V1];
    put_strings(
        &mut v,
        &[
            &r.client.to_string(),
            &r.client_name,
            &r.node,
            &r.addr.to_string(),
            r.share.as_deref().unwrap_or(""),
            if r.ip_notify { "1" } else { "0" },
            &r.since.to_string(),
        ],
    );
    v
}

/// A record; None for anything else (a field that does not parse, a flag
/// other than 0 or 1, bytes left over).
pub fn decode(value: &[u8]) -> Option<WitnessRecord> {
    let rest = value.strip_prefix(&[WITNESS_RECORD_V1])?;
    let [client, client_name, node, addr, share, ip_notify, since] = take_strings::<7>(rest)?;
    Some(WitnessRecord {
        client: client.parse().ok()?,
        client_name,
        node,
        addr: addr.parse().ok()?,
        share: (!share.is_empty()).then_some(share),
        ip_notify: match ip_notify.as_str() {
            "0" => false,
            "1" => true,
            _ => return None,
        },
        since: since.parse().ok()?,
    })
}

/// The registration item (the key's last part) for `handle`.
pub fn item(handle: &[u8]) -> String {
    handle.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every node's registrations, ordered by holder then handle, and how many
/// values failed their seal or did not decode (left out: one forged record
/// must not hide the others).
pub fn read_all(store: &EtcdStore) -> Result<(Vec<HeldRecord>, usize), StateError> {
    let mut held = Vec::new();
    let (found, mut refused) = store.scan_prefix_skipping_forged(WITNESS_PREFIX)?;
    for (key, value) in found {
        let parsed = std::str::from_utf8(&key[WITNESS_PREFIX.len()..])
            .ok()
            .and_then(|k| k.split_once('/'))
            .zip(decode(&value.value));
        match parsed {
            Some(((holder, handle), record)) => held.push(HeldRecord {
                holder: holder.to_owned(),
                handle: handle.to_owned(),
                record,
            }),
            None => {
                tracing::warn!(
                    "witness: a registration record {} does not decode: left out",
                    String::from_utf8_lossy(&key)
                );
                refused += 1;
            }
        }
    }
    held.sort_by(|a, b| (&a.holder, &a.handle).cmp(&(&b.holder, &b.handle)));
    Ok((held, refused))
}

/// The nodes holding at least one registration `which` selects, each once.
pub fn holders(held: &[HeldRecord], which: impl Fn(&WitnessRecord) -> bool) -> Vec<String> {
    let mut nodes: Vec<String> = held
        .iter()
        .filter(|h| which(&h.record))
        .map(|h| h.holder.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> WitnessRecord {
        WitnessRecord {
            client: "192.0.2.7".parse().unwrap(),
            client_name: "WS7".into(),
            node: "n1".into(),
            addr: "127.0.0.1".parse().unwrap(),
            share: Some("ca".into()),
            ip_notify: true,
            since: 1_790_000_000,
        }
    }

    #[test]
    fn a_record_reads_back_and_anything_else_is_refused() {
        let r = record();
        assert_eq!(decode(&encode(&r)), Some(r.clone()));
        let plain = WitnessRecord {
            share: None,
            ip_notify: false,
            ..r.clone()
        };
        assert_eq!(decode(&encode(&plain)), Some(plain));
        let good = encode(&r);
        // Cut anywhere, a byte more, another version: refused.
        for end in 0..good.len() {
            assert_eq!(decode(&good[..end]), None, "cut at {end}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&longer), None);
        let mut other = good.clone();
        other[0] = 0x31;
        assert_eq!(decode(&other), None);
        // A flag other than 0 or 1, an address that does not parse.
        for fields in [
            ["192.0.2.7", "WS7", "n1", "127.0.0.1", "", "2", "1"],
            ["192.0.2.x", "WS7", "n1", "127.0.0.1", "", "0", "1"],
            ["192.0.2.7", "WS7", "n1", "127.0.0.1", "", "0", "-1"],
        ] {
            let mut v = vec![WITNESS_RECORD_V1];
            put_strings(&mut v, &fields);
            assert_eq!(decode(&v), None, "{fields:?}");
        }
    }

    #[test]
    fn holders_are_named_once_each() {
        let r = record();
        let held: Vec<HeldRecord> = [("n2", "aa"), ("n3", "bb"), ("n2", "cc")]
            .iter()
            .map(|(holder, handle)| HeldRecord {
                holder: (*holder).into(),
                handle: (*handle).into(),
                record: r.clone(),
            })
            .collect();
        assert_eq!(holders(&held, |_| true), vec!["n2", "n3"]);
        assert!(holders(&held, |r| r.node == "n9").is_empty());
    }
}
