//! Self-relative security descriptors (MS-DTYP 2.4.6), their ACLs (2.4.5)
//! and ACEs (2.4.4), parsed strictly and written back in the layout
//! Windows uses. What a client sends (SET_INFO, the SD_BUFFER create
//! context) and what is stored with a file both go through here, so a
//! descriptor that parses is one the server can also encode.
//!
//! Parsing never trusts a length or count: every offset and size is
//! checked against the buffer, and nothing is allocated ahead of the bytes
//! that back it.

use crate::codec::{Put, Reader};
use crate::dtyp::Sid;

/// MS-DTYP 2.4.6 SECURITY_DESCRIPTOR Control bits.
pub mod control {
    pub const OWNER_DEFAULTED: u16 = 0x0001;
    pub const GROUP_DEFAULTED: u16 = 0x0002;
    pub const DACL_PRESENT: u16 = 0x0004;
    pub const DACL_DEFAULTED: u16 = 0x0008;
    pub const SACL_PRESENT: u16 = 0x0010;
    pub const SACL_DEFAULTED: u16 = 0x0020;
    pub const DACL_AUTO_INHERIT_REQ: u16 = 0x0100;
    pub const SACL_AUTO_INHERIT_REQ: u16 = 0x0200;
    pub const DACL_AUTO_INHERITED: u16 = 0x0400;
    pub const SACL_AUTO_INHERITED: u16 = 0x0800;
    pub const DACL_PROTECTED: u16 = 0x1000;
    pub const SACL_PROTECTED: u16 = 0x2000;
    pub const SELF_RELATIVE: u16 = 0x8000;
}

/// MS-DTYP 2.4.4.1 ACE_HEADER AceType values the server acts on.
pub mod ace_type {
    pub const ACCESS_ALLOWED: u8 = 0x00;
    pub const ACCESS_DENIED: u8 = 0x01;
    pub const SYSTEM_AUDIT: u8 = 0x02;
    pub const SYSTEM_ALARM: u8 = 0x03;
    pub const ACCESS_ALLOWED_COMPOUND: u8 = 0x04;
    pub const ACCESS_ALLOWED_CALLBACK: u8 = 0x09;
    pub const ACCESS_DENIED_CALLBACK: u8 = 0x0A;
    pub const SYSTEM_AUDIT_CALLBACK: u8 = 0x0D;
    pub const SYSTEM_ALARM_CALLBACK: u8 = 0x0E;
    pub const SYSTEM_MANDATORY_LABEL: u8 = 0x11;
    pub const SYSTEM_RESOURCE_ATTRIBUTE: u8 = 0x12;
    pub const SYSTEM_SCOPED_POLICY_ID: u8 = 0x13;
}

/// MS-DTYP 2.4.4.1 ACE_HEADER AceFlags.
pub mod ace_flags {
    pub const OBJECT_INHERIT: u8 = 0x01;
    pub const CONTAINER_INHERIT: u8 = 0x02;
    pub const NO_PROPAGATE_INHERIT: u8 = 0x04;
    pub const INHERIT_ONLY: u8 = 0x08;
    pub const INHERITED: u8 = 0x10;
    pub const SUCCESSFUL_ACCESS: u8 = 0x40;
    pub const FAILED_ACCESS: u8 = 0x80;
    /// The flags that say how an ACE passes to children.
    pub const INHERITANCE: u8 =
        OBJECT_INHERIT | CONTAINER_INHERIT | NO_PROPAGATE_INHERIT | INHERIT_ONLY;
}

/// ACL_REVISION and ACL_REVISION_DS (the latter allows object ACEs).
const ACL_REVISION: u8 = 2;
const ACL_REVISION_DS: u8 = 4;
/// MS-DTYP 2.4.2: a SID has at most 15 sub-authorities.
const MAX_SUB_AUTHORITIES: u8 = 15;
const SD_FIXED: usize = 20;
const ACL_HEADER: usize = 8;

