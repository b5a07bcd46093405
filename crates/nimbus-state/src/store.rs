//! The `StateStore` trait: versioned byte records with compare-and-set, the
//! primitive an etcd or redb backend offers as well as memory does.

use core::fmt;

/// A value and the version the store gave it; a version changes on every
/// write, so compare-and-set detects any concurrent update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub version: u64,
    pub value: Vec<u8>,
}

#[derive(Debug)]
#[non_exhaustive]
pub enum StateError {
    /// The backend could not be reached or failed (for remote stores).
    Unavailable(String),
    /// A record could not be decoded: a bug or a foreign writer.
    Corrupt(&'static str),
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateError::Unavailable(why) => write!(f, "state store unavailable: {why}"),
            StateError::Corrupt(what) => write!(f, "corrupt state record: {what}"),
        }
    }
}

impl std::error::Error for StateError {}

impl StateError {
    /// The same error for another caller (errors carry no handles).
    pub fn clone_message(&self) -> StateError {
        match self {
            StateError::Unavailable(why) => StateError::Unavailable(why.clone()),
            StateError::Corrupt(what) => StateError::Corrupt(what),
        }
    }
}

/// How soon a write must be on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Before the call returns: for what a client is about to be told
    /// (a persistent handle granted, a lock taken).
    Now,
    /// With the next `Now` write or within a short, backend-defined delay
    /// (a few milliseconds), but visible to every reader and ordered with
    /// every other write at once. For writes whose loss in a crash within
    /// that delay costs at most a record that expires on its own (a close
    /// seen again as a handle nobody reclaims) or one dropped at start (an
    /// "answered" mark): a backend that is always durable treats it as
    /// `Now`.
    Soon,
}

pub trait StateStore: Send + Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError>;

    /// Writes `value` (or deletes the key when `value` is None) only if the
    /// key's current version is `expected` (None: the key must not exist).
    /// Returns Ok(Some(new_version)) on success (0 after a delete), Ok(None)
    /// when the version did not match.
    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError>;

    /// `compare_and_set` with the durability the write needs.
    fn compare_and_set_with(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
        durability: Durability,
    ) -> Result<Option<u64>, StateError> {
        let _ = durability;
        self.compare_and_set(key, expected, value)
    }

    /// Puts every `Durability::Soon` write made so far on stable storage
    /// (at shutdown).
    fn flush(&self) -> Result<(), StateError> {
        Ok(())
    }

    /// Whether every change of `key` goes through this store object now,
    /// so that a caller may trust what it remembers of the record (a file
    /// it saw without byte-range locks has none). True for a node's own
    /// store; false for a record other cluster nodes may be changing.
    fn is_local(&self, key: &[u8]) -> bool {
        let _ = key;
        true
    }

    /// Whether this node may decide from what it remembers of records
    /// other nodes change: its cluster lease is proven now. A store of one
    /// node always may.
    fn lease_proven(&self) -> bool {
        true
    }

    /// Every record whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError>;

    /// A regular file is about to be made (`O_EXCL`) in the directory of
    /// group `dir` (`FileKey::record_key(&[])`): a token when the file,
    /// once made, may be held without asking anyone (`made`). A cluster
    /// node's store claims the directory for it (docs/SCALING.md, "New
    /// files"); a store of one node decides every file alone anyway.
    fn before_making(&self, dir: &[u8]) -> Option<u64> {
        let _ = dir;
        None
    }

    /// The file of group `file` is about to show under another directory
    /// (a rename): a store that holds it under the claim of the directory
    /// it was made in owns it first, as the claim covers that directory
    /// alone.
    fn naming_elsewhere(&self, file: &[u8]) -> Result<(), StateError> {
        let _ = file;
        Ok(())
    }

    /// The file of group `file` was made in `dir` after `before_making`
    /// gave `token`: true when it is held from here on with no further
    /// question, false when its first update asks as any file's does.
    fn made(&self, file: &[u8], dir: &[u8], token: u64) -> bool {
        let _ = (file, dir, token);
        false
    }

    /// `compare_and_set_with`, answering a write that did not happen with
    /// the record as it is now (what the caller reads next anyway): a
    /// store whose writes are round trips reads it in the same one.
    fn compare_and_set_or_read(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
        durability: Durability,
    ) -> Result<Result<u64, Option<Versioned>>, StateError> {
        match self.compare_and_set_with(key, expected, value, durability)? {
            Some(version) => Ok(Ok(version)),
            None => Ok(Err(self.get(key)?)),
        }
    }

    /// Runs `update`, one read-modify-write of `key` (`records::update`),
    /// in its turn among this node's updates of that record. A store whose
    /// record other nodes may be changing (a cluster's shared file) runs
    /// one update of it at a time and hands each the record as the one
    /// before it left it (a `Memo`), so that the writes of one node's
    /// clients follow each other instead of racing, and each is one round
    /// trip instead of a read and a write; elsewhere `update` gets no memo
    /// and runs at once.
    fn in_turn(&self, key: &[u8], update: &mut dyn FnMut(Option<&mut Option<Memo>>)) {
        let _ = key;
        update(None)
    }

    /// Reads `key` for a decision that must not take the record's file
    /// from another node: where `get` on a cluster store asks the node
    /// that holds the file to hand it over, this says that another node
    /// holds it. Otherwise it reads as `get` (which takes for this node a
    /// file nobody holds whose records are claimable). A store of one node
    /// reads it as `get`.
    fn read_in_place(&self, key: &[u8]) -> Result<InPlace, StateError> {
        self.get(key).map(InPlace::Record)
    }

    /// Writes several records of one file in one step, each only if its
    /// version is the one expected, all or none (as `Durability::Now`).
    /// `Some(Ok(versions))`: written, each record's version in order (a
    /// kept record keeps its own, a deleted one is 0). `Some(Err(now))`: a
    /// version did not match; every record as it is now, in order. `None`:
    /// this store does not write these records together (a store of one
    /// node, or a file a cluster node decides from its memory, where an
    /// update of each record costs nothing), and nothing was written.
    fn compare_and_set_together(&self, writes: &[Together<'_>]) -> Result<Written, StateError> {
        let _ = writes;
        Ok(Written::NotTogether)
    }

    /// Reads several records of one file, each as `get` would. A store
    /// that keeps a shared file's records in etcd reads them in one
    /// request where it can (`ClusterStore`): an update that changed
    /// nothing on records it remembered reads them again this way to prove
    /// its answer.
    fn get_together(&self, keys: &[&[u8]]) -> Result<Vec<Option<Versioned>>, StateError> {
        keys.iter().map(|k| self.get(k)).collect()
    }

    /// `in_turn` for one update of several records (`records::update_both`):
    /// in the turn of each, with what each last update left. A store that
    /// takes no turns runs `update` at once, with none.
    fn in_turns(&self, keys: &[&[u8]], update: &mut TurnsUpdate<'_>) {
        let _ = keys;
        update(None)
    }
}

