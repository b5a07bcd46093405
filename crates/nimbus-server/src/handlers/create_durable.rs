//! The durable handle side of CREATE: which durable context a request
//! carries (MS-SMB2 3.3.5.9.6, 3.3.5.9.10), granting durability to a new
//! open, replaying a CREATE by its CreateGuid, and reclaiming a
//! disconnected durable open (3.3.5.9.7, 3.3.5.9.12).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use nimbus_state::caching::{self, Granted};
use nimbus_state::durable_record::DurableOpen;
use nimbus_wire::create::{
    context_name, CreateAction, CreateContext, CreateRequest, CreateResponse,
};

use nimbus_wire::durable::{self as wire, ReconnectV2, RequestV2, ResponseV2};
use nimbus_wire::fscc::access;
use nimbus_wire::header::flags;
use nimbus_wire::negotiate::capabilities;
use nimbus_wire::oplock::{oplock_level, LeaseContext};
use nimbus_wire::{FileId, NtStatus};

use crate::acl::Token;
use crate::ctx::Ctx;
use crate::durable::{Durable, GuidEntry, GuidKey, Owner};
use crate::fileinfo::times_and_sizes;
use crate::oplocks::Route;
use crate::session::{Open, Tree};
use crate::sync::lock;

use super::create_security::{decide, Ask};

/// The durable context of a CREATE, checked for combinations the spec
/// refuses.
#[derive(Clone, Copy, Debug)]
pub enum DurableAsk {
    None,
    /// DHnQ: durable if a batch oplock or a handle-caching lease is granted.
    V1,
    /// DH2Q (3.x).
    V2(RequestV2),
    /// DHnC or DH2C: reclaim a disconnected open; nothing else of the
    /// request is acted on.
    Reconnect(Reconnect),
}

#[derive(Clone, Copy, Debug)]
pub enum Reconnect {
    V1(FileId),
    V2(ReconnectV2),
}

fn find<'a>(req: &'a CreateRequest, name: &[u8]) -> Option<&'a CreateContext> {
    req.contexts.iter().find(|c| c.name.as_slice() == name)
}

