//! MS-SMB2 2.2.35 SMB2 CHANGE_NOTIFY Request, 2.2.36 SMB2 CHANGE_NOTIFY
//! Response, and the MS-FSCC 2.4.42 FILE_NOTIFY_INFORMATION entries the
//! response carries.

use crate::codec::{body_buffer, HEADER_SIZE};
use crate::codec::{put_utf16le, utf16le_to_string, Put, Reader, WireError, WireResult};
use crate::file_id::FileId;

/// MS-SMB2 2.2.35 Flags: report changes anywhere beneath the directory,
/// not only in it.
pub const WATCH_TREE: u16 = 0x0001;

/// MS-SMB2 2.2.35 CompletionFilter bits (the same values as MS-FSCC's
/// FILE_NOTIFY_CHANGE_*): which kinds of change complete a request.
pub mod completion_filter {
    pub const FILE_NAME: u32 = 0x0000_0001;
    pub const DIR_NAME: u32 = 0x0000_0002;
    pub const ATTRIBUTES: u32 = 0x0000_0004;
    pub const SIZE: u32 = 0x0000_0008;
    pub const LAST_WRITE: u32 = 0x0000_0010;
    pub const LAST_ACCESS: u32 = 0x0000_0020;
    pub const CREATION: u32 = 0x0000_0040;
    pub const EA: u32 = 0x0000_0080;
    pub const SECURITY: u32 = 0x0000_0100;
    pub const STREAM_NAME: u32 = 0x0000_0200;
    pub const STREAM_SIZE: u32 = 0x0000_0400;
    pub const STREAM_WRITE: u32 = 0x0000_0800;
    /// Every bit MS-SMB2 defines; others are ignored.
    pub const ALL: u32 = 0x0000_0FFF;
}

/// MS-FSCC 2.4.42 FILE_NOTIFY_INFORMATION Action: what happened to the
/// name an entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum NotifyAction {
    Added = 0x0000_0001,
    Removed = 0x0000_0002,
    Modified = 0x0000_0003,
    /// The old name of a rename within one directory; RenamedNewName follows.
    RenamedOldName = 0x0000_0004,
    RenamedNewName = 0x0000_0005,
    AddedStream = 0x0000_0006,
    RemovedStream = 0x0000_0007,
    ModifiedStream = 0x0000_0008,
}

impl NotifyAction {
    pub fn from_u32(v: u32) -> Option<NotifyAction> {
        Some(match v {
            0x1 => NotifyAction::Added,
            0x2 => NotifyAction::Removed,
            0x3 => NotifyAction::Modified,
            0x4 => NotifyAction::RenamedOldName,
            0x5 => NotifyAction::RenamedNewName,
            0x6 => NotifyAction::AddedStream,
            0x7 => NotifyAction::RemovedStream,
            0x8 => NotifyAction::ModifiedStream,
            _ => return None,
        })
    }
}

/// MS-SMB2 2.2.35 SMB2 CHANGE_NOTIFY Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeNotifyRequest {
    /// WATCH_TREE or 0.
    pub flags: u16,
    /// The most bytes of FILE_NOTIFY_INFORMATION the client takes back.
    pub output_buffer_length: u32,
    pub file_id: FileId,
    pub completion_filter: u32,
}

impl ChangeNotifyRequest {
    pub const STRUCTURE_SIZE: u16 = 32;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let flags = r.u16()?;
        let output_buffer_length = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let completion_filter = r.u32()?;
        let _reserved = r.u32()?;
        Ok(ChangeNotifyRequest {
            flags,
            output_buffer_length,
            file_id,
            completion_filter,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.flags);
        out.put_u32(self.output_buffer_length);
        self.file_id.write(out);
        out.put_u32(self.completion_filter);
        out.put_u32(0);
    }

    pub fn watch_tree(&self) -> bool {
        self.flags & WATCH_TREE != 0
    }
}

/// Bytes of the CHANGE_NOTIFY response before its buffer.
const RESPONSE_FIXED: usize = 8;

/// MS-SMB2 2.2.36 SMB2 CHANGE_NOTIFY Response around `buffer`, the
/// FILE_NOTIFY_INFORMATION entries (empty for STATUS_NOTIFY_ENUM_DIR and
/// STATUS_NOTIFY_CLEANUP). An empty buffer still gets the one byte a
/// variable-length body must have, and offset zero.
pub fn encode_change_notify_response(out: &mut Vec<u8>, buffer: &[u8]) {
    out.put_u16(9);
    if buffer.is_empty() {
        out.put_u16(0);
        out.put_u32(0);
        out.put_u8(0);
        return;
    }
    out.put_u16((HEADER_SIZE + RESPONSE_FIXED) as u16);
    out.put_u32(buffer.len() as u32);
    out.extend_from_slice(buffer);
}

