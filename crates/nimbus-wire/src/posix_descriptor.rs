//! The security descriptor shown for a file that has none stored: its
//! POSIX owner, group and mode as MS-DTYP 2.4.6 allow ACEs.

use crate::dtyp::Sid;
use crate::fscc::access;
use crate::security_descriptor::{ace_flags, ace_type, control, Ace, Acl, SecurityDescriptor};

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
