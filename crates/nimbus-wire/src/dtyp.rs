//! MS-DTYP 2.4 security structures: SIDs, ACLs and self-relative security
//! descriptors (the codec is in `security_descriptor`), and the descriptor
//! that describes a POSIX owner, group and mode.

use crate::codec::Put;
use crate::fscc::access;
use crate::security_descriptor::{ace_flags, ace_type, control, Ace, Acl, SecurityDescriptor};

/// MS-DTYP 2.4.2.2 SID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sid {
    pub authority: u64,
    pub sub_authorities: Vec<u32>,
}

impl Sid {
    /// S-1-1-0, Everyone.
    pub fn everyone() -> Sid {
        Sid {
            authority: 1,
            sub_authorities: vec![0],
        }
    }

    /// S-1-22-1-UID: the well-known form for a Unix user that has no
    /// Windows account, as Samba also reports it.
    pub fn unix_user(uid: u32) -> Sid {
        Sid {
            authority: 22,
            sub_authorities: vec![1, uid],
        }
    }

    /// S-1-22-2-GID for a Unix group.
    pub fn unix_group(gid: u32) -> Sid {
        Sid {
            authority: 22,
            sub_authorities: vec![2, gid],
        }
    }

    pub fn len(&self) -> usize {
        8 + 4 * self.sub_authorities.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.put_u8(1);
        out.put_u8(self.sub_authorities.len() as u8);
        // IdentifierAuthority is 6 bytes big-endian.
        out.extend_from_slice(&self.authority.to_be_bytes()[2..]);
        for s in &self.sub_authorities {
            out.put_u32(*s);
        }
    }
}

/// MS-DTYP 2.4.2.1: the string form, S-1-22-1-1000 (the authority in
/// hexadecimal when it does not fit 32 bits).
impl std::fmt::Display for Sid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.authority >> 32 == 0 {
            write!(f, "S-1-{}", self.authority)?;
        } else {
            write!(f, "S-1-0x{:012X}", self.authority)?;
        }
        for s in &self.sub_authorities {
            write!(f, "-{s}")?;
        }
        Ok(())
    }
}

/// MS-DTYP 2.4.7 SECURITY_INFORMATION bits.
pub mod security_information {
    pub const OWNER: u32 = 0x1;
    pub const GROUP: u32 = 0x2;
    pub const DACL: u32 = 0x4;
    pub const SACL: u32 = 0x8;
    pub const LABEL: u32 = 0x10;
    pub const ATTRIBUTE: u32 = 0x20;
    pub const SCOPE: u32 = 0x40;
    pub const BACKUP: u32 = 0x1_0000;
}

/// Maps three POSIX permission bits onto file access rights.
fn rights_from_rwx(bits: u32, is_dir: bool) -> u32 {
    let mut mask = 0;
    if bits & 0o4 != 0 {
        mask |= access::FILE_GENERIC_READ;
    }
    if bits & 0o2 != 0 {
        mask |= access::FILE_GENERIC_WRITE | access::DELETE;
        if is_dir {
            mask |= access::FILE_DELETE_CHILD;
        }
    }
    if bits & 0o1 != 0 {
        mask |= access::FILE_GENERIC_EXECUTE;
    }
    mask
}

/// The descriptor shown for a file that has none stored: `owner`, its
/// POSIX group, and its mode as three allow ACEs (owner, group, Everyone).
pub fn posix_security_descriptor(
    owner: Sid,
    gid: u32,
    mode: u32,
    is_dir: bool,
) -> SecurityDescriptor {
    let group = Sid::unix_group(gid);
    let inherit = if is_dir {
        ace_flags::OBJECT_INHERIT | ace_flags::CONTAINER_INHERIT
    } else {
        0
    };
    let allow = |sid: &Sid, mask| Ace::new(ace_type::ACCESS_ALLOWED, inherit, mask, sid.clone());
    let aces = vec![
        allow(
            &owner,
            rights_from_rwx(mode >> 6, is_dir)
                | access::READ_CONTROL
                | access::WRITE_DAC
                | access::FILE_WRITE_ATTRIBUTES,
        ),
        allow(&group, rights_from_rwx(mode >> 3, is_dir)),
        allow(&Sid::everyone(), rights_from_rwx(mode, is_dir)),
    ];
    SecurityDescriptor {
        control: control::SELF_RELATIVE | control::DACL_PRESENT,
        owner: Some(owner),
        group: Some(group),
        sacl: None,
        dacl: Some(Acl::new(aces)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sid_string_form() {
        assert_eq!(Sid::unix_user(1000).to_string(), "S-1-22-1-1000");
        assert_eq!(Sid::everyone().to_string(), "S-1-1-0");
        let big = Sid {
            authority: 0x1_0000_0000,
            sub_authorities: vec![],
        };
        assert_eq!(big.to_string(), "S-1-0x000100000000");
    }

    #[test]
    fn sid_encoding() {
        let mut out = Vec::new();
        Sid::everyone().write(&mut out);
        assert_eq!(out, [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
    }

    #[test]
    fn descriptor_layout() {
        let sd = posix_security_descriptor(Sid::unix_user(1000), 1000, 0o644, false).encode(0x7);
        assert_eq!(sd[0], 1);
        assert_eq!(u16::from_le_bytes([sd[2], sd[3]]), 0x8004);
        // Windows' order: DACL, then owner, then group.
        let dacl_off = u32::from_le_bytes(sd[16..20].try_into().unwrap()) as usize;
        assert_eq!(dacl_off, 20);
        let acl_size = u16::from_le_bytes([sd[dacl_off + 2], sd[dacl_off + 3]]) as usize;
        let owner_off = u32::from_le_bytes(sd[4..8].try_into().unwrap()) as usize;
        assert_eq!(owner_off, dacl_off + acl_size);
        assert_eq!(&sd[owner_off..owner_off + 8], &[1, 2, 0, 0, 0, 0, 0, 22]);
        // Owner only: no DACL.
        let sd = posix_security_descriptor(Sid::unix_user(0), 0, 0o600, false).encode(0x1);
        assert_eq!(u32::from_le_bytes(sd[16..20].try_into().unwrap()), 0);
        assert_eq!(u16::from_le_bytes([sd[2], sd[3]]), 0x8000);
    }
}
