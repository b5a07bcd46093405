//! How per-file state is kept in a `StateStore`: each kind of record has
//! its own key prefix and a versioned encoding (the first byte names the
//! layout, so a node of a later release can still read what an earlier
//! one wrote, and a foreign or damaged value is an error, never a panic),
//! and every change is a read, a pure rule applied to the decoded value,
//! and a compare-and-set that retries when another writer came first.
//!
//! The same encodings go to every backend: memory on one node today, a
//! replicated database in a cluster.

use crate::byte_range::RangeLock;
use crate::caching::{BreakOrder, Breaking, FileCaching, Grant, Holder, LeaseId, OpenEntry};
use crate::file_key::FileKey;
use crate::store::{
    Change, Durability, Memo, StateError, StateStore, Together, Versioned, Written,
};

/// A value kept under one key.
pub trait Record: Default {
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, StateError>;
    /// An empty record is deleted rather than stored.
    fn is_empty(&self) -> bool;
}

/// Retries of a compare-and-set loop before giving up. Contention on one
/// file's record is short-lived, but a store that commits concurrent
/// writers together (redb's group commit) lets only one of them win each
/// round, so a writer may lose many rounds in a row; each loss yields.
const CAS_RETRIES: usize = 1024;

/// Applies `f` to the record under `key` atomically: `f` sees the current
/// value (the default when there is none) and may refuse with its error;
/// it may run more than once, so it must not act outside the record.
pub fn update<R: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    key: &[u8],
    f: impl FnMut(&mut R) -> Result<T, E>,
) -> Result<T, E> {
    update_with(store, key, Durability::Now, f)
}

/// `update` with the durability the write needs.
pub fn update_with<R: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    key: &[u8],
    durability: Durability,
    mut f: impl FnMut(&mut R) -> Result<T, E>,
) -> Result<T, E> {
    let mut answer = None;
    store.in_turn(key, &mut |memo| {
        answer = Some(update_in_turn(store, key, durability, &mut f, memo));
    });
    answer.unwrap_or_else(|| {
        Err(StateError::Unavailable("a store skipped an update's turn".into()).into())
    })
}

/// One update in its turn: from the record `memo` remembers, if any (it
/// may be stale: the compare-and-set proves it, and a rule that writes
/// nothing or refuses is decided again on the current record), else from
/// a read.
fn update_in_turn<R: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    key: &[u8],
    durability: Durability,
    f: &mut impl FnMut(&mut R) -> Result<T, E>,
    mut memo: Option<&mut Option<Memo>>,
) -> Result<T, E> {
    let remembered = match memo.as_deref() {
        Some(Some(m)) if m.key == key => Some(m.record.clone()),
        _ => None,
    };
    let mut fresh = remembered.is_none();
    let mut current = match remembered {
        Some(r) => r,
        None => store.get(key)?,
    };
    // Only a store that remembers needs the written record kept: no copy
    // of it otherwise (a single node's every open and close comes here).
    let remembering = memo.is_some();
    let mut remember = |record: Option<Versioned>| {
        if let Some(m) = memo.as_deref_mut() {
            *m = Some(Memo {
                key: key.to_vec(),
                record,
            });
        }
    };
    for _ in 0..CAS_RETRIES {
        let mut rec = match &current {
            Some(v) => R::decode(&v.value)?,
            None => R::default(),
        };
        let out = f(&mut rec);
        let value = (!rec.is_empty()).then(|| rec.encode());
        // A rule that refused, or changed nothing (a refused lock, a
        // refused acknowledgement), writes nothing: its answer stands if
        // it was given on the current record.
        let unchanged = current.as_ref().map(|v| v.value.as_slice()) == value.as_deref();
        if out.is_err() || unchanged {
            if !fresh {
                current = store.get(key)?;
                fresh = true;
                continue;
            }
            remember(current);
            return out;
        }
        let expected = current.as_ref().map(|v| v.version);
        let kept = if remembering { value.clone() } else { None };
        match store.compare_and_set_or_read(key, expected, value, durability)? {
            Ok(version) => {
                remember(kept.map(|value| Versioned { version, value }));
                return out;
            }
            Err(now) => {
                current = now;
                fresh = true;
            }
        }
        std::thread::yield_now();
    }
    Err(StateError::Unavailable("too much contention on one record".into()).into())
}

