//! Durable and persistent handles across cluster nodes (issue 15,
//! failover and elasticity): a client whose node died or left reconnects
//! to another node and reclaims its handles there, with their locks and
//! caching.
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
//! **Leaving.** A node that leaves on SIGTERM first closes its
//! connections, which leaves its durable opens disconnected, then writes a
//! record of each (`hand_back`) and shares their files, and only then
//! gives up its lease: to the other nodes its durable opens are then what a
//! dead node's persistent opens are, with one difference that comes from
//! MS-SMB2 itself: a break that reaches a durable open whose client is away
//! closes it (`close_handed_back`), where a persistent one waits for its
//! client.
//!
//! **Reclaim.** The durable reconnect (DHnC or DH2C) of such an open, on
//! any node, finds no open there and asks `claim`: the node takes the open
//! by creating `holder/<open id>` under its lease (only while the record's
//! node is gone and nobody holds it), opens the file again and keeps the
//! open disconnected with its state as etcd has it; the reconnect then goes
//! on as on one node. A node that dies holding it lets it go with its
//! lease.
//!
//! **Moving on.** A client whose connection to the node that took its
//! open over is lost may reconnect to a third node while that one lives.
//! The third node asks the holder (`reclaim`: a message to its box) to let
//! go of the open: the holder, if the open still waits for its client
//! there and the request names the open's CreateGuid, drops its own copy
//! without closing it (its share-mode entry, locks and caching stay in
//! etcd under its open id; its record is in etcd already) and deletes its
//! claim (`let_go`); the third node then claims it as above.
//!
//! **Moving away from a live node.** A client whose connection to the
//! node that made its durable open is lost may reconnect to another node
//! while that node lives (name resolution gave it another address). The
//! other node asks the open's node to let go of it, as above; that node,
//! if the open waits for its client there and the request names its
//! CreateGuid, writes its record to etcd (a durable open's first; the
//! file's records go with it), marks it let go (`released/<open id>`, kept
//! until the open closes for good) and drops its copy. The open's id still
//! names that node, which lives: the mark is what lets another node claim
//! it. The node that let go keeps it pinned (its file's records stay in
//! etcd, and are not its to decide from memory), forwards the breaks that
//! come to it for the open to whichever node holds it, and takes it back
//! when no node does (its holder died): a break then ends as it would on
//! one node, and an open nobody reclaims expires there.
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
use nimbus_state::{FileKey, StateError, StateStore};

use crate::cluster::incarnation_of;
use crate::server::Server;
use crate::session::Open;

/// Key prefix of the claims: `holder/<open id>` (8 bytes, big-endian).
pub const HOLDER_PREFIX: &[u8] = b"holder/";

fn holder_key(open_id: u64) -> Vec<u8> {
    let mut k = HOLDER_PREFIX.to_vec();
    k.extend_from_slice(&open_id.to_be_bytes());
    k
}

/// Key prefix of the marks a live node leaves on its own opens it let go
/// of: `released/<open id>` (8 bytes, big-endian), not under a lease (the
/// node may register again under a new one while the open lives on
/// elsewhere); deleted when the open closes for good.
pub const RELEASED_PREFIX: &[u8] = b"released/";

fn released_key(open_id: u64) -> Vec<u8> {
    let mut k = RELEASED_PREFIX.to_vec();
    k.extend_from_slice(&open_id.to_be_bytes());
    k
}