/// Why a descriptor was refused; the server answers with the matching
/// NTSTATUS (INVALID_SECURITY_DESCR, INVALID_ACL, INVALID_SID).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SdError {
    Descriptor(&'static str),
    Acl(&'static str),
    Sid(&'static str),
}

impl Sid {
    /// Parses a SID (MS-DTYP 2.4.2.2) at the reader's position.
    pub fn parse(r: &mut Reader<'_>) -> Result<Sid, SdError> {
        let truncated = SdError::Sid("truncated");
        let revision = r.u8().map_err(|_| truncated)?;
        let count = r.u8().map_err(|_| truncated)?;
        if revision != 1 {
            return Err(SdError::Sid("revision is not 1"));
        }
        if count > MAX_SUB_AUTHORITIES {
            return Err(SdError::Sid("more than 15 sub-authorities"));
        }
        let auth = r.bytes(6).map_err(|_| truncated)?;
        let mut authority = [0u8; 8];
        authority[2..].copy_from_slice(auth);
        let mut sub_authorities = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            sub_authorities.push(r.u32().map_err(|_| truncated)?);
        }
        Ok(Sid {
            authority: u64::from_be_bytes(authority),
            sub_authorities,
        })
    }

    /// A SID in its own buffer.
    pub fn from_bytes(bytes: &[u8]) -> Result<Sid, SdError> {
        Sid::parse(&mut Reader::new(bytes))
    }
}

/// One ACE (MS-DTYP 2.4.4). Every ACE type starts with its access mask;
/// the SID follows it (after the object fields of the object types), and
/// whatever comes after the SID (callback application data, attribute
/// values) is kept as it came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ace {
    pub kind: u8,
    pub flags: u8,
    pub mask: u32,
    /// Object ACEs: Flags, ObjectType and InheritedObjectType, as sent.
    pub object: Vec<u8>,
    /// None for the types whose layout is not a SID after the mask
    /// (ACCESS_ALLOWED_COMPOUND); their body is all in `trailer`.
    pub sid: Option<Sid>,
    pub trailer: Vec<u8>,
}

impl Ace {
    /// A plain allow or deny ACE.
    pub fn new(kind: u8, flags: u8, mask: u32, sid: Sid) -> Ace {
        Ace {
            kind,
            flags,
            mask,
            object: Vec::new(),
            sid: Some(sid),
            trailer: Vec::new(),
        }
    }

    fn is_object_type(kind: u8) -> bool {
        matches!(kind, 0x05..=0x08 | 0x0B | 0x0C | 0x0F | 0x10)
    }

    /// Parses one ACE from exactly its `AceSize` bytes.
    fn parse(bytes: &[u8]) -> Result<Ace, SdError> {
        let bad = SdError::Acl("an ACE is shorter than its fields");
        let mut r = Reader::new(bytes);
        let kind = r.u8().map_err(|_| bad)?;
        let flags = r.u8().map_err(|_| bad)?;
        r.u16().map_err(|_| bad)?;
        let mask = r.u32().map_err(|_| bad)?;
        let mut object = Vec::new();
        if Ace::is_object_type(kind) {
            let start = r.pos();
            let present = r.u32().map_err(|_| bad)?;
            let guids = (present & 1 != 0) as usize + (present & 2 != 0) as usize;
            r.skip(16 * guids).map_err(|_| bad)?;
            object = bytes[start..r.pos()].to_vec();
        }
        let sid = if kind == ace_type::ACCESS_ALLOWED_COMPOUND {
            None
        } else {
            Some(Sid::parse(&mut r).map_err(|e| match e {
                SdError::Sid("truncated") => bad,
                e => e,
            })?)
        };
        let trailer = bytes[r.pos()..].to_vec();
        Ok(Ace {
            kind,
            flags,
            mask,
            object,
            sid,
            trailer,
        })
    }

    fn encoded_len(&self) -> usize {
        let raw =
            8 + self.object.len() + self.sid.as_ref().map_or(0, Sid::len) + self.trailer.len();
        raw.next_multiple_of(4)
    }

    fn write(&self, out: &mut Vec<u8>) {
        let size = self.encoded_len();
        let start = out.len();
        out.put_u8(self.kind);
        out.put_u8(self.flags);
        out.put_u16(size as u16);
        out.put_u32(self.mask);
        out.extend_from_slice(&self.object);
        if let Some(sid) = &self.sid {
            sid.write(out);
        }
        out.extend_from_slice(&self.trailer);
        out.resize(start + size, 0);
    }

