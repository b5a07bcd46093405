//! Durable and persistent handles across cluster nodes (failover and
//! elasticity): a client whose node died or left reconnects
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
//! there and the request names the open's CreateGuid and owner, drops its own copy
//! without closing it (its share-mode entry, locks and caching stay in
//! etcd under its open id; its record is in etcd already) and deletes its
//! claim (`let_go`); the third node then claims it as above.
//!
//! **Moving away from a live node.** A client whose connection to the
//! node that made its durable open is lost may reconnect to another node
//! while that node lives (name resolution gave it another address). The
//! other node asks the open's node to let go of it, as above; that node,
//! if the open waits for its client there and the request names its
//! CreateGuid and owner, writes its record to etcd (a durable open's first; the
//! file's records go with it), marks it let go (`released/<open id>`, kept
//! until the open closes for good) and drops its copy. The open's id still
//! names that node, which lives: the mark is what lets another node claim
//! it. The node that let go keeps it pinned (its file's records stay in
//! etcd, and are not its to decide from memory), forwards the breaks that
//! come to it for the open to whichever node holds it, and takes it back
//! when no node does (its holder died): a break then ends as it would on
//! one node, and an open nobody reclaims expires there.
//!
//! The asking node asks only for an open whose record, where etcd has
//! one, names the reconnect's user (SID) and CreateGuid, at most
//! `LET_GO_ASKS_PER_SESSION` times a session in a window, and once per
//! reconnect. The node asked answers at once (`LET_GO_DONE_V1`, or
//! `LET_GO_REFUSED_V1` for an open that does not wait for its client
//! there, or not for that CreateGuid and owner: one still connected there
//! is refused as on one node). Meanwhile the reconnect is answered
//! STATUS_PENDING and holds no thread; the answer, the end of the asked
//! node's run (its lease ran out: etcd says so), or `LET_GO_WAIT` without
//! either, runs it again, and that run only claims.
//!
//! **Expiry.** A record nobody reclaims is kept for its durable timeout
//! from when a node first saw it orphaned; after that any node takes it and
//! closes it (`sweep_orphans`), which frees its file.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::caching::BreakOrder;
use nimbus_state::durable_record::{Answered, DurableOpen, OPEN_PREFIX};
use nimbus_state::etcd_store::{Cmp, Op};
use nimbus_state::records::Record;
use nimbus_state::{FileKey, StateError, StateStore, Versioned};

use crate::claims::{holder_key, holder_of, released_key, HOLDER_PREFIX};
use crate::cluster::incarnation_of;
use crate::let_go_handover::{encode_answer, encode_let_go, Asked, LetGo, LetGoAnswer};
use crate::open::Open;
use crate::server::Server;

/// What `claim_for` did.
enum Claimed {
    /// The open is this node's now.
    Taken,
    /// Its record names another user or CreateGuid, or was never
    /// answered: nothing of it is this reconnect's.
    NotYours,
    /// Another node holds it (or no record shows it yet), or etcd did not
    /// answer.
    Held,
}

/// Takes open `open_id` (its record in etcd) for this node, if its own
/// node is gone or let go of it, and nobody holds it: it is then a
/// disconnected open here, waiting for its client. Whether it now is.
pub fn claim(server: &Arc<Server>, open_id: u64) -> bool {
    matches!(claim_for(server, open_id, None), Claimed::Taken)
}

/// Whether the session reconnecting may have the open a record describes
/// on its tree: the file's own security descriptor and the share decide,
/// never the record (whoever could write etcd could have written it).
pub type MayReopen<'a> = &'a dyn Fn(&DurableOpen) -> bool;

