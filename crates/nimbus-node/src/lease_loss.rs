//! What a cluster node gives up when it has lost its lease
//! (`crate::cluster`): other nodes may have taken its files and granted
//! over its clients' opens, locks and leases by then, so its clients must
//! not go on believing they hold them. Their connections are dropped, as a
//! crash would drop them, and they reconnect and reclaim their durable and
//! persistent handles through any node, from the records in etcd. The
//! durable opens this node kept for clients already gone are given up too:
//! their records stay in etcd (the node's writes fail there, fenced on the
//! lost lease) and are reclaimed as a gone node's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::server::Server;
use crate::session::Channel;

/// How long the dropped connections may take to end before the node goes
/// on regardless (their requests wait on nothing by then: every etcd call
/// is refused at once).
const DROP_WAIT: Duration = Duration::from_secs(10);

/// Drops every connection with a session and every durable open kept
/// for a client, and waits for them to be released.
pub fn drop_clients(server: &Server) {
    // Its groups of alike opens are joined by reading again: what it
    // remembers of shared files proves nothing now (`nimbus_state::grouped_opens`).
    server.share_modes.grouped().revoke_all();
    let mut conns: Vec<Arc<dyn Channel>> = Vec::new();
    for session in server.sessions.all() {
        for c in session.connections() {
            if !conns
                .iter()
                .any(|k| std::ptr::addr_eq(Arc::as_ptr(k), Arc::as_ptr(&c)))
            {
                conns.push(c);
            }
        }
    }
    for c in &conns {
        c.drop_now();
    }
    let deadline = Instant::now() + DROP_WAIT;
    while conns.iter().any(|c| !c.has_ended()) {
        if Instant::now() >= deadline {
            tracing::warn!(
                "cluster: {} dropped connections still ending after {:?}",
                conns.iter().filter(|c| !c.has_ended()).count(),
                DROP_WAIT
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let kept = server.durables.all_disconnected();
    for open in &kept {
        crate::disconnected::purge(server, open.open_id);
    }
    tracing::warn!(
        "cluster: {} client connections dropped and {} disconnected durable handles given up with \
         the lease; their clients reclaim them through any node",
        conns.len(),
        kept.len()
    );
}
