//! SUPPORTS_NFS_ACE: a Mac reads a file's Unix owner, group and mode from
//! three ACEs of the S-1-5-88 authority ("MS-NFS" SIDs, as Windows' NFS
//! server writes them) in the DACL, and changes the mode by sending one
//! back. They grant and deny nothing (access mask 0): the access check
//! passes over them.

use nimbus_vfs::Stat;
use nimbus_wire::dtyp::Sid;
use nimbus_wire::security_descriptor::{ace_type, Ace, SecurityDescriptor};

/// S-1-5-88-1-<uid>, S-1-5-88-2-<gid>, S-1-5-88-3-<mode>.
const NT_AUTHORITY: u64 = 5;
const NFS_AUTHORITY: u32 = 88;
const UID: u32 = 1;
const GID: u32 = 2;
const MODE: u32 = 3;

fn nfs_sid(kind: u32, value: u32) -> Sid {
    Sid {
        authority: NT_AUTHORITY,
        sub_authorities: vec![NFS_AUTHORITY, kind, value],
    }
}

/// The kind and value of an S-1-5-88 SID.
fn nfs_parts(sid: &Sid) -> Option<(u32, u32)> {
    match sid.sub_authorities.as_slice() {
        [NFS_AUTHORITY, kind, value] if sid.authority == NT_AUTHORITY => Some((*kind, *value)),
        _ => None,
    }
}

fn is_nfs(ace: &Ace) -> bool {
    ace.sid.as_ref().is_some_and(|s| {
        s.authority == NT_AUTHORITY && s.sub_authorities.first() == Some(&NFS_AUTHORITY)
    })
}

/// Adds the three ACEs that describe `st` to the DACL shown (replacing any
/// stored ones). A null DACL stays null: an ACE would turn "everyone may
/// do everything" into "nobody may do anything".
pub fn show(sd: &mut SecurityDescriptor, st: &Stat) {
    let Some(dacl) = sd.dacl.as_mut() else {
        return;
    };
    dacl.aces.retain(|a| !is_nfs(a));
    let file_type = if st.is_dir { 0o040000 } else { 0o100000 };
    for sid in [
        nfs_sid(MODE, file_type | (st.mode & 0o7777)),
        nfs_sid(UID, st.uid),
        nfs_sid(GID, st.gid),
    ] {
        dacl.aces.push(Ace::new(ace_type::ACCESS_DENIED, 0, 0, sid));
    }
}

/// Takes the S-1-5-88 ACEs out of a descriptor to store; returns the
/// permission bits a mode ACE among them asks for.
pub fn take(sd: &mut SecurityDescriptor) -> Option<u32> {
    let dacl = sd.dacl.as_mut()?;
    let mode = dacl
        .aces
        .iter()
        .filter_map(|a| a.sid.as_ref().and_then(nfs_parts))
        .find(|(kind, _)| *kind == MODE)
        .map(|(_, value)| value & 0o777);
    dacl.aces.retain(|a| !is_nfs(a));
    mode
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_wire::security_descriptor::Acl;

    fn stat() -> Stat {
        let t = nimbus_vfs::Timespec { sec: 0, nsec: 0 };
        Stat {
            size: 0,
            alloc_size: 0,
            is_dir: false,
            is_symlink: false,
            mode: 0o644,
            uid: 1000,
            gid: 100,
            nlink: 1,
            ino: 1,
            dev: 1,
            gen: 1,
            atime: t,
            mtime: t,
            ctime: t,
            btime: None,
        }
    }

    #[test]
    fn shown_once_whatever_was_stored_and_taken_out_again() {
        let mut sd = SecurityDescriptor {
            dacl: Some(Acl::new(vec![
                Ace::new(ace_type::ACCESS_ALLOWED, 0, 0x1F01FF, Sid::everyone()),
                Ace::new(ace_type::ACCESS_DENIED, 0, 0, nfs_sid(UID, 27)),
            ])),
            ..SecurityDescriptor::default()
        };
        show(&mut sd, &stat());
        let aces = &sd.dacl.as_ref().unwrap().aces;
        assert_eq!(aces.len(), 4);
        let sids: Vec<_> = aces
            .iter()
            .filter_map(|a| a.sid.as_ref().and_then(nfs_parts))
            .collect();
        assert_eq!(sids, vec![(MODE, 0o100644), (UID, 1000), (GID, 100)]);
        assert!(aces[1..]
            .iter()
            .all(|a| a.mask == 0 && a.kind == ace_type::ACCESS_DENIED));
        assert_eq!(take(&mut sd), Some(0o644));
        assert_eq!(sd.dacl.as_ref().unwrap().aces.len(), 1);
    }

    #[test]
    fn a_null_dacl_stays_null() {
        let mut sd = SecurityDescriptor::default();
        show(&mut sd, &stat());
        assert!(sd.dacl.is_none());
        assert_eq!(take(&mut sd), None);
    }
}
