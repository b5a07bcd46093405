//! MS-SMB2 3.3.5.15 Receiving an SMB2 IOCTL Request. The FSCTLs that act on
//! a file's data have modules of their own: server-side copy (`copychunk`),
//! block cloning (`clone`) and sparse files (`sparse`).

mod clone;
mod copychunk;
mod copyfile;
mod sparse;

use nimbus_wire::ioctl::{
    ctl_code, encode_ioctl_response, encode_network_interfaces, encode_validate_negotiate_response,
    IoctlRequest, ValidateNegotiateInfo, IOCTL_IS_FSCTL,
};
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::ctx::{Ctx, HandlerResult};

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = IoctlRequest::parse(body).map_err(malformed)?;
    if req.flags != IOCTL_IS_FSCTL {
        return Err(NtStatus::NOT_SUPPORTED);
    }
    check_credit_charge(
        ctx,
        req.input
            .len()
            .max(req.max_output_response as usize)
            .min(u32::MAX as usize) as u32,
    )?;
    let mut output = Vec::new();
    let mut status = NtStatus::SUCCESS;
    match req.ctl_code {
        ctl_code::FSCTL_VALIDATE_NEGOTIATE_INFO => validate_negotiate(ctx, req.input, &mut output)?,
        ctl_code::FSCTL_QUERY_NETWORK_INTERFACE_INFO => {
            // MS-SMB2 3.3.5.15.11: asked of the server, not of an open.
            if req.file_id != nimbus_wire::FileId::RELATED {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            encode_network_interfaces(
                &mut output,
                &crate::interfaces::listed(&ctx.server.config().listen, ctx.conn.local.ip()),
            );
        }
        ctl_code::FSCTL_CREATE_OR_GET_OBJECT_ID => {
            let open = ctx.open(req.file_id)?;
            let st = open
                .handle
                .stat()
                .map_err(|e| crate::errors::vfs_status(&e))?;
            object_id(&mut output, st.dev, st.ino);
        }
        ctl_code::FSCTL_LMR_REQUEST_RESILIENCY => request_resiliency(ctx, &req)?,
        // Not a DFS server: clients then use the path as it is.
        ctl_code::FSCTL_DFS_GET_REFERRALS => return Err(NtStatus::NOT_FOUND),
        ctl_code::FSCTL_PIPE_TRANSCEIVE if super::pipe::on_ipc(ctx) => {
            return super::pipe::transceive(ctx, &req, out);
        }
        ctl_code::FSCTL_PIPE_TRANSCEIVE => return Err(NtStatus::INVALID_DEVICE_REQUEST),
        ctl_code::FSCTL_SRV_REQUEST_RESUME_KEY => {
            copychunk::request_resume_key(ctx, &req, &mut output)?
        }
        ctl_code::FSCTL_SRV_COPYCHUNK | ctl_code::FSCTL_SRV_COPYCHUNK_WRITE => {
            return copychunk::copy_chunk(ctx, &req, out);
        }
        ctl_code::FSCTL_DUPLICATE_EXTENTS_TO_FILE => clone::duplicate_extents(ctx, &req)?,
        ctl_code::FSCTL_SET_SPARSE => sparse::set_sparse(ctx, &req)?,
        ctl_code::FSCTL_SET_ZERO_DATA => sparse::set_zero_data(ctx, &req)?,
        ctl_code::FSCTL_QUERY_ALLOCATED_RANGES => {
            status = sparse::query_allocated_ranges(ctx, &req, &mut output)?
        }
        ctl_code::FSCTL_GET_COMPRESSION => sparse::get_compression(ctx, &req, &mut output)?,
        ctl_code::FSCTL_SET_COMPRESSION => sparse::set_compression(ctx, &req)?,
        _ => {
            // File-system controls act on an open: a stale handle is
            // reported as such before the code is judged.
            if req.file_id != nimbus_wire::FileId::RELATED || ctx.related {
                ctx.open(req.file_id)?;
            }
            return Err(NtStatus::INVALID_DEVICE_REQUEST);
        }
    }
    if output.len() > req.max_output_response as usize {
        return Err(NtStatus::BUFFER_TOO_SMALL);
    }
    encode_ioctl_response(out, req.ctl_code, req.file_id, &output);
    Ok(status)
}

