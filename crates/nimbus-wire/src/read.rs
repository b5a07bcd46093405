//! MS-SMB2 2.2.19 SMB2 READ Request and 2.2.20 Response.

use crate::codec::{Put, Reader, WireResult, HEADER_SIZE};
use crate::file_id::FileId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub flags: u8,
    pub length: u32,
    pub offset: u64,
    pub file_id: FileId,
    pub minimum_count: u32,
}

impl ReadRequest {
    pub const STRUCTURE_SIZE: u16 = 49;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let _padding = r.u8()?;
        let flags = r.u8()?;
        let length = r.u32()?;
        let offset = r.u64()?;
        let file_id = FileId::read(&mut r)?;
        let minimum_count = r.u32()?;
        // Channel, RemainingBytes and the channel info matter only for RDMA.
        Ok(ReadRequest {
            flags,
            length,
            offset,
            file_id,
            minimum_count,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(0);
        out.put_u8(self.flags);
        out.put_u32(self.length);
        out.put_u64(self.offset);
        self.file_id.write(out);
        out.put_u32(self.minimum_count);
        out.put_u32(0);
        out.put_u32(0);
        out.put_u16(0);
        out.put_u16(0);
        out.put_u8(0);
    }
}

/// Size of the READ response body before its data.
pub const READ_RESPONSE_FIXED: usize = 16;

/// Writes the 16-byte READ response body; the data follows directly, at
/// header offset 80, so the file can be read straight into the send buffer.
pub fn encode_read_response_head(out: &mut Vec<u8>, data_length: u32) {
    out.put_u16(17);
    out.put_u8((HEADER_SIZE + READ_RESPONSE_FIXED) as u8);
    out.put_u8(0);
    out.put_u32(data_length);
    out.put_u32(0); // DataRemaining
    out.put_u32(0); // Flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let req = ReadRequest {
            flags: 0,
            length: 65536,
            offset: 1 << 40,
            file_id: FileId {
                persistent: 3,
                volatile: 4,
            },
            minimum_count: 0,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out.len(), 49);
        assert_eq!(ReadRequest::parse(&out).unwrap(), req);
        let mut resp = Vec::new();
        encode_read_response_head(&mut resp, 10);
        assert_eq!(resp.len(), READ_RESPONSE_FIXED);
        assert_eq!(resp[2], 80);
    }
}