/// Applies `f` to two records of one file in one write (a CREATE's
/// share-mode check and its caching contention; a close's leaving of
/// both): where the store writes records one round trip each (a file
/// several cluster nodes share in etcd), this is one transaction where
/// two updates are two, and neither record can change between the two
/// rules. `f` sees both current records and may refuse; it may run more
/// than once. None: the store does not write these records together (one
/// node's store, a file a cluster node holds in memory, or one that moved
/// there meanwhile): nothing was written, and the caller updates each
/// record on its own (`update`).
pub fn update_both<A: Record, B: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    keys: [&[u8]; 2],
    f: impl FnMut(&mut A, &mut B) -> Result<T, E>,
) -> Option<Result<T, E>> {
    update_both_trusting(store, keys, |_| false, f).map(|r| r.map(|(out, _)| out))
}

/// How `update_both_trusting` came to its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decided {
    /// The records were written (a compare-and-set went through).
    Written,
    /// Nothing to write, proven on records read for it.
    Read,
    /// Nothing to write, decided on the records remembered, unread: the
    /// caller trusted them (`crate::grouped_opens`, joins without a read).
    Remembered,
}

/// `update_both`, where the caller may say of an answer that writes
/// nothing that it is right on the records this node remembers, however
/// stale (`trust_remembered`): it then stands without the read that would
/// prove it, while the node's lease is proven (`StateStore::lease_proven`,
/// asked in the records' turn). A refusal is still decided again on the
/// current records.
pub fn update_both_trusting<A: Record, B: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    keys: [&[u8]; 2],
    trust_remembered: impl Fn(&T) -> bool,
    mut f: impl FnMut(&mut A, &mut B) -> Result<T, E>,
) -> Option<Result<(T, Decided), E>> {
    update_both_reading(store, keys, None, trust_remembered, |a, b, _| f(a, b))
}

/// `update_both_trusting`, where the rules also read a third record of
/// the same file that they never change (`also`: a CREATE's admits ask
/// whether the file has byte-range locks). `f` gets its encoded value
/// (None: there is none, or no third record was named). Its version is
/// compared by the same compare-and-set as the other two, so the answer
/// stands on all three as they are at the write, in one transaction where
/// a read of it first would be a second.
pub fn update_both_reading<A: Record, B: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    keys: [&[u8]; 2],
    also: Option<&[u8]>,
    trust_remembered: impl Fn(&T) -> bool,
    mut f: impl FnMut(&mut A, &mut B, Option<&[u8]>) -> Result<T, E>,
) -> Option<Result<(T, Decided), E>> {
    let mut all: Vec<&[u8]> = keys.to_vec();
    all.extend(also);
    if all.iter().any(|k| store.is_local(k)) {
        return None;
    }
    let mut answer = None;
    store.in_turns(&all, &mut |memos| {
        answer =
            memos.and_then(|memos| both_in_turn(store, &all, &trust_remembered, &mut f, memos));
    });
    answer
}

