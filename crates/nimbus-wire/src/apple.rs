//! Apple's SMB2 extensions, as macOS clients use them. Apple publishes no
//! specification: the layouts here are those macOS sends and expects (and
//! that Samba's vfs_fruit and smbtorture's vfs.fruit suite document by
//! behaviour). All integers of the AAPL context are little-endian; those of
//! an AfpInfo stream are big-endian, as on a Mac.

use crate::codec::{put_utf16le, Put, Reader, WireError, WireResult};

/// The create context macOS sends on its first CREATE of a connection to
/// learn what the server offers (name "AAPL").
pub const CONTEXT_NAME: &[u8] = b"AAPL";

/// Commands of the AAPL context; only the server query is served.
pub mod command {
    pub const SERVER_QUERY: u32 = 1;
    pub const RESOLVE_ID: u32 = 2;
}

/// What a server query asks for, and what its reply holds.
pub mod bitmap {
    pub const SERVER_CAPS: u64 = 0x1;
    pub const VOLUME_CAPS: u64 = 0x2;
    pub const MODEL_INFO: u64 = 0x4;
}

/// Server (and client) capabilities.
pub mod caps {
    /// Directory listings carry Finder information, the resource fork's
    /// size and the Unix mode (see [`ReaddirAttr`]).
    pub const SUPPORTS_READ_DIR_ATTR: u64 = 0x1;
    /// A copy-chunk request without chunks copies a whole file, its
    /// streams included.
    pub const SUPPORTS_OSX_COPYFILE: u64 = 0x2;
    pub const UNIX_BASED: u64 = 0x4;
    /// Security descriptors carry the Unix owner, group and mode as ACEs
    /// of the S-1-5-88 authority.
    pub const SUPPORTS_NFS_ACE: u64 = 0x8;
}

/// Volume capabilities.
pub mod volume_caps {
    pub const SUPPORT_RESOLVE_ID: u64 = 0x1;
    pub const CASE_SENSITIVE: u64 = 0x2;
    pub const FULL_SYNC: u64 = 0x4;
}

/// AAPL request: Command (4), Reserved (4), RequestBitmap (8),
/// ClientCapabilities (8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AaplRequest {
    pub command: u32,
    pub request_bitmap: u64,
    pub client_caps: u64,
}

impl AaplRequest {
    pub const LEN: usize = 24;

    /// A server query is exactly 24 bytes; anything else is refused (a
    /// resolve-id request carries other fields and is not served).
    pub fn parse(data: &[u8]) -> WireResult<AaplRequest> {
        if data.len() != Self::LEN {
            return Err(WireError::Invalid("AAPL context length"));
        }
        let mut r = Reader::new(data);
        let command = r.u32()?;
        r.skip(4)?;
        let request_bitmap = r.u64()?;
        let client_caps = r.u64()?;
        Ok(AaplRequest {
            command,
            request_bitmap,
            client_caps,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.command);
        out.put_u32(0);
        out.put_u64(self.request_bitmap);
        out.put_u64(self.client_caps);
    }
}

/// The reply to a server query: Command (4), Reserved (4), ReplyBitmap
/// (8), then only what the bitmap names, in this order: ServerCaps (8);
/// VolumeCaps (8); Pad (4), ModelStringLength in bytes (4) and the model
/// string in UTF-16LE without a terminator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AaplReply<'a> {
    pub reply_bitmap: u64,
    pub server_caps: u64,
    pub volume_caps: u64,
    /// The Mac model whose icon Finder shows for the server.
    pub model: &'a str,
}

impl AaplReply<'_> {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(command::SERVER_QUERY);
        out.put_u32(0);
        out.put_u64(self.reply_bitmap);
        if self.reply_bitmap & bitmap::SERVER_CAPS != 0 {
            out.put_u64(self.server_caps);
        }
        if self.reply_bitmap & bitmap::VOLUME_CAPS != 0 {
            out.put_u64(self.volume_caps);
        }
        if self.reply_bitmap & bitmap::MODEL_INFO != 0 {
            let mut model = Vec::with_capacity(self.model.len() * 2);
            put_utf16le(&mut model, self.model);
            out.put_u32(0);
            out.put_u32(model.len() as u32);
            out.extend_from_slice(&model);
        }
    }
}