/// MS-SMB2 3.3.5.15.12: the client proves the NEGOTIATE was not tampered
/// with; any mismatch means a downgrade attack and ends the connection.
/// MS-SMB2 3.3.5.15.9: a resilient open is kept through a lost
/// connection for the time asked (at most `max_durable_handle_timeout`),
/// like a durable one, and its LOCKs are checked for replays.
fn request_resiliency(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>) -> Result<(), NtStatus> {
    let neg = ctx.conn.negotiated().ok_or(NtStatus::INVALID_PARAMETER)?;
    if neg.dialect == nimbus_wire::negotiate::Dialect::Smb202 {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    let open = ctx.open(req.file_id)?;
    // NETWORK_RESILIENCY_REQUEST (MS-SMB2 2.2.31.3): Timeout, Reserved.
    let timeout_ms = match req.input.get(..8) {
        Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        None => return Err(NtStatus::INVALID_PARAMETER),
    };
    let limits = &ctx.server.config().limits;
    let timeout = match timeout_ms {
        0 => limits.durable_handle_timeout,
        ms => std::time::Duration::from_millis(ms as u64),
    };
    if timeout > limits.max_durable_handle_timeout {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    // A guest's or anonymous session's handle is never kept for a
    // reconnect: nothing would prove the reconnecting client is the same.
    let owner = super::create_durable::owner(ctx).ok_or(NtStatus::ACCESS_DENIED)?;
    ctx.server.durables.granted(
        &open,
        crate::durable::Durable {
            timeout,
            persistent: false,
            in_store: false,
            owner,
            answered: true,
            forgotten: false,
        },
    );
    Ok(())
}

fn validate_negotiate(
    ctx: &mut Ctx<'_>,
    input: &[u8],
    output: &mut Vec<u8>,
) -> Result<(), NtStatus> {
    let neg = ctx.conn.negotiated().ok_or(NtStatus::INVALID_PARAMETER)?;
    // 3.1.1 protects the negotiate with the preauth hash instead; a client
    // that asks anyway is not one the spec knows: end the connection.
    if neg.dialect == nimbus_wire::negotiate::Dialect::Smb311 {
        tracing::warn!(
            "{}: VALIDATE_NEGOTIATE_INFO on an SMB 3.1.1 connection; closing connection",
            ctx.conn.peer
        );
        ctx.disconnect = true;
        return Err(NtStatus::ACCESS_DENIED);
    }
    let Ok(v) = ValidateNegotiateInfo::parse(input) else {
        ctx.disconnect = true;
        return Err(NtStatus::INVALID_PARAMETER);
    };
    let mut ours = neg.client_dialects.clone();
    let mut theirs = v.dialects.clone();
    ours.sort_unstable();
    theirs.sort_unstable();
    let ok = v.guid == neg.client_guid
        && v.security_mode == neg.client_security_mode
        && v.capabilities == neg.client_capabilities
        && ours == theirs;
    if !ok {
        tracing::warn!(
            "{}: VALIDATE_NEGOTIATE_INFO mismatch; closing connection",
            ctx.conn.peer
        );
        ctx.disconnect = true;
        return Err(NtStatus::ACCESS_DENIED);
    }
    encode_validate_negotiate_response(
        output,
        neg.server_capabilities,
        &ctx.server.guid,
        neg.server_security_mode,
        neg.dialect as u16,
    );
    Ok(())
}

/// MS-FSCC 2.1.3.1 FILE_OBJECTID_BUFFER (type 1): a stable 16-byte object
/// id derived from the file's device and inode, and zeroed extended info.
fn object_id(out: &mut Vec<u8>, dev: u64, ino: u64) {
    out.extend_from_slice(&ino.to_le_bytes());
    out.extend_from_slice(&dev.to_le_bytes());
    out.resize(out.len() + 48, 0);
}
