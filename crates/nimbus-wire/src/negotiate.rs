//! MS-SMB2 2.2.3 SMB2 NEGOTIATE Request and 2.2.4 SMB2 NEGOTIATE Response,
//! with the 3.1.1 negotiate contexts of 2.2.3.1 / 2.2.4.1.

use crate::codec::{body_buffer, Put, Reader, WireError, WireResult, HEADER_SIZE};

/// MS-SMB2 2.2.3 Dialects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u16)]
pub enum Dialect {
    Smb202 = 0x0202,
    Smb210 = 0x0210,
    Smb300 = 0x0300,
    Smb302 = 0x0302,
    Smb311 = 0x0311,
}

impl Dialect {
    pub const ALL: [Dialect; 5] = [
        Dialect::Smb202,
        Dialect::Smb210,
        Dialect::Smb300,
        Dialect::Smb302,
        Dialect::Smb311,
    ];

    pub fn from_u16(v: u16) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| *d as u16 == v)
    }

    /// SMB 3.x dialects use AES-CMAC signing, KDF-derived keys and
    /// FSCTL_VALIDATE_NEGOTIATE_INFO.
    pub fn is_smb3(self) -> bool {
        self >= Dialect::Smb300
    }
}

/// "SMB 2.???": the multi-protocol wildcard dialect (MS-SMB2 2.2.4).
pub const DIALECT_WILDCARD: u16 = 0x02FF;

/// MS-SMB2 2.2.3 SecurityMode.
pub mod security_mode {
    pub const SIGNING_ENABLED: u16 = 0x0001;
    pub const SIGNING_REQUIRED: u16 = 0x0002;
}

/// MS-SMB2 2.2.3 Capabilities.
pub mod capabilities {
    pub const DFS: u32 = 0x01;
    pub const LEASING: u32 = 0x02;
    pub const LARGE_MTU: u32 = 0x04;
    pub const MULTI_CHANNEL: u32 = 0x08;
    pub const PERSISTENT_HANDLES: u32 = 0x10;
    pub const DIRECTORY_LEASING: u32 = 0x20;
    pub const ENCRYPTION: u32 = 0x40;
}

/// MS-SMB2 2.2.3.1 ContextType values.
pub mod context_type {
    pub const PREAUTH_INTEGRITY_CAPABILITIES: u16 = 0x0001;
    pub const ENCRYPTION_CAPABILITIES: u16 = 0x0002;
    pub const COMPRESSION_CAPABILITIES: u16 = 0x0003;
    pub const NETNAME_NEGOTIATE_CONTEXT_ID: u16 = 0x0005;
    pub const TRANSPORT_CAPABILITIES: u16 = 0x0006;
    pub const RDMA_TRANSFORM_CAPABILITIES: u16 = 0x0007;
    pub const SIGNING_CAPABILITIES: u16 = 0x0008;
}

/// MS-SMB2 2.2.3.1.1 HashAlgorithms: SHA-512 is the only one defined.
pub const HASH_SHA512: u16 = 0x0001;

/// MS-SMB2 2.2.3.1.2 Ciphers.
pub mod cipher {
    pub const AES_128_CCM: u16 = 0x0001;
    pub const AES_128_GCM: u16 = 0x0002;
    pub const AES_256_CCM: u16 = 0x0003;
    pub const AES_256_GCM: u16 = 0x0004;
}

/// MS-SMB2 2.2.3.1 SMB2 NEGOTIATE_CONTEXT, kept raw; the typed views below
/// decode the ones the server acts on and the rest are ignored as the spec says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiateContext {
    pub context_type: u16,
    pub data: Vec<u8>,
}

/// MS-SMB2 2.2.3 SMB2 NEGOTIATE Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiateRequest {
    pub security_mode: u16,
    pub capabilities: u32,
    pub client_guid: [u8; 16],
    pub dialects: Vec<u16>,
    /// Present only when the client offers 3.1.1.
    pub contexts: Vec<NegotiateContext>,
}

