//! The opens of each file and the sharing check between them (MS-FSA
//! 2.1.5.1.2, "Open of an Existing File", share access rules), kept in a
//! `StateStore` under one key per file so that opens of different files
//! never touch the same record.

use std::sync::Arc;

use crate::grouped_opens::{GroupedOpens, GROUP_ENTRY};
use crate::records::{self, Record};
use crate::store::{InPlace, StateError, StateStore};

pub use crate::file_key::FileKey;

/// Key prefix of a file's opens and share modes.
pub const OPENS_PREFIX: &[u8] = b"file/";

/// Layout 1 of a share-mode record.
const SHARE_MODES_V1: u8 = 1;

/// One open as far as sharing is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenRecord {
    /// Unique across the server (and, with a cluster, across nodes).
    pub open_id: u64,
    /// Granted access mask (MS-SMB2 2.2.13.1), generic bits already mapped.
    pub access: u32,
    /// ShareAccess the open allowed others (MS-SMB2 2.2.13).
    pub share_access: u32,
}

/// Everything the server shares about one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileRecord {
    pub opens: Vec<OpenRecord>,
    /// Set by delete-on-close or FileDispositionInformation: the file goes
    /// when its last open closes, and new opens are refused meanwhile.
    pub delete_pending: bool,
}

impl Record for FileRecord {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(2 + self.opens.len() * 16);
        v.push(SHARE_MODES_V1);
        v.push(self.delete_pending as u8);
        for o in &self.opens {
            v.extend_from_slice(&o.open_id.to_le_bytes());
            v.extend_from_slice(&o.access.to_le_bytes());
            v.extend_from_slice(&o.share_access.to_le_bytes());
        }
        v
    }

    fn decode(b: &[u8]) -> Result<FileRecord, StateError> {
        let [SHARE_MODES_V1, flag, rest @ ..] = b else {
            return Err(StateError::Corrupt("share-mode record layout"));
        };
        let flag = *flag;
        if rest.len() % 16 != 0 {
            return Err(StateError::Corrupt("file record length"));
        }
        let opens = rest
            .chunks_exact(16)
            .map(|c| {
                let u64_at =
                    |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap_or([0; 8]));
                let u32_at =
                    |i: usize| u32::from_le_bytes(c[i..i + 4].try_into().unwrap_or([0; 4]));
                OpenRecord {
                    open_id: u64_at(0),
                    access: u32_at(8),
                    share_access: u32_at(12),
                }
            })
            .collect();
        Ok(FileRecord {
            opens,
            delete_pending: flag != 0,
        })
    }

    /// A file nobody has open keeps no record (delete-pending ends with
    /// its last open).
    fn is_empty(&self) -> bool {
        self.opens.is_empty()
    }
}

/// How `ShareModes::attribute_open` decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttributeOpen {
    /// Record it as any other open (`add_open`).
    Record,
    /// It may go on without a record: nothing of it is to be recorded,
    /// and its close removes nothing.
    Unrecorded,
}

/// Why an open was refused.
#[derive(Debug)]
pub enum SharingError {
    /// STATUS_SHARING_VIOLATION.
    Violation,
    /// STATUS_DELETE_PENDING.
    DeletePending,
    Store(StateError),
}

impl From<StateError> for SharingError {
    fn from(e: StateError) -> Self {
        SharingError::Store(e)
    }
}

const READ_DATA: u32 = 0x1;
const WRITE_DATA: u32 = 0x2;
const APPEND_DATA: u32 = 0x4;
const EXECUTE: u32 = 0x20;
const DELETE: u32 = 0x1_0000;
const SHARE_READ: u32 = 0x1;
const SHARE_WRITE: u32 = 0x2;
const SHARE_DELETE: u32 = 0x4;
/// Only these rights take part in sharing; an attribute-only open never
/// conflicts (MS-FSA 2.1.5.1.2).
const SHARING_RIGHTS: u32 = READ_DATA | WRITE_DATA | APPEND_DATA | EXECUTE | DELETE;

/// Set in `OpenRecord::share_access` of the entry an open of one of a
/// file's named streams leaves among the opens of the file itself. Such an
/// entry keeps the file while the stream is open (a delete-pending file
/// goes when the last of them closes, and cannot be opened meanwhile), and
/// keeps a DELETE open of the file out unless the stream shares delete
/// (MS-FSA 2.1.5.1.2: a file is deleted with its streams). Nothing else of
/// the file is shared with it: its own opens conflict only among
/// themselves. Record it with `access` 0.
pub const STREAM_OPEN: u32 = 0x8000_0000;

/// Whether an open with `access` and `share` may coexist with `existing`.
pub fn compatible(existing: &OpenRecord, access: u32, share: u32) -> bool {
    if existing.share_access & STREAM_OPEN != 0 {
        return access & DELETE == 0 || existing.share_access & SHARE_DELETE != 0;
    }
    if existing.access & SHARING_RIGHTS == 0 || access & SHARING_RIGHTS == 0 {
        return true;
    }
    let conflict = |acc: u32, allowed: u32| {
        (acc & (READ_DATA | EXECUTE) != 0 && allowed & SHARE_READ == 0)
            || (acc & (WRITE_DATA | APPEND_DATA) != 0 && allowed & SHARE_WRITE == 0)
            || (acc & DELETE != 0 && allowed & SHARE_DELETE == 0)
    };
    !conflict(access, existing.share_access) && !conflict(existing.access, share)
}

