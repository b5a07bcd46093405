//! MS-FSCC information classes: file (2.4), file system (2.5) and file
//! attributes (2.6), plus MS-SMB2 2.2.13.1 access masks.

use crate::codec::{put_utf16le, utf16le_to_string, Put, Reader, WireError, WireResult};

/// MS-FSCC 2.6 File Attributes.
pub mod attributes {
    pub const READONLY: u32 = 0x0000_0001;
    pub const HIDDEN: u32 = 0x0000_0002;
    pub const SYSTEM: u32 = 0x0000_0004;
    pub const DIRECTORY: u32 = 0x0000_0010;
    pub const ARCHIVE: u32 = 0x0000_0020;
    pub const NORMAL: u32 = 0x0000_0080;
    pub const TEMPORARY: u32 = 0x0000_0100;
    pub const SPARSE_FILE: u32 = 0x0000_0200;
    pub const REPARSE_POINT: u32 = 0x0000_0400;
    pub const COMPRESSED: u32 = 0x0000_0800;
    pub const OFFLINE: u32 = 0x0000_1000;
    pub const NOT_CONTENT_INDEXED: u32 = 0x0000_2000;
    pub const ENCRYPTED: u32 = 0x0000_4000;
    pub const INTEGRITY_STREAM: u32 = 0x0000_8000;
    pub const NO_SCRUB_DATA: u32 = 0x0002_0000;
    /// Attributes a client may set; others are STATUS_INVALID_PARAMETER.
    pub const SETTABLE: u32 = 0x0000_7FB7 | NO_SCRUB_DATA | INTEGRITY_STREAM;
}

/// MS-SMB2 2.2.13.1 Access Mask Encoding.
pub mod access {
    pub const FILE_READ_DATA: u32 = 0x0000_0001;
    pub const FILE_WRITE_DATA: u32 = 0x0000_0002;
    pub const FILE_APPEND_DATA: u32 = 0x0000_0004;
    pub const FILE_READ_EA: u32 = 0x0000_0008;
    pub const FILE_WRITE_EA: u32 = 0x0000_0010;
    pub const FILE_EXECUTE: u32 = 0x0000_0020;
    pub const FILE_DELETE_CHILD: u32 = 0x0000_0040;
    pub const FILE_READ_ATTRIBUTES: u32 = 0x0000_0080;
    pub const FILE_WRITE_ATTRIBUTES: u32 = 0x0000_0100;
    /// The same bits under their directory names (MS-SMB2 2.2.13.1.2).
    pub const FILE_LIST_DIRECTORY: u32 = FILE_READ_DATA;
    pub const FILE_ADD_FILE: u32 = FILE_WRITE_DATA;
    pub const FILE_ADD_SUBDIRECTORY: u32 = FILE_APPEND_DATA;
    pub const DELETE: u32 = 0x0001_0000;
    pub const READ_CONTROL: u32 = 0x0002_0000;
    pub const WRITE_DAC: u32 = 0x0004_0000;
    pub const WRITE_OWNER: u32 = 0x0008_0000;
    pub const SYNCHRONIZE: u32 = 0x0010_0000;
    pub const ACCESS_SYSTEM_SECURITY: u32 = 0x0100_0000;
    pub const MAXIMUM_ALLOWED: u32 = 0x0200_0000;
    pub const GENERIC_ALL: u32 = 0x1000_0000;
    pub const GENERIC_EXECUTE: u32 = 0x2000_0000;
    pub const GENERIC_WRITE: u32 = 0x4000_0000;
    pub const GENERIC_READ: u32 = 0x8000_0000;