/// Takes open `open_id` (its record in etcd) for this node, if its own
/// node is gone or let go of it, and nobody holds it: it is then a
/// disconnected open here, waiting for its client. Whether it now is.
pub fn claim(server: &Arc<Server>, open_id: u64) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    // Asked of etcd again: a client reconnects within a second of its node
    // leaving, while this node may still remember that node alive.
    let origin_gone = m.is_gone_now(incarnation_of(open_id));
    let marker = released_key(open_id);
    // A node that lives lets another take its open only by marking it.
    let released = if origin_gone {
        None
    } else {
        match m.store.get(&marker) {
            Ok(Some(v)) => Some(v.version),
            Ok(None) => {
                tracing::debug!("cluster: open {open_id:#x} not claimed: its node lives");
                return false;
            }
            Err(e) => {
                tracing::warn!("cluster: claiming open {open_id:#x}: {e}");
                return false;
            }
        }
    };
    let key = DurableOpen::key(open_id);
    let Ok(Some(v)) = m.store.get(&key) else {
        tracing::debug!("cluster: open {open_id:#x} not claimed: no record");
        return false;
    };
    let record = match DurableOpen::decode(&v.value) {
        Ok(r) if r.answered == Answered::Yes => r,
        r => {
            tracing::debug!(
                "cluster: open {open_id:#x} not claimed: record {:?}",
                r.map(|r| r.answered)
            );
            return false;
        }
    };
    let holder = holder_key(open_id);
    let me = m.incarnation().to_string();
    let mut unchanged = vec![Cmp::Absent(&holder), Cmp::Version(&key, Some(v.version))];
    if let Some(version) = released {
        unchanged.push(Cmp::Version(&marker, Some(version)));
    }
    let taken = m.store.txn(
        &unchanged,
        &[Op::Put(&holder, me.as_bytes(), m.lease())],
        &[],
    );
    match taken {
        Ok(t) if t.succeeded => {}
        Ok(_) => {
            tracing::debug!("cluster: open {open_id:#x} not claimed: held, or its record changed");
            return false;
        }
        Err(e) => {
            tracing::warn!("cluster: claiming open {open_id:#x}: {e}");
            return false;
        }
    }
    match take_over(server, &record, Instant::now()) {
        Ok(()) => {
            tracing::info!(
                "cluster: {} open {open_id:#x} of {} taken over from {}; \
                 its client has {} ms to reclaim it",
                kind(&record),
                record.path,
                if origin_gone {
                    "a gone node"
                } else {
                    "the node that let go of it"
                },
                record.timeout_ms
            );
            true
        }
        Err(why) => {
            tracing::warn!(
                "cluster: {} open {open_id:#x} not taken over: {why}",
                kind(&record)
            );
            let _ = m.store.txn(&[], &[Op::Delete(&holder)], &[]);
            false
        }
    }
}

/// Message tag of a request to let go of an open (`let_go`), beside
/// breaks (`nimbus_state::records::encode_break`) and notify changes
/// (`crate::cluster_notify`).
pub const LET_GO_V1: u8 = 0x20;

/// How long a reconnect waits for the node holding its open to let go.
const LET_GO_WAIT: Duration = Duration::from_secs(5);
/// How often it asks meanwhile.
const ASK_AGAIN: Duration = Duration::from_millis(250);

/// `LET_GO_V1`, the open id, and the CreateGuid the reconnect named (all
/// zero for a v1 reconnect).
pub fn encode_let_go(open_id: u64, create_guid: [u8; 16]) -> Vec<u8> {
    let mut m = Vec::with_capacity(25);
    m.push(LET_GO_V1);
    m.extend_from_slice(&open_id.to_le_bytes());
    m.extend_from_slice(&create_guid);
    m
}

pub fn decode_let_go(msg: &[u8]) -> Option<(u64, [u8; 16])> {
    let [LET_GO_V1, rest @ ..] = msg else {
        return None;
    };
    if rest.len() != 24 {
        return None;
    }
    let id = u64::from_le_bytes(rest[..8].try_into().ok()?);
    Some((id, rest[8..].try_into().ok()?))
}

/// A durable reconnect of `open_id` found no open here: `claim` it; when
/// another node that lives holds it (it made it, or took it over, and its
/// client came here), ask that node to let go first. Whether the open is
/// this node's now.
pub fn reclaim(server: &Arc<Server>, open_id: u64, create_guid: [u8; 16]) -> bool {
    if claim(server, open_id) {
        return true;
    }
    ask_to_let_go(server, open_id, create_guid) && claim(server, open_id)
}