impl DurableAsk {
    /// Reads the durable contexts of `req`. v2 contexts are for 3.x only
    /// and ignored below it. A v1 reconnect ignores a v1 request beside it
    /// (3.3.5.9.7); every other mix of two kinds is INVALID_PARAMETER, as
    /// is a context of the wrong size.
    pub fn parse(req: &CreateRequest, smb3: bool) -> Result<DurableAsk, NtStatus> {
        let bad = |_| NtStatus::INVALID_PARAMETER;
        let q1 = find(req, context_name::DURABLE_HANDLE_REQUEST);
        let c1 = find(req, context_name::DURABLE_HANDLE_RECONNECT);
        let (q2, c2) = if smb3 {
            (
                find(req, context_name::DURABLE_HANDLE_REQUEST_V2),
                find(req, context_name::DURABLE_HANDLE_RECONNECT_V2),
            )
        } else {
            (None, None)
        };
        if (q2.is_some() || c2.is_some()) && (q1.is_some() || c1.is_some())
            || (q2.is_some() && c2.is_some())
        {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        Ok(if let Some(c) = c1 {
            DurableAsk::Reconnect(Reconnect::V1(
                wire::parse_reconnect_v1(&c.data).map_err(bad)?,
            ))
        } else if let Some(c) = c2 {
            DurableAsk::Reconnect(Reconnect::V2(ReconnectV2::parse(&c.data).map_err(bad)?))
        } else if let Some(c) = q2 {
            DurableAsk::V2(RequestV2::parse(&c.data).map_err(bad)?)
        } else if let Some(c) = q1 {
            wire::parse_request_v1(&c.data).map_err(bad)?;
            DurableAsk::V1
        } else {
            DurableAsk::None
        })
    }
}

/// Who the request's session is logged on as, by its token's user SID:
/// None for a guest or anonymous session (and for a user removed from the
/// database since it logged on, which acts as a guest), which may neither
/// be granted a durable handle nor reclaim or replay one.
pub(crate) fn owner(ctx: &Ctx<'_>) -> Option<Owner> {
    crate::disconnected::session_owner(ctx.session().ok()?)
}

/// Whether what the open caches makes it durable (MS-SMB2 3.3.5.9.6): a
/// batch oplock, or a lease with handle caching.
fn caching_allows(granted: &Granted) -> bool {
    match granted {
        Granted::Oplock(level) => *level == oplock_level::BATCH,
        Granted::Lease { state, .. } => state & caching::HANDLE != 0,
    }
}

/// Grants durability to a new open as `ask` asks and its caching allows;
/// returns the response context to add.
pub fn grant(
    ctx: &mut Ctx<'_>,
    open: &Arc<Open>,
    ask: &DurableAsk,
    granted: &Granted,
) -> Option<CreateContext> {
    // A persistent handle (MS-SMB2 3.3.5.9.10): asked for on a
    // continuously available share by a connection whose NEGOTIATE answered
    // SMB2_GLOBAL_CAP_PERSISTENT_HANDLES (so its client announced it),
    // granted whatever is cached. Otherwise the ask is one for a durable
    // handle.
    let persistent = match ask {
        DurableAsk::V2(r) => {
            r.flags & wire::FLAG_PERSISTENT != 0
                && open.share.continuous_availability
                && ctx.server.disk_store.is_some()
                && ctx
                    .conn
                    .negotiated()
                    .is_some_and(|n| n.server_capabilities & capabilities::PERSISTENT_HANDLES != 0)
        }
        _ => false,
    };
    if open.is_dir || !(persistent || caching_allows(granted)) {
        return None;
    }
    let limits = &ctx.server.config().limits;
    let timeout = match ask {
        DurableAsk::V1 => limits.durable_handle_timeout,
        DurableAsk::V2(r) => match r.timeout_ms {
            0 => limits.durable_handle_timeout,
            ms => Duration::from_millis(ms as u64).min(limits.max_durable_handle_timeout),
        },
        _ => return None,
    };
    let owner = owner(ctx)?;
    ctx.server.durables.granted(
        open,
        Durable {
            timeout,
            persistent,
            in_store: persistent,
            owner,
            answered: false,
            forgotten: false,
        },
    );
    // Its record is on disk before the client hears of it; marked
    // answered once the response is written. A store that fails leaves a
    // durable handle that is not persistent, and the client is told so.
    let persistent = persistent
        && match crate::persist::save(ctx.server, open) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(
                    "persistent open {} not recorded ({e}): granted as durable only",
                    open.open_id
                );
                if let Some(d) = lock(&open.durable).as_mut() {
                    d.persistent = false;
                    d.in_store = false;
                }
                false
            }
        };
    if persistent {
        let server = ctx.server.clone();
        let open = open.clone();
        ctx.on_sent
            .push(Box::new(move || crate::persist::answered(&server, &open)));
    }
    let mut data = Vec::with_capacity(ResponseV2::LEN);
    let name = match ask {
        DurableAsk::V2(_) => {
            ResponseV2 {
                timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
                flags: if persistent { wire::FLAG_PERSISTENT } else { 0 },
            }
            .encode(&mut data);
            context_name::DURABLE_HANDLE_REQUEST_V2
        }
        _ => {
            wire::encode_response_v1(&mut data);
            context_name::DURABLE_HANDLE_REQUEST
        }
    };
    Some(CreateContext {
        name: name.to_vec(),
        data,
    })
}

/// The lease context a request carries, if any.
fn lease_asked(req: &CreateRequest) -> Option<LeaseContext> {
    find(req, context_name::REQUEST_LEASE).and_then(|c| LeaseContext::parse(&c.data).ok())
}

