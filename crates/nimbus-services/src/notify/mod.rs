//! Change notify (MS-SMB2 3.3.5.19; MS-FSA 2.1.5.10 Server Requests Change
//! Notifications for a Directory): watches on open directories, and the
//! changes SMB requests of any session make beneath them.
//!
//! A directory handle gets a watch with its first CHANGE_NOTIFY request.
//! The watch keeps that first request's CompletionFilter, WATCH_TREE flag
//! and OutputBufferLength for its life, as Windows does (smbtorture
//! smb2.notify.mask-change): later requests only collect. Between requests
//! changes are buffered on the watch, so nothing is lost while the client
//! turns a response around; a request that finds buffered changes completes
//! at once. When the buffer would outgrow the first request's length, or the
//! server's total, the watch overflows: the changes are dropped and the next
//! request gets STATUS_NOTIFY_ENUM_DIR, which tells the client to list the
//! directory again. Memory stays bounded whatever a client does.
//!
//! Handlers report what they change (`opened`, `renamed`, `info_set`,
//! `wrote`, the deletion at last close). Writes are reported when their
//! handle closes, as NTFS does, so a file written in a thousand pieces makes
//! one MODIFIED entry. Changes made on the server's disk by anything else
//! come from the VFS's directory watches (inotify), through the same
//! `report`; `disk` says how, and how a change made through SMB, which
//! inotify sees too, is reported once.
//!
//! A watch hears only of names its watcher could list: entries below the
//! watched directory need the right to list each directory on the way,
//! and on a share with access-based enumeration each name must be one a
//! listing shows the watcher (`visible`). A batch of which nothing is left
//! for a watch leaves its request waiting.
//!
//! On a cluster node, changes made through SMB reach the watches of other
//! nodes too, through a `Relay` (`nimbus_cluster::cluster_notify`): this node tells
//! it which directories it watches, and hands it every change its handlers
//! report; the relay hands other nodes' changes back to `deliver_local`.
//! Changes seen on disk stay on the node that saw them (on a shared file
//! system each node's kernel sees its own).
//!
//! One mutex over every watch: a change looks up its directory and that
//! directory's ancestors in a map, and changes are metadata operations, far
//! rarer than reads and writes. Requests are completed after the mutex is
//! released, so the mutex is never held while sending.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use nimbus_state::FileKey;
use nimbus_vfs::{DirWatcher, Subscription};
use nimbus_wire::fscc::{file_class, SetBasicInfo};
use nimbus_wire::notify::{
    completion_filter as cf, encode_change_notify_response, encode_notify_information,
    padded_entry_len, NotifyAction,
};
use nimbus_wire::NtStatus;

use crate::acl::{store, Token};
use crate::open::Open;
use crate::pending::PendingRequest;
use crate::share::Share;
use crate::sync::lock;

mod disk;
mod visible;

use visible::{Descriptors, Known, Viewer};

/// The most bytes of changes one watch buffers, whatever its first request
/// offered (the response must also fit the room dispatch reserves for a
/// response, 64 KiB). Beyond: STATUS_NOTIFY_ENUM_DIR.
pub const MAX_WATCH_BUFFER: usize = 60 * 1024;

/// The most memory the buffered changes of all watches of the server take
/// together (names as on the wire plus each entry's bookkeeping): a client
/// opening thousands of directory handles cannot make the server hold more.
/// A watch that would pass it overflows.
pub const MAX_BUFFERED_TOTAL: usize = 64 * 1024 * 1024;

/// Memory an entry takes beyond its wire bytes (its struct; the name's heap
/// bytes are about its UTF-16 length).
const ENTRY_OVERHEAD: usize = std::mem::size_of::<Entry>();

/// Carries changes between cluster nodes.
pub trait Relay: Send + Sync {
    /// Whether another node is known to watch anything (a directory's
    /// delete-pending is then worth telling). Changes are worked out on a
    /// cluster node whatever it says: a watch another node began a moment
    /// ago may not be known here yet, and hears of them late.
    fn anyone_watches(&self) -> bool;
    /// What this node watches of `dir` on the share at `root` now: None
    /// (nothing any more), or whether some watch covers its whole tree.
    fn watching(&self, root: &Path, dir: &str, tree: Option<bool>);
    /// Changes made through SMB on this node, for other nodes' watches.
    fn publish(&self, root: &Path, changes: &[Change<'_>]);
    /// Directory `dir` (file `key`) of the share at `root` is delete-pending
    /// and still open: other nodes' watches of it end
    /// (`ChangeNotify::end_deleted_watches`).
    fn delete_pending(&self, root: &Path, dir: &str, key: FileKey);
}

/// What a CHANGE_NOTIFY request comes to.
pub enum Answer {
    /// Complete now with this status and these FILE_NOTIFY_INFORMATION bytes.
    Now(NtStatus, Vec<u8>),
    /// Registered as pending: a change, CANCEL or the handle's close ends it.
    Waiting,
}

/// A change to report: what happened to `path` (share-relative,
/// '/'-separated), and the CompletionFilter bits it satisfies.
#[derive(Clone, Copy, Debug)]
pub struct Change<'a> {
    pub action: NotifyAction,
    pub filter: u32,
    pub path: &'a str,
}

/// One buffered FILE_NOTIFY_INFORMATION entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    action: NotifyAction,
    /// Relative to the watched directory, '\'-separated.
    name: String,
}