    pub const FILE_ALL_ACCESS: u32 = 0x001F_01FF;
    pub const FILE_GENERIC_READ: u32 =
        READ_CONTROL | FILE_READ_DATA | FILE_READ_ATTRIBUTES | FILE_READ_EA | SYNCHRONIZE;
    pub const FILE_GENERIC_WRITE: u32 = READ_CONTROL
        | FILE_WRITE_DATA
        | FILE_WRITE_ATTRIBUTES
        | FILE_WRITE_EA
        | FILE_APPEND_DATA
        | SYNCHRONIZE;
    pub const FILE_GENERIC_EXECUTE: u32 =
        READ_CONTROL | FILE_READ_ATTRIBUTES | FILE_EXECUTE | SYNCHRONIZE;
    /// Rights that modify a file or directory (refused on a read-only share).
    pub const MODIFYING: u32 = FILE_WRITE_DATA
        | FILE_APPEND_DATA
        | FILE_WRITE_EA
        | FILE_DELETE_CHILD
        | FILE_WRITE_ATTRIBUTES
        | DELETE
        | WRITE_DAC
        | WRITE_OWNER;

    /// Maps GENERIC_* bits onto the file-specific rights they stand for.
    pub fn map_generic(mask: u32) -> u32 {
        let mut out = mask & !(GENERIC_ALL | GENERIC_EXECUTE | GENERIC_WRITE | GENERIC_READ);
        if mask & GENERIC_ALL != 0 {
            out |= FILE_ALL_ACCESS;
        }
        if mask & GENERIC_READ != 0 {
            out |= FILE_GENERIC_READ;
        }
        if mask & GENERIC_WRITE != 0 {
            out |= FILE_GENERIC_WRITE;
        }
        if mask & GENERIC_EXECUTE != 0 {
            out |= FILE_GENERIC_EXECUTE;
        }
        out
    }
}

/// MS-FSCC 2.4 file information classes.
pub mod file_class {
    pub const DIRECTORY: u8 = 1;
    pub const FULL_DIRECTORY: u8 = 2;
    pub const BOTH_DIRECTORY: u8 = 3;
    pub const BASIC: u8 = 4;
    pub const STANDARD: u8 = 5;
    pub const INTERNAL: u8 = 6;
    pub const EA: u8 = 7;
    pub const ACCESS: u8 = 8;
    pub const NAME: u8 = 9;
    pub const RENAME: u8 = 10;
    pub const LINK: u8 = 11;
    pub const NAMES: u8 = 12;
    pub const DISPOSITION: u8 = 13;
    pub const POSITION: u8 = 14;
    pub const FULL_EA: u8 = 15;
    pub const MODE: u8 = 16;
    pub const ALIGNMENT: u8 = 17;
    pub const ALL: u8 = 18;
    pub const ALLOCATION: u8 = 19;
    pub const END_OF_FILE: u8 = 20;
    pub const ALTERNATE_NAME: u8 = 21;
    pub const STREAM: u8 = 22;
    pub const COMPRESSION: u8 = 28;
    pub const NETWORK_OPEN: u8 = 34;
    pub const ATTRIBUTE_TAG: u8 = 35;
    pub const ID_BOTH_DIRECTORY: u8 = 37;
    pub const ID_FULL_DIRECTORY: u8 = 38;
    pub const VALID_DATA_LENGTH: u8 = 39;
    pub const NORMALIZED_NAME: u8 = 48;
    pub const ID: u8 = 59;
    pub const ID_EXTD_DIRECTORY: u8 = 60;
    pub const DISPOSITION_EX: u8 = 64;
    pub const RENAME_EX: u8 = 65;
}

/// MS-FSCC 2.5 file system information classes.
pub mod fs_class {
    pub const VOLUME: u8 = 1;
    pub const LABEL: u8 = 2;
    pub const SIZE: u8 = 3;
    pub const DEVICE: u8 = 4;
    pub const ATTRIBUTE: u8 = 5;
    pub const CONTROL: u8 = 6;
    pub const FULL_SIZE: u8 = 7;
    pub const OBJECT_ID: u8 = 8;
    pub const SECTOR_SIZE: u8 = 11;
}

