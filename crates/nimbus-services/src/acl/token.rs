//! The SIDs a session acts with (MS-DTYP 2.5.2 Token): its user's, the
//! user's primary group, and the well-known groups every network logon
//! has. Users of the user database are S-1-5-21-<machine>-<RID>, as the
//! local accounts of a Windows server are.

use nimbus_auth::MachineSid;
use nimbus_wire::dtyp::Sid;

/// Well-known SIDs (MS-DTYP 2.4.2.4).
pub mod well_known {
    use nimbus_wire::dtyp::Sid;

    fn sid(authority: u64, subs: &[u32]) -> Sid {
        Sid {
            authority,
            sub_authorities: subs.to_vec(),
        }
    }

    pub fn everyone() -> Sid {
        sid(1, &[0])
    }
    pub fn creator_owner() -> Sid {
        sid(3, &[0])
    }
    pub fn creator_group() -> Sid {
        sid(3, &[1])
    }
    pub fn owner_rights() -> Sid {
        sid(3, &[4])
    }
    pub fn network() -> Sid {
        sid(5, &[2])
    }
    pub fn anonymous() -> Sid {
        sid(5, &[7])
    }
    pub fn authenticated_users() -> Sid {
        sid(5, &[11])
    }
    pub fn system() -> Sid {
        sid(5, &[18])
    }
    /// BUILTIN\Administrators: the sessions of `[security] admins`.
    pub fn builtin_administrators() -> Sid {
        sid(5, &[32, 544])
    }
    pub fn builtin_users() -> Sid {
        sid(5, &[32, 545])
    }
    pub fn builtin_guests() -> Sid {
        sid(5, &[32, 546])
    }
}

/// The RIDs of a machine's built-in accounts (MS-SAMR 2.2.1.14 and a
/// standalone Windows server's "None" group, the primary group of its
/// local users).
pub const GUEST_RID: u32 = 501;
pub const NONE_GROUP_RID: u32 = 513;
pub const GUESTS_GROUP_RID: u32 = 514;

/// An account SID under the machine SID.
pub fn account_sid(machine: MachineSid, rid: u32) -> Sid {
    let [a, b, c] = machine.0;
    Sid {
        authority: 5,
        sub_authorities: vec![21, a, b, c, rid],
    }
}

/// The RID of `sid` if it is an account of this machine.
pub fn machine_rid(machine: MachineSid, sid: &Sid) -> Option<u32> {
    let [a, b, c] = machine.0;
    match (sid.authority, sid.sub_authorities.as_slice()) {
        (5, [21, x, y, z, rid]) if [*x, *y, *z] == [a, b, c] => Some(*rid),
        _ => None,
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub user: Sid,
    pub primary_group: Sid,
    /// Every group, the primary one included.
    pub groups: Vec<Sid>,
}

impl Token {
    /// A user of the user database, without groups of the server's own.
    pub fn user(machine: MachineSid, rid: u32) -> Token {
        Token::member(machine, rid, &[])
    }

    /// A user of the user database, member of the server's groups with
    /// the RIDs `groups`.
    pub fn member(machine: MachineSid, rid: u32, groups: &[u32]) -> Token {
        let primary_group = account_sid(machine, NONE_GROUP_RID);
        let mut all = vec![
            primary_group.clone(),
            well_known::everyone(),
            well_known::builtin_users(),
            well_known::network(),
            well_known::authenticated_users(),
        ];
        all.extend(groups.iter().map(|g| account_sid(machine, *g)));
        Token {
            user: account_sid(machine, rid),
            groups: all,
            primary_group,
        }
    }

    /// A guest logon (an unknown user where guests are allowed).
    pub fn guest(machine: MachineSid) -> Token {
        let primary_group = account_sid(machine, GUESTS_GROUP_RID);
        Token {
            user: account_sid(machine, GUEST_RID),
            groups: vec![
                primary_group.clone(),
                well_known::everyone(),
                well_known::builtin_guests(),
                well_known::network(),
            ],
            primary_group,
        }
    }

    /// An anonymous logon.
    pub fn anonymous() -> Token {
        Token {
            user: well_known::anonymous(),
            primary_group: well_known::anonymous(),
            groups: vec![well_known::everyone(), well_known::network()],
        }
    }

    /// Whether the token is a user's that proved who it is: Authenticated
    /// Users (S-1-5-11) is in every such token and in no guest's or
    /// anonymous logon's.
    pub fn is_authenticated_user(&self) -> bool {
        self.groups.contains(&well_known::authenticated_users())
    }

    /// Makes the token an administrator's: BUILTIN\Administrators joins
    /// its groups, as in a Windows administrator's token.
    pub fn with_administrators(mut self) -> Token {
        let admins = well_known::builtin_administrators();
        if !self.groups.contains(&admins) {
            self.groups.push(admins);
        }
        self
    }

    /// Whether the session may administer the server (list its sessions,
    /// tree connects and open files): BUILTIN\Administrators is in it.
    pub fn is_administrator(&self) -> bool {
        self.groups.contains(&well_known::builtin_administrators())
    }

    /// Whether `sid` is the user's or one of its groups'.
    pub fn contains(&self, sid: &Sid) -> bool {
        self.user == *sid || self.groups.contains(sid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_sids_are_under_the_machine_sid() {
        let m = MachineSid([1, 2, 3]);
        let t = Token::user(m, 1000);
        assert_eq!(t.user.to_string(), "S-1-5-21-1-2-3-1000");
        assert_eq!(t.primary_group.to_string(), "S-1-5-21-1-2-3-513");
        assert!(t.contains(&well_known::everyone()));
        assert!(t.contains(&well_known::authenticated_users()));
        assert!(!t.contains(&well_known::creator_owner()));
        assert_eq!(machine_rid(m, &t.user), Some(1000));
        assert_eq!(machine_rid(MachineSid([1, 2, 4]), &t.user), None);
        assert!(!Token::guest(m).contains(&well_known::authenticated_users()));
        assert!(t.is_authenticated_user());
        assert!(!Token::guest(m).is_authenticated_user());
        assert!(!Token::anonymous().is_authenticated_user());
        let staff = account_sid(m, 1007);
        assert!(Token::member(m, 1000, &[1007]).contains(&staff));
        assert!(!t.contains(&staff));
        assert!(!t.is_administrator());
        let admin = t.clone().with_administrators().with_administrators();
        assert!(admin.is_administrator());
        assert_eq!(admin.groups.len(), t.groups.len() + 1);
        assert_eq!(
            well_known::builtin_administrators().to_string(),
            "S-1-5-32-544"
        );
    }
}
