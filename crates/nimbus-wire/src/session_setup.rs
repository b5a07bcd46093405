//! MS-SMB2 2.2.5 SMB2 SESSION_SETUP Request and 2.2.6 Response.

use crate::codec::{body_buffer, Put, Reader, WireResult, HEADER_SIZE};

/// MS-SMB2 2.2.5 Flags.
pub const FLAG_BINDING: u8 = 0x01;

/// MS-SMB2 2.2.6 SessionFlags.
pub mod session_flags {
    pub const IS_GUEST: u16 = 0x0001;
    pub const IS_NULL: u16 = 0x0002;
    pub const ENCRYPT_DATA: u16 = 0x0004;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSetupRequest<'a> {
    pub flags: u8,
    pub security_mode: u8,
    pub capabilities: u32,
    pub previous_session_id: u64,
    pub security_buffer: &'a [u8],
}

impl<'a> SessionSetupRequest<'a> {
    pub const STRUCTURE_SIZE: u16 = 25;

    pub fn parse(body: &'a [u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let flags = r.u8()?;
        let security_mode = r.u8()?;
        let capabilities = r.u32()?;
        let _channel = r.u32()?;
        let off = r.u16()? as usize;
        let len = r.u16()? as usize;
        let previous_session_id = r.u64()?;
        Ok(SessionSetupRequest {
            flags,
            security_mode,
            capabilities,
            previous_session_id,
            security_buffer: body_buffer(body, off, len)?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.flags);
        out.put_u8(self.security_mode);
        out.put_u32(self.capabilities);
        out.put_u32(0);
        out.put_u16((HEADER_SIZE + 24) as u16);
        out.put_u16(self.security_buffer.len() as u16);
        out.put_u64(self.previous_session_id);
        out.extend_from_slice(self.security_buffer);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSetupResponse {
    pub session_flags: u16,
    pub security_buffer: Vec<u8>,
}

impl SessionSetupResponse {
    pub const STRUCTURE_SIZE: u16 = 9;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.session_flags);
        out.put_u16((HEADER_SIZE + 8) as u16);
        out.put_u16(self.security_buffer.len() as u16);
        out.extend_from_slice(&self.security_buffer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_truncation() {
        let token = [0x60, 0x48, 1, 2, 3];
        let req = SessionSetupRequest {
            flags: 0,
            security_mode: 1,
            capabilities: 1,
            previous_session_id: 0,
            security_buffer: &token,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(SessionSetupRequest::parse(&out).unwrap(), req);
        for n in 0..out.len() {
            assert!(SessionSetupRequest::parse(&out[..n]).is_err());
        }
    }

    #[test]
    fn response_layout() {
        let mut out = Vec::new();
        SessionSetupResponse {
            session_flags: 0,
            security_buffer: vec![0xA1, 0x00],
        }
        .encode(&mut out);
        assert_eq!(out, [9, 0, 0, 0, 72, 0, 2, 0, 0xA1, 0x00]);
    }
}