/// MS-FSCC 2.5.1 FileSystemAttributes.
pub mod fs_attributes {
    pub const CASE_SENSITIVE_SEARCH: u32 = 0x0000_0001;
    pub const CASE_PRESERVED_NAMES: u32 = 0x0000_0002;
    pub const UNICODE_ON_DISK: u32 = 0x0000_0004;
    pub const PERSISTENT_ACLS: u32 = 0x0000_0008;
    pub const SUPPORTS_SPARSE_FILES: u32 = 0x0000_0040;
    pub const SUPPORTS_EXTENDED_ATTRIBUTES: u32 = 0x0080_0000;
    pub const SUPPORTS_BLOCK_REFCOUNTING: u32 = 0x0800_0000;
}

/// Seconds between 1601-01-01 (FILETIME epoch) and 1970-01-01.
const FILETIME_UNIX_OFFSET_SECS: i64 = 11_644_473_600;

/// Converts Unix time to a FILETIME (100 ns ticks since 1601); times before
/// 1601 clamp to 0.
pub fn unix_to_filetime(sec: i64, nsec: u32) -> u64 {
    let ticks = (sec as i128 + FILETIME_UNIX_OFFSET_SECS as i128) * 10_000_000 + nsec as i128 / 100;
    ticks.clamp(0, u64::MAX as i128) as u64
}

/// Converts a FILETIME to Unix seconds and nanoseconds.
pub fn filetime_to_unix(ft: u64) -> (i64, u32) {
    let secs = (ft / 10_000_000) as i64 - FILETIME_UNIX_OFFSET_SECS;
    let nsec = ((ft % 10_000_000) * 100) as u32;
    (secs, nsec)
}

/// What the server knows of a file, in SMB terms; every information class
/// below is a view of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileInfo {
    pub creation_time: u64,
    pub last_access_time: u64,
    pub last_write_time: u64,
    pub change_time: u64,
    pub allocation_size: u64,
    pub end_of_file: u64,
    pub attributes: u32,
    pub number_of_links: u32,
    pub delete_pending: bool,
    pub is_directory: bool,
    pub file_id: u64,
    pub volume_serial: u64,
}

impl FileInfo {
    /// MS-FSCC 2.4.7 FileBasicInformation.
    pub fn put_basic(&self, out: &mut Vec<u8>) {
        out.put_u64(self.creation_time);
        out.put_u64(self.last_access_time);
        out.put_u64(self.last_write_time);
        out.put_u64(self.change_time);
        out.put_u32(self.attributes);
        out.put_u32(0);
    }

    /// MS-FSCC 2.4.41 FileStandardInformation.
    pub fn put_standard(&self, out: &mut Vec<u8>) {
        out.put_u64(self.allocation_size);
        out.put_u64(self.end_of_file);
        out.put_u32(self.number_of_links);
        out.put_u8(self.delete_pending as u8);
        out.put_u8(self.is_directory as u8);
        out.put_u16(0);
    }

    /// MS-FSCC 2.4.29 FileNetworkOpenInformation.
    pub fn put_network_open(&self, out: &mut Vec<u8>) {
        out.put_u64(self.creation_time);
        out.put_u64(self.last_access_time);
        out.put_u64(self.last_write_time);
        out.put_u64(self.change_time);
        out.put_u64(self.allocation_size);
        out.put_u64(self.end_of_file);
        out.put_u32(self.attributes);
        out.put_u32(0);
    }
}

/// Per-open values that some file classes report besides the file's own.
#[derive(Clone, Debug, Default)]
pub struct OpenView<'a> {
    pub access_flags: u32,
    pub position: u64,
    pub mode: u32,
    /// The name relative to the share root, backslash-separated, with a
    /// leading backslash as Windows reports it.
    pub name: &'a str,
    /// MS-FSCC 2.4.12 EaSize: the length of the file's EAs as one
    /// FILE_FULL_EA_INFORMATION list.
    pub ea_size: u32,
}

/// One data stream of a file, as FileStreamInformation lists it.
#[derive(Clone, Debug)]
pub struct StreamEntry<'a> {
    /// `::$DATA` for the unnamed stream, `:name:$DATA` for the others.
    pub name: &'a str,
    pub size: u64,
    pub allocation_size: u64,
}

