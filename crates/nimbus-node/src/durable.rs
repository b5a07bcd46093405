//! Durable handles (MS-SMB2 3.3.5.9.6-12, 3.3.7.1): an open granted
//! durability outlives its connection. When the connection drops, the open
//! stays with its share modes, byte-range locks, oplock or lease and file
//! position, reachable by nobody, until its client reconnects and reclaims
//! it (DHnC / DH2C), or its timeout runs out, or another client's open
//! needs what it holds (a break sent to a disconnected holder closes it
//! instead, as Windows does). LOGOFF, TREE_DISCONNECT and CLOSE close a
//! durable open like any other.
//!
//! This table keeps the disconnected opens and the CreateGuids of every
//! v2 durable open (replay detection, reconnect by CreateGuid); a scavenger
//! task closes what expired.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use crate::open::Open;
use crate::pending::PendingRequest;
use crate::sync::lock;

pub use crate::durable_handle::{Durable, GuidKey, Owner};

/// What a CreateGuid names.
#[derive(Clone)]
pub enum GuidEntry {
    /// The open its CREATE made.
    Open(u64),
    /// Its CREATE waits for breaks (answered STATUS_PENDING): a replay of
    /// it meanwhile gets STATUS_FILE_NOT_AVAILABLE.
    Pending(Weak<PendingRequest>),
}

/// How many disconnected opens may be kept.
#[derive(Clone, Copy, Debug)]
pub struct KeepLimits {
    pub total: usize,
    pub per_user: usize,
}

struct Kept {
    open: Arc<Open>,
    expires: Instant,
    owner: Owner,
}

#[derive(Default)]
struct Inner {
    /// Disconnected opens by open id (FileId.Persistent).
    disconnected: HashMap<u64, Kept>,
    /// Expiry order of the disconnected opens.
    expiries: BTreeSet<(Instant, u64)>,
    per_user: HashMap<Owner, usize>,
    /// Every open made by a CREATE with a DH2Q context (durable or not,
    /// connected or not), and such CREATEs still waiting, by CreateGuid.
    by_guid: HashMap<GuidKey, GuidEntry>,
}

/// Why an open was not kept at its disconnect.
#[derive(Debug, PartialEq, Eq)]
pub enum NotKept {
    NotDurable,
    /// `[limits] max_durable_handles` or `max_durable_handles_per_user`.
    TooMany,
}

pub struct DurableOpens {
    inner: Mutex<Inner>,
    limits: Mutex<KeepLimits>,
    /// Wakes the scavenger when an earlier expiry is added.
    wake: tokio::sync::Notify,
}

