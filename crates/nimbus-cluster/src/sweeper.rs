//! Which node looks for orphaned persistent and durable handles (the
//! records of gone nodes nobody reclaimed, `nimbus_node::failover`).
//!
//! Looking costs two range reads of every handle record in the cluster.
//! Done by every node every few seconds, that read grows with the number
//! of nodes for no gain: one looker finds what all of them would. So one
//! node is elected: the one whose lease holds `sweeper` (its value is the
//! node's name and lease id, so that a node whose put was applied but not
//! answered knows the key for its own at the next look). It goes with its
//! holder's lease, when the holder dies,
//! loses its lease or leaves, and every node watches the key: a deletion
//! has each of them try to take it (one compare-and-set wins). Between
//! changes a node that does not hold it costs etcd nothing but one point
//! read per `LOOK_AGAIN`, in case a change went unseen.
//!
//! Two nodes may both believe they look for a moment (a lease expiring as
//! the next holder reads), and none may for a lease TTL after a holder
//! dies: both are harmless, since taking an orphan is a compare-and-set
//! (`failover::claim`) and an orphan's timeout only starts counting when a
//! looker first sees it.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nimbus_state::etcd_store::{Cmp, Op};
use nimbus_state::StateStore;

use crate::cluster::Membership;

/// The key whose holder looks for orphans.
pub const SWEEPER_KEY: &[u8] = b"sweeper";

/// How often a node that does not look reads the key anyway.
pub const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// This node's part in the election.
pub struct Sweeper {
    /// The lease under which this node holds the key; 0: it does not.
    held_under: AtomicI64,
    /// The key may be free: look at the next round.
    look: AtomicBool,
    last_look: Mutex<Option<Instant>>,
}

impl Default for Sweeper {
    fn default() -> Self {
        Sweeper {
            held_under: AtomicI64::new(0),
            look: AtomicBool::new(true),
            last_look: Mutex::new(None),
        }
    }
}

impl Sweeper {
    /// Starts watching the key (for as long as the process runs): a
    /// change has the next round look at it.
    pub fn follow(self: &Arc<Self>, m: &Arc<Membership>) {
        let (on_change, on_tick) = (Arc::downgrade(self), Arc::downgrade(self));
        m.clone().watch_records(
            "nimbus-sweeper",
            SWEEPER_KEY.to_vec(),
            LOOK_AGAIN,
            move |_| {
                if let Some(s) = on_change.upgrade() {
                    s.look.store(true, Ordering::SeqCst);
                }
            },
            move |_| {
                if let Some(s) = on_tick.upgrade() {
                    s.look.store(true, Ordering::SeqCst);
                }
            },
        );
    }

    /// Whether this node is the one to look for orphans now; takes the
    /// key when it is free. Called once per round of the orphan thread.
    pub fn is_mine(&self, m: &Membership) -> bool {
        let lease = m.lease();
        if lease == 0 || m.is_lost() {
            return false;
        }
        let held = self.held_under.load(Ordering::SeqCst);
        if held == lease && !self.look.load(Ordering::SeqCst) {
            return true;
        }
        let due = crate::sync::lock(&self.last_look).is_none_or(|at| at.elapsed() >= LOOK_AGAIN);
        if !self.look.swap(false, Ordering::SeqCst) && !due {
            return false;
        }
        *crate::sync::lock(&self.last_look) = Some(Instant::now());
        let mine = self.take(m, lease);
        let was = self
            .held_under
            .swap(if mine { lease } else { 0 }, Ordering::SeqCst);
        if mine && was != lease {
            tracing::info!("cluster: this node now looks for orphaned handles");
        } else if !mine && was != 0 {
            tracing::info!("cluster: another node looks for orphaned handles now");
        }
        mine
    }

    /// Reads the key and, when nobody holds it, takes it under `lease`.
    /// Whether this node holds it (under `lease`) afterwards. An etcd
    /// that does not answer: not held, looked at again next round.
    fn take(&self, m: &Membership, lease: i64) -> bool {
        let value = format!("{}/{lease:x}", m.node).into_bytes();
        let value = value.as_slice();
        match m.store.get(SWEEPER_KEY) {
            // This node's under this lease (perhaps taken by a put whose
            // answer was lost), or another holder's: another node's, or
            // this node's under an earlier lease, gone when that ends.
            Ok(Some(v)) => return v.value == value,
            Ok(None) => {}
            Err(e) => {
                tracing::debug!("cluster: who looks for orphans? etcd: {e}");
                self.look.store(true, Ordering::SeqCst);
                return false;
            }
        }
        match m.store.txn(
            &[Cmp::Absent(SWEEPER_KEY)],
            &[Op::Put(SWEEPER_KEY, value, lease)],
            &[],
        ) {
            Ok(outcome) => outcome.succeeded,
            Err(e) => {
                tracing::debug!("cluster: taking the orphan look: {e}");
                self.look.store(true, Ordering::SeqCst);
                false
            }
        }
    }
}
