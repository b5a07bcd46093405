//! The redb store's write-ahead journal: a file of fixed size, written
//! once with zeros, to which each durable commit appends one entry (the
//! batch of record changes) with one `fdatasync`. A redb commit writes and
//! flushes half a dozen pages scattered over its file, which on this
//! project's virtual disks costs three times what one appended page does;
//! the journal makes a durable commit cost about one page, and redb is
//! brought up to date without waiting for the disk, made durable only
//! when the journal is full (a checkpoint) and at start.
//!
//! Entries carry the journal's epoch, which the checkpoint raises in the
//! same redb transaction that makes everything before it durable: after a
//! checkpoint the old entries (still in the file until overwritten) are
//! of an older epoch and ignored. An entry whose checksum or sequence does
//! not follow (a torn write at a crash, or the zeros after the last entry)
//! ends the journal: what follows it was never acknowledged durable.
//!
//! Entry: magic "NJL1", epoch u32, sequence u64 (1, 2, ... within an
//! epoch), payload length u32, CRC-32 of the 16 bytes before it and the
//! payload; all little endian. Payload: change count u32, then per change
//! key length u16, key, kind u8 (1: value, 0: delete), and for a value its
//! version u64, length u32 and bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::store::Versioned;

const MAGIC: &[u8; 4] = b"NJL1";
const HEADER: usize = 24;

/// The journal's size on disk; a batch that does not fit goes straight to
/// redb (a checkpoint).
pub const CAPACITY: u64 = 4 << 20;

/// What one commit changes: each key's new value (None: deleted).
pub type Batch = BTreeMap<Vec<u8>, Option<Versioned>>;

pub struct Journal {
    file: File,
    pub epoch: u32,
    seq: u64,
    offset: u64,
}

impl Journal {
    /// Opens the journal file at `path`, creating it (zero-filled to
    /// `CAPACITY`, so that appends change no file metadata) when missing
    /// or short.
    pub fn open(path: &Path) -> std::io::Result<Journal> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        // 0600 whatever the umask, and narrowed if it was found wider: the
        // journal holds the same records as the store.
        {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        }
        let len = file.metadata()?.len();
        if len < CAPACITY {
            let zeros = vec![0u8; 1 << 20];
            let mut at = len;
            while at < CAPACITY {
                let n = zeros.len().min((CAPACITY - at) as usize);
                file.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            file.sync_all()?;
            if let Some(dir) = path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        Ok(Journal {
            file,
            epoch: 0,
            seq: 0,
            offset: 0,
        })
    }

    /// The batches of `epoch`, in order, up to the first entry that is
    /// not one (see the module text).
    pub fn read(&self, epoch: u32) -> std::io::Result<Vec<Batch>> {
        let mut buf = vec![0u8; CAPACITY as usize];
        self.file.read_exact_at(&mut buf, 0)?;
        let mut out = Vec::new();
        let mut at = 0usize;
        let mut seq = 1u64;
        while let Some((batch, len)) = decode_entry(&buf[at..], epoch, seq) {
            out.push(batch);
            at += len;
            seq += 1;
        }
        Ok(out)
    }

    /// Starts `epoch` at the beginning of the file (after the checkpoint
    /// that made everything before it durable).
    pub fn restart(&mut self, epoch: u32) {
        self.epoch = epoch;
        self.seq = 0;
        self.offset = 0;
    }

    /// Appends `batch` and waits for the disk. Ok(false): it does not fit;
    /// nothing was written, and a checkpoint must take it.
    pub fn append(&mut self, batch: &Batch) -> std::io::Result<bool> {
        let entry = encode_entry(batch, self.epoch, self.seq + 1);
        if self.offset + entry.len() as u64 > CAPACITY {
            return Ok(false);
        }
        self.file.write_all_at(&entry, self.offset)?;
        self.file.sync_data()?;
        self.offset += entry.len() as u64;
        self.seq += 1;
        Ok(true)
    }
}

fn encode_entry(batch: &Batch, epoch: u32, seq: u64) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    for (key, value) in batch {
        // Keys are the store's own (a few dozen bytes); a longer one
        // cannot be written, and is cut to what the field holds only in
        // a bug (debug builds stop there).
        debug_assert!(key.len() <= u16::MAX as usize);
        let key = &key[..key.len().min(u16::MAX as usize)];
        payload.extend_from_slice(&(key.len() as u16).to_le_bytes());
        payload.extend_from_slice(key);
        match value {
            Some(v) => {
                payload.push(1);
                payload.extend_from_slice(&v.version.to_le_bytes());
                payload.extend_from_slice(&(v.value.len() as u32).to_le_bytes());
                payload.extend_from_slice(&v.value);
            }
            None => payload.push(0),
        }
    }
    let mut entry = Vec::with_capacity(HEADER + payload.len());
    entry.extend_from_slice(MAGIC);
    entry.extend_from_slice(&epoch.to_le_bytes());
    entry.extend_from_slice(&seq.to_le_bytes());
    entry.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&entry[4..20]);
    crc.update(&payload);
    entry.extend_from_slice(&crc.finalize().to_le_bytes());
    entry.extend_from_slice(&payload);
    entry
}

