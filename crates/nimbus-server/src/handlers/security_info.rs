//! Security descriptors through QUERY_INFO and SET_INFO (MS-SMB2
//! 3.3.5.20.3 and 3.3.5.21.3, info type SMB2_0_INFO_SECURITY).
//!
//! A file with a stored descriptor (crate::acl::store) shows it. One
//! without shows the descriptor made up from its POSIX mode, with the
//! asking user as its owner: every user acts on the disk as the server's
//! one Unix account, so each may do to such a file what that account may,
//! as an owner would. The first SET_INFO stores a descriptor, built on the
//! one shown; from then on the file's own rules apply.

use nimbus_wire::dtyp::security_information as si;
use nimbus_wire::posix_descriptor::posix_security_descriptor;
use nimbus_wire::security_descriptor::SecurityDescriptor;
use nimbus_wire::NtStatus;

use super::create_security::sd_status;
use crate::acl::{assign, store, Token};
use crate::ctx::Ctx;
use crate::errors::vfs_status;
use crate::fileinfo::is_readonly;
use crate::session::Open;

/// The descriptor of `open`'s file (a stream's is its file's).
fn current(open: &Open, token: &Token) -> Result<SecurityDescriptor, NtStatus> {
    let meta = open.meta();
    if let Some(sd) = store::read_handle(meta, &open.path()).map_err(|e| vfs_status(&e))? {
        return Ok(sd);
    }
    let st = meta.stat().map_err(|e| vfs_status(&e))?;
    // READONLY clears the write bits; on Windows it leaves the DACL alone,
    // so the DACL shown is the one from before (clearing it sets u+w).
    let mode = if !st.is_dir && is_readonly(st.mode) {
        st.mode | 0o200
    } else {
        st.mode
    };
    Ok(posix_security_descriptor(
        token.user.clone(),
        st.gid,
        mode,
        st.is_dir,
    ))
}

/// The self-relative encoding of the parts `wanted` asks for.
pub fn query(ctx: &Ctx<'_>, open: &Open, wanted: u32) -> Result<Vec<u8>, NtStatus> {
    let need = assign::rights_to_query(wanted);
    if open.access & need != need {
        return Err(NtStatus::ACCESS_DENIED);
    }
    // No part asked for (AdditionalInformation 0): Windows and Samba answer
    // the empty self-relative descriptor (MS-DTYP 2.4.6: revision 1,
    // SE_SELF_RELATIVE, no owner, group or ACL), whatever the open's access.
    if wanted & (si::OWNER | si::GROUP | si::DACL | si::SACL) == 0 {
        return Ok(SecurityDescriptor::default().encode(0));
    }
    let token = ctx
        .session()?
        .token()
        .ok_or(NtStatus::USER_SESSION_DELETED)?;
    let mut sd = current(open, &token)?;
    // A Mac reads the Unix owner, group and mode from the DACL.
    if wanted & si::DACL != 0 && ctx.conn.apple.on(&open.share) {
        let st = open.meta().stat().map_err(|e| vfs_status(&e))?;
        crate::apple::nfs_ace::show(&mut sd, &st);
    }
    Ok(sd.encode(wanted))
}

/// Stores the parts `info` names of the descriptor in `buffer`.
pub fn set(ctx: &Ctx<'_>, open: &Open, info: u32, buffer: &[u8]) -> Result<(), NtStatus> {
    let need = assign::rights_to_set(info);
    if open.access & need != need {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let mut new = SecurityDescriptor::parse(buffer).map_err(sd_status)?;
    // The Unix owner, group and mode a Mac shows as ACEs are not stored;
    // a mode among them is the mode it sets (crate::apple::nfs_ace).
    if info & si::DACL != 0 && ctx.conn.apple.on(&open.share) {
        if let Some(mode) = crate::apple::nfs_ace::take(&mut new) {
            set_mode(open, mode)?;
        }
    }
    let token = ctx
        .session()?
        .token()
        .ok_or(NtStatus::USER_SESSION_DELETED)?;
    let merged = assign::with_changes(&current(open, &token)?, &new, info, &token)?;
    if merged.dacl.as_ref().is_some_and(|a| !a.fits()) {
        return Err(NtStatus::INVALID_ACL);
    }
    store::write(open.meta(), &merged).map_err(|e| vfs_status(&e))?;
    ctx.server
        .notify
        .modified(open, nimbus_wire::notify::completion_filter::SECURITY);
    Ok(())
}

/// The permission bits a Mac sets (chmod on its mount; no write bits is
/// READONLY, as everywhere in Nimbus). The owner's read (and a directory's
/// search) stays: the server acts on the disk as that owner, who of the
/// share's users may read is the DACL's to say, and a file the server
/// cannot read is lost to every one of them.
fn set_mode(open: &Open, mode: u32) -> Result<(), NtStatus> {
    let meta = open.meta();
    let st = meta.stat().map_err(|e| vfs_status(&e))?;
    let keep = if st.is_dir { 0o500 } else { 0o400 };
    meta.set_mode((mode & 0o777) | keep)
        .map_err(|e| vfs_status(&e))
}
