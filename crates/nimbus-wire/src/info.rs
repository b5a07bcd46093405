//! MS-SMB2 2.2.37 SMB2 QUERY_INFO Request, 2.2.39 SMB2 SET_INFO Request
//! and 2.2.40 SET_INFO Response.

use crate::codec::{body_buffer, Put, Reader, WireResult, HEADER_SIZE};
use crate::file_id::FileId;

/// MS-SMB2 2.2.37 InfoType.
pub mod info_type {
    pub const FILE: u8 = 0x01;
    pub const FILESYSTEM: u8 = 0x02;
    pub const SECURITY: u8 = 0x03;
    pub const QUOTA: u8 = 0x04;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryInfoRequest<'a> {
    pub info_type: u8,
    pub info_class: u8,
    pub output_buffer_length: u32,
    pub input: &'a [u8],
    pub additional_information: u32,
    pub flags: u32,
    pub file_id: FileId,
}

impl<'a> QueryInfoRequest<'a> {
    pub const STRUCTURE_SIZE: u16 = 41;

    pub fn parse(body: &'a [u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let info_type = r.u8()?;
        let info_class = r.u8()?;
        let output_buffer_length = r.u32()?;
        let in_off = r.u16()? as usize;
        r.skip(2)?;
        let in_len = r.u32()? as usize;
        let additional_information = r.u32()?;
        let flags = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        Ok(QueryInfoRequest {
            info_type,
            info_class,
            output_buffer_length,
            input: body_buffer(body, in_off, in_len)?,
            additional_information,
            flags,
            file_id,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.info_type);
        out.put_u8(self.info_class);
        out.put_u32(self.output_buffer_length);
        out.put_u16(if self.input.is_empty() {
            0
        } else {
            (HEADER_SIZE + 40) as u16
        });
        out.put_u16(0);
        out.put_u32(self.input.len() as u32);
        out.put_u32(self.additional_information);
        out.put_u32(self.flags);
        self.file_id.write(out);
        out.extend_from_slice(self.input);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetInfoRequest<'a> {
    pub info_type: u8,
    pub info_class: u8,
    pub buffer: &'a [u8],
    pub additional_information: u32,
    pub file_id: FileId,
}

impl<'a> SetInfoRequest<'a> {
    pub const STRUCTURE_SIZE: u16 = 33;

    pub fn parse(body: &'a [u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let info_type = r.u8()?;
        let info_class = r.u8()?;
        let len = r.u32()? as usize;
        let off = r.u16()? as usize;
        r.skip(2)?;
        let additional_information = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        Ok(SetInfoRequest {
            info_type,
            info_class,
            buffer: body_buffer(body, off, len)?,
            additional_information,
            file_id,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.info_type);
        out.put_u8(self.info_class);
        out.put_u32(self.buffer.len() as u32);
        out.put_u16((HEADER_SIZE + 32) as u16);
        out.put_u16(0);
        out.put_u32(self.additional_information);
        self.file_id.write(out);
        out.extend_from_slice(self.buffer);
    }
}

pub fn encode_set_info_response(out: &mut Vec<u8>) {
    out.put_u16(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        let q = QueryInfoRequest {
            info_type: info_type::FILE,
            info_class: 18,
            output_buffer_length: 4096,
            input: &[],
            additional_information: 0,
            flags: 0,
            file_id: FileId::default(),
        };
        let mut out = Vec::new();
        q.encode(&mut out);
        assert_eq!(QueryInfoRequest::parse(&out).unwrap(), q);
        let buf = [0u8; 40];
        let s = SetInfoRequest {
            info_type: info_type::FILE,
            info_class: 4,
            buffer: &buf,
            additional_information: 0,
            file_id: FileId::default(),
        };
        out.clear();
        s.encode(&mut out);
        assert_eq!(SetInfoRequest::parse(&out).unwrap(), s);
        assert!(SetInfoRequest::parse(&out[..out.len() - 1]).is_err());
    }
}