impl Entry {
    fn wire_len(&self) -> usize {
        padded_entry_len(self.name.encode_utf16().count() * 2)
    }
}

struct Waiter {
    request: Arc<PendingRequest>,
    /// The request's OutputBufferLength.
    max_len: usize,
}

/// MS-FSA's ChangeNotifyEntry of one open directory.
struct Watch {
    root: PathBuf,
    dir: String,
    file_key: FileKey,
    /// Whose watch it is: what it may hear of (`visible`).
    viewer: Viewer,
    filter: u32,
    recursive: bool,
    /// Bytes of entries the watch holds before it overflows.
    capacity: usize,
    entries: Vec<Entry>,
    /// Wire bytes of `entries` (each padded).
    entry_bytes: usize,
    /// Changes were dropped: the next request gets NOTIFY_ENUM_DIR.
    overflowed: bool,
    /// Requests waiting, oldest first. While one waits, `entries` is empty:
    /// a request that finds entries completes at once.
    waiting: VecDeque<Waiter>,
    /// Its directory (or tree) watched on disk.
    disk: Option<Subscription>,
}

#[derive(Default)]
struct Watches {
    by_open: HashMap<u64, Watch>,
    /// Share root, then watched directory, to the open ids watching it.
    by_dir: HashMap<PathBuf, HashMap<String, Vec<u64>>>,
    /// Memory of the entries buffered in all watches (see `Watch::memory`).
    buffered: usize,
}

/// The entries of one delivery for one watch, before they are checked.
struct Matched {
    id: u64,
    viewer: Viewer,
    /// The watched directory, when the entries were made.
    watched: String,
    /// Each entry, the index of its change, and whether it needs checking
    /// (`Viewer::checks`).
    entries: Vec<(Entry, usize, bool)>,
}

impl Matched {
    fn needs_checking(&self) -> bool {
        self.entries.iter().any(|(_, _, check)| *check)
    }

    fn into_entries(self) -> Vec<Entry> {
        self.entries.into_iter().map(|(e, _, _)| e).collect()
    }
}

/// A final response to send once the mutex is released.
struct Completion {
    request: Arc<PendingRequest>,
    status: NtStatus,
    data: Vec<u8>,
}

impl Completion {
    fn send(self) {
        let data = self.data;
        self.request
            .complete(self.status, |out| encode_change_notify_response(out, &data));
    }
}

pub struct ChangeNotify {
    watches: Mutex<Watches>,
    /// How many watches exist; while none does, changes are not looked at.
    watch_count: AtomicUsize,
    /// Opens whose changes are reported when they close (writes, the
    /// attribute change of a renamed file): open id to CompletionFilter bits.
    at_close: RwLock<HashMap<u64, u32>>,
    /// Directories watched on disk, started with the first watch; None
    /// inside when inotify is off or unavailable (SMB changes only).
    disk: OnceLock<Option<DirWatcher>>,
    /// `[limits] max_inotify_watches`.
    max_disk_watches: usize,
    /// On a cluster node: the way to other nodes' watches.
    relay: OnceLock<Arc<dyn Relay>>,
}

fn share_root(share: &Share) -> Option<&Path> {
    share.fs.as_ref().map(|fs| fs.root_path())
}

/// The directory part of a share-relative path ("" for the share root);
/// None for the root itself, which is in no directory of the share.
pub fn parent_of(path: &str) -> Option<&str> {
    (!path.is_empty()).then(|| nimbus_vfs::names::parent(path))
}

/// The directories whose watches may hear of a change to `path`, nearest
/// first, each with whether it is `path`'s own directory (`direct`): its
/// own directory's watch hears it; an ancestor's only when it watches the
/// tree. Up to the share's root.
pub fn covering(path: &str) -> impl Iterator<Item = (&str, bool)> {
    let mut next = parent_of(path);
    let mut direct = true;
    std::iter::from_fn(move || {
        let dir = next?;
        next = parent_of(dir);
        let own = std::mem::replace(&mut direct, false);
        Some((dir, own))
    })
}

/// `path` relative to its ancestor `dir`, in the '\'-separated form of the
/// wire.
fn relative_name(path: &str, dir: &str) -> String {
    let rest = if dir.is_empty() {
        path
    } else {
        path.get(dir.len() + 1..).unwrap_or(path)
    };
    rest.replace('/', "\\")
}

fn name_filter(is_dir: bool) -> u32 {
    if is_dir {
        cf::DIR_NAME
    } else {
        cf::FILE_NAME
    }
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let pairs: Vec<(NotifyAction, &str)> = entries
        .iter()
        .map(|e| (e.action, e.name.as_str()))
        .collect();
    encode_notify_information(&pairs)
}

impl Watch {
    /// What the buffered entries take, as counted against
    /// MAX_BUFFERED_TOTAL.
    fn memory(&self) -> usize {
        self.entry_bytes + self.entries.len() * ENTRY_OVERHEAD
    }
}

