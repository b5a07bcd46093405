//! What every `StateStore` backend must do, as one suite each backend's
//! tests run (memory and redb here; etcd in the cluster): compare-and-set
//! on versions, deletes, prefix scans in key order, records whole after
//! the generic update loop, and refusal of damaged records.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};

use crate::records::{self, Record};
use crate::store::{Change, Durability, StateError, StateStore, Together, TurnsUpdate, Written};
use crate::{MemoryStore, Versioned};

/// Runs every check against `store`, which must start empty.
pub fn run_all(store: &dyn StateStore) {
    compare_and_set(store);
    soon_writes_are_writes(store);
    scans_in_key_order(store);
    updates_through_records(store);
    concurrent_updates_lose_nothing(store);
}

/// A `Durability::Soon` write is the same compare-and-set, seen at once.
fn soon_writes_are_writes(s: &dyn StateStore) {
    let soon = Durability::Soon;
    let v1 = s
        .compare_and_set_with(b"soon/a", None, Some(b"1".to_vec()), soon)
        .unwrap()
        .expect("created");
    assert_eq!(
        s.compare_and_set_with(b"soon/a", None, Some(b"x".to_vec()), soon)
            .unwrap(),
        None
    );
    assert_eq!(s.get(b"soon/a").unwrap().unwrap().value, b"1");
    let v2 = s
        .compare_and_set(b"soon/a", Some(v1), Some(b"2".to_vec()))
        .unwrap()
        .expect("a durable write after a soon one sees its version");
    assert_eq!(
        s.compare_and_set_with(b"soon/a", Some(v2), None, soon)
            .unwrap(),
        Some(0)
    );
    assert_eq!(s.get(b"soon/a").unwrap(), None);
}

fn compare_and_set(s: &dyn StateStore) {
    assert_eq!(s.get(b"cas/a").unwrap(), None);
    let v1 = s
        .compare_and_set(b"cas/a", None, Some(b"1".to_vec()))
        .unwrap()
        .expect("created");
    // Creating again fails: the key exists.
    assert_eq!(
        s.compare_and_set(b"cas/a", None, Some(b"x".to_vec()))
            .unwrap(),
        None
    );
    // A stale or made-up version fails.
    assert_eq!(
        s.compare_and_set(b"cas/a", Some(v1 + 1), Some(b"x".to_vec()))
            .unwrap(),
        None
    );
    let v2 = s
        .compare_and_set(b"cas/a", Some(v1), Some(b"2".to_vec()))
        .unwrap()
        .expect("updated");
    assert!(v2 > v1, "versions rise");
    assert_eq!(s.get(b"cas/a").unwrap().unwrap().value, b"2");
    assert_eq!(s.get(b"cas/a").unwrap().unwrap().version, v2);
    // An empty value is a value, not a delete.
    s.compare_and_set(b"cas/empty", None, Some(vec![]))
        .unwrap()
        .unwrap();
    assert_eq!(s.get(b"cas/empty").unwrap().unwrap().value, b"");
    // Deleting needs the current version, and deletes.
    assert_eq!(s.compare_and_set(b"cas/a", Some(v1), None).unwrap(), None);
    assert_eq!(
        s.compare_and_set(b"cas/a", Some(v2), None).unwrap(),
        Some(0)
    );
    assert_eq!(s.get(b"cas/a").unwrap(), None);
    // A deleted key can be created again, with a new version.
    let v3 = s
        .compare_and_set(b"cas/a", None, Some(b"3".to_vec()))
        .unwrap()
        .unwrap();
    assert!(v3 > v2);
}