/// MS-FSCC 2.4.44 FILE_STREAM_INFORMATION entries: NextEntryOffset (u32,
/// 0 in the last), StreamNameLength (u32, bytes), StreamSize (u64),
/// StreamAllocationSize (u64), StreamName (UTF-16LE); each entry after the
/// first starts 8-byte aligned.
pub fn encode_stream_information(entries: &[StreamEntry<'_>], out: &mut Vec<u8>) {
    let start = out.len();
    let mut last: Option<usize> = None;
    for e in entries {
        if let Some(prev) = last {
            let at = start + (out.len() - start).next_multiple_of(8);
            out.resize(at, 0);
            let next = (at - prev) as u32;
            out[prev..prev + 4].copy_from_slice(&next.to_le_bytes());
        }
        last = Some(out.len());
        let name = crate::codec::utf16le(e.name);
        out.put_u32(0);
        out.put_u32(name.len() as u32);
        out.put_u64(e.size);
        out.put_u64(e.allocation_size);
        out.extend_from_slice(&name);
    }
}

/// Encodes a file information class (MS-FSCC 2.4). Returns None for a
/// class the server does not serve.
pub fn encode_file_class(class: u8, info: &FileInfo, open: &OpenView<'_>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(128);
    match class {
        file_class::BASIC => info.put_basic(&mut out),
        file_class::STANDARD => info.put_standard(&mut out),
        file_class::INTERNAL => out.put_u64(info.file_id),
        file_class::EA => out.put_u32(open.ea_size),
        file_class::ACCESS => out.put_u32(open.access_flags),
        file_class::POSITION => out.put_u64(open.position),
        file_class::MODE => out.put_u32(open.mode),
        // Byte alignment: the device has no alignment requirement.
        file_class::ALIGNMENT => out.put_u32(0),
        file_class::NAME | file_class::NORMALIZED_NAME => {
            let mut name = Vec::new();
            put_utf16le(&mut name, open.name);
            out.put_u32(name.len() as u32);
            out.extend_from_slice(&name);
        }
        file_class::ALL => {
            info.put_basic(&mut out);
            info.put_standard(&mut out);
            out.put_u64(info.file_id);
            out.put_u32(open.ea_size);
            out.put_u32(open.access_flags);
            out.put_u64(open.position);
            out.put_u32(open.mode);
            out.put_u32(0); // alignment
            let mut name = Vec::new();
            put_utf16le(&mut name, open.name);
            out.put_u32(name.len() as u32);
            out.extend_from_slice(&name);
        }
        file_class::NETWORK_OPEN => info.put_network_open(&mut out),
        file_class::ATTRIBUTE_TAG => {
            out.put_u32(info.attributes);
            out.put_u32(0);
        }
        file_class::STREAM => {
            // MS-FSCC 2.4.44: a directory has no unnamed data stream.
            if !info.is_directory {
                let unnamed = StreamEntry {
                    name: "::$DATA",
                    size: info.end_of_file,
                    allocation_size: info.allocation_size,
                };
                encode_stream_information(&[unnamed], &mut out);
            }
        }
        file_class::COMPRESSION => {
            out.put_u64(info.end_of_file);
            out.put_u16(0); // COMPRESSION_FORMAT_NONE
            out.put_zeros(6);
        }
        file_class::ID => {
            out.put_u64(info.volume_serial);
            out.put_u64(info.file_id);
            out.put_u64(0);
        }
        file_class::VALID_DATA_LENGTH => out.put_u64(info.end_of_file),
        _ => return None,
    }
    Some(out)
}

/// One directory entry for QUERY_DIRECTORY.
#[derive(Clone, Debug)]
pub struct DirectoryEntry<'a> {
    pub name: &'a str,
    /// Its 8.3 name where that differs from `name`, else "" (at most 12
    /// characters are sent).
    pub short_name: &'a str,
    /// MS-FSCC 2.4.14 EaSize (as FileEaInformation gives it).
    pub ea_size: u32,
    pub info: &'a FileInfo,
}

