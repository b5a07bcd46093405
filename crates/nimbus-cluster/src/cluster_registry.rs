//! What each cluster node is interested in, known to every node without an
//! etcd call: `<prefix><node>/<item>` keys under the registering node's
//! lease (so they go with it), and on every node a copy of the other
//! nodes' keys, filled by a scan and kept by a watch on the prefix
//! (`Membership::watch_records`). Change notify registers the directories
//! its clients watch; oplocks the directories its clients hold leases on.
//!
//! A registration reaches the other nodes' copies within the latency of an
//! etcd watch (milliseconds): a directory lease's node handles what another
//! node does in that moment as if it had come a moment before the
//! registration; change notify sends it late (`on_noticed`,
//! `crate::notify_recent`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use nimbus_state::etcd_store::Op;
use nimbus_state::StateStore;

use crate::cluster::Membership;

/// How often the copy is read whole though the watch keeps it: a safety
/// net. The watch reads it whole itself whenever it (re)starts, so this
/// costs one read per node per period and nothing more.
const RELOAD_EVERY: std::time::Duration = std::time::Duration::from_secs(120);

/// Registrations put back per etcd transaction (etcd allows 128 by
/// default).
const PUT_BACK_BATCH: usize = 64;
/// How many times `settle` writes an item that keeps changing.
const SETTLE_TRIES: usize = 3;

/// Item to node to the value that node registered.
pub type Entries = HashMap<String, HashMap<String, Vec<u8>>>;

/// `<prefix><node>/<item>`.
fn key_of(prefix: &[u8], node: &str, item: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(node.as_bytes());
    k.push(b'/');
    k.extend_from_slice(item.as_bytes());
    k
}

/// (node, item) of a key under `prefix` (node names hold no '/'; items may).
fn parse<'k>(prefix: &[u8], key: &'k [u8]) -> Option<(&'k str, &'k str)> {
    std::str::from_utf8(key.strip_prefix(prefix)?)
        .ok()?
        .split_once('/')
}

/// Told of a registration another node made or changed: (node, item,
/// value).
pub type Noticed = Box<dyn Fn(&str, &str, &[u8]) + Send + Sync>;

pub struct Registry {
    m: Arc<Membership>,
    prefix: &'static [u8],
    /// What the registrations are of, for log lines.
    what: &'static str,
    others: RwLock<Entries>,
    /// How many registrations `others` holds, read without its lock.
    count: AtomicUsize,
    /// This node's registrations, to put back under a new lease.
    mine: Mutex<HashMap<String, Vec<u8>>>,
    /// Called as the copy learns of another node's new or changed
    /// registration (`on_noticed`).
    noticed: std::sync::OnceLock<Noticed>,
}

impl Registry {
    /// A registry under `prefix`; this node's registrations are put back
    /// when it registers again under a new lease.
    pub fn new(m: Arc<Membership>, prefix: &'static [u8], what: &'static str) -> Arc<Registry> {
        let r = Arc::new(Registry {
            m: m.clone(),
            prefix,
            what,
            others: RwLock::new(HashMap::new()),
            count: AtomicUsize::new(0),
            mine: Mutex::new(HashMap::new()),
            noticed: std::sync::OnceLock::new(),
        });
        let weak = Arc::downgrade(&r);
        m.on_new_lease(Box::new(move |_| {
            if let Some(r) = weak.upgrade() {
                r.put_back();
            }
        }));
        r
    }

    /// Puts this node's registrations back (they went with its old lease),
    /// `PUT_BACK_BATCH` to a transaction: this runs before the new lease's
    /// first renewal.
    fn put_back(&self) {
        let mine: Vec<(String, Vec<u8>)> = crate::sync::lock(&self.mine)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let lease = self.m.lease();
        for chunk in mine.chunks(PUT_BACK_BATCH) {
            let keys: Vec<Vec<u8>> = chunk
                .iter()
                .map(|(item, _)| self.key(&self.m.node, item))
                .collect();
            let ops: Vec<Op> = chunk
                .iter()
                .zip(&keys)
                .map(|((_, value), key)| Op::Put(key, value, lease))
                .collect();
            if let Err(e) = self.m.store.txn(&[], &ops, &[]) {
                // One at a time then: a failed batch (too large a
                // request, say) must not cost all of its items.
                tracing::debug!(
                    "cluster: registering {} {} item(s) again at once: {e}",
                    self.what,
                    chunk.len()
                );
                for (op, (item, _)) in ops.iter().zip(chunk) {
                    if let Err(e) = self.m.store.txn(&[], std::slice::from_ref(op), &[]) {
                        tracing::warn!("cluster: registering {} {item} again: {e}", self.what);
                    }
                }
            }
            for ((item, value), key) in chunk.iter().zip(&keys) {
                self.settle(item, value, key, lease);
            }
        }
    }

    /// After `put_back` wrote `value` for `item`: a registration withdrawn
    /// or changed meanwhile (`set_mine`, whose own write may have landed
    /// before the one put back) is written again as it stands now, until
    /// it stands still (a few times at most).
    fn settle(&self, item: &str, value: &[u8], key: &[u8], lease: i64) {
        let mut written = Some(value.to_vec());
        for _ in 0..SETTLE_TRIES {
            let now = crate::sync::lock(&self.mine).get(item).cloned();
            if now == written {
                return;
            }
            let op = match &now {
                Some(v) => Op::Put(key, v, lease),
                None => Op::Delete(key),
            };
            if let Err(e) = self.m.store.txn(&[], &[op], &[]) {
                tracing::warn!("cluster: registering {} {item} again: {e}", self.what);
                return;
            }
            written = now;
        }
    }

