//! What SMB keeps about a file that POSIX has no place for: the DOS
//! attributes other than READONLY, the creation time, and an explicitly set
//! change time (MS-FSCC 2.4.7 FILE_BASIC_INFORMATION). Stored in one
//! extended attribute so it follows the file through renames.

use nimbus_vfs::{FileHandle, Timespec, VfsError};
use nimbus_wire::fscc::attributes;

/// The extended attribute holding the encoded [`DosInfo`].
pub const XATTR_NAME: &str = "user.nimbus.dosinfo";

const VERSION: u8 = 1;
const ENCODED_LEN: usize = 1 + 4 + 8 + 8 + 8 + 4;

/// Attributes kept here that a client sets with the others (CREATE,
/// FileBasicInformation). DIRECTORY lives in the file type and a file's
/// READONLY in its permission bits (a directory's READONLY is kept here);
/// the others have no POSIX meaning. SPARSE_FILE is kept here too, but
/// only FSCTL_SET_SPARSE sets or clears it (MS-FSA 2.1.5.14.2 ignores it in
/// FileBasicInformation; a CREATE cannot make a file sparse).
pub const STORED_ATTRIBUTES: u32 = attributes::HIDDEN
    | attributes::SYSTEM
    | attributes::ARCHIVE
    | attributes::TEMPORARY
    | attributes::OFFLINE
    | attributes::NOT_CONTENT_INDEXED;

/// A change time set by a client. POSIX cannot set ctime, so the value is
/// reported only while the file's mtime is still the one seen when it was
/// set: any later data change moves mtime, and the real ctime (which then
/// is newer) takes over again, as it would on NTFS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeTime {
    pub filetime: u64,
    pub mtime_stamp: Timespec,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DosInfo {
    /// None: never set; files then report ARCHIVE, as a fresh NTFS file does.
    pub attributes: Option<u32>,
    /// FILETIME; None: use the birth time.
    pub create_time: Option<u64>,
    pub change_time: Option<ChangeTime>,
}

impl DosInfo {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(VERSION);
        // u32::MAX marks "attributes never set": it has invalid bits, so no
        // stored value can collide with it.
        out.extend_from_slice(&self.attributes.unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&self.create_time.unwrap_or(0).to_le_bytes());
        let (ft, stamp) = match self.change_time {
            Some(c) => (c.filetime, c.mtime_stamp),
            None => (0, Timespec { sec: 0, nsec: 0 }),
        };
        out.extend_from_slice(&ft.to_le_bytes());
        out.extend_from_slice(&stamp.sec.to_le_bytes());
        out.extend_from_slice(&stamp.nsec.to_le_bytes());
        out
    }

    /// Decodes a stored value; anything unrecognised reads as "nothing
    /// stored", since the attribute may have been written by another tool.
    pub fn decode(buf: &[u8]) -> DosInfo {
        if buf.len() != ENCODED_LEN || buf[0] != VERSION {
            return DosInfo::default();
        }
        let u32_at = |o: usize| {
            buf.get(o..o + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let u64_at = |o: usize| {
            buf.get(o..o + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        let attrs = u32_at(1).unwrap_or(u32::MAX);
        let create = u64_at(5).unwrap_or(0);
        let change = u64_at(13).unwrap_or(0);
        let sec = u64_at(21).unwrap_or(0) as i64;
        let nsec = u32_at(29).unwrap_or(0);
        DosInfo {
            attributes: (attrs != u32::MAX).then_some(
                attrs & (STORED_ATTRIBUTES | attributes::READONLY | attributes::SPARSE_FILE),
            ),
            create_time: (create != 0).then_some(create),
            change_time: (change != 0).then_some(ChangeTime {
                filetime: change,
                mtime_stamp: Timespec { sec, nsec },
            }),
        }
    }

    /// The stored change time, if the file has not changed since it was set.
    pub fn change_time_for(&self, mtime: Timespec) -> Option<u64> {
        self.change_time
            .filter(|c| c.mtime_stamp == mtime)
            .map(|c| c.filetime)
    }

    /// The attributes without READONLY and DIRECTORY, as a fresh object
    /// without stored information has them.
    pub fn stored_or_default(&self, is_dir: bool) -> u32 {
        self.attributes
            .unwrap_or(if is_dir { 0 } else { attributes::ARCHIVE })
    }

    pub fn load(handle: &FileHandle) -> DosInfo {
        match handle.get_xattr(XATTR_NAME) {
            Ok(Some(buf)) => DosInfo::decode(&buf),
            Ok(None) => DosInfo::default(),
            Err(e) => {
                tracing::debug!("reading DOS information: {e}");
                DosInfo::default()
            }
        }
    }

    pub fn save(&self, handle: &FileHandle) -> Result<(), VfsError> {
        handle.set_xattr(XATTR_NAME, &self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let d = DosInfo {
            attributes: Some(attributes::HIDDEN | attributes::ARCHIVE),
            create_time: Some(133_000_000_000_000_000),
            change_time: Some(ChangeTime {
                filetime: 133_000_000_100_000_000,
                mtime_stamp: Timespec {
                    sec: 1_700_000_000,
                    nsec: 5,
                },
            }),
        };
        assert_eq!(DosInfo::decode(&d.encode()), d);
        assert_eq!(
            DosInfo::decode(&DosInfo::default().encode()),
            DosInfo::default()
        );
        let zero = DosInfo {
            attributes: Some(0),
            ..DosInfo::default()
        };
        assert_eq!(DosInfo::decode(&zero.encode()), zero);
    }

    #[test]
    fn rejects_foreign_values() {
        assert_eq!(DosInfo::decode(b""), DosInfo::default());
        assert_eq!(DosInfo::decode(&[9u8; ENCODED_LEN]), DosInfo::default());
    }

    #[test]
    fn change_time_expires_with_mtime() {
        let stamp = Timespec { sec: 10, nsec: 1 };
        let d = DosInfo {
            change_time: Some(ChangeTime {
                filetime: 42,
                mtime_stamp: stamp,
            }),
            ..DosInfo::default()
        };
        assert_eq!(d.change_time_for(stamp), Some(42));
        assert_eq!(d.change_time_for(Timespec { sec: 11, nsec: 0 }), None);
        assert_eq!(d.stored_or_default(false), attributes::ARCHIVE);
        assert_eq!(d.stored_or_default(true), 0);
    }
}