/// The rule of `ShareModes::remove_open_unless_last_of_deleted` (for
/// `ShareModes::update_with`): true, and nothing removed, for the last
/// open of a delete-pending file.
pub fn leave_rule(rec: &mut FileRecord, open_id: u64) -> bool {
    // Not an open the record holds (a refused open leaving, or one whose
    // entry went already): not the last open, whatever else is left.
    let named = rec.opens.iter().any(|o| o.open_id == open_id);
    if named && rec.delete_pending && rec.opens.iter().all(|o| o.open_id == open_id) {
        return true;
    }
    rec.opens.retain(|o| o.open_id != open_id);
    false
}

/// Whether an open belongs to a cluster node that is gone (its entries
/// are stale: nobody will close them).
pub type Gone = Arc<dyn Fn(u64) -> bool + Send + Sync>;

/// Asks the nodes of the given group entries (`GROUP_ENTRY`) of a file to
/// revoke their groups of it (`GroupedOpens::revoke`) and waits for their
/// answers: the entries whose nodes answered, or that are gone or this
/// node's own. Blocks for at most a few seconds.
pub type Revoker = Arc<dyn Fn(FileKey, &[u64]) -> Vec<u64> + Send + Sync>;

/// Rounds of `set_delete_pending` at most: each finds groups recorded
/// since the last (a group forms with a client's first open of a kind).
const REVOKE_ROUNDS: usize = 64;

/// Between rounds of `set_delete_pending` in which a node did not answer.
const REVOKE_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// How long `set_delete_pending` asks nodes to revoke their groups before
/// it gives up: a node cut off from etcd neither answers nor joins once
/// its lease is past, and its entries then go with it.
struct Revoking {
    revoke: Revoker,
    give_up_after: std::time::Duration,
}

pub struct ShareModes {
    store: Arc<dyn StateStore>,
    gone: Option<Gone>,
    /// Closed opens whose entries the store did not let go of: removed
    /// again by `retry_releases` (nobody else drops a live node's entries).
    unreleased: std::sync::Mutex<Vec<(FileKey, u64)>>,
    /// This node's alike opens recorded as one entry each.
    grouped: GroupedOpens,
    /// On a cluster: how other nodes' groups are revoked before a file is
    /// set delete-pending.
    revoking: Option<Revoking>,
}

impl ShareModes {
    /// A regular file is about to be made in directory `dir`: a token
    /// when, once made, it may be held with no question to anyone
    /// (`StateStore::before_making`).
    pub fn before_making(&self, dir: FileKey) -> Option<u64> {
        self.store.before_making(&dir.record_key(&[]))
    }

    /// `file` is about to show under another directory
    /// (`StateStore::naming_elsewhere`).
    pub fn naming_elsewhere(&self, file: FileKey) -> Result<(), SharingError> {
        Ok(self.store.naming_elsewhere(&file.record_key(&[]))?)
    }

    /// `file` was made in `dir` under `token` (`StateStore::made`).
    pub fn made(&self, file: FileKey, dir: FileKey, token: u64) -> bool {
        self.store
            .made(&file.record_key(&[]), &dir.record_key(&[]), token)
    }

    pub fn new(store: Arc<dyn StateStore>) -> Self {
        ShareModes {
            store,
            gone: None,
            unreleased: Default::default(),
            grouped: GroupedOpens::default(),
            revoking: None,
        }
    }

    /// Share modes of a cluster node: the entries of gone nodes' opens
    /// leave the record at its next write (`drop_gone`), so an open that
    /// conflicts with one of them is not refused.
    pub fn with_liveness(store: Arc<dyn StateStore>, gone: Gone) -> Self {
        ShareModes {
            gone: Some(gone),
            ..ShareModes::new(store)
        }
    }

    /// How other nodes' groups of alike opens are revoked before a file
    /// is set delete-pending (`set_delete_pending`), asking for at most
    /// `give_up_after` in all.
    pub fn with_revoker(self, revoke: Revoker, give_up_after: std::time::Duration) -> Self {
        ShareModes {
            revoking: Some(Revoking {
                revoke,
                give_up_after,
            }),
            ..self
        }
    }

    /// This node's groups of alike opens (`crate::grouped_opens`).
    pub fn grouped(&self) -> &GroupedOpens {
        &self.grouped
    }

    /// Puts `open` of `file` into its node's group of alike opens
    /// (`crate::grouped_opens`): the entry to check and record for it, the
    /// group's (its id, marked `GROUP_ENTRY`). Recording an entry that is
    /// there already changes nothing (`admit_rule`). The open must leave
    /// its group (`grouped().leave`) however its CREATE ends.
    pub fn join_group(&self, file: FileKey, open: OpenRecord, client: u64) -> OpenRecord {
        let share = open.share_access & !GROUP_ENTRY;
        OpenRecord {
            open_id: self
                .grouped
                .join(file, open.open_id, open.access, share, client),
            access: open.access,
            share_access: share | GROUP_ENTRY,
        }
    }

    /// The entry a closing open leaves in `file`'s records
    /// (`GroupedOpens::entry_to_leave`), at a client's CLOSE: where the
    /// records are in etcd, the last member of a group that has had
    /// members of several clients waits a moment for an alike open to
    /// join it (`GroupedOpens::entry_to_leave_closing`).
    pub fn entry_to_leave_closing(&self, file: FileKey, open_id: u64) -> Option<u64> {
        self.grouped.entry_to_leave_closing(open_id, || {
            match self.store.is_local(&file.record_key(OPENS_PREFIX)) {
                true => std::time::Duration::ZERO,
                false => crate::grouped_opens::REJOIN_WAIT,
            }
        })
    }