/// `update_both_reading` in the records' turns (`keys`: the two records
/// the rules change, then any they only read): from what `memos`
/// remember where they do (proven by the compare-and-set; a refusal or
/// no change on a remembered record is decided again on the current
/// ones), else read.
fn both_in_turn<A: Record, B: Record, T, E: From<StateError>>(
    store: &dyn StateStore,
    keys: &[&[u8]],
    trust_remembered: &impl Fn(&T) -> bool,
    f: &mut impl FnMut(&mut A, &mut B, Option<&[u8]>) -> Result<T, E>,
    memos: &mut [Option<Memo>],
) -> Option<Result<(T, Decided), E>> {
    if memos.len() != keys.len() || !(2..=3).contains(&keys.len()) {
        return Some(Err(StateError::Unavailable(
            "a store gave an update the wrong turns".into(),
        )
        .into()));
    }
    // A first read by `get`, which takes a file nobody holds into this
    // node's memory; a read again of records remembered from etcd (a
    // shared file) in one request (`StateStore::get_together`).
    let read_again = || -> Result<Vec<Option<Versioned>>, StateError> {
        let now = store.get_together(keys)?;
        if now.len() != keys.len() {
            return Err(miscounted());
        }
        Ok(now)
    };
    let remembered: Vec<Option<Option<Versioned>>> = memos
        .iter()
        .zip(keys)
        .map(|(m, key)| match m {
            Some(m) if m.key == *key => Some(m.record.clone()),
            _ => None,
        })
        .collect();
    // Both records the rules change remembered, or all read, as one
    // answer decided on each of them must be; a read-only record
    // forgotten alone (by an update of its own) is read alone, and proven
    // with the remembered ones by the compare-and-set.
    let mut fresh = remembered[..2].iter().any(Option::is_none);
    let mut current = Vec::with_capacity(keys.len());
    for (key, r) in keys.iter().zip(remembered) {
        current.push(match r {
            Some(r) if !fresh => r,
            _ => match store.get(key) {
                Ok(r) => r,
                Err(e) => return Some(Err(e.into())),
            },
        });
    }
    for _ in 0..CAS_RETRIES {
        let (mut a, mut b) = match (
            decode_or_default::<A>(&current[0]),
            decode_or_default::<B>(&current[1]),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => return Some(Err(e.into())),
        };
        let read_only = current
            .get(2)
            .and_then(|r| r.as_ref())
            .map(|r| r.value.as_slice());
        let out = f(&mut a, &mut b, read_only);
        let mut values = vec![
            (!a.is_empty()).then(|| a.encode()),
            (!b.is_empty()).then(|| b.encode()),
        ];
        let unchanged =
            |i: usize| current[i].as_ref().map(|v| v.value.as_slice()) == values[i].as_deref();
        if out.is_err() || (unchanged(0) && unchanged(1)) {
            if !fresh && out.as_ref().is_ok_and(trust_remembered) && store.lease_proven() {
                return Some(out.map(|t| (t, Decided::Remembered)));
            }
            if !fresh {
                current = match read_again() {
                    Ok(c) => c,
                    Err(e) => return Some(Err(e.into())),
                };
                fresh = true;
                continue;
            }
            for (memo, (key, record)) in memos.iter_mut().zip(keys.iter().zip(current)) {
                *memo = Some(Memo {
                    key: key.to_vec(),
                    record,
                });
            }
            return Some(out.map(|t| (t, Decided::Read)));
        }
        // The encoded records move into the write, and back into the
        // memos once written: no copy of them is made. A record only
        // read is compared and kept.
        let kept = [unchanged(0), unchanged(1)];
        values.resize(keys.len(), None);
        let writes: Vec<Together<'_>> = values
            .into_iter()
            .enumerate()
            .map(|(i, value)| Together {
                key: keys[i],
                expected: current[i].as_ref().map(|v| v.version),
                change: match value {
                    _ if i >= 2 || kept[i] => Change::Keep,
                    Some(v) => Change::Put(v),
                    None => Change::Delete,
                },
            })
            .collect();
        match store.compare_and_set_together(&writes) {
            Err(e) => return Some(Err(e.into())),
            // Not written together after all (the file came into this
            // node's memory meanwhile): the caller updates each record.
            Ok(Written::NotTogether) => {
                memos.iter_mut().for_each(|m| *m = None);
                return None;
            }
            Ok(Written::Done(versions)) if versions.len() == keys.len() => {
                let written = writes.into_iter().zip(current).zip(versions);
                for (i, ((w, before), version)) in written.enumerate() {
                    let record = match w.change {
                        Change::Keep => before,
                        Change::Put(value) => Some(Versioned { version, value }),
                        Change::Delete => None,
                    };
                    memos[i] = Some(Memo {
                        key: keys[i].to_vec(),
                        record,
                    });
                }
                return Some(out.map(|t| (t, Decided::Written)));
            }
            Ok(Written::Changed(now)) if now.len() == keys.len() => {
                current = now;
                fresh = true;
            }
            Ok(_) => return Some(Err(miscounted())),
        }
        std::thread::yield_now();
    }
    Some(Err(StateError::Unavailable(
        "too much contention on one file's records".into(),
    )
    .into()))
}

