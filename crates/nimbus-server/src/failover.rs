//! Persistent handles across cluster nodes (issue 15, failover): a client
//! whose node died reconnects to another node and reclaims its persistent
//! handles there, with their locks and caching.
//!
//! **What outlives a node.** A cluster node keeps persistent open records
//! (`open/<open id>`, as `crate::persist` writes them) in etcd, not under
//! its lease. The files of its persistent opens are never owned by it
//! (`Membership::pin`): their share-mode, lock and caching records are in
//! etcd too. When the node dies, those entries stay, and an open whose
//! node is gone but whose record remains is not gone
//! (`Membership::open_is_gone`): other clients' conflicting opens and
//! locks are refused meanwhile.
//!
//! **Reclaim.** The durable reconnect (DH2C) of such an open, on any node,
//! finds no open there and asks `claim`: the node takes the open by
//! creating `holder/<open id>` under its lease (only while the record's
//! node is gone and nobody holds it), opens the file again and keeps the
//! open disconnected with its state as etcd has it; the reconnect then goes
//! on as on one node. A node that dies holding it lets it go with its
//! lease.
//!
//! **Expiry.** A record nobody reclaims is kept for its durable timeout
//! from when a node first saw it orphaned; after that any node takes it and
//! closes it (`sweep_orphans`), which frees its file.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::durable_record::{Answered, DurableOpen, OPEN_PREFIX};
use nimbus_state::etcd_store::{Cmp, Op};
use nimbus_state::records::Record;
use nimbus_state::{FileKey, StateStore};

use crate::cluster::incarnation_of;
use crate::server::Server;

/// Key prefix of the claims: `holder/<open id>` (8 bytes, big-endian).
pub const HOLDER_PREFIX: &[u8] = b"holder/";

fn holder_key(open_id: u64) -> Vec<u8> {
    let mut k = HOLDER_PREFIX.to_vec();
    k.extend_from_slice(&open_id.to_be_bytes());
    k
}

/// Takes persistent open `open_id` of a gone node for this one, if nobody
/// holds it: it is then a disconnected open here, waiting for its client.
/// Whether it now is.
pub fn claim(server: &Arc<Server>, open_id: u64) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    if !m.is_gone(incarnation_of(open_id)) {
        return false;
    }
    let key = DurableOpen::key(open_id);
    let Ok(Some(v)) = m.store.get(&key) else {
        return false;
    };
    let record = match DurableOpen::decode(&v.value) {
        Ok(r) if r.answered == Answered::Yes => r,
        _ => return false,
    };
    let holder = holder_key(open_id);
    let me = m.incarnation().to_string();
    let taken = m.store.txn(
        &[Cmp::Absent(&holder), Cmp::Version(&key, Some(v.version))],
        &[Op::Put(&holder, me.as_bytes(), m.lease())],
        &[],
    );
    match taken {
        Ok(t) if t.succeeded => {}
        Ok(_) => return false,
        Err(e) => {
            tracing::warn!("cluster: claiming persistent open {open_id:#x}: {e}");
            return false;
        }
    }
    match take_over(server, &record, Instant::now()) {
        Ok(()) => {
            tracing::info!(
                "cluster: persistent open {open_id:#x} of {} taken over from a gone node; \
                 its client has {} ms to reclaim it",
                record.path,
                record.timeout_ms
            );
            true
        }
        Err(why) => {
            tracing::warn!("cluster: persistent open {open_id:#x} not taken over: {why}");
            let _ = m.store.txn(&[], &[Op::Delete(&holder)], &[]);
            false
        }
    }
}

/// Whether `file` has a persistent open of a gone node that waits for its
/// client to reclaim it (no node has taken it over yet): a conflicting
/// open is then told STATUS_FILE_NOT_AVAILABLE, as on one node.
pub fn waits_for_reclaim(server: &Server, file: FileKey) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    let Ok(rec) = server.share_modes.record(file) else {
        return false;
    };
    rec.opens.iter().any(|o| is_stranded(m, o.open_id))
}