    /// A closed open whose entry `remove_open` failed to take out: taken
    /// out by a later `retry_releases`.
    pub fn release_later(&self, key: FileKey, open_id: u64) {
        crate::blocking::lock(&self.unreleased).push((key, open_id));
    }

    /// Takes out again the entries `release_later` was given (each tried
    /// once; those that fail again wait for the next call). The files of
    /// which such an entry was the last open of a delete-pending file:
    /// their deletion is the caller's.
    pub fn retry_releases(&self) -> Vec<FileKey> {
        let pending = std::mem::take(&mut *crate::blocking::lock(&self.unreleased));
        let mut to_delete = Vec::new();
        for (key, open_id) in pending {
            match self.remove_open(key, open_id) {
                Ok(true) => to_delete.push(key),
                Ok(false) => {}
                Err(_) => self.release_later(key, open_id),
            }
        }
        to_delete
    }

    /// Applies `f` to the file's record atomically; `f` may refuse.
    fn update<T>(
        &self,
        key: FileKey,
        f: impl FnMut(&mut FileRecord) -> Result<T, SharingError>,
    ) -> Result<T, SharingError> {
        records::update(&*self.store, &key.record_key(OPENS_PREFIX), f)
    }

    /// Registers a new open after checking it against the existing ones.
    pub fn add_open(&self, key: FileKey, open: OpenRecord) -> Result<(), SharingError> {
        self.update(key, |rec| self.admit_rule(rec, open))
    }

    /// Applies `f` to the file's share-mode record and to another record
    /// of the same file in the same store, in one write
    /// (`records::update_both`: one etcd transaction on a file cluster
    /// nodes share, where an update of each would be two). `f` applies
    /// this module's rules (`admit_rule`, `leave_rule`) with the other
    /// record's, for one open or for several; it may run more than once.
    /// None: the store does not write them together, and nothing was
    /// written (the caller updates each record, as `add_open` does).
    pub fn update_with<R: Record, T>(
        &self,
        key: FileKey,
        other_key: &[u8],
        mut f: impl FnMut(&mut FileRecord, &mut R) -> T,
    ) -> Option<Result<T, SharingError>> {
        self.update_with_trusting(key, other_key, None, |_| false, |rec, r, _| f(rec, r))
            .map(|r| r.map(|(out, _)| out))
    }

    /// `update_with`, where an answer that writes nothing may stand on the
    /// records remembered, unread, where `trust_remembered` says so of it
    /// (`records::update_both_trusting`: the joins of a licensed group,
    /// `crate::grouped_opens`), and how it was decided. `f` also reads the
    /// record under `also`, a third of the file's that it does not change
    /// (`records::update_both_reading`), when one is named.
    pub fn update_with_trusting<R: Record, T>(
        &self,
        key: FileKey,
        other_key: &[u8],
        also: Option<&[u8]>,
        trust_remembered: impl Fn(&T) -> bool,
        mut f: impl FnMut(&mut FileRecord, &mut R, Option<&[u8]>) -> T,
    ) -> Option<Result<(T, records::Decided), SharingError>> {
        let k = key.record_key(OPENS_PREFIX);
        records::update_both_reading::<FileRecord, R, T, SharingError>(
            &*self.store,
            [&k, other_key],
            also,
            trust_remembered,
            |rec, r, read| Ok(f(rec, r, read)),
        )
    }

    /// The sharing rule of `add_open`, applied to the file's record (for
    /// `update_with`). A refusal may still have dropped entries of gone
    /// nodes' opens from it.
    /// An open that joins a group recorded already (`GROUP_ENTRY`) is
    /// checked against that entry too, and leaves the record as it was.
    pub fn admit_rule(&self, rec: &mut FileRecord, open: OpenRecord) -> Result<(), SharingError> {
        let joining = open.share_access & GROUP_ENTRY != 0 && rec.opens.contains(&open);
        // A durable open taken over or a persistent one restored registers
        // again under its old id: it is one of the file's opens already,
        // not a new one, so a deletion set since does not refuse it (its
        // close is what may delete the file).
        let registered_again = !joining && rec.opens.iter().any(|o| o.open_id == open.open_id);
        if !joining {
            rec.opens.retain(|o| o.open_id != open.open_id);
        }
        if self.drop_gone(rec) && rec.opens.is_empty() {
            // Every open of a delete-pending file was a dead node's: the
            // deletion went with it.
            rec.delete_pending = false;
        }
        if rec.delete_pending && !registered_again {
            return Err(SharingError::DeletePending);
        }
        if rec
            .opens
            .iter()
            .any(|o| !compatible(o, open.access, open.share_access))
        {
            return Err(SharingError::Violation);
        }
        if !joining {
            rec.opens.push(open);
        }
        Ok(())
    }

