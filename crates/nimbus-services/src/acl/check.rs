//! The access check of MS-DTYP 2.5.3.2, for what a file server needs: no
//! privileges, no object types, no conditional (callback) expressions.
//!
//! The rights a descriptor grants are computed once, walking the DACL in
//! order: an allow ACE grants the bits no earlier deny ACE took, a deny
//! ACE takes the bits no earlier allow ACE granted. A request for specific
//! rights succeeds exactly when they are all among those (the
//! first-match-wins walk of 2.5.3.2 gives the same answer), and
//! MAXIMUM_ALLOWED gets them all.

use nimbus_wire::dtyp::Sid;
use nimbus_wire::fscc::access;
use nimbus_wire::security_descriptor::{ace_type, SecurityDescriptor};

use super::token::{well_known, Token};

/// Everything a file's DACL can grant (FILE_ALL_ACCESS): what a null DACL
/// grants, and what the creator of a new file may get.
pub const ALL_RIGHTS: u32 = access::FILE_ALL_ACCESS;

/// What a share with access-based enumeration requires to show a user a
/// name: Read (FILE_GENERIC_READ, SYNCHRONIZE aside), as Windows hides
/// what a user has no Read permission on.
pub const SEEN_WITH_ABE: u32 = access::FILE_GENERIC_READ & !access::SYNCHRONIZE;

