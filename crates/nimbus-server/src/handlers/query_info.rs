//! MS-SMB2 3.3.5.20 Receiving an SMB2 QUERY_INFO Request: file, file system
//! and security information.

use std::sync::atomic::Ordering;

use nimbus_wire::fscc::{
    access, encode_file_class, encode_fs_class, encode_stream_information, file_class, fs_class,
    OpenView, StreamEntry,
};
use nimbus_wire::info::{info_type, QueryInfoRequest};
use nimbus_wire::query_directory::encode_output_buffer_response;
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::ctx::{Ctx, HandlerResult};
use crate::eas::{self, Ea};
use crate::errors::vfs_status;
use crate::fileinfo::{open_info, volume_info};
use crate::session::Open;
use nimbus_vfs::names::dos_name;

/// Size of the fixed part of a variable-length class: a buffer at least
/// this big gets a truncated answer and STATUS_BUFFER_OVERFLOW, a smaller
/// one STATUS_INFO_LENGTH_MISMATCH. None: the class is all fixed.
fn fixed_part(info_type: u8, class: u8) -> Option<usize> {
    match (info_type, class) {
        // Windows counts the structure with the first character of its name,
        // rounded up to 8 bytes: 104 for FileAllInformation (100 + 2), 32
        // for FileStreamInformation (24 + 2); smbtorture
        // smb2.getinfo.qfile_buffercheck checks both.
        (info_type::FILE, file_class::ALL) => Some(104),
        (info_type::FILE, file_class::NAME | file_class::NORMALIZED_NAME) => Some(4),
        // As FileStreamInformation: 4 + 2, rounded up (qfile_buffercheck).
        (info_type::FILE, file_class::ALTERNATE_NAME) => Some(8),
        (info_type::FILE, file_class::STREAM) => Some(32),
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
            // MS-SMB2 3.3.5.20.1: the normalized name is a 3.1.1 class.
            if req.info_class == file_class::NORMALIZED_NAME
                && ctx
                    .conn
                    .negotiated()
                    .is_none_or(|n| n.dialect != nimbus_wire::negotiate::Dialect::Smb311)
            {
                return Err(NtStatus::NOT_SUPPORTED);
            }
            if req.info_class == file_class::FULL_EA {
                return full_ea_information(&open, &req, out);
            }
            let ea_size = if matches!(req.info_class, file_class::EA | file_class::ALL) {
                eas::size_of(&eas::load(open.meta())?)
            } else {
                0
            };
            // Only FileStandardInformation and FileAllInformation report
            // delete-pending (and the link count it lowers): other classes
            // read no state. Read in place: a query through an open a
            // cluster node left out of the file's records (an attribute
            // open) does not ask the node that holds the file for it.
            let pending_of = |key| ctx.server.share_modes.delete_pending_in_place(key);
            let reports_pending = matches!(req.info_class, file_class::STANDARD | file_class::ALL);
            // A stream is delete-pending with its file too.
            let pending = reports_pending
                && (pending_of(open.file_key)
                    || open.stream.as_ref().is_some_and(|s| pending_of(s.base_key)));
            // A delayed write-time update now due is made first.
            ctx.server.write_times.settle(&open);
            let mut info = open_info(&open, pending).map_err(|e| vfs_status(&e))?;
            ctx.server.write_times.adjust(open.meta_key(), &mut info);
            let name = open.smb_name();
            let view = OpenView {
                access_flags: open.access,
                position: open.position.load(Ordering::Relaxed),
                mode: open.mode.load(Ordering::Relaxed),
                name: if req.info_class == file_class::NAME || req.info_class == file_class::ALL {
                    &name
                } else {
                    &name[1..]
                },
                ea_size,
            };
            if req.info_class == file_class::STREAM {
                stream_information(&open, &ctx.conn.apple)?
            } else if req.info_class == file_class::ALTERNATE_NAME {
                alternate_name(&open)
            } else {
                encode_file_class(req.info_class, &info, &view)
                    .ok_or(NtStatus::INVALID_INFO_CLASS)?
            }
        }
        info_type::FILESYSTEM => {
            let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
            let st = fs.statfs().map_err(|e| vfs_status(&e))?;
            let vol = volume_info(&st, &open.share.name, open.share.created, fs.can_clone());
            encode_fs_class(req.info_class, &vol).ok_or(NtStatus::INVALID_INFO_CLASS)?
        }
        info_type::SECURITY => {
            let sd = super::security_info::query(ctx, &open, req.additional_information)?;
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

/// FileStreamInformation (MS-FSA 2.1.5.12.29, no access needed): the
/// file's unnamed data stream (a directory has none) and its named ones,
/// whichever of them the open is of.
fn stream_information(open: &Open, apple: &crate::apple::AppleState) -> Result<Vec<u8>, NtStatus> {
    let vfs = |e: nimbus_vfs::VfsError| vfs_status(&e);
    let meta = open.meta();
    let base = meta.stat().map_err(vfs)?;
    let mut names = Vec::new();
    if !base.is_dir {
        names.push((
            "::$DATA".to_string(),
            base.size,
            meta.data_allocation(&base),
        ));
    }
    let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
    if let Some(streams) = fs.streams(meta, false).map_err(vfs)? {
        let mut named = streams.list().map_err(vfs)?;
        // What exists only on disk is not shown (crate::apple).
        named.retain(|(name, st)| crate::apple::stream_listed(apple, &open.share, name, st.size));
        // In the order they were made, where the file system keeps birth
        // times; by name where it does not.
        named.sort_by_key(|(name, st)| (st.btime.map(|t| (t.sec, t.nsec)), name.clone()));
        names.extend(
            named
                .into_iter()
                .map(|(n, st)| (format!(":{n}:$DATA"), st.size, st.alloc_size)),
        );
    }
    let entries: Vec<StreamEntry<'_>> = names
        .iter()
        .map(|(name, size, alloc)| StreamEntry {
            name,
            size: *size,
            allocation_size: *alloc,
        })
        .collect();
    let mut out = Vec::new();
    encode_stream_information(&entries, &mut out);
    Ok(out)
}

/// FileAlternateNameInformation (MS-FSCC 2.4.5, laid out as
/// FILE_NAME_INFORMATION): the 8.3 name of the file's last component (of
/// the file a stream belongs to), empty for the share root.
fn alternate_name(open: &Open) -> Vec<u8> {
    let path = open.path();
    let leaf = path.rsplit('/').next().unwrap_or("");
    let short = if leaf.is_empty() {
        String::new()
    } else {
        dos_name(leaf)
    };
    let name = nimbus_wire::codec::utf16le(&short);
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
    out.extend_from_slice(&name);
    out
}

/// MS-SMB2 2.2.37 Flags of a QUERY_INFO for FileFullEaInformation.
const SL_RESTART_SCAN: u32 = 0x1;
const SL_RETURN_SINGLE_ENTRY: u32 = 0x2;
const SL_INDEX_SPECIFIED: u32 = 0x4;

/// FileFullEaInformation (MS-FSA 2.1.5.12.10, needs READ_EA): the EAs named
/// in the request's FILE_GET_EA_INFORMATION list (one not there comes back
/// with no value), or else the file's EAs from the open's place in them
/// (SL_RESTART_SCAN from the first, SL_INDEX_SPECIFIED from the 1-based
/// index in AdditionalInformation), whole entries only: as many as fit
/// (BUFFER_OVERFLOW when more remain), or one with SL_RETURN_SINGLE_ENTRY.
fn full_ea_information(
    open: &Open,
    req: &QueryInfoRequest<'_>,
    out: &mut Vec<u8>,
) -> HandlerResult {
    if open.access & access::FILE_READ_EA == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let limit = req.output_buffer_length as usize;
    let stored = eas::load(open.meta())?;
    let (picked, start) = if !req.input.is_empty() {
        let names = nimbus_wire::ea::parse_get_ea_list(req.input)
            .map_err(|_| NtStatus::EA_LIST_INCONSISTENT)?;
        let picked: Vec<Ea> = names
            .iter()
            .map(|n| {
                let name = String::from_utf8_lossy(n).to_ascii_uppercase();
                stored
                    .iter()
                    .find(|e| e.name == name)
                    .cloned()
                    .unwrap_or(Ea {
                        flags: 0,
                        name,
                        value: Vec::new(),
                    })
            })
            .collect();
        (picked, None)
    } else {
        if stored.is_empty() {
            return Err(NtStatus::NO_EAS_ON_FILE);
        }
        let mut at = open.ea_index.load(Ordering::Relaxed) as usize;
        if req.flags & SL_RESTART_SCAN != 0 {
            at = 0;
        }
        if req.flags & SL_INDEX_SPECIFIED != 0 {
            at = (req.additional_information as usize).saturating_sub(1);
        }
        if at >= stored.len() {
            return Err(NtStatus::NO_MORE_EAS);
        }
        (stored[at..].to_vec(), Some(at))
    };
    let single = req.flags & SL_RETURN_SINGLE_ENTRY != 0 && start.is_some();
    // Whole entries, each after the first 4-byte aligned, up to the limit.
    let mut fit = 0;
    let mut size = 0usize;
    for e in &picked {
        let padded = size.next_multiple_of(4);
        let end = padded + nimbus_wire::ea::full_ea_len(e.name.len(), e.value.len());
        if end > limit || (single && fit == 1) {
            break;
        }
        size = end;
        fit += 1;
    }
    if fit == 0 {
        return Err(NtStatus::BUFFER_TOO_SMALL);
    }
    let mut list = Vec::with_capacity(size);
    nimbus_wire::ea::encode_full_ea_list(picked[..fit].iter().map(Ea::full), &mut list);
    if let Some(at) = start {
        open.ea_index.store((at + fit) as u32, Ordering::Relaxed);
    }
    encode_output_buffer_response(out, &list);
    Ok(if fit < picked.len() && !single {
        NtStatus::BUFFER_OVERFLOW
    } else {
        NtStatus::SUCCESS
    })
}
