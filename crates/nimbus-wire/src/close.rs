//! MS-SMB2 2.2.15 SMB2 CLOSE Request and 2.2.16 Response.

use crate::codec::{Put, Reader, WireResult};
use crate::create::FileTimesAndSizes;
use crate::file_id::FileId;

/// MS-SMB2 2.2.15 Flags: return the attributes in the response.
pub const FLAG_POSTQUERY_ATTRIB: u16 = 0x0001;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseRequest {
    pub flags: u16,
    pub file_id: FileId,
}

impl CloseRequest {
    pub const STRUCTURE_SIZE: u16 = 24;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let flags = r.u16()?;
        r.skip(4)?;
        Ok(CloseRequest {
            flags,
            file_id: FileId::read(&mut r)?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.flags);
        out.put_u32(0);
        self.file_id.write(out);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloseResponse {
    pub flags: u16,
    /// All zero unless POSTQUERY_ATTRIB was asked for.
    pub info: FileTimesAndSizes,
}

impl CloseResponse {
    pub const STRUCTURE_SIZE: u16 = 60;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.flags);
        out.put_u32(0);
        out.put_u64(self.info.creation_time);
        out.put_u64(self.info.last_access_time);
        out.put_u64(self.info.last_write_time);
        out.put_u64(self.info.change_time);
        out.put_u64(self.info.allocation_size);
        out.put_u64(self.info.end_of_file);
        out.put_u32(self.info.file_attributes);
    }
}

/// MS-SMB2 2.2.17 SMB2 FLUSH Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushRequest {
    pub file_id: FileId,
}

impl FlushRequest {
    pub const STRUCTURE_SIZE: u16 = 24;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        r.skip(6)?;
        Ok(FlushRequest {
            file_id: FileId::read(&mut r)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_round_trip_and_response_size() {
        let req = CloseRequest {
            flags: FLAG_POSTQUERY_ATTRIB,
            file_id: FileId {
                persistent: 1,
                volatile: 2,
            },
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(CloseRequest::parse(&out).unwrap(), req);
        assert!(CloseRequest::parse(&out[..23]).is_err());
        out.clear();
        CloseResponse {
            flags: 0,
            info: FileTimesAndSizes::default(),
        }
        .encode(&mut out);
        assert_eq!(out.len(), 60);
    }
}
