//! Change notify across cluster nodes: the `Relay` of a cluster
//! node.
//!
//! **Who watches what.** A node that watches a directory (some handle's
//! CHANGE_NOTIFY) registers `notify/<node>/<share>/<dir>` in etcd
//! (`crate::cluster_registry`), saying whether a watch covers the
//! directory's tree and when the watch began (`encode_registration`); the
//! key goes when its last watch of that directory ends, or with the node.
//! It is written before the client hears that its request waits. Every
//! node keeps a copy of the other nodes' registrations, so that a change
//! costs no etcd call while nobody elsewhere watches its directory.
//!
//! **Changes.** A change made through SMB whose directory (or an ancestor,
//! for a tree watch) another node watches goes to that node as a message
//! (`Membership::post`), one per node and batch, so that a rename's two
//! names arrive together; the receiver hands it to its own watches, which
//! apply their filters. Changes seen on disk are not relayed: on a shared
//! file system each node's kernel sees only its own.
//!
//! **Watches the copy hears of late.** The copy follows etcd through a
//! watch, milliseconds behind it. The changes made here in the last
//! moments are kept (`crate::notify_recent`); when the copy learns of a
//! watch, those made after it began and sent to nobody there go to it.
//!
//! **Not older than the watch.** The sender's copy of the registrations
//! lags the store, so a change made just before a watch here began can
//! still be relayed to it; the receiver drops the changes whose message is
//! older (by the store's revision) than every registration here that
//! covers them (`made_before_watched`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nimbus_state::records::Cursor;
use nimbus_state::{FileKey, StateError};
use nimbus_wire::notify::NotifyAction;

use crate::cluster::Membership;
use crate::cluster_registry::Registry;
use crate::notify::{covering, Change, Relay};
use crate::notify_recent::{now, Recent};

/// Key prefix of the registrations: `notify/<node>/<share>/<dir>`.
pub const NOTIFY_PREFIX: &[u8] = b"notify/";

/// First byte of a change message (a break message starts with 1).
pub const CHANGES_V1: u8 = 0x10;

/// Tag of a message saying that a watched directory became delete-pending
/// while still open (`Relay::delete_pending`). Layout 2 names the
/// directory with its generation; layout 1 (0x11) did not, and a node
/// refuses it as unknown.
pub const DIR_DELETE_PENDING_V2: u8 = 0x12;

pub use crate::notify_recent::OwnedChange;

/// A registration's value: its first byte says whether a watch covers the
/// directory's tree ('1') or not ('0'); the 8 bytes after it (little-endian)
/// when the watch began (`notify_recent::now`), for the changes other nodes
/// made before their copy of the registrations held it (`notify_recent`).
pub fn encode_registration(tree: bool, began: u64) -> Vec<u8> {
    let mut v = vec![if tree { b'1' } else { b'0' }];
    v.extend_from_slice(&began.to_le_bytes());
    v
}

/// Whether a registration's watch covers the tree, and when it began (None:
/// the value does not say).
pub fn decode_registration(value: &[u8]) -> (bool, Option<u64>) {
    let tree = value.first() == Some(&b'1');
    let began = value
        .get(1..)
        .and_then(|rest| <[u8; 8]>::try_from(rest).ok())
        .map(u64::from_le_bytes);
    (tree, began)
}

pub struct NotifyRelay {
    m: Arc<Membership>,
    /// Share roots on this node, and the names all nodes know them by
    /// (a reload changes them: `set_shares`).
    shares: std::sync::RwLock<Vec<(PathBuf, String)>>,
    /// Items `<share>/<dir>`, valued as `encode_registration` says.
    registry: Arc<Registry>,
    /// This node's registrations: since when (the store's revision of the
    /// write that made it), and whether a watch covers the tree.
    since: std::sync::Mutex<HashMap<String, Since>>,
    /// The changes made here lately, for watches the copy learns of late.
    recent: Arc<Recent>,
}

/// When this node began to watch a directory, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Since {
    /// The store's revision of the registration's first write (0 when
    /// that write failed: unknown, so nothing is dropped for it).
    pub revision: u64,
    /// A watch covers the directory's tree.
    pub tree: bool,
}