impl NegotiateRequest {
    pub const STRUCTURE_SIZE: u16 = 36;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let dialect_count = r.u16()? as usize;
        let security_mode = r.u16()?;
        r.skip(2)?;
        let capabilities = r.u32()?;
        let client_guid = r.array()?;
        let context_offset = r.u32()? as usize;
        let context_count = r.u16()? as usize;
        r.skip(2)?;
        if dialect_count == 0 {
            return Err(WireError::Invalid("DialectCount is zero"));
        }
        let dialects = (0..dialect_count)
            .map(|_| r.u16())
            .collect::<WireResult<Vec<u16>>>()?;
        let contexts = if dialects.contains(&(Dialect::Smb311 as u16)) {
            parse_contexts(body, context_offset, context_count)?
        } else {
            Vec::new()
        };
        Ok(NegotiateRequest {
            security_mode,
            capabilities,
            client_guid,
            dialects,
            contexts,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let base = out.len();
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.dialects.len() as u16);
        out.put_u16(self.security_mode);
        out.put_u16(0);
        out.put_u32(self.capabilities);
        out.extend_from_slice(&self.client_guid);
        let offset_at = out.len();
        out.put_u32(0);
        out.put_u16(self.contexts.len() as u16);
        out.put_u16(0);
        for d in &self.dialects {
            out.put_u16(*d);
        }
        if !self.contexts.is_empty() {
            align_body(out, base);
            let off = (HEADER_SIZE + out.len() - base) as u32;
            out.patch_u32(offset_at, off);
            put_contexts(out, base, &self.contexts);
        }
    }
}

/// Parses `count` negotiate contexts starting at header-relative `offset`.
/// Each context after the first starts 8-byte aligned (relative to the
/// header, which is itself 8-byte aligned).
fn parse_contexts(body: &[u8], offset: usize, count: usize) -> WireResult<Vec<NegotiateContext>> {
    if count == 0 {
        return Ok(Vec::new());
    }
    let start = offset
        .checked_sub(HEADER_SIZE)
        .ok_or(WireError::Invalid("NegotiateContextOffset"))?;
    let area = body.get(start..).ok_or(WireError::Truncated)?;
    let mut contexts = Vec::new();
    let mut pos = 0usize;
    for i in 0..count {
        if i > 0 {
            pos = pos.next_multiple_of(8);
        }
        let mut r = Reader::new(area.get(pos..).ok_or(WireError::Truncated)?);
        let context_type = r.u16()?;
        let len = r.u16()? as usize;
        r.skip(4)?;
        contexts.push(NegotiateContext {
            context_type,
            data: r.bytes(len)?.to_vec(),
        });
        pos += 8 + len;
    }
    Ok(contexts)
}

/// Pads so that the next byte is 8-byte aligned relative to the header start.
fn align_body(out: &mut Vec<u8>, body_base: usize) {
    out.align_to_from(body_base, 8);
}

fn put_contexts(out: &mut Vec<u8>, body_base: usize, contexts: &[NegotiateContext]) {
    for (i, c) in contexts.iter().enumerate() {
        if i > 0 {
            align_body(out, body_base);
        }
        out.put_u16(c.context_type);
        out.put_u16(c.data.len() as u16);
        out.put_u32(0);
        out.extend_from_slice(&c.data);
    }
}

/// MS-SMB2 2.2.3.1.1 SMB2_PREAUTH_INTEGRITY_CAPABILITIES.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreauthIntegrity {
    pub hash_algorithms: Vec<u16>,
    pub salt: Vec<u8>,
}

impl PreauthIntegrity {
    pub fn parse(data: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(data);
        let count = r.u16()? as usize;
        let salt_len = r.u16()? as usize;
        if count == 0 {
            return Err(WireError::Invalid("HashAlgorithmCount is zero"));
        }
        let hash_algorithms = (0..count).map(|_| r.u16()).collect::<WireResult<_>>()?;
        let salt = r.bytes(salt_len)?.to_vec();
        Ok(PreauthIntegrity {
            hash_algorithms,
            salt,
        })
    }

