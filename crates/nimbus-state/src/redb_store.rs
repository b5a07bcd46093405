//! Single-node backend on disk: one redb file in the server's state
//! directory, for the records that must outlive the process (durable and
//! persistent handles). Every compare-and-set is committed (fsync) before
//! it returns, in a redb write transaction it shares with the others made
//! meanwhile (group commit: one fsync for many concurrent opens), so a
//! crash at any point leaves each record either as it was or as written,
//! never half.
//!
//! Layout: table `records` maps a key to its version (u64, little endian)
//! followed by the value; table `meta` holds the last version handed out,
//! so versions keep rising across restarts.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::store::{StateError, StateStore, Versioned};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LAST_VERSION: &str = "last_version";

/// The file name of the store inside the state directory.
pub const FILE_NAME: &str = "state.redb";

pub struct RedbStore {
    db: Database,
    path: PathBuf,
    /// Compare-and-sets waiting for the next commit, and whether one is
    /// under way (see `compare_and_set`).
    group: Mutex<Group>,
    done: Condvar,
}

/// Why the store could not be opened; names the path, for the operator.
#[derive(Debug)]
pub struct OpenError {
    pub path: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "state store {}: {}", self.path.display(), self.reason)
    }
}

impl std::error::Error for OpenError {}

fn unavailable(e: impl std::fmt::Display) -> StateError {
    StateError::Unavailable(e.to_string())
}

/// A stored value: version, then the record's bytes.
fn split(stored: &[u8]) -> Result<Versioned, StateError> {
    if stored.len() < 8 {
        return Err(StateError::Corrupt(
            "stored record shorter than its version",
        ));
    }
    let (v, value) = stored.split_at(8);
    let mut b = [0u8; 8];
    b.copy_from_slice(v);
    Ok(Versioned {
        version: u64::from_le_bytes(b),
        value: value.to_vec(),
    })
}

impl RedbStore {
    /// Opens (or creates) the store in directory `dir`, creating the
    /// directory with mode 0700 when it does not exist. A file that is not
    /// a store, or a damaged one, is an error naming it: never an empty
    /// store in its place.
    pub fn open(dir: &Path) -> Result<RedbStore, OpenError> {
        let fail = |path: &Path, reason: String| OpenError {
            path: path.to_path_buf(),
            reason,
        };
        if !dir.exists() {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| fail(dir, format!("cannot create the directory: {e}")))?;
        } else if !dir.is_dir() {
            return Err(fail(dir, "is not a directory".into()));
        }
        let path = dir.join(FILE_NAME);
        let db = Database::create(&path).map_err(|e| {
            fail(
                &path,
                format!(
                    "cannot open: {e} (a damaged or foreign file is not replaced: move it \
                     away to start with an empty store, which forgets the handles it kept)"
                ),
            )
        })?;
        let store = RedbStore {
            db,
            path,
            group: Mutex::new(Group::default()),
            done: Condvar::new(),
        };
        // Both tables exist from the first open on, so that reads never
        // meet a missing table.
        let txn = store
            .db
            .begin_write()
            .map_err(|e| fail(&store.path, e.to_string()))?;
        {
            txn.open_table(RECORDS)
                .map_err(|e| fail(&store.path, e.to_string()))?;
            txn.open_table(META)
                .map_err(|e| fail(&store.path, e.to_string()))?;
        }
        txn.commit().map_err(|e| fail(&store.path, e.to_string()))?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Applies `batch` in order in one write transaction and commits it;
    /// the answer of each op (a failed commit fails them all).
    fn commit_batch(&self, batch: &[Op]) -> Vec<Result<Option<u64>, StateError>> {
        let fail_all = |e: StateError| batch.iter().map(|_| Err(e.clone_message())).collect();
        let txn = match self.db.begin_write() {
            Ok(t) => t,
            Err(e) => return fail_all(unavailable(e)),
        };
        let mut answers = Vec::with_capacity(batch.len());
        {
            let mut table = match txn.open_table(RECORDS) {
                Ok(t) => t,
                Err(e) => return fail_all(unavailable(e)),
            };
            let mut meta = match txn.open_table(META) {
                Ok(t) => t,
                Err(e) => return fail_all(unavailable(e)),
            };
            for op in batch {
                answers.push(apply(&mut table, &mut meta, op));
            }
        }
        // Nothing was written (every op refused or failed): no commit.
        if answers.iter().all(|a| !matches!(a, Ok(Some(_)))) {
            drop(txn);
            return answers;
        }
        match txn.commit() {
            Ok(()) => answers,
            Err(e) => fail_all(unavailable(e)),
        }
    }
}