/// Asks the node holding `open_id` (the one that took it over, else the
/// live one that made it) to let go of it and waits until it has (no node
/// holds it, and its node is gone or marked it let go), or `LET_GO_WAIT`.
fn ask_to_let_go(server: &Server, open_id: u64, create_guid: [u8; 16]) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    let origin = incarnation_of(open_id);
    let holder = match holder_of(m, open_id) {
        Some(h) => h,
        None if !m.is_gone(origin) => origin,
        None => {
            tracing::debug!("cluster: open {open_id:#x}: no node holds it");
            return false;
        }
    };
    if m.runs(holder) {
        return false;
    }
    tracing::debug!("cluster: open {open_id:#x}: asking incarnation {holder} to let go");
    let node = match m.node_of(holder) {
        Ok(Some(node)) => node,
        // Gone: its claim goes with its lease.
        Ok(None) => String::new(),
        Err(e) => {
            tracing::warn!("cluster: asking for open {open_id:#x}: {e}");
            return false;
        }
    };
    let deadline = Instant::now() + LET_GO_WAIT;
    let mut pause = Duration::from_millis(2);
    let mut asked: Option<Instant> = None;
    loop {
        // Asked again now and then: the holder may not have seen its
        // client's connection drop yet when the first request came (the
        // client reconnects here at once), and ignores a request for an
        // open still connected there.
        if !node.is_empty() && asked.is_none_or(|t| t.elapsed() >= ASK_AGAIN) {
            if let Err(e) = m.post(&node, &encode_let_go(open_id, create_guid)) {
                tracing::warn!("cluster: asking node {node} for open {open_id:#x}: {e}");
                return false;
            }
            asked = Some(Instant::now());
        }
        match free_to_claim(m, open_id) {
            Ok(true) => return true,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("cluster: waiting for open {open_id:#x}: {e}");
                return false;
            }
        }
        if Instant::now() >= deadline {
            tracing::info!(
                "cluster: node {node} did not let go of open {open_id:#x} within {:?} \
                 (its client may still be connected there)",
                LET_GO_WAIT
            );
            return false;
        }
        nimbus_state::blocking::off_worker(|| std::thread::sleep(pause));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Whether no node holds `open_id` and its own node is gone or let go of
/// it: a claim may take it.
fn free_to_claim(m: &crate::cluster::Membership, open_id: u64) -> Result<bool, StateError> {
    if m.store.get(&holder_key(open_id))?.is_some() {
        return Ok(false);
    }
    Ok(m.is_gone(incarnation_of(open_id)) || m.store.get(&released_key(open_id))?.is_some())
}

/// The disconnected open `open_id` of this node, if its CreateGuid is
/// `create_guid` (all zero for a v1 open).
fn waiting_here(server: &Server, open_id: u64, create_guid: [u8; 16]) -> Option<Arc<Open>> {
    let open = server.durables.find_disconnected(open_id)?;
    (open.replay.as_ref().map_or([0; 16], |r| r.key.1) == create_guid).then_some(open)
}

/// Another node's client reconnects to open `open_id`: if it waits for its
/// client here and `create_guid` is its CreateGuid, this node lets go of
/// it, an open it took over (`let_go_taken`) or one of its own
/// (`let_go_own`). A request for anything else (an open whose client is
/// connected here, a wrong CreateGuid) is ignored: the asking reconnect
/// then fails, as it would on one node.
pub fn let_go(server: &Server, open_id: u64, create_guid: [u8; 16]) {
    let Some(m) = &server.cluster else {
        return;
    };
    tracing::debug!("cluster: another node asks for open {open_id:#x}");
    if m.runs(incarnation_of(open_id)) && !m.is_released(open_id) {
        let_go_own(server, m, open_id, create_guid);
    } else {
        let_go_taken(server, m, open_id, create_guid);
    }
}

