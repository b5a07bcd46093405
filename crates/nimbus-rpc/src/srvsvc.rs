//! MS-SRVS, the server service: the share list Explorer, Finder and
//! `smbclient -L` show, one share's details, and the server's own.

use crate::ndr::{Reader, Writer};
use crate::pdu::SyntaxId;
use crate::{
    werror, Host, RpcError, ShareEntry, ShareKind, PLATFORM_ID_NT, VERSION_MAJOR, VERSION_MINOR,
};

/// MS-SRVS 1.9: 4b324fc8-1670-01d3-1278-5a47bf6ee188 version 3.0.
pub const INTERFACE: SyntaxId = SyntaxId {
    uuid: [
        0xc8, 0x4f, 0x32, 0x4b, 0x70, 0x16, 0xd3, 0x01, 0x12, 0x78, 0x5a, 0x47, 0xbf, 0x6e, 0xe1,
        0x88,
    ],
    major: 3,
    minor: 0,
};

/// MS-SRVS 3.1.4: the operations served.
pub mod opnum {
    pub const NETR_SHARE_ENUM: u16 = 15;
    pub const NETR_SHARE_ENUM_STICKY: u16 = 36;
    pub const NETR_SHARE_GET_INFO: u16 = 16;
    pub const NETR_SERVER_GET_INFO: u16 = 21;
}

/// MS-SRVS 2.2.2.4 share types.
const STYPE_DISKTREE: u32 = 0;
const STYPE_IPC: u32 = 3;
const STYPE_SPECIAL: u32 = 0x8000_0000;
/// MS-SRVS 2.2.4.29 SHARE_INFO_1005 flags.
const SHI1005_FLAGS_ENCRYPT_DATA: u32 = 0x8000;
/// MS-SRVS 2.2.2.7 server types: a workstation and server of the NT
/// family.
const SV_TYPE_WORKSTATION: u32 = 0x1;
const SV_TYPE_SERVER: u32 = 0x2;
const SV_TYPE_NT: u32 = 0x1000;
const SV_TYPE_SERVER_NT: u32 = 0x8000;
/// No limit on a share's connections (SHARE_INFO_2 shi2_max_uses).
const UNLIMITED_USES: u32 = u32::MAX;

/// Share information levels served by NetrShareEnum (2.2.4.38) and
/// NetrShareGetInfo (2.2.3.6), 1005 by the latter only.
fn share_level_known(level: u32, get_info: bool) -> bool {
    matches!(level, 0 | 1 | 2 | 501 | 502) || (get_info && level == 1005)
}

/// Runs one srvsvc call; None for an operation not served.
pub fn call(opnum: u16, stub: &[u8], host: &Host) -> Result<Option<Vec<u8>>, RpcError> {
    Ok(Some(match opnum {
        opnum::NETR_SHARE_ENUM => share_enum(stub, host, false)?,
        opnum::NETR_SHARE_ENUM_STICKY => share_enum(stub, host, true)?,
        opnum::NETR_SHARE_GET_INFO => share_get_info(stub, host)?,
        opnum::NETR_SERVER_GET_INFO => server_get_info(stub, host)?,
        _ => return Ok(None),
    }))
}

fn share_type(s: &ShareEntry) -> u32 {
    match s.kind {
        ShareKind::Disk => STYPE_DISKTREE,
        ShareKind::Ipc => STYPE_IPC | STYPE_SPECIAL,
    }
}

/// The fixed part of one SHARE_INFO_<level> (MS-SRVS 2.2.4.22-2.2.4.29):
/// integers in place, strings as referent ids.
fn share_fixed(w: &mut Writer, level: u32, s: &ShareEntry) {
    w.pointer(); // netname
    if level == 0 {
        return;
    }
    if level == 1005 {
        // SHARE_INFO_1005 is the flags alone: no name.
        return;
    }
    w.u32(share_type(s));
    w.pointer(); // remark
    match level {
        2 | 502 => {
            w.u32(0); // permissions: share-level security is not used
            w.u32(UNLIMITED_USES);
            w.u32(s.current_uses);
            w.pointer(); // path
            w.null_pointer(); // password: share-level security is not used
            if level == 502 {
                w.u32(0); // reserved: the length of no security descriptor
                w.null_pointer();
            }
        }
        501 => w.u32(share_flags(s)),
        _ => {}
    }
}

/// The deferred strings of one SHARE_INFO_<level>, in field order.
fn share_deferred(w: &mut Writer, level: u32, s: &ShareEntry) {
    if level == 1005 {
        return;
    }
    w.wstring(&s.name);
    if level == 0 {
        return;
    }
    w.wstring(&s.comment);
    if matches!(level, 2 | 502) {
        // The local path is not disclosed: Windows shows it to
        // administrators only, and Nimbus has no administrator role.
        w.wstring("");
    }
}

fn share_flags(s: &ShareEntry) -> u32 {
    // Client-side caching stays manual (flags 0), as the tree connect says.
    if s.encrypt_data {
        SHI1005_FLAGS_ENCRYPT_DATA
    } else {
        0
    }
}

/// Roughly what one entry takes on the wire, to honour the client's
/// PreferedMaximumLength (MS-SRVS 3.1.4.8).
fn entry_size(level: u32, s: &ShareEntry) -> usize {
    let strings = 16 + 2 * (s.name.len() + 1) + 16 + 2 * (s.comment.len() + 1);
    let fixed = match level {
        0 => 4,
        1 => 12,
        501 => 16,
        _ => 40,
    };
    fixed + strings
}