    fn key(&self, node: &str, item: &str) -> Vec<u8> {
        key_of(self.prefix, node, item)
    }

    fn parse<'k>(&self, key: &'k [u8]) -> Option<(&'k str, &'k str)> {
        parse(self.prefix, key)
    }

    /// Registers `item` for this node with `value`, or withdraws it (None).
    /// The store's revision after the write, None if it failed (logged).
    pub fn set_mine(&self, item: &str, value: Option<&[u8]>) -> Option<u64> {
        {
            let mut mine = crate::sync::lock(&self.mine);
            match value {
                Some(v) => mine.insert(item.to_owned(), v.to_vec()),
                None => mine.remove(item),
            };
        }
        let key = self.key(&self.m.node, item);
        let op = match value {
            Some(v) => Op::Put(&key, v, self.m.lease()),
            None => Op::Delete(&key),
        };
        match self.m.store.txn(&[], &[op], &[]) {
            Ok(done) => Some(done.revision),
            Err(e) => {
                tracing::warn!("cluster: registering {} {item}: {e}", self.what);
                None
            }
        }
    }

    /// Whether another node registered anything.
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// The other nodes' registrations.
    pub fn others(&self) -> RwLockReadGuard<'_, Entries> {
        self.others.read().unwrap_or_else(|p| p.into_inner())
    }

    fn replace(&self, f: impl FnOnce(&mut Entries)) {
        let mut others = self.others.write().unwrap_or_else(|p| p.into_inner());
        f(&mut others);
        let n = others.values().map(HashMap::len).sum();
        self.count.store(n, Ordering::Release);
    }

    /// Sets what to call as the copy learns of another node's new or
    /// changed registration (once, before `follow`).
    pub fn on_noticed(&self, f: Noticed) {
        let _ = self.noticed.set(f);
    }

    fn notice(&self, node: &str, item: &str, value: &[u8]) {
        if let Some(f) = self.noticed.get() {
            f(node, item, value);
        }
    }

    /// A registration changed in etcd (a watch event, which carries the
    /// value it was given: reading it back would only add to the moment
    /// the copy lags).
    pub fn seen(&self, key: &[u8], value: Option<&[u8]>) {
        let Some((node, item)) = self.parse(key) else {
            return;
        };
        if node == self.m.node {
            return;
        }
        match &value {
            Some(_) => tracing::debug!("cluster: node \"{node}\" registered {} {item}", self.what),
            None => tracing::debug!("cluster: node \"{node}\" withdrew {} {item}", self.what),
        }
        let mut new = false;
        self.replace(|others| match value {
            Some(v) => {
                let held = others.entry(item.to_owned()).or_default();
                new = held.get(node).is_none_or(|old| old.as_slice() != v);
                held.insert(node.to_owned(), v.to_vec());
            }
            None => {
                if let Some(nodes) = others.get_mut(item) {
                    nodes.remove(node);
                    if nodes.is_empty() {
                        others.remove(item);
                    }
                }
            }
        });
        if let (true, Some(v)) = (new, value) {
            self.notice(node, item, v);
        }
    }

    /// Reads every registration again (at start, and when the watch may
    /// have missed changes).
    pub fn reload(&self) {
        let found = match self.m.store.scan_prefix(self.prefix) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!("cluster: reading {} registrations: {e}", self.what);
                return;
            }
        };
        let mut fresh = Entries::new();
        for (key, v) in found {
            if let Some((node, item)) = self.parse(&key) {
                if node != self.m.node {
                    fresh
                        .entry(item.to_owned())
                        .or_default()
                        .insert(node.to_owned(), v.value);
                }
            }
        }
        // What the watch missed, as it would have told it.
        let mut noticed = Vec::new();
        self.replace(|others| {
            for (item, nodes) in &fresh {
                for (node, value) in nodes {
                    let old = others.get(item).and_then(|n| n.get(node));
                    if old.is_none_or(|old| old != value) {
                        noticed.push((node.clone(), item.clone(), value.clone()));
                    }
                }
            }
            *others = fresh;
        });
        for (node, item, value) in noticed {
            // As `seen` says it: a registration made before this node's
            // watch began (or one a watch missed) is learnt here.
            tracing::debug!("cluster: node \"{node}\" registered {} {item}", self.what);
            self.notice(&node, &item, &value);
        }
    }

    /// Keeps the copy for as long as the process runs (a watch thread).
    pub fn follow(self: &Arc<Self>, name: &str) {
        let (a, b) = (self.clone(), self.clone());
        self.m.clone().watch_records(
            name,
            self.prefix.to_vec(),
            RELOAD_EVERY,
            move |e| a.seen(&e.key, e.value.as_deref()),
            move |_| b.reload(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_key_names_its_node_and_item_again() {
        let k = key_of(b"notify/", "n2", "data/a/b c");
        assert_eq!(k, b"notify/n2/data/a/b c");
        assert_eq!(parse(b"notify/", &k), Some(("n2", "data/a/b c")));
        assert_eq!(parse(b"notify/", b"notify/n1/data/"), Some(("n1", "data/")));
        assert_eq!(parse(b"notify/", b"notify/n1"), None);
        assert_eq!(parse(b"dirlease/", &k), None);
    }
}
