//! Unix accounts as clients see them. A file's owner and group are shown
//! as S-1-22-1-UID and S-1-22-2-GID (the form Samba also uses for Unix ids
//! without a Windows account); lsarpc names them `Unix User\name` and
//! `Unix Group\name` from the server's user and group databases, through
//! getpwuid_r and its kin so that every NSS source counts.
//!
//! The users of the user database are the server's own accounts,
//! S-1-5-21-<machine>-<RID>, named `SERVER\name` as a Windows server names
//! its local accounts (with its Guest and its "None" group, the primary
//! group of every user).

use std::ffi::{CStr, CString};

use nimbus_rpc::{Account, Sid, SidNameUse};

/// The buffer getpw*_r/getgr*_r may need grows up to this (a group with
/// many members needs more than the usual 1 KiB).
const MAX_BUFFER: usize = 1 << 20;

pub const UNIX_USERS: &str = "Unix User";
pub const UNIX_GROUPS: &str = "Unix Group";

fn domain_sid(kind: u32) -> Sid {
    Sid {
        authority: 22,
        sub_authorities: vec![kind],
    }
}

fn user(name: String, uid: u32) -> Account {
    Account {
        domain: UNIX_USERS.to_string(),
        domain_sid: domain_sid(1),
        name,
        rid: uid,
        kind: SidNameUse::User,
    }
}

fn group(name: String, gid: u32) -> Account {
    Account {
        domain: UNIX_GROUPS.to_string(),
        domain_sid: domain_sid(2),
        name,
        rid: gid,
        kind: SidNameUse::Alias,
    }
}

/// The account an S-1-22-1/2 SID names, if the id has a name here.
pub fn by_sid(sid: &Sid) -> Option<Account> {
    match (sid.authority, sid.sub_authorities.as_slice()) {
        (22, [1, uid]) => user_name(*uid).map(|n| user(n, *uid)),
        (22, [2, gid]) => group_name(*gid).map(|n| group(n, *gid)),
        _ => None,
    }
}

/// The account of a name: in the domain given, or a user before a group
/// of the same name.
pub fn by_name(domain: Option<&str>, name: &str) -> Option<Account> {
    let wants = |d: &str| domain.is_none_or(|given| given.eq_ignore_ascii_case(d));
    if wants(UNIX_USERS) {
        if let Some((n, uid)) = user_id(name) {
            return Some(user(n, uid));
        }
    }
    if wants(UNIX_GROUPS) {
        if let Some((n, gid)) = group_id(name) {
            return Some(group(n, gid));
        }
    }
    None
}

/// Calls a reentrant NSS lookup with a buffer grown until it fits; the
/// closure returns the errno-style result and whether an entry was found.
fn with_buffer<T>(mut f: impl FnMut(&mut [u8]) -> (i32, Option<T>)) -> Option<T> {
    let mut len = 1024;
    loop {
        let mut buf = vec![0u8; len];
        match f(&mut buf) {
            (libc::ERANGE, _) if len < MAX_BUFFER => len *= 4,
            (0, found) => return found,
            _ => return None,
        }
    }
}

fn user_name(uid: u32) -> Option<String> {
    with_buffer(|buf| {
        // SAFETY: a zeroed passwd is a valid out value; buf outlives the
        // call and the name is copied out before it is dropped.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        let name = (!result.is_null() && !pw.pw_name.is_null()).then(|| {
            unsafe { CStr::from_ptr(pw.pw_name) }
                .to_string_lossy()
                .into_owned()
        });
        (rc, name)
    })
}

