//! MS-DTYP 2.4 security structures: SIDs and the SECURITY_INFORMATION
//! bits (the ACL and descriptor codec is in `security_descriptor`, the
//! descriptor of a POSIX owner, group and mode in `posix_descriptor`).

use crate::codec::Put;

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
}
