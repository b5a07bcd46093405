//! MS-SMB2 2.2.21 SMB2 WRITE Request and 2.2.22 Response.

use crate::codec::{body_buffer, Put, Reader, WireResult, HEADER_SIZE};
use crate::file_id::FileId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRequest<'a> {
    pub offset: u64,
    pub file_id: FileId,
    pub flags: u32,
    /// Borrowed from the received frame: written to disk without a copy.
    pub data: &'a [u8],
}

/// MS-SMB2 2.2.21 Flags.
pub const WRITEFLAG_WRITE_THROUGH: u32 = 0x1;

impl<'a> WriteRequest<'a> {
    pub const STRUCTURE_SIZE: u16 = 49;

    pub fn parse(body: &'a [u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let data_offset = r.u16()? as usize;
        let length = r.u32()? as usize;
        let offset = r.u64()?;
        let file_id = FileId::read(&mut r)?;
        let _channel = r.u32()?;
        let _remaining = r.u32()?;
        let _info_off = r.u16()?;
        let _info_len = r.u16()?;
        let flags = r.u32()?;
        Ok(WriteRequest {
            offset,
            file_id,
            flags,
            data: body_buffer(body, data_offset, length)?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16((HEADER_SIZE + 48) as u16);
        out.put_u32(self.data.len() as u32);
        out.put_u64(self.offset);
        self.file_id.write(out);
        out.put_u32(0);
        out.put_u32(0);
        out.put_u16(0);
        out.put_u16(0);
        out.put_u32(self.flags);
        out.extend_from_slice(self.data);
    }
}

pub fn encode_write_response(out: &mut Vec<u8>, count: u32) {
    out.put_u16(17);
    out.put_u16(0);
    out.put_u32(count);
    out.put_u32(0);
    out.put_u16(0);
    out.put_u16(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let data = [1u8, 2, 3, 4, 5];
        let req = WriteRequest {
            offset: 9,
            file_id: FileId::default(),
            flags: 0,
            data: &data,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(WriteRequest::parse(&out).unwrap(), req);
        assert!(WriteRequest::parse(&out[..out.len() - 1]).is_err());
        let mut resp = Vec::new();
        encode_write_response(&mut resp, 5);
        assert_eq!(resp.len(), 16);
    }
}