impl DurableOpens {
    pub fn new(limits: KeepLimits) -> DurableOpens {
        DurableOpens {
            inner: Mutex::new(Inner::default()),
            limits: Mutex::new(limits),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// What wakes the scavenger (`crate::disconnected::scavenge`): an
    /// earlier expiry was added.
    pub fn woken(&self) -> tokio::sync::futures::Notified<'_> {
        self.wake.notified()
    }

    /// A reloaded configuration's limits, for the next disconnects.
    pub fn set_limits(&self, limits: KeepLimits) {
        *lock(&self.limits) = limits;
    }

    /// `open` was granted durability.
    pub fn granted(&self, open: &Open, durable: Durable) {
        *lock(&open.durable) = Some(durable);
    }

    /// A CREATE with a DH2Q context made `open`: its CreateGuid names it.
    pub fn name_open(&self, open: &Open) {
        if let Some(r) = &open.replay {
            lock(&self.inner)
                .by_guid
                .insert(r.key, GuidEntry::Open(open.open_id));
        }
    }

    /// A CREATE with a DH2Q context waits as `request`.
    pub fn name_pending(&self, key: GuidKey, request: &Arc<PendingRequest>) {
        lock(&self.inner)
            .by_guid
            .insert(key, GuidEntry::Pending(Arc::downgrade(request)));
    }

    /// What `key` names; a waiting CREATE that ended meanwhile (cancelled,
    /// its connection gone) names nothing.
    pub fn by_create_guid(&self, key: GuidKey) -> Option<GuidEntry> {
        let mut inner = lock(&self.inner);
        match inner.by_guid.get(&key)? {
            GuidEntry::Pending(r) if r.upgrade().is_none_or(|r| r.is_done()) => {
                inner.by_guid.remove(&key);
                None
            }
            e => Some(e.clone()),
        }
    }

    /// Keeps `open` after its connection was lost, if it is durable and
    /// the limits allow; otherwise the caller closes it.
    pub fn disconnect(&self, open: &Arc<Open>, now: Instant) -> Result<(), NotKept> {
        let Some(d) = lock(&open.durable).clone() else {
            return Err(NotKept::NotDurable);
        };
        let limits = *lock(&self.limits);
        let mut inner = lock(&self.inner);
        // Its share was taken away by a reload, which purges the share's
        // disconnected opens under this lock after marking it: nothing
        // could reconnect to it.
        if open.share.is_removed() {
            return Err(NotKept::NotDurable);
        }
        let user_count = inner.per_user.get(&d.owner).copied().unwrap_or(0);
        if inner.disconnected.len() >= limits.total || user_count >= limits.per_user {
            drop(inner);
            log_too_many(&d.owner, limits);
            return Err(NotKept::TooMany);
        }
        let expires = now + d.timeout;
        let earliest = inner.expiries.first().map(|(t, _)| *t);
        inner.expiries.insert((expires, open.open_id));
        *inner.per_user.entry(d.owner.clone()).or_default() += 1;
        inner.disconnected.insert(
            open.open_id,
            Kept {
                open: open.clone(),
                expires,
                owner: d.owner,
            },
        );
        drop(inner);
        if earliest.is_none_or(|t| expires < t) {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// The disconnected open `open_id`, left in place (a reconnect checks
    /// it before it `claim`s it).
    pub fn find_disconnected(&self, open_id: u64) -> Option<Arc<Open>> {
        lock(&self.inner)
            .disconnected
            .get(&open_id)
            .map(|k| k.open.clone())
    }

    /// Takes the disconnected open `open_id` out of the table; None when
    /// another reconnect, its expiry or a purge took it first.
    pub fn claim(&self, open_id: u64) -> Option<Arc<Open>> {
        let mut inner = lock(&self.inner);
        let kept = inner.disconnected.remove(&open_id)?;
        inner.forget_kept(open_id, &kept);
        Some(kept.open)
    }

    /// Every open kept disconnected now.
    pub fn all_disconnected(&self) -> Vec<Arc<Open>> {
        lock(&self.inner)
            .disconnected
            .values()
            .map(|k| k.open.clone())
            .collect()
    }

    /// Whether a persistent open of `file` waits for its client to
    /// reclaim it: other clients' conflicting opens are refused meanwhile
    /// (STATUS_FILE_NOT_AVAILABLE) rather than closing it.
    pub fn persistent_waits(&self, file: nimbus_state::FileKey) -> bool {
        lock(&self.inner)
            .disconnected
            .values()
            .any(|k| k.open.file_key == file && k.open.is_persistent())
    }

    /// How many opens are kept disconnected.
    pub fn disconnected_count(&self) -> usize {
        lock(&self.inner).disconnected.len()
    }

    /// An open is closed for good: its CreateGuid is free again.
    pub fn closed(&self, open: &Open) {
        let Some(r) = &open.replay else {
            return;
        };
        let mut inner = lock(&self.inner);
        if matches!(inner.by_guid.get(&r.key), Some(GuidEntry::Open(id)) if *id == open.open_id) {
            inner.by_guid.remove(&r.key);
        }
    }

    /// The disconnected opens whose timeout ran out by `now`.
    pub fn expired(&self, now: Instant) -> Vec<u64> {
        let inner = lock(&self.inner);
        inner
            .expiries
            .iter()
            .take_while(|(t, _)| *t <= now)
            .map(|(_, id)| *id)
            .collect()
    }

    pub fn next_expiry(&self) -> Option<Instant> {
        lock(&self.inner).expiries.first().map(|(t, _)| *t)
    }
}

impl Inner {
    fn forget_kept(&mut self, open_id: u64, kept: &Kept) {
        self.expiries.remove(&(kept.expires, open_id));
        if let Some(n) = self.per_user.get_mut(&kept.owner) {
            *n -= 1;
            if *n == 0 {
                self.per_user.remove(&kept.owner);
            }
        }
    }
}

fn log_too_many(owner: &Owner, limits: KeepLimits) {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, std::sync::atomic::Ordering::Relaxed) != now {
        tracing::warn!(
            "a durable open of {} ({}) was closed at its disconnect: {} are kept server-wide at \
             most ([limits] max_durable_handles) and {} per user (max_durable_handles_per_user)",
            owner.name,
            owner.sid,
            limits.total,
            limits.per_user
        );
    }
}