/// `claim`, for a reconnect when `asking` (whose user and CreateGuid the
/// record must name: another user's reconnect would fail after the move
/// anyway, and must not reset its timeout or move it about, nor have
/// other nodes asked for it; and whose session must be let have the open).
fn claim_for(
    server: &Arc<Server>,
    open_id: u64,
    asking: Option<(&LetGo, MayReopen<'_>)>,
) -> Claimed {
    let Some(m) = &server.cluster else {
        return Claimed::Held;
    };
    let key = DurableOpen::key(open_id);
    // The record first: a reconnect it does not name ends here, and asks
    // nothing of other nodes.
    let v = match m.store.get(&key) {
        Ok(Some(v)) => v,
        Ok(None) => {
            tracing::debug!("cluster: open {open_id:#x} not claimed: no record");
            return Claimed::Held;
        }
        Err(e) => {
            tracing::warn!("cluster: claiming open {open_id:#x}: {e}");
            return Claimed::Held;
        }
    };
    let record = match DurableOpen::decode(&v.value) {
        // A client that names the open with its ids heard the CREATE's
        // answer, even when its node died before marking the record so.
        Ok(r)
            if (r.answered == Answered::Yes || asking.is_some())
                && asking.is_none_or(|(a, _)| names(a, &r)) =>
        {
            r
        }
        r => {
            tracing::debug!(
                "cluster: open {open_id:#x} not claimed: record {:?}",
                r.map(|r| r.answered)
            );
            return Claimed::NotYours;
        }
    };
    if let Some((_, may_reopen)) = asking {
        if !may_reopen(&record) {
            tracing::warn!(
                "cluster: open {open_id:#x} of {} not claimed: the file's security descriptor \
                 or the share does not give its owner the access its record holds ({:#x})",
                record.path,
                record.access
            );
            return Claimed::NotYours;
        }
    }
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
                return Claimed::Held;
            }
            Err(e) => {
                tracing::warn!("cluster: claiming open {open_id:#x}: {e}");
                return Claimed::Held;
            }
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
            return Claimed::Held;
        }
        Err(e) => {
            tracing::warn!("cluster: claiming open {open_id:#x}: {e}");
            return Claimed::Held;
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
            Claimed::Taken
        }
        Err(why) => {
            tracing::warn!(
                "cluster: {} open {open_id:#x} not taken over: {why}",
                kind(&record)
            );
            crate::errors::cleanup(
                format_args!("dropping the claim of open {open_id:#x}"),
                m.store.txn(&[], &[Op::Delete(&holder)], &[]),
            );
            Claimed::Held
        }
    }
}

/// Whether record `r` is of the open a reconnect asks for: its user
/// (SID) and, for a v2 reconnect, its CreateGuid (all zero for a v1 open).
/// A v1 reconnect names the open by its FileId alone (MS-SMB2 3.3.5.9.7),
/// as it does on one node.
fn names(asking: &LetGo, r: &DurableOpen) -> bool {
    asking.owner.sid == r.owner_sid && asking.create_guid.is_none_or(|g| g == r.create_guid)
}

/// Numbers this node's requests to let go.
static NEXT_ASK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// How long a reconnect waits for the node holding its open to answer;
/// a node that lives answers within a round trip through etcd.
const LET_GO_WAIT: Duration = Duration::from_secs(5);

/// What a durable reconnect that found no open here got from the cluster.
pub enum Reclaim {
    /// The open is this node's now, waiting for its client.
    Claimed,
    /// The node holding it was asked to let go; the reconnect waits for
    /// its answer, and `resumed` runs then (or when that node's run ends,
    /// or after `LET_GO_WAIT`).
    Asked,
    /// No open for this reconnect: none, another user's, or one its node
    /// keeps (its client is still connected there).
    NotFound,
}

/// A durable reconnect of `open_id` found no open here: `claim` it. When
/// another node that lives holds it (it made it, or took it over, and its
/// client came here), that node is asked to let go, once: `resume` runs
/// the reconnect again when it answers, and that run (`asked_before`)
/// only claims. A request is made only for an open whose record, where
/// etcd has one, names the reconnect's user and CreateGuid; at most a few
/// etcd calls each, and at most `LET_GO_ASKS_PER_SESSION` a session in
/// each window.
pub fn reclaim(
    server: &Arc<Server>,
    req: &LetGo,
    session_id: u64,
    asked_before: bool,
    may_reopen: MayReopen<'_>,
    resume: impl FnOnce(u64) -> Option<crate::cluster::LetGoWait>,
) -> Reclaim {
    let Some(m) = &server.cluster else {
        return Reclaim::NotFound;
    };
    match claim_for(server, req.open_id, Some((req, may_reopen))) {
        Claimed::Taken => return Reclaim::Claimed,
        Claimed::NotYours => return Reclaim::NotFound,
        Claimed::Held if asked_before => return Reclaim::NotFound,
        Claimed::Held => {}
    }
    if !m.may_ask_to_let_go(session_id) {
        tracing::warn!(
            "cluster: session {session_id:#x} asked other nodes to let go of too many opens \
             lately; open {:#x} not asked for",
            req.open_id
        );
        return Reclaim::NotFound;
    }
    match ask_to_let_go(m, req, resume) {
        true => Reclaim::Asked,
        false => Reclaim::NotFound,
    }
}