/// Whether QUERY_DIRECTORY serves this class (MS-FSCC 2.4 directory classes).
pub fn is_directory_class(class: u8) -> bool {
    matches!(
        class,
        file_class::DIRECTORY
            | file_class::FULL_DIRECTORY
            | file_class::BOTH_DIRECTORY
            | file_class::NAMES
            | file_class::ID_BOTH_DIRECTORY
            | file_class::ID_FULL_DIRECTORY
            | file_class::ID_EXTD_DIRECTORY
    )
}

/// Appends one directory entry of `class` (MS-FSCC 2.4.10, 2.4.14, 2.4.8,
/// 2.4.28, 2.4.17, 2.4.18, 2.4.19), with NextEntryOffset 0; the caller links
/// entries and aligns them to 8 bytes.
pub fn encode_directory_entry(class: u8, e: &DirectoryEntry<'_>, out: &mut Vec<u8>) {
    let mut name = Vec::with_capacity(e.name.len() * 2);
    put_utf16le(&mut name, e.name);
    let i = e.info;
    out.put_u32(0); // NextEntryOffset
    out.put_u32(0); // FileIndex
    if class == file_class::NAMES {
        out.put_u32(name.len() as u32);
        out.extend_from_slice(&name);
        return;
    }
    out.put_u64(i.creation_time);
    out.put_u64(i.last_access_time);
    out.put_u64(i.last_write_time);
    out.put_u64(i.change_time);
    out.put_u64(i.end_of_file);
    out.put_u64(i.allocation_size);
    out.put_u32(i.attributes);
    out.put_u32(name.len() as u32);
    match class {
        file_class::DIRECTORY => {}
        file_class::FULL_DIRECTORY => out.put_u32(e.ea_size),
        file_class::ID_FULL_DIRECTORY => {
            out.put_u32(e.ea_size);
            out.put_u32(0);
            out.put_u64(i.file_id);
        }
        file_class::BOTH_DIRECTORY | file_class::ID_BOTH_DIRECTORY => {
            out.put_u32(e.ea_size);
            // ShortNameLength, Reserved1, ShortName (12 UTF-16 units).
            let mut short = Vec::with_capacity(24);
            put_utf16le(&mut short, e.short_name);
            short.truncate(24);
            out.put_u8(short.len() as u8);
            out.put_u8(0);
            out.extend_from_slice(&short);
            out.put_zeros(24 - short.len());
            if class == file_class::ID_BOTH_DIRECTORY {
                out.put_u16(0);
                out.put_u64(i.file_id);
            }
        }
        file_class::ID_EXTD_DIRECTORY => {
            out.put_u32(e.ea_size);
            out.put_u32(0); // ReparsePointTag
            out.put_u64(i.file_id);
            out.put_u64(0);
        }
        _ => {}
    }
    out.extend_from_slice(&name);
}

/// Volume facts for the file system classes.
#[derive(Clone, Debug, Default)]
pub struct VolumeInfo {
    pub creation_time: u64,
    pub serial: u32,
    pub label: String,
    pub total_units: u64,
    pub caller_available_units: u64,
    pub actual_available_units: u64,
    pub sectors_per_unit: u32,
    pub bytes_per_sector: u32,
    pub max_name_len: u32,
    pub fs_attributes: u32,
    pub fs_name: String,
}