    pub fn is_inherit_only(&self) -> bool {
        self.flags & ace_flags::INHERIT_ONLY != 0
    }
}

/// MS-DTYP 2.4.5 ACL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    pub revision: u8,
    pub aces: Vec<Ace>,
}

impl Acl {
    pub fn new(aces: Vec<Ace>) -> Acl {
        let revision = if aces.iter().any(|a| Ace::is_object_type(a.kind)) {
            ACL_REVISION_DS
        } else {
            ACL_REVISION
        };
        Acl { revision, aces }
    }

    /// Parses the ACL that starts at `bytes[0]`; the buffer may run on past
    /// it (to the end of the descriptor).
    fn parse(bytes: &[u8]) -> Result<Acl, SdError> {
        let mut r = Reader::new(bytes);
        let truncated = SdError::Acl("truncated");
        let revision = r.u8().map_err(|_| truncated)?;
        r.u8().map_err(|_| truncated)?;
        let size = usize::from(r.u16().map_err(|_| truncated)?);
        let count = usize::from(r.u16().map_err(|_| truncated)?);
        r.u16().map_err(|_| truncated)?;
        if revision != ACL_REVISION && revision != ACL_REVISION_DS {
            return Err(SdError::Acl("unknown revision"));
        }
        if size < ACL_HEADER || size > bytes.len() {
            return Err(SdError::Acl("AclSize is outside the descriptor"));
        }
        let body = &bytes[ACL_HEADER..size];
        // The smallest ACE is 8 bytes: a count that cannot fit is refused
        // before anything is allocated for it.
        if count > body.len() / 8 {
            return Err(SdError::Acl("AceCount does not fit AclSize"));
        }
        let mut aces = Vec::with_capacity(count);
        let mut at = 0;
        for _ in 0..count {
            let head = body
                .get(at..at + 4)
                .ok_or(SdError::Acl("an ACE runs past AclSize"))?;
            let ace_size = usize::from(u16::from_le_bytes([head[2], head[3]]));
            // Windows keeps ACEs 4-byte aligned (RtlValidAcl): a size that
            // is not could not be written back as it came.
            if ace_size < 8 || ace_size % 4 != 0 {
                return Err(SdError::Acl("AceSize is not a multiple of 4 of at least 8"));
            }
            let ace_bytes = body
                .get(at..at + ace_size)
                .ok_or(SdError::Acl("an ACE runs past AclSize"))?;
            let ace = Ace::parse(ace_bytes)?;
            if Ace::is_object_type(ace.kind) && revision != ACL_REVISION_DS {
                return Err(SdError::Acl("object ACE in a revision 2 ACL"));
            }
            aces.push(ace);
            at += ace_size;
        }
        Ok(Acl { revision, aces })
    }

    fn encoded_len(&self) -> usize {
        ACL_HEADER + self.aces.iter().map(Ace::encoded_len).sum::<usize>()
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.put_u8(self.revision);
        out.put_u8(0);
        out.put_u16(self.encoded_len() as u16);
        out.put_u16(self.aces.len() as u16);
        out.put_u16(0);
        for ace in &self.aces {
            ace.write(out);
        }
    }

    /// Whether the encoding fits the 16-bit AclSize.
    pub fn fits(&self) -> bool {
        self.encoded_len() <= usize::from(u16::MAX)
    }
}

/// A security descriptor. A DACL that is present but null (control has
/// DACL_PRESENT, `dacl` is None) grants everyone everything, as does an
/// absent one; an empty DACL grants nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityDescriptor {
    pub control: u16,
    pub owner: Option<Sid>,
    pub group: Option<Sid>,
    pub sacl: Option<Acl>,
    pub dacl: Option<Acl>,
}