impl Watches {
    /// What this node watches of `dir` under `root` (see `Relay::watching`).
    fn watch_state(&self, root: &Path, dir: &str) -> Option<bool> {
        let ids = self.by_dir.get(root)?.get(dir)?;
        let tree = ids
            .iter()
            .any(|id| self.by_open.get(id).is_some_and(|w| w.recursive));
        (!ids.is_empty()).then_some(tree)
    }

    fn remove_from_dir(&mut self, root: &Path, dir: &str, open_id: u64) {
        if let Some(dirs) = self.by_dir.get_mut(root) {
            if let Some(ids) = dirs.get_mut(dir) {
                ids.retain(|&id| id != open_id);
                if ids.is_empty() {
                    dirs.remove(dir);
                }
            }
            if dirs.is_empty() {
                self.by_dir.remove(root);
            }
        }
    }

    /// The entries `changes` on the share at `root` make for each watch
    /// they concern, in the order of the changes: a change's directory's
    /// watches, then (for watches of a whole tree) its ancestors'.
    fn matching(&self, root: &Path, changes: &[Change<'_>]) -> Vec<Matched> {
        let mut matched: Vec<Matched> = Vec::new();
        let Some(dirs) = self.by_dir.get(root) else {
            return matched;
        };
        for (i, change) in changes.iter().enumerate() {
            let Some(parent) = parent_of(change.path) else {
                continue;
            };
            let mut dir = parent;
            let mut direct = true;
            loop {
                for &id in dirs.get(dir).into_iter().flatten() {
                    let Some(watch) = self.by_open.get(&id) else {
                        continue;
                    };
                    if (!direct && !watch.recursive) || watch.filter & change.filter == 0 {
                        continue;
                    }
                    let entry = Entry {
                        action: change.action,
                        name: relative_name(change.path, dir),
                    };
                    let check = watch.viewer.checks(direct);
                    match matched.iter_mut().find(|m| m.id == id) {
                        Some(m) => m.entries.push((entry, i, check)),
                        None => matched.push(Matched {
                            id,
                            viewer: watch.viewer.clone(),
                            watched: watch.dir.clone(),
                            entries: vec![(entry, i, check)],
                        }),
                    }
                }
                match parent_of(dir) {
                    Some(up) => dir = up,
                    None => break,
                }
                direct = false;
            }
        }
        matched
    }

    /// Changes to watch `open_id` were lost: its oldest waiting request,
    /// or else its next one, gets STATUS_NOTIFY_ENUM_DIR.
    fn overflow(&mut self, open_id: u64) -> Option<Completion> {
        let watch = self.by_open.get_mut(&open_id)?;
        if let Some(waiter) = watch.waiting.pop_front() {
            return Some(Completion {
                request: waiter.request,
                status: NtStatus::NOTIFY_ENUM_DIR,
                data: Vec::new(),
            });
        }
        if !watch.overflowed {
            self.buffered -= watch.memory();
            watch.overflowed = true;
            watch.entries = Vec::new();
            watch.entry_bytes = 0;
        }
        None
    }

    /// Hands `new` entries to one watch: to its oldest waiting request, or
    /// into its buffer.
    fn deliver(&mut self, open_id: u64, new: Vec<Entry>) -> Option<Completion> {
        let watch = self.by_open.get_mut(&open_id)?;
        if let Some(waiter) = watch.waiting.pop_front() {
            let data = encode(&new);
            return Some(if data.len() > waiter.max_len {
                Completion {
                    request: waiter.request,
                    status: NtStatus::NOTIFY_ENUM_DIR,
                    data: Vec::new(),
                }
            } else {
                Completion {
                    request: waiter.request,
                    status: NtStatus::SUCCESS,
                    data,
                }
            });
        }
        if watch.overflowed {
            return None;
        }
        for entry in new {
            // The same file modified again adds nothing the client needs.
            if entry.action == NotifyAction::Modified && watch.entries.last() == Some(&entry) {
                continue;
            }
            let len = entry.wire_len();
            if watch.entry_bytes + len > watch.capacity
                || self.buffered + len + ENTRY_OVERHEAD > MAX_BUFFERED_TOTAL
            {
                watch.overflowed = true;
                self.buffered -= watch.memory();
                watch.entry_bytes = 0;
                watch.entries = Vec::new();
                return None;
            }
            watch.entry_bytes += len;
            self.buffered += len + ENTRY_OVERHEAD;
            watch.entries.push(entry);
        }
        None
    }
}

impl ChangeNotify {
    /// `max_disk_watches`: directories watched on disk at most (0: none).
    pub fn new(max_disk_watches: usize) -> ChangeNotify {
        ChangeNotify {
            watches: Mutex::default(),
            watch_count: AtomicUsize::new(0),
            at_close: RwLock::default(),
            disk: OnceLock::new(),
            max_disk_watches,
            relay: OnceLock::new(),
        }
    }

    /// Sets the way to other cluster nodes' watches; once, at start.
    pub fn set_relay(&self, relay: Arc<dyn Relay>) {
        let _ = self.relay.set(relay);
    }