/// `let_go` of an open this node made: its record goes to etcd (a durable
/// open's first; a persistent one's is there), with its file's records;
/// the open is marked let go (`released/<open id>`) and this node drops
/// its copy without closing it. It stays pinned here (its entries name
/// this node).
fn let_go_own(
    server: &Server,
    m: &crate::cluster::Membership,
    open_id: u64,
    create_guid: [u8; 16],
) {
    let Some(open) = waiting_here(server, open_id, create_guid) else {
        tracing::debug!("cluster: open {open_id:#x} stays: no such open waits here for its client");
        return;
    };
    {
        let mut d = crate::session::lock(&open.durable);
        match d.as_mut() {
            Some(d) if !d.forgotten => {
                d.in_store = true;
                // Its client names it: its CREATE was answered.
                d.answered = true;
            }
            _ => return,
        }
    }
    if let Err(e) = crate::persist::save(server, &open) {
        tracing::warn!(
            "cluster: open {open_id:#x} not let go: its record could not be written ({e})"
        );
        return;
    }
    // Out of the table first: a reconnect here meanwhile finds nothing.
    let Some(open) = server.durables.claim(open_id) else {
        return;
    };
    // Marked here before etcd: a break that comes for it once it is gone
    // from the table is forwarded.
    m.mark_released(open_id);
    let me = m.incarnation().to_string();
    let marked = m.store.txn(
        &[Cmp::Absent(&holder_key(open_id))],
        &[Op::Put(&released_key(open_id), me.as_bytes(), 0)],
        &[],
    );
    if !matches!(marked, Ok(ref t) if t.succeeded) {
        tracing::warn!(
            "cluster: open {open_id:#x} not let go: it could not be marked ({marked:?})"
        );
        // Back to waiting for its client here, as if nobody had asked;
        // its record stays, and with it the pin.
        m.forget_released(open_id);
        m.pin(open_id);
        if server.durables.disconnect(&open, Instant::now()).is_err() {
            crate::handlers::close::release(server, &open);
        }
        return;
    }
    drop_copy(server, &open);
}

/// `let_go` of an open this node took over (from a gone node, or one that
/// let go of it): it drops its copy without closing it and deletes its
/// claim.
fn let_go_taken(
    server: &Server,
    m: &crate::cluster::Membership,
    open_id: u64,
    create_guid: [u8; 16],
) {
    let Some(open) = waiting_here(server, open_id, create_guid) else {
        return;
    };
    let in_store = crate::session::lock(&open.durable)
        .as_ref()
        .is_some_and(|d| d.in_store && !d.forgotten);
    if !in_store {
        return;
    }
    // Out of the table first: a reconnect here meanwhile finds nothing.
    let Some(open) = server.durables.claim(open_id) else {
        return;
    };
    // The claim goes next; only then is the open no longer this node's.
    // Should that fail, the open goes back to waiting for its client here
    // (its timeout counted again from now), as if nobody had asked.
    let holder = holder_key(open_id);
    let me = m.incarnation().to_string();
    let deleted = m.store.txn(
        &[Cmp::Value(&holder, me.as_bytes())],
        &[Op::Delete(&holder)],
        &[],
    );
    if !matches!(deleted, Ok(ref t) if t.succeeded) {
        tracing::warn!(
            "cluster: open {open_id:#x} not let go: its claim could not be given up ({deleted:?})"
        );
        if server.durables.disconnect(&open, Instant::now()).is_err() {
            crate::handlers::close::release(server, &open);
        }
        return;
    }
    drop_copy(server, &open);
    // One this node made stays pinned (its entries name this node).
    if !m.is_released(open_id) {
        m.unpin(open_id);
    }
}

/// Drops this node's copy of an open another node will hold, without
/// closing it: its share-mode entry, locks and caching stay in etcd under
/// its open id.
fn drop_copy(server: &Server, open: &Open) {
    let open_id = open.open_id;
    // Saves of it still under way here write nothing now: its record is
    // the next holder's.
    if let Some(d) = crate::session::lock(&open.durable).as_mut() {
        d.forgotten = true;
    }
    server.oplocks.let_go(open_id);
    server.opens.forget(open_id);
    server.durables.closed(open);
    tracing::info!(
        "cluster: {} open {open_id:#x} of {} let go for its client on another node",
        if open.is_persistent() {
            "persistent"
        } else {
            "durable"
        },
        open.path()
    );
}

fn kind(r: &DurableOpen) -> &'static str {
    if r.persistent {
        "persistent"
    } else {
        "durable"
    }
}