fn scans_in_key_order(s: &dyn StateStore) {
    for k in [&b"scan/b"[..], b"scan/a", b"scan/ab", b"scan0", b"scam/z"] {
        s.compare_and_set(k, None, Some(k.to_vec()))
            .unwrap()
            .unwrap();
    }
    let keys: Vec<Vec<u8>> = s
        .scan_prefix(b"scan/")
        .unwrap()
        .into_iter()
        .map(|(k, v)| {
            assert_eq!(k, v.value, "each key with its own value");
            k
        })
        .collect();
    assert_eq!(
        keys,
        vec![b"scan/a".to_vec(), b"scan/ab".to_vec(), b"scan/b".to_vec()]
    );
    assert!(s.scan_prefix(b"nothing/").unwrap().is_empty());
    // Binary keys, high bytes included, sort as bytes.
    s.compare_and_set(b"bin/\xff", None, Some(vec![1]))
        .unwrap()
        .unwrap();
    s.compare_and_set(b"bin/\x00", None, Some(vec![0]))
        .unwrap()
        .unwrap();
    let bin: Vec<u8> = s
        .scan_prefix(b"bin/")
        .unwrap()
        .into_iter()
        .map(|(_, v)| v.value[0])
        .collect();
    assert_eq!(bin, vec![0, 1]);
}

/// A counter record with the usual layout byte in front.
#[derive(Default, Debug, PartialEq)]
struct Counter(u32);

impl Record for Counter {
    fn encode(&self) -> Vec<u8> {
        let mut v = vec![1u8];
        v.extend_from_slice(&self.0.to_le_bytes());
        v
    }
    fn decode(bytes: &[u8]) -> Result<Self, StateError> {
        match bytes {
            [1, a, b, c, d] => Ok(Counter(u32::from_le_bytes([*a, *b, *c, *d]))),
            _ => Err(StateError::Corrupt("counter")),
        }
    }
    fn is_empty(&self) -> bool {
        self.0 == 0
    }
}

fn updates_through_records(s: &dyn StateStore) {
    let key = b"rec/counter";
    for _ in 0..3 {
        records::update::<Counter, _, StateError>(s, key, |c| {
            c.0 += 1;
            Ok(())
        })
        .unwrap();
    }
    assert_eq!(records::read::<Counter>(s, key).unwrap(), Counter(3));
    // A rule that refuses changes nothing.
    let refused = records::update::<Counter, (), StateError>(s, key, |c| {
        c.0 = 99;
        Err(StateError::Corrupt("refused"))
    });
    assert!(refused.is_err());
    assert_eq!(records::read::<Counter>(s, key).unwrap(), Counter(3));
    // An empty record is deleted.
    records::update::<Counter, _, StateError>(s, key, |c| {
        c.0 = 0;
        Ok(())
    })
    .unwrap();
    assert_eq!(s.get(key).unwrap(), None);
    // A damaged value is an error, never a default.
    s.compare_and_set(b"rec/damaged", None, Some(vec![9, 9]))
        .unwrap()
        .unwrap();
    assert!(records::read::<Counter>(s, b"rec/damaged").is_err());
    assert!(records::update::<Counter, _, StateError>(s, b"rec/damaged", |_| Ok(())).is_err());
}

fn concurrent_updates_lose_nothing(s: &dyn StateStore) {
    let key = b"rec/concurrent";
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..25 {
                    records::update::<Counter, _, StateError>(s, key, |c| {
                        c.0 += 1;
                        Ok(())
                    })
                    .unwrap();
                }
            });
        }
    });
    assert_eq!(records::read::<Counter>(s, key).unwrap(), Counter(100));
}

/// A record that is its bytes, for tests of what stores do with records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Raw(pub Vec<u8>);

