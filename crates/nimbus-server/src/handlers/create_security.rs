//! Windows permissions at CREATE (crate::acl): the rights a file's stored
//! descriptor grants the session, and the descriptor a new file gets.
//!
//! MS-FSA 2.1.5.1.2.1 (an existing file): the file's DACL decides, except
//! that DELETE also comes from FILE_DELETE_CHILD on the parent and
//! FILE_READ_ATTRIBUTES from FILE_LIST_DIRECTORY on it; overwriting needs
//! FILE_WRITE_DATA. MS-FSA 2.1.5.1.1 (a new file): the parent must grant
//! FILE_ADD_FILE (FILE_ADD_SUBDIRECTORY for a directory), and the creator
//! gets what it asked for whatever the new DACL says.
//!
//! A file or directory without a stored descriptor limits nothing here.

use nimbus_vfs::LocalFs;
use nimbus_wire::create::{context_name, CreateContext};
use nimbus_wire::fscc::access;
use nimbus_wire::security_descriptor::{SdError, SecurityDescriptor};
use nimbus_wire::NtStatus;

use crate::acl::check::{self, ALL_RIGHTS};
use crate::acl::{assign, store, Token};
use crate::errors::vfs_status;
use nimbus_vfs::names::parent;

/// What the descriptors allow this CREATE.
pub struct Security {
    /// The most the open may get (with the tree's maximal access on top).
    pub limit: u32,
    /// The descriptor to store on the file the CREATE makes.
    pub assign: Option<SecurityDescriptor>,
}

impl Security {
    const UNLIMITED: Security = Security {
        limit: u32::MAX,
        assign: None,
    };
}

/// The status a descriptor that does not parse gets.
pub fn sd_status(e: SdError) -> NtStatus {
    match e {
        SdError::Descriptor(_) => NtStatus::INVALID_SECURITY_DESCR,
        SdError::Acl(_) => NtStatus::INVALID_ACL,
        SdError::Sid(_) => NtStatus::INVALID_SID,
    }
}

/// The SD_BUFFER create context's descriptor (MS-SMB2 2.2.13.2.3), checked
/// before anything is created.
pub fn given(contexts: &[CreateContext]) -> Result<Option<SecurityDescriptor>, NtStatus> {
    contexts
        .iter()
        .find(|c| c.name.as_slice() == context_name::SD_BUFFER)
        .map(|c| SecurityDescriptor::parse(&c.data).map_err(sd_status))
        .transpose()
}

fn stored(fs: &LocalFs, path: &str) -> Result<Option<SecurityDescriptor>, NtStatus> {
    store::read(fs, path).map_err(|e| vfs_status(&e))
}

/// A stored descriptor's bytes read already (by `LocalFs::lookup`, with
/// the file's stat), or None when it is still to be read.
pub type Known = Option<Option<Vec<u8>>>;

fn stored_or_known(
    fs: &LocalFs,
    path: &str,
    known: &Known,
) -> Result<Option<SecurityDescriptor>, NtStatus> {
    match known {
        Some(value) => Ok(value.as_ref().map(|v| store::decode(v, path))),
        None => stored(fs, path),
    }
}

/// The decision for a CREATE of `path` (for a stream: its file's path).
/// `is_new`: the CREATE makes the object (for a stream, the file).
pub struct Ask<'a> {
    pub path: &'a str,
    pub is_new: bool,
    pub is_dir: bool,
    /// Generic rights mapped.
    pub desired: u32,
    pub truncating: bool,
    /// A new named stream of an existing file: writing the file, it needs
    /// FILE_WRITE_DATA on it, whatever the open asks for.
    pub adds_stream: bool,
    pub given: Option<&'a SecurityDescriptor>,
    /// The object's own descriptor, and (for a new one) its directory's,
    /// if looked up with its stat.
    pub own: Known,
    pub parent: Known,
}

/// Whether a directory with descriptor `dir` (None: none stored) lets the
/// session add a name to it: FILE_ADD_FILE for a file, FILE_ADD_SUBDIRECTORY
/// for a directory (by CREATE or by rename).
fn may_add(dir: Option<&SecurityDescriptor>, is_dir: bool, token: &Token) -> Result<(), NtStatus> {
    let need = if is_dir {
        access::FILE_ADD_SUBDIRECTORY
    } else {
        access::FILE_ADD_FILE
    };
    match dir {
        Some(sd) if check::granted(sd, token) & need == 0 => Err(NtStatus::ACCESS_DENIED),
        _ => Ok(()),
    }
}

/// [`may_add`] for the directory at `dir`.
pub fn may_add_to(fs: &LocalFs, dir: &str, is_dir: bool, token: &Token) -> Result<(), NtStatus> {
    may_add(stored(fs, dir)?.as_ref(), is_dir, token)
}

pub fn decide(fs: &LocalFs, ask: &Ask<'_>, token: &Token) -> Result<Security, NtStatus> {
    // Only SeSecurityPrivilege opens a SACL, and nobody holds it here.
    if ask.desired & access::ACCESS_SYSTEM_SECURITY != 0 {
        return Err(NtStatus::PRIVILEGE_NOT_HELD);
    }
    if ask.is_new {
        let parent_sd = stored_or_known(fs, parent(ask.path), &ask.parent)?;
        may_add(parent_sd.as_ref(), ask.is_dir, token)?;
        let assign = if parent_sd.is_some() || ask.given.is_some() {
            Some(assign::for_new_file(
                parent_sd.as_ref(),
                ask.given,
                token,
                ask.is_dir,
            )?)
        } else {
            None
        };
        return Ok(Security {
            limit: u32::MAX,
            assign,
        });
    }
    let Some(sd) = stored_or_known(fs, ask.path, &ask.own)? else {
        return Ok(Security::UNLIMITED);
    };
    let mut allowed = check::granted(&sd, token);
    let asked = if ask.desired & access::MAXIMUM_ALLOWED != 0 {
        ALL_RIGHTS
    } else {
        ask.desired
    };
    let from_parent = (access::DELETE | access::FILE_READ_ATTRIBUTES) & asked & !allowed;
    if from_parent != 0 {
        let by_parent =
            stored(fs, parent(ask.path))?.map_or(ALL_RIGHTS, |p| check::granted(&p, token));
        if by_parent & access::FILE_DELETE_CHILD != 0 {
            allowed |= access::DELETE;
        }
        if by_parent & access::FILE_LIST_DIRECTORY != 0 {
            allowed |= access::FILE_READ_ATTRIBUTES;
        }
    }
    if (ask.truncating || ask.adds_stream) && allowed & access::FILE_WRITE_DATA == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    Ok(Security {
        limit: allowed,
        assign: None,
    })
}