    pub fn to_context(&self) -> NegotiateContext {
        let mut data = Vec::new();
        data.put_u16(self.hash_algorithms.len() as u16);
        data.put_u16(self.salt.len() as u16);
        for h in &self.hash_algorithms {
            data.put_u16(*h);
        }
        data.extend_from_slice(&self.salt);
        NegotiateContext {
            context_type: context_type::PREAUTH_INTEGRITY_CAPABILITIES,
            data,
        }
    }
}

/// A list of 16-bit ids preceded by their count: the shape of both
/// MS-SMB2 2.2.3.1.2 SMB2_ENCRYPTION_CAPABILITIES and
/// 2.2.3.1.7 SMB2_SIGNING_CAPABILITIES.
pub fn parse_id_list(data: &[u8]) -> WireResult<Vec<u16>> {
    let ids = parse_ids(data)?;
    if ids.is_empty() {
        return Err(WireError::Invalid("empty algorithm list"));
    }
    Ok(ids)
}

/// MS-SMB2 2.2.3.1.2 SMB2_ENCRYPTION_CAPABILITIES as a server takes it: a
/// CipherCount of 0 (which 2.2.3.1.2 forbids a client to send, and which
/// some clients send when they do not want encryption) is an empty list,
/// not an error (the NEGOTIATE handler answers it as no context at all);
/// only a list its length cannot hold is malformed.
pub fn parse_cipher_list(data: &[u8]) -> WireResult<Vec<u16>> {
    parse_ids(data)
}

fn parse_ids(data: &[u8]) -> WireResult<Vec<u16>> {
    let mut r = Reader::new(data);
    let count = r.u16()? as usize;
    (0..count).map(|_| r.u16()).collect()
}

pub fn id_list_context(context_type: u16, ids: &[u16]) -> NegotiateContext {
    let mut data = Vec::new();
    data.put_u16(ids.len() as u16);
    for id in ids {
        data.put_u16(*id);
    }
    NegotiateContext { context_type, data }
}

/// MS-SMB2 2.2.4 SMB2 NEGOTIATE Response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiateResponse {
    pub security_mode: u16,
    pub dialect: u16,
    pub server_guid: [u8; 16],
    pub capabilities: u32,
    pub max_transact_size: u32,
    pub max_read_size: u32,
    pub max_write_size: u32,
    pub system_time: u64,
    pub server_start_time: u64,
    pub security_buffer: Vec<u8>,
    pub contexts: Vec<NegotiateContext>,
}

impl NegotiateResponse {
    pub const STRUCTURE_SIZE: u16 = 65;