/// Whether `open_id` is a gone node's persistent open no node took over.
pub fn is_stranded(m: &crate::cluster::Membership, open_id: u64) -> bool {
    m.is_gone(incarnation_of(open_id))
        && !m.open_is_gone(open_id)
        && matches!(m.store.get(&holder_key(open_id)), Ok(None))
}

/// The incarnation that holds a gone node's open now, if one took it over.
pub fn holder_of(m: &crate::cluster::Membership, open_id: u64) -> Option<u64> {
    let v = m.store.get(&holder_key(open_id)).ok()??;
    std::str::from_utf8(&v.value).ok()?.parse().ok()
}

/// The claim of `open_id` goes with its close.
pub fn closed(server: &Server, open_id: u64) {
    if let Some(m) = &server.cluster {
        m.unpin(open_id);
        if m.is_gone(incarnation_of(open_id)) {
            let _ = m.store.txn(&[], &[Op::Delete(&holder_key(open_id))], &[]);
        }
    }
}

/// Opens the file of `r` again on this node and keeps the open
/// disconnected since `since`. Its share-mode entry, locks and caching are
/// in etcd already (its file's records are shared); only what this node
/// keeps about its own opens is set up.
fn take_over(server: &Arc<Server>, r: &DurableOpen, since: Instant) -> Result<(), String> {
    let (share, handle, file) = crate::persist::open_file_again(server, r)?;
    // Its share-mode entry is in etcd; put again, it stays (or comes back,
    // if something dropped it; the take-over fails on a conflict).
    crate::persist::add_share_mode(server, r, file)?;
    let slot = server.open_files.reserve().ok_or("too many open files")?;
    let open = crate::persist::open_of_record(server, r, share, handle, file, slot);
    server.oplocks.take_over(file, r.open_id);
    crate::persist::wait_for_client(server, &open, r, since)
}

/// Persistent records of gone nodes that nobody reclaimed, with when this
/// node first saw each: after its timeout from then, it is taken and
/// closed.
#[derive(Default)]
pub struct Orphans {
    seen: HashMap<u64, Instant>,
}

/// One look for orphaned persistent records (every few seconds).
pub fn sweep_orphans(server: &Arc<Server>, orphans: &mut Orphans) {
    let Some(m) = &server.cluster else {
        return;
    };
    let (records, held) = match (
        m.store.scan_prefix(OPEN_PREFIX),
        m.store.scan_prefix(HOLDER_PREFIX),
    ) {
        (Ok(r), Ok(h)) => (r, h),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cluster: looking for orphaned persistent opens: {e}");
            return;
        }
    };
    let held: HashSet<Vec<u8>> = held
        .into_iter()
        .filter_map(|(k, _)| k.strip_prefix(HOLDER_PREFIX).map(<[u8]>::to_vec))
        .collect();
    let mut now_orphaned = HashSet::new();
    for (key, v) in records {
        let Some(id) = key
            .strip_prefix(OPEN_PREFIX)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
        else {
            continue;
        };
        let open_id = u64::from_be_bytes(id);
        if held.contains(id.as_slice()) || !m.is_gone(incarnation_of(open_id)) {
            continue;
        }
        let Ok(r) = DurableOpen::decode(&v.value) else {
            continue;
        };
        now_orphaned.insert(open_id);
        let first = *orphans.seen.entry(open_id).or_insert_with(Instant::now);
        if first.elapsed() < Duration::from_millis(r.timeout_ms as u64) {
            continue;
        }
        // Its time is up: taken here and closed at once.
        if claim(server, open_id) {
            tracing::info!(
                "cluster: persistent open {open_id:#x} of {} was not reclaimed in time; closed",
                r.path
            );
            server.durables.purge(server, open_id);
        } else if r.answered != Answered::Yes {
            // Never answered: no client knows it, and its entries go as a
            // gone node's once the record has.
            let _ = m.store.compare_and_set(&key, Some(v.version), None);
        }
    }
    orphans.seen.retain(|id, _| now_orphaned.contains(id));
}