/// What `StateStore::compare_and_set_together` came to.
#[derive(Debug)]
pub enum Written {
    /// Every record written: each one's version now (0: deleted), in the
    /// order of the writes.
    Done(Vec<u64>),
    /// A record had changed, nothing was written: the records as they are
    /// now, in the order of the writes.
    Changed(Vec<Option<Versioned>>),
    /// This store does not write these records together (not a shared
    /// file, or one held in a node's memory): nothing was written.
    NotTogether,
}

/// An update run in several records' turns (`StateStore::in_turns`), with
/// what each last update left.
pub type TurnsUpdate<'a> = dyn FnMut(Option<&mut [Option<Memo>]>) + 'a;

/// One record's part of `StateStore::compare_and_set_together`.
#[derive(Clone, Debug)]
pub struct Together<'a> {
    pub key: &'a [u8],
    /// The version the record must have (None: it must not exist).
    pub expected: Option<u64>,
    pub change: Change,
}

/// What `compare_and_set_together` does to one record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Compared only: the update's rule read it and left it as it was.
    Keep,
    Put(Vec<u8>),
    Delete,
}

/// What a node last knew of a record it updated (`StateStore::in_turn`):
/// the record as this node last wrote or read it, which another node may
/// have changed since. An update that starts from it proves it by its
/// compare-and-set; one that would write nothing (or refuse) reads the
/// record first, as only the current record can decide that.
#[derive(Clone, Debug)]
pub struct Memo {
    pub key: Vec<u8>,
    pub record: Option<Versioned>,
}

/// What `StateStore::read_in_place` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InPlace {
    /// The record as it is now (None: there is none).
    Record(Option<Versioned>),
    /// Another cluster node decides the record's file from its memory; the
    /// copy in the shared database may be behind.
    HeldElsewhere,
}