    pub fn encode(&self, out: &mut Vec<u8>) {
        let base = out.len();
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.security_mode);
        out.put_u16(self.dialect);
        out.put_u16(self.contexts.len() as u16);
        out.extend_from_slice(&self.server_guid);
        out.put_u32(self.capabilities);
        out.put_u32(self.max_transact_size);
        out.put_u32(self.max_read_size);
        out.put_u32(self.max_write_size);
        out.put_u64(self.system_time);
        out.put_u64(self.server_start_time);
        // The security buffer follows the 64-byte fixed part.
        out.put_u16((HEADER_SIZE + 64) as u16);
        out.put_u16(self.security_buffer.len() as u16);
        let ctx_offset_at = out.len();
        out.put_u32(0);
        out.extend_from_slice(&self.security_buffer);
        if !self.contexts.is_empty() {
            align_body(out, base);
            let off = (HEADER_SIZE + out.len() - base) as u32;
            out.patch_u32(ctx_offset_at, off);
            put_contexts(out, base, &self.contexts);
        }
    }

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let security_mode = r.u16()?;
        let dialect = r.u16()?;
        let context_count = r.u16()? as usize;
        let server_guid = r.array()?;
        let capabilities = r.u32()?;
        let max_transact_size = r.u32()?;
        let max_read_size = r.u32()?;
        let max_write_size = r.u32()?;
        let system_time = r.u64()?;
        let server_start_time = r.u64()?;
        let sec_off = r.u16()? as usize;
        let sec_len = r.u16()? as usize;
        let ctx_off = r.u32()? as usize;
        let security_buffer = body_buffer(body, sec_off, sec_len)?.to_vec();
        let contexts = parse_contexts(body, ctx_off, context_count)?;
        Ok(NegotiateResponse {
            security_mode,
            dialect,
            server_guid,
            capabilities,
            max_transact_size,
            max_read_size,
            max_write_size,
            system_time,
            server_start_time,
            security_buffer,
            contexts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_request() -> NegotiateRequest {
        NegotiateRequest {
            security_mode: security_mode::SIGNING_ENABLED,
            capabilities: capabilities::LARGE_MTU,
            client_guid: [7; 16],
            dialects: vec![0x0202, 0x0210, 0x0300, 0x0302, 0x0311],
            contexts: vec![
                PreauthIntegrity {
                    hash_algorithms: vec![HASH_SHA512],
                    salt: vec![1; 32],
                }
                .to_context(),
                id_list_context(context_type::ENCRYPTION_CAPABILITIES, &[2, 1]),
                id_list_context(context_type::SIGNING_CAPABILITIES, &[2, 1, 0]),
            ],
        }
    }

    #[test]
    fn request_round_trip() {
        let req = sample_request();
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(NegotiateRequest::parse(&out).unwrap(), req);
        // Every truncation is refused (tests/truncation.rs covers every decoder).
        for n in 0..out.len() {
            assert!(NegotiateRequest::parse(&out[..n]).is_err(), "{n}");
        }
    }

    #[test]
    fn parses_hand_assembled_request() {
        // A negotiate body laid out by hand from MS-SMB2 2.2.3 (not produced
        // by our encoder): five dialects, then preauth and encryption
        // contexts at 8-byte aligned header-relative offsets.
        let hex_body = "24000500010000007f000000\
            00000000000000000000000000000000\
            70000000020000000202100200030203110300000100260000000000\
            010020000100\
            0000000000000000000000000000000000000000000000000000000000000000\
            0000020006000000000002000200\
            0100";
        let body = hex::decode(hex_body.replace(char::is_whitespace, "")).unwrap();
        let req = NegotiateRequest::parse(&body).unwrap();
        assert_eq!(req.dialects, vec![0x0202, 0x0210, 0x0300, 0x0302, 0x0311]);
        assert_eq!(req.contexts.len(), 2);
        let pre = PreauthIntegrity::parse(&req.contexts[0].data).unwrap();
        assert_eq!(pre.hash_algorithms, vec![HASH_SHA512]);
        assert_eq!(pre.salt.len(), 32);
        assert_eq!(parse_id_list(&req.contexts[1].data).unwrap(), vec![2, 1]);
        // An empty cipher list is no cipher in common; a short one is
        // malformed; an empty signing list stays an error.
        assert_eq!(parse_cipher_list(&[0, 0]).unwrap(), Vec::<u16>::new());
        assert!(parse_cipher_list(&[2, 0, 1, 0]).is_err());
        assert!(parse_id_list(&[0, 0]).is_err());
    }

    #[test]
    fn response_round_trip() {
        let resp = NegotiateResponse {
            security_mode: 3,
            dialect: 0x0311,
            server_guid: [1; 16],
            capabilities: 0x44,
            max_transact_size: 8 << 20,
            max_read_size: 8 << 20,
            max_write_size: 8 << 20,
            system_time: 1,
            server_start_time: 0,
            security_buffer: vec![0x60, 0x03, 1, 2, 3],
            contexts: vec![
                PreauthIntegrity {
                    hash_algorithms: vec![1],
                    salt: vec![5; 32],
                }
                .to_context(),
                id_list_context(context_type::SIGNING_CAPABILITIES, &[2]),
            ],
        };
        let mut out = Vec::new();
        resp.encode(&mut out);
        assert_eq!(NegotiateResponse::parse(&out).unwrap(), resp);
    }

    #[test]
    fn zero_dialects_refused() {
        let mut req = sample_request();
        req.dialects.clear();
        req.contexts.clear();
        let mut out = Vec::new();
        req.encode(&mut out);
        assert!(NegotiateRequest::parse(&out).is_err());
    }
}