/// The AFP_AfpInfo stream: 60 bytes that hold what the Apple Filing
/// Protocol kept per file, the 32 bytes of Finder information above all.
pub mod afp_info {
    pub const STREAM_NAME: &str = "AFP_AfpInfo";
    pub const SIZE: usize = 60;
    /// "AFP\0", big-endian 0x41465000.
    pub const SIGNATURE: [u8; 4] = *b"AFP\0";
    /// Version 1.0 as stored (big-endian 0x00000100).
    pub const VERSION: [u8; 4] = [0, 0, 1, 0];
    /// Backup time "never" (big-endian 0x80000000).
    pub const BACKUP_NEVER: [u8; 4] = [0x80, 0, 0, 0];
    /// Where the 32 bytes of Finder information start.
    pub const FINDER_INFO: usize = 16;
    pub const FINDER_INFO_LEN: usize = 32;

    /// The AfpInfo of a file that has none yet: signature, version and
    /// backup time, nothing else.
    pub fn empty() -> [u8; SIZE] {
        let mut b = [0u8; SIZE];
        b[0..4].copy_from_slice(&SIGNATURE);
        b[4..8].copy_from_slice(&VERSION);
        b[12..16].copy_from_slice(&BACKUP_NEVER);
        b
    }

    /// The Finder information of a stored AfpInfo, if it is one (signature
    /// and version right).
    pub fn finder_info(blob: &[u8]) -> Option<&[u8]> {
        if blob.len() < SIZE || blob[0..4] != SIGNATURE || blob[4..8] != VERSION {
            return None;
        }
        Some(&blob[FINDER_INFO..FINDER_INFO + FINDER_INFO_LEN])
    }
}

/// The resource fork's stream.
pub const RESOURCE_STREAM_NAME: &str = "AFP_Resource";

/// Seconds from the Unix epoch to 2000-01-01, the epoch of AFP dates.
pub const AFP_DATE_DELTA: i64 = 946_684_800;

/// What a FileIdBothDirectoryInformation entry (MS-FSCC 2.4.17) carries
/// instead of the short name once a client asked for READ_DIR_ATTR: EaSize
/// is the caller's maximal access, ShortNameLength is 24 and the 24 bytes
/// of ShortName hold the resource fork's size (u64 LE) and 16 bytes of
/// Finder information (type, creator, flags, extended flags, date added);
/// Reserved2 is the Unix mode (low 16 bits of st_mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaddirAttr {
    pub max_access: u32,
    pub resource_fork_size: u64,
    pub finder_info: [u8; 16],
    pub unix_mode: u16,
}

/// Offsets inside a FileIdBothDirectoryInformation entry.
const EA_SIZE_AT: usize = 64;
const SHORT_NAME_LENGTH_AT: usize = 68;
const SHORT_NAME_AT: usize = 70;
const RESERVED2_AT: usize = 94;
const FIXED_PART: usize = 104;

impl ReaddirAttr {
    /// Compresses an AfpInfo's 32 bytes of Finder information to the 16 a
    /// listing carries: type and creator (files only), Finder flags,
    /// extended flags, and the date the file was added (seconds since
    /// 2000, big-endian).
    pub fn compress_finder_info(finder_info: &[u8], is_dir: bool, date_added: u32) -> [u8; 16] {
        let mut out = [0u8; 16];
        if finder_info.len() >= afp_info::FINDER_INFO_LEN {
            if !is_dir {
                out[0..8].copy_from_slice(&finder_info[0..8]);
            }
            out[8..10].copy_from_slice(&finder_info[8..10]);
            out[10..12].copy_from_slice(&finder_info[24..26]);
        }
        out[12..16].copy_from_slice(&date_added.to_be_bytes());
        out
    }