/// The entry at the start of `buf` if it is entry `seq` of `epoch` and
/// whole, with its length.
fn decode_entry(buf: &[u8], epoch: u32, seq: u64) -> Option<(Batch, usize)> {
    let head = buf.get(..HEADER)?;
    if &head[..4] != MAGIC {
        return None;
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&head[8..16]);
    if u32_at(4) != epoch || u64::from_le_bytes(s) != seq {
        return None;
    }
    let len = u32_at(16) as usize;
    let payload = buf.get(HEADER..HEADER.checked_add(len)?)?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[4..20]);
    crc.update(payload);
    if crc.finalize() != u32_at(20) {
        return None;
    }
    Some((decode_payload(payload)?, HEADER + len))
}

fn decode_payload(mut p: &[u8]) -> Option<Batch> {
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (a, b) = (p.get(..n)?, p.get(n..)?);
        *p = b;
        Some(a)
    }
    let count = u32::from_le_bytes(take(&mut p, 4)?.try_into().ok()?);
    let mut batch = Batch::new();
    for _ in 0..count {
        let klen = u16::from_le_bytes(take(&mut p, 2)?.try_into().ok()?) as usize;
        let key = take(&mut p, klen)?.to_vec();
        let value = match take(&mut p, 1)?[0] {
            1 => {
                let version = u64::from_le_bytes(take(&mut p, 8)?.try_into().ok()?);
                let vlen = u32::from_le_bytes(take(&mut p, 4)?.try_into().ok()?) as usize;
                Some(Versioned {
                    version,
                    value: take(&mut p, vlen)?.to_vec(),
                })
            }
            0 => None,
            _ => return None,
        };
        batch.insert(key, value);
    }
    p.is_empty().then_some(batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change as the tests write it: key, and version and value or None.
    type Change<'a> = (&'a [u8], Option<(u64, &'a [u8])>);

    fn batch(items: &[Change<'_>]) -> Batch {
        items
            .iter()
            .map(|(k, v)| {
                (
                    k.to_vec(),
                    v.map(|(version, value)| Versioned {
                        version,
                        value: value.to_vec(),
                    }),
                )
            })
            .collect()
    }

    #[test]
    fn entries_round_trip_and_end_at_damage_or_another_epoch() {
        let dir = std::env::temp_dir().join(format!("nimbus-journal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j");
        let mut j = Journal::open(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), CAPACITY);
        j.restart(3);
        let a = batch(&[(b"k1", Some((5, b"one"))), (b"k2", None)]);
        let b = batch(&[(b"k1", Some((6, b""))), (b"k3", Some((7, b"three")))]);
        let c = batch(&[(b"k3", None)]);
        for x in [&a, &b, &c] {
            assert!(j.append(x).unwrap());
        }
        assert_eq!(j.read(3).unwrap(), vec![a.clone(), b.clone(), c.clone()]);
        // Another epoch's reader sees none of it.
        assert!(j.read(4).unwrap().is_empty());
        // A flipped byte in the second entry ends the journal before it.
        let first_len = encode_entry(&a, 3, 1).len() as u64;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xFF], first_len + HEADER as u64 + 2)
            .unwrap();
        assert_eq!(
            Journal::open(&path).unwrap().read(3).unwrap(),
            vec![a.clone()]
        );
        // A restart writes from the start again: old entries of the older
        // epoch beyond the new end are not read back.
        let mut j = Journal::open(&path).unwrap();
        j.restart(4);
        assert!(j.append(&c).unwrap());
        assert_eq!(j.read(4).unwrap(), vec![c.clone()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_batch_that_does_not_fit_is_refused_unwritten() {
        let dir = std::env::temp_dir().join(format!("nimbus-journal-full-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut j = Journal::open(&dir.join("j")).unwrap();
        j.restart(1);
        let big = vec![7u8; (CAPACITY / 3) as usize];
        let b = batch(&[(b"big", Some((1, &big)))]);
        assert!(j.append(&b).unwrap());
        assert!(j.append(&b).unwrap());
        assert!(!j.append(&b).unwrap());
        assert_eq!(j.read(1).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_payloads_are_not_batches() {
        assert!(decode_payload(&[]).is_none());
        assert!(decode_payload(&[1, 0, 0, 0, 200, 0]).is_none());
        assert!(decode_payload(&[1, 0, 0, 0, 1, 0, b'k', 9]).is_none());
        // Bytes left over after the last change.
        assert!(decode_payload(&[0, 0, 0, 0, 1]).is_none());
        assert_eq!(decode_payload(&[0, 0, 0, 0]), Some(Batch::new()));
    }
}
