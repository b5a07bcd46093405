//! The record of a persistent open, or of a durable one a cluster node
//! handed back when it left: everything a server needs to rebuild the open
//! after a restart, or on another node, so that its client can reclaim it
//! (MS-SMB2 3.3.5.9.12). Never a session key: the client authenticates
//! again and only the owner's SID is kept.
//!
//! One versioned encoding (a layout byte first), shared by every store
//! backend like the other records; a damaged or foreign value decodes to
//! an error, never a panic or a default.

use crate::byte_range::LockRange;
use crate::caching::LeaseId;
use crate::file_key::FileKey;
use crate::records::{put_len, Cursor, Record};
use crate::store::StateError;

/// Key prefix of open records: `open/` then the open id, big-endian (a scan
/// lists them in id order).
pub const OPEN_PREFIX: &[u8] = b"open/";

/// Layout 1 of an open record: a persistent open's.
const OPEN_V1: u8 = 1;
/// Layout 2: layout 1 and then whether the open is persistent. Written only
/// for opens that are not (durable opens a leaving node handed back), so a
/// persistent open's record of a file of unknown generation reads the same
/// to a node that knows layout 1 alone. The generation section (2026-12-05)
/// is one such a node does not know: it refuses the record, so going back
/// to a release before it loses the persistent handles recorded since
/// (docs/CLUSTER.md, "Upgrades").
const OPEN_V2: u8 = 2;

/// Strings (share name, path, owner SID and name) longer than this are refused:
/// no name a server accepts comes near it.
const MAX_STRING: usize = 64 * 1024;

/// What the open caches, as its client will find it on reclaim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Caching {
    #[default]
    Nothing,
    /// An oplock of this level (MS-SMB2 2.2.13 RequestedOplockLevel).
    Oplock(u8),
    Lease {
        id: LeaseId,
        state: u32,
        epoch: u16,
        version: u8,
    },
}

/// Whether the client has been told about the open: a record written but
/// never answered (the server stopped in between) is dropped at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Answered {
    #[default]
    Not,
    Yes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableOpen {
    pub open_id: u64,
    pub file: FileKey,
    pub share: String,
    /// Share-relative, '/'-separated.
    pub path: String,
    pub access: u32,
    pub share_access: u32,
    /// CreateOptions kept with the open (write-through, delete-on-close...).
    pub mode: u32,
    pub position: u64,
    pub delete_on_close: bool,
    /// The owner's SID (`S-1-...`): only a session whose token's user it is
    /// may reclaim the open. A layout-1 record written before owners were
    /// SIDs holds a user name here, which no session's SID equals.
    pub owner_sid: String,
    /// The owner's user name, for logs and listings only.
    pub owner_name: String,
    pub client_guid: [u8; 16],
    pub create_guid: [u8; 16],
    /// Reclaim window after a restart or a lost connection.
    pub timeout_ms: u32,
    pub caching: Caching,
    pub locks: Vec<LockRange>,
    pub lock_sequences: [u8; 64],
    pub create_action: u8,
    pub answered: Answered,
    /// A persistent open (kept whatever breaks it is sent), or a durable
    /// one (closed by a break that reaches it while its client is away).
    pub persistent: bool,
    /// Written just before the file (or a directory above it) is renamed
    /// from the first path to the second: a crash may have left the rename
    /// done or not, so a start that does not find `path` looks for it
    /// renamed (`moved_path`). Encoded after everything else, tag 1.
    pub renaming: Option<(String, String)>,
}

impl Default for DurableOpen {
    fn default() -> Self {
        DurableOpen {
            open_id: 0,
            file: FileKey::new(0, 0, 0),
            share: String::new(),
            path: String::new(),
            access: 0,
            share_access: 0,
            mode: 0,
            position: 0,
            delete_on_close: false,
            owner_sid: String::new(),
            owner_name: String::new(),
            client_guid: [0; 16],
            create_guid: [0; 16],
            timeout_ms: 0,
            caching: Caching::Nothing,
            locks: Vec::new(),
            lock_sequences: [0xFF; 64],
            create_action: 0,
            answered: Answered::Not,
            persistent: true,
            renaming: None,
        }
    }
}

impl DurableOpen {
    pub fn key(open_id: u64) -> Vec<u8> {
        let mut k = OPEN_PREFIX.to_vec();
        k.extend_from_slice(&open_id.to_be_bytes());
        k
    }

    /// `path` as the rename in progress (`renaming`) would leave it, if it
    /// is the renamed path or beneath it.
    pub fn moved_path(&self) -> Option<String> {
        let (from, to) = self.renaming.as_ref()?;
        if self.path == *from {
            return Some(to.clone());
        }
        let rest = self.path.strip_prefix(from.as_str())?.strip_prefix('/')?;
        Some(format!("{to}/{rest}"))
    }
}