/// Asks the node holding `req`'s open (the one that took it over, else the
/// live one that made it) to let go of it, and registers what `resume`
/// gives (handed the request's number) to run at its answer. Whether it
/// was asked.
fn ask_to_let_go(
    m: &Arc<crate::cluster::Membership>,
    req: &LetGo,
    resume: impl FnOnce(u64) -> Option<crate::cluster::LetGoWait>,
) -> bool {
    let open_id = req.open_id;
    let origin = incarnation_of(open_id);
    let holder = match holder_of(m.store.as_ref(), open_id) {
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
    let node = match m.node_of(holder) {
        Ok(Some(node)) => node,
        // Gone: its claim goes with its lease, and nobody is there to ask.
        Ok(None) => return false,
        Err(e) => {
            tracing::warn!("cluster: asking for open {open_id:#x}: {e}");
            return false;
        }
    };
    let asked = Asked {
        req: LetGo {
            open_id,
            create_guid: req.create_guid,
            owner: req.owner.clone(),
        },
        reply_to: m.node.clone(),
        nonce: NEXT_ASK.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let Some(runtime) = m.let_go_room() else {
        tracing::warn!(
            "cluster: too many reconnects wait for other nodes; open {open_id:#x} not asked for"
        );
        return false;
    };
    let Some(wake) = resume(asked.nonce) else {
        return false;
    };
    // Registered before the request goes: the answer may come at once.
    m.await_let_go(open_id, asked.nonce, wake, runtime, LET_GO_WAIT, holder);
    tracing::debug!("cluster: open {open_id:#x}: asking node {node} to let go");
    if let Err(e) = m.post(&node, &encode_let_go(&asked)) {
        tracing::warn!("cluster: asking node {node} for open {open_id:#x}: {e}");
        // The reconnect waits already: it runs again now, and finds no
        // open to claim.
        m.let_go_answered(open_id, asked.nonce);
    }
    true
}

/// The disconnected open a request names, if it waits here for its client
/// and the request names its CreateGuid and owner.
fn waiting_here(server: &Server, req: &LetGo) -> Option<Arc<Open>> {
    let open = server.durables.find_disconnected(req.open_id)?;
    let guid = open.replay.as_ref().map_or([0; 16], |r| r.key.1);
    let owned = crate::sync::lock(&open.durable)
        .as_ref()
        .is_some_and(|d| d.owner == req.owner && !d.forgotten);
    (req.create_guid.is_none_or(|g| g == guid) && owned).then_some(open)
}

/// Another node's client reconnects to an open that waits for its client
/// here: if the request names its CreateGuid and owner, this node lets go
/// of it, an open it took over (`let_go_taken`) or one of its own
/// (`let_go_own`). The asking node is answered either way, at once: a
/// request for anything else (an open whose client is still connected
/// here, a wrong CreateGuid, another user) is refused, as one node
/// refuses a reconnect of an open whose connection lives (MS-SMB2
/// 3.3.5.9.7).
pub fn let_go(server: &Server, asked: &Asked) {
    let Some(m) = &server.cluster else {
        return;
    };
    let req = &asked.req;
    let open_id = req.open_id;
    tracing::debug!("cluster: another node asks for open {open_id:#x}");
    let answer = match waiting_here(server, req) {
        None => {
            tracing::debug!(
                "cluster: open {open_id:#x} stays: no such open waits here for its client"
            );
            LetGoAnswer::Refused
        }
        Some(open) => {
            let gone = if m.runs(incarnation_of(open_id)) && !m.is_released(open_id) {
                let_go_own(server, m, open)
            } else {
                let_go_taken(server, m, open)
            };
            if gone {
                LetGoAnswer::Done
            } else {
                LetGoAnswer::Refused
            }
        }
    };
    if let Err(e) = m.post(
        &asked.reply_to,
        &encode_answer(answer, open_id, asked.nonce),
    ) {
        tracing::warn!(
            "cluster: answering {} about open {open_id:#x}: {e}",
            asked.reply_to
        );
    }
}

/// `let_go` of an open this node made: its record goes to etcd (a durable
/// open's first; a persistent one's is there), with its file's records;
/// the open is marked let go (`released/<open id>`) and this node drops
/// its copy without closing it. It stays pinned here (its entries name
/// this node).
fn let_go_own(server: &Server, m: &crate::cluster::Membership, open: Arc<Open>) -> bool {
    let open_id = open.open_id;
    let was_in_store = {
        let mut d = crate::sync::lock(&open.durable);
        let Some(d) = d.as_mut() else {
            return false;
        };
        let was = d.in_store;
        d.in_store = true;
        // Its client names it: its CREATE was answered.
        d.answered = true;
        was
    };
    if let Err(e) = crate::persist::save(server, &open) {
        tracing::warn!(
            "cluster: open {open_id:#x} not let go: its record could not be written ({e})"
        );
        // As it was: a durable open this node keeps in its memory (handed
        // back should the node leave).
        if !was_in_store {
            if let Some(d) = crate::sync::lock(&open.durable).as_mut() {
                d.in_store = false;
            }
            m.unpin(open_id);
        }
        return false;
    }
    // Out of the table first: a reconnect here meanwhile finds nothing.
    let Some(open) = server.durables.claim(open_id) else {
        return false;
    };
    stop_serving(server, &open);
    // Marked here before etcd: a break that comes for it from now on is
    // sent on to whichever node holds it.
    m.mark_released(open_id);
    let (holder, marker) = (holder_key(open_id), released_key(open_id));
    let me = m.incarnation().to_string();
    let marked = match m.store.txn(
        &[Cmp::Absent(&holder)],
        &[Op::Put(&marker, me.as_bytes(), 0)],
        &[],
    ) {
        Ok(t) => t.succeeded,
        Err(e) => {
            // Perhaps written: taken back if it can be, else taken as
            // written (another node may claim it already); this node then
            // takes it back itself should nobody hold it
            // (`sweep_orphans`, `forward_break`).
            tracing::warn!("cluster: marking open {open_id:#x} let go: {e}");
            let undone = m.store.txn(
                &[Cmp::Value(&marker, me.as_bytes())],
                &[Op::Delete(&marker)],
                &[],
            );
            undone.is_err()
        }
    };
    if !marked {
        tracing::warn!("cluster: open {open_id:#x} not let go: it could not be marked");
        // Back to waiting for its client here, as if nobody had asked;
        // its record stays, and with it the pin.
        m.forget_released(open_id);
        m.pin(open_id);
        serve_again(server, &open);
        return false;
    }
    drop_copy(server, &open);
    true
}

/// `let_go` of an open this node took over (from a gone node, or one that
/// let go of it): it drops its copy without closing it and deletes its
/// claim.
fn let_go_taken(server: &Server, m: &crate::cluster::Membership, open: Arc<Open>) -> bool {
    let open_id = open.open_id;
    let in_store = crate::sync::lock(&open.durable)
        .as_ref()
        .is_some_and(|d| d.in_store);
    if !in_store {
        return false;
    }
    // Out of the table first: a reconnect here meanwhile finds nothing.
    let Some(open) = server.durables.claim(open_id) else {
        return false;
    };
    stop_serving(server, &open);
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
        serve_again(server, &open);
        return false;
    }
    drop_copy(server, &open);
    // One this node made stays pinned (its entries name this node).
    if !m.is_released(open_id) {
        m.unpin(open_id);
    }
    true
}

/// Before an open is given up: saves of it write nothing from now on (its
/// record is the next holder's), and breaks for it no longer end here.
fn stop_serving(server: &Server, open: &Open) {
    if let Some(d) = crate::sync::lock(&open.durable).as_mut() {
        d.forgotten = true;
    }
    server.oplocks.let_go(open.open_id);
}

/// An open that could not be given up waits for its client here again
/// (its timeout counted from now).
fn serve_again(server: &Server, open: &Arc<Open>) {
    if let Some(d) = crate::sync::lock(&open.durable).as_mut() {
        d.forgotten = false;
    }
    server.oplocks.detach(open.open_id);
    if server.durables.disconnect(open, Instant::now()).is_err() {
        crate::release::release(server, open);
    }
}

/// Drops this node's copy of an open another node holds now, without
/// closing it: its share-mode entry, locks and caching stay in etcd under
/// its open id. What this node kept of its write time goes to the file,
/// as at a close (the next holder keeps its own).
fn drop_copy(server: &Server, open: &Open) {
    let open_id = open.open_id;
    crate::release::settle_write_time(server, open);
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
    crate::disconnected::purge(server, open_id)
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
            let mut d = crate::sync::lock(&open.durable);
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

/// A break another node sent here for `open_id`, an open this node let go
/// of that is not served here: it goes on to the node holding the open;
/// when none does (its holder died), this node takes the open back, which
/// ends the break as on one node (a durable open closes, a persistent
/// one's is taken as acknowledged: `take_over`). Whether it was such an
/// open.
pub fn forward_break(server: &Arc<Server>, open_id: u64, order: &BreakOrder) -> bool {
    let Some(m) = &server.cluster else {
        return false;
    };
    if !m.is_released(open_id) || server.oplocks.serves_here(open_id) {
        return false;
    }
    match holder_of(m.store.as_ref(), open_id) {
        Some(h) if !m.runs(h) => {
            post_to_holder(m, h, open_id, order, server.oplocks.break_timeout());
            true
        }
        // Taken back here a moment ago.
        Some(_) => false,
        // Taken back on a thread of its own: a take-over opens the file
        // and writes to etcd, and the messages behind this one (other
        // opens' breaks) do not wait for it.
        None => {
            {
                let mut taking = lock_taking_back();
                if let Some(queued) = taking.get_mut(&open_id) {
                    // Its take-back is under way: this break follows it.
                    queued.push(*order);
                    return true;
                }
                taking.insert(open_id, vec![*order]);
            }
            let server = server.clone();
            let spawned = std::thread::Builder::new()
                .name("nimbus-take-back".into())
                .spawn(move || take_back_all(&server, open_id));
            if let Err(e) = spawned {
                tracing::warn!("cluster: taking open {open_id:#x} back: {e}");
                lock_taking_back().remove(&open_id);
            }
            true
        }
    }
}

/// Let-go opens being taken back (`forward_break`), each with the breaks
/// for it that came meanwhile (handled in order once it is here).
static TAKING_BACK: std::sync::LazyLock<std::sync::Mutex<HashMap<u64, Vec<BreakOrder>>>> =
    std::sync::LazyLock::new(Default::default);

fn lock_taking_back() -> std::sync::MutexGuard<'static, HashMap<u64, Vec<BreakOrder>>> {
    crate::sync::lock(&TAKING_BACK)
}

/// Handles the breaks queued for a let-go open being taken back, the
/// first of which started it, until none is left.
fn take_back_all(server: &Arc<Server>, open_id: u64) {
    loop {
        let orders = {
            let mut taking = lock_taking_back();
            match taking.get_mut(&open_id) {
                Some(queued) if !queued.is_empty() => std::mem::take(queued),
                _ => {
                    taking.remove(&open_id);
                    return;
                }
            }
        };
        for order in &orders {
            take_back(server, open_id, order);
        }
    }
}

/// Takes back a let-go open that nobody holds, which ends `order` as on
/// one node (`take_over`); twice at most, as a node may claim it between
/// the look and the take (the break then goes to it).
fn take_back(server: &Arc<Server>, open_id: u64, order: &BreakOrder) {
    let Some(m) = &server.cluster else {
        return;
    };
    for _ in 0..2 {
        match holder_of(m.store.as_ref(), open_id) {
            Some(h) if !m.runs(h) => {
                return post_to_holder(m, h, open_id, order, server.oplocks.break_timeout())
            }
            // Here (taken back by this break or one before it): it ends
            // as on one node.
            Some(_) => return server.oplocks.deliver_here(open_id, *order),
            None if claim(server, open_id) => return,
            None => {}
        }
    }
}

fn post_to_holder(
    m: &crate::cluster::Membership,
    holder: u64,
    open_id: u64,
    order: &BreakOrder,
    break_timeout: std::time::Duration,
) {
    if m.post_break(holder, open_id, order, break_timeout) {
        tracing::debug!("cluster: break for open {open_id:#x} forwarded to incarnation {holder}");
    }
}

/// Opens the file of `r` again on this node and keeps the open
/// disconnected since `since`. Its share-mode entry, locks and caching are
/// in etcd already (its file's records are shared); only what this node
/// keeps about its own opens is set up.
fn take_over(
    server: &Arc<Server>,
    r: &DurableOpen,
    since: Instant,
) -> Result<(), crate::persist::NotReopened> {
    let (share, handle, file, path) = crate::persist::open_file_again(server, r)?;
    let _through = crate::persist::opened_through(server, &share, &path)?;
    let r = &DurableOpen { path, ..r.clone() };
    // Its share-mode entry is in etcd; put again, it stays (or comes back,
    // if something dropped it; the take-over fails on a conflict).
    crate::persist::add_share_mode(server, r, file)?;
    let slot = server
        .open_files
        .reserve()
        .ok_or(crate::persist::NotReopened::TooManyOpenFiles)?;
    let open = crate::persist::open_of_record(server, r, share, handle, file, slot);
    if !r.locks.is_empty() {
        server.locks.came_with_locks(file);
    }
    server.oplocks.take_over(file, r.open_id);
    if let Err(why) = crate::persist::wait_for_client(server, &open, r, since) {
        // Not kept here (too many disconnected opens): this node's copy
        // goes again, as when one is let go, and its records in etcd stay
        // for a node that can keep it (the claim is deleted by the caller).
        stop_serving(server, &open);
        server.opens.forget(open.open_id);
        server.durables.closed(&open);
        return Err(why);
    }
    // A break that reached the node that held it last, as it let go or
    // died, was answered by nobody: it ends now, as it would have ended
    // there (a persistent open's taken as acknowledged, a durable one
    // closes), rather than at the break timeout.
    if server.oplocks.open_breaking(file, r.open_id) {
        if r.persistent {
            server.oplocks.acknowledge_pending_for(file, r.open_id);
        } else {
            crate::disconnected::purge(server, r.open_id);
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

/// One look for orphaned open records (every few seconds). The node
/// elected to look (`nimbus_cluster::sweeper`, `everyone`) reads every
/// handle record; any other node only those of its own opens it let go of
/// (point reads, none while it has let go of nothing), which no other
/// node counts as orphaned.
pub fn sweep_orphans(server: &Arc<Server>, orphans: &mut Orphans, everyone: bool) {
    let Some(m) = &server.cluster else {
        return;
    };
    // Looked at before the reads: an open marked let go had its record
    // written first, so one in this list without a record below closed
    // for good.
    let released = m.released();
    if !everyone && released.is_empty() {
        orphans.seen.clear();
        return;
    }
    // Point reads for a few; past that, the two range reads cost less.
    let read = if everyone || released.len() > RELEASED_POINT_READS {
        read_all_records(m)
    } else {
        read_records_of(m, &released)
    };
    let (records, held) = match read {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!("cluster: looking for orphaned durable opens: {e}");
            return;
        }
    };
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
            crate::disconnected::purge(server, open_id);
        } else if r.answered != Answered::Yes {
            // Never answered: no client knows it, and its entries go as a
            // gone node's once the record has.
            crate::errors::cleanup(
                format_args!("dropping the record of unanswered open {open_id:#x}"),
                m.store.compare_and_set(&key, Some(v.version), None),
            );
        }
    }
    orphans.seen.retain(|id, _| now_orphaned.contains(id));
    // Opens this node let go of that closed for good elsewhere (their
    // closer deleted the mark already, unless it died first).
    for open_id in released {
        if !with_record.contains(&open_id) {
            crate::errors::cleanup(
                format_args!("dropping the let-go mark of open {open_id:#x}"),
                m.store.txn(&[], &[Op::Delete(&released_key(open_id))], &[]),
            );
            m.forget_released(open_id);
        }
    }
}

/// Up to this many opens let go of, a node that does not look for every
/// orphan reads their records one by one.
const RELEASED_POINT_READS: usize = 16;

/// Handle records (key, record) and the ids of those somebody holds.
type RecordsAndHolders = (Vec<(Vec<u8>, Versioned)>, HashSet<Vec<u8>>);

/// Every handle record of the cluster, and which are held (two range
/// reads).
fn read_all_records(m: &crate::cluster::Membership) -> Result<RecordsAndHolders, StateError> {
    let records = m.store.scan_prefix(OPEN_PREFIX)?;
    let held = m
        .store
        .scan_prefix(HOLDER_PREFIX)?
        .into_iter()
        .filter_map(|(k, _)| k.strip_prefix(HOLDER_PREFIX).map(<[u8]>::to_vec))
        .collect();
    Ok((records, held))
}

/// The records of `open_ids`, and which are held (two point reads each).
fn read_records_of(
    m: &crate::cluster::Membership,
    open_ids: &[u64],
) -> Result<RecordsAndHolders, StateError> {
    let mut records = Vec::new();
    let mut held = HashSet::new();
    for &open_id in open_ids {
        let key = DurableOpen::key(open_id);
        if let Some(v) = m.store.get(&key)? {
            records.push((key, v));
        }
        if m.store.get(&holder_key(open_id))?.is_some() {
            held.insert(open_id.to_be_bytes().to_vec());
        }
    }
    Ok((records, held))
}