    /// Tells the relay what this node now watches of these directories.
    fn tell_relay(&self, root: &Path, dirs: &[String]) {
        let Some(relay) = self.relay.get() else {
            return;
        };
        let states: Vec<Option<bool>> = {
            let w = self.watches();
            dirs.iter().map(|d| w.watch_state(root, d)).collect()
        };
        for (dir, state) in dirs.iter().zip(states) {
            relay.watching(root, dir, state);
        }
    }

    fn watches(&self) -> std::sync::MutexGuard<'_, Watches> {
        lock(&self.watches)
    }

    /// No watch anywhere could hear of a change: none here, and this node
    /// is no cluster node (on one, a watch another node began a moment ago
    /// may not be known here yet: `Relay::anyone_watches`).
    fn nobody_watches(&self) -> bool {
        self.nobody_here() && self.relay.get().is_none()
    }

    /// No watch is known, here or on another node. A write is only marked
    /// for its close while one is (WRITE is far more frequent than the
    /// changes that name a file), so a watch set up between a write and
    /// its handle's close misses that one change.
    fn nobody_known_to_watch(&self) -> bool {
        self.nobody_here() && self.relay.get().is_none_or(|r| !r.anyone_watches())
    }

    /// No watch on this node.
    fn nobody_here(&self) -> bool {
        self.watch_count.load(Ordering::Acquire) == 0
    }

    /// A CHANGE_NOTIFY request on directory `open` (checked by the
    /// handler): the watch is set up by the first, on disk too; buffered
    /// changes (or an overflow) answer at once; otherwise `wait` makes the
    /// request pending, or says why it cannot wait. `max_len` is the
    /// request's OutputBufferLength; `token` the SIDs of the session
    /// watching. `still_open` says whether the open is still in the
    /// server's table of opens.
    #[allow(clippy::too_many_arguments)]
    pub fn request(
        self: &Arc<Self>,
        still_open: &dyn Fn(u64) -> bool,
        open: &Open,
        token: Arc<Token>,
        filter: u32,
        recursive: bool,
        max_len: usize,
        wait: &mut dyn FnMut() -> Result<Arc<PendingRequest>, NtStatus>,
    ) -> Result<Answer, NtStatus> {
        let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
        let root = fs.root_path();
        let dir = open.path();
        let created = {
            let mut w = self.watches();
            let w = &mut *w;
            match w.by_open.entry(open.open_id) {
                MapEntry::Occupied(_) => false,
                MapEntry::Vacant(e) => {
                    w.by_dir
                        .entry(root.to_path_buf())
                        .or_default()
                        .entry(dir.clone())
                        .or_default()
                        .push(open.open_id);
                    self.watch_count.fetch_add(1, Ordering::AcqRel);
                    e.insert(Watch {
                        root: root.to_path_buf(),
                        dir: dir.clone(),
                        file_key: open.file_key,
                        viewer: Viewer {
                            token,
                            share: open.share.clone(),
                        },
                        filter: filter & cf::ALL,
                        recursive,
                        capacity: max_len.min(MAX_WATCH_BUFFER),
                        entries: Vec::new(),
                        entry_bytes: 0,
                        overflowed: false,
                        waiting: VecDeque::new(),
                        disk: None,
                    });
                    true
                }
            }
        };
        if created {
            // Other nodes learn of the watch before its client hears that
            // its request waits.
            self.tell_relay(root, std::slice::from_ref(&dir));
            // Before the client hears that its request waits: a change it
            // makes on disk after that is seen. Outside the mutex, for a
            // tree is walked.
            self.watch_disk(open.open_id, fs, &dir, recursive);
            // A close that ran since the handler found the open (requests
            // of one connection can run at once: encrypted ones all go to
            // the blocking pool) found no watch to end: the release forgets
            // the open before it ends its watch, so either it ends this
            // one, or it is seen gone here.
            if !still_open(open.open_id) {
                self.end_watch(open.open_id);
                return Ok(Answer::Now(NtStatus::NOTIFY_CLEANUP, Vec::new()));
            }
        }
        let mut w = self.watches();
        let w = &mut *w;
        let Some(watch) = w.by_open.get_mut(&open.open_id) else {
            // Its handle closed meanwhile, as a waiting request would hear.
            return Ok(Answer::Now(NtStatus::NOTIFY_CLEANUP, Vec::new()));
        };
        if watch.overflowed {
            watch.overflowed = false;
            return Ok(Answer::Now(NtStatus::NOTIFY_ENUM_DIR, Vec::new()));
        }
        if !watch.entries.is_empty() {
            w.buffered -= watch.memory();
            let entries = std::mem::take(&mut watch.entries);
            watch.entry_bytes = 0;
            let data = encode(&entries);
            if data.len() > max_len {
                return Ok(Answer::Now(NtStatus::NOTIFY_ENUM_DIR, Vec::new()));
            }
            return Ok(Answer::Now(NtStatus::SUCCESS, data));
        }
        let request = wait()?;
        watch.waiting.push_back(Waiter { request, max_len });
        Ok(Answer::Waiting)
    }