impl SecurityDescriptor {
    /// Parses a self-relative descriptor.
    pub fn parse(bytes: &[u8]) -> Result<SecurityDescriptor, SdError> {
        if bytes.len() < SD_FIXED {
            return Err(SdError::Descriptor("shorter than its fixed part"));
        }
        let mut r = Reader::new(bytes);
        let truncated = SdError::Descriptor("truncated");
        let revision = r.u8().map_err(|_| truncated)?;
        r.u8().map_err(|_| truncated)?;
        let control = r.u16().map_err(|_| truncated)?;
        let mut offsets = [0usize; 4];
        for o in &mut offsets {
            *o = r.u32().map_err(|_| truncated)? as usize;
        }
        if revision != 1 {
            return Err(SdError::Descriptor("revision is not 1"));
        }
        if control & control::SELF_RELATIVE == 0 {
            return Err(SdError::Descriptor("not self-relative"));
        }
        let [owner_at, group_at, sacl_at, dacl_at] = offsets;
        let part = |at: usize| -> Result<Option<&[u8]>, SdError> {
            match at {
                0 => Ok(None),
                at if at < SD_FIXED || at >= bytes.len() => {
                    Err(SdError::Descriptor("an offset is outside the descriptor"))
                }
                at => Ok(Some(&bytes[at..])),
            }
        };
        let sid_at = |at| -> Result<Option<Sid>, SdError> {
            part(at)?
                .map(|b| Sid::parse(&mut Reader::new(b)))
                .transpose()
        };
        let owner = sid_at(owner_at)?;
        let group = sid_at(group_at)?;
        let acl_at = |at, present_bit| -> Result<Option<Acl>, SdError> {
            if control & present_bit == 0 {
                return Ok(None);
            }
            part(at)?.map(Acl::parse).transpose()
        };
        let sacl = acl_at(sacl_at, control::SACL_PRESENT)?;
        let dacl = acl_at(dacl_at, control::DACL_PRESENT)?;
        Ok(SecurityDescriptor {
            control,
            owner,
            group,
            sacl,
            dacl,
        })
    }

    /// True when the DACL restricts nothing (absent or null).
    pub fn dacl_is_open(&self) -> bool {
        self.dacl.is_none()
    }

    /// The self-relative encoding of the parts `wanted` (SECURITY_INFORMATION
    /// bits) asks for, laid out as Windows lays them out: SACL, DACL,
    /// owner, group.
    pub fn encode(&self, wanted: u32) -> Vec<u8> {
        use crate::dtyp::security_information as si;
        let mut control = self.control | control::SELF_RELATIVE;
        let mut body = Vec::new();
        let mut offsets = [0u32; 4]; // owner, group, sacl, dacl
        let mut place = |body: &mut Vec<u8>, slot: usize| {
            offsets[slot] = (SD_FIXED + body.len()) as u32;
        };
        if wanted & si::SACL != 0 {
            if let Some(acl) = &self.sacl {
                place(&mut body, 2);
                acl.write(&mut body);
            }
        } else {
            control &= !(control::SACL_PRESENT
                | control::SACL_AUTO_INHERITED
                | control::SACL_PROTECTED
                | control::SACL_DEFAULTED);
        }
        if wanted & si::DACL != 0 {
            if let Some(acl) = &self.dacl {
                place(&mut body, 3);
                acl.write(&mut body);
            }
        } else {
            control &= !(control::DACL_PRESENT
                | control::DACL_AUTO_INHERITED
                | control::DACL_PROTECTED
                | control::DACL_DEFAULTED);
        }
        if wanted & si::OWNER != 0 {
            if let Some(sid) = &self.owner {
                place(&mut body, 0);
                sid.write(&mut body);
            }
        }
        if wanted & si::GROUP != 0 {
            if let Some(sid) = &self.group {
                place(&mut body, 1);
                sid.write(&mut body);
            }
        }
        let mut out = Vec::with_capacity(SD_FIXED + body.len());
        out.put_u8(1);
        out.put_u8(0);
        out.put_u16(control);
        for o in offsets {
            out.put_u32(o);
        }
        out.extend_from_slice(&body);
        out
    }