fn group_name(gid: u32) -> Option<String> {
    with_buffer(|buf| {
        // SAFETY: as in user_name.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut result = std::ptr::null_mut();
        let rc = unsafe {
            libc::getgrgid_r(
                gid,
                &mut gr,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        let name = (!result.is_null() && !gr.gr_name.is_null()).then(|| {
            unsafe { CStr::from_ptr(gr.gr_name) }
                .to_string_lossy()
                .into_owned()
        });
        (rc, name)
    })
}

/// A user's name as the database spells it, and uid.
fn user_id(name: &str) -> Option<(String, u32)> {
    let c = CString::new(name).ok()?;
    with_buffer(|buf| {
        // SAFETY: as in user_name; `c` is a valid C string.
        let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwnam_r(
                c.as_ptr(),
                &mut pw,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        let found = (!result.is_null() && !pw.pw_name.is_null()).then(|| {
            let n = unsafe { CStr::from_ptr(pw.pw_name) }
                .to_string_lossy()
                .into_owned();
            (n, pw.pw_uid)
        });
        (rc, found)
    })
}

fn group_id(name: &str) -> Option<(String, u32)> {
    let c = CString::new(name).ok()?;
    with_buffer(|buf| {
        // SAFETY: as in user_name; `c` is a valid C string.
        let mut gr: libc::group = unsafe { std::mem::zeroed() };
        let mut result = std::ptr::null_mut();
        let rc = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                &mut gr,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        let found = (!result.is_null() && !gr.gr_name.is_null()).then(|| {
            let n = unsafe { CStr::from_ptr(gr.gr_name) }
                .to_string_lossy()
                .into_owned();
            (n, gr.gr_gid)
        });
        (rc, found)
    })
}

/// The server's own accounts: users and groups of the user database (its
/// groups are local groups, "aliases" to lsarpc, as on a Windows server),
/// Guest, None.
pub fn machine_by_sid(
    auth: &nimbus_auth::Authenticator,
    server_name: &str,
    sid: &Sid,
) -> Option<Account> {
    use crate::acl::token::{machine_rid, GUESTS_GROUP_RID, GUEST_RID, NONE_GROUP_RID};
    let machine = auth.machine_sid();
    let rid = machine_rid(machine, sid)?;
    let (name, kind) = match rid {
        GUEST_RID => ("Guest".to_string(), SidNameUse::User),
        NONE_GROUP_RID => ("None".to_string(), SidNameUse::Group),
        GUESTS_GROUP_RID => ("Guests".to_string(), SidNameUse::Group),
        rid => match auth.user_of_rid(rid) {
            Some(user) => (user, SidNameUse::User),
            None => (auth.group_of_rid(rid)?, SidNameUse::Alias),
        },
    };
    Some(machine_account(machine, server_name, name, rid, kind))
}

/// The server's account of that name, in its own domain (or none given).
pub fn machine_by_name(
    auth: &nimbus_auth::Authenticator,
    server_name: &str,
    domain: Option<&str>,
    name: &str,
) -> Option<Account> {
    if domain.is_some_and(|d| !d.eq_ignore_ascii_case(server_name)) {
        return None;
    }
    let machine = auth.machine_sid();
    if let Some(rid) = auth.user_rid(name) {
        let stored = auth.user_of_rid(rid)?;
        return Some(machine_account(
            machine,
            server_name,
            stored,
            rid,
            SidNameUse::User,
        ));
    }
    let rid = auth.group_rid(name)?;
    let stored = auth.group_of_rid(rid)?;
    Some(machine_account(
        machine,
        server_name,
        stored,
        rid,
        SidNameUse::Alias,
    ))
}

fn machine_account(
    machine: nimbus_auth::MachineSid,
    server_name: &str,
    name: String,
    rid: u32,
    kind: SidNameUse,
) -> Account {
    let [a, b, c] = machine.0;
    Account {
        domain: server_name.to_uppercase(),
        domain_sid: Sid {
            authority: 5,
            sub_authorities: vec![21, a, b, c],
        },
        name,
        rid,
        kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_named_both_ways() {
        // uid and gid 0 are root on every system the tests run on.
        let a = by_sid(&Sid {
            authority: 22,
            sub_authorities: vec![1, 0],
        })
        .unwrap();
        assert_eq!(
            (a.domain.as_str(), a.name.as_str(), a.rid),
            (UNIX_USERS, "root", 0)
        );
        assert_eq!(by_name(None, "root").unwrap().sid(), a.sid());
        let g = by_name(Some("unix group"), "root").unwrap();
        assert_eq!(g.sid().to_string(), "S-1-22-2-0");
        assert_eq!(by_sid(&g.sid()).unwrap().name, "root");
        assert!(by_name(Some("Unix User"), "no-such-user-here").is_none());
        assert!(by_name(None, "nul\0inside").is_none());
        assert!(by_sid(&Sid {
            authority: 22,
            sub_authorities: vec![1, 4_000_000_000],
        })
        .is_none());
    }
}
