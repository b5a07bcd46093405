//! MS-SMB2 2.2.9 SMB2 TREE_CONNECT Request and 2.2.10 Response.

use crate::codec::{body_buffer, utf16le_to_string, Put, Reader, WireResult, HEADER_SIZE};

/// MS-SMB2 2.2.10 ShareType.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ShareType {
    Disk = 0x01,
    Pipe = 0x02,
    Print = 0x03,
}

/// MS-SMB2 2.2.10 ShareFlags.
pub mod share_flags {
    pub const MANUAL_CACHING: u32 = 0x0000_0000;
    pub const NO_CACHING: u32 = 0x0000_0030;
    pub const ACCESS_BASED_DIRECTORY_ENUM: u32 = 0x0000_0800;
    pub const ENCRYPT_DATA: u32 = 0x0000_8000;
}

/// MS-SMB2 2.2.10 Capabilities: the share is continuously available
/// (persistent handles may be asked for).
pub const SHARE_CAP_CONTINUOUS_AVAILABILITY: u32 = 0x0000_0010;
/// MS-SMB2 2.2.10: the share is served by every node of a scale-out
/// cluster.
pub const SHARE_CAP_SCALEOUT: u32 = 0x0000_0020;
/// MS-SMB2 2.2.10: the share's availability is monitored by the witness
/// service (MS-SWN): a client registers for it.
pub const SHARE_CAP_CLUSTER: u32 = 0x0000_0040;

/// MS-SMB2 2.2.9: with EXTENSION_PRESENT (3.1.1) the path offset is
/// relative to the extension; the server reads PathOffset either way.
pub const FLAG_EXTENSION_PRESENT: u16 = 0x0004;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeConnectRequest {
    pub flags: u16,
    /// `\\server\share` as the client sent it.
    pub path: String,
}

impl TreeConnectRequest {
    pub const STRUCTURE_SIZE: u16 = 9;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let flags = r.u16()?;
        let off = r.u16()? as usize;
        let len = r.u16()? as usize;
        let path = utf16le_to_string(body_buffer(body, off, len)?)?;
        Ok(TreeConnectRequest { flags, path })
    }

    /// The share name: the last component of the UNC path.
    pub fn share_name(&self) -> &str {
        self.path
            .trim_end_matches('\\')
            .rsplit('\\')
            .next()
            .unwrap_or("")
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let name = crate::codec::utf16le(&self.path);
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.flags);
        out.put_u16((HEADER_SIZE + 8) as u16);
        out.put_u16(name.len() as u16);
        out.extend_from_slice(&name);
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeConnectResponse {
    pub share_type: ShareType,
    pub share_flags: u32,
    pub capabilities: u32,
    pub maximal_access: u32,
}

impl TreeConnectResponse {
    pub const STRUCTURE_SIZE: u16 = 16;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.share_type as u8);
        out.put_u8(0);
        out.put_u32(self.share_flags);
        out.put_u32(self.capabilities);
        out.put_u32(self.maximal_access);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_unc_share_name() {
        let req = TreeConnectRequest {
            flags: 0,
            path: r"\\127.0.0.1\Data".into(),
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        let parsed = TreeConnectRequest::parse(&out).unwrap();
        assert_eq!(parsed.share_name(), "Data");
        for n in 0..out.len() {
            assert!(TreeConnectRequest::parse(&out[..n]).is_err());
        }
    }
}
