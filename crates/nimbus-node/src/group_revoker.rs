//! Both ends of a revocation of groups of alike opens
//! (`nimbus_state::grouped_opens`, `nimbus_cluster::group_revoke`): the
//! setter of a file's delete-pending asks the nodes whose groups its
//! record names, and each revokes its groups of the file and answers.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use nimbus_cluster::cluster::{incarnation_of, Membership};
use nimbus_cluster::group_revoke::{encode_answer, encode_request, RevokeGroups};
use nimbus_state::share_modes::Revoker;
use nimbus_state::FileKey;

use crate::server::Server;

/// How long one node is waited for: a node that does not answer is asked
/// again in the setter's next round, until its lease has run out.
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// The `Revoker` of a cluster node: the group entries whose nodes
/// answered, are gone, or are this node's (a group of its own that left
/// its memory is joined no more).
pub fn revoker(m: Arc<Membership>) -> Revoker {
    Arc::new(move |file, ids| {
        let mine = m.incarnation();
        let mut revoked = Vec::new();
        let mut by_node: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for &id in ids {
            let incarnation = incarnation_of(id);
            if incarnation == mine {
                revoked.push(id);
                continue;
            }
            match m.node_of(incarnation) {
                // Its lease ran out: it joins nothing now.
                Ok(None) => revoked.push(id),
                Ok(Some(node)) => by_node.entry(node).or_default().push(id),
                Err(e) => tracing::warn!("cluster: finding the node of a group of opens: {e}"),
            }
        }
        // Every node at once, each with a request of its own (an answer
        // names only its request): a deletion waits for the slowest node,
        // not for the sum of them. A node whose thread could not be made
        // is asked on this one.
        std::thread::scope(|scope| {
            let mut asks = Vec::new();
            for (node, ids) in by_node {
                let m = &m;
                let asking = move || ask_to_revoke(m, file, node, ids);
                match std::thread::Builder::new()
                    .name("revoke-ask".into())
                    .spawn_scoped(scope, asking.clone())
                {
                    Ok(ask) => asks.push(ask),
                    Err(e) => {
                        tracing::warn!("cluster: no thread to ask a node to revoke groups: {e}");
                        revoked.extend(asking());
                    }
                }
            }
            // Joined here, so a thread that panicked does not panic the
            // scope: its node counts as not answered, asked again in the
            // next round.
            for ask in asks {
                revoked.extend(ask.join().unwrap_or_default());
            }
        });
        revoked
    })
}

/// Asks `node` to revoke its groups of `file`: their entries `ids` if it
/// answered in time, else none (it is asked again in the next round).
fn ask_to_revoke(m: &Membership, file: FileKey, node: String, ids: Vec<u64>) -> Vec<u64> {
    let request = |nonce| {
        encode_request(&RevokeGroups {
            nonce,
            file,
            reply_to: m.node.clone(),
        })
    };
    if m.ask_nodes(std::slice::from_ref(&node), request, ANSWER_WAIT) == [1] {
        return ids;
    }
    tracing::warn!(
        "cluster: node {node} did not answer a request to revoke its opens' groups \
         within {}s; asked again",
        ANSWER_WAIT.as_secs()
    );
    Vec::new()
}

/// Another node sets a file delete-pending: this node's groups of it are
/// revoked at once, then the answer goes (from the runtime's blocking
/// pool: it is an etcd write).
pub fn revoke_for_node(server: &Server, req: RevokeGroups) {
    server.share_modes.grouped().revoke(req.file);
    let Some(m) = server.cluster.clone() else {
        return;
    };
    crate::oplocks::on_runtime(Box::new(move || {
        if let Err(e) = m.post(&req.reply_to, &encode_answer(req.nonce)) {
            tracing::warn!(
                "cluster: answering {} about revoked groups: {e}",
                req.reply_to
            );
        }
    }));
}
