//! MS-SMB2 2.2.13 SMB2 CREATE Request, 2.2.13.2 create contexts and
//! 2.2.14 SMB2 CREATE Response.

use crate::codec::{
    body_buffer, utf16le_to_string, Put, Reader, WireError, WireResult, HEADER_SIZE,
};
use crate::file_id::FileId;

/// MS-SMB2 2.2.13 CreateDisposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateDisposition {
    Supersede = 0,
    Open = 1,
    Create = 2,
    OpenIf = 3,
    Overwrite = 4,
    OverwriteIf = 5,
}

impl CreateDisposition {
    pub fn from_u32(v: u32) -> Option<Self> {
        use CreateDisposition::*;
        Some(match v {
            0 => Supersede,
            1 => Open,
            2 => Create,
            3 => OpenIf,
            4 => Overwrite,
            5 => OverwriteIf,
            _ => return None,
        })
    }

    /// Whether a missing file is created (MS-SMB2 2.2.13 CreateDisposition).
    pub fn creates(self) -> bool {
        use CreateDisposition::*;
        matches!(self, Supersede | Create | OpenIf | OverwriteIf)
    }
}

/// MS-SMB2 2.2.14 CreateAction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateAction {
    Superseded = 0,
    Opened = 1,
    Created = 2,
    Overwritten = 3,
}

/// MS-SMB2 2.2.13 CreateOptions.
pub mod create_options {
    pub const DIRECTORY_FILE: u32 = 0x0000_0001;
    pub const WRITE_THROUGH: u32 = 0x0000_0002;
    pub const SEQUENTIAL_ONLY: u32 = 0x0000_0004;
    pub const NO_INTERMEDIATE_BUFFERING: u32 = 0x0000_0008;
    pub const SYNCHRONOUS_IO_ALERT: u32 = 0x0000_0010;
    pub const SYNCHRONOUS_IO_NONALERT: u32 = 0x0000_0020;
    pub const NON_DIRECTORY_FILE: u32 = 0x0000_0040;
    pub const COMPLETE_IF_OPLOCKED: u32 = 0x0000_0100;
    pub const NO_EA_KNOWLEDGE: u32 = 0x0000_0200;
    pub const RANDOM_ACCESS: u32 = 0x0000_0800;
    pub const DELETE_ON_CLOSE: u32 = 0x0000_1000;
    pub const OPEN_BY_FILE_ID: u32 = 0x0000_2000;
    pub const OPEN_FOR_BACKUP_INTENT: u32 = 0x0000_4000;
    pub const NO_COMPRESSION: u32 = 0x0000_8000;
    pub const OPEN_REMOTE_INSTANCE: u32 = 0x0000_0400;
    pub const OPEN_REQUIRING_OPLOCK: u32 = 0x0001_0000;
    pub const DISALLOW_EXCLUSIVE: u32 = 0x0002_0000;
    pub const RESERVE_OPFILTER: u32 = 0x0010_0000;
    pub const OPEN_REPARSE_POINT: u32 = 0x0020_0000;
    pub const OPEN_NO_RECALL: u32 = 0x0040_0000;
    pub const OPEN_FOR_FREE_SPACE_QUERY: u32 = 0x0080_0000;
    /// Bits a client may set; anything else is STATUS_INVALID_PARAMETER.
    pub const VALID_MASK: u32 = 0x00FF_FFFF;
}

/// MS-SMB2 2.2.13 ShareAccess.
pub mod share_access {
    pub const READ: u32 = 0x1;
    pub const WRITE: u32 = 0x2;
    pub const DELETE: u32 = 0x4;
    pub const ALL: u32 = READ | WRITE | DELETE;
}

/// MS-SMB2 2.2.13 ImpersonationLevel: values above Delegate are invalid.
pub const IMPERSONATION_DELEGATE: u32 = 3;

/// MS-SMB2 2.2.13.2 SMB2_CREATE_CONTEXT, kept raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateContext {
    pub name: Vec<u8>,
    pub data: Vec<u8>,
}

