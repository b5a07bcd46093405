//! MS-SMB2 2.2.33 SMB2 QUERY_DIRECTORY Request and 2.2.34 Response.

use crate::codec::{body_buffer, utf16le_to_string, Put, Reader, WireResult, HEADER_SIZE};
use crate::file_id::FileId;

/// MS-SMB2 2.2.33 Flags.
pub mod flags {
    pub const RESTART_SCANS: u8 = 0x01;
    pub const RETURN_SINGLE_ENTRY: u8 = 0x02;
    pub const INDEX_SPECIFIED: u8 = 0x04;
    pub const REOPEN: u8 = 0x10;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryDirectoryRequest {
    pub info_class: u8,
    pub flags: u8,
    pub file_index: u32,
    pub file_id: FileId,
    pub pattern: String,
    pub output_buffer_length: u32,
}

impl QueryDirectoryRequest {
    pub const STRUCTURE_SIZE: u16 = 33;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let info_class = r.u8()?;
        let flags = r.u8()?;
        let file_index = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let name_off = r.u16()? as usize;
        let name_len = r.u16()? as usize;
        let output_buffer_length = r.u32()?;
        let pattern = utf16le_to_string(body_buffer(body, name_off, name_len)?)?;
        Ok(QueryDirectoryRequest {
            info_class,
            flags,
            file_index,
            file_id,
            pattern,
            output_buffer_length,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let name = crate::codec::utf16le(&self.pattern);
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.info_class);
        out.put_u8(self.flags);
        out.put_u32(self.file_index);
        self.file_id.write(out);
        out.put_u16((HEADER_SIZE + 32) as u16);
        out.put_u16(name.len() as u16);
        out.put_u32(self.output_buffer_length);
        out.extend_from_slice(&name);
    }
}

/// The shared shape of MS-SMB2 2.2.34 QUERY_DIRECTORY and 2.2.38 QUERY_INFO
/// responses: StructureSize 9, then an offset/length pair and the buffer.
pub fn encode_output_buffer_response(out: &mut Vec<u8>, data: &[u8]) {
    out.put_u16(9);
    out.put_u16((HEADER_SIZE + 8) as u16);
    out.put_u32(data.len() as u32);
    if data.is_empty() {
        out.put_u8(0);
    } else {
        out.extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let req = QueryDirectoryRequest {
            info_class: 0x25,
            flags: flags::RESTART_SCANS,
            file_index: 0,
            file_id: FileId::default(),
            pattern: "*".into(),
            output_buffer_length: 65536,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(QueryDirectoryRequest::parse(&out).unwrap(), req);
    }

    /// A QUERY_DIRECTORY request laid out by hand from MS-SMB2 2.2.33
    /// (offsets from the start of the body; buffer offsets count from the
    /// start of the 64-byte header).
    const QUERY_DIRECTORY_REQUEST: &str = concat!(
        "2100",                 // 0  StructureSize 33
        "25",                   // 2  FileInformationClass: FileIdBothDirectoryInformation
        "05",                   // 3  Flags: RESTART_SCANS | INDEX_SPECIFIED
        "07000000",             // 4  FileIndex 7
        "0100000000000000",     // 8  FileId.Persistent
        "0200000000000080",     // 16 FileId.Volatile
        "6000",                 // 24 FileNameOffset 0x60 = 64 + 32
        "0a00",                 // 26 FileNameLength 10
        "00000100",             // 28 OutputBufferLength 0x10000
        "2a002e00740078007400", // 32 Buffer: "*.txt" in UTF-16LE
    );

    #[test]
    fn parses_hand_laid_request() {
        let body = hex::decode(QUERY_DIRECTORY_REQUEST).unwrap();
        let req = QueryDirectoryRequest::parse(&body).unwrap();
        assert_eq!(
            req,
            QueryDirectoryRequest {
                info_class: crate::fscc::file_class::ID_BOTH_DIRECTORY,
                flags: flags::RESTART_SCANS | flags::INDEX_SPECIFIED,
                file_index: 7,
                file_id: FileId {
                    persistent: 1,
                    volatile: 0x8000_0000_0000_0002,
                },
                pattern: "*.txt".into(),
                output_buffer_length: 0x1_0000,
            }
        );
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out, body);
    }

    fn sample_file() -> crate::fscc::FileInfo {
        crate::fscc::FileInfo {
            creation_time: 0x01DA_0000_1111_1111,
            last_access_time: 0x01DA_0000_2222_2222,
            last_write_time: 0x01DA_0000_3333_3333,
            change_time: 0x01DA_0000_4444_4444,
            allocation_size: 4096,
            end_of_file: 5,
            attributes: crate::fscc::attributes::ARCHIVE,
            file_id: 0xAB_CDEF,
            ..Default::default()
        }
    }

    fn response_with_entry(class: u8, name: &str) -> Vec<u8> {
        let info = sample_file();
        let mut entry = Vec::new();
        crate::fscc::encode_directory_entry(
            class,
            &crate::fscc::DirectoryEntry {
                name,
                short_name: "",
                ea_size: 0,
                info: &info,
            },
            &mut entry,
        );
        let mut out = Vec::new();
        encode_output_buffer_response(&mut out, &entry);
        out
    }

    /// A QUERY_DIRECTORY response (MS-SMB2 2.2.34) holding one
    /// FileIdBothDirectoryInformation entry (MS-FSCC 2.4.17), by hand.
    #[test]
    fn id_both_directory_response_matches_hand_laid_layout() {
        let expected = hex::decode(concat!(
            "0900",     // 0  StructureSize 9
            "4800",     // 2  OutputBufferOffset 0x48 = 64 + 8
            "72000000", // 4  OutputBufferLength 114
            // 8  Buffer: FILE_ID_BOTH_DIR_INFORMATION, offsets from its start
            "00000000",                 // 0   NextEntryOffset: the last entry
            "00000000",                 // 4   FileIndex
            "111111110000da01",         // 8   CreationTime
            "222222220000da01",         // 16  LastAccessTime
            "333333330000da01",         // 24  LastWriteTime
            "444444440000da01",         // 32  ChangeTime
            "0500000000000000",         // 40  EndOfFile 5
            "0010000000000000",         // 48  AllocationSize 4096
            "20000000",                 // 56  FileAttributes: ARCHIVE
            "0a000000",                 // 60  FileNameLength 10
            "00000000",                 // 64  EaSize
            "00",                       // 68  ShortNameLength: no 8.3 name
            "00",                       // 69  Reserved1
            "000000000000000000000000", // 70  ShortName, 24 bytes
            "000000000000000000000000", // 82  (ShortName, continued)
            "0000",                     // 94  Reserved2
            "efcdab0000000000",         // 96  FileId
            "61002e00740078007400",     // 104 FileName "a.txt"
        ))
        .unwrap();
        let out = response_with_entry(crate::fscc::file_class::ID_BOTH_DIRECTORY, "a.txt");
        assert_eq!(out, expected);
    }

    /// The same response with a FileNamesInformation entry (MS-FSCC 2.4.28).
    #[test]
    fn names_response_matches_hand_laid_layout() {
        let expected = hex::decode(concat!(
            "0900",     // 0  StructureSize 9
            "4800",     // 2  OutputBufferOffset 0x48
            "16000000", // 4  OutputBufferLength 22
            // 8  Buffer: FILE_NAMES_INFORMATION
            "00000000",             // 0  NextEntryOffset
            "00000000",             // 4  FileIndex
            "0a000000",             // 8  FileNameLength 10
            "61002e00740078007400", // 12 FileName "a.txt"
        ))
        .unwrap();
        let out = response_with_entry(crate::fscc::file_class::NAMES, "a.txt");
        assert_eq!(out, expected);
    }
}
