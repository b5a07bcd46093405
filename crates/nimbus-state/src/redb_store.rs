//! Single-node backend on disk: one redb file in the server's state
//! directory, for the records that must outlive the process (durable and
//! persistent handles).
//!
//! The records live in memory, where every read and compare-and-set is
//! decided (they are few: the handles kept for reconnection, bounded by
//! `max_durable_handles`), and are written behind to redb. A write asked
//! for `Durability::Now` returns once it and every write before it are
//! committed (fsync); the writes made meanwhile by other callers go in the
//! same redb transaction (group commit: one fsync for many concurrent
//! opens). A write asked for `Durability::Soon` returns at once and goes
//! to disk with the next durable commit, or with the flusher's at most
//! `FLUSH_DELAY` later; several writes of one key before a commit reach
//! the disk as the last of them (a handle opened, marked answered and
//! closed between two commits costs one insert and one delete).
//!
//! A durable commit is one entry appended to the write-ahead journal
//! (`journal.rs`, file `state.journal`) and one `fdatasync`, after which
//! redb takes the same changes without waiting for the disk; redb is made
//! durable when the journal is full and at start, after the journal's
//! entries are replayed into it. Each commit moves the store from one
//! state the memory had to a later one as a whole, so a crash at any point
//! leaves it as the store was at some moment, never half a record. A commit that fails
//! leaves memory ahead of the disk: the store then refuses every call
//! (`Unavailable`, naming the error) rather than answer from a state the
//! disk may never hold.
//!
//! Readers see a write as soon as it is made, before it is durable; only
//! the writer that asked for `Now` is told it is on disk.
//!
//! Layout: table `records` maps a key to its version (u64, little endian)
//! followed by the value; table `meta` holds the last version handed out,
//! so versions keep rising across restarts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::journal::{Batch, Journal};
use crate::store::{Durability, StateError, StateStore, Versioned};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const LAST_VERSION: &str = "last_version";
/// The journal epoch whose entries come after what redb holds durably.
const JOURNAL_EPOCH: &str = "journal_epoch";

/// The file name of the journal inside the state directory.
pub const JOURNAL_FILE_NAME: &str = "state.journal";

/// The file name of the store inside the state directory.
pub const FILE_NAME: &str = "state.redb";

/// How long a `Durability::Soon` write may stay off the disk when no
/// durable write comes to take it along.
/// Short, as it is the window in which a crash loses an acknowledged
/// close or "answered" mark when the server is otherwise idle; under load
/// the next durable write comes sooner.
pub const FLUSH_DELAY: Duration = Duration::from_millis(2);

pub struct RedbStore {
    inner: Arc<Inner>,
    flusher: Option<std::thread::JoinHandle<()>>,
}

struct Inner {
    db: Database,
    path: PathBuf,
    /// Used by the one commit under way (`State::committing`).
    journal: Mutex<Journal>,
    state: Mutex<State>,
    /// Signalled when a commit ends.
    changed: Condvar,
    /// Signalled when a write starts waiting for the flusher, and at stop
    /// (its own, so that commits do not wake it).
    flush_due: Condvar,
}

