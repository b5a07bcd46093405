//! The witness service's registrations (MS-SWN 3.1.1.1), apart from the
//! service (`crate::witness`) so that `Server` can hold them without the
//! service's imports.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use nimbus_rpc::witness::{Handle, InterfaceInfo, Notification};
use tokio::sync::Notify;

/// One registration (MS-SWN 3.1.1.1 WitnessRegistration).
pub(crate) struct Registration {
    pub(crate) association: u64,
    /// The client's address, as its witness connection came from: what
    /// `nimbus witness move --client` names.
    pub(crate) client: IpAddr,
    /// The interface registered for: its node and address.
    pub(crate) node: String,
    pub(crate) addr: IpAddr,
    /// The share RegisterEx named, for SHARE_MOVE.
    pub(crate) share: Option<String>,
    /// RegisterEx asked for IP_CHANGE (WITNESS_REGISTER_IP_NOTIFICATION).
    pub(crate) ip_notify: bool,
    /// Seconds an AsyncNotify waits (RegisterEx); 0: no limit.
    pub(crate) timeout: u32,
    /// Notifications not yet reported.
    pub(crate) pending: Vec<Notification>,
    /// The interface was reported gone (and not since back).
    pub(crate) gone: bool,
    pub(crate) wake: Arc<Notify>,
}

/// Every registration this node serves.
#[derive(Default)]
pub struct Witness {
    pub(crate) registrations: Mutex<HashMap<Handle, Registration>>,
    next_handle: AtomicU64,
    pub(crate) next_association: AtomicU64,
    /// Connections to the witness service, and to the endpoint mapper.
    pub(crate) connections: AtomicUsize,
    pub(crate) mapper_connections: AtomicUsize,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Witness {
    pub(crate) fn issue(&self) -> Handle {
        let n = self.next_handle.fetch_add(1, Ordering::Relaxed) + 1;
        let mut h = [0u8; 20];
        h[4..12].copy_from_slice(&n.to_le_bytes());
        h[12..20].copy_from_slice(b"nimbusWT");
        h
    }

    /// Compares the registrations with the live interfaces: one whose
    /// node left gets RESOURCE_CHANGE (unavailable), once; when the node
    /// is back with that address, RESOURCE_CHANGE (available). One that
    /// asked for IP notifications also gets IP_CHANGE: the address
    /// offline, then online.
    pub(crate) fn note_members(&self, live: &[InterfaceInfo]) {
        let mut regs = lock(&self.registrations);
        for r in regs.values_mut() {
            let alive = live
                .iter()
                .any(|i| i.group_name == r.node && i.addr == r.addr);
            if alive == r.gone {
                r.gone = !alive;
                r.pending.push(Notification::ResourceChange {
                    name: r.addr.to_string(),
                    available: alive,
                });
                if r.ip_notify {
                    r.pending
                        .push(Notification::IpChange(vec![(r.addr, alive)]));
                }
                r.wake.notify_waiters();
            }
        }
    }

    /// Registrations held now (`nimbus status`).
    pub fn registration_count(&self) -> usize {
        lock(&self.registrations).len()
    }

    /// `nimbus witness move`: every registration of the client at
    /// `client` gets CLIENT_MOVE to `to`; how many there were.
    pub fn move_client(&self, client: IpAddr, to: &[IpAddr]) -> usize {
        self.move_where(|r| r.client == client, to)
    }

    /// `nimbus witness move --share`: every registration for `share` (of
    /// the client at `client` only, when named) gets SHARE_MOVE to `to`;
    /// how many there were.
    pub fn move_share(&self, share: &str, client: Option<IpAddr>, to: &[IpAddr]) -> usize {
        let mut regs = lock(&self.registrations);
        let mut moved = 0;
        let named = |r: &Registration| {
            r.share
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case(share))
                && client.is_none_or(|c| c == r.client)
        };
        for r in regs.values_mut().filter(|r| named(r)) {
            r.pending.push(Notification::ShareMove(to.to_vec()));
            r.wake.notify_waiters();
            moved += 1;
        }
        moved
    }

    /// `nimbus drain` of `node`: every registration for its interface
    /// gets CLIENT_MOVE to `to`; how many there were.
    pub fn move_node_clients(&self, node: &str, to: &[IpAddr]) -> usize {
        self.move_where(|r| r.node == node, to)
    }

    fn move_where(&self, which: impl Fn(&Registration) -> bool, to: &[IpAddr]) -> usize {
        let mut regs = lock(&self.registrations);
        let mut moved = 0;
        for r in regs.values_mut().filter(|r| which(r)) {
            r.pending.push(Notification::ClientMove(to.to_vec()));
            r.wake.notify_waiters();
            moved += 1;
        }
        moved
    }

    pub(crate) fn drop_association(&self, association: u64) {
        lock(&self.registrations).retain(|_, r| {
            if r.association == association {
                r.wake.notify_waiters();
            }
            r.association != association
        });
    }
}