fn item(share: &str, dir: &str) -> String {
    format!("{share}/{dir}")
}

impl NotifyRelay {
    pub fn new(m: Arc<Membership>, shares: Vec<(PathBuf, String)>) -> NotifyRelay {
        let registry = Registry::new(m.clone(), NOTIFY_PREFIX, "watch of");
        let recent = Arc::new(Recent::default());
        let (to, made) = (m.clone(), recent.clone());
        registry.on_noticed(Box::new(move |node, item, value| {
            send_missed(&to, &made, node, item, value);
        }));
        NotifyRelay {
            registry,
            m,
            since: std::sync::Mutex::default(),
            shares: std::sync::RwLock::new(shares),
            recent,
        }
    }

    /// The shares of a reloaded configuration.
    pub fn set_shares(&self, shares: Vec<(PathBuf, String)>) {
        *self.shares.write().unwrap_or_else(|e| e.into_inner()) = shares;
    }

    fn shares(&self) -> std::sync::RwLockReadGuard<'_, Vec<(PathBuf, String)>> {
        self.shares.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the copy of other nodes' watches (a thread).
    pub fn follow(&self) {
        self.registry.follow("nimbus-notifywatch");
    }

    fn share_of(&self, root: &Path) -> Option<String> {
        self.shares()
            .iter()
            .find(|(r, _)| r == root)
            .map(|(_, n)| n.clone())
    }

    fn root_of(&self, share: &str) -> Option<PathBuf> {
        self.shares()
            .iter()
            .find(|(_, n)| n == share)
            .map(|(r, _)| r.clone())
    }

    /// A change message from another node, written to the store at
    /// `revision`: its share's root and changes, without those made before
    /// this node watched their directory (`made_before_watched`).
    pub fn receive(&self, bytes: &[u8], revision: u64) -> Option<(PathBuf, Vec<OwnedChange>)> {
        match decode_changes(bytes) {
            Ok((share, mut changes)) => {
                {
                    let since = crate::sync::lock(&self.since);
                    changes.retain(|(_, _, path)| {
                        !made_before_watched(&since, &share, path, revision)
                    });
                }
                if changes.is_empty() {
                    return None;
                }
                Some((self.root_of(&share)?, changes))
            }
            Err(e) => {
                tracing::warn!("cluster: change message: {e}");
                None
            }
        }
    }
}

impl Relay for NotifyRelay {
    fn anyone_watches(&self) -> bool {
        self.registry.any()
    }

    fn watching(&self, root: &Path, dir: &str, tree: Option<bool>) {
        if let Some(share) = self.share_of(root) {
            let value = tree.map(|t| encode_registration(t, now()));
            let item = item(&share, dir);
            // Not held across the write: the inbox thread, which also
            // carries breaks, would wait for etcd behind every watch's
            // start and end. A message read in that moment is kept.
            let revision = self.registry.set_mine(&item, value.as_deref());
            let mut since = crate::sync::lock(&self.since);
            match (tree, revision) {
                (None, _) => {
                    since.remove(&item);
                }
                // A directory watched already keeps its first revision:
                // its older watches hear what was made since then.
                (Some(tree), _) if since.contains_key(&item) => {
                    if let Some(s) = since.get_mut(&item) {
                        s.tree = tree;
                    }
                }
                (Some(tree), Some(revision)) => {
                    since.insert(item, Since { revision, tree });
                }
                // Not written (it may be put back later, or have been
                // written after all): its age is unknown, nothing it
                // covers is dropped.
                (Some(tree), None) => {
                    since.insert(item, Since { revision: 0, tree });
                }
            }
        }
    }