/// Whether `file` has a persistent open of a gone node that waits for its
/// client to reclaim it (no node has taken it over yet): a conflicting
/// open is then told STATUS_FILE_NOT_AVAILABLE, as on one node. (A durable
/// one is closed by the break the conflicting open sends instead.)
pub fn waits_for_reclaim(server: &Server, file: FileKey) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    let Ok(rec) = server.share_modes.record(file) else {
        return false;
    };
    rec.opens
        .iter()
        .any(|o| stranded_record(m, o.open_id).is_some_and(|r| r.persistent))
}

/// Whether `open_id` is a gone node's open with a record that no node took
/// over (or, on the node that let go of it, one of its own no node holds).
pub fn is_stranded(m: &crate::cluster::Membership, open_id: u64) -> bool {
    stranded_record(m, open_id).is_some()
}

/// The record of `open_id` when it is a gone node's open no node took
/// over. An etcd that does not answer proves nothing: None.
fn stranded_record(m: &crate::cluster::Membership, open_id: u64) -> Option<DurableOpen> {
    let away = m.is_gone(incarnation_of(open_id)) || m.is_released(open_id);
    if !away || m.open_is_gone(open_id) {
        return None;
    }
    let v = m.store.get(&DurableOpen::key(open_id)).ok()??;
    let r = DurableOpen::decode(&v.value).ok()?;
    matches!(m.store.get(&holder_key(open_id)), Ok(None)).then_some(r)
}

/// A break for `open_id`, which no node serves. A durable open handed back
/// by a node that left is closed, as a break closes a disconnected durable
/// open on one node (MS-SMB2 3.3.4.6 sends it nowhere, and the open that
/// caused it must not wait out the break timeout): taken here and closed,
/// which ends the break. Whether it was. A persistent one is left to wait
/// for its client (its break is taken as acknowledged by the caller).
pub fn close_handed_back(server: &Arc<Server>, open_id: u64) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    match stranded_record(m, open_id) {
        Some(r) if !r.persistent => {}
        _ => return false,
    }
    if !claim(server, open_id) {
        return false;
    }
    tracing::info!("cluster: durable open {open_id:#x} of a node that left closed by a break");
    server.durables.purge(server, open_id)
}

/// When this node leaves (SIGTERM), after its connections are closed: each
/// durable open left waiting for its client gets a record in etcd, its
/// file's state goes back to etcd, and its open id stays live there once
/// this node's lease is gone (`Membership::open_is_gone`), for the client
/// to reclaim on another node. Persistent opens have their records
/// already. Returns how many were handed back.
pub fn hand_back(server: &Arc<Server>) -> usize {
    if server.cluster.is_none() {
        return 0;
    }
    let mut handed = 0;
    for open in server.durables.all_disconnected() {
        {
            let mut d = crate::session::lock(&open.durable);
            match d.as_mut() {
                Some(d) if !d.in_store && !d.forgotten => {
                    d.in_store = true;
                    // Its CREATE was answered: the connection's responses
                    // were all written before it closed.
                    d.answered = true;
                }
                _ => continue,
            }
        }
        match crate::persist::save(server, &open) {
            Ok(()) => handed += 1,
            Err(e) => tracing::warn!(
                "cluster: durable open {:#x} of {} not handed back: {e}; \
                 its client cannot reclaim it on another node",
                open.open_id,
                open.path()
            ),
        }
    }
    handed
}

/// The incarnation that holds a gone node's open now, if one took it over.
pub fn holder_of(m: &crate::cluster::Membership, open_id: u64) -> Option<u64> {
    let v = m.store.get(&holder_key(open_id)).ok()??;
    std::str::from_utf8(&v.value).ok()?.parse().ok()
}

/// The claim of `open_id`, and the mark of its node letting go of it, go
/// with its close.
pub fn closed(server: &Server, open_id: u64) {
    if let Some(m) = &server.cluster {
        m.unpin(open_id);
        let origin = incarnation_of(open_id);
        if !m.runs(origin) || m.is_released(open_id) || m.is_gone(origin) {
            let (holder, marker) = (holder_key(open_id), released_key(open_id));
            let _ = m
                .store
                .txn(&[], &[Op::Delete(&holder), Op::Delete(&marker)], &[]);
            m.forget_released(open_id);
        }
    }
}

