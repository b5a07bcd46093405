//! The descriptor a new file gets (MS-DTYP 2.5.3.4 CreateSecurityObject,
//! with the inheritance of 2.5.3.4.2 ComputeACL), and what SET_INFO makes
//! of a stored one (2.5.3.4 SetSecurityInfo's merge). No privileges: the
//! owner may only be the user itself, and SACLs (which need
//! SeSecurityPrivilege) are never set.

use nimbus_wire::dtyp::{security_information as si, Sid};
use nimbus_wire::fscc::access;
use nimbus_wire::security_descriptor::{ace_flags, control, Ace, Acl, SecurityDescriptor};
use nimbus_wire::status::NtStatus;

use super::token::{well_known, Token};

/// The owner a client may give: its own SID only (Windows also lets
/// holders of SeRestorePrivilege or SeTakeOwnershipPrivilege give others;
/// nobody holds them here).
fn check_owner(owner: &Sid, token: &Token) -> Result<(), NtStatus> {
    if *owner == token.user {
        Ok(())
    } else {
        Err(NtStatus::INVALID_OWNER)
    }
}

/// The ACEs a child inherits from its parent's ACL (MS-DTYP 2.5.3.4.2
/// ComputeInheritedACLfromParent). `auto`: the parent's ACL is marked
/// auto-inherited, and the copies are marked INHERITED.
fn inherited_aces(parent: &Acl, is_dir: bool, owner: &Sid, group: &Sid, auto: bool) -> Vec<Ace> {
    let inherited = if auto { ace_flags::INHERITED } else { 0 };
    let audit = ace_flags::SUCCESSFUL_ACCESS | ace_flags::FAILED_ACCESS;
    let creator_owner = well_known::creator_owner();
    let creator_group = well_known::creator_group();
    // The ACE as it applies to the child itself.
    let effective = |a: &Ace| {
        let mut e = a.clone();
        e.flags = (a.flags & audit) | inherited;
        e.mask = access::map_generic(a.mask);
        if e.sid.as_ref() == Some(&creator_owner) {
            e.sid = Some(owner.clone());
        } else if e.sid.as_ref() == Some(&creator_group) {
            e.sid = Some(group.clone());
        }
        e
    };
    let mut out = Vec::new();
    for a in &parent.aces {
        let oi = a.flags & ace_flags::OBJECT_INHERIT != 0;
        let ci = a.flags & ace_flags::CONTAINER_INHERIT != 0;
        let no_propagate = a.flags & ace_flags::NO_PROPAGATE_INHERIT != 0;
        if !is_dir {
            if oi {
                out.push(effective(a));
            }
            continue;
        }
        if ci {
            let creator = a
                .sid
                .as_ref()
                .is_some_and(|s| *s == creator_owner || *s == creator_group);
            let generic = access::map_generic(a.mask) != a.mask;
            if no_propagate {
                out.push(effective(a));
            } else if creator || generic {
                // What it means here, and the original to pass on.
                out.push(effective(a));
                let mut passed = a.clone();
                passed.flags = (a.flags
                    & (ace_flags::OBJECT_INHERIT | ace_flags::CONTAINER_INHERIT | audit))
                    | ace_flags::INHERIT_ONLY
                    | inherited;
                out.push(passed);
            } else {
                let mut kept = a.clone();
                kept.flags =
                    (a.flags & !ace_flags::INHERIT_ONLY & !ace_flags::INHERITED) | inherited;
                out.push(kept);
            }
        } else if oi && !no_propagate {
            // For the files below this directory, not for it.
            let mut passed = a.clone();
            passed.flags = (a.flags & (ace_flags::OBJECT_INHERIT | audit))
                | ace_flags::INHERIT_ONLY
                | inherited;
            out.push(passed);
        }
    }
    out
}

/// `acl` as Windows stores a DACL it is given: generic rights in the ACEs
/// that apply to the object itself and pass nothing on are mapped to file
/// rights (smbtorture smb2.acls.CREATOR and GENERIC read them back so);
/// inheritable ones keep them, for the children to map.
fn with_generic_mapped(acl: &Acl) -> Acl {
    let mut out = acl.clone();
    for a in &mut out.aces {
        if a.flags & ace_flags::INHERITANCE == 0 {
            a.mask = access::map_generic(a.mask);
        }
    }
    out
}

/// The DACL of a file created with nothing to inherit and no DACL given:
/// the creator and SYSTEM in full control (a Windows token's default DACL).
fn default_dacl(owner: &Sid) -> Acl {
    let allow = |sid: Sid| Ace::new(0, 0, access::FILE_ALL_ACCESS, sid);
    Acl::new(vec![allow(owner.clone()), allow(well_known::system())])
}

