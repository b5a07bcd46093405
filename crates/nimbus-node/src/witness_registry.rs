//! The witness service's registrations (MS-SWN 3.1.1.1), apart from the
//! service (`crate::witness`) so that `Server` can hold them without the
//! service's imports. On a cluster node each is also kept in etcd
//! (`nimbus_cluster::witness_records`), for `nimbus witness list` and so
//! that moves and drains reach only the nodes holding registrations.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use nimbus_cluster::cluster_registry::Registry;
use nimbus_cluster::witness_records::{self, WitnessRecord};
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
    /// Its place in the order registrations were made (`Witness::issue`):
    /// a read of the membership begun before it was made does not judge it.
    pub(crate) seq: u64,
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
    /// Woken when a registration is made, so that the membership is read
    /// again for it (its node may have gone between its check and now).
    pub(crate) recheck: Arc<Notify>,
    /// Connections to the witness service, and to the endpoint mapper.
    pub(crate) connections: AtomicUsize,
    pub(crate) mapper_connections: AtomicUsize,
    /// On a cluster node: where the registrations are kept in etcd.
    records: OnceLock<Arc<Registry>>,
}

/// Notifications one registration keeps for its client: beyond this the
/// oldest goes (a client that does not ask has heard none of them).
const MAX_PENDING: usize = 16;

fn queue(pending: &mut Vec<Notification>, n: Notification) {
    if pending.len() >= MAX_PENDING {
        pending.remove(0);
    }
    pending.push(n);
}