/// The tag of the optional `renaming` section.
const RENAMING: u8 = 1;
/// The tag of the file's generation (`FileKey::gen`), written when it is
/// not 0; a record written before it was kept reads as generation 0,
/// which a reopen does not check.
const GENERATION: u8 = 2;

fn put_str(w: &mut Vec<u8>, s: &str) {
    put_len(w, s.len());
    w.extend_from_slice(s.as_bytes());
}

fn get_str(r: &mut Cursor<'_>) -> Result<String, StateError> {
    let n = r.count(1)?;
    if n > MAX_STRING {
        return Err(StateError::Corrupt("open record string length"));
    }
    String::from_utf8(r.take(n)?.to_vec()).map_err(|_| StateError::Corrupt("open record string"))
}

impl Record for DurableOpen {
    fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(256 + self.path.len() + self.locks.len() * 17);
        w.push(if self.persistent { OPEN_V1 } else { OPEN_V2 });
        w.extend_from_slice(&self.open_id.to_le_bytes());
        w.extend_from_slice(&self.file.dev.to_le_bytes());
        w.extend_from_slice(&self.file.ino.to_le_bytes());
        put_str(&mut w, &self.share);
        put_str(&mut w, &self.path);
        w.extend_from_slice(&self.access.to_le_bytes());
        w.extend_from_slice(&self.share_access.to_le_bytes());
        w.extend_from_slice(&self.mode.to_le_bytes());
        w.extend_from_slice(&self.position.to_le_bytes());
        w.push(self.delete_on_close as u8);
        put_str(&mut w, &self.owner_sid);
        put_str(&mut w, &self.owner_name);
        w.extend_from_slice(&self.client_guid);
        w.extend_from_slice(&self.create_guid);
        w.extend_from_slice(&self.timeout_ms.to_le_bytes());
        match self.caching {
            Caching::Nothing => w.push(0),
            Caching::Oplock(level) => {
                w.push(1);
                w.push(level);
            }
            Caching::Lease {
                id,
                state,
                epoch,
                version,
            } => {
                w.push(2);
                w.extend_from_slice(&id.client);
                w.extend_from_slice(&id.key);
                w.extend_from_slice(&state.to_le_bytes());
                w.extend_from_slice(&epoch.to_le_bytes());
                w.push(version);
            }
        }
        put_len(&mut w, self.locks.len());
        for l in &self.locks {
            w.extend_from_slice(&l.offset.to_le_bytes());
            w.extend_from_slice(&l.length.to_le_bytes());
            w.push(l.exclusive as u8);
        }
        w.extend_from_slice(&self.lock_sequences);
        w.push(self.create_action);
        w.push(match self.answered {
            Answered::Not => 0,
            Answered::Yes => 1,
        });
        if !self.persistent {
            w.push(0);
        }
        if let Some((from, to)) = &self.renaming {
            w.push(RENAMING);
            put_str(&mut w, from);
            put_str(&mut w, to);
        }
        if self.file.gen != 0 {
            w.push(GENERATION);
            w.extend_from_slice(&self.file.gen.to_le_bytes());
        }
        w
    }

    fn decode(bytes: &[u8]) -> Result<DurableOpen, StateError> {
        let mut r = Cursor(bytes);
        let layout = r.u8()?;
        if layout != OPEN_V1 && layout != OPEN_V2 {
            return Err(StateError::Corrupt("open record layout"));
        }
        let open_id = r.u64()?;
        let mut file = FileKey {
            dev: r.u64()?,
            ino: r.u64()?,
            gen: 0,
        };
        let share = get_str(&mut r)?;
        let path = get_str(&mut r)?;
        let access = r.u32()?;
        let share_access = r.u32()?;
        let mode = r.u32()?;
        let position = r.u64()?;
        let delete_on_close = r.flag()?;
        let owner_sid = get_str(&mut r)?;
        let owner_name = get_str(&mut r)?;
        let client_guid = r.array()?;
        let create_guid = r.array()?;
        let timeout_ms = r.u32()?;
        let caching = match r.u8()? {
            0 => Caching::Nothing,
            1 => Caching::Oplock(r.u8()?),
            2 => Caching::Lease {
                id: LeaseId {
                    client: r.array()?,
                    key: r.array()?,
                },
                state: r.u32()?,
                epoch: r.u16()?,
                version: r.u8()?,
            },
            _ => return Err(StateError::Corrupt("open record caching")),
        };
        let n = r.count(17)?;
        let mut locks = Vec::with_capacity(n);
        for _ in 0..n {
            locks.push(LockRange {
                offset: r.u64()?,
                length: r.u64()?,
                exclusive: r.flag()?,
            });
        }
        let lock_sequences = r.array()?;
        let create_action = r.u8()?;
        let answered = match r.u8()? {
            0 => Answered::Not,
            1 => Answered::Yes,
            _ => return Err(StateError::Corrupt("open record answered")),
        };
        let persistent = layout == OPEN_V1 || r.flag()?;
        // Optional sections, each at most once, in tag order.
        let mut renaming = None;
        let mut last_tag = 0;
        while let Some(&tag) = r.0.first() {
            if tag <= last_tag {
                return Err(StateError::Corrupt("open record section order"));
            }
            r.u8()?;
            match tag {
                RENAMING => renaming = Some((get_str(&mut r)?, get_str(&mut r)?)),
                GENERATION => file.gen = r.u64()?,
                _ => return Err(StateError::Corrupt("open record section")),
            }
            last_tag = tag;
        }
        if !r.0.is_empty() {
            return Err(StateError::Corrupt("open record trailing bytes"));
        }
        Ok(DurableOpen {
            open_id,
            file,
            share,
            path,
            access,
            share_access,
            mode,
            position,
            delete_on_close,
            owner_sid,
            owner_name,
            client_guid,
            create_guid,
            timeout_ms,
            caching,
            locks,
            lock_sequences,
            create_action,
            answered,
            persistent,
            renaming,
        })
    }

    /// An open record is never empty: it is deleted when its open closes.
    fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records;
    use crate::{MemoryStore, StateStore};

    fn sample() -> DurableOpen {
        let mut seqs = [0xFF; 64];
        seqs[0] = 3;
        seqs[63] = 15;
        DurableOpen {
            open_id: 0x0102_0304_0506_0708,
            file: FileKey::new(2049, 77, 0x5eed),
            share: "ca".into(),
            path: "dir/Ledger Ü.xlsx".into(),
            access: 0x0012_019F,
            share_access: 0x3,
            mode: 0x20,
            position: 4096,
            delete_on_close: false,
            owner_sid: "alice".into(),
            owner_name: "NIMBUS".into(),
            client_guid: [7; 16],
            create_guid: [9; 16],
            timeout_ms: 60_000,
            caching: Caching::Lease {
                id: LeaseId {
                    client: [7; 16],
                    key: [5; 16],
                },
                state: 0x3,
                epoch: 4,
                version: 2,
            },
            locks: vec![
                LockRange {
                    offset: 0,
                    length: 100,
                    exclusive: true,
                },
                LockRange {
                    offset: u64::MAX - 1,
                    length: 1,
                    exclusive: false,
                },
            ],
            lock_sequences: seqs,
            create_action: 2,
            answered: Answered::Yes,
            persistent: true,
            renaming: None,
        }
    }

    #[test]
    fn round_trips() {
        let r = sample();
        assert_eq!(DurableOpen::decode(&r.encode()).unwrap(), r);
        let plain = DurableOpen {
            caching: Caching::Oplock(9),
            locks: vec![],
            answered: Answered::Not,
            ..sample()
        };
        assert_eq!(DurableOpen::decode(&plain.encode()).unwrap(), plain);
        let nothing = DurableOpen::default();
        assert_eq!(DurableOpen::decode(&nothing.encode()).unwrap(), nothing);
        let handed_back = DurableOpen {
            persistent: false,
            ..sample()
        };
        let bytes = handed_back.encode();
        assert_eq!(bytes[0], OPEN_V2);
        assert_eq!(DurableOpen::decode(&bytes).unwrap(), handed_back);
    }

    /// A record of a file with no generation is written as before
    /// generations were kept, and reads as one; the generation section
    /// comes after the rename's, once.
    #[test]
    fn the_generation_is_an_optional_section_after_the_rename() {
        let unknown = DurableOpen {
            file: FileKey {
                gen: 0,
                ..sample().file
            },
            ..sample()
        };
        let bytes = unknown.encode();
        assert_eq!(bytes.len() + 9, sample().encode().len());
        assert_eq!(DurableOpen::decode(&bytes).unwrap(), unknown);
        let moving = DurableOpen {
            renaming: Some(("a".into(), "b".into())),
            ..sample()
        };
        let bytes = moving.encode();
        assert_eq!(DurableOpen::decode(&bytes).unwrap(), moving);
        // The generation twice, or before the rename: refused.
        let mut twice = sample().encode();
        twice.extend_from_slice(&[GENERATION, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert!(DurableOpen::decode(&twice).is_err());
        // The rename's section: its tag and two strings of one byte.
        let gen_at = bytes.len() - 9;
        let rename_at = gen_at - (1 + 2 * (4 + 1));
        assert_eq!(bytes[rename_at], RENAMING);
        let mut swapped = bytes[..rename_at].to_vec();
        swapped.extend_from_slice(&bytes[gen_at..]);
        swapped.extend_from_slice(&bytes[rename_at..gen_at]);
        assert!(matches!(
            DurableOpen::decode(&swapped),
            Err(StateError::Corrupt("open record section order"))
        ));
    }

    /// A record written while its file was being renamed keeps both
    /// names, and finds the file under the new one, or beneath it.
    #[test]
    fn a_rename_in_progress_round_trips_and_moves_the_path() {
        let moving = DurableOpen {
            path: "dir/Ledger Ü.xlsx".into(),
            renaming: Some(("dir/Ledger Ü.xlsx".into(), "dir/old.xlsx".into())),
            ..sample()
        };
        assert_eq!(DurableOpen::decode(&moving.encode()).unwrap(), moving);
        assert_eq!(moving.moved_path().as_deref(), Some("dir/old.xlsx"));
        let beneath = DurableOpen {
            path: "a/b/c.txt".into(),
            renaming: Some(("a".into(), "z".into())),
            persistent: false,
            ..sample()
        };
        assert_eq!(DurableOpen::decode(&beneath.encode()).unwrap(), beneath);
        assert_eq!(beneath.moved_path().as_deref(), Some("z/b/c.txt"));
        let elsewhere = DurableOpen {
            path: "ab/c.txt".into(),
            renaming: Some(("a".into(), "z".into())),
            ..sample()
        };
        assert_eq!(elsewhere.moved_path(), None);
        assert_eq!(sample().moved_path(), None);
    }

    /// A persistent open's record of a file of unknown generation keeps
    /// layout 1 byte for byte: a node that knows no later layout reads it.
    /// (One with a generation carries a section such a node refuses.)
    #[test]
    fn a_persistent_record_keeps_layout_1() {
        let mut r = sample();
        r.file.gen = 0;
        let bytes = r.encode();
        assert_eq!(bytes[0], OPEN_V1);
        let v2 = DurableOpen {
            persistent: false,
            ..r
        }
        .encode();
        assert_eq!(&v2[1..], [&bytes[1..], &[0u8][..]].concat());
    }

    #[test]
    fn damage_is_an_error_never_a_panic() {
        let bytes = sample().encode();
        // Cut before the optional generation section, the record reads
        // as one of an unknown generation; cut anywhere else, it is an
        // error.
        let whole_without_gen = bytes.len() - 9;
        for n in 0..bytes.len() {
            if n == whole_without_gen {
                assert_eq!(DurableOpen::decode(&bytes[..n]).unwrap().file.gen, 0);
                continue;
            }
            assert!(DurableOpen::decode(&bytes[..n]).is_err(), "{n} bytes");
        }
        let mut v = bytes.clone();
        v[0] = 3;
        assert!(DurableOpen::decode(&v).is_err(), "unknown layout");
        let mut v = bytes.clone();
        v[0] = OPEN_V2;
        assert!(
            DurableOpen::decode(&v).is_err(),
            "layout 2 without its flag"
        );
        let mut v = bytes.clone();
        v.push(0);
        assert!(DurableOpen::decode(&v).is_err(), "trailing bytes");
        // A string length beyond the record (or beyond any real name).
        let mut v = vec![OPEN_V1];
        v.extend_from_slice(&[0; 24]);
        v.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(DurableOpen::decode(&v).is_err(), "huge string");
        // Every single-byte change decodes to an error or to some record,
        // never a panic.
        for i in 0..bytes.len() {
            let mut v = bytes.clone();
            v[i] ^= 0xA5;
            let _ = DurableOpen::decode(&v);
        }
    }

    #[test]
    fn kept_in_a_store_by_open_id() {
        let store = MemoryStore::new();
        let r = sample();
        let key = DurableOpen::key(r.open_id);
        assert!(key.starts_with(OPEN_PREFIX));
        records::update::<DurableOpen, _, StateError>(&store, &key, |rec| {
            *rec = r.clone();
            Ok(())
        })
        .unwrap();
        assert_eq!(records::read::<DurableOpen>(&store, &key).unwrap(), r);
        let listed = store.scan_prefix(OPEN_PREFIX).unwrap();
        assert_eq!(listed.len(), 1);
    }
}