/// Encodes a file system information class (MS-FSCC 2.5). Returns None for
/// a class the server does not serve.
pub fn encode_fs_class(class: u8, v: &VolumeInfo) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    match class {
        fs_class::VOLUME => {
            let label = crate::codec::utf16le(&v.label);
            out.put_u64(v.creation_time);
            out.put_u32(v.serial);
            out.put_u32(label.len() as u32);
            out.put_u8(0);
            out.put_u8(0);
            out.extend_from_slice(&label);
        }
        fs_class::SIZE => {
            out.put_u64(v.total_units);
            out.put_u64(v.caller_available_units);
            out.put_u32(v.sectors_per_unit);
            out.put_u32(v.bytes_per_sector);
        }
        fs_class::FULL_SIZE => {
            out.put_u64(v.total_units);
            out.put_u64(v.caller_available_units);
            out.put_u64(v.actual_available_units);
            out.put_u32(v.sectors_per_unit);
            out.put_u32(v.bytes_per_sector);
        }
        fs_class::DEVICE => {
            out.put_u32(0x0000_0007); // FILE_DEVICE_DISK
            out.put_u32(0);
        }
        fs_class::ATTRIBUTE => {
            let name = crate::codec::utf16le(&v.fs_name);
            out.put_u32(v.fs_attributes);
            out.put_u32(v.max_name_len);
            out.put_u32(name.len() as u32);
            out.extend_from_slice(&name);
        }
        fs_class::SECTOR_SIZE => {
            for _ in 0..4 {
                out.put_u32(v.bytes_per_sector);
            }
            // SSINFO_FLAGS_ALIGNED_DEVICE | PARTITION_ALIGNED_ON_DEVICE
            out.put_u32(0x3);
            out.put_u32(0);
            out.put_u32(0);
        }
        fs_class::OBJECT_ID => out.put_zeros(64),
        // MS-FSCC 2.5.2 FileFsControlInformation: quotas are not kept, so
        // no filtering thresholds, no default quota (-1: no limit) and no
        // quota flags.
        fs_class::CONTROL => {
            out.put_zeros(24);
            out.put_u64(u64::MAX);
            out.put_u64(u64::MAX);
            out.put_u32(0);
            out.put_u32(0);
        }
        _ => return None,
    }
    Some(out)
}

/// MS-FSCC 2.4.7 FileBasicInformation as sent in SET_INFO. Zero means
/// "leave unchanged"; -1 (all ones) means "stop updating this time
/// automatically", which this server treats as unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetBasicInfo {
    pub creation_time: u64,
    pub last_access_time: u64,
    pub last_write_time: u64,
    pub change_time: u64,
    pub attributes: u32,
}

impl SetBasicInfo {
    pub fn parse(buf: &[u8]) -> WireResult<Self> {
        if buf.len() < 36 {
            return Err(WireError::Truncated);
        }
        let mut r = Reader::new(buf);
        Ok(SetBasicInfo {
            creation_time: r.u64()?,
            last_access_time: r.u64()?,
            last_write_time: r.u64()?,
            change_time: r.u64()?,
            attributes: r.u32()?,
        })
    }
}

/// MS-FSCC 2.4.37.2 FILE_RENAME_INFORMATION_TYPE_2 (the SMB2 form).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenameInfo {
    pub replace_if_exists: bool,
    pub root_directory: u64,
    pub name: String,
}