fn miscounted<E: From<StateError>>() -> E {
    StateError::Unavailable("a store answered a write of several records with another count".into())
        .into()
}

fn decode_or_default<R: Record>(v: &Option<Versioned>) -> Result<R, StateError> {
    match v {
        Some(v) => R::decode(&v.value),
        None => Ok(R::default()),
    }
}

/// The record under `key`, or the default when there is none.
pub fn read<R: Record>(store: &dyn StateStore, key: &[u8]) -> Result<R, StateError> {
    match store.get(key)? {
        Some(v) => R::decode(&v.value),
        None => Ok(R::default()),
    }
}

impl FileKey {
    /// The key of one kind of record about this file: `prefix`, then
    /// device, inode and generation big-endian (a scan of the prefix lists
    /// files in order).
    pub fn record_key(&self, prefix: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(prefix.len() + 24);
        k.extend_from_slice(prefix);
        k.extend_from_slice(&self.dev.to_be_bytes());
        k.extend_from_slice(&self.ino.to_be_bytes());
        k.extend_from_slice(&self.gen.to_be_bytes());
        k
    }

    /// The file a record key under `prefix` is about (None: not such a
    /// key).
    pub fn from_record_key(prefix: &[u8], key: &[u8]) -> Option<FileKey> {
        let id: &[u8; 24] = key.strip_prefix(prefix)?.try_into().ok()?;
        let field =
            |i: usize| u64::from_be_bytes(id[i * 8..i * 8 + 8].try_into().unwrap_or_default());
        Some(FileKey {
            dev: field(0),
            ino: field(1),
            gen: field(2),
        })
    }
}

/// Key prefix of a file's oplocks and leases.
pub const CACHING_PREFIX: &[u8] = b"caching/";

/// Layout 1 of a caching record.
const CACHING_V1: u8 = 1;