    /// Takes a waiting request off its watch (CANCEL, logoff, disconnect);
    /// whether it was still waiting there (if not, it was answered or is
    /// being answered).
    pub fn withdraw(&self, open_id: u64, async_id: u64) -> bool {
        let mut w = self.watches();
        let Some(watch) = w.by_open.get_mut(&open_id) else {
            return false;
        };
        let before = watch.waiting.len();
        watch.waiting.retain(|r| r.request.async_id() != async_id);
        watch.waiting.len() != before
    }

    /// Reports `changes` made through SMB on the share at `root` to every
    /// watch they concern, on this node and (through the relay) others.
    pub fn report(&self, root: &Path, changes: &[Change<'_>]) {
        self.report_known(root, changes, Vec::new());
    }

    /// [`ChangeNotify::report`], with the descriptors of names the changes
    /// removed as they were (`visible`).
    fn report_known(&self, root: &Path, changes: &[Change<'_>], known: Known) {
        self.deliver_checked(root, changes, known);
        if let Some(relay) = self.relay.get() {
            relay.publish(root, changes);
        }
    }

    /// Reports `changes` on the share at `root` to every watch of this
    /// node they concern, as one batch: a rename's old and new names reach
    /// a watch together.
    pub fn deliver_local(&self, root: &Path, changes: &[Change<'_>]) {
        self.deliver_checked(root, changes, Vec::new());
    }

    /// [`ChangeNotify::deliver_local`]. Under the mutex, the entries for
    /// each watch are worked out, and handed at once to watches none of
    /// whose entries needs checking; the others are checked outside it
    /// (reading descriptors), then handed over what is left.
    fn deliver_checked(&self, root: &Path, changes: &[Change<'_>], known: Known) {
        if self.nobody_here() {
            return;
        }
        let (mut done, to_check) = {
            let mut w = self.watches();
            let matched = w.matching(root, changes);
            let (to_check, now): (Vec<Matched>, Vec<Matched>) =
                matched.into_iter().partition(Matched::needs_checking);
            let done: Vec<Completion> = now
                .into_iter()
                .filter_map(|m| w.deliver(m.id, m.into_entries()))
                .collect();
            (done, to_check)
        };
        if !to_check.is_empty() {
            let mut sds = Descriptors::new(known);
            let checked: Vec<(u64, Vec<Entry>)> = to_check
                .into_iter()
                .map(|m| {
                    let entries = m
                        .entries
                        .into_iter()
                        .filter(|(_, i, check)| {
                            !check
                                || sds.may_see(
                                    &m.viewer,
                                    &m.watched,
                                    changes[*i].path,
                                    visible::object_of(changes, *i),
                                )
                        })
                        .map(|(e, _, _)| e)
                        .collect();
                    (m.id, entries)
                })
                .collect();
            let mut w = self.watches();
            // A watch left with nothing keeps its request waiting: an
            // empty response would mean NOTIFY_ENUM_DIR to the client.
            done.extend(
                checked
                    .into_iter()
                    .filter(|(_, entries)| !entries.is_empty())
                    .filter_map(|(id, entries)| w.deliver(id, entries)),
            );
        }
        for c in done {
            c.send();
        }
    }

    /// CREATE made `path` (`created`), or overwrote or superseded it
    /// (`overwritten`).
    pub fn opened(
        &self,
        share: &Share,
        path: &str,
        is_dir: bool,
        created: bool,
        overwritten: bool,
    ) {
        let Some(root) = share_root(share) else {
            return;
        };
        if created {
            self.report(
                root,
                &[Change {
                    action: NotifyAction::Added,
                    filter: name_filter(is_dir),
                    path,
                }],
            );
        } else if overwritten {
            self.report(
                root,
                &[Change {
                    action: NotifyAction::Modified,
                    filter: cf::SIZE | cf::LAST_WRITE | cf::ATTRIBUTES,
                    path,
                }],
            );
        }
    }

    /// `open` was renamed from `from` to `to` (MS-FSA 2.1.5.15.14: old and
    /// new name within one directory, removed and added across two). Watches
    /// of a renamed directory, or beneath it, follow it. A renamed file's
    /// attributes change too (NTFS sets ARCHIVE), reported when the handle
    /// closes as Windows does (smbtorture smb2.notify.mask-change, .rec).
    pub fn renamed(&self, open: &Open, from: &str, to: &str) {
        if !open.is_dir {
            self.at_close(open.open_id, cf::ATTRIBUTES);
        }
        if self.nobody_watches() {
            return;
        }
        let Some(root) = share_root(&open.share) else {
            return;
        };
        let filter = name_filter(open.is_dir);
        let (old, new) = if parent_of(from) == parent_of(to) {
            (NotifyAction::RenamedOldName, NotifyAction::RenamedNewName)
        } else {
            (NotifyAction::Removed, NotifyAction::Added)
        };
        self.report(
            root,
            &[
                Change {
                    action: old,
                    filter,
                    path: from,
                },
                Change {
                    action: new,
                    filter,
                    path: to,
                },
            ],
        );
        if open.is_dir {
            self.move_watches(root, from, to);
            if let Some(disk) = self.disk_watcher() {
                disk.moved(root, from, to);
            }
        }
    }

    /// Watches of directory `from` and beneath it now watch under `to`.
    fn move_watches(&self, root: &Path, from: &str, to: &str) {
        let dirs = self.move_watches_locked(root, from, to);
        self.tell_relay(root, &dirs);
    }

    /// `move_watches` under the mutex; the directories whose watches moved,
    /// old and new names.
    fn move_watches_locked(&self, root: &Path, from: &str, to: &str) -> Vec<String> {
        let mut w = self.watches();
        let prefix = format!("{from}/");
        let moved: Vec<(u64, String, String)> = w
            .by_open
            .iter()
            .filter(|(_, watch)| watch.root == root)
            .filter_map(|(&id, watch)| {
                let new = if watch.dir == from {
                    to.to_string()
                } else {
                    format!("{to}/{}", watch.dir.strip_prefix(&prefix)?)
                };
                Some((id, watch.dir.clone(), new))
            })
            .collect();
        let mut dirs = Vec::new();
        for (id, old, new) in moved {
            dirs.push(old.clone());
            dirs.push(new.clone());
            w.remove_from_dir(root, &old, id);
            w.by_dir
                .entry(root.to_path_buf())
                .or_default()
                .entry(new.clone())
                .or_default()
                .push(id);
            if let Some(watch) = w.by_open.get_mut(&id) {
                watch.dir = new;
            }
        }
        dirs.sort();
        dirs.dedup();
        dirs
    }

    /// SET_INFO of `class` with `buffer` succeeded on `open` (the rename
    /// classes are reported by `renamed`). FileBasicInformation reports the
    /// fields it set: attributes, write, access and creation times
    /// (MS-FSA 2.1.5.15.1); end of file and allocation report the size.
    pub fn info_set(&self, open: &Open, class: u8, buffer: &[u8]) {
        let filter = match class {
            file_class::BASIC => match SetBasicInfo::parse(buffer) {
                Ok(b) => {
                    let set = |t: u64| t != 0 && t < u64::MAX - 1;
                    let mut f = 0;
                    if b.attributes != 0 {
                        f |= cf::ATTRIBUTES;
                    }
                    if set(b.last_write_time) {
                        f |= cf::LAST_WRITE;
                    }
                    if set(b.last_access_time) {
                        f |= cf::LAST_ACCESS;
                    }
                    if set(b.creation_time) {
                        f |= cf::CREATION;
                    }
                    f
                }
                Err(_) => 0,
            },
            file_class::END_OF_FILE | file_class::ALLOCATION => cf::SIZE | cf::LAST_WRITE,
            file_class::FULL_EA => cf::EA,
            _ => 0,
        };
        if filter != 0 {
            self.modified(open, filter);
        }
    }

    /// Reports a MODIFIED entry for `open`'s file now. Of an open of a
    /// named stream, the size and data written are the stream's (MODIFIED
    /// STREAM, under STREAM_SIZE and STREAM_WRITE, named `file:stream`);
    /// the rest (times, attributes, EAs) its file's.
    pub fn modified(&self, open: &Open, filter: u32) {
        if self.nobody_watches() {
            return;
        }
        let Some(root) = share_root(&open.share) else {
            return;
        };
        let path = open.path();
        let Some(stream) = &open.stream else {
            self.report(
                root,
                &[Change {
                    action: NotifyAction::Modified,
                    filter,
                    path: &path,
                }],
            );
            return;
        };
        let named = format!("{path}:{}", crate::sync::lock(&stream.name));
        let mut changes = Vec::with_capacity(2);
        let mut of_stream = 0;
        if filter & cf::SIZE != 0 {
            of_stream |= cf::STREAM_SIZE;
        }
        if filter & cf::LAST_WRITE != 0 {
            of_stream |= cf::STREAM_WRITE;
        }
        if of_stream != 0 {
            changes.push(Change {
                action: NotifyAction::ModifiedStream,
                filter: of_stream,
                path: &named,
            });
        }
        if filter & !cf::SIZE != 0 {
            changes.push(Change {
                action: NotifyAction::Modified,
                filter: filter & !cf::SIZE,
                path: &path,
            });
        }
        self.report(root, &changes);
    }

    /// The named stream `stream` of the file at `path` was made (`added`)
    /// or removed: ADDED_STREAM or REMOVED_STREAM under STREAM_NAME, named
    /// `file:stream` (MS-FSCC 2.7.1).
    pub fn stream_named(&self, share: &Share, path: &str, stream: &str, added: bool) {
        if self.nobody_watches() {
            return;
        }
        let Some(root) = share_root(share) else {
            return;
        };
        let named = format!("{path}:{stream}");
        let action = if added {
            NotifyAction::AddedStream
        } else {
            NotifyAction::RemovedStream
        };
        self.report(
            root,
            &[Change {
                action,
                filter: cf::STREAM_NAME,
                path: &named,
            }],
        );
    }

    /// WRITE through `open` succeeded: its size and write time are reported
    /// when it closes. While nobody watches, nothing is kept (a watch set
    /// up between the write and the close misses that one change).
    pub fn wrote(&self, open: &Open) {
        if self.nobody_known_to_watch() {
            return;
        }
        self.at_close(open.open_id, cf::SIZE | cf::LAST_WRITE);
    }

    /// Keeps `filter` for `open_id`'s close. Every WRITE comes here while
    /// anyone watches: an open already marked only takes the read lock.
    fn at_close(&self, open_id: u64, filter: u32) {
        let marked = self
            .at_close
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&open_id)
            .is_some_and(|kept| kept & filter == filter);
        if !marked {
            *self
                .at_close
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .entry(open_id)
                .or_default() |= filter;
        }
    }

    /// `open` is closing (CLOSE, TREE_DISCONNECT, LOGOFF, disconnect): the
    /// changes kept for its close are reported, and its watch ends; a
    /// request still waiting on it gets STATUS_NOTIFY_CLEANUP, as from
    /// Windows (smbtorture smb2.notify.close, .tdis1, .logoff).
    pub fn closed(&self, open: &Open) {
        // Most opens kept nothing: only those that did take the write lock.
        let has_kept = self
            .at_close
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&open.open_id);
        let kept = has_kept
            .then(|| {
                self.at_close
                    .write()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&open.open_id)
            })
            .flatten();
        if let Some(filter) = kept {
            self.modified(open, filter);
        }
        if self.nobody_here() {
            return;
        }
        for waiter in self.end_watch(open.open_id) {
            Completion {
                request: waiter.request,
                status: NtStatus::NOTIFY_CLEANUP,
                data: Vec::new(),
            }
            .send();
        }
    }

    /// Removes watch `open_id` (on disk too); its waiting requests.
    fn end_watch(&self, open_id: u64) -> VecDeque<Waiter> {
        let (waiting, sub) = {
            let mut w = self.watches();
            let Some(watch) = w.by_open.remove(&open_id) else {
                return VecDeque::new();
            };
            self.watch_count.fetch_sub(1, Ordering::AcqRel);
            w.buffered -= watch.memory();
            w.remove_from_dir(&watch.root, &watch.dir, open_id);
            (watch.waiting, (watch.disk, watch.root, watch.dir))
        };
        let (sub, root, dir) = sub;
        self.tell_relay(&root, &[dir]);
        if let (Some(sub), Some(disk)) = (sub, self.disk_watcher()) {
            disk.unsubscribe(sub);
        }
        waiting
    }

    /// The last open of `open`'s file closed with the file delete-pending
    /// and the VFS asked to remove it: if its name is gone now (the removal
    /// went ahead, not refused because the name meanwhile named another
    /// file), watches of its directory see it REMOVED.
    pub fn deleted(&self, open: &Open) {
        if self.nobody_watches() {
            return;
        }
        let Some(fs) = open.share.fs.as_ref() else {
            return;
        };
        let path = open.path();
        let gone = match fs.stat(&path) {
            // A file that took the name may have reused the inode too.
            Ok(st) => {
                let k = open.file_key;
                (st.dev, st.ino, st.gen) != (k.dev, k.ino, k.gen)
            }
            Err(_) => true,
        };
        if gone {
            // Its descriptor as it was, for the watches that must check
            // the name itself (`visible`: on a share with access-based
            // enumeration): still readable through the handle.
            let known = if open.stream.is_none() && open.share.access_based_enumeration() {
                let sd = store::read_handle(&open.handle, &path).map_err(|_| ());
                vec![(path.clone(), sd)]
            } else {
                Vec::new()
            };
            self.removed_known(&open.share, &path, open.is_dir, known);
        }
    }

    /// `path` of `share` was removed through SMB: watches of its directory
    /// see it REMOVED.
    pub fn removed(&self, share: &Share, path: &str, is_dir: bool) {
        self.removed_known(share, path, is_dir, Vec::new());
    }

    /// [`ChangeNotify::removed`], with the descriptor the name had.
    fn removed_known(&self, share: &Share, path: &str, is_dir: bool, known: Known) {
        if self.nobody_watches() {
            return;
        }
        let Some(fs) = share.fs.as_ref() else {
            return;
        };
        self.report_known(
            fs.root_path(),
            &[Change {
                action: NotifyAction::Removed,
                filter: name_filter(is_dir),
                path,
            }],
            known,
        );
    }

    /// `open` closed and other opens of its file remain: if it is a
    /// directory now delete-pending, requests waiting on its watches end
    /// with STATUS_DELETE_PENDING (smbtorture smb2.notify.rmdir1-4), as do
    /// later ones (the handler checks).
    /// On a cluster node, the same goes for other nodes' watches: the
    /// relay tells the nodes that watch the directory (smbtorture
    /// smb2.notify.rmdir3/4 with their two connections on two nodes).
    /// `delete_pending` reads the flag from the file's share-mode record
    /// (asked only when a watch could be ended).
    pub fn still_open(&self, delete_pending: &dyn Fn(FileKey) -> bool, open: &Open) {
        let relay = self.relay.get().filter(|r| r.anyone_watches());
        if !open.is_dir || (self.nobody_here() && relay.is_none()) {
            return;
        }
        if !delete_pending(open.file_key) {
            return;
        }
        self.end_deleted_watches(open.file_key);
        if let (Some(relay), Some(root)) = (relay, share_root(&open.share)) {
            let path = lock(&open.path).clone();
            relay.delete_pending(root, &path, open.file_key);
        }
    }

    /// Whether a watch on this node is of file `key`.
    pub fn watches_file(&self, key: FileKey) -> bool {
        !self.nobody_here() && self.watches().by_open.values().any(|w| w.file_key == key)
    }

    /// Requests waiting on watches of directory `key`, delete-pending, end
    /// with STATUS_DELETE_PENDING. The caller has seen the flag in the
    /// file's share-mode record.
    pub fn end_deleted_watches(&self, key: FileKey) {
        if self.nobody_here() {
            return;
        }
        let ended: Vec<Waiter> = {
            let mut w = self.watches();
            w.by_open
                .values_mut()
                .filter(|watch| watch.file_key == key)
                .flat_map(|watch| std::mem::take(&mut watch.waiting))
                .collect()
        };
        for waiter in ended {
            waiter.request.complete(NtStatus::DELETE_PENDING, |_| {});
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_covered_by_its_directory_then_each_ancestor_up_to_the_root() {
        let dirs: Vec<(&str, bool)> = covering("a/b/c.txt").collect();
        assert_eq!(dirs, [("a/b", true), ("a", false), ("", false)]);
        assert_eq!(covering("top.txt").collect::<Vec<_>>(), [("", true)]);
        assert_eq!(covering("").count(), 0);
    }

    #[test]
    fn parents_and_relative_names() {
        assert_eq!(parent_of(""), None);
        assert_eq!(parent_of("a"), Some(""));
        assert_eq!(parent_of("a/b/c"), Some("a/b"));
        assert_eq!(relative_name("a/b/c", "a"), "b\\c");
        assert_eq!(relative_name("a/b/c", ""), "a\\b\\c");
        assert_eq!(relative_name("a/b/c", "a/b"), "c");
    }

    fn watch(capacity: usize) -> Watch {
        Watch {
            root: PathBuf::from("/srv"),
            dir: String::new(),
            file_key: FileKey::new(1, 2, 1),
            viewer: Viewer {
                token: Arc::new(Token::anonymous()),
                share: Arc::new(Share::for_test(None)),
            },
            filter: cf::FILE_NAME,
            recursive: false,
            capacity,
            entries: Vec::new(),
            entry_bytes: 0,
            overflowed: false,
            waiting: VecDeque::new(),
            disk: None,
        }
    }

    fn entry(action: NotifyAction, name: &str) -> Entry {
        Entry {
            action,
            name: name.into(),
        }
    }

    #[test]
    fn buffer_overflows_at_its_capacity_and_frees_its_entries() {
        let mut w = Watches::default();
        // "abcd": 12 + 8 bytes, so three fit in 60 and the fourth overflows.
        w.by_open.insert(1, watch(60));
        for _ in 0..3 {
            assert!(w
                .deliver(1, vec![entry(NotifyAction::Added, "abcd")])
                .is_none());
        }
        assert_eq!(
            (w.buffered, w.by_open[&1].entries.len()),
            (60 + 3 * ENTRY_OVERHEAD, 3)
        );
        w.deliver(1, vec![entry(NotifyAction::Removed, "abcd")]);
        let watch = &w.by_open[&1];
        assert!(watch.overflowed);
        assert!(watch.entries.is_empty());
        assert_eq!((w.buffered, watch.entry_bytes), (0, 0));
        // Overflowed: nothing more is kept.
        w.deliver(1, vec![entry(NotifyAction::Added, "x")]);
        assert_eq!(w.buffered, 0);
    }

    #[test]
    fn repeated_modifications_are_kept_once() {
        let mut w = Watches::default();
        w.by_open.insert(1, watch(1000));
        for _ in 0..5 {
            w.deliver(1, vec![entry(NotifyAction::Modified, "f")]);
        }
        w.deliver(1, vec![entry(NotifyAction::Added, "g")]);
        w.deliver(1, vec![entry(NotifyAction::Added, "g")]);
        assert_eq!(
            w.by_open[&1].entries,
            [
                entry(NotifyAction::Modified, "f"),
                entry(NotifyAction::Added, "g"),
                entry(NotifyAction::Added, "g")
            ]
        );
    }

    #[test]
    fn an_overflow_answers_the_waiter_or_else_drops_the_buffer() {
        let mut w = Watches::default();
        w.by_open.insert(1, watch(1000));
        w.deliver(1, vec![entry(NotifyAction::Added, "abcd")]);
        assert!(w.buffered > 0);
        assert!(w.overflow(1).is_none());
        let watch = &w.by_open[&1];
        assert!(watch.overflowed && watch.entries.is_empty());
        assert_eq!((w.buffered, watch.entry_bytes), (0, 0));
        // Twice is once.
        assert!(w.overflow(1).is_none());
        assert_eq!(w.buffered, 0);
        assert!(w.overflow(2).is_none());
    }

    #[test]
    fn the_servers_total_is_bounded() {
        let mut w = Watches::default();
        w.by_open.insert(1, watch(MAX_WATCH_BUFFER));
        w.buffered = MAX_BUFFERED_TOTAL - 10;
        w.deliver(1, vec![entry(NotifyAction::Added, "abcd")]);
        assert!(w.by_open[&1].overflowed);
        assert_eq!(w.buffered, MAX_BUFFERED_TOTAL - 10);
    }
}