    /// Every part, as stored.
    pub fn encode_all(&self) -> Vec<u8> {
        self.encode(0xF)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtyp::security_information as si;

    fn sid(s: &[u32]) -> Sid {
        Sid {
            authority: 5,
            sub_authorities: s.to_vec(),
        }
    }

    fn sample() -> SecurityDescriptor {
        SecurityDescriptor {
            control: control::DACL_PRESENT | control::SELF_RELATIVE,
            owner: Some(sid(&[21, 1, 2, 3, 1000])),
            group: Some(sid(&[21, 1, 2, 3, 513])),
            sacl: None,
            dacl: Some(Acl::new(vec![
                Ace::new(ace_type::ACCESS_DENIED, 0, 0x2, sid(&[21, 1, 2, 3, 1001])),
                Ace::new(
                    ace_type::ACCESS_ALLOWED,
                    ace_flags::OBJECT_INHERIT | ace_flags::CONTAINER_INHERIT,
                    0x1F01FF,
                    Sid::everyone(),
                ),
            ])),
        }
    }

    #[test]
    fn round_trip() {
        let sd = sample();
        let bytes = sd.encode_all();
        assert_eq!(SecurityDescriptor::parse(&bytes).unwrap(), sd);
        // Windows' layout: DACL first when there is no SACL.
        assert_eq!(u32::from_le_bytes(bytes[16..20].try_into().unwrap()), 20);
    }

    #[test]
    fn parts_left_out() {
        let bytes = sample().encode(si::OWNER);
        let sd = SecurityDescriptor::parse(&bytes).unwrap();
        assert!(sd.owner.is_some());
        assert!(sd.group.is_none() && sd.dacl.is_none());
        assert_eq!(sd.control & control::DACL_PRESENT, 0);
    }

    #[test]
    fn null_dacl_is_present_without_offset() {
        let mut b = vec![1, 0];
        b.extend_from_slice(&(control::SELF_RELATIVE | control::DACL_PRESENT).to_le_bytes());
        b.extend_from_slice(&[0; 16]);
        let sd = SecurityDescriptor::parse(&b).unwrap();
        assert!(sd.dacl.is_none() && sd.control & control::DACL_PRESENT != 0);
    }

    #[test]
    fn refuses_bad_offsets_and_counts() {
        let good = sample().encode_all();
        // Owner offset past the end.
        let mut b = good.clone();
        b[4..8].copy_from_slice(&(good.len() as u32).to_le_bytes());
        assert!(matches!(
            SecurityDescriptor::parse(&b),
            Err(SdError::Descriptor(_))
        ));
        // Offset into the fixed part.
        let mut b = good.clone();
        b[4..8].copy_from_slice(&4u32.to_le_bytes());
        assert!(SecurityDescriptor::parse(&b).is_err());
        // A huge AceCount.
        let mut b = good.clone();
        b[20 + 4..20 + 6].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            SecurityDescriptor::parse(&b),
            Err(SdError::Acl(_))
        ));
        // AclSize past the end.
        let mut b = good.clone();
        b[20 + 2..20 + 4].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(matches!(
            SecurityDescriptor::parse(&b),
            Err(SdError::Acl(_))
        ));
        // A SID with 16 sub-authorities.
        let mut b = good.clone();
        let owner_at = u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
        b[owner_at + 1] = 16;
        assert!(matches!(
            SecurityDescriptor::parse(&b),
            Err(SdError::Sid(_))
        ));
        // Not self-relative.
        let mut b = good;
        b[3] &= 0x7F;
        assert!(SecurityDescriptor::parse(&b).is_err());
        // An ACE size that is not a multiple of 4.
        let mut b = sample().encode_all();
        b[20 + 8 + 2] += 1;
        assert!(matches!(
            SecurityDescriptor::parse(&b),
            Err(SdError::Acl(_))
        ));
        // Every truncation is refused or parses (never panics).
        let good = sample().encode_all();
        for n in 0..good.len() {
            let _ = SecurityDescriptor::parse(&good[..n]);
        }
    }

    #[test]
    fn object_and_callback_aces_survive() {
        let mut object = Ace::new(0x05, 0, 0x10, Sid::everyone());
        let mut present = 1u32.to_le_bytes().to_vec();
        present.extend_from_slice(&[0xAB; 16]);
        object.object = present;
        let mut callback = Ace::new(ace_type::ACCESS_ALLOWED_CALLBACK, 0, 1, Sid::everyone());
        callback.trailer = vec![1, 2, 3, 4];
        let sd = SecurityDescriptor {
            control: control::DACL_PRESENT | control::SELF_RELATIVE,
            dacl: Some(Acl::new(vec![object, callback])),
            ..Default::default()
        };
        let parsed = SecurityDescriptor::parse(&sd.encode_all()).unwrap();
        assert_eq!(parsed, sd);
    }
}