    /// Drops the entries of gone nodes' opens (nobody will close them; an
    /// open waiting for its client to reconnect is not gone). Whenever the
    /// record is written: left in, a dead node's opens would keep a
    /// delete-pending file from going with its last live open, and a file
    /// every node shares would gather one entry per node death. The check
    /// costs no etcd call for a node known gone or seen alive within the
    /// last second. Returns whether any went.
    fn drop_gone(&self, rec: &mut FileRecord) -> bool {
        let Some(gone) = &self.gone else {
            return false;
        };
        let before = rec.opens.len();
        rec.opens.retain(|o| !gone(o.open_id));
        rec.opens.len() < before
    }

    /// The rule of `remove_open_unless_last_of_deleted` (for `update_with`):
    /// `leave_rule`, once gone nodes' opens are dropped.
    pub fn leave_rule(&self, rec: &mut FileRecord, open_id: u64) -> bool {
        self.drop_gone(rec);
        leave_rule(rec, open_id)
    }

    /// Removes an open. Returns true when it was the last one and the file
    /// was delete-pending: the caller must now delete the file.
    pub fn remove_open(&self, key: FileKey, open_id: u64) -> Result<bool, SharingError> {
        self.update(key, |rec| {
            // Only an open the record names can be the file's last (as in
            // `leave_rule`): a record a dead node's opens left empty lost
            // its deletion with them (`admit_rule`).
            let named = rec.opens.iter().any(|o| o.open_id == open_id);
            rec.opens.retain(|o| o.open_id != open_id);
            self.drop_gone(rec);
            let delete_now = named && rec.opens.is_empty() && rec.delete_pending;
            if rec.opens.is_empty() {
                rec.delete_pending = false;
            }
            Ok(delete_now)
        })
    }

    /// `remove_open` for a close that deletes the file itself when it is
    /// the last open of a delete-pending file: then nothing is removed
    /// (returns true), so that an open that comes while the caller unlinks
    /// the file is still told it is delete-pending rather than opening the
    /// file about to go; the caller calls `remove_open` after the unlink.
    /// Otherwise the open is removed (returns false).
    pub fn remove_open_unless_last_of_deleted(
        &self,
        key: FileKey,
        open_id: u64,
    ) -> Result<bool, SharingError> {
        self.update(key, |rec| Ok(self.leave_rule(rec, open_id)))
    }

    /// Sets or clears the file's delete-pending. On a cluster a node's
    /// group of alike opens may be joined without reading the records
    /// (`crate::grouped_opens`), so before the flag is written every live
    /// group the record names is revoked by its node: this node's at once,
    /// another's by request (`with_revoker`). The write refuses itself
    /// while the record names a group not revoked, so a group recorded
    /// meanwhile (a write, which also fails the compare-and-set) is
    /// revoked in the next round.
    pub fn set_delete_pending(&self, key: FileKey, pending: bool) -> Result<(), SharingError> {
        let Some(revoking) = self.revoking.as_ref().filter(|_| pending) else {
            return self.update(key, |rec| {
                rec.delete_pending = pending;
                Ok(())
            });
        };
        let dead = |id: u64| self.gone.as_ref().is_some_and(|gone| gone(id));
        let give_up_at = std::time::Instant::now() + revoking.give_up_after;
        let mut revoked: std::collections::HashSet<u64> = Default::default();
        let mut rounds = 0;
        loop {
            revoked.extend(self.grouped.revoke(key));
            let mut unrevoked = Vec::new();
            let set = self.update(key, |rec| {
                unrevoked.clear();
                unrevoked.extend(
                    rec.opens
                        .iter()
                        .filter(|o| o.share_access & GROUP_ENTRY != 0)
                        .map(|o| o.open_id)
                        .filter(|id| !revoked.contains(id) && !dead(*id)),
                );
                if !unrevoked.is_empty() {
                    // Told apart from a real refusal by `unrevoked`.
                    return Err(SharingError::Violation);
                }
                rec.delete_pending = true;
                Ok(())
            });
            if unrevoked.is_empty() {
                return set;
            }
            // This node's own groups formed meanwhile: the next round's.
            let (own, others): (Vec<u64>, Vec<u64>) =
                unrevoked.iter().partition(|id| self.grouped.is_group(**id));
            if !others.is_empty() {
                let answered = crate::blocking::off_worker(|| (revoking.revoke)(key, &others));
                revoked.extend(answered);
            }
            rounds += 1;
            let unanswered = others.iter().any(|id| !revoked.contains(id));
            if unanswered {
                // A node that could not be asked at all (etcd refused the
                // request) is asked again after a pause, not at once.
                crate::blocking::off_worker(|| std::thread::sleep(REVOKE_PAUSE));
            }
            if (unanswered && std::time::Instant::now() >= give_up_at) || rounds >= REVOKE_ROUNDS {
                return Err(SharingError::Store(StateError::Unavailable(format!(
                    "{} group(s) of opens of the file were not revoked within {}s ({rounds} \
                     rounds)",
                    own.len() + others.len(),
                    revoking.give_up_after.as_secs()
                ))));
            }
        }
    }