/// A break another node sent here for `open_id`, an open this node let go
/// of that is not served here: it goes on to the node holding the open;
/// when none does (its holder died), this node takes the open back, which
/// ends the break as on one node (a durable open closes, a persistent
/// one's is taken as acknowledged: `take_over`). Whether it was such an
/// open.
pub fn forward_break(
    server: &Arc<Server>,
    open_id: u64,
    order: &nimbus_state::caching::BreakOrder,
) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    if !m.is_released(open_id) || server.oplocks.serves_here(open_id) {
        return false;
    }
    // Twice at most: a node may claim it between the look and the take.
    for _ in 0..2 {
        match holder_of(m, open_id) {
            Some(h) if !m.runs(h) => {
                tracing::debug!(
                    "cluster: break for open {open_id:#x} forwarded to incarnation {h}"
                );
                if !m.send_break(open_id, order) {
                    tracing::debug!("cluster: break for open {open_id:#x} reached no node");
                }
                return true;
            }
            // Taken back here a moment ago.
            Some(_) => return false,
            None => {
                if claim(server, open_id) {
                    return true;
                }
            }
        }
    }
    true
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
    if !r.locks.is_empty() {
        server.locks.came_with_locks(file);
    }
    server.oplocks.take_over(file, r.open_id);
    crate::persist::wait_for_client(server, &open, r, since)?;
    // A break that reached the node that held it last, as it let go or
    // died, was answered by nobody: it ends now, as it would have ended
    // there (a persistent open's taken as acknowledged, a durable one
    // closes), rather than at the break timeout.
    if server.oplocks.open_breaking(file, r.open_id) {
        if r.persistent {
            server.oplocks.acknowledge_pending_for(file, r.open_id);
        } else {
            server.durables.purge(server, r.open_id);
        }
    }
    Ok(())
}

/// Records of gone nodes' opens that nobody reclaimed, with when this
/// node first saw each: after its timeout from then, it is taken and
/// closed.
#[derive(Default)]
pub struct Orphans {
    seen: HashMap<u64, Instant>,
}

/// One look for orphaned open records (every few seconds).
pub fn sweep_orphans(server: &Arc<Server>, orphans: &mut Orphans) {
    let Some(m) = &server.cluster else {
        return;
    };
    // Looked at before the scan: an open marked let go had its record
    // written first, so one in this list without a record in the scan
    // closed for good.
    let released = m.released();
    let (records, held) = match (
        m.store.scan_prefix(OPEN_PREFIX),
        m.store.scan_prefix(HOLDER_PREFIX),
    ) {
        (Ok(r), Ok(h)) => (r, h),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cluster: looking for orphaned durable opens: {e}");
            return;
        }
    };
    let held: HashSet<Vec<u8>> = held
        .into_iter()
        .filter_map(|(k, _)| k.strip_prefix(HOLDER_PREFIX).map(<[u8]>::to_vec))
        .collect();
    let mut now_orphaned = HashSet::new();
    let mut with_record = HashSet::new();
    for (key, v) in records {
        let Some(id) = key
            .strip_prefix(OPEN_PREFIX)
            .and_then(|b| <[u8; 8]>::try_from(b).ok())
        else {
            continue;
        };
        let open_id = u64::from_be_bytes(id);
        with_record.insert(open_id);
        let away = m.is_gone(incarnation_of(open_id)) || m.is_released(open_id);
        if held.contains(id.as_slice()) || !away {
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
                "cluster: {} open {open_id:#x} of {} was not reclaimed in time; closed",
                kind(&r),
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
    // Opens this node let go of that closed for good elsewhere (their
    // closer deleted the mark already, unless it died first).
    for open_id in released {
        if !with_record.contains(&open_id) {
            let _ = m.store.txn(&[], &[Op::Delete(&released_key(open_id))], &[]);
            m.forget_released(open_id);
        }
    }
}