    fn publish(&self, root: &Path, changes: &[Change<'_>]) {
        let at = now();
        let Some(share) = self.share_of(root) else {
            return;
        };
        // The changes each other node watches, in order.
        let mut per_node: Vec<(String, Vec<usize>)> = Vec::new();
        {
            // Held until the batch is recorded: a registration the copy
            // learns of meanwhile (`Registry::seen` takes the copy's write
            // lock, then looks for what it missed) finds the batch either
            // sent to its node or recorded as not sent there.
            let others = self.registry.others();
            for (i, c) in changes.iter().enumerate() {
                for (dir, direct) in covering(c.path) {
                    for (node, value) in others.get(&item(&share, dir)).into_iter().flatten() {
                        if !(direct || decode_registration(value).0) {
                            continue;
                        }
                        match per_node.iter_mut().find(|(n, _)| n == node) {
                            Some((_, list)) if list.last() == Some(&i) => {}
                            Some((_, list)) => list.push(i),
                            None => per_node.push((node.clone(), vec![i])),
                        }
                    }
                }
            }
            let owned = changes
                .iter()
                .map(|c| (c.action, c.filter, c.path.to_owned()))
                .collect();
            let sent_to = per_node.iter().map(|(n, _)| n.clone()).collect();
            self.recent.record(at, &share, owned, sent_to);
        }
        for (node, picked) in per_node {
            let batch: Vec<&Change<'_>> = picked.iter().map(|&i| &changes[i]).collect();
            if let Err(e) = self.m.post(&node, &encode_changes(&share, &batch)) {
                tracing::warn!("cluster: changes for node \"{node}\" not sent: {e}");
            }
        }
    }

    fn delete_pending(&self, root: &Path, dir: &str, key: FileKey) {
        let Some(share) = self.share_of(root) else {
            return;
        };
        let nodes: Vec<String> = {
            let others = self.registry.others();
            others
                .get(&item(&share, dir))
                .into_iter()
                .flatten()
                .map(|(node, _)| node.clone())
                .collect()
        };
        for node in nodes {
            if let Err(e) = self.m.post(&node, &encode_delete_pending(key)) {
                tracing::warn!(
                    "cluster: a directory's delete-pending for node \"{node}\" not sent: {e}"
                );
            }
        }
    }
}

/// Another node's registration of `item` (`<share>/<dir>`), new to this
/// node's copy: the changes made here since its watch began, which went
/// to nobody there, go to it now (`notify_recent`).
fn send_missed(m: &Membership, recent: &Recent, node: &str, item: &str, value: &[u8]) {
    let (tree, Some(began)) = decode_registration(value) else {
        return;
    };
    let Some((share, dir)) = item.split_once('/') else {
        return;
    };
    // The batches in order, as few messages as their size allows (this
    // runs on the thread that keeps the copy).
    let missed = recent.missed(node, share, dir, tree, began);
    let mut message: Vec<Change<'_>> = Vec::new();
    let mut bytes = 0;
    let mut batches = missed.iter().peekable();
    while let Some(batch) = batches.next() {
        for (action, filter, path) in batch {
            bytes += 12 + 2 * path.len();
            message.push(Change {
                action: *action,
                filter: *filter,
                path,
            });
        }
        if bytes < LATE_MESSAGE_BYTES && batches.peek().is_some() {
            continue;
        }
        let refs: Vec<&Change<'_>> = message.iter().collect();
        tracing::debug!(
            "cluster: {} change(s) made before node \"{node}\" was known to watch {item}, sent to it late",
            refs.len()
        );
        if let Err(e) = m.post(node, &encode_changes(share, &refs)) {
            tracing::warn!("cluster: changes for node \"{node}\" not sent: {e}");
        }
        message.clear();
        bytes = 0;
    }
}

/// About the most bytes of changes one late message carries (etcd takes
/// values up to 1.5 MiB by default).
const LATE_MESSAGE_BYTES: usize = 256 * 1024;

/// Whether a change to `path` of `share`, whose message the store holds at
/// `revision`, was made before this node watched the directories it is
/// reported in: it then predates every watch here that could hear of it.
///
/// Why this is needed: a node relays a change to the nodes its copy of the
/// registrations names, and that copy lags the store. A directory whose
/// last watch here ended, and whose next watch began a moment later,
/// receives the changes another node made in between: relayed to the old
/// registration, read after the new one. A client that makes a change
/// through one node, then opens a watch through another, would hear of a
/// change made before its watch, which a single server never reports.
/// The sender posts its message after the change is made, and this node
/// writes its registration as its first watch of the directory begins, so
/// a message older than every registration that covers the change was made
/// before any watch here began. What this leaves: a message read between
/// the registration's write and its recording here is kept; a second watch
/// of a directory watched already (or a tree watch added where a direct
/// one was) hears changes made since the first began. Both can only report
/// an older change, never lose a newer one. Changes that match no
/// registration here are kept (the watches filter them, as they filter
/// local changes).
pub fn made_before_watched(
    since: &HashMap<String, Since>,
    share: &str,
    path: &str,
    revision: u64,
) -> bool {
    let mut covered = false;
    for (dir, direct) in covering(path) {
        if let Some(s) = since.get(&item(share, dir)) {
            if direct || s.tree {
                if s.revision <= revision {
                    return false;
                }
                covered = true;
            }
        }
    }
    covered
}

/// The message of `Relay::delete_pending`: the tag and the directory's file
/// key. The receiver reads the flag from the file's share-mode record
/// before it ends any watch, so the message is only a hint.
pub fn encode_delete_pending(key: FileKey) -> Vec<u8> {
    let mut w = vec![DIR_DELETE_PENDING_V2];
    w.extend_from_slice(&key.dev.to_le_bytes());
    w.extend_from_slice(&key.ino.to_le_bytes());
    w.extend_from_slice(&key.gen.to_le_bytes());
    w
}

pub fn decode_delete_pending(bytes: &[u8]) -> Option<FileKey> {
    let rest = bytes.strip_prefix(&[DIR_DELETE_PENDING_V2])?;
    let (dev, rest) = rest.split_first_chunk::<8>()?;
    let (ino, rest) = rest.split_first_chunk::<8>()?;
    let gen: &[u8; 8] = rest.try_into().ok()?;
    Some(FileKey {
        dev: u64::from_le_bytes(*dev),
        ino: u64::from_le_bytes(*ino),
        gen: u64::from_le_bytes(*gen),
    })
}

/// A change message: the tag, the share's name, then each change's action,
/// filter and path (lengths little-endian).
pub fn encode_changes(share: &str, changes: &[&Change<'_>]) -> Vec<u8> {
    let mut w = vec![CHANGES_V1];
    put_str(&mut w, share);
    w.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for c in changes {
        w.extend_from_slice(&(c.action as u32).to_le_bytes());
        w.extend_from_slice(&c.filter.to_le_bytes());
        put_str(&mut w, c.path);
    }
    w
}

fn put_str(w: &mut Vec<u8>, s: &str) {
    w.extend_from_slice(&(s.len() as u32).to_le_bytes());
    w.extend_from_slice(s.as_bytes());
}

fn get_str(r: &mut Cursor<'_>) -> Result<String, StateError> {
    let n = r.u32()? as usize;
    String::from_utf8(r.take(n)?.to_vec()).map_err(|_| StateError::Corrupt("change message name"))
}

pub fn decode_changes(bytes: &[u8]) -> Result<(String, Vec<OwnedChange>), StateError> {
    let mut r = Cursor(bytes);
    if r.u8()? != CHANGES_V1 {
        return Err(StateError::Corrupt("change message layout"));
    }
    let share = get_str(&mut r)?;
    // Each change takes 12 bytes at least.
    let n = r.count(12)?;
    let mut changes = Vec::with_capacity(n);
    for _ in 0..n {
        let action =
            NotifyAction::from_u32(r.u32()?).ok_or(StateError::Corrupt("change message action"))?;
        let filter = r.u32()?;
        changes.push((action, filter, get_str(&mut r)?));
    }
    if !r.0.is_empty() {
        return Err(StateError::Corrupt("change message trailing bytes"));
    }
    Ok((share, changes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterConfig;
    use nimbus_wire::notify::completion_filter::ATTRIBUTES;

    /// Two nodes of one etcd cluster, "r1" and "r2", each with its relay
    /// of share "data" at the same root.
    struct Pair {
        /// Runs until the pair is dropped (after its members left).
        _etcd: nimbus_state::etcd_test_cluster::Cluster,
        root: PathBuf,
        m1: Arc<Membership>,
        m2: Arc<Membership>,
        r1: NotifyRelay,
        r2: NotifyRelay,
    }

    fn pair(name: &str) -> Pair {
        let etcd = nimbus_state::etcd_test_cluster::Cluster::start(name);
        let member = |node: &str| {
            let cfg = ClusterConfig {
                etcd: etcd.urls.clone(),
                node: node.into(),
                advertise: "127.0.0.1:4450".parse().unwrap(),
                node_ttl_secs: 10,
                tls: None,
                user: None,
                group_leases: false,
                secret_file: None,
            };
            Arc::new(Membership::join(&cfg).unwrap())
        };
        let (m1, m2) = (member("r1"), member("r2"));
        let root = etcd.dir.join("share");
        let shares = vec![(root.clone(), "data".to_owned())];
        Pair {
            r1: NotifyRelay::new(m1.clone(), shares.clone()),
            r2: NotifyRelay::new(m2.clone(), shares),
            _etcd: etcd,
            root,
            m1,
            m2,
        }
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            self.m1.leave();
            self.m2.leave();
        }
    }

    fn modified(path: &str) -> Change<'_> {
        Change {
            action: NotifyAction::Modified,
            filter: ATTRIBUTES,
            path,
        }
    }

    /// The paths of the changes waiting in `m`'s box, as `r` takes them.
    fn delivered(m: &Membership, r: &NotifyRelay) -> Vec<String> {
        let mut keys = m.pending_messages();
        keys.sort();
        keys.iter()
            .filter_map(|k| m.take_message(k))
            .filter_map(|msg| r.receive(&msg.value, msg.version))
            .flat_map(|(_, changes)| changes.into_iter().map(|(_, _, p)| p))
            .collect()
    }

    /// The race of smbtorture smb2.notify.basedir across nodes, made
    /// certain: a watch begins on n1 and a change is made on n2 before
    /// n2's copy of the registrations holds the watch (n2 reads its copy
    /// only after the change). When the copy learns of the watch, the
    /// change goes to n1; one made before the watch began, or outside the
    /// watched directory, does not.
    #[test]
    fn a_change_made_before_the_copy_knew_of_a_watch_still_reaches_it() {
        let Pair {
            root, m1, r1, r2, ..
        } = &pair("notify-late");
        r2.registry.reload();

        r2.publish(root, &[modified("base/before")]);
        r1.watching(root, "base", Some(false));
        r2.publish(root, &[modified("base/after"), modified("other/f")]);
        assert!(
            m1.pending_messages().is_empty(),
            "n2's copy knew of the watch already"
        );
        // n2's copy catches up (as its watch, or its resync, would).
        r2.registry.reload();
        assert_eq!(delivered(m1, r1), ["base/after"]);
        // Once known, a change goes at once, and nothing goes twice.
        r2.publish(root, &[modified("base/next")]);
        r2.registry.reload();
        assert_eq!(delivered(m1, r1), ["base/next"]);
    }

    /// The same through n2's etcd watch, as a node runs: whichever way the
    /// race goes (the copy knew of the watch, or learned of it after the
    /// change), the change reaches n1.
    #[test]
    fn a_change_made_as_a_watch_begins_elsewhere_reaches_it_through_the_watch() {
        let Pair {
            root, m1, r1, r2, ..
        } = &pair("notify-race");
        r2.follow();
        for i in 0..5 {
            let dir = format!("d{i}");
            let path = format!("{dir}/f");
            r1.watching(root, &dir, Some(false));
            r2.publish(root, &[modified(&path)]);
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            let mut got = Vec::new();
            while got.is_empty() && std::time::Instant::now() < until {
                got = delivered(m1, r1);
                if got.is_empty() {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            assert_eq!(got, [path]);
        }
    }

    #[test]
    fn a_registration_says_its_tree_and_when_it_began() {
        assert_eq!(
            decode_registration(&encode_registration(true, 7)),
            (true, Some(7))
        );
        assert_eq!(
            decode_registration(&encode_registration(false, 9)),
            (false, Some(9))
        );
        // What a node before began-times wrote, and damage.
        assert_eq!(decode_registration(b"1"), (true, None));
        assert_eq!(decode_registration(b""), (false, None));
        assert_eq!(decode_registration(b"1abc"), (true, None));
    }

    #[test]
    fn a_change_older_than_every_covering_registration_is_dropped() {
        let since: HashMap<String, Since> = [
            (
                "data/d".to_owned(),
                Since {
                    revision: 100,
                    tree: false,
                },
            ),
            (
                "data/".to_owned(),
                Since {
                    revision: 50,
                    tree: false,
                },
            ),
            (
                "data/t".to_owned(),
                Since {
                    revision: 200,
                    tree: true,
                },
            ),
            (
                "data/t/sub".to_owned(),
                Since {
                    revision: 300,
                    tree: false,
                },
            ),
            // A registration whose write failed: its age is unknown.
            (
                "data/u".to_owned(),
                Since {
                    revision: 0,
                    tree: true,
                },
            ),
        ]
        .into_iter()
        .collect();
        let before = |path: &str, revision| made_before_watched(&since, "data", path, revision);
        // A direct watch: made before its registration, or at or after.
        assert!(before("d/f", 99));
        assert!(!before("d/f", 100));
        assert!(!before("d/f", 101));
        // The root's registration is a direct one: it does not cover d/f's
        // subdirectories, nor is a grandchild covered by d's direct watch.
        assert!(!before("d/e/f", 10));
        assert!(!before("f", 50));
        assert!(before("f", 49));
        // A tree watch covers everything beneath; a later direct watch of a
        // subdirectory does not make a change the tree watch hears older.
        assert!(before("t/x/y/z", 199));
        assert!(!before("t/x/y/z", 200));
        assert!(!before("t/sub/f", 250));
        assert!(before("t/sub/f", 150));
        assert!(!before("u/f", 1));
        assert!(!before("u/v/f", 1));
        // Another share, or nothing watched here: kept.
        assert!(!made_before_watched(&since, "other", "d/f", 1));
        assert!(!before("elsewhere/f", 1));
        assert!(!before("", 1));
    }

    #[test]
    fn a_delete_pending_message_reads_back_and_damage_is_refused() {
        let key = FileKey::new(0x803, 99, 0xabc);
        let bytes = encode_delete_pending(key);
        assert_eq!(decode_delete_pending(&bytes), Some(key));
        for cut in 0..bytes.len() {
            assert_eq!(decode_delete_pending(&bytes[..cut]), None);
        }
        let mut longer = bytes;
        longer.push(0);
        assert_eq!(decode_delete_pending(&longer), None);
    }

    #[test]
    fn a_change_message_reads_back_and_damage_is_an_error() {
        let changes = [
            Change {
                action: NotifyAction::RenamedOldName,
                filter: 0x1,
                path: "dir/old name.txt",
            },
            Change {
                action: NotifyAction::RenamedNewName,
                filter: 0x1,
                path: "dir/nouveau-é.txt",
            },
        ];
        let refs: Vec<&Change<'_>> = changes.iter().collect();
        let bytes = encode_changes("data", &refs);
        let (share, got) = decode_changes(&bytes).unwrap();
        assert_eq!(share, "data");
        assert_eq!(
            got,
            vec![
                (
                    NotifyAction::RenamedOldName,
                    1,
                    "dir/old name.txt".to_owned()
                ),
                (
                    NotifyAction::RenamedNewName,
                    1,
                    "dir/nouveau-é.txt".to_owned()
                ),
            ]
        );
        for cut in 0..bytes.len() {
            assert!(decode_changes(&bytes[..cut]).is_err());
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_changes(&longer).is_err());
        // A count far beyond the message allocates nothing for it.
        let mut huge = vec![CHANGES_V1];
        put_str(&mut huge, "data");
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_changes(&huge).is_err());
    }
}