/// The rights `sd` grants `token` (MS-DTYP 2.5.3.2 with MAXIMUM_ALLOWED).
pub fn granted(sd: &SecurityDescriptor, token: &Token) -> u32 {
    let is_owner = sd.owner.as_ref().is_some_and(|o| token.contains(o));
    let Some(dacl) = &sd.dacl else {
        // No DACL, or a null one: no protection at all.
        return ALL_RIGHTS;
    };
    let owner_rights = well_known::owner_rights();
    let effective = || dacl.aces.iter().filter(|a| !a.is_inherit_only());
    let mut granted = 0;
    let mut denied = 0;
    // The owner may always read and change the DACL, unless an OWNER
    // RIGHTS ACE says what the owner gets instead.
    if is_owner && !effective().any(|a| a.sid.as_ref() == Some(&owner_rights)) {
        granted |= access::READ_CONTROL | access::WRITE_DAC;
    }
    let applies = |sid: &Sid| token.contains(sid) || (is_owner && *sid == owner_rights);
    for ace in effective() {
        let Some(sid) = &ace.sid else { continue };
        if !applies(sid) {
            continue;
        }
        let mask = access::map_generic(ace.mask);
        match ace.kind {
            ace_type::ACCESS_ALLOWED => granted |= mask & !denied,
            // A condition this server cannot evaluate denies rather than
            // allows: a callback deny counts, a callback allow does not.
            ace_type::ACCESS_DENIED | ace_type::ACCESS_DENIED_CALLBACK => denied |= mask & !granted,
            _ => {}
        }
    }
    // An ACE may carry any bit; only the rights a file has are granted
    // (never ACCESS_SYSTEM_SECURITY, which needs a privilege, nor the
    // reserved bits, which would show up in MxAc and FileAccessInformation).
    granted & ALL_RIGHTS
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_auth::MachineSid;
    use nimbus_wire::security_descriptor::{ace_flags, control, Ace, Acl};

    /// A request for specific rights: all of them or the ones missing.
    fn check(sd: &SecurityDescriptor, token: &Token, desired: u32) -> Result<u32, u32> {
        let allowed = granted(sd, token);
        let asked = desired & !access::MAXIMUM_ALLOWED;
        match asked & !allowed {
            0 if desired & access::MAXIMUM_ALLOWED != 0 => Ok(allowed | asked),
            0 => Ok(asked),
            missing => Err(missing),
        }
    }

    fn sd(owner: Sid, aces: Vec<Ace>) -> SecurityDescriptor {
        SecurityDescriptor {
            control: control::SELF_RELATIVE | control::DACL_PRESENT,
            owner: Some(owner),
            group: None,
            sacl: None,
            dacl: Some(Acl::new(aces)),
        }
    }

    fn allow(sid: Sid, mask: u32) -> Ace {
        Ace::new(ace_type::ACCESS_ALLOWED, 0, mask, sid)
    }

    fn deny(sid: Sid, mask: u32) -> Ace {
        Ace::new(ace_type::ACCESS_DENIED, 0, mask, sid)
    }

    const M: MachineSid = MachineSid([7, 8, 9]);

    #[test]
    fn order_decides_between_allow_and_deny() {
        let alice = Token::user(M, 1000);
        let bob = Token::user(M, 1001);
        let d = sd(
            bob.user.clone(),
            vec![
                deny(alice.user.clone(), access::FILE_WRITE_DATA),
                allow(
                    well_known::everyone(),
                    access::FILE_GENERIC_READ | access::FILE_GENERIC_WRITE,
                ),
            ],
        );
        let rw = access::FILE_READ_DATA | access::FILE_WRITE_DATA;
        assert_eq!(check(&d, &alice, rw), Err(access::FILE_WRITE_DATA));
        assert_eq!(check(&d, &bob, rw), Ok(rw));
        assert_eq!(
            check(&d, &alice, access::FILE_READ_DATA),
            Ok(access::FILE_READ_DATA)
        );
        // An allow before the deny wins.
        let d = sd(
            bob.user.clone(),
            vec![
                allow(alice.user.clone(), access::FILE_WRITE_DATA),
                deny(alice.user.clone(), access::FILE_WRITE_DATA),
            ],
        );
        assert!(check(&d, &alice, access::FILE_WRITE_DATA).is_ok());
    }

    #[test]
    fn owner_rights_and_maximum_allowed() {
        let alice = Token::user(M, 1000);
        // An empty DACL: the owner can still read and change it.
        let d = sd(alice.user.clone(), vec![]);
        assert_eq!(
            check(&d, &alice, access::MAXIMUM_ALLOWED),
            Ok(access::READ_CONTROL | access::WRITE_DAC)
        );
        assert!(check(&d, &alice, access::FILE_READ_DATA).is_err());
        assert!(check(&d, &Token::user(M, 1001), access::READ_CONTROL).is_err());
        // An OWNER RIGHTS ACE replaces the implicit rights.
        let d = sd(
            alice.user.clone(),
            vec![allow(well_known::owner_rights(), access::FILE_READ_DATA)],
        );
        assert_eq!(granted(&d, &alice), access::FILE_READ_DATA);
        // CREATOR OWNER in an object's own DACL matches nobody; inherit-only
        // ACEs do not count.
        let mut io = allow(alice.user.clone(), access::FILE_WRITE_DATA);
        io.flags = ace_flags::INHERIT_ONLY | ace_flags::OBJECT_INHERIT;
        let d = sd(
            alice.user.clone(),
            vec![
                allow(well_known::creator_owner(), access::FILE_ALL_ACCESS),
                io,
            ],
        );
        assert_eq!(
            granted(&d, &alice),
            access::READ_CONTROL | access::WRITE_DAC
        );
        // Generic bits in an ACE are mapped.
        let d = sd(
            alice.user.clone(),
            vec![allow(well_known::everyone(), access::GENERIC_ALL)],
        );
        assert_eq!(granted(&d, &Token::user(M, 5000)), access::FILE_ALL_ACCESS);
    }

    #[test]
    fn null_dacl_grants_everything() {
        let d = SecurityDescriptor {
            control: control::SELF_RELATIVE | control::DACL_PRESENT,
            ..Default::default()
        };
        assert_eq!(granted(&d, &Token::anonymous()), ALL_RIGHTS);
        assert_eq!(
            check(&d, &Token::anonymous(), access::FILE_WRITE_DATA),
            Ok(access::FILE_WRITE_DATA)
        );
    }
}