    /// How an open with none of the sharing rights (an attribute-only
    /// open: it conflicts with no open and no open conflicts with it) is
    /// decided. Where the file's record is this node's (always on a single
    /// node), or nobody's yet, it is recorded as any open: that costs
    /// nothing, or takes the file for this node once. Where another node
    /// holds the file or several nodes share it, the only rule that could
    /// refuse it is delete-pending, read in place
    /// (`StateStore::read_in_place`): the open then moves no file between
    /// nodes and writes nothing to the shared database, which is what keeps
    /// a file that many nodes' clients look at (Explorer's and Finder's
    /// attribute opens) from being decided through etcd on every open.
    /// What that gives up, on a file another node decides alone: that
    /// node's delete-pending is not seen (etcd's copy may be behind), so
    /// the open goes on, and it does not hold the file back from deletion
    /// when that node's last open closes; its handle keeps working on the
    /// file it opened.
    pub fn attribute_open(&self, key: FileKey) -> Result<AttributeOpen, SharingError> {
        let k = key.record_key(OPENS_PREFIX);
        if self.store.is_local(&k) {
            return Ok(AttributeOpen::Record);
        }
        let found = self.store.read_in_place(&k)?;
        // A file nobody held is this node's now (a read and a transaction,
        // once):
        // its opens here are decided from memory (the common case of a
        // file looked at from one node only).
        if self.store.is_local(&k) {
            return Ok(AttributeOpen::Record);
        }
        let rec = match found {
            InPlace::HeldElsewhere | InPlace::Record(None) => return Ok(AttributeOpen::Unrecorded),
            InPlace::Record(Some(v)) => FileRecord::decode(&v.value)?,
        };
        // Delete-pending set by opens of nodes that are gone went with
        // them (as `add_open` finds).
        let dead = |id: u64| self.gone.as_ref().is_some_and(|gone| gone(id));
        if rec.delete_pending && !rec.opens.iter().all(|o| dead(o.open_id)) {
            return Err(SharingError::DeletePending);
        }
        Ok(AttributeOpen::Unrecorded)
    }

    /// Whether the file is delete-pending, read in place
    /// (`StateStore::read_in_place`): a file another cluster node decides
    /// alone is not asked for, and counts as not delete-pending (what
    /// `attribute_open` gives up). Unknown (the store failed): not.
    pub fn delete_pending_in_place(&self, key: FileKey) -> bool {
        match self.store.read_in_place(&key.record_key(OPENS_PREFIX)) {
            Ok(InPlace::Record(Some(v))) => {
                FileRecord::decode(&v.value).is_ok_and(|r| r.delete_pending)
            }
            _ => false,
        }
    }

    pub fn record(&self, key: FileKey) -> Result<FileRecord, SharingError> {
        Ok(records::read(&*self.store, &key.record_key(OPENS_PREFIX))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    const K: FileKey = FileKey::new(1, 2, 1);

    #[test]
    fn delete_pending_is_set_only_once_every_live_group_the_record_names_is_revoked() {
        use std::sync::Mutex;
        use std::time::Duration;
        // Another node's group entry (900), a gone node's (950), this
        // node's own group (1), and a lone open (7).
        let asked: Arc<Mutex<Vec<Vec<u64>>>> = Default::default();
        let answering = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, on) = (asked.clone(), answering.clone());
        let revoker: Revoker = Arc::new(move |file, ids| {
            assert_eq!(file, K);
            a.lock().unwrap().push(ids.to_vec());
            match on.load(std::sync::atomic::Ordering::SeqCst) {
                true => ids.to_vec(),
                false => Vec::new(),
            }
        });
        let gone: Gone = Arc::new(|id| id == 950);
        let sm = ShareModes::with_liveness(Arc::new(MemoryStore::new()), gone)
            .with_revoker(revoker, Duration::ZERO);
        let member = |id| open(id, READ_DATA, SHARE_READ | GROUP_ENTRY);
        sm.add_open(K, member(900)).unwrap();
        sm.add_open(K, member(950)).unwrap();
        let own = sm.join_group(K, open(1, READ_DATA, SHARE_READ), 1);
        sm.add_open(K, own).unwrap();
        sm.grouped().license(1);
        sm.add_open(K, open(7, READ_DATA, SHARE_READ)).unwrap();
        // Node of 900 does not answer: nothing is set, and the setter says
        // why once its time is up.
        assert!(matches!(
            sm.set_delete_pending(K, true),
            Err(SharingError::Store(_))
        ));
        assert!(!sm.record(K).unwrap().delete_pending);
        assert!(
            !sm.grouped().licensed(1),
            "this node's own group was not revoked"
        );
        // It answers: set. Only the live other node's entry was asked about.
        answering.store(true, std::sync::atomic::Ordering::SeqCst);
        sm.set_delete_pending(K, true).unwrap();
        assert!(sm.record(K).unwrap().delete_pending);
        assert_eq!(*asked.lock().unwrap(), vec![vec![900], vec![900]]);
        // Clearing it asks nobody.
        sm.set_delete_pending(K, false).unwrap();
        assert_eq!(asked.lock().unwrap().len(), 2);
    }

    fn open(id: u64, access: u32, share: u32) -> OpenRecord {
        OpenRecord {
            open_id: id,
            access,
            share_access: share,
        }
    }

    /// A store as a cluster node sees a file it does not hold: records
    /// shared with other nodes, or held by another node (`held`).
    struct NotHere {
        records: MemoryStore,
        held: std::sync::atomic::AtomicBool,
    }

    impl StateStore for NotHere {
        fn get(&self, key: &[u8]) -> Result<Option<crate::Versioned>, StateError> {
            self.records.get(key)
        }
        fn compare_and_set(
            &self,
            key: &[u8],
            expected: Option<u64>,
            value: Option<Vec<u8>>,
        ) -> Result<Option<u64>, StateError> {
            self.records.compare_and_set(key, expected, value)
        }
        fn is_local(&self, _key: &[u8]) -> bool {
            false
        }
        fn scan_prefix(
            &self,
            prefix: &[u8],
        ) -> Result<Vec<(Vec<u8>, crate::Versioned)>, StateError> {
            self.records.scan_prefix(prefix)
        }
        fn read_in_place(&self, key: &[u8]) -> Result<InPlace, StateError> {
            if self.held.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(InPlace::HeldElsewhere);
            }
            self.records.get(key).map(InPlace::Record)
        }
    }