/// A CREATE with a DH2Q whose CreateGuid names an open of this client that
/// is still replay-eligible (MS-SMB2 3.3.5.9.10): with the replay flag it
/// is answered with that open, as the first CREATE was; without it, the
/// client reused a CreateGuid (DUPLICATE_OBJECTID). A CreateGuid whose
/// CREATE still waits for breaks gets FILE_NOT_AVAILABLE: the client may
/// try again once that one is answered. Ok(None): no such open, go on
/// with a new one.
pub fn replay(
    ctx: &mut Ctx<'_>,
    req: &CreateRequest,
    key: GuidKey,
    out: &mut Vec<u8>,
) -> Result<Option<NtStatus>, NtStatus> {
    let open_id = match ctx.server.durables.by_create_guid(key) {
        None => return Ok(None),
        Some(GuidEntry::Open(id)) => id,
        Some(GuidEntry::Pending(waiting)) => {
            // The waiting CREATE itself, run again once its breaks ended.
            let me = ctx.resumed.as_ref().map(|r| r.async_id());
            if waiting.upgrade().map(|w| w.async_id()) == me {
                return Ok(None);
            }
            return Err(NtStatus::FILE_NOT_AVAILABLE);
        }
    };
    let Some(open) = ctx.server.opens.get(open_id) else {
        return Ok(None);
    };
    if !open.replay_eligible.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let Some(create_action) = open.replay.as_ref().map(|r| r.create_action) else {
        return Ok(None);
    };
    let session = ctx.session()?.clone();
    let mut in_session = lock(&session.opens)
        .get(&open.volatile_id())
        .is_some_and(|o| Arc::ptr_eq(o, &open));
    let replaying = ctx.hdr.flags & flags::REPLAY_OPERATION != 0;
    if replaying && !in_session {
        // A replay from a new connection after the first one was lost
        // (MS-SMB2 3.2.7.1): the open kept for its client comes to this
        // session, as a reconnect would bring it.
        in_session = reclaim_for_replay(ctx, &open)?;
    }
    if !replaying || !in_session {
        tracing::debug!(
            "CreateGuid of open {open_id} reused (replay flag {}, same session {in_session})",
            ctx.hdr.flags & flags::REPLAY_OPERATION != 0
        );
        return Err(NtStatus::DUPLICATE_OBJECTID);
    }
    let (held, lease) = ctx.server.oplocks.held_by(open.file_key, open.open_id);
    let asked_lease = (req.requested_oplock_level == oplock_level::LEASE)
        .then(|| lease_asked(req))
        .flatten();
    let mut contexts = Vec::new();
    let level = match (asked_lease, lease, held) {
        (
            Some(asked),
            Some(id),
            Granted::Lease {
                state,
                epoch,
                version,
                ..
            },
        ) if asked.lease_key == id.key => {
            contexts.extend(super::create_caching::lease_response(
                &req.contexts,
                state,
                epoch,
                false,
                version,
            ));
            oplock_level::LEASE
        }
        // A replay naming another lease, or a lease the open does not
        // hold, is not the CREATE it claims to repeat.
        (Some(_), _, _) => return Err(NtStatus::ACCESS_DENIED),
        // The level the replay asks for is the one reported (Windows and
        // Samba agree; smbtorture smb2.replay.replay-dhv2-oplock2).
        (None, _, _) => match req.requested_oplock_level {
            l @ (oplock_level::II | oplock_level::EXCLUSIVE | oplock_level::BATCH) => l,
            _ => oplock_level::NONE,
        },
    };
    let durable = lock(&open.durable).clone();
    if let Some(d) = durable.filter(|_| matches!(level, oplock_level::BATCH | oplock_level::LEASE))
    {
        let mut data = Vec::with_capacity(ResponseV2::LEN);
        ResponseV2 {
            timeout_ms: d.timeout.as_millis().min(u32::MAX as u128) as u32,
            flags: if d.persistent {
                wire::FLAG_PERSISTENT
            } else {
                0
            },
        }
        .encode(&mut data);
        contexts.push(CreateContext {
            name: context_name::DURABLE_HANDLE_REQUEST_V2.to_vec(),
            data,
        });
    }
    let info =
        crate::fileinfo::open_info(&open, false).map_err(|e| crate::errors::vfs_status(&e))?;
    let file_id = FileId {
        persistent: open.open_id,
        volatile: open.volatile_id(),
    };
    ctx.chain_file_id = Some(file_id);
    CreateResponse {
        oplock_level: level,
        create_action,
        info: times_and_sizes(&info),
        file_id,
        contexts,
    }
    .encode(out);
    Ok(Some(NtStatus::SUCCESS))
}