    /// Writes these fields over an encoded FileIdBothDirectoryInformation
    /// entry (which starts `entry`); an entry too short is left alone.
    pub fn patch_id_both_entry(&self, entry: &mut [u8]) {
        if entry.len() < FIXED_PART {
            return;
        }
        entry[EA_SIZE_AT..EA_SIZE_AT + 4].copy_from_slice(&self.max_access.to_le_bytes());
        entry[SHORT_NAME_LENGTH_AT] = 24;
        entry[SHORT_NAME_LENGTH_AT + 1] = 0;
        entry[SHORT_NAME_AT..SHORT_NAME_AT + 8]
            .copy_from_slice(&self.resource_fork_size.to_le_bytes());
        entry[SHORT_NAME_AT + 8..SHORT_NAME_AT + 24].copy_from_slice(&self.finder_info);
        entry[RESERVED2_AT..RESERVED2_AT + 2].copy_from_slice(&self.unix_mode.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fscc::{encode_directory_entry, file_class, DirectoryEntry, FileInfo};

    #[test]
    fn a_server_query_round_trips_and_other_lengths_are_refused() {
        let req = AaplRequest {
            command: command::SERVER_QUERY,
            request_bitmap: 7,
            client_caps: 0x0D,
        };
        let mut b = Vec::new();
        req.encode(&mut b);
        assert_eq!(b.len(), AaplRequest::LEN);
        assert_eq!(AaplRequest::parse(&b).unwrap(), req);
        assert!(AaplRequest::parse(&b[..23]).is_err());
        b.push(0);
        assert!(AaplRequest::parse(&b).is_err());
    }

    #[test]
    fn a_full_reply_is_40_bytes_and_the_model() {
        let mut b = Vec::new();
        AaplReply {
            reply_bitmap: 7,
            server_caps: 0x0F,
            volume_caps: 0,
            model: "MacSamba",
        }
        .encode(&mut b);
        assert_eq!(b.len(), 56);
        assert_eq!(&b[0..4], &1u32.to_le_bytes());
        assert_eq!(&b[8..16], &7u64.to_le_bytes());
        assert_eq!(&b[16..24], &0x0Fu64.to_le_bytes());
        assert_eq!(&b[24..32], &0u64.to_le_bytes());
        assert_eq!(&b[36..40], &16u32.to_le_bytes());
        assert_eq!(&b[40..44], &[b'M', 0, b'a', 0]);
        // Only what was asked for follows the bitmap.
        let mut b = Vec::new();
        AaplReply {
            reply_bitmap: bitmap::SERVER_CAPS,
            server_caps: 0x0F,
            volume_caps: 0,
            model: "MacSamba",
        }
        .encode(&mut b);
        assert_eq!(b.len(), 24);
    }

    #[test]
    fn finder_info_is_found_only_in_a_signed_afp_info() {
        let mut blob = afp_info::empty();
        blob[16..24].copy_from_slice(b"SMB,OLE!");
        assert_eq!(&afp_info::finder_info(&blob).unwrap()[..8], b"SMB,OLE!");
        blob[0] = b'X';
        assert!(afp_info::finder_info(&blob).is_none());
        assert!(afp_info::finder_info(&blob[..59]).is_none());
    }

    #[test]
    fn readdir_attr_replaces_the_short_name_of_an_id_both_entry() {
        let info = FileInfo::default();
        let mut entry = Vec::new();
        encode_directory_entry(
            file_class::ID_BOTH_DIRECTORY,
            &DirectoryEntry {
                name: "test_aapl",
                short_name: "TEST_A~1",
                ea_size: 0,
                info: &info,
            },
            &mut entry,
        );
        let mut fi = [0u8; 32];
        fi[0..8].copy_from_slice(b"SMB,OLE!");
        fi[24..26].copy_from_slice(&[0xAB, 0xCD]);
        ReaddirAttr {
            max_access: 0x001F01FF,
            resource_fork_size: 3,
            finder_info: ReaddirAttr::compress_finder_info(&fi, false, 0x01020304),
            unix_mode: 0o100644,
        }
        .patch_id_both_entry(&mut entry);
        assert_eq!(&entry[64..68], &0x001F01FFu32.to_le_bytes());
        assert_eq!(entry[68], 24);
        assert_eq!(&entry[70..78], &3u64.to_le_bytes());
        assert_eq!(&entry[78..86], b"SMB,OLE!");
        assert_eq!(&entry[88..90], &[0xAB, 0xCD]);
        assert_eq!(&entry[90..94], &[1, 2, 3, 4]);
        assert_eq!(&entry[94..96], &0o100644u16.to_le_bytes());
        // The name is untouched.
        assert_eq!(&entry[104..106], &[b't', 0]);
    }
}
