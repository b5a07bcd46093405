//! The durable handle create contexts: MS-SMB2 2.2.13.2.3-4 (v1 request and
//! reconnect), 2.2.13.2.11-12 (v2 request and reconnect), and their
//! responses 2.2.14.2.3 and 2.2.14.2.12.

use crate::codec::{Put, Reader, WireError, WireResult};
use crate::file_id::FileId;

/// MS-SMB2 2.2.13.2.11 Flags: a persistent handle is asked for (or, in a
/// response, granted).
pub const FLAG_PERSISTENT: u32 = 0x0000_0002;

/// Refuses a context whose data is not exactly `len` bytes: each durable
/// context has one fixed size, and Windows refuses any other.
fn exact(data: &[u8], len: usize) -> WireResult<Reader<'_>> {
    if data.len() != len {
        return Err(WireError::Invalid("durable handle context size"));
    }
    Ok(Reader::new(data))
}

/// MS-SMB2 2.2.13.2.3 SMB2_CREATE_DURABLE_HANDLE_REQUEST ("DHnQ"): 16
/// reserved bytes, nothing to read.
pub fn parse_request_v1(data: &[u8]) -> WireResult<()> {
    exact(data, 16).map(|_| ())
}

/// MS-SMB2 2.2.13.2.4 SMB2_CREATE_DURABLE_HANDLE_RECONNECT ("DHnC"): the
/// FileId of the open to reclaim.
pub fn parse_reconnect_v1(data: &[u8]) -> WireResult<FileId> {
    FileId::read(&mut exact(data, 16)?)
}

/// MS-SMB2 2.2.13.2.11 SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2 ("DH2Q").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestV2 {
    /// Milliseconds the client asks the handle to be kept; 0: the server's
    /// default.
    pub timeout_ms: u32,
    pub flags: u32,
    pub create_guid: [u8; 16],
}

impl RequestV2 {
    pub const LEN: usize = 32;

    pub fn parse(data: &[u8]) -> WireResult<RequestV2> {
        let mut r = exact(data, Self::LEN)?;
        let timeout_ms = r.u32()?;
        let flags = r.u32()?;
        r.skip(8)?; // Reserved
        let create_guid = r.array()?;
        Ok(RequestV2 {
            timeout_ms,
            flags,
            create_guid,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.timeout_ms);
        out.put_u32(self.flags);
        out.put_u64(0);
        out.extend_from_slice(&self.create_guid);
    }
}

/// MS-SMB2 2.2.13.2.12 SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2 ("DH2C").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReconnectV2 {
    pub file_id: FileId,
    pub create_guid: [u8; 16],
    pub flags: u32,
}

impl ReconnectV2 {
    pub const LEN: usize = 36;

    pub fn parse(data: &[u8]) -> WireResult<ReconnectV2> {
        let mut r = exact(data, Self::LEN)?;
        Ok(ReconnectV2 {
            file_id: FileId::read(&mut r)?,
            create_guid: r.array()?,
            flags: r.u32()?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        self.file_id.write(out);
        out.extend_from_slice(&self.create_guid);
        out.put_u32(self.flags);
    }
}

/// MS-SMB2 2.2.14.2.3 SMB2_CREATE_DURABLE_HANDLE_RESPONSE: 8 reserved bytes.
pub fn encode_response_v1(out: &mut Vec<u8>) {
    out.put_u64(0);
}

/// MS-SMB2 2.2.14.2.12 SMB2_CREATE_DURABLE_HANDLE_RESPONSE_V2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseV2 {
    /// Milliseconds the server keeps the handle for a reconnect.
    pub timeout_ms: u32,
    pub flags: u32,
}

impl ResponseV2 {
    pub const LEN: usize = 8;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.timeout_ms);
        out.put_u32(self.flags);
    }

    pub fn parse(data: &[u8]) -> WireResult<ResponseV2> {
        let mut r = exact(data, Self::LEN)?;
        Ok(ResponseV2 {
            timeout_ms: r.u32()?,
            flags: r.u32()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn request_v2_layout() {
        // MS-SMB2 2.2.13.2.11: Timeout, Flags, 8 reserved, CreateGuid.
        let data = hex("60ea0000 02000000 0000000000000000 \
             00112233445566778899aabbccddeeff");
        let req = RequestV2::parse(&data).unwrap();
        assert_eq!(req.timeout_ms, 60_000);
        assert_eq!(req.flags, FLAG_PERSISTENT);
        assert_eq!(req.create_guid[0], 0x00);
        assert_eq!(req.create_guid[15], 0xff);
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out, data);
    }

    #[test]
    fn reconnect_v2_layout() {
        // MS-SMB2 2.2.13.2.12: FileId (persistent, volatile), CreateGuid, Flags.
        let data = hex("0100000000000000 0200000000000000 \
             ffeeddccbbaa99887766554433221100 00000000");
        let r = ReconnectV2::parse(&data).unwrap();
        assert_eq!(
            r.file_id,
            FileId {
                persistent: 1,
                volatile: 2
            }
        );
        assert_eq!(r.create_guid[0], 0xff);
        assert_eq!(r.flags, 0);
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out, data);
    }

    #[test]
    fn v1_contexts() {
        assert!(parse_request_v1(&[0; 16]).is_ok());
        let id = parse_reconnect_v1(&hex("0700000000000000 0900000000000000")).unwrap();
        assert_eq!((id.persistent, id.volatile), (7, 9));
        let mut out = Vec::new();
        encode_response_v1(&mut out);
        assert_eq!(out, [0; 8]);
    }

    #[test]
    fn wrong_sizes_are_refused() {
        assert!(parse_request_v1(&[0; 15]).is_err());
        assert!(parse_request_v1(&[0; 17]).is_err());
        assert!(parse_reconnect_v1(&[]).is_err());
        assert!(RequestV2::parse(&[0; 31]).is_err());
        assert!(RequestV2::parse(&[0; 33]).is_err());
        assert!(ReconnectV2::parse(&[0; 35]).is_err());
        assert!(ResponseV2::parse(&[0; 4]).is_err());
    }

    #[test]
    fn response_v2_layout() {
        let mut out = Vec::new();
        ResponseV2 {
            timeout_ms: 180_000,
            flags: FLAG_PERSISTENT,
        }
        .encode(&mut out);
        assert_eq!(out, hex("20bf0200 02000000"));
        assert_eq!(
            ResponseV2::parse(&out).unwrap(),
            ResponseV2 {
                timeout_ms: 180_000,
                flags: FLAG_PERSISTENT
            }
        );
    }
}
