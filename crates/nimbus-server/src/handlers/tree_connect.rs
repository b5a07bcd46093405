//! MS-SMB2 3.3.5.7 Receiving an SMB2 TREE_CONNECT Request and 3.3.5.8
//! TREE_DISCONNECT.

use std::sync::Arc;

use nimbus_wire::simple::{encode_empty, parse_empty};
use nimbus_wire::tree_connect::{share_flags, ShareType, TreeConnectRequest, TreeConnectResponse};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::config::EncryptionPolicy;
use crate::ctx::{Ctx, HandlerResult};
use crate::session::{SessionState, Tree};
use crate::sync::lock;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = TreeConnectRequest::parse(body).map_err(malformed)?;
    let session = ctx.session()?.clone();
    let name = req.share_name();
    let (guest, can_encrypt, can_sign) = match &*lock(&session.state) {
        SessionState::Valid(a) => (a.guest, a.cipher.is_some(), a.signer.is_some()),
        SessionState::InProgress { .. } => return Err(NtStatus::USER_SESSION_DELETED),
    };
    // MS-SMB2 3.3.5.7: on 3.1.1 a TREE_CONNECT of a session that has keys
    // (neither guest nor anonymous) must be signed or sealed. 3.1.1 has no
    // VALIDATE_NEGOTIATE: this signature over the preauth-bound key is what
    // shows the client's NEGOTIATE reached the server unaltered, even when
    // the server does not require signing. Checked before the share is
    // looked up, so that an unsigned request learns nothing of which shares
    // exist. The section says to disconnect; refused with ACCESS_DENIED as
    // Samba refuses it, which a client can report.
    let dialect_311 = ctx
        .conn
        .negotiated()
        .is_some_and(|n| n.dialect == nimbus_wire::negotiate::Dialect::Smb311);
    if dialect_311 && can_sign && ctx.signed_by.is_none() && ctx.sealed_by.is_none() {
        tracing::warn!(
            "{}: tree connect to \"{name}\" refused: a 3.1.1 session with keys sent it \
             neither signed nor encrypted",
            ctx.conn.peer
        );
        return Err(NtStatus::ACCESS_DENIED);
    }
    let Some(share) = ctx.server.find_share(name) else {
        tracing::info!(
            "{}: tree connect to unknown share \"{name}\"",
            ctx.conn.peer
        );
        return Err(NtStatus::BAD_NETWORK_NAME);
    };
    // MS-SMB2 3.3.5.7: a share that requires encryption refuses a session
    // that cannot encrypt (SMB 2.x, no common cipher, guest).
    if share.encryption() == EncryptionPolicy::Required && !can_encrypt {
        tracing::warn!(
            "{}: tree connect to \"{}\" refused: the share requires encryption and this \
             session cannot encrypt ({})",
            ctx.conn.peer,
            share.name,
            ctx.conn.why_no_encryption(guest)
        );
        return Err(NtStatus::ACCESS_DENIED);
    }
    let encrypt_data = share.encryption() != EncryptionPolicy::Off && can_encrypt;
    let access_based_enumeration = share.access_based_enumeration();
    if guest && !share.guest_ok && !share.is_ipc() {
        tracing::info!(
            "{}: guest refused on share \"{}\"",
            ctx.conn.peer,
            share.name
        );
        return Err(NtStatus::ACCESS_DENIED);
    }
    let maximal_access = crate::session::share_maximal_access(&share);
    let limit = ctx.server.config().limits.max_trees_per_session;
    if lock(&session.trees).len() >= limit {
        tracing::warn!(
            "{}: tree connect to \"{}\" refused: the session has {limit} tree connects \
             (limits.max_trees_per_session)",
            ctx.conn.peer,
            share.name
        );
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    // MS-SMB2 2.2.10, for 3.x: CONTINUOUS_AVAILABILITY; and on a cluster
    // whose nodes serve the witness service, SCALEOUT and CLUSTER with it,
    // so that a client registers with the witness (CLUSTER has no effect
    // without CA: Windows registers for continuously available shares).
    let smb3 = ctx.conn.negotiated().is_some_and(|n| n.dialect.is_smb3());
    let mut capabilities = 0;
    if smb3 && share.continuous_availability && ctx.server.disk_store.is_some() {
        use nimbus_wire::tree_connect as tc;
        capabilities |= tc::SHARE_CAP_CONTINUOUS_AVAILABILITY;
        if ctx.server.cluster.is_some() && !ctx.server.config().witness_listen.is_empty() {
            capabilities |= tc::SHARE_CAP_SCALEOUT | tc::SHARE_CAP_CLUSTER;
        }
    }
    let id = session.next_tree_id();
    let share_type = if share.is_ipc() {
        ShareType::Pipe
    } else {
        ShareType::Disk
    };
    let mut trees = lock(&session.trees);
    // Taken away by a reload since it was looked up: its trees are being
    // swept (under this lock), and this one would never be.
    if share.is_removed() {
        return Err(NtStatus::BAD_NETWORK_NAME);
    }
    trees.insert(
        id,
        Arc::new(Tree {
            id,
            share,
            encrypt_data,
            connected: std::time::Instant::now(),
        }),
    );
    drop(trees);
    let mut flags = share_flags::MANUAL_CACHING;
    if encrypt_data {
        flags |= share_flags::ENCRYPT_DATA;
    }
    if access_based_enumeration {
        flags |= share_flags::ACCESS_BASED_DIRECTORY_ENUM;
    }
    TreeConnectResponse {
        share_type,
        share_flags: flags,
        capabilities,
        maximal_access,
    }
    .encode(out);
    // The response carries the new tree id in its header.
    ctx.response_tree_id = Some(id);
    Ok(NtStatus::SUCCESS)
}

pub fn handle_disconnect(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    parse_empty(body).map_err(malformed)?;
    let session = ctx.session()?.clone();
    let tree = ctx.tree()?.clone();
    lock(&session.trees).remove(&tree.id);
    lock(&session.pipes).retain(|_, p| p.tree_id != tree.id);
    let opens: Vec<_> = {
        let mut table = lock(&session.opens);
        let ids: Vec<u64> = table
            .values()
            .filter(|o| o.tree_id() == tree.id)
            .map(|o| o.volatile_id())
            .collect();
        ids.iter().filter_map(|id| table.remove(id)).collect()
    };
    for open in opens {
        crate::release::release(ctx.server, &open);
    }
    encode_empty(out);
    Ok(NtStatus::SUCCESS)
}
