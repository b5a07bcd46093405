//! MS-SMB2 3.3.5.20 Receiving an SMB2 QUERY_INFO Request: file, file system
//! and security information.

use std::sync::atomic::Ordering;

use nimbus_wire::dtyp::posix_security_descriptor;
use nimbus_wire::fscc::{
    access, encode_file_class, encode_fs_class, file_class, fs_class, OpenView,
};
use nimbus_wire::info::{info_type, QueryInfoRequest};
use nimbus_wire::query_directory::encode_output_buffer_response;
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::dispatch::{Ctx, HandlerResult};
use crate::dosinfo::DosInfo;
use crate::errors::vfs_status;
use crate::fileinfo::{file_info, volume_info};
use crate::names::to_smb_name;

/// Size of the fixed part of a variable-length class: a buffer at least
/// this big gets a truncated answer and STATUS_BUFFER_OVERFLOW, a smaller
/// one STATUS_INFO_LENGTH_MISMATCH. None: the class is all fixed.
fn fixed_part(info_type: u8, class: u8) -> Option<usize> {
    match (info_type, class) {
        (info_type::FILE, file_class::ALL) => Some(100),
        (info_type::FILE, file_class::NAME | file_class::NORMALIZED_NAME) => Some(4),
        (info_type::FILE, file_class::STREAM) => Some(24),
        // Windows asks for the fixed part rounded up to 8 bytes: 24 for
        // FileFsVolumeInformation (18 + label), 16 for FileFsAttributeInformation.
        (info_type::FILESYSTEM, fs_class::VOLUME) => Some(24),
        (info_type::FILESYSTEM, fs_class::ATTRIBUTE) => Some(16),
        _ => None,
    }
}

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = QueryInfoRequest::parse(body).map_err(malformed)?;
    let open = ctx.open(req.file_id)?;
    check_credit_charge(ctx, req.output_buffer_length)?;
    let limit = req.output_buffer_length as usize;
    let data = match req.info_type {
        info_type::FILE => {
            let needs_read_attributes = matches!(
                req.info_class,
                file_class::BASIC
                    | file_class::ALL
                    | file_class::NETWORK_OPEN
                    | file_class::ATTRIBUTE_TAG
            );
            if needs_read_attributes && open.access & access::FILE_READ_ATTRIBUTES == 0 {
                return Err(NtStatus::ACCESS_DENIED);
            }
            if req.info_class == file_class::FULL_EA {
                return Err(NtStatus::NO_EAS_ON_FILE);
            }
            let st = open.handle.stat().map_err(|e| vfs_status(&e))?;
            let pending = ctx
                .server
                .share_modes
                .record(open.file_key)
                .map(|r| r.delete_pending)
                .unwrap_or(false);
            let name = to_smb_name(&open.path());
            let view = OpenView {
                access_flags: open.access,
                position: open.position.load(Ordering::Relaxed),
                mode: open.mode.load(Ordering::Relaxed),
                name: if req.info_class == file_class::NAME || req.info_class == file_class::ALL {
                    &name
                } else {
                    &name[1..]
                },
            };
            encode_file_class(
                req.info_class,
                &file_info(&st, &DosInfo::load(&open.handle), pending),
                &view,
            )
            .ok_or(NtStatus::INVALID_INFO_CLASS)?
        }
        info_type::FILESYSTEM => {
            let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
            let st = fs.statfs().map_err(|e| vfs_status(&e))?;
            let vol = volume_info(&st, &open.share.name, open.share.created, fs.can_clone());
            encode_fs_class(req.info_class, &vol).ok_or(NtStatus::INVALID_INFO_CLASS)?
        }
        info_type::SECURITY => {
            if open.access & access::READ_CONTROL == 0 {
                return Err(NtStatus::ACCESS_DENIED);
            }
            let st = open.handle.stat().map_err(|e| vfs_status(&e))?;
            let sd = posix_security_descriptor(
                st.uid,
                st.gid,
                st.mode,
                st.is_dir,
                req.additional_information,
            );
            if sd.len() > limit {
                // MS-SMB2 3.3.5.20.3: tell the client the size it needs.
                ctx.error_data = (sd.len() as u32).to_le_bytes().to_vec();
                return Err(NtStatus::BUFFER_TOO_SMALL);
            }
            sd
        }
        info_type::QUOTA => return Err(NtStatus::NOT_SUPPORTED),
        _ => return Err(NtStatus::INVALID_PARAMETER),
    };
    if data.len() <= limit {
        encode_output_buffer_response(out, &data);
        return Ok(NtStatus::SUCCESS);
    }
    match fixed_part(req.info_type, req.info_class) {
        Some(fixed) if limit >= fixed => {
            encode_output_buffer_response(out, &data[..limit]);
            Ok(NtStatus::BUFFER_OVERFLOW)
        }
        _ => Err(NtStatus::INFO_LENGTH_MISMATCH),
    }
}