    /// A second record of the file, for the tests: its opens' ids.
    use crate::conformance::Raw as Ids;

    #[test]
    fn opens_and_closes_write_the_share_modes_and_another_record_together_where_shared() {
        const IDS: &[u8] = b"ids/1";
        let ids = |store: &dyn StateStore| records::read::<Ids>(store, IDS).unwrap().0;
        // A node's own store writes nothing together: the caller goes
        // step by step, and nothing was written.
        // An open: its share modes checked, and its id added to the other
        // record if admitted. A close: its id taken out of both, unless it
        // is the last open of a delete-pending file.
        let opening = |sm: &ShareModes, id: u8, access: u32| {
            sm.update_with(K, IDS, |rec, ids: &mut Ids| {
                sm.admit_rule(rec, open(id as u64, access, SHARE_READ))?;
                ids.0.push(id);
                Ok::<(), SharingError>(())
            })
        };
        let closing = |sm: &ShareModes, id: u8| {
            sm.update_with(K, IDS, |rec, ids: &mut Ids| {
                let last_of_deleted = leave_rule(rec, id as u64);
                if !last_of_deleted {
                    ids.0.retain(|i| *i != id);
                }
                last_of_deleted
            })
        };
        // A node's own store writes nothing together: the caller goes
        // step by step, and nothing was written.
        let store = Arc::new(MemoryStore::new());
        let sm = ShareModes::new(store.clone());
        assert!(opening(&sm, 1, READ_DATA).is_none());
        assert!(sm.record(K).unwrap().opens.is_empty());
        assert!(ids(&*store).is_empty());

        let store = Arc::new(crate::conformance::SharedMemory::default());
        let writes = || store.writes();
        let sm = ShareModes::new(store.clone());
        // Admitted: both records in one write.
        opening(&sm, 1, READ_DATA).unwrap().unwrap().unwrap();
        opening(&sm, 2, READ_DATA).unwrap().unwrap().unwrap();
        assert_eq!(writes(), 2);
        assert_eq!(ids(&*store), vec![1, 2]);
        // Refused: neither record changes, nothing is written.
        assert!(matches!(
            opening(&sm, 3, WRITE_DATA),
            Some(Ok(Err(SharingError::Violation)))
        ));
        assert_eq!(writes(), 2);
        assert_eq!(sm.record(K).unwrap().opens.len(), 2);
        assert_eq!(ids(&*store), vec![1, 2]);

        // A close leaves both in one write.
        assert!(!closing(&sm, 1).unwrap().unwrap());
        assert_eq!(writes(), 3);
        assert_eq!(ids(&*store), vec![2]);
        // The last open of a delete-pending file: nothing written (its
        // close deletes the file first).
        sm.set_delete_pending(K, true).unwrap();
        let before = writes();
        assert!(closing(&sm, 2).unwrap().unwrap());
        assert_eq!(writes(), before);
        assert_eq!(
            sm.record(K).unwrap().opens,
            vec![open(2, READ_DATA, SHARE_READ)]
        );
        assert_eq!(ids(&*store), vec![2]);
    }

    #[test]
    fn an_attribute_open_is_recorded_where_the_record_is_here_and_else_checked_in_place() {
        // A node's own store: recorded as any open.
        let sm = ShareModes::new(Arc::new(MemoryStore::new()));
        assert_eq!(sm.attribute_open(K).unwrap(), AttributeOpen::Record);

        let store = Arc::new(NotHere {
            records: MemoryStore::new(),
            held: false.into(),
        });
        // Node 7's opens belong to a node that is gone.
        let sm = ShareModes::with_liveness(store.clone(), Arc::new(|id| id == 7));
        // No record, on a file this node does not hold: unrecorded.
        assert_eq!(sm.attribute_open(K).unwrap(), AttributeOpen::Unrecorded);
        // Others' opens, exclusive ones too: it goes on unrecorded (it
        // conflicts with nothing).
        sm.add_open(K, open(1, READ_DATA | WRITE_DATA | DELETE, 0))
            .unwrap();
        assert_eq!(sm.attribute_open(K).unwrap(), AttributeOpen::Unrecorded);
        // Delete-pending refuses it, as it refuses any open.
        sm.set_delete_pending(K, true).unwrap();
        assert!(matches!(
            sm.attribute_open(K),
            Err(SharingError::DeletePending)
        ));
        // ... unless the file is decided by another node, whose
        // delete-pending is not known here (the documented give).
        store.held.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(sm.attribute_open(K).unwrap(), AttributeOpen::Unrecorded);
        store.held.store(false, std::sync::atomic::Ordering::SeqCst);
        // Delete-pending left only by a dead node's opens no longer counts.
        sm.remove_open(K, 1).unwrap();
        sm.add_open(K, open(7, DELETE, 0x7)).unwrap();
        sm.set_delete_pending(K, true).unwrap();
        assert_eq!(sm.attribute_open(K).unwrap(), AttributeOpen::Unrecorded);
        // Nothing was recorded by any of it.
        assert_eq!(sm.record(K).unwrap().opens, vec![open(7, DELETE, 0x7)]);
    }