/// Reclaims a disconnected durable open for the session and tree of this
/// request (MS-SMB2 3.3.5.9.7 and 3.3.5.9.12). The open comes back as it
/// was left: its access, share modes, locks, oplock or lease, position;
/// the request's own access, disposition and options are not looked at.
pub fn reconnect(
    ctx: &mut Ctx<'_>,
    req: &CreateRequest,
    how: Reconnect,
    body: &[u8],
    out: &mut Vec<u8>,
    again: super::deferred::Handler,
) -> Result<NtStatus, NtStatus> {
    let tree = ctx.tree()?.clone();
    let (file_id, create_guid) = match how {
        Reconnect::V1(id) => (id, None),
        Reconnect::V2(r) => (r.file_id, Some(r.create_guid)),
    };
    // Every refusal below, another user's handle included, answers as a
    // handle that does not exist does: FileIds are not secrets to be
    // tested one by one for whose open they name.
    let not_found = NtStatus::OBJECT_NAME_NOT_FOUND;
    let me = owner(ctx).ok_or(not_found)?;
    // The client may have left the open's connection a moment ago, and
    // the open not be disconnected yet (`crate::leaving`).
    let mut open = crate::leaving::reconnect_look(
        ctx.server,
        file_id.persistent,
        (ctx.conn, &me),
        crate::teardowns::WAIT,
        || {
            ctx.server
                .durables
                .find_disconnected(file_id.persistent)
                .or_else(|| disconnect_if_closing(ctx, file_id.persistent))
        },
    );
    // On a cluster node, an open another node held is taken over here
    // (`crate::failover`); one a live node holds is asked for, and this
    // request waits for the answer, answered STATUS_PENDING meanwhile.
    if open.is_none() && ctx.server.cluster.is_some() {
        match reclaim_from_cluster(ctx, file_id.persistent, create_guid, &me, body, again)? {
            Some(status) => return Ok(status),
            None => open = ctx.server.durables.find_disconnected(file_id.persistent),
        }
    }
    let open = open.ok_or(not_found)?;
    let d = lock(&open.durable).clone().ok_or(not_found)?;
    if me != d.owner {
        return Err(not_found);
    }
    // A v1 open has no CreateGuid: only an all-zero one names it.
    let open_guid = open.replay.as_ref().map_or([0; 16], |r| r.key.1);
    if create_guid.is_some_and(|g| g != open_guid) {
        return Err(not_found);
    }
    if !Arc::ptr_eq(&open.share, &tree.share) {
        return Err(not_found);
    }
    let neg = ctx.conn.negotiated().ok_or(not_found)?;
    let (held, lease) = ctx.server.oplocks.held_by(open.file_key, open.open_id);
    if let Some(id) = lease {
        // A leased open is reclaimed only by its client, naming its lease
        // and its file.
        let asked = lease_asked(req).ok_or(not_found)?;
        if asked.lease_key != id.key || neg.client_guid != id.client {
            return Err(not_found);
        }
        if !same_name(&req.name, &open.path()) {
            return Err(NtStatus::INVALID_PARAMETER);
        }
    }
    let info = times_and_sizes(
        &crate::fileinfo::open_info(&open, false).map_err(|e| crate::errors::vfs_status(&e))?,
    );
    // Another reconnect, the open's expiry or a purge may have come first.
    let open = ctx.server.durables.claim(open.open_id).ok_or(not_found)?;
    let file_id = attach(ctx, &open)?;
    tracing::debug!(
        "durable open {} ({}) reclaimed from {}",
        open.open_id,
        open.path(),
        ctx.conn.peer
    );
    let (level, lease) = super::create_caching::caching_response(&req.contexts, &held);
    let contexts: Vec<CreateContext> = lease.into_iter().collect();
    ctx.chain_file_id = Some(file_id);
    CreateResponse {
        oplock_level: level,
        create_action: CreateAction::Opened,
        info,
        file_id,
        contexts,
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

/// Whether the session of `token`, on `tree`, may have the open record
/// `r` describes (one another node kept): as a CREATE of its file asking
/// for the record's access would be let (MS-FSA 2.1.5.1.2.1), on the same
/// share. A record is only what some node wrote to etcd; the file's own
/// descriptor decides.
fn may_reopen(tree: &Tree, token: &Token, r: &DurableOpen) -> bool {
    let Some(fs) = tree.share.fs.as_ref() else {
        return false;
    };
    if !tree.share.name.eq_ignore_ascii_case(&r.share) {
        return false;
    }
    let desired = r.access | if r.delete_on_close { access::DELETE } else { 0 };
    let ask = Ask {
        path: &r.path,
        is_new: false,
        is_dir: false,
        desired,
        truncating: false,
        adds_stream: false,
        given: None,
        own: None,
        parent: None,
    };
    let Ok(security) = decide(fs, &ask, token) else {
        return false;
    };
    let writes = access::FILE_WRITE_DATA | access::FILE_APPEND_DATA | access::DELETE;
    desired & !(tree.maximal_access() & security.limit) == 0
        && !(tree.share.read_only() && desired & writes != 0)
}

/// `reconnect`'s look for its open in the cluster: Ok(None) when it was
/// claimed here or is nowhere (the caller looks again), Ok(PENDING) when
/// its holder was asked to let go and the request waits for the answer.
fn reclaim_from_cluster(
    ctx: &mut Ctx<'_>,
    open_id: u64,
    create_guid: Option<[u8; 16]>,
    me: &Owner,
    body: &[u8],
    // The CREATE's handler, run again once the other node answered.
    again: super::deferred::Handler,
) -> Result<Option<NtStatus>, NtStatus> {
    let server = ctx.server.clone();
    let Some(m) = server.cluster.clone() else {
        return Ok(None);
    };
    let req = crate::let_go_handover::LetGo {
        open_id,
        create_guid,
        owner: me.clone(),
    };
    let session = ctx.session()?;
    let session_id = session.id;
    let token = session.token().ok_or(NtStatus::USER_SESSION_DELETED)?;
    let tree = ctx.tree()?.clone();
    let may_reopen = |r: &DurableOpen| may_reopen(&tree, &token, r);
    let asked_before = ctx.resumed.is_some();
    let mut parked = None;
    let reclaim = crate::failover::reclaim;
    let outcome = reclaim(
        &server,
        &req,
        session_id,
        asked_before,
        &may_reopen,
        |nonce| {
            let mut wake = None;
            let status = super::deferred::park(
                ctx,
                body,
                again,
                move |_| m.forget_let_go(open_id, nonce),
                |_, resume| wake = Some(resume),
            );
            parked = Some(status);
            wake
        },
    );
    match (outcome, parked) {
        (crate::failover::Reclaim::Asked, Some(status)) => status.map(Some),
        _ => Ok(None),
    }
}

/// A replayed CREATE names a disconnected durable open of its own user on
/// the request's share: it is claimed for the request's session.
fn reclaim_for_replay(ctx: &Ctx<'_>, open: &Arc<Open>) -> Result<bool, NtStatus> {
    let server = ctx.server;
    let Some(d) = lock(&open.durable).clone() else {
        return Ok(false);
    };
    if server.durables.find_disconnected(open.open_id).is_none()
        || !Arc::ptr_eq(&open.share, &ctx.tree()?.share)
        || owner(ctx).is_none_or(|me| me != d.owner)
    {
        return Ok(false);
    }
    let Some(open) = server.durables.claim(open.open_id) else {
        return Ok(false);
    };
    attach(ctx, &open)?;
    Ok(true)
}

/// Puts a claimed disconnected open in the request's session and tree
/// under a new volatile id, with breaks going to this connection; returns
/// its FileId. Its breaks are routed before the session holds it: the
/// end of the session (its last channel lost meanwhile) then finds it
/// whole and sends its breaks back to the disconnected handler, instead
/// of leaving them routed to a connection that is gone.
fn attach(ctx: &Ctx<'_>, open: &Arc<Open>) -> Result<FileId, NtStatus> {
    let session = ctx.session()?.clone();
    let tree = ctx.tree()?.clone();
    let ended = |open: &Arc<Open>| {
        // Logged off on another channel meanwhile: the claimed open goes
        // back to waiting for a reconnect.
        crate::disconnected::keep_or_close(ctx.server, open);
        Err(NtStatus::USER_SESSION_DELETED)
    };
    let volatile = {
        let opens = lock(&session.opens);
        if session.has_ended() {
            drop(opens);
            return ended(open);
        }
        ctx.server
            .new_volatile_id(open.open_id, |id| opens.contains_key(&id))
    };
    open.reattach(session.id, tree.id, volatile);
    let file_id = FileId {
        persistent: open.open_id,
        volatile,
    };
    ctx.server.oplocks.attach(
        open.open_id,
        Route {
            conn: Arc::<crate::connection::Connection>::downgrade(ctx.conn),
            session: Arc::<crate::session::Session>::downgrade(&session),
            session_id: session.id,
            file_id,
            seal: super::create_caching::break_cipher(&session, &tree),
        },
    );
    if !session.add_open(open) {
        return ended(open);
    }
    Ok(file_id)
}

/// A client reconnects as soon as it sees its connection fail; the server
/// may not have finished tearing that connection down. A durable open
/// still attached to a connection that is closing is disconnected now,
/// rather than answering the reconnect OBJECT_NAME_NOT_FOUND.
fn disconnect_if_closing(ctx: &Ctx<'_>, open_id: u64) -> Option<Arc<Open>> {
    let server = ctx.server;
    let open = server.opens.get(open_id)?;
    if !open.is_durable() {
        return None;
    }
    let session = server.sessions.find(open.session_id())?;
    // Disconnected only when no channel of the session is left.
    if !session.connections().iter().all(|c| c.is_closing()) {
        return None;
    }
    let removed = session.take_open(&open)?;
    crate::disconnected::keep_or_close(server, &removed);
    server.durables.find_disconnected(open_id)
}

/// Whether the name of a reconnect names the open's file (share-relative,
/// any case), read as a CREATE's name is.
fn same_name(asked: &str, path: &str) -> bool {
    nimbus_vfs::names::to_vfs_path(asked)
        .is_ok_and(|asked| asked.to_lowercase() == path.to_lowercase())
}

/// The AppInstanceId of a CREATE (MS-SMB2 2.2.13.2.13), heeded beside a
/// DH2Q context on 3.x only.
pub fn app_instance(req: &CreateRequest, ask: &DurableAsk) -> Option<[u8; 16]> {
    if !matches!(ask, DurableAsk::V2(_)) {
        return None;
    }
    let c = find(req, context_name::APP_INSTANCE_ID)?;
    // StructureSize (20), Reserved, AppInstanceId.
    if c.data.len() != 20 || c.data[..2] != 20u16.to_le_bytes() {
        return None;
    }
    c.data[4..20].try_into().ok()
}

/// MS-SMB2 3.3.5.9.13: a durable CREATE of `file` under AppInstanceId `id`
/// closes the other opens of that file made under the same id, without a
/// break: the application moved to another client node and its old
/// handles must not keep the file from it. Only opens of the same share,
/// made by another client (ClientGuid) for the same user (SID), are
/// closed: the id is the application's, and it names nothing of another
/// user's, a guest's, or the same client's own.
pub fn close_app_instance(ctx: &Ctx<'_>, file: nimbus_state::FileKey, id: [u8; 16]) {
    let server = ctx.server;
    let (Some(me), Some(neg), Ok(tree)) = (owner(ctx), ctx.conn.negotiated(), ctx.tree()) else {
        return;
    };
    let share = tree.share.name.clone();
    crate::disconnected::close_app_instance_opens(server, file, id, &share, neg.client_guid, &me);
    if let Some(m) = &server.cluster {
        close_on_other_nodes(m, file, id, &share, neg.client_guid, &me);
    }
}

/// How long a CREATE under an AppInstanceId waits for the other nodes to
/// close the application's old opens. A node answers as soon as its inbox
/// watch delivers the request; one that does not answer within this is
/// taken to have lost its opens with its lease, and the CREATE goes on
/// (meeting whatever is left as any open would).
const APP_INSTANCE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `close_app_instance` on every other node of the cluster
/// (`crate::app_instance_handover`), waiting for their answers.
fn close_on_other_nodes(
    m: &crate::cluster::Membership,
    file: nimbus_state::FileKey,
    id: [u8; 16],
    share: &str,
    client_guid: [u8; 16],
    me: &Owner,
) {
    let nodes = match m.other_nodes() {
        Ok(nodes) => nodes,
        Err(e) => {
            tracing::warn!("AppInstanceId: listing the other nodes: {e}");
            return;
        }
    };
    let request = |nonce| {
        crate::app_instance_handover::encode_request(
            &crate::app_instance_handover::CloseAppInstance {
                nonce,
                dev: file.dev,
                ino: file.ino,
                gen: file.gen,
                app_instance: id,
                client_guid,
                reply_to: m.node.clone(),
                share: share.to_string(),
                owner_sid: me.sid.clone(),
            },
        )
    };
    let answers = m.ask_nodes(&nodes, request, APP_INSTANCE_WAIT);
    if answers.len() < nodes.len() {
        tracing::warn!(
            "AppInstanceId: {} of {} other node(s) answered within {}s",
            answers.len(),
            nodes.len(),
            APP_INSTANCE_WAIT.as_secs()
        );
    }
}