impl Record for FileCaching {
    fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(16 + self.opens.len() * 9 + self.grants.len() * 80);
        w.push(CACHING_V1);
        put_len(&mut w, self.opens.len());
        for o in &self.opens {
            w.extend_from_slice(&o.open_id.to_le_bytes());
            w.push(o.stat as u8);
        }
        put_len(&mut w, self.grants.len());
        for g in &self.grants {
            put_holder(&mut w, g.holder);
            w.extend_from_slice(&g.state.to_le_bytes());
            match g.breaking {
                None => w.push(0),
                Some(b) => {
                    w.push(1);
                    w.extend_from_slice(&b.sent.to_le_bytes());
                    w.extend_from_slice(&b.required.to_le_bytes());
                }
            }
            w.extend_from_slice(&g.epoch.to_le_bytes());
            w.push(g.version);
            match g.parent_key {
                None => w.push(0),
                Some(k) => {
                    w.push(1);
                    w.extend_from_slice(&k);
                }
            }
            put_len(&mut w, g.opens.len());
            for o in &g.opens {
                w.extend_from_slice(&o.to_le_bytes());
            }
        }
        w
    }

    fn decode(bytes: &[u8]) -> Result<FileCaching, StateError> {
        let mut r = Cursor(bytes);
        if r.u8()? != CACHING_V1 {
            return Err(StateError::Corrupt("caching record layout"));
        }
        let n = r.count(9)?;
        let mut opens = Vec::with_capacity(n);
        for _ in 0..n {
            opens.push(OpenEntry {
                open_id: r.u64()?,
                stat: r.flag()?,
            });
        }
        // The smallest grant: oplock holder, no break, no parent, no opens.
        let n = r.count(22)?;
        let mut grants = Vec::with_capacity(n);
        for _ in 0..n {
            let holder = get_holder(&mut r)?;
            let state = r.u32()?;
            let breaking = if r.flag()? {
                Some(Breaking {
                    sent: r.u32()?,
                    required: r.u32()?,
                })
            } else {
                None
            };
            let epoch = r.u16()?;
            let version = r.u8()?;
            let parent_key = if r.flag()? { Some(r.array()?) } else { None };
            let k = r.count(8)?;
            let mut grant_opens = Vec::with_capacity(k);
            for _ in 0..k {
                grant_opens.push(r.u64()?);
            }
            grants.push(Grant {
                holder,
                state,
                breaking,
                epoch,
                version,
                parent_key,
                opens: grant_opens,
            });
        }
        if !r.0.is_empty() {
            return Err(StateError::Corrupt("caching record trailing bytes"));
        }
        Ok(FileCaching { opens, grants })
    }

    fn is_empty(&self) -> bool {
        FileCaching::is_empty(self)
    }
}

/// Key prefix of a file's byte-range locks.
pub const LOCKS_PREFIX: &[u8] = b"locks/";

/// Layout 1 of a byte-range lock record.
const LOCKS_V1: u8 = 1;

/// The byte-range locks granted on one file, in the order granted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockList(pub Vec<RangeLock>);

impl Record for LockList {
    fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(5 + self.0.len() * 25);
        w.push(LOCKS_V1);
        put_len(&mut w, self.0.len());
        for l in &self.0 {
            w.extend_from_slice(&l.owner.to_le_bytes());
            w.extend_from_slice(&l.offset.to_le_bytes());
            w.extend_from_slice(&l.length.to_le_bytes());
            w.push(l.exclusive as u8);
        }
        w
    }

    fn decode(bytes: &[u8]) -> Result<LockList, StateError> {
        let mut r = Cursor(bytes);
        if r.u8()? != LOCKS_V1 {
            return Err(StateError::Corrupt("lock record layout"));
        }
        let n = r.count(25)?;
        let mut locks = Vec::with_capacity(n);
        for _ in 0..n {
            locks.push(RangeLock {
                owner: r.u64()?,
                offset: r.u64()?,
                length: r.u64()?,
                exclusive: r.flag()?,
            });
        }
        if !r.0.is_empty() {
            return Err(StateError::Corrupt("lock record trailing bytes"));
        }
        Ok(LockList(locks))
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Layout 1 of a break sent to another cluster node.
const BREAK_V1: u8 = 1;

/// A break for open `open_id`, to be delivered by the node that serves it
/// (a cluster node's message to another): the open, then the order.
pub fn encode_break(open_id: u64, b: &BreakOrder) -> Vec<u8> {
    let mut w = Vec::with_capacity(64);
    w.push(BREAK_V1);
    w.extend_from_slice(&open_id.to_le_bytes());
    put_holder(&mut w, b.holder);
    w.extend_from_slice(&b.from.to_le_bytes());
    w.extend_from_slice(&b.to.to_le_bytes());
    w.push(b.ack_required as u8);
    w.extend_from_slice(&b.epoch.to_le_bytes());
    w.push(b.version);
    w
}

/// The open and order `encode_break` wrote.
pub fn decode_break(bytes: &[u8]) -> Result<(u64, BreakOrder), StateError> {
    let mut r = Cursor(bytes);
    if r.u8()? != BREAK_V1 {
        return Err(StateError::Corrupt("break message layout"));
    }
    let open_id = r.u64()?;
    let holder = get_holder(&mut r)?;
    let order = BreakOrder {
        holder,
        from: r.u32()?,
        to: r.u32()?,
        ack_required: r.flag()?,
        epoch: r.u16()?,
        version: r.u8()?,
    };
    if !r.0.is_empty() {
        return Err(StateError::Corrupt("break message trailing bytes"));
    }
    Ok((open_id, order))
}

fn put_holder(w: &mut Vec<u8>, holder: Holder) {
    match holder {
        Holder::Oplock(open_id) => {
            w.push(0);
            w.extend_from_slice(&open_id.to_le_bytes());
        }
        Holder::Lease(id) => {
            w.push(1);
            w.extend_from_slice(&id.client);
            w.extend_from_slice(&id.key);
        }
    }
}

fn get_holder(r: &mut Cursor<'_>) -> Result<Holder, StateError> {
    Ok(match r.u8()? {
        0 => Holder::Oplock(r.u64()?),
        1 => Holder::Lease(LeaseId {
            client: r.array()?,
            key: r.array()?,
        }),
        _ => return Err(StateError::Corrupt("caching record holder")),
    })
}

pub(crate) fn put_len(w: &mut Vec<u8>, n: usize) {
    w.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes());
}