    #[test]
    fn a_stream_open_keeps_out_only_a_delete_it_does_not_share() {
        let sm = ShareModes::new(Arc::new(MemoryStore::new()));
        // A stream opened with no sharing at all, and one sharing delete.
        sm.add_open(K, open(1, 0, STREAM_OPEN)).unwrap();
        assert!(sm.add_open(K, open(2, WRITE_DATA | READ_DATA, 0x7)).is_ok());
        assert!(matches!(
            sm.add_open(K, open(3, DELETE, SHARE_DELETE)),
            Err(SharingError::Violation)
        ));
        sm.remove_open(K, 1).unwrap();
        sm.add_open(K, open(4, 0, STREAM_OPEN | SHARE_DELETE))
            .unwrap();
        assert!(sm.add_open(K, open(5, DELETE, 0x7)).is_ok());
        // The file is deleted when the stream, its last open, goes.
        sm.set_delete_pending(K, true).unwrap();
        assert!(!sm.remove_open(K, 2).unwrap());
        assert!(!sm.remove_open(K, 5).unwrap());
        assert!(matches!(
            sm.add_open(K, open(6, 0, STREAM_OPEN)),
            Err(SharingError::DeletePending)
        ));
        assert!(sm.remove_open(K, 4).unwrap());
    }

    #[test]
    fn sharing_rules() {
        let sm = ShareModes::new(Arc::new(MemoryStore::new()));
        sm.add_open(K, open(1, READ_DATA, SHARE_READ)).unwrap();
        // A writer is refused: the first open did not share write.
        assert!(matches!(
            sm.add_open(K, open(2, WRITE_DATA, 7)),
            Err(SharingError::Violation)
        ));
        // A reader that does not share read with the existing reader is refused.
        assert!(matches!(
            sm.add_open(K, open(3, READ_DATA, SHARE_WRITE)),
            Err(SharingError::Violation)
        ));
        // Attribute-only opens never conflict.
        sm.add_open(K, open(4, 0x80, 0)).unwrap();
        sm.add_open(K, open(5, READ_DATA, SHARE_READ)).unwrap();
        assert_eq!(sm.record(K).unwrap().opens.len(), 3);
        assert!(!sm.remove_open(K, 1).unwrap());
    }

    #[test]
    fn alike_opens_of_a_node_join_one_entry_and_are_checked_as_each_open_would_be() {
        let store = Arc::new(MemoryStore::new());
        let sm = ShareModes::new(store.clone());
        let key = K.record_key(OPENS_PREFIX);
        let readers = |id| sm.join_group(K, open(id, READ_DATA, SHARE_READ), id);
        let first = readers(1);
        sm.add_open(K, first).unwrap();
        let written = store.get(&key).unwrap().unwrap();
        // The second reader joins the entry: the record is not written.
        let second = readers(2);
        assert_eq!(second, first);
        sm.add_open(K, second).unwrap();
        assert_eq!(store.get(&key).unwrap().unwrap().version, written.version);
        assert_eq!(sm.record(K).unwrap().opens, vec![first]);
        // The entry refuses what either reader would: a writer.
        assert!(matches!(
            sm.add_open(K, open(9, WRITE_DATA, 7)),
            Err(SharingError::Violation)
        ));
        // An open that shares nothing conflicts with its own twin.
        const K2: FileKey = FileKey::new(1, 3, 1);
        let lone = |id| sm.join_group(K2, open(id, READ_DATA, 0), id);
        sm.add_open(K2, lone(5)).unwrap();
        assert!(matches!(
            sm.add_open(K2, lone(6)),
            Err(SharingError::Violation)
        ));
        assert_eq!(sm.grouped().entry_to_leave(6), None);
        assert_eq!(sm.grouped().entry_to_leave(5), Some(5));
        // A delete-pending file refuses a member as any open.
        sm.set_delete_pending(K, true).unwrap();
        assert!(matches!(
            sm.add_open(K, readers(4)),
            Err(SharingError::DeletePending)
        ));
        sm.set_delete_pending(K, false).unwrap();
        // Members leave; the entry goes with the last.
        for id in [2, 4] {
            assert_eq!(sm.grouped().entry_to_leave(id), None);
        }
        assert_eq!(sm.grouped().entry_to_leave(1), Some(1));
        assert!(!sm.remove_open(K, 1).unwrap());
        sm.add_open(K, open(9, WRITE_DATA, 7)).unwrap();
    }

    #[test]
    fn an_open_the_record_does_not_name_is_never_the_last_of_a_deleted_file() {
        // Open 1's node is gone; open 2 was refused and leaves: the file's
        // deletion went with node 1 (as `add_open` finds), not to open 2.
        let gone: Gone = Arc::new(|id| id == 1);
        let sm = ShareModes::with_liveness(Arc::new(MemoryStore::new()), gone);
        sm.add_open(K, open(1, DELETE, 7)).unwrap();
        sm.set_delete_pending(K, true).unwrap();
        assert!(!sm.remove_open_unless_last_of_deleted(K, 2).unwrap());
        assert_eq!(sm.record(K).unwrap(), FileRecord::default());
        // Nor at a close that removes it outright.
        sm.add_open(K, open(1, DELETE, 7)).unwrap();
        sm.set_delete_pending(K, true).unwrap();
        assert!(!sm.remove_open(K, 2).unwrap());
    }