/// One op of a compare-and-set, within a write transaction.
fn apply(
    table: &mut redb::Table<&[u8], &[u8]>,
    meta: &mut redb::Table<&str, u64>,
    op: &Op,
) -> Result<Option<u64>, StateError> {
    let current = match table.get(op.key.as_slice()).map_err(unavailable)? {
        Some(v) => Some(split(v.value())?.version),
        None => None,
    };
    if current != op.expected {
        return Ok(None);
    }
    match &op.value {
        Some(value) => {
            let last = meta
                .get(LAST_VERSION)
                .map_err(unavailable)?
                .map(|v| v.value())
                .unwrap_or(0);
            let version = last + 1;
            meta.insert(LAST_VERSION, version).map_err(unavailable)?;
            let mut stored = Vec::with_capacity(8 + value.len());
            stored.extend_from_slice(&version.to_le_bytes());
            stored.extend_from_slice(value);
            table
                .insert(op.key.as_slice(), stored.as_slice())
                .map_err(unavailable)?;
            Ok(Some(version))
        }
        None => {
            table.remove(op.key.as_slice()).map_err(unavailable)?;
            Ok(Some(0))
        }
    }
}

/// A compare-and-set waiting for a group commit.
struct Op {
    key: Vec<u8>,
    expected: Option<u64>,
    value: Option<Vec<u8>>,
    slot: Arc<Slot>,
}

#[derive(Default)]
struct Slot {
    answer: Mutex<Option<Result<Option<u64>, StateError>>>,
}

#[derive(Default)]
struct Group {
    queue: Vec<Op>,
    committing: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StateStore for RedbStore {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let table = txn.open_table(RECORDS).map_err(unavailable)?;
        let found = table.get(key).map_err(unavailable)?;
        found.map(|v| split(v.value())).transpose()
    }

    /// Group commit: a caller that finds no commit under way becomes the
    /// leader and applies every compare-and-set queued so far in one write
    /// transaction with one fsync; the others wait for its commit. Each
    /// still sees the versions the ones queued before it left, so the
    /// answers are those of the calls made one after the other.
    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        let slot = Arc::new(Slot::default());
        let mut g = lock(&self.group);
        g.queue.push(Op {
            key: key.to_vec(),
            expected,
            value,
            slot: slot.clone(),
        });
        loop {
            if let Some(answer) = lock(&slot.answer).take() {
                return answer;
            }
            if !g.committing {
                break;
            }
            g = self.done.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        // Leader: take what is queued (this call's op among it), commit it
        // without holding the queue, hand out the answers.
        g.committing = true;
        let batch = std::mem::take(&mut g.queue);
        drop(g);
        let answers = self.commit_batch(&batch);
        for (op, answer) in batch.iter().zip(answers) {
            *lock(&op.slot.answer) = Some(answer);
        }
        let mut g = lock(&self.group);
        g.committing = false;
        drop(g);
        self.done.notify_all();
        let answer = lock(&slot.answer).take();
        answer.unwrap_or_else(|| {
            Err(StateError::Unavailable(
                "group commit lost an answer".into(),
            ))
        })
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let table = txn.open_table(RECORDS).map_err(unavailable)?;
        let mut out = Vec::new();
        for entry in table.range(prefix..).map_err(unavailable)? {
            let (k, v) = entry.map_err(unavailable)?;
            let k = k.value();
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), split(v.value())?));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "nimbus-redb-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn conforms() {
        let dir = temp_dir("conforms");
        let store = RedbStore::open(&dir).unwrap();
        crate::conformance::run_all(&store);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn records_and_versions_survive_reopening() {
        let dir = temp_dir("reopen");
        let v1 = {
            let s = RedbStore::open(&dir).unwrap();
            s.compare_and_set(b"o/1", None, Some(b"kept".to_vec()))
                .unwrap()
                .unwrap()
        };
        let s = RedbStore::open(&dir).unwrap();
        let got = s.get(b"o/1").unwrap().unwrap();
        assert_eq!((got.version, got.value.as_slice()), (v1, &b"kept"[..]));
        // Versions keep rising: a CAS against a version from before the
        // restart cannot be confused with a new record's.
        let v2 = s
            .compare_and_set(b"o/2", None, Some(vec![]))
            .unwrap()
            .unwrap();
        assert!(v2 > v1);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn directory_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir("mode").join("nested");
        let s = RedbStore::open(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        drop(s);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    #[test]
    fn damaged_file_is_an_error_naming_it() {
        let dir = temp_dir("damaged");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(FILE_NAME), b"not a redb file at all, just text").unwrap();
        let err = RedbStore::open(&dir).err().expect("refused");
        assert_eq!(err.path, dir.join(FILE_NAME));
        assert!(err.to_string().contains(FILE_NAME), "{err}");
        // The file is left as it was for the operator to look at.
        assert_eq!(
            std::fs::read(dir.join(FILE_NAME)).unwrap(),
            b"not a redb file at all, just text"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_an_error() {
        let dir = temp_dir("notdir");
        std::fs::write(&dir, b"x").unwrap();
        let err = RedbStore::open(&dir).err().expect("refused");
        assert!(err.to_string().contains("not a directory"), "{err}");
        std::fs::remove_file(&dir).unwrap();
    }
}
