//! What the oplock service asks of a node (`oplocks::OplockHost`): what a
//! break to a disconnected durable open does, whether a file holds
//! byte-range locks, the persistent records that follow an open's
//! caching, and, on a cluster node, the way a break reaches another node's
//! open. Built with the server (`crate::start`), which it reaches through
//! a weak reference: the service lives inside the server it asks.

use std::sync::{Arc, Weak};
use std::time::Duration;

use nimbus_state::caching::BreakOrder;
use nimbus_state::FileKey;

use crate::cluster::Membership;
use crate::oplocks::{OplockHost, Oplocks};
use crate::server::Server;

pub struct NodeOplockHost {
    pub server: Weak<Server>,
    /// This node's cluster, if it is one's.
    pub cluster: Option<Arc<Membership>>,
    /// Whether records follow the caching of opens: persistent handles
    /// offered at start, or a cluster node.
    pub follows_caching: bool,
}

impl OplockHost for NodeOplockHost {
    /// A break for a durable open whose client is gone closes that open
    /// (there is nobody to acknowledge it, and the open that caused it
    /// must not wait out the break timeout); a persistent open stays for
    /// its client, its break taken as acknowledged (its write caching
    /// goes).
    fn disconnected_break(&self, open_id: u64, order: BreakOrder) {
        let Some(s) = self.server.upgrade() else {
            return;
        };
        match s.durables.find_disconnected(open_id) {
            Some(open) if open.is_persistent() => {
                s.oplocks.acknowledge_for(open.file_key, open_id, order)
            }
            _ => {
                crate::disconnected::purge(&s, open_id);
            }
        }
    }

    fn has_locks(&self, file: FileKey) -> bool {
        self.server
            .upgrade()
            .is_some_and(|s| s.locks.has_locks(file))
    }

    /// A record follows the caching its open holds: a lease broken from
    /// RH to R must not come back with H after a restart or on another
    /// node.
    fn follows_caching(&self) -> bool {
        self.follows_caching
    }

    fn caching_changed(&self, open_ids: &[u64]) {
        let Some(s) = self.server.upgrade() else {
            return;
        };
        for id in open_ids {
            if let Some(open) = s.opens.get(*id) {
                crate::persist::changed_soon(&s, &open);
            }
        }
    }

    fn later(&self, after: Duration, f: Box<dyn FnOnce(&Oplocks) + Send>) {
        let server = self.server.clone();
        crate::oplocks::after(
            after,
            Box::new(move || {
                if let Some(s) = server.upgrade() {
                    f(&s.oplocks)
                }
            }),
        );
    }

    fn in_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Breaks for other nodes' opens go there as messages; one for an open
    /// no node serves closes it when it is a durable one a leaving node
    /// handed back (`crate::failover`), and is otherwise taken as
    /// acknowledged (a persistent open waiting for its client).
    fn forward(&self, open_id: u64, order: BreakOrder) -> bool {
        let Some(m) = &self.cluster else {
            return false;
        };
        let Some(server) = self.server.upgrade() else {
            return false;
        };
        m.send_break(open_id, &order, server.oplocks.break_timeout())
            || crate::failover::close_handed_back(&server, open_id)
    }

    fn stranded(&self, open_id: u64) -> bool {
        let Some(m) = &self.cluster else {
            return false;
        };
        crate::failover::is_stranded(m, open_id)
            && !self
                .server
                .upgrade()
                .is_some_and(|s| crate::failover::close_handed_back(&s, open_id))
    }
}