impl RenameInfo {
    pub fn parse(buf: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(buf);
        let replace_if_exists = r.u8()? != 0;
        r.skip(7)?;
        let root_directory = r.u64()?;
        let len = r.u32()? as usize;
        let name = utf16le_to_string(r.bytes(len)?)?;
        Ok(RenameInfo {
            replace_if_exists,
            root_directory,
            name,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let name = crate::codec::utf16le(&self.name);
        out.put_u8(self.replace_if_exists as u8);
        out.put_zeros(7);
        out.put_u64(self.root_directory);
        out.put_u32(name.len() as u32);
        out.extend_from_slice(&name);
    }
}

/// Reads the single little-endian integer that several SET_INFO classes
/// carry (end of file, allocation, position, mode, disposition).
pub fn parse_u64(buf: &[u8]) -> WireResult<u64> {
    Reader::new(buf).u64()
}

pub fn parse_u32(buf: &[u8]) -> WireResult<u32> {
    Reader::new(buf).u32()
}

pub fn parse_u8(buf: &[u8]) -> WireResult<u8> {
    Reader::new(buf).u8()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filetime_conversions() {
        // 1970-01-01 is 116444736000000000 ticks after 1601-01-01.
        assert_eq!(unix_to_filetime(0, 0), 116_444_736_000_000_000);
        assert_eq!(filetime_to_unix(116_444_736_000_000_001), (0, 100));
        assert_eq!(unix_to_filetime(i64::MIN / 2, 0), 0);
    }

    /// Two entries laid out by hand from MS-FSCC 2.4.44: `::$DATA` (14
    /// bytes of name, so the entry is 38 bytes and the next starts at 40)
    /// and `:ab:$DATA`.
    #[test]
    fn stream_information_entries_are_8_byte_aligned_and_chained() {
        let mut out = Vec::new();
        let entries = [
            StreamEntry {
                name: "::$DATA",
                size: 5,
                allocation_size: 4096,
            },
            StreamEntry {
                name: ":ab:$DATA",
                size: 0,
                allocation_size: 0,
            },
        ];
        encode_stream_information(&entries, &mut out);
        let mut want = Vec::new();
        want.extend_from_slice(&40u32.to_le_bytes());
        want.extend_from_slice(&14u32.to_le_bytes());
        want.extend_from_slice(&5u64.to_le_bytes());
        want.extend_from_slice(&4096u64.to_le_bytes());
        for c in "::$DATA".encode_utf16() {
            want.extend_from_slice(&c.to_le_bytes());
        }
        want.extend_from_slice(&[0, 0]);
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&18u32.to_le_bytes());
        want.extend_from_slice(&[0; 16]);
        for c in ":ab:$DATA".encode_utf16() {
            want.extend_from_slice(&c.to_le_bytes());
        }
        assert_eq!(out, want);
    }

    #[test]
    fn fixed_class_sizes_match_ms_fscc() {
        let info = FileInfo::default();
        let open = OpenView {
            name: "\\a",
            ..Default::default()
        };
        let len = |c| encode_file_class(c, &info, &open).unwrap().len();
        assert_eq!(len(file_class::BASIC), 40);
        assert_eq!(len(file_class::STANDARD), 24);
        assert_eq!(len(file_class::INTERNAL), 8);
        assert_eq!(len(file_class::NETWORK_OPEN), 56);
        assert_eq!(len(file_class::ATTRIBUTE_TAG), 8);
        assert_eq!(len(file_class::ALL), 100 + 4);
        assert_eq!(len(file_class::STREAM), 24 + 14);
        let v = VolumeInfo::default();
        assert_eq!(encode_fs_class(fs_class::SIZE, &v).unwrap().len(), 24);
        assert_eq!(encode_fs_class(fs_class::FULL_SIZE, &v).unwrap().len(), 32);
        assert_eq!(
            encode_fs_class(fs_class::SECTOR_SIZE, &v).unwrap().len(),
            28
        );
        assert_eq!(encode_fs_class(fs_class::VOLUME, &v).unwrap().len(), 18);
    }

    #[test]
    fn directory_entry_fixed_sizes() {
        let info = FileInfo::default();
        let e = DirectoryEntry {
            name: "",
            short_name: "",
            ea_size: 0,
            info: &info,
        };
        let size = |c| {
            let mut v = Vec::new();
            encode_directory_entry(c, &e, &mut v);
            v.len()
        };
        assert_eq!(size(file_class::DIRECTORY), 64);
        assert_eq!(size(file_class::FULL_DIRECTORY), 68);
        assert_eq!(size(file_class::BOTH_DIRECTORY), 94);
        assert_eq!(size(file_class::ID_BOTH_DIRECTORY), 104);
        assert_eq!(size(file_class::ID_FULL_DIRECTORY), 80);
        assert_eq!(size(file_class::NAMES), 12);
        assert_eq!(size(file_class::ID_EXTD_DIRECTORY), 88);
    }

    #[test]
    fn rename_round_trip() {
        let r = RenameInfo {
            replace_if_exists: true,
            root_directory: 0,
            name: "dir\\new.txt".into(),
        };
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(RenameInfo::parse(&out).unwrap(), r);
        assert!(RenameInfo::parse(&out[..out.len() - 1]).is_err());
    }

    #[test]
    fn generic_mapping() {
        assert_eq!(
            access::map_generic(access::GENERIC_ALL),
            access::FILE_ALL_ACCESS
        );
        assert_eq!(
            access::map_generic(access::GENERIC_READ),
            access::FILE_GENERIC_READ
        );
    }
}