/// The descriptor of a file being created. `parent`: the stored descriptor
/// of the directory it is made in, if it has one; `given`: the one the
/// client sent (SD_BUFFER create context).
pub fn for_new_file(
    parent: Option<&SecurityDescriptor>,
    given: Option<&SecurityDescriptor>,
    token: &Token,
    is_dir: bool,
) -> Result<SecurityDescriptor, NtStatus> {
    if given.is_some_and(|g| g.control & control::SACL_PRESENT != 0) {
        return Err(NtStatus::PRIVILEGE_NOT_HELD);
    }
    let owner = match given.and_then(|g| g.owner.as_ref()) {
        Some(o) => {
            check_owner(o, token)?;
            o.clone()
        }
        None => token.user.clone(),
    };
    let group = given
        .and_then(|g| g.group.clone())
        .unwrap_or_else(|| token.primary_group.clone());
    let parent_dacl = parent.and_then(|p| p.dacl.as_ref());
    let auto = parent.is_some_and(|p| p.control & control::DACL_AUTO_INHERITED != 0);
    let from_parent = parent_dacl
        .map(|acl| inherited_aces(acl, is_dir, &owner, &group, auto))
        .unwrap_or_default();
    let mut control = control::SELF_RELATIVE | control::DACL_PRESENT;
    let explicit = given.filter(|g| {
        g.control & control::DACL_PRESENT != 0 && g.control & control::DACL_DEFAULTED == 0
    });
    let dacl = match explicit {
        // A DACL given: kept as sent. Where the parent's ACEs are marked
        // auto-inherited and the given DACL is not protected, they follow
        // it (Windows' auto-inheritance).
        Some(g) => {
            control |= g.control & control::DACL_PROTECTED;
            match &g.dacl {
                Some(acl) if auto && g.control & control::DACL_PROTECTED == 0 => {
                    control |= control::DACL_AUTO_INHERITED;
                    let mut aces: Vec<Ace> = acl
                        .aces
                        .iter()
                        .filter(|a| a.flags & ace_flags::INHERITED == 0)
                        .cloned()
                        .collect();
                    aces.extend(from_parent);
                    Some(Acl::new(aces))
                }
                other => other.as_ref().map(with_generic_mapped),
            }
        }
        None if !from_parent.is_empty() => {
            if auto {
                control |= control::DACL_AUTO_INHERITED;
            }
            Some(Acl::new(from_parent))
        }
        None => Some(default_dacl(&owner)),
    };
    if dacl.as_ref().is_some_and(|a| !a.fits()) {
        return Err(NtStatus::INVALID_ACL);
    }
    Ok(SecurityDescriptor {
        control,
        owner: Some(owner),
        group: Some(group),
        sacl: None,
        dacl,
    })
}

/// The rights a QUERY_INFO of the parts `info` needs on the open (MS-SMB2
/// 3.3.5.20.3, MS-FSA 2.1.5.13), as Windows asks for them: READ_CONTROL
/// for the owner, group, DACL and the label, attribute and scope ACEs;
/// ACCESS_SYSTEM_SECURITY for the SACL; both for BACKUP. Asking for none
/// of them needs nothing (the answer is an empty descriptor).
pub fn rights_to_query(info: u32) -> u32 {
    let mut need = 0;
    if info
        & (si::OWNER | si::GROUP | si::DACL | si::LABEL | si::ATTRIBUTE | si::SCOPE | si::BACKUP)
        != 0
    {
        need |= access::READ_CONTROL;
    }
    if info & (si::SACL | si::BACKUP) != 0 {
        need |= access::ACCESS_SYSTEM_SECURITY;
    }
    need
}

/// The rights a SET_INFO of the parts `info` needs on the open (MS-SMB2
/// 3.3.5.21.3, MS-FSA 2.1.5.16).
pub fn rights_to_set(info: u32) -> u32 {
    let mut need = 0;
    if info & (si::OWNER | si::GROUP) != 0 {
        need |= access::WRITE_OWNER;
    }
    if info & si::DACL != 0 {
        need |= access::WRITE_DAC;
    }
    if info & si::SACL != 0 {
        need |= access::ACCESS_SYSTEM_SECURITY;
    }
    need
}