/// Whether `n` reports the state of `addr` (RESOURCE_CHANGE or IP_CHANGE).
fn about(n: &Notification, addr: IpAddr) -> bool {
    match n {
        Notification::ResourceChange { name, .. } => *name == addr.to_string(),
        Notification::IpChange(a) => a.iter().any(|(x, _)| *x == addr),
        Notification::ClientMove(_) | Notification::ShareMove(_) => false,
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Witness {
    /// A new registration's handle and its `seq`.
    pub(crate) fn issue(&self) -> (Handle, u64) {
        let n = self.next_handle.fetch_add(1, Ordering::SeqCst) + 1;
        let mut h = [0u8; 20];
        h[4..12].copy_from_slice(&n.to_le_bytes());
        h[12..20].copy_from_slice(b"nimbusWT");
        (h, n)
    }

    /// Keeps the registrations in etcd from now on (a cluster node).
    pub fn keep_in(&self, records: Arc<Registry>) {
        if self.records.set(records).is_err() {
            tracing::warn!(
                "witness: the registrations' etcd registry was set twice; kept the first"
            );
        }
    }

    /// Writes registration `h` to etcd (blocking); false if that failed,
    /// and the registration must not stand: nothing else would list it or
    /// send it a move. True on a single node, which keeps none.
    pub(crate) fn record(&self, h: &Handle, r: &Registration, client_name: &str) -> bool {
        let Some(records) = self.records.get() else {
            return true;
        };
        let value = witness_records::encode(&WitnessRecord {
            client: r.client,
            client_name: client_name.to_owned(),
            node: r.node.clone(),
            addr: r.addr,
            share: r.share.clone(),
            ip_notify: r.ip_notify,
            since: nimbus_cluster::witness_move::now(),
        });
        let item = witness_records::item(h);
        if records.set_mine(&item, Some(&value)).is_some() {
            return true;
        }
        // Not put back under a new lease, and gone from etcd should the
        // failed write have been applied after all.
        records.set_mine(&item, None);
        false
    }

    /// Takes registrations `handles` out of etcd (blocking). One that
    /// fails stays listed until the node's lease ends (logged).
    pub(crate) fn forget_records(&self, handles: &[Handle]) {
        if let Some(records) = self.records.get() {
            for h in handles {
                records.set_mine(&witness_records::item(h), None);
            }
        }
    }

    /// The `seq` of the last registration made so far: a read of the
    /// membership begun now judges those up to it.
    pub(crate) fn issued(&self) -> u64 {
        self.next_handle.load(Ordering::SeqCst)
    }

    /// Compares the registrations with the live interfaces: one whose
    /// node left gets RESOURCE_CHANGE (unavailable), once; when the node
    /// is back with that address, RESOURCE_CHANGE (available). One that
    /// asked for IP notifications also gets IP_CHANGE: the address
    /// offline, then online.
    /// `live` was read after registration `upto` was made; later ones are
    /// left to the next read.
    pub(crate) fn note_members(&self, live: &[InterfaceInfo], upto: u64) {
        let mut regs = lock(&self.registrations);
        for r in regs.values_mut().filter(|r| r.seq <= upto) {
            let alive = live
                .iter()
                .any(|i| i.group_name == r.node && i.addr == r.addr);
            if alive == r.gone {
                r.gone = !alive;
                let addr = r.addr;
                // What was not reported yet about this address is out of
                // date: only the newest state is kept.
                r.pending.retain(|n| !about(n, addr));
                queue(
                    &mut r.pending,
                    Notification::ResourceChange {
                        name: addr.to_string(),
                        available: alive,
                    },
                );
                if r.ip_notify {
                    queue(&mut r.pending, Notification::IpChange(vec![(addr, alive)]));
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
            queue(&mut r.pending, Notification::ShareMove(to.to_vec()));
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
            queue(&mut r.pending, Notification::ClientMove(to.to_vec()));
            r.wake.notify_waiters();
            moved += 1;
        }
        moved
    }

    /// Ends the registrations of `association` (its connection closed);
    /// their handles, for `forget_records`.
    pub(crate) fn drop_association(&self, association: u64) -> Vec<Handle> {
        let mut gone = Vec::new();
        lock(&self.registrations).retain(|h, r| {
            if r.association == association {
                r.wake.notify_waiters();
                gone.push(*h);
            }
            r.association != association
        });
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(w: &Witness, addr: IpAddr) -> Handle {
        let (h, seq) = w.issue();
        lock(&w.registrations).insert(
            h,
            Registration {
                association: 1,
                client: IpAddr::from([192, 0, 2, 7]),
                node: "n1".into(),
                addr,
                seq,
                share: None,
                ip_notify: true,
                timeout: 0,
                pending: Vec::new(),
                gone: false,
                wake: Arc::new(Notify::new()),
            },
        );
        h
    }

    fn pending(w: &Witness, h: &Handle) -> Vec<Notification> {
        lock(&w.registrations)[h].pending.clone()
    }

    #[test]
    fn a_read_judges_only_older_registrations_and_keeps_the_newest_state() {
        let w = Witness::default();
        let addr = IpAddr::from([127, 0, 0, 1]);
        let before = w.issued();
        let h = registration(&w, addr);
        // Read before the registration was made: its node's absence there
        // says nothing about it.
        w.note_members(&[], before);
        assert!(pending(&w, &h).is_empty());
        w.note_members(&[], w.issued());
        let gone = Notification::ResourceChange {
            name: addr.to_string(),
            available: false,
        };
        assert_eq!(
            pending(&w, &h),
            vec![gone, Notification::IpChange(vec![(addr, false)])]
        );
        // Back before the client asked: only that is reported.
        let live = [InterfaceInfo {
            group_name: "n1".into(),
            addr,
            available: true,
            witness_if: true,
        }];
        w.note_members(&live, w.issued());
        let back = Notification::ResourceChange {
            name: addr.to_string(),
            available: true,
        };
        assert_eq!(
            pending(&w, &h),
            vec![back, Notification::IpChange(vec![(addr, true)])]
        );
        // Another client's move, or a move of another node's clients, is
        // not this registration's.
        assert_eq!(w.move_client(IpAddr::from([192, 0, 2, 8]), &[addr]), 0);
        assert_eq!(w.move_node_clients("n2", &[addr]), 0);
        assert_eq!(w.move_share("ca", None, &[addr]), 0);
        assert_eq!(pending(&w, &h).len(), 2);
        // A client that never asks keeps the newest MAX_PENDING.
        for i in 0..20u8 {
            w.move_client(IpAddr::from([192, 0, 2, 7]), &[IpAddr::from([10, 0, 0, i])]);
        }
        let kept = pending(&w, &h);
        assert_eq!(kept.len(), MAX_PENDING);
        assert_eq!(
            kept.last(),
            Some(&Notification::ClientMove(vec![IpAddr::from([
                10, 0, 0, 19
            ])]))
        );
    }
}