struct State {
    records: BTreeMap<Vec<u8>, Versioned>,
    last_version: u64,
    /// What changed since the last commit: each key's latest value (None:
    /// deleted).
    unwritten: Batch,
    /// Writes made so far, and how many of them the disk holds.
    made: u64,
    on_disk: u64,
    /// A commit is under way (one at a time).
    committing: bool,
    /// When the oldest write not on disk was made.
    unflushed_since: Option<Instant>,
    /// Why the store refuses service (a failed commit).
    failed: Option<String>,
    /// The store is being dropped: the flusher commits what is left.
    stopping: bool,
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

/// Creates the file at `path` if it is missing, and makes it (or the one
/// there) mode 0600, whatever the umask: nothing in the state directory is
/// for other users. Leaves its contents as they are.
fn private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?
        .set_permissions(std::fs::Permissions::from_mode(0o600))
}

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
    /// directory with mode 0700 when it does not exist, and reads its
    /// records into memory. A file that is not a store, or a damaged one,
    /// is an error naming it: never an empty store in its place.
    ///
    /// The directory holds who has which file open (the owners,
    /// CreateGuids and paths of the handles kept for reconnection; the
    /// server's status files list sessions and open files), so it is
    /// private to the server's user: an existing directory that group or
    /// others may read, enter or write is refused, with the `chmod` that
    /// fixes it; the files the store writes are made 0600 whatever the
    /// umask, and one found wider is narrowed.
    pub fn open(dir: &Path) -> Result<RedbStore, OpenError> {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(FILE_NAME);
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
                .and_then(|()| {
                    // The mode asked for at creation is cut by the umask.
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                })
                .map_err(|e| fail(dir, format!("cannot create the directory: {e}")))?;
        } else if !dir.is_dir() {
            return Err(fail(dir, "is not a directory".into()));
        } else {
            let mode = std::fs::metadata(dir)
                .map_err(|e| fail(dir, format!("cannot read its mode: {e}")))?
                .permissions()
                .mode()
                & 0o7777;
            if mode & 0o077 != 0 {
                return Err(fail(
                    dir,
                    format!(
                        "mode {mode:04o} lets group or others read, enter or write it, and it \
                         holds the owners, CreateGuids and paths of the handles kept for \
                         reconnection and the server's sessions and open files (fix: \
                         `chmod 700 {}`)",
                        dir.display()
                    ),
                ));
            }
        }
        private_file(&path).map_err(|e| fail(&path, format!("cannot open: {e}")))?;
        let db = Database::create(&path).map_err(|e| {
            fail(
                &path,
                format!(
                    "cannot open: {e} (a damaged or foreign file is not replaced: move it \
                     away to start with an empty store, which forgets the handles it kept)"
                ),
            )
        })?;
        let err = |e: &dyn std::fmt::Display| fail(&path, e.to_string());
        let mut records = BTreeMap::new();
        let (mut last_version, epoch) = {
            let txn = db.begin_read().map_err(|e| err(&e))?;
            // A store made by an older Nimbus has no meta table yet.
            match txn.open_table(RECORDS) {
                Ok(table) => {
                    for entry in table.iter().map_err(|e| err(&e))? {
                        let (k, v) = entry.map_err(|e| err(&e))?;
                        let v = split(v.value()).map_err(|e| err(&e))?;
                        records.insert(k.value().to_vec(), v);
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(err(&e)),
            }
            match txn.open_table(META) {
                Ok(meta) => {
                    let get = |k: &str| -> Result<u64, OpenError> {
                        Ok(meta
                            .get(k)
                            .map_err(|e| err(&e))?
                            .map(|v| v.value())
                            .unwrap_or(0))
                    };
                    (get(LAST_VERSION)?, get(JOURNAL_EPOCH)? as u32)
                }
                Err(redb::TableError::TableDoesNotExist(_)) => (0, 0),
                Err(e) => return Err(err(&e)),
            }
        };
        // What the journal holds beyond redb's last durable state: replayed
        // into memory, then made durable in redb with the next epoch, which
        // starts the journal afresh.
        let journal_path = dir.join(JOURNAL_FILE_NAME);
        let jerr = |e: &dyn std::fmt::Display| fail(&journal_path, e.to_string());
        let mut journal = Journal::open(&journal_path).map_err(|e| jerr(&e))?;
        let mut replayed = Batch::new();
        for batch in journal.read(epoch).map_err(|e| jerr(&e))? {
            for (key, value) in batch {
                match &value {
                    Some(v) => {
                        last_version = last_version.max(v.version);
                        records.insert(key.clone(), v.clone());
                    }
                    None => {
                        records.remove(&key);
                    }
                }
                replayed.insert(key, value);
            }
        }
        let next_epoch = epoch.wrapping_add(1);
        checkpoint(&db, &replayed, last_version, next_epoch).map_err(|e| err(&e))?;
        journal.restart(next_epoch);
        let inner = Arc::new(Inner {
            db,
            path: path.clone(),
            journal: Mutex::new(journal),
            state: Mutex::new(State {
                records,
                last_version,
                unwritten: BTreeMap::new(),
                made: 0,
                on_disk: 0,
                committing: false,
                unflushed_since: None,
                failed: None,
                stopping: false,
            }),
            changed: Condvar::new(),
            flush_due: Condvar::new(),
        });
        let flusher = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("nimbus-state-flush".into())
                .spawn(move || inner.flush_loop())
                .map_err(|e| fail(&path, format!("cannot start its flusher: {e}")))?
        };
        Ok(RedbStore {
            inner,
            flusher: Some(flusher),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

impl Drop for RedbStore {
    /// Stops the flusher, which puts what is pending on disk first.
    fn drop(&mut self) {
        lock(&self.inner.state).stopping = true;
        self.inner.flush_due.notify_all();
        if let Some(t) = self.flusher.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl State {
    fn refuse(&self) -> Result<(), StateError> {
        match &self.failed {
            Some(why) => Err(StateError::Unavailable(format!(
                "a commit failed earlier ({why}); restart the server"
            ))),
            None => Ok(()),
        }
    }
}

/// Applies `batch` to the tables of `txn` (and the epoch, when given).
fn write_batch(
    txn: &redb::WriteTransaction,
    batch: &Batch,
    last_version: u64,
    epoch: Option<u32>,
) -> Result<(), StateError> {
    let mut table = txn.open_table(RECORDS).map_err(unavailable)?;
    let mut meta = txn.open_table(META).map_err(unavailable)?;
    let mut stored = Vec::new();
    for (key, value) in batch {
        match value {
            Some(v) => {
                stored.clear();
                stored.extend_from_slice(&v.version.to_le_bytes());
                stored.extend_from_slice(&v.value);
                table
                    .insert(key.as_slice(), stored.as_slice())
                    .map_err(unavailable)?;
            }
            None => {
                table.remove(key.as_slice()).map_err(unavailable)?;
            }
        }
    }
    meta.insert(LAST_VERSION, last_version)
        .map_err(unavailable)?;
    if let Some(epoch) = epoch {
        meta.insert(JOURNAL_EPOCH, epoch as u64)
            .map_err(unavailable)?;
    }
    Ok(())
}

/// One durable redb commit of `batch` that also ends the journal's epoch:
/// from here on redb holds everything, and the journal starts `epoch`.
fn checkpoint(
    db: &Database,
    batch: &Batch,
    last_version: u64,
    epoch: u32,
) -> Result<(), StateError> {
    let txn = db.begin_write().map_err(unavailable)?;
    write_batch(&txn, batch, last_version, Some(epoch))?;
    txn.commit().map_err(unavailable)
}

impl Inner {
    fn wait<'a>(&self, g: std::sync::MutexGuard<'a, State>) -> std::sync::MutexGuard<'a, State> {
        self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once the disk holds the first `upto` writes: commits them
    /// itself when no commit is under way (taking along every write made
    /// meanwhile), or waits for the commit that is.
    fn make_durable<'a>(
        &'a self,
        mut g: std::sync::MutexGuard<'a, State>,
        upto: u64,
    ) -> Result<std::sync::MutexGuard<'a, State>, StateError> {
        loop {
            g.refuse()?;
            if g.on_disk >= upto {
                return Ok(g);
            }
            if !g.committing {
                break;
            }
            g = self.wait(g);
        }
        g.committing = true;
        let batch = std::mem::take(&mut g.unwritten);
        let made = g.made;
        let last_version = g.last_version;
        drop(g);
        let result = self.commit(&batch, last_version);
        let mut g = lock(&self.state);
        g.committing = false;
        match result {
            Ok(()) => {
                g.on_disk = made;
                g.unflushed_since = (!g.unwritten.is_empty()).then(Instant::now);
                if g.unflushed_since.is_some() {
                    self.flush_due.notify_one();
                }
            }
            Err(e) => {
                tracing::error!("state store {}: commit failed: {e}", self.path.display());
                g.failed = Some(e.to_string());
            }
        }
        self.changed.notify_all();
        g.refuse()?;
        Ok(g)
    }

    /// Makes `batch` durable: one journal entry, then redb without
    /// waiting for the disk; or, when the journal is full, a checkpoint.
    fn commit(&self, batch: &Batch, last_version: u64) -> Result<(), StateError> {
        let mut journal = lock(&self.journal);
        if journal.append(batch).map_err(unavailable)? {
            let mut txn = self.db.begin_write().map_err(unavailable)?;
            txn.set_durability(redb::Durability::None)
                .map_err(unavailable)?;
            write_batch(&txn, batch, last_version, None)?;
            return txn.commit().map_err(unavailable);
        }
        let next = journal.epoch.wrapping_add(1);
        checkpoint(&self.db, batch, last_version, next)?;
        journal.restart(next);
        Ok(())
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
        durability: Durability,
    ) -> Result<Option<u64>, StateError> {
        let mut g = lock(&self.state);
        g.refuse()?;
        if g.records.get(key).map(|v| v.version) != expected {
            return Ok(None);
        }
        let (version, stored) = match value {
            Some(value) => {
                g.last_version += 1;
                let v = Versioned {
                    version: g.last_version,
                    value,
                };
                g.records.insert(key.to_vec(), v.clone());
                (v.version, Some(v))
            }
            None => {
                g.records.remove(key);
                (0, None)
            }
        };
        g.unwritten.insert(key.to_vec(), stored);
        g.made += 1;
        let made = g.made;
        match durability {
            Durability::Now => {
                drop(self.make_durable(g, made)?);
            }
            Durability::Soon => {
                if g.unflushed_since.is_none() {
                    g.unflushed_since = Some(Instant::now());
                    drop(g);
                    self.flush_due.notify_one();
                }
            }
        }
        Ok(Some(version))
    }

    /// The flusher: once a `Soon` write has waited `FLUSH_DELAY` without
    /// a durable commit taking it along, commits it; at stop, commits
    /// what is left and returns.
    fn flush_loop(&self) {
        let mut g = lock(&self.state);
        loop {
            let pending = g.made > g.on_disk && g.failed.is_none();
            let due = g.unflushed_since.map(|t| t + FLUSH_DELAY);
            if pending && (g.stopping || due.is_some_and(|d| Instant::now() >= d)) {
                let made = g.made;
                g = match self.make_durable(g, made) {
                    Ok(g) => g,
                    // Logged by make_durable; the store now refuses service.
                    Err(_) => lock(&self.state),
                };
                continue;
            }
            if g.stopping {
                return;
            }
            g = match due {
                Some(due) if pending => {
                    let wait = due.saturating_duration_since(Instant::now());
                    self.flush_due
                        .wait_timeout(g, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                _ => self.flush_due.wait(g).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

impl StateStore for RedbStore {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let g = lock(&self.inner.state);
        g.refuse()?;
        Ok(g.records.get(key).cloned())
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        self.inner
            .compare_and_set(key, expected, value, Durability::Now)
    }

    fn compare_and_set_with(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
        durability: Durability,
    ) -> Result<Option<u64>, StateError> {
        self.inner.compare_and_set(key, expected, value, durability)
    }

    fn flush(&self) -> Result<(), StateError> {
        let g = lock(&self.inner.state);
        let made = g.made;
        drop(self.inner.make_durable(g, made)?);
        Ok(())
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError> {
        let g = lock(&self.inner.state);
        g.refuse()?;
        Ok(g.records
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
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

    /// Runs `child` in a copy of this test binary that then dies without
    /// unwinding (as kill -9 would leave the store), and returns when it
    /// has.
    fn in_a_process_that_aborts(test: &str, dir: &Path) {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env("NIMBUS_REDB_CHILD_DIR", dir)
            .status()
            .unwrap();
        assert!(!status.success(), "the child aborts");
    }

    #[test]
    fn durable_writes_survive_an_abort_and_soon_ones_the_flush_delay() {
        if let Some(dir) = std::env::var_os("NIMBUS_REDB_CHILD_DIR") {
            // The child: one write of each kind, then death without Drop.
            let s = RedbStore::open(Path::new(&dir)).unwrap();
            s.compare_and_set(b"o/now", None, Some(b"now".to_vec()))
                .unwrap()
                .unwrap();
            s.compare_and_set_with(b"o/soon", None, Some(b"soon".to_vec()), Durability::Soon)
                .unwrap()
                .unwrap();
            // Seen at once, before it is on disk.
            assert_eq!(s.get(b"o/soon").unwrap().unwrap().value, b"soon");
            // The flusher puts it on disk within FLUSH_DELAY; wait for it
            // to say so (bounded), then die.
            let until = Instant::now() + Duration::from_secs(10);
            let behind = || {
                let g = lock(&s.inner.state);
                g.made > g.on_disk
            };
            while behind() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::process::abort();
        }
        let dir = temp_dir("abort");
        in_a_process_that_aborts(
            "redb_store::tests::durable_writes_survive_an_abort_and_soon_ones_the_flush_delay",
            &dir,
        );
        let s = RedbStore::open(&dir).unwrap();
        assert_eq!(s.get(b"o/now").unwrap().unwrap().value, b"now");
        assert_eq!(s.get(b"o/soon").unwrap().unwrap().value, b"soon");
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn journal_checkpoints_lose_nothing_at_an_abort() {
        if let Some(dir) = std::env::var_os("NIMBUS_REDB_CHILD_DIR") {
            // Enough to fill the journal twice over: two checkpoints, then
            // entries of a third epoch, then death without Drop.
            let s = RedbStore::open(Path::new(&dir)).unwrap();
            let big = vec![0x5Au8; 100 << 10];
            let mut versions = Vec::new();
            for i in 0..100u32 {
                let key = format!("big/{i:03}");
                versions.push(
                    s.compare_and_set(key.as_bytes(), None, Some(big.clone()))
                        .unwrap()
                        .unwrap(),
                );
            }
            for (i, v) in versions.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
                let key = format!("big/{i:03}");
                s.compare_and_set(key.as_bytes(), Some(*v), None)
                    .unwrap()
                    .unwrap();
            }
            std::process::abort();
        }
        let dir = temp_dir("checkpoints");
        in_a_process_that_aborts(
            "redb_store::tests::journal_checkpoints_lose_nothing_at_an_abort",
            &dir,
        );
        let s = RedbStore::open(&dir).unwrap();
        let left = s.scan_prefix(b"big/").unwrap();
        let names: Vec<String> = left
            .iter()
            .map(|(k, _)| String::from_utf8(k.clone()).unwrap())
            .collect();
        let odd: Vec<String> = (0..100)
            .filter(|i| i % 2 == 1)
            .map(|i| format!("big/{i:03}"))
            .collect();
        assert_eq!(names, odd);
        assert!(left.iter().all(|(_, v)| v.value == vec![0x5Au8; 100 << 10]));
        // And again after a clean reopen: the checkpoint at start kept it.
        drop(s);
        let s = RedbStore::open(&dir).unwrap();
        assert_eq!(s.scan_prefix(b"big/").unwrap().len(), 50);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn soon_writes_are_ordered_with_durable_ones_and_kept_at_drop() {
        let dir = temp_dir("soon");
        let s = RedbStore::open(&dir).unwrap();
        let v1 = s
            .compare_and_set_with(b"o/1", None, Some(b"a".to_vec()), Durability::Soon)
            .unwrap()
            .unwrap();
        // A durable compare-and-set sees the version the Soon one left.
        let v2 = s
            .compare_and_set(b"o/1", Some(v1), Some(b"b".to_vec()))
            .unwrap()
            .unwrap();
        assert!(v2 > v1);
        // ...and takes it to disk: nothing is left for the flusher.
        {
            let g = lock(&s.inner.state);
            assert_eq!(g.made, g.on_disk);
        }
        s.compare_and_set_with(b"o/1", Some(v2), None, Durability::Soon)
            .unwrap()
            .unwrap();
        s.compare_and_set_with(b"o/2", None, Some(b"c".to_vec()), Durability::Soon)
            .unwrap()
            .unwrap();
        drop(s);
        let s = RedbStore::open(&dir).unwrap();
        assert_eq!(s.get(b"o/1").unwrap(), None);
        assert_eq!(s.get(b"o/2").unwrap().unwrap().value, b"c");
        // An explicit flush with nothing pending costs no commit and fails
        // nothing.
        s.flush().unwrap();
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn directory_is_created_private() {
        let dir = temp_dir("mode").join("nested");
        let s = RedbStore::open(&dir).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        assert_eq!(mode_of(&dir.join(FILE_NAME)), 0o600);
        assert_eq!(mode_of(&dir.join(JOURNAL_FILE_NAME)), 0o600);
        drop(s);
        std::fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    fn mode_of(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn set_mode(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A directory of the right mode, made as an operator would.
    fn private_dir(name: &str) -> PathBuf {
        let dir = temp_dir(name);
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&dir, 0o700);
        dir
    }

    #[test]
    fn a_directory_others_may_enter_is_refused_and_wide_files_are_narrowed() {
        let dir = private_dir("wide");
        drop(RedbStore::open(&dir).unwrap());
        for mode in [0o755, 0o750, 0o701, 0o770, 0o1777] {
            set_mode(&dir, mode);
            let err = RedbStore::open(&dir).err().expect("refused");
            assert_eq!(err.path, dir);
            let text = err.to_string();
            assert!(text.contains(&format!("mode {mode:04o}")), "{text}");
            assert!(
                text.contains(&format!("chmod 700 {}", dir.display())),
                "{text}"
            );
        }
        // The files of a store whose directory is made private again are
        // narrowed when it opens.
        set_mode(&dir, 0o700);
        set_mode(&dir.join(FILE_NAME), 0o644);
        set_mode(&dir.join(JOURNAL_FILE_NAME), 0o666);
        let s = RedbStore::open(&dir).unwrap();
        assert_eq!(mode_of(&dir.join(FILE_NAME)), 0o600);
        assert_eq!(mode_of(&dir.join(JOURNAL_FILE_NAME)), 0o600);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn damaged_file_is_an_error_naming_it() {
        let dir = private_dir("damaged");
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