/// Well-known create context names (MS-SMB2 2.2.13.2).
pub mod context_name {
    pub const EA_BUFFER: &[u8] = b"ExtA";
    pub const SD_BUFFER: &[u8] = b"SecD";
    pub const DURABLE_HANDLE_REQUEST: &[u8] = b"DHnQ";
    pub const DURABLE_HANDLE_RECONNECT: &[u8] = b"DHnC";
    pub const DURABLE_HANDLE_REQUEST_V2: &[u8] = b"DH2Q";
    pub const DURABLE_HANDLE_RECONNECT_V2: &[u8] = b"DH2C";
    pub const APP_INSTANCE_ID: &[u8] = &[
        0x45, 0xBC, 0xA6, 0x6A, 0xEF, 0xA7, 0xF7, 0x4A, 0x90, 0x08, 0xFA, 0x46, 0x2E, 0x14, 0x4D,
        0x74,
    ];
    pub const ALLOCATION_SIZE: &[u8] = b"AlSi";
    pub const QUERY_MAXIMAL_ACCESS: &[u8] = b"MxAc";
    pub const TIMEWARP_TOKEN: &[u8] = b"TWrp";
    pub const QUERY_ON_DISK_ID: &[u8] = b"QFid";
    pub const REQUEST_LEASE: &[u8] = b"RqLs";
}

/// Parses a chain of create contexts (each 8-byte aligned, linked by Next).
pub fn parse_create_contexts(buf: &[u8]) -> WireResult<Vec<CreateContext>> {
    let mut out = Vec::new();
    let mut pos = 0usize;
    loop {
        let ctx = buf.get(pos..).ok_or(WireError::Truncated)?;
        let mut r = Reader::new(ctx);
        let next = r.u32()? as usize;
        let name_off = r.u16()? as usize;
        let name_len = r.u16()? as usize;
        r.skip(2)?;
        let data_off = r.u16()? as usize;
        let data_len = r.u32()? as usize;
        let limit = if next == 0 {
            ctx.len()
        } else {
            next.min(ctx.len())
        };
        let slice = |off: usize, len: usize| -> WireResult<&[u8]> {
            if len == 0 {
                return Ok(&[]);
            }
            let end = off.checked_add(len).ok_or(WireError::Truncated)?;
            if off < 16 || end > limit {
                return Err(WireError::Invalid("create context bounds"));
            }
            Ok(&ctx[off..end])
        };
        let name = slice(name_off, name_len)?;
        if name.is_empty() {
            return Err(WireError::Invalid("create context without a name"));
        }
        out.push(CreateContext {
            name: name.to_vec(),
            data: slice(data_off, data_len)?.to_vec(),
        });
        if next == 0 {
            return Ok(out);
        }
        if !next.is_multiple_of(8) || next < 16 {
            return Err(WireError::Invalid("create context Next"));
        }
        pos = pos.checked_add(next).ok_or(WireError::Truncated)?;
    }
}

/// Encodes a chain of create contexts; the caller places it 8-byte aligned.
pub fn encode_create_contexts(out: &mut Vec<u8>, contexts: &[CreateContext]) {
    for (i, c) in contexts.iter().enumerate() {
        let start = out.len();
        out.put_u32(0);
        out.put_u16(16);
        out.put_u16(c.name.len() as u16);
        out.put_u16(0);
        // The name sits at 16; the data starts 8-byte aligned after it.
        let data_off = (16 + c.name.len()).next_multiple_of(8);
        out.put_u16(if c.data.is_empty() {
            0
        } else {
            data_off as u16
        });
        out.put_u32(c.data.len() as u32);
        out.extend_from_slice(&c.name);
        if !c.data.is_empty() {
            out.resize(start + data_off, 0);
            out.extend_from_slice(&c.data);
        }
        if i + 1 < contexts.len() {
            let len = (out.len() - start).next_multiple_of(8);
            out.resize(start + len, 0);
            out.patch_u32(start, len as u32);
        }
    }
}

