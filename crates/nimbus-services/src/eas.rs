//! Extended attributes (EAs) of files, as clients set and read them
//! (MS-FSA 2.1.5.15.5 set, 2.1.5.12.10 query). Each is kept in an
//! extended attribute of the file, `user.nimbus.ea.` and the EA's name in
//! capitals (EA names compare without case, and NTFS returns them in
//! capitals), its value the EA's flags byte followed by the EA's value.

use nimbus_vfs::{FileHandle, VfsError};
use nimbus_wire::ea::{full_ea_len, FullEa};
use nimbus_wire::NtStatus;

use crate::errors::vfs_status;

const PREFIX: &str = "user.nimbus.ea.";
/// The EAs of one file together, encoded as a FILE_FULL_EA_INFORMATION
/// list, at most (NTFS's limit).
pub const MAX_TOTAL: usize = 64 * 1024;

/// One stored EA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ea {
    pub flags: u8,
    /// In capitals, as stored.
    pub name: String,
    pub value: Vec<u8>,
}

impl Ea {
    pub fn full(&self) -> FullEa<'_> {
        FullEa {
            flags: self.flags,
            name: self.name.as_bytes(),
            value: &self.value,
        }
    }
}

/// MS-FSCC 2.4.15: 1 to 255 ASCII characters, none of the control
/// characters or `" * / : < > ? \ |` (and `+ , ; = [ ]`, which FAT and
/// Windows refuse as well).
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .iter()
            .all(|&c| c > 0x1F && c < 0x7F && !b"\"*/:<>?\\|+,;=[]".contains(&c))
}

/// Whether an EA name is one of the server's own: its case-blind form
/// begins with `USER.NIMBUS.`, the names of the extended attributes in
/// which Nimbus keeps a file's security descriptor (`user.nimbus.sd`), DOS
/// attributes, streams and EAs. Setting such an EA is ACCESS_DENIED, as
/// Samba refuses an EA named after the attribute that holds its ACLs
/// (smbtorture smb2.ea.acl_xattr). An EA's own extended attribute has a
/// prefix of its own, so no EA could reach those attributes anyway; the
/// refusal keeps a name that reads as the server's out of the files, where
/// a tool that copies EAs to extended attributes one to one (or another
/// server exporting the same directory, which maps `user.*` to EAs) would
/// make it the real thing.
pub fn reserved_name(name: &[u8]) -> bool {
    const OWN: &[u8] = b"USER.NIMBUS.";
    name.len() >= OWN.len() && name[..OWN.len()].eq_ignore_ascii_case(OWN)
}

/// The file's EAs, in the order the file system lists them.
pub fn load(handle: &FileHandle) -> Result<Vec<Ea>, NtStatus> {
    let names = handle.list_xattrs(PREFIX).map_err(|e| vfs_status(&e))?;
    let mut out = Vec::with_capacity(names.len());
    for xattr in names {
        let Some(stored) = handle.get_xattr(&xattr).map_err(|e| vfs_status(&e))? else {
            continue; // removed meanwhile
        };
        let Some((&flags, value)) = stored.split_first() else {
            continue;
        };
        out.push(Ea {
            flags,
            name: xattr[PREFIX.len()..].to_string(),
            value: value.to_vec(),
        });
    }
    Ok(out)
}

/// MS-FSCC 2.4.12 FileEaInformation's EaSize: the length of the file's EAs
/// as one FILE_FULL_EA_INFORMATION list (0 when it has none).
pub fn size_of(eas: &[Ea]) -> u32 {
    // Each entry after the first starts 4-byte aligned; the last is not
    // padded.
    let total = eas.iter().fold(0usize, |size, e| {
        size.next_multiple_of(4) + full_ea_len(e.name.len(), e.value.len())
    });
    total as u32
}

