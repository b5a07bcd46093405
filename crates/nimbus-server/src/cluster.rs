//! Cluster membership (`[cluster]`): this node's record in etcd,
//! `nodes/<name>` holding the address clients reach it at, under a lease
//! of `node_ttl_secs` that a task renews every third of it. A node that
//! dies stops renewing, and its record (and, in later steps, everything it
//! owns under the same lease) goes when the lease expires; a node cut off
//! from etcd that finds its lease expired when it comes back registers
//! again without a restart. SIGTERM revokes the lease: the node leaves at
//! once.
//!
//! What is not here yet (issue 15, later steps): the protocol state of
//! opens, share modes, leases and locks in etcd with per-file ownership,
//! and failover of persistent handles.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::{EtcdStore, StateError, StateStore};

use crate::config::ClusterConfig;

/// Every key of a Nimbus cluster starts with this in etcd.
pub const KEY_PREFIX: &[u8] = b"/nimbus/";

/// Key prefix of the membership records.
pub const NODES_PREFIX: &[u8] = b"nodes/";

/// How long one etcd call may take on one endpoint.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);

pub struct Membership {
    pub store: Arc<EtcdStore>,
    pub node: String,
    pub advertise: SocketAddr,
    ttl: Duration,
    /// The lease the membership record lives under (0: none).
    lease: AtomicI64,
}

/// A member as etcd lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    pub advertise: String,
}

fn node_key(node: &str) -> Vec<u8> {
    let mut k = NODES_PREFIX.to_vec();
    k.extend_from_slice(node.as_bytes());
    k
}

impl Membership {
    /// Connects to etcd and registers this node. A record of the same
    /// name that is still alive may be this node's own from before a
    /// crash (its lease not yet expired): it is waited out, up to one
    /// TTL; one that outlives that belongs to a running node, and this
    /// one refuses to start.
    pub fn join(cfg: &ClusterConfig) -> Result<Membership, String> {
        let store = EtcdStore::new(&cfg.etcd, KEY_PREFIX, CALL_TIMEOUT)
            .map_err(|e| format!("[cluster] etcd: {e}"))?;
        store.check().map_err(|e| {
            format!(
                "[cluster] etcd: the cluster does not answer ({e}); start etcd, or fix the \
                 client URLs in [cluster] etcd"
            )
        })?;
        let m = Membership {
            store: Arc::new(store),
            node: cfg.node.clone(),
            advertise: cfg.advertise,
            ttl: Duration::from_secs(cfg.node_ttl_secs as u64),
            lease: AtomicI64::new(0),
        };
        let until = Instant::now() + m.ttl + Duration::from_secs(1);
        loop {
            if m.register()
                .map_err(|e| format!("[cluster]: registering node: {e}"))?
            {
                break;
            }
            if Instant::now() >= until {
                return Err(format!(
                    "[cluster] node: another running node is registered as \"{}\" (its record \
                     outlived node_ttl_secs); give this node a name of its own",
                    m.node
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        tracing::info!(
            "cluster: joined as node \"{}\" (clients reach it at {}), lease {}s",
            m.node,
            m.advertise,
            m.ttl.as_secs()
        );
        Ok(m)
    }

    /// One try: a new lease and the record under it. Ok(false): a live
    /// record of this name exists (the new lease is revoked again).
    fn register(&self) -> Result<bool, StateError> {
        let lease = self.store.grant_lease(self.ttl.as_secs() as i64)?;
        let value = self.advertise.to_string();
        if self
            .store
            .create_with_lease(&node_key(&self.node), value.as_bytes(), lease)?
        {
            self.lease.store(lease, Ordering::SeqCst);
            return Ok(true);
        }
        let _ = self.store.revoke_lease(lease);
        Ok(false)
    }

    /// Renews the lease every third of the TTL, for as long as the server
    /// runs; an expired lease (etcd was out of reach for longer than the
    /// TTL) is replaced by a new registration.
    pub async fn keep_alive(self: Arc<Self>) {
        let period = self.ttl / 3;
        loop {
            tokio::time::sleep(period).await;
            let m = self.clone();
            let renewed = tokio::task::spawn_blocking(move || {
                let lease = m.lease.load(Ordering::SeqCst);
                match m.store.keep_alive(lease) {
                    Ok(true) => Ok(true),
                    Ok(false) => {
                        tracing::warn!(
                            "cluster: node \"{}\"'s lease expired (etcd out of reach for longer \
                             than node_ttl_secs); registering again",
                            m.node
                        );
                        m.register()
                    }
                    Err(e) => Err(e),
                }
            })
            .await;
            match renewed {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => tracing::error!(
                    "cluster: node \"{}\" cannot register again: another node holds its name",
                    self.node
                ),
                Ok(Err(e)) => tracing::warn!("cluster: lease renewal failed: {e}"),
                Err(e) => tracing::error!("cluster: lease renewal task failed: {e}"),
            }
        }
    }

    /// Leaves the cluster (at shutdown): the record goes at once.
    pub fn leave(&self) {
        let lease = self.lease.swap(0, Ordering::SeqCst);
        if lease != 0 {
            match self.store.revoke_lease(lease) {
                Ok(()) => tracing::info!("cluster: node \"{}\" left", self.node),
                Err(e) => tracing::warn!(
                    "cluster: leaving: {e}; the record goes with its lease in {}s",
                    self.ttl.as_secs()
                ),
            }
        }
    }

    /// The live members, by name.
    pub fn members(&self) -> Result<Vec<Member>, StateError> {
        Ok(self
            .store
            .scan_prefix(NODES_PREFIX)?
            .into_iter()
            .map(|(k, v)| Member {
                node: String::from_utf8_lossy(&k[NODES_PREFIX.len()..]).into_owned(),
                advertise: String::from_utf8_lossy(&v.value).into_owned(),
            })
            .collect())
    }
}