    #[test]
    fn delete_pending_lifecycle() {
        let sm = ShareModes::new(Arc::new(MemoryStore::new()));
        sm.add_open(K, open(1, DELETE, 7)).unwrap();
        sm.add_open(K, open(2, READ_DATA, 7)).unwrap();
        sm.set_delete_pending(K, true).unwrap();
        assert!(matches!(
            sm.add_open(K, open(3, READ_DATA, 7)),
            Err(SharingError::DeletePending)
        ));
        // Open 2 registered again under its id (a durable open taken over,
        // a persistent one restored) is one of the file's opens already,
        // not a new one: a deletion set since does not refuse it.
        sm.add_open(K, open(2, READ_DATA, 7)).unwrap();
        assert!(!sm.remove_open(K, 1).unwrap());
        assert!(sm.remove_open(K, 2).unwrap());
        // The record is gone, so a new file with the same inode starts clean.
        assert_eq!(sm.record(K).unwrap(), FileRecord::default());
    }

    #[test]
    fn the_last_open_of_a_deleted_file_stays_in_its_record_until_told() {
        let sm = ShareModes::new(Arc::new(MemoryStore::new()));
        sm.add_open(K, open(1, DELETE, 7)).unwrap();
        sm.add_open(K, open(2, READ_DATA, 7)).unwrap();
        sm.set_delete_pending(K, true).unwrap();
        // Not the last: removed.
        assert!(!sm.remove_open_unless_last_of_deleted(K, 1).unwrap());
        // The last: left in the record (the caller unlinks the file), so
        // that an open meanwhile is still told the file is going.
        assert!(sm.remove_open_unless_last_of_deleted(K, 2).unwrap());
        assert!(matches!(
            sm.add_open(K, open(3, READ_DATA, 7)),
            Err(SharingError::DeletePending)
        ));
        assert!(sm.remove_open(K, 2).unwrap());
        assert_eq!(sm.record(K).unwrap(), FileRecord::default());
        // Of a file not delete-pending, the last open just goes.
        sm.add_open(K, open(4, READ_DATA, 7)).unwrap();
        assert!(!sm.remove_open_unless_last_of_deleted(K, 4).unwrap());
        assert_eq!(sm.record(K).unwrap(), FileRecord::default());
    }

    #[test]
    fn stale_entries_of_gone_nodes_give_way() {
        // Opens of "incarnation" 9 (ids 900..) belong to a node that is gone.
        let sm =
            ShareModes::with_liveness(Arc::new(MemoryStore::new()), Arc::new(|id: u64| id >= 900));
        sm.add_open(K, open(900, READ_DATA | DELETE, 0)).unwrap();
        sm.set_delete_pending(K, true).unwrap();
        // The stale entry and its delete-pending give way.
        sm.add_open(K, open(1, READ_DATA, SHARE_READ)).unwrap();
        let rec = sm.record(K).unwrap();
        assert_eq!(rec.opens, vec![open(1, READ_DATA, SHARE_READ)]);
        assert!(!rec.delete_pending);
        // A stale conflicting entry goes; a live one still refuses.
        sm.add_open(K, open(901, WRITE_DATA, 7)).unwrap_err();
        assert!(matches!(
            sm.add_open(K, open(3, WRITE_DATA, 7)),
            Err(SharingError::Violation)
        ));
    }

    #[test]
    fn a_dead_nodes_sharing_opens_go_at_the_next_write_and_keep_no_file_from_its_deletion() {
        let sm =
            ShareModes::with_liveness(Arc::new(MemoryStore::new()), Arc::new(|id: u64| id >= 900));
        let all = SHARE_READ | SHARE_WRITE | SHARE_DELETE;
        // Written while its node lived (the rule drops nothing of its own).
        sm.add_open(K, open(900, READ_DATA, all)).unwrap();
        // A compatible stale entry goes too when the record is written.
        sm.add_open(K, open(1, READ_DATA | DELETE, all)).unwrap();
        assert_eq!(
            sm.record(K).unwrap().opens,
            vec![open(1, READ_DATA | DELETE, all)]
        );
        // Left in by a write before the node died: the last live close of
        // the delete-pending file deletes it.
        sm.update(K, |rec| {
            rec.opens.push(open(901, READ_DATA, all));
            Ok(())
        })
        .unwrap();
        sm.set_delete_pending(K, true).unwrap();
        assert!(
            sm.remove_open(K, 1).unwrap(),
            "the file goes with its last live open"
        );
        // The same through the rule a close applies in place.
        let mut rec = FileRecord {
            opens: vec![open(902, READ_DATA, all), open(2, READ_DATA, all)],
            delete_pending: true,
        };
        assert!(sm.leave_rule(&mut rec, 2), "2 is the last live open");
    }

    #[test]
    fn corrupt_records_are_errors() {
        assert!(FileRecord::decode(&[]).is_err());
        assert!(FileRecord::decode(&[SHARE_MODES_V1, 0, 1, 2]).is_err());
        assert!(FileRecord::decode(&[2, 0]).is_err());
        let rec = FileRecord {
            opens: vec![open(1, READ_DATA, 7)],
            delete_pending: true,
        };
        assert_eq!(FileRecord::decode(&rec.encode()).unwrap(), rec);
    }
}