/// MS-SRVS 3.1.4.8 NetrShareEnum (Samba: NetShareEnumAll), opnum 15, and
/// 3.1.4.9 NetrShareEnumSticky (Samba: NetShareEnum), opnum 36, which
/// lists the shares configured to last (every disk share here), not IPC$.
fn share_enum(stub: &[u8], host: &Host, sticky: bool) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    // SHARE_ENUM_STRUCT: Level, then the union's discriminant and arm.
    let level = r.u32()?;
    let switch = r.u32()?;
    if switch != level {
        return Err(RpcError::BadStub);
    }
    if share_level_known(level, false) && r.pointer()? {
        // The container a client sends is empty: EntriesRead, Buffer.
        let _entries_read = r.u32()?;
        if r.pointer()? && r.u32()? != 0 {
            return Err(RpcError::BadStub);
        }
    }
    let preferred_max = r.u32()?;
    let resume = if r.pointer()? { Some(r.u32()?) } else { None };

    let mut w = Writer::new();
    w.u32(level);
    w.u32(level);
    if !share_level_known(level, false) {
        // The union's default arm is empty.
        w.u32(0); // TotalEntries
        write_resume(&mut w, resume);
        w.u32(werror::INVALID_LEVEL);
        return Ok(w.into_bytes());
    }
    if !host.may_enumerate {
        w.null_pointer();
        w.u32(0);
        write_resume(&mut w, resume);
        w.u32(werror::ACCESS_DENIED);
        return Ok(w.into_bytes());
    }
    let listed: Vec<&ShareEntry> = host
        .shares
        .iter()
        .filter(|s| !sticky || s.kind == ShareKind::Disk)
        .collect();
    let start = resume.unwrap_or(0) as usize;
    let rest = listed.get(start..).unwrap_or(&[]);
    // Without a resume handle the client could not ask for the rest: it
    // gets everything. With one, as many entries as its preferred length
    // holds, at least one.
    let taken = match resume {
        None => rest.len(),
        Some(_) => page_len(level, rest, preferred_max),
    };
    let page = &rest[..taken];
    w.pointer(); // the container
    w.u32(page.len() as u32);
    if page.is_empty() {
        w.null_pointer();
    } else {
        w.pointer();
        w.u32(page.len() as u32); // the array's conformance
        for s in page {
            share_fixed(&mut w, level, s);
        }
        for s in page {
            share_deferred(&mut w, level, s);
        }
    }
    w.u32(listed.len() as u32); // TotalEntries
    let next = start + taken;
    let more = next < listed.len();
    write_resume(&mut w, resume.map(|_| if more { next as u32 } else { 0 }));
    w.u32(if more { werror::MORE_DATA } else { werror::OK });
    Ok(w.into_bytes())
}

/// How many of `shares` fit in `preferred_max` bytes (u32::MAX: all), at
/// least one.
fn page_len(level: u32, shares: &[&ShareEntry], preferred_max: u32) -> usize {
    if preferred_max == u32::MAX {
        return shares.len();
    }
    let mut size = 0usize;
    let mut n = 0;
    for s in shares {
        size += entry_size(level, s);
        if n > 0 && size > preferred_max as usize {
            break;
        }
        n += 1;
    }
    n
}

fn write_resume(w: &mut Writer, resume: Option<u32>) {
    match resume {
        Some(v) => {
            w.pointer();
            w.u32(v);
        }
        None => w.null_pointer(),
    }
}

/// MS-SRVS 3.1.4.10 NetrShareGetInfo, opnum 16.
fn share_get_info(stub: &[u8], host: &Host) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let net_name = r.wstring()?; // [in, string] (a reference pointer: no id)
    let level = r.u32()?;
    let mut w = Writer::new();
    w.u32(level);
    if !share_level_known(level, true) {
        w.u32(werror::INVALID_LEVEL);
        return Ok(w.into_bytes());
    }
    let found = host
        .shares
        .iter()
        .find(|s| s.name.eq_ignore_ascii_case(&net_name));
    let status = match found {
        _ if !host.may_enumerate => werror::ACCESS_DENIED,
        None => werror::NET_NAME_NOT_FOUND,
        Some(s) => {
            w.pointer();
            if level == 1005 {
                w.u32(share_flags(s));
            } else {
                share_fixed(&mut w, level, s);
                share_deferred(&mut w, level, s);
            }
            w.u32(werror::OK);
            return Ok(w.into_bytes());
        }
    };
    w.null_pointer();
    w.u32(status);
    Ok(w.into_bytes())
}

/// MS-SRVS 3.1.4.17 NetrServerGetInfo, opnum 21: levels 100 and 101;
/// 102 and above are for administrators (ACCESS_DENIED, as Windows
/// answers other callers).
fn server_get_info(stub: &[u8], host: &Host) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let level = r.u32()?;
    let mut w = Writer::new();
    w.u32(level);
    let status = match level {
        100 | 101 => {
            w.pointer();
            w.u32(PLATFORM_ID_NT);
            w.pointer(); // name
            if level == 101 {
                w.u32(VERSION_MAJOR);
                w.u32(VERSION_MINOR);
                w.u32(SV_TYPE_WORKSTATION | SV_TYPE_SERVER | SV_TYPE_NT | SV_TYPE_SERVER_NT);
                w.pointer(); // comment
            }
            w.wstring(&host.name);
            if level == 101 {
                w.wstring(&host.comment);
            }
            werror::OK
        }
        102 | 502 | 503 => {
            w.null_pointer();
            werror::ACCESS_DENIED
        }
        _ => werror::INVALID_LEVEL,
    };
    w.u32(status);
    Ok(w.into_bytes())
}