/// The buffer of a CHANGE_NOTIFY response body (for clients and tests).
pub fn parse_change_notify_response(body: &[u8]) -> WireResult<&[u8]> {
    let mut r = Reader::new(body);
    r.structure_size(9)?;
    let offset = r.u16()? as usize;
    let len = r.u32()? as usize;
    body_buffer(body, offset, len)
}

/// One MS-FSCC 2.4.42 FILE_NOTIFY_INFORMATION entry, decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileNotifyInformation {
    pub action: NotifyAction,
    /// Relative to the watched directory, components separated by `\`.
    pub file_name: String,
}

/// Size of an entry before its name: NextEntryOffset, Action, FileNameLength.
pub const ENTRY_FIXED: usize = 12;

/// Bytes one entry takes when another follows it: entries start on 4-byte
/// boundaries (MS-FSCC 2.4.42), so all but the last are padded.
pub fn padded_entry_len(name_utf16_bytes: usize) -> usize {
    (ENTRY_FIXED + name_utf16_bytes).next_multiple_of(4)
}

/// Encodes `entries` as a chain of FILE_NOTIFY_INFORMATION (MS-FSCC
/// 2.4.42): each NextEntryOffset points at the next 4-byte-aligned entry,
/// the last one's is zero and it carries no padding.
pub fn encode_notify_information(entries: &[(NotifyAction, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut previous: Option<usize> = None;
    for (action, name) in entries {
        if let Some(at) = previous {
            out.align_to(4);
            let next = (out.len() - at) as u32;
            out.patch_u32(at, next);
        }
        let start = out.len();
        out.put_u32(0);
        out.put_u32(*action as u32);
        let len_at = out.len();
        out.put_u32(0);
        put_utf16le(&mut out, name);
        let name_len = (out.len() - len_at - 4) as u32;
        out.patch_u32(len_at, name_len);
        previous = Some(start);
    }
    out
}

/// Decodes a chain of FILE_NOTIFY_INFORMATION. Every entry must lie inside
/// `buf`, each NextEntryOffset must move forward and keep 4-byte alignment,
/// so a hostile buffer cannot loop or reach outside; the entries returned
/// are at most `buf.len() / 12`.
pub fn parse_notify_information(buf: &[u8]) -> WireResult<Vec<FileNotifyInformation>> {
    let mut entries = Vec::new();
    let mut at = 0usize;
    if buf.is_empty() {
        return Ok(entries);
    }
    loop {
        let entry = buf.get(at..).ok_or(WireError::Truncated)?;
        let mut r = Reader::new(entry);
        let next = r.u32()? as usize;
        let action = NotifyAction::from_u32(r.u32()?)
            .ok_or(WireError::Invalid("unknown FILE_NOTIFY_INFORMATION Action"))?;
        let name_len = r.u32()? as usize;
        let file_name = utf16le_to_string(r.bytes(name_len)?)?;
        entries.push(FileNotifyInformation { action, file_name });
        if next == 0 {
            return Ok(entries);
        }
        if next < ENTRY_FIXED + name_len || !next.is_multiple_of(4) {
            return Err(WireError::Invalid("bad NextEntryOffset"));
        }
        at = at.checked_add(next).ok_or(WireError::Truncated)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request laid out by hand from MS-SMB2 2.2.35.
    #[test]
    fn hand_laid_request() {
        let mut b = Vec::new();
        b.extend_from_slice(&32u16.to_le_bytes()); // 0: StructureSize
        b.extend_from_slice(&1u16.to_le_bytes()); // 2: Flags (WATCH_TREE)
        b.extend_from_slice(&4096u32.to_le_bytes()); // 4: OutputBufferLength
        b.extend_from_slice(&7u64.to_le_bytes()); // 8: FileId.Persistent
        b.extend_from_slice(&9u64.to_le_bytes()); // 16: FileId.Volatile
        b.extend_from_slice(&0x17u32.to_le_bytes()); // 24: CompletionFilter
        b.extend_from_slice(&0u32.to_le_bytes()); // 28: Reserved
        let req = ChangeNotifyRequest::parse(&b).unwrap();
        assert_eq!(
            req,
            ChangeNotifyRequest {
                flags: WATCH_TREE,
                output_buffer_length: 4096,
                file_id: FileId {
                    persistent: 7,
                    volatile: 9
                },
                completion_filter: completion_filter::FILE_NAME
                    | completion_filter::DIR_NAME
                    | completion_filter::ATTRIBUTES
                    | completion_filter::LAST_WRITE,
            }
        );
        assert!(req.watch_tree());
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out, b);
        for cut in 0..b.len() {
            assert_eq!(
                ChangeNotifyRequest::parse(&b[..cut]),
                Err(WireError::Truncated),
                "prefix {cut}"
            );
        }
        b[0] = 33;
        assert_eq!(
            ChangeNotifyRequest::parse(&b),
            Err(WireError::BadStructureSize)
        );
    }

    /// Two entries laid out by hand from MS-FSCC 2.4.42: the first ("a",
    /// 2 bytes of name) is padded from 14 to 16 bytes, the last is not.
    #[test]
    fn hand_laid_entries() {
        let mut want = Vec::new();
        want.extend_from_slice(&16u32.to_le_bytes()); // NextEntryOffset
        want.extend_from_slice(&1u32.to_le_bytes()); // Action: ADDED
        want.extend_from_slice(&2u32.to_le_bytes()); // FileNameLength
        want.extend_from_slice(b"a\0");
        want.extend_from_slice(&[0, 0]); // padding to 4 bytes
        want.extend_from_slice(&0u32.to_le_bytes()); // last entry
        want.extend_from_slice(&5u32.to_le_bytes()); // RENAMED_NEW_NAME
        want.extend_from_slice(&6u32.to_le_bytes());
        want.extend_from_slice(b"d\0\\\0e\0");
        let got = encode_notify_information(&[
            (NotifyAction::Added, "a"),
            (NotifyAction::RenamedNewName, "d\\e"),
        ]);
        assert_eq!(got, want);
        assert_eq!(padded_entry_len(2), 16);
        assert_eq!(padded_entry_len(6), 20);
    }

    #[test]
    fn entries_round_trip_and_stay_aligned() {
        let names = [
            "x",
            "ab",
            "abc",
            "subdir-name\\subname1-r",
            "\u{e9}t\u{e9}",
            "",
        ];
        let actions = [
            NotifyAction::Added,
            NotifyAction::Removed,
            NotifyAction::Modified,
            NotifyAction::RenamedOldName,
            NotifyAction::RenamedNewName,
            NotifyAction::ModifiedStream,
        ];
        let entries: Vec<(NotifyAction, &str)> =
            actions.iter().copied().zip(names.iter().copied()).collect();
        let buf = encode_notify_information(&entries);
        // Every entry starts on a 4-byte boundary.
        let mut at = 0;
        loop {
            assert_eq!(at % 4, 0);
            let next = u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            if next == 0 {
                break;
            }
            at += next;
        }
        let parsed = parse_notify_information(&buf).unwrap();
        let back: Vec<(NotifyAction, &str)> = parsed
            .iter()
            .map(|e| (e.action, e.file_name.as_str()))
            .collect();
        assert_eq!(back, entries);
        assert!(parse_notify_information(&[]).unwrap().is_empty());
    }

    #[test]
    fn truncated_or_hostile_entries_are_refused() {
        let buf = encode_notify_information(&[
            (NotifyAction::Added, "first"),
            (NotifyAction::Removed, "second"),
        ]);
        for cut in 1..buf.len() {
            assert!(
                parse_notify_information(&buf[..cut]).is_err(),
                "prefix {cut}"
            );
        }
        // A NextEntryOffset that points back into its own entry, is
        // misaligned, or points past the end.
        for bad in [4u32, 13, 0xFFFF_FFFC] {
            let mut b = buf.clone();
            b[..4].copy_from_slice(&bad.to_le_bytes());
            assert!(parse_notify_information(&b).is_err(), "next {bad}");
        }
        // A name longer than the buffer, and an unknown action.
        let mut b = buf.clone();
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_notify_information(&b).is_err());
        let mut b = buf;
        b[4..8].copy_from_slice(&99u32.to_le_bytes());
        assert!(parse_notify_information(&b).is_err());
    }

    #[test]
    fn response_layout() {
        let entries = encode_notify_information(&[(NotifyAction::Added, "f")]);
        let mut out = Vec::new();
        encode_change_notify_response(&mut out, &entries);
        assert_eq!(&out[..2], &9u16.to_le_bytes());
        assert_eq!(&out[2..4], &72u16.to_le_bytes()); // header + 8
        assert_eq!(&out[4..8], &(entries.len() as u32).to_le_bytes());
        assert_eq!(parse_change_notify_response(&out).unwrap(), &entries[..]);
        let mut empty = Vec::new();
        encode_change_notify_response(&mut empty, &[]);
        assert_eq!(empty, [9, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_change_notify_response(&empty).unwrap(), &[] as &[u8]);
        assert!(parse_change_notify_response(&out[..6]).is_err());
    }
}