/// `current` with the parts `info` names taken from `new`.
pub fn with_changes(
    current: &SecurityDescriptor,
    new: &SecurityDescriptor,
    info: u32,
    token: &Token,
) -> Result<SecurityDescriptor, NtStatus> {
    let mut out = current.clone();
    out.control |= control::SELF_RELATIVE;
    if info & si::SACL != 0 {
        return Err(NtStatus::PRIVILEGE_NOT_HELD);
    }
    if info & si::OWNER != 0 {
        let owner = new.owner.as_ref().ok_or(NtStatus::INVALID_OWNER)?;
        // Writing back the owner a file already has changes nothing.
        if current.owner.as_ref() != Some(owner) {
            check_owner(owner, token)?;
        }
        out.owner = Some(owner.clone());
    }
    if info & si::GROUP != 0 {
        out.group = Some(new.group.clone().ok_or(NtStatus::INVALID_PRIMARY_GROUP)?);
    }
    if info & si::DACL != 0 {
        let dacl_bits = control::DACL_PRESENT
            | control::DACL_AUTO_INHERITED
            | control::DACL_PROTECTED
            | control::DACL_DEFAULTED;
        out.control &= !dacl_bits;
        // A DACL_PRESENT bit left out means "no DACL": stored as a null one
        // (MS-DTYP: both grant everything; Windows shows it as null).
        // PROTECTED is kept as sent; AUTO_INHERITED only when the client
        // also asks for auto-inheritance (AUTO_INHERIT_REQ, itself never
        // stored), as Windows keeps them (smbtorture smb2.acls.INHERITFLAGS).
        let auto_asked = control::DACL_AUTO_INHERITED | control::DACL_AUTO_INHERIT_REQ;
        let auto = if new.control & auto_asked == auto_asked {
            control::DACL_AUTO_INHERITED
        } else {
            0
        };
        out.control |= (new.control & (control::DACL_PROTECTED | control::DACL_DEFAULTED))
            | auto
            | control::DACL_PRESENT;
        out.control &= !control::DACL_AUTO_INHERIT_REQ;
        out.dacl = if new.control & control::DACL_PRESENT != 0 {
            new.dacl.as_ref().map(with_generic_mapped)
        } else {
            None
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_auth::MachineSid;
    use nimbus_wire::security_descriptor::ace_type;

    const M: MachineSid = MachineSid([7, 8, 9]);

    #[test]
    fn a_query_needs_the_rights_of_the_parts_it_names() {
        assert_eq!(rights_to_query(0), 0);
        for part in [si::OWNER, si::GROUP, si::DACL, si::LABEL] {
            assert_eq!(rights_to_query(part), access::READ_CONTROL);
        }
        assert_eq!(rights_to_query(si::SACL), access::ACCESS_SYSTEM_SECURITY);
        assert_eq!(
            rights_to_query(si::BACKUP),
            access::READ_CONTROL | access::ACCESS_SYSTEM_SECURITY
        );
    }

    fn ace(flags: u8, mask: u32, sid: Sid) -> Ace {
        Ace::new(ace_type::ACCESS_ALLOWED, flags, mask, sid)
    }

    fn parent(aces: Vec<Ace>, auto: bool) -> SecurityDescriptor {
        SecurityDescriptor {
            control: control::SELF_RELATIVE
                | control::DACL_PRESENT
                | if auto {
                    control::DACL_AUTO_INHERITED
                } else {
                    0
                },
            owner: Some(Token::user(M, 1000).user),
            group: None,
            sacl: None,
            dacl: Some(Acl::new(aces)),
        }
    }

    #[test]
    fn files_and_directories_inherit_as_windows_does() {
        let bob = Token::user(M, 1001);
        let oi = ace_flags::OBJECT_INHERIT;
        let ci = ace_flags::CONTAINER_INHERIT;
        let p = parent(
            vec![
                ace(oi | ci, access::GENERIC_ALL, well_known::creator_owner()),
                ace(oi, access::FILE_READ_DATA, well_known::everyone()),
                ace(
                    ci | ace_flags::NO_PROPAGATE_INHERIT,
                    access::FILE_LIST_DIRECTORY,
                    well_known::network(),
                ),
                ace(0, access::FILE_WRITE_DATA, well_known::everyone()),
            ],
            false,
        );
        let file = for_new_file(Some(&p), None, &bob, false).unwrap();
        let aces = &file.dacl.unwrap().aces;
        assert_eq!(aces.len(), 2);
        assert_eq!(aces[0], ace(0, access::FILE_ALL_ACCESS, bob.user.clone()));
        assert_eq!(
            aces[1],
            ace(0, access::FILE_READ_DATA, well_known::everyone())
        );
        assert_eq!(file.control & control::DACL_AUTO_INHERITED, 0);

        let dir = for_new_file(Some(&p), None, &bob, true).unwrap();
        let aces = &dir.dacl.unwrap().aces;
        assert_eq!(aces.len(), 4);
        assert_eq!(aces[0], ace(0, access::FILE_ALL_ACCESS, bob.user.clone()));
        assert_eq!(
            aces[1],
            ace(
                oi | ci | ace_flags::INHERIT_ONLY,
                access::GENERIC_ALL,
                well_known::creator_owner()
            )
        );
        assert_eq!(
            aces[2],
            ace(
                oi | ace_flags::INHERIT_ONLY,
                access::FILE_READ_DATA,
                well_known::everyone()
            )
        );
        assert_eq!(
            aces[3],
            ace(0, access::FILE_LIST_DIRECTORY, well_known::network())
        );
        assert_eq!(dir.owner, Some(bob.user.clone()));
        assert_eq!(dir.group, Some(bob.primary_group.clone()));

        // Auto-inherited parents mark what they pass on.
        let p = parent(
            vec![ace(oi, access::FILE_READ_DATA, well_known::everyone())],
            true,
        );
        let file = for_new_file(Some(&p), None, &bob, false).unwrap();
        assert_eq!(file.dacl.unwrap().aces[0].flags, ace_flags::INHERITED);
        assert_ne!(file.control & control::DACL_AUTO_INHERITED, 0);
    }

    #[test]
    fn given_descriptors_and_defaults() {
        let bob = Token::user(M, 1001);
        // Nothing to inherit, nothing given: creator and SYSTEM.
        let sd = for_new_file(None, None, &bob, false).unwrap();
        assert_eq!(sd.dacl, Some(default_dacl(&bob.user)));
        // A given DACL is kept as sent.
        let mut given = parent(vec![ace(0, 1, well_known::everyone())], false);
        given.owner = Some(bob.user.clone());
        let p = parent(
            vec![ace(ace_flags::OBJECT_INHERIT, 2, well_known::network())],
            false,
        );
        let sd = for_new_file(Some(&p), Some(&given), &bob, false).unwrap();
        assert_eq!(sd.dacl, given.dacl);
        assert_eq!(sd.owner, Some(bob.user.clone()));
        // Someone else as owner: refused; SACLs: refused.
        given.owner = Some(Token::user(M, 1000).user);
        assert_eq!(
            for_new_file(None, Some(&given), &bob, false),
            Err(NtStatus::INVALID_OWNER)
        );
        let mut with_sacl = given.clone();
        with_sacl.owner = None;
        with_sacl.control |= control::SACL_PRESENT;
        assert_eq!(
            for_new_file(None, Some(&with_sacl), &bob, false),
            Err(NtStatus::PRIVILEGE_NOT_HELD)
        );
    }

    #[test]
    fn set_info_merges_the_parts_named() {
        let alice = Token::user(M, 1000);
        let bob = Token::user(M, 1001);
        let current = parent(vec![ace(0, 1, well_known::everyone())], false);
        let mut new = parent(vec![], false);
        new.owner = Some(bob.user.clone());
        // The DACL only: owner unchanged.
        let out = with_changes(&current, &new, si::DACL, &bob).unwrap();
        assert_eq!(out.owner, current.owner);
        assert_eq!(out.dacl, Some(Acl::new(vec![])));
        // Generic rights are mapped where they apply to the file itself.
        new.dacl = Some(Acl::new(vec![
            ace(0, access::GENERIC_READ, well_known::everyone()),
            ace(
                ace_flags::OBJECT_INHERIT,
                access::GENERIC_READ,
                well_known::everyone(),
            ),
        ]));
        let out = with_changes(&current, &new, si::DACL, &bob).unwrap();
        let masks: Vec<u32> = out.dacl.unwrap().aces.iter().map(|a| a.mask).collect();
        assert_eq!(masks, [access::FILE_GENERIC_READ, access::GENERIC_READ]);
        // Taking ownership without a privilege: refused; writing the
        // current owner back: allowed.
        assert_eq!(
            with_changes(&current, &new, si::OWNER, &alice),
            Err(NtStatus::INVALID_OWNER)
        );
        new.owner = current.owner.clone();
        assert!(with_changes(&current, &new, si::OWNER, &bob).is_ok());
        // DACL_PRESENT cleared: a null DACL.
        new.control = control::SELF_RELATIVE;
        let out = with_changes(&current, &new, si::DACL, &bob).unwrap();
        assert!(out.dacl.is_none() && out.control & control::DACL_PRESENT != 0);
    }
}
