//! The records of a failover in etcd: a node's claim of a gone node's
//! open, and the mark a live node leaves on an open it let go of. Below
//! both the membership (`crate::cluster`), which sends a break to whoever
//! holds an open, and the failover that writes them (`nimbus_node::failover`).

use nimbus_state::StateStore;

/// Key prefix of the claims: `holder/<open id>` (8 bytes, big-endian).
pub const HOLDER_PREFIX: &[u8] = b"holder/";

pub fn holder_key(open_id: u64) -> Vec<u8> {
    per_open_key(HOLDER_PREFIX, open_id)
}

fn per_open_key(prefix: &[u8], open_id: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(&open_id.to_be_bytes());
    k
}

/// Key prefix of the marks a live node leaves on its own opens it let go
/// of: `released/<open id>` (8 bytes, big-endian), not under a lease (the
/// node may register again under a new one while the open lives on
/// elsewhere); deleted when the open closes for good.
const RELEASED_PREFIX: &[u8] = b"released/";

pub fn released_key(open_id: u64) -> Vec<u8> {
    per_open_key(RELEASED_PREFIX, open_id)
}

/// The incarnation that holds a gone node's open now, if one took it over.
pub fn holder_of(store: &dyn StateStore, open_id: u64) -> Option<u64> {
    let v = store.get(&holder_key(open_id)).ok()??;
    std::str::from_utf8(&v.value).ok()?.parse().ok()
}
