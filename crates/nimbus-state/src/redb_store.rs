//! Single-node backend on disk: one redb file in the server's state
//! directory, for the records that must outlive the process (durable and
//! persistent handles). Every compare-and-set is one redb write
//! transaction, committed (fsync) before it returns, so a crash at any
//! point leaves each record either as it was or as written, never half.
//!
//! Layout: table `records` maps a key to its version (u64, little endian)
//! followed by the value; table `meta` holds the last version handed out,
//! so versions keep rising across restarts.

use std::path::{Path, PathBuf};

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
        let store = RedbStore { db, path };
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
}

impl StateStore for RedbStore {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        let txn = self.db.begin_read().map_err(unavailable)?;
        let table = txn.open_table(RECORDS).map_err(unavailable)?;
        let found = table.get(key).map_err(unavailable)?;
        found.map(|v| split(v.value())).transpose()
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        let txn = self.db.begin_write().map_err(unavailable)?;
        let written = {
            let mut table = txn.open_table(RECORDS).map_err(unavailable)?;
            let current = match table.get(key).map_err(unavailable)? {
                Some(v) => Some(split(v.value())?.version),
                None => None,
            };
            if current != expected {
                return Ok(None);
            }
            match value {
                Some(value) => {
                    let mut meta = txn.open_table(META).map_err(unavailable)?;
                    let last = meta
                        .get(LAST_VERSION)
                        .map_err(unavailable)?
                        .map(|v| v.value())
                        .unwrap_or(0);
                    let version = last + 1;
                    meta.insert(LAST_VERSION, version).map_err(unavailable)?;
                    let mut stored = Vec::with_capacity(8 + value.len());
                    stored.extend_from_slice(&version.to_le_bytes());
                    stored.extend_from_slice(&value);
                    table.insert(key, stored.as_slice()).map_err(unavailable)?;
                    version
                }
                None => {
                    table.remove(key).map_err(unavailable)?;
                    0
                }
            }
        };
        txn.commit().map_err(unavailable)?;
        Ok(Some(written))
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