/// Reads a record front to back; running out is `Corrupt`, never a panic.
pub struct Cursor<'a>(pub &'a [u8]);

impl Cursor<'_> {
    pub fn take(&mut self, n: usize) -> Result<&[u8], StateError> {
        if self.0.len() < n {
            return Err(StateError::Corrupt("record truncated"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], StateError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, StateError> {
        Ok(self.array::<1>()?[0])
    }

    pub fn flag(&mut self) -> Result<bool, StateError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(StateError::Corrupt("record flag")),
        }
    }

    pub fn u16(&mut self) -> Result<u16, StateError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> Result<u32, StateError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, StateError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items at least `min_size` bytes each: one the rest of
    /// the record cannot hold is refused before anything is allocated.
    pub fn count(&mut self, min_size: usize) -> Result<usize, StateError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size) > self.0.len() {
            return Err(StateError::Corrupt("record count"));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caching::{OpenAsk, Want, HANDLE, OPLOCK_BATCH, READ, WRITE};
    use crate::MemoryStore;

    #[test]
    fn a_break_message_reads_back_and_damage_is_an_error() {
        let orders = [
            BreakOrder {
                holder: Holder::Oplock(7 << 40 | 3),
                from: READ | WRITE | HANDLE,
                to: READ,
                ack_required: true,
                epoch: 0,
                version: 0,
            },
            BreakOrder {
                holder: Holder::Lease(LeaseId {
                    client: [9; 16],
                    key: [4; 16],
                }),
                from: READ | HANDLE,
                to: 0,
                ack_required: true,
                epoch: 513,
                version: 2,
            },
        ];
        for b in orders {
            let bytes = encode_break(42, &b);
            assert_eq!(decode_break(&bytes).unwrap(), (42, b));
            for cut in 0..bytes.len() {
                assert!(decode_break(&bytes[..cut]).is_err());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(decode_break(&longer).is_err());
        }
        assert!(decode_break(&[2, 0, 0]).is_err());
    }

    #[test]
    fn a_record_key_names_its_file_again() {
        let f = FileKey::new(0x0102_0304_0506_0708, u64::MAX - 5, 0x1122_3344_5566_7788);
        let key = f.record_key(LOCKS_PREFIX);
        assert_eq!(FileKey::from_record_key(LOCKS_PREFIX, &key), Some(f));
        assert_eq!(FileKey::from_record_key(CACHING_PREFIX, &key), None);
        assert_eq!(FileKey::from_record_key(LOCKS_PREFIX, &key[..20]), None);
    }

    fn sample() -> FileCaching {
        let mut f = FileCaching::default();
        let ask = |open_id, want| OpenAsk {
            open_id,
            access: 0x3,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want,
        };
        f.admit(&ask(
            1,
            Want::Lease {
                id: LeaseId {
                    client: [7; 16],
                    key: [9; 16],
                },
                state: READ | WRITE | HANDLE,
                version: 2,
                parent_key: Some([3; 16]),
                epoch: 5,
            },
        ));
        // A second open breaks the lease: a break under way is recorded.
        f.contend(&ask(2, Want::Oplock(OPLOCK_BATCH)));
        f.admit(&ask(2, Want::Oplock(OPLOCK_BATCH)));
        f.opens.push(OpenEntry {
            open_id: 3,
            stat: true,
        });
        f
    }

    #[test]
    fn caching_record_round_trips() {
        let f = sample();
        assert!(f.grants.iter().any(|g| g.breaking.is_some()));
        let bytes = f.encode();
        assert_eq!(bytes[0], CACHING_V1);
        assert_eq!(FileCaching::decode(&bytes).unwrap(), f);
        assert_eq!(
            FileCaching::decode(&FileCaching::default().encode()).unwrap(),
            FileCaching::default()
        );
    }

    #[test]
    fn damaged_caching_records_are_errors_not_panics() {
        let bytes = sample().encode();
        // Every truncation, an unknown layout, trailing bytes, a huge count.
        for n in 0..bytes.len() {
            assert!(FileCaching::decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        let mut v = bytes.clone();
        v[0] = 2;
        assert!(FileCaching::decode(&v).is_err());
        let mut v = bytes.clone();
        v.push(0);
        assert!(FileCaching::decode(&v).is_err());
        let mut v = vec![CACHING_V1];
        v.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(FileCaching::decode(&v).is_err());
    }

    #[test]
    fn lock_record_round_trips_and_refuses_damage() {
        let list = LockList(vec![
            RangeLock {
                owner: 1,
                offset: u64::MAX,
                length: 0,
                exclusive: true,
            },
            RangeLock {
                owner: 2,
                offset: 10,
                length: 5,
                exclusive: false,
            },
        ]);
        let bytes = list.encode();
        assert_eq!(LockList::decode(&bytes).unwrap(), list);
        for n in 0..bytes.len() {
            assert!(LockList::decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        let mut v = bytes.clone();
        *v.last_mut().unwrap() = 2; // not a flag
        assert!(LockList::decode(&v).is_err());
    }

    #[test]
    fn update_applies_through_compare_and_set_and_deletes_empty_records() {
        let store = MemoryStore::new();
        let key = FileKey::new(1, 2, 3).record_key(CACHING_PREFIX);
        update::<FileCaching, _, StateError>(&store, &key, |f| {
            *f = sample();
            Ok(())
        })
        .unwrap();
        assert_eq!(read::<FileCaching>(&store, &key).unwrap(), sample());
        // A writer that raced in between is seen: the rule runs again on
        // its value.
        let mut runs = 0;
        update::<FileCaching, _, StateError>(&store, &key, |f| {
            runs += 1;
            if runs == 1 {
                let v = store.get(&key).unwrap().unwrap();
                store
                    .compare_and_set(&key, Some(v.version), Some(v.value))
                    .unwrap();
            }
            f.opens.clear();
            f.grants.clear();
            Ok(())
        })
        .unwrap();
        assert_eq!(runs, 2);
        assert_eq!(store.get(&key).unwrap(), None);
        // A rule that changes nothing leaves the version alone.
        update::<FileCaching, _, StateError>(&store, &key, |f| {
            *f = sample();
            Ok(())
        })
        .unwrap();
        let before = store.get(&key).unwrap().unwrap().version;
        update::<FileCaching, _, StateError>(&store, &key, |_| Ok(())).unwrap();
        assert_eq!(store.get(&key).unwrap().unwrap().version, before);
    }
}