/// Appends a create context chain 8-byte aligned from the body start
/// `base`, and fills in the CreateContextsOffset/Length pair at `ctx_at`.
fn put_contexts_at(out: &mut Vec<u8>, base: usize, ctx_at: usize, contexts: &[CreateContext]) {
    out.align_to_from(base, 8);
    let start = out.len();
    encode_create_contexts(out, contexts);
    out.patch_u32(ctx_at, (HEADER_SIZE + start - base) as u32);
    out.patch_u32(ctx_at + 4, (out.len() - start) as u32);
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRequest {
    pub requested_oplock_level: u8,
    pub impersonation_level: u32,
    pub desired_access: u32,
    pub file_attributes: u32,
    pub share_access: u32,
    pub create_disposition: u32,
    pub create_options: u32,
    /// The path relative to the share, backslash-separated, as sent.
    pub name: String,
    pub contexts: Vec<CreateContext>,
}

impl CreateRequest {
    pub const STRUCTURE_SIZE: u16 = 57;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let _security_flags = r.u8()?;
        let requested_oplock_level = r.u8()?;
        let impersonation_level = r.u32()?;
        let _smb_create_flags = r.u64()?;
        let _reserved = r.u64()?;
        let desired_access = r.u32()?;
        let file_attributes = r.u32()?;
        let share_access = r.u32()?;
        let create_disposition = r.u32()?;
        let create_options = r.u32()?;
        let name_off = r.u16()? as usize;
        let name_len = r.u16()? as usize;
        let ctx_off = r.u32()? as usize;
        let ctx_len = r.u32()? as usize;
        let name = utf16le_to_string(body_buffer(body, name_off, name_len)?)?;
        let contexts = if ctx_len == 0 {
            Vec::new()
        } else {
            parse_create_contexts(body_buffer(body, ctx_off, ctx_len)?)?
        };
        Ok(CreateRequest {
            requested_oplock_level,
            impersonation_level,
            desired_access,
            file_attributes,
            share_access,
            create_disposition,
            create_options,
            name,
            contexts,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let base = out.len();
        let name = crate::codec::utf16le(&self.name);
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(0);
        out.put_u8(self.requested_oplock_level);
        out.put_u32(self.impersonation_level);
        out.put_u64(0);
        out.put_u64(0);
        out.put_u32(self.desired_access);
        out.put_u32(self.file_attributes);
        out.put_u32(self.share_access);
        out.put_u32(self.create_disposition);
        out.put_u32(self.create_options);
        out.put_u16((HEADER_SIZE + 56) as u16);
        out.put_u16(name.len() as u16);
        let ctx_at = out.len();
        out.put_u32(0);
        out.put_u32(0);
        out.extend_from_slice(&name);
        if name.is_empty() {
            out.put_u8(0);
        }
        if !self.contexts.is_empty() {
            put_contexts_at(out, base, ctx_at, &self.contexts);
        }
    }
}

/// Times and sizes reported by CREATE and CLOSE (FILETIME values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileTimesAndSizes {
    pub creation_time: u64,
    pub last_access_time: u64,
    pub last_write_time: u64,
    pub change_time: u64,
    pub allocation_size: u64,
    pub end_of_file: u64,
    pub file_attributes: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateResponse {
    pub oplock_level: u8,
    pub create_action: CreateAction,
    pub info: FileTimesAndSizes,
    pub file_id: FileId,
    pub contexts: Vec<CreateContext>,
}

impl CreateResponse {
    pub const STRUCTURE_SIZE: u16 = 89;

    pub fn encode(&self, out: &mut Vec<u8>) {
        let base = out.len();
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.oplock_level);
        out.put_u8(0);
        out.put_u32(self.create_action as u32);
        out.put_u64(self.info.creation_time);
        out.put_u64(self.info.last_access_time);
        out.put_u64(self.info.last_write_time);
        out.put_u64(self.info.change_time);
        out.put_u64(self.info.allocation_size);
        out.put_u64(self.info.end_of_file);
        out.put_u32(self.info.file_attributes);
        out.put_u32(0);
        self.file_id.write(out);
        let ctx_at = out.len();
        out.put_u32(0);
        out.put_u32(0);
        if self.contexts.is_empty() {
            out.put_zeros(1);
        } else {
            put_contexts_at(out, base, ctx_at, &self.contexts);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_with_contexts() {
        let req = CreateRequest {
            requested_oplock_level: 0,
            impersonation_level: 2,
            desired_access: 0x0012_0089,
            file_attributes: 0x80,
            share_access: share_access::ALL,
            create_disposition: CreateDisposition::OpenIf as u32,
            create_options: create_options::NON_DIRECTORY_FILE,
            name: r"dir\file.txt".into(),
            contexts: vec![
                CreateContext {
                    name: context_name::QUERY_MAXIMAL_ACCESS.to_vec(),
                    data: vec![],
                },
                CreateContext {
                    name: context_name::ALLOCATION_SIZE.to_vec(),
                    data: 4096u64.to_le_bytes().to_vec(),
                },
            ],
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(CreateRequest::parse(&out).unwrap(), req);
        for n in 0..out.len() {
            assert!(CreateRequest::parse(&out[..n]).is_err(), "{n}");
        }
    }

    #[test]
    fn hostile_contexts_refused() {
        // Next pointing back at itself would loop forever if it were accepted.
        let mut c = Vec::new();
        encode_create_contexts(
            &mut c,
            &[CreateContext {
                name: b"MxAc".to_vec(),
                data: vec![],
            }],
        );
        c[0] = 0; // Next = 0 is fine
        assert!(parse_create_contexts(&c).is_ok());
        c.resize(24, 0);
        c[0] = 8; // Next smaller than a header
        assert!(parse_create_contexts(&c).is_err());
        let mut huge = c.clone();
        huge[10] = 0xFF; // data offset past the end
        huge[12] = 0x10;
        assert!(parse_create_contexts(&huge).is_err());
    }
}