impl Record for Raw {
    fn encode(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn decode(b: &[u8]) -> Result<Self, StateError> {
        Ok(Raw(b.to_vec()))
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A store as a cluster node sees the records of a file several nodes
/// share, for tests of what is built on `records::update_both`: no record
/// is local, and records are written together (in memory, under one lock).
/// Writes can be held at a gate, so that a test can line up what comes
/// while one is under way.
#[derive(Default)]
pub struct SharedMemory {
    records: MemoryStore,
    writing: Mutex<()>,
    writes: AtomicUsize,
    gate: Mutex<Gate>,
    gate_moved: Condvar,
    /// The key whose next write fails, as a write etcd does not answer.
    fail_next: Mutex<Option<Vec<u8>>>,
}

#[derive(Default)]
struct Gate {
    closed: bool,
    /// With Some, only writes of this key are held.
    only: Option<Vec<u8>>,
    /// Writes waiting at the closed gate.
    held: usize,
}

impl SharedMemory {
    /// Writes made so far (single and together).
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }

    /// Holds every write from now on at the gate.
    pub fn close_gate(&self) {
        let mut g = self.gate.lock().unwrap();
        g.closed = true;
        g.only = None;
    }

    /// Holds the writes of `key` from now on at the gate (a record whose
    /// write is slow, such as one etcd must hand over); others pass.
    pub fn close_gate_on(&self, key: &[u8]) {
        let mut g = self.gate.lock().unwrap();
        g.closed = true;
        g.only = Some(key.to_vec());
    }

    /// Lets the writes held go on.
    pub fn open_gate(&self) {
        let mut g = self.gate.lock().unwrap();
        g.closed = false;
        g.only = None;
        drop(g);
        self.gate_moved.notify_all();
    }

    /// The next write of `key` (alone or with others) fails with
    /// `StateError::Unavailable`, having written nothing: a write whose
    /// answer never came, after the rule that made it passed.
    pub fn fail_next_write_on(&self, key: &[u8]) {
        *self.fail_next.lock().unwrap() = Some(key.to_vec());
    }

    /// Whether a write of `keys` is the one to fail (it fails once).
    fn fails<'k>(&self, mut keys: impl Iterator<Item = &'k [u8]>) -> Result<(), StateError> {
        let mut next = self.fail_next.lock().unwrap();
        match next.as_deref() {
            Some(key) if keys.any(|k| k == key) => {
                *next = None;
                Err(StateError::Unavailable(
                    "a write failed, as a test asked".into(),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Waits until `n` writes are held at the gate.
    pub fn wait_held(&self, n: usize) {
        let mut g = self.gate.lock().unwrap();
        while g.held < n {
            g = self.gate_moved.wait(g).unwrap();
        }
    }

    fn pass_gate<'k>(&self, mut keys: impl Iterator<Item = &'k [u8]>) {
        let mut g = self.gate.lock().unwrap();
        let held_here = match &g.only {
            None => true,
            Some(only) => keys.any(|k| k == only.as_slice()),
        };
        if g.closed && held_here {
            g.held += 1;
            self.gate_moved.notify_all();
            while g.closed {
                g = self.gate_moved.wait(g).unwrap();
            }
            g.held -= 1;
        }
    }
}

impl StateStore for SharedMemory {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        self.records.get(key)
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        self.pass_gate(std::iter::once(key));
        self.fails(std::iter::once(key))?;
        let _one = self.writing.lock().unwrap();
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.records.compare_and_set(key, expected, value)
    }

    fn is_local(&self, _key: &[u8]) -> bool {
        false
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError> {
        self.records.scan_prefix(prefix)
    }

    fn in_turns(&self, keys: &[&[u8]], update: &mut TurnsUpdate<'_>) {
        update(Some(&mut vec![None; keys.len()]))
    }

    fn compare_and_set_together(&self, writes: &[Together<'_>]) -> Result<Written, StateError> {
        self.pass_gate(writes.iter().map(|w| w.key));
        self.fails(writes.iter().map(|w| w.key))?;
        let _one = self.writing.lock().unwrap();
        self.writes.fetch_add(1, Ordering::SeqCst);
        let now: Vec<Option<Versioned>> = writes
            .iter()
            .map(|w| self.records.get(w.key))
            .collect::<Result<_, _>>()?;
        let matches = now
            .iter()
            .zip(writes)
            .all(|(n, w)| n.as_ref().map(|v| v.version) == w.expected);
        if !matches {
            return Ok(Written::Changed(now));
        }
        let mut versions = Vec::with_capacity(writes.len());
        for w in writes {
            let value = match &w.change {
                Change::Keep => {
                    versions.push(w.expected.unwrap_or(0));
                    continue;
                }
                Change::Put(v) => Some(v.clone()),
                Change::Delete => None,
            };
            let v = self.records.compare_and_set(w.key, w.expected, value)?;
            versions.push(v.unwrap_or(0));
        }
        Ok(Written::Done(versions))
    }
}