/// Applies a FILE_FULL_EA_INFORMATION list: an empty value removes the EA,
/// another sets it. Every name is checked first (INVALID_EA_NAME), and the
/// EAs the file would have after it must fit MAX_TOTAL (EA_TOO_LARGE); a
/// list the file system cannot take whole (its own limit on the space for
/// a file's extended attributes, 4 KiB on ext4) is undone: all or nothing.
pub fn apply(handle: &FileHandle, list: &[FullEa<'_>]) -> Result<(), NtStatus> {
    if list.iter().any(|ea| !valid_name(ea.name)) {
        return Err(NtStatus::INVALID_EA_NAME);
    }
    if list.iter().any(|ea| reserved_name(ea.name)) {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let before = load(handle)?;
    let mut after = before.clone();
    for ea in list {
        let name = String::from_utf8_lossy(ea.name).to_ascii_uppercase();
        after.retain(|e| e.name != name);
        if !ea.value.is_empty() {
            after.push(Ea {
                flags: ea.flags,
                name,
                value: ea.value.to_vec(),
            });
        }
    }
    let total: usize = after
        .iter()
        .map(|e| full_ea_len(e.name.len(), e.value.len()).next_multiple_of(4))
        .sum();
    if total > MAX_TOTAL {
        return Err(NtStatus::EA_TOO_LARGE);
    }
    let mut written = Vec::new();
    for ea in list {
        let name = String::from_utf8_lossy(ea.name).to_ascii_uppercase();
        if let Err(e) = store(handle, &name, ea.flags, ea.value) {
            undo(handle, &before, &written);
            return Err(match e {
                // The file system's own limit on extended attributes.
                VfsError::NoSpace | VfsError::InvalidParameter => NtStatus::EA_TOO_LARGE,
                e => vfs_status(&e),
            });
        }
        written.push(name);
    }
    Ok(())
}

/// Sets (or, with an empty value, removes) one EA.
fn store(handle: &FileHandle, name: &str, flags: u8, value: &[u8]) -> Result<(), VfsError> {
    let xattr = format!("{PREFIX}{name}");
    if value.is_empty() {
        return handle.remove_xattr(&xattr);
    }
    let mut stored = Vec::with_capacity(1 + value.len());
    stored.push(flags);
    stored.extend_from_slice(value);
    handle.set_xattr(&xattr, &stored)
}

/// Puts back what `apply` changed of `before` (best effort: the failure
/// being answered is the one the client hears of).
fn undo(handle: &FileHandle, before: &[Ea], written: &[String]) {
    for name in written {
        let old = before.iter().find(|e| &e.name == name);
        let r = match old {
            Some(e) => store(handle, name, e.flags, &e.value),
            None => store(handle, name, 0, &[]),
        };
        if let Err(e) = r {
            tracing::warn!("putting back EA {name} after a failed SET_INFO: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_is_the_encoded_lists_length() {
        let ea = |name: &str, len: usize| Ea {
            flags: 0,
            name: name.to_string(),
            value: vec![7; len],
        };
        for eas in [
            vec![],
            vec![ea("A", 1)],
            vec![ea("A", 2), ea("BC", 0), ea("DEF", 5)],
        ] {
            let mut list = Vec::new();
            nimbus_wire::ea::encode_full_ea_list(eas.iter().map(Ea::full), &mut list);
            assert_eq!(size_of(&eas) as usize, list.len());
        }
    }

    #[test]
    fn the_servers_own_names_are_reserved_in_any_case() {
        for own in [&b"user.nimbus.sd"[..], b"USER.NIMBUS.EA.X", b"User.Nimbus."] {
            assert!(reserved_name(own), "{own:?}");
        }
        for other in [
            &b"user.nimbus"[..],
            b"user.nimbusX.sd",
            b"security.NTACL",
            b"NIMBUS.SD",
        ] {
            assert!(!reserved_name(other), "{other:?}");
        }
    }

    #[test]
    fn names_follow_ms_fscc() {
        assert!(valid_name(b"user.test"));
        assert!(valid_name(b"A B-C_D"));
        for bad in [
            &b""[..],
            b"a:b",
            b"a\\b",
            b"a*",
            b"\x01x",
            b"a\x7f",
            &[b'a'; 256],
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name(&[b'a'; 255]));
    }
}
