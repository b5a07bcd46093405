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
}
