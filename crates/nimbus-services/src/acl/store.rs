//! Descriptors kept with their files: in the extended attribute
//! `user.nimbus.sd` (so they follow the file through renames and live on
//! the shared file system every cluster node sees), as a version byte and
//! the self-relative encoding of MS-DTYP 2.4.6.

use nimbus_vfs::{FileHandle, LocalFs, VfsError};
use nimbus_wire::fscc::access;
use nimbus_wire::security_descriptor::{control, Acl, SecurityDescriptor};
use nimbus_wire::NtStatus;

use super::Token;
use crate::errors::vfs_status;
use nimbus_vfs::names::parent;

/// The extended attribute holding a file's descriptor.
pub const XATTR_NAME: &str = "user.nimbus.sd";
const VERSION: u8 = 1;

pub fn encode(sd: &SecurityDescriptor) -> Vec<u8> {
    let mut out = vec![VERSION];
    out.extend_from_slice(&sd.encode_all());
    out
}

/// The stored value as a descriptor. One that cannot be read (another
/// version, or damaged on the disk) grants nothing to anyone: a file whose
/// permissions are unknown is not opened for everyone instead. The
/// server's log names the file; removing the attribute gives it back its
/// POSIX-derived permissions.
pub fn decode(value: &[u8], what: &str) -> SecurityDescriptor {
    match value.split_first() {
        Some((&VERSION, sd)) => match SecurityDescriptor::parse(sd) {
            Ok(sd) => return sd,
            Err(e) => tracing::error!(
                "{what}: the security descriptor in {XATTR_NAME} is damaged ({e:?}); nobody may \
                 open the file until it is set again or the attribute is removed (setfattr -x \
                 {XATTR_NAME})"
            ),
        },
        _ => tracing::error!(
            "{what}: {XATTR_NAME} holds a security descriptor of an unknown version; nobody may \
             open the file until the attribute is removed (setfattr -x {XATTR_NAME})"
        ),
    }
    SecurityDescriptor {
        control: control::SELF_RELATIVE | control::DACL_PRESENT,
        dacl: Some(Acl::new(Vec::new())),
        ..Default::default()
    }
}

/// The stored descriptor of what `path` names, if it has one.
pub fn read(fs: &LocalFs, path: &str) -> Result<Option<SecurityDescriptor>, VfsError> {
    Ok(fs.get_xattr(path, XATTR_NAME)?.map(|v| decode(&v, path)))
}

/// The stored descriptor of an open file, if it has one.
pub fn read_handle(
    handle: &FileHandle,
    what: &str,
) -> Result<Option<SecurityDescriptor>, VfsError> {
    Ok(handle.get_xattr(XATTR_NAME)?.map(|v| decode(&v, what)))
}

/// Stores `sd` with the file. Linux lets only a writer set `user.`
/// attributes, so when the server does not run as root a READONLY file
/// (no write bits) gets its owner's write bit back for the moment.
pub fn write(handle: &FileHandle, sd: &SecurityDescriptor) -> Result<(), VfsError> {
    let value = encode(sd);
    match handle.set_xattr(XATTR_NAME, &value) {
        Err(VfsError::AccessDenied) => {
            let mode = handle.stat()?.mode;
            if mode & 0o200 != 0 {
                return Err(VfsError::AccessDenied);
            }
            handle.set_mode(mode | 0o200)?;
            let r = handle.set_xattr(XATTR_NAME, &value);
            handle.set_mode(mode)?;
            r
        }
        r => r,
    }
}

/// Whether the session may delete what `path` names: DELETE from its
/// stored descriptor, or FILE_DELETE_CHILD from its directory's (MS-FSA
/// 2.1.5.1.2.1); a file without a descriptor limits nothing.
pub fn may_delete(fs: &LocalFs, path: &str, token: &Token) -> Result<(), NtStatus> {
    let Some(sd) = read(fs, path).map_err(|e| vfs_status(&e))? else {
        return Ok(());
    };
    if super::check::granted(&sd, token) & access::DELETE != 0 {
        return Ok(());
    }
    match read(fs, parent(path)).map_err(|e| vfs_status(&e))? {
        Some(p) if super::check::granted(&p, token) & access::FILE_DELETE_CHILD == 0 => {
            Err(NtStatus::ACCESS_DENIED)
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_wire::dtyp::Sid;

    #[test]
    fn round_trip_and_damage() {
        let sd = SecurityDescriptor {
            control: control::SELF_RELATIVE,
            owner: Some(Sid::everyone()),
            ..Default::default()
        };
        assert_eq!(decode(&encode(&sd), "f"), sd);
        // Damaged or unknown: an empty DACL, which grants nothing.
        for bad in [&[][..], &[2, 1, 0][..], &[VERSION, 1, 0, 0][..]] {
            let d = decode(bad, "f");
            assert_eq!(d.dacl.map(|a| a.aces.len()), Some(0));
            assert!(d.owner.is_none());
        }
    }
}
