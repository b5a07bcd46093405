//! MS-SRVS, the server service: the share list Explorer, Finder and
//! `smbclient -L` show, one share's details, and the server's own; and
//! for administrators' tools (Computer Management's Shared Folders,
//! `net session`, `net file`) the sessions, tree connects and open files,
//! with the server's clock for `net time`.

use crate::ndr::{Reader, Writer};
use crate::pdu::SyntaxId;
use crate::{
    werror, ConnectionEntry, FileEntry, Host, HostSource, RpcError, SessionEntry, ShareEntry,
    ShareKind, PLATFORM_ID_NT, VERSION_MAJOR, VERSION_MINOR,
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
    pub const NETR_CONNECTION_ENUM: u16 = 8;
    pub const NETR_FILE_ENUM: u16 = 9;
    pub const NETR_SESSION_ENUM: u16 = 12;
    pub const NETR_SHARE_ENUM: u16 = 15;
    pub const NETR_SHARE_ENUM_STICKY: u16 = 36;
    pub const NETR_SHARE_GET_INFO: u16 = 16;
    pub const NETR_SHARE_CHECK: u16 = 20;
    pub const NETR_SERVER_GET_INFO: u16 = 21;
    pub const NETR_REMOTE_TOD: u16 = 28;
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
/// MS-SRVS 2.2.2.2 MAX_PREFERRED_LENGTH: the client takes every entry.
const MAX_PREFERRED_LENGTH: u32 = u32::MAX;
/// The longest enumeration answer, whatever the client prefers: it stays
/// well within what a pipe queues (`pipe::MAX_QUEUED`); a longer list is
/// answered ERROR_MORE_DATA, to be resumed where the client gave a
/// resume handle.
const MAX_ANSWER: usize = 256 * 1024;

/// Share information levels served by NetrShareEnum (2.2.4.38) and
/// NetrShareGetInfo (2.2.3.6), 1005 by the latter only.
const SHARE_ENUM_LEVELS: [u32; 5] = [0, 1, 2, 501, 502];

fn share_info_level_known(level: u32) -> bool {
    SHARE_ENUM_LEVELS.contains(&level) || level == 1005
}

/// Runs one srvsvc call; None for an operation not served.
pub fn call<H: HostSource + ?Sized>(
    opnum: u16,
    stub: &[u8],
    src: &H,
) -> Result<Option<Vec<u8>>, RpcError> {
    Ok(Some(match opnum {
        opnum::NETR_SHARE_ENUM => share_enum(stub, &src.host(), false)?,
        opnum::NETR_SHARE_ENUM_STICKY => share_enum(stub, &src.host(), true)?,
        opnum::NETR_SHARE_GET_INFO => share_get_info(stub, &src.host())?,
        opnum::NETR_SERVER_GET_INFO => server_get_info(stub, &src.host())?,
        opnum::NETR_SHARE_CHECK => share_check(stub, src)?,
        opnum::NETR_SESSION_ENUM => session_enum(stub, src)?,
        opnum::NETR_CONNECTION_ENUM => connection_enum(stub, src)?,
        opnum::NETR_FILE_ENUM => file_enum(stub, src)?,
        opnum::NETR_REMOTE_TOD => remote_tod(stub, src)?,
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
        // administrators only, and the share list is built alike for all.
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

/// One entry of an enumeration answer: its fixed part (integers in
/// place, strings as referent ids), then the strings NDR defers, in field
/// order; and roughly what it takes on the wire, to honour the client's
/// PreferedMaximumLength.
trait Listed {
    fn fixed(&self, w: &mut Writer, level: u32);
    fn deferred(&self, w: &mut Writer, level: u32);
    fn size(&self, level: u32) -> usize;
}

/// Bytes a deferred string takes: its three counts and its units.
fn string_size(s: &str) -> usize {
    12 + 2 * (s.encode_utf16().count() + 1) + 2
}

impl Listed for &ShareEntry {
    fn fixed(&self, w: &mut Writer, level: u32) {
        share_fixed(w, level, self);
    }

    fn deferred(&self, w: &mut Writer, level: u32) {
        share_deferred(w, level, self);
    }

    fn size(&self, level: u32) -> usize {
        let fixed = match level {
            0 => 4,
            1 => 12,
            501 => 16,
            _ => 40,
        };
        fixed + string_size(&self.name) + string_size(&self.comment)
    }
}

/// The [in] <X>_ENUM_STRUCT of an enumeration (MS-SRVS 2.2.4.38 and its
/// kin for sessions, connections and files): Level, the union's
/// discriminant, and for a level the server knows the client's
/// container, which is empty (EntriesRead, a null Buffer). Returns the
/// level and whether it is known.
fn read_enum_struct(r: &mut Reader, known: &[u32]) -> Result<(u32, bool), RpcError> {
    let level = r.u32()?;
    let switch = r.u32()?;
    if switch != level {
        return Err(RpcError::BadStub);
    }
    let known = known.contains(&level);
    if known && r.pointer()? {
        let _entries_read = r.u32()?;
        if r.pointer()? && r.u32()? != 0 {
            return Err(RpcError::BadStub);
        }
    }
    Ok((level, known))
}

/// PreferedMaximumLength and the ResumeHandle that end an enumeration's
/// parameters.
fn read_enum_tail(r: &mut Reader) -> Result<(u32, Option<u32>), RpcError> {
    let preferred_max = r.u32()?;
    let resume = if r.pointer()? { Some(r.u32()?) } else { None };
    Ok((preferred_max, resume))
}

/// An enumeration's answer: the [out] <X>_ENUM_STRUCT, TotalEntries, the
/// ResumeHandle and the status. `entries` is the whole list, or the
/// status of a refused call; a level not known has an empty union arm.
///
/// A resume handle is the index of the next entry. Without one the client
/// could not ask for the rest: it gets everything up to MAX_ANSWER bytes.
/// With one, as many entries as its preferred length holds, at least one
/// (MS-SRVS 3.1.4.8 and the other enumerations alike).
fn enum_answer<E: Listed>(
    level: u32,
    known: bool,
    entries: Result<Vec<E>, u32>,
    preferred_max: u32,
    resume: Option<u32>,
) -> Vec<u8> {
    let mut w = Writer::new();
    w.u32(level);
    w.u32(level);
    let listed = match (known, entries) {
        (false, _) => Err(werror::INVALID_LEVEL),
        (true, Err(status)) => {
            w.null_pointer();
            Err(status)
        }
        (true, Ok(listed)) => Ok(listed),
    };
    let listed = match &listed {
        Ok(l) => &l[..],
        Err(status) => {
            w.u32(0); // TotalEntries
            write_resume(&mut w, resume);
            w.u32(*status);
            return w.into_bytes();
        }
    };
    let start = resume.unwrap_or(0) as usize;
    let rest = listed.get(start..).unwrap_or(&[]);
    let budget = match resume {
        None => MAX_ANSWER,
        Some(_) if preferred_max == MAX_PREFERRED_LENGTH => MAX_ANSWER,
        Some(_) => (preferred_max as usize).min(MAX_ANSWER),
    };
    let taken = page_len(level, rest, budget);
    let page = &rest[..taken];
    w.pointer(); // the container
    w.u32(page.len() as u32);
    if page.is_empty() {
        w.null_pointer();
    } else {
        w.pointer();
        w.u32(page.len() as u32); // the array's conformance
        for e in page {
            e.fixed(&mut w, level);
        }
        for e in page {
            e.deferred(&mut w, level);
        }
    }
    w.u32(listed.len() as u32); // TotalEntries
    let next = start + taken;
    let more = next < listed.len();
    write_resume(&mut w, resume.map(|_| if more { next as u32 } else { 0 }));
    w.u32(if more { werror::MORE_DATA } else { werror::OK });
    w.into_bytes()
}

/// MS-SRVS 3.1.4.8 NetrShareEnum (Samba: NetShareEnumAll), opnum 15, and
/// 3.1.4.9 NetrShareEnumSticky (Samba: NetShareEnum), opnum 36, which
/// lists the shares configured to last (every disk share here), not IPC$.
fn share_enum(stub: &[u8], host: &Host, sticky: bool) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let (level, known) = read_enum_struct(&mut r, &SHARE_ENUM_LEVELS)?;
    let (preferred_max, resume) = read_enum_tail(&mut r)?;
    let listed: Vec<&ShareEntry> = host
        .shares
        .iter()
        .filter(|s| !sticky || s.kind == ShareKind::Disk)
        .collect();
    let entries = if host.may_enumerate {
        Ok(listed)
    } else {
        Err(werror::ACCESS_DENIED)
    };
    Ok(enum_answer(level, known, entries, preferred_max, resume))
}

/// How many of `entries` fit in `budget` bytes, at least one.
fn page_len<E: Listed>(level: u32, entries: &[E], budget: usize) -> usize {
    let mut size = 0usize;
    let mut n = 0;
    for e in entries {
        size += e.size(level);
        if n > 0 && size > budget {
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
    if !share_info_level_known(level) {
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

/// MS-SRVS 3.1.4.20 NetrShareCheck, opnum 20: whether a device (a drive,
/// a printer port) is shared. Nimbus shares directories, never devices:
/// every device is NERR_DeviceNotShared, and Type, set only on success,
/// stays 0. Open to whoever may list the shares, as Windows asks no group
/// membership.
fn share_check<H: HostSource + ?Sized>(stub: &[u8], src: &H) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let _device = r.wstring()?; // [in, string] (a reference pointer: no id)
    let mut w = Writer::new();
    w.u32(0); // Type
    w.u32(if src.may_look_up() {
        werror::DEVICE_NOT_SHARED
    } else {
        werror::ACCESS_DENIED
    });
    Ok(w.into_bytes())
}

/// MS-SRVS 2.2.4.15-2.2.4.19 SESSION_INFO_0, 1, 2, 10 and 502.
const SESSION_LEVELS: [u32; 5] = [0, 1, 2, 10, 502];
/// MS-SRVS 2.2.4.16 sesi1_user_flags: a guest logon.
const SESS_GUEST: u32 = 0x1;
/// The transport a client on TCP port 445 reaches a Windows server by
/// (SESSION_INFO_502 sesi502_transport).
const TRANSPORT_DIRECT_TCP: &str = "\\Device\\NetbiosSmb";

/// A client as Windows names it in a session: `\\` and its name, here its
/// address.
fn unc_client(client: &str) -> String {
    format!("\\\\{client}")
}

impl Listed for SessionEntry {
    fn fixed(&self, w: &mut Writer, level: u32) {
        w.pointer(); // cname
        if level == 0 {
            return;
        }
        w.pointer(); // username
        if level != 10 {
            w.u32(self.opens);
        }
        w.u32(self.seconds);
        w.u32(self.idle_seconds);
        if level == 10 {
            return;
        }
        w.u32(if self.guest { SESS_GUEST } else { 0 });
        if matches!(level, 2 | 502) {
            w.pointer(); // cltype_name
        }
        if level == 502 {
            w.pointer(); // transport
        }
    }

    fn deferred(&self, w: &mut Writer, level: u32) {
        w.wstring(&unc_client(&self.client));
        if level == 0 {
            return;
        }
        w.wstring(&self.user);
        if matches!(level, 2 | 502) {
            // The client's operating system: SMB2 does not say.
            w.wstring("");
        }
        if level == 502 {
            w.wstring(TRANSPORT_DIRECT_TCP);
        }
    }

    fn size(&self, _level: u32) -> usize {
        36 + string_size(&self.client)
            + 4
            + string_size(&self.user)
            + 2 * 14
            + string_size(TRANSPORT_DIRECT_TCP)
    }
}

/// A ClientName or Qualifier naming a computer (`\\name`): the name.
fn computer_name(s: &str) -> Option<&str> {
    s.strip_prefix("\\\\")
}

/// Only administrators list sessions, connections and open files: Windows
/// asks membership of Administrators or Server Operators, and since
/// Windows 10 1607 / Server 2016 for NetSessionEnum at every level too.
fn admin_only<H: HostSource + ?Sized>(src: &H) -> Result<(), u32> {
    if src.is_admin() {
        Ok(())
    } else {
        Err(werror::ACCESS_DENIED)
    }
}

/// The parameters of NetrSessionEnum and NetrFileEnum: ServerName, two
/// optional filters (ClientName or BasePath, then UserName; an empty
/// string filters nothing), the <X>_ENUM_STRUCT, PreferedMaximumLength
/// and the ResumeHandle.
struct FilteredEnum {
    first: Option<String>,
    user: Option<String>,
    level: u32,
    known: bool,
    preferred_max: u32,
    resume: Option<u32>,
}

fn read_filtered_enum(stub: &[u8], levels: &[u32]) -> Result<FilteredEnum, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let first = r.wstring_pointer()?.filter(|s| !s.is_empty());
    let user = r.wstring_pointer()?.filter(|s| !s.is_empty());
    let (level, known) = read_enum_struct(&mut r, levels)?;
    let (preferred_max, resume) = read_enum_tail(&mut r)?;
    Ok(FilteredEnum {
        first,
        user,
        level,
        known,
        preferred_max,
        resume,
    })
}

impl FilteredEnum {
    fn user_matches(&self, user: &str) -> bool {
        self.user
            .as_deref()
            .is_none_or(|u| user.eq_ignore_ascii_case(u))
    }

    fn answer<E: Listed>(&self, listed: Result<Vec<E>, u32>) -> Vec<u8> {
        enum_answer(
            self.level,
            self.known,
            listed,
            self.preferred_max,
            self.resume,
        )
    }
}

/// MS-SRVS 3.1.4.5 NetrSessionEnum, opnum 12: the sessions, those of one
/// client (ClientName, `\\` and its name) or user (UserName) when named.
fn session_enum<H: HostSource + ?Sized>(stub: &[u8], src: &H) -> Result<Vec<u8>, RpcError> {
    let q = read_filtered_enum(stub, &SESSION_LEVELS)?;
    let listed = admin_only(src).and_then(|()| {
        if !q.known {
            return Ok(Vec::new());
        }
        let client = match q.first.as_deref().map(computer_name) {
            Some(None) => return Err(werror::INVALID_PARAMETER),
            Some(Some(c)) => Some(c),
            None => None,
        };
        let listed: Vec<SessionEntry> = src
            .sessions()
            .into_iter()
            .filter(|s| client.is_none_or(|c| s.client.eq_ignore_ascii_case(c)))
            .filter(|s| q.user_matches(&s.user))
            .collect();
        match (listed.is_empty(), client, &q.user) {
            (true, Some(_), _) => Err(werror::CLIENT_NAME_NOT_FOUND),
            (true, None, Some(_)) => Err(werror::USER_NOT_FOUND),
            _ => Ok(listed),
        }
    });
    Ok(q.answer(listed))
}

/// MS-SRVS 2.2.4.1-2.2.4.2 CONNECTION_INFO_0 and 1.
const CONNECTION_LEVELS: [u32; 2] = [0, 1];

/// A tree connect as listed for a Qualifier: coni1_netname is the share
/// when the Qualifier names a computer, the computer when it names a
/// share.
struct ConnectionShown<'a> {
    entry: &'a ConnectionEntry,
    by_computer: bool,
}

impl ConnectionShown<'_> {
    fn netname(&self) -> &str {
        if self.by_computer {
            &self.entry.share
        } else {
            &self.entry.client
        }
    }
}

impl Listed for ConnectionShown<'_> {
    fn fixed(&self, w: &mut Writer, level: u32) {
        w.u32(self.entry.id);
        if level == 0 {
            return;
        }
        w.u32(match self.entry.kind {
            ShareKind::Disk => STYPE_DISKTREE,
            ShareKind::Ipc => STYPE_IPC,
        });
        w.u32(self.entry.opens);
        w.u32(1); // num_users: a tree connect belongs to one session
        w.u32(self.entry.seconds);
        w.pointer(); // username
        w.pointer(); // netname
    }

    fn deferred(&self, w: &mut Writer, level: u32) {
        if level == 1 {
            w.wstring(&self.entry.user);
            w.wstring(self.netname());
        }
    }

    fn size(&self, _level: u32) -> usize {
        28 + string_size(&self.entry.user) + string_size(self.netname())
    }
}

/// MS-SRVS 3.1.4.1 NetrConnectionEnum, opnum 8: the tree connects to a
/// share, or from a computer (a Qualifier of `\\` and its name).
fn connection_enum<H: HostSource + ?Sized>(stub: &[u8], src: &H) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let qualifier = r.wstring_pointer()?.unwrap_or_default();
    let (level, known) = read_enum_struct(&mut r, &CONNECTION_LEVELS)?;
    let (preferred_max, resume) = read_enum_tail(&mut r)?;
    let by_computer = computer_name(&qualifier);
    let all = match admin_only(src) {
        Ok(()) if known => src.connections(),
        _ => Vec::new(),
    };
    let listed = admin_only(src).and_then(|()| {
        if qualifier.is_empty() {
            return Err(werror::INVALID_PARAMETER);
        }
        let shown: Vec<ConnectionShown> = all
            .iter()
            .filter(|c| match by_computer {
                Some(name) => c.client.eq_ignore_ascii_case(name),
                None => c.share.eq_ignore_ascii_case(&qualifier),
            })
            .map(|entry| ConnectionShown {
                entry,
                by_computer: by_computer.is_some(),
            })
            .collect();
        if shown.is_empty() {
            match by_computer {
                Some(_) => return Err(werror::CLIENT_NAME_NOT_FOUND),
                None if !src
                    .host()
                    .shares
                    .iter()
                    .any(|s| s.name.eq_ignore_ascii_case(&qualifier)) =>
                {
                    return Err(werror::NET_NAME_NOT_FOUND)
                }
                None => {}
            }
        }
        Ok(shown)
    });
    Ok(enum_answer(level, known, listed, preferred_max, resume))
}

/// MS-SRVS 2.2.4.7-2.2.4.8 FILE_INFO_2 and 3.
const FILE_LEVELS: [u32; 2] = [2, 3];
/// MS-SRVS 2.2.2.8 fi3_permissions.
const PERM_FILE_READ: u32 = 0x1;
const PERM_FILE_WRITE: u32 = 0x2;
/// MS-SMB2 2.2.13.1.1 access rights that read or write a file's data
/// (FILE_READ_DATA, FILE_EXECUTE; FILE_WRITE_DATA, FILE_APPEND_DATA).
const READS_DATA: u32 = 0x1 | 0x20;
const WRITES_DATA: u32 = 0x2 | 0x4;

fn file_permissions(access: u32) -> u32 {
    let mut p = 0;
    if access & READS_DATA != 0 {
        p |= PERM_FILE_READ;
    }
    if access & WRITES_DATA != 0 {
        p |= PERM_FILE_WRITE;
    }
    p
}

impl Listed for FileEntry {
    fn fixed(&self, w: &mut Writer, level: u32) {
        w.u32(self.id);
        if level == 3 {
            w.u32(file_permissions(self.access));
            w.u32(self.locks);
            w.pointer(); // pathname
            w.pointer(); // username
        }
    }

    fn deferred(&self, w: &mut Writer, level: u32) {
        if level == 3 {
            w.wstring(&self.path);
            w.wstring(&self.user);
        }
    }

    fn size(&self, _level: u32) -> usize {
        20 + string_size(&self.path) + string_size(&self.user)
    }
}

/// MS-SRVS 3.1.4.16 NetrFileEnum, opnum 9: the open files, those whose
/// path begins with BasePath, or of UserName, when given.
fn file_enum<H: HostSource + ?Sized>(stub: &[u8], src: &H) -> Result<Vec<u8>, RpcError> {
    let q = read_filtered_enum(stub, &FILE_LEVELS)?;
    let listed = admin_only(src).map(|()| {
        if !q.known {
            return Vec::new();
        }
        src.open_files()
            .into_iter()
            .filter(|f| {
                q.first
                    .as_deref()
                    .is_none_or(|b| starts_with_ignoring_case(&f.path, b))
            })
            .filter(|f| q.user_matches(&f.user))
            .collect::<Vec<FileEntry>>()
    });
    Ok(q.answer(listed))
}

fn starts_with_ignoring_case(s: &str, prefix: &str) -> bool {
    s.get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// MS-SRVS 2.2.4.105 tod_tinterval: the clock's tick, in 0.0001 s, as
/// Windows reports it.
const TOD_TINTERVAL: u32 = 310;

/// MS-SRVS 3.1.4.21 NetrRemoteTOD, opnum 28: the server's clock, as a
/// TIME_OF_DAY_INFO (2.2.4.105) of UTC fields and the local zone's offset.
/// Open to whoever may list the shares.
fn remote_tod<H: HostSource + ?Sized>(stub: &[u8], src: &H) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let mut w = Writer::new();
    if !src.may_look_up() {
        w.null_pointer();
        w.u32(werror::ACCESS_DENIED);
        return Ok(w.into_bytes());
    }
    w.pointer();
    write_time_of_day(&mut w, &src.clock());
    w.u32(werror::OK);
    Ok(w.into_bytes())
}

/// TIME_OF_DAY_INFO's twelve fields, in place.
fn write_time_of_day(w: &mut Writer, clock: &crate::Clock) {
    let since_epoch = clock
        .now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since_epoch.as_secs();
    let days = secs / 86_400;
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    w.u32(u32::try_from(secs).unwrap_or(u32::MAX)); // tod_elapsedt
    w.u32(clock.msecs);
    w.u32((of_day / 3600) as u32);
    w.u32((of_day / 60 % 60) as u32);
    w.u32((of_day % 60) as u32);
    w.u32(since_epoch.subsec_millis() / 10); // hundredths
    w.u32(clock.timezone_minutes as u32); // a signed long on the wire
    w.u32(TOD_TINTERVAL);
    w.u32(day);
    w.u32(month);
    w.u32(year);
    w.u32(((days + 4) % 7) as u32); // 1970-01-01 was a Thursday; Sunday is 0
}

/// The proleptic Gregorian (year, month, day) of a count of days since
/// 1970-01-01 (the civil-from-days method: 400-year eras of 146097 days,
/// years counted from March so that the leap day ends a year).
fn civil_from_days(days: u64) -> (u32, u32, u32) {
    let z = days + 719_468; // days since 0000-03-01
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year as u32, month as u32, day as u32)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{Clock, ConnectionEntry, FileEntry, SessionEntry};
    use std::time::{Duration, UNIX_EPOCH};

    /// A server with two sessions (alice's from 10.0.0.5 with two files
    /// open, bob's, a guest, from 10.0.0.6), their tree connects and
    /// alice's files; `admin` says whether the caller is an administrator.
    struct Server {
        admin: bool,
        may_enumerate: bool,
    }

    impl HostSource for Server {
        fn host(&self) -> Host {
            Host {
                name: "NIMBUS".into(),
                workgroup: "WORKGROUP".into(),
                comment: "Nimbus".into(),
                shares: vec![
                    ShareEntry {
                        name: "data".into(),
                        kind: ShareKind::Disk,
                        comment: String::new(),
                        current_uses: 2,
                        encrypt_data: false,
                    },
                    ShareEntry {
                        name: "empty".into(),
                        kind: ShareKind::Disk,
                        comment: String::new(),
                        current_uses: 0,
                        encrypt_data: false,
                    },
                ],
                may_enumerate: self.may_enumerate,
            }
        }

        fn may_look_up(&self) -> bool {
            self.may_enumerate
        }

        fn is_admin(&self) -> bool {
            self.admin
        }

        fn sessions(&self) -> Vec<SessionEntry> {
            vec![
                SessionEntry {
                    client: "10.0.0.5".into(),
                    user: "alice".into(),
                    guest: false,
                    opens: 2,
                    seconds: 300,
                    idle_seconds: 7,
                },
                SessionEntry {
                    client: "10.0.0.6".into(),
                    user: "bob".into(),
                    guest: true,
                    opens: 0,
                    seconds: 60,
                    idle_seconds: 60,
                },
            ]
        }

        fn connections(&self) -> Vec<ConnectionEntry> {
            let tree = |id, share: &str, kind, client: &str, user: &str, opens| ConnectionEntry {
                id,
                share: share.into(),
                kind,
                client: client.into(),
                user: user.into(),
                opens,
                seconds: 42,
            };
            vec![
                tree(1, "IPC$", ShareKind::Ipc, "10.0.0.5", "alice", 0),
                tree(2, "data", ShareKind::Disk, "10.0.0.5", "alice", 2),
                tree(1, "data", ShareKind::Disk, "10.0.0.6", "bob", 0),
            ]
        }

        fn open_files(&self) -> Vec<FileEntry> {
            vec![
                FileEntry {
                    id: 11,
                    access: 0x0012_0089, // read
                    locks: 0,
                    path: "/srv/data/report.txt".into(),
                    user: "alice".into(),
                },
                FileEntry {
                    id: 12,
                    access: 0x0012_019f, // read and write
                    locks: 3,
                    path: "/srv/data/sub/notes.txt".into(),
                    user: "alice".into(),
                },
            ]
        }

        fn clock(&self) -> Clock {
            Clock {
                // 2024-02-29 13:45:30.25 UTC, a Thursday.
                now: UNIX_EPOCH + Duration::from_millis(1_709_214_330_250),
                msecs: 123_456,
                timezone_minutes: -60,
            }
        }
    }

    const ADMIN: Server = Server {
        admin: true,
        may_enumerate: true,
    };
    const USER: Server = Server {
        admin: false,
        may_enumerate: true,
    };

    fn opt_string(w: &mut Writer, s: Option<&str>) {
        match s {
            Some(s) => w.wstring_pointer(s),
            None => w.null_pointer(),
        }
    }

    /// An <X>_ENUM_STRUCT with an empty container, PreferedMaximumLength
    /// and a resume handle.
    pub(crate) fn enum_tail(w: &mut Writer, level: u32, preferred: u32, resume: Option<u32>) {
        w.u32(level);
        w.u32(level);
        w.pointer();
        w.u32(0);
        w.null_pointer();
        w.u32(preferred);
        match resume {
            Some(v) => {
                w.pointer();
                w.u32(v);
            }
            None => w.null_pointer(),
        }
    }

    fn session_stub(
        client: Option<&str>,
        user: Option<&str>,
        level: u32,
        resume: Option<u32>,
        preferred: u32,
    ) -> Vec<u8> {
        let mut w = Writer::new();
        w.wstring_pointer("\\\\NIMBUS");
        opt_string(&mut w, client);
        opt_string(&mut w, user);
        enum_tail(&mut w, level, preferred, resume);
        w.into_bytes()
    }

    fn run(src: &Server, opnum: u16, stub: &[u8]) -> Vec<u8> {
        call(opnum, stub, src).unwrap().unwrap()
    }

    /// The answer's header up to the array: (level, count) or None for a
    /// null container.
    fn open_container(r: &mut Reader, level: u32) -> Option<u32> {
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (level, level));
        if !r.pointer().unwrap() {
            return None;
        }
        let count = r.u32().unwrap();
        if r.pointer().unwrap() {
            assert_eq!(r.u32().unwrap(), count);
        }
        Some(count)
    }

    /// TotalEntries, the resume handle and the status; nothing after.
    pub(crate) fn close_answer(r: &mut Reader) -> (u32, Option<u32>, u32) {
        let total = r.u32().unwrap();
        let resume = if r.pointer().unwrap() {
            Some(r.u32().unwrap())
        } else {
            None
        };
        let status = r.u32().unwrap();
        assert!(r.u32().is_err(), "bytes after the status");
        (total, resume, status)
    }

    /// The status of a refused enumeration, whose union arm is a null
    /// pointer for a `known` level, empty for another.
    fn refused(answer: &[u8], level: u32, known: bool) -> u32 {
        let mut r = Reader::new(answer);
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (level, level));
        if known {
            assert!(!r.pointer().unwrap());
        }
        let (total, _, status) = close_answer(&mut r);
        assert_eq!(total, 0);
        status
    }

    #[test]
    fn session_enum_encodes_every_level() {
        // Level 10: cname, username, time, idle time.
        let a = run(
            &ADMIN,
            opnum::NETR_SESSION_ENUM,
            &session_stub(None, None, 10, None, u32::MAX),
        );
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 10), Some(2));
        let mut times = Vec::new();
        for _ in 0..2 {
            assert!(r.pointer().unwrap() && r.pointer().unwrap());
            times.push((r.u32().unwrap(), r.u32().unwrap()));
        }
        assert_eq!(times, [(300, 7), (60, 60)]);
        let strings: Vec<String> = (0..4).map(|_| r.wstring().unwrap()).collect();
        assert_eq!(strings, ["\\\\10.0.0.5", "alice", "\\\\10.0.0.6", "bob"]);
        assert_eq!(close_answer(&mut r), (2, None, werror::OK));

        // Levels 0, 1, 2 and 502, one session (a client named).
        for level in [0, 1, 2, 502] {
            let stub = session_stub(Some("\\\\10.0.0.6"), None, level, Some(0), u32::MAX);
            let a = run(&ADMIN, opnum::NETR_SESSION_ENUM, &stub);
            let mut r = Reader::new(&a);
            assert_eq!(open_container(&mut r, level), Some(1));
            assert!(r.pointer().unwrap());
            if level != 0 {
                assert!(r.pointer().unwrap());
                // num_opens, time, idle_time, user_flags (a guest).
                let ints: Vec<u32> = (0..4).map(|_| r.u32().unwrap()).collect();
                assert_eq!(ints, [0, 60, 60, SESS_GUEST], "level {level}");
            }
            if level == 2 || level == 502 {
                assert!(r.pointer().unwrap());
            }
            if level == 502 {
                assert!(r.pointer().unwrap());
            }
            assert_eq!(r.wstring().unwrap(), "\\\\10.0.0.6");
            if level != 0 {
                assert_eq!(r.wstring().unwrap(), "bob");
            }
            if level == 2 || level == 502 {
                assert_eq!(r.wstring().unwrap(), "");
            }
            if level == 502 {
                assert_eq!(r.wstring().unwrap(), "\\Device\\NetbiosSmb");
            }
            assert_eq!(
                close_answer(&mut r),
                (1, Some(0), werror::OK),
                "level {level}"
            );
        }
    }

    #[test]
    fn session_enum_filters_refuses_and_pages() {
        let status = |src: &Server, client, user, level| {
            refused(
                &run(
                    src,
                    opnum::NETR_SESSION_ENUM,
                    &session_stub(client, user, level, None, u32::MAX),
                ),
                level,
                SESSION_LEVELS.contains(&level),
            )
        };
        assert_eq!(status(&USER, None, None, 10), werror::ACCESS_DENIED);
        assert_eq!(status(&USER, None, None, 0), werror::ACCESS_DENIED);
        assert_eq!(status(&ADMIN, None, None, 3), werror::INVALID_LEVEL);
        assert_eq!(
            status(&ADMIN, Some("10.0.0.5"), None, 0),
            werror::INVALID_PARAMETER
        );
        assert_eq!(
            status(&ADMIN, Some("\\\\10.9.9.9"), None, 0),
            werror::CLIENT_NAME_NOT_FOUND
        );
        assert_eq!(
            status(&ADMIN, None, Some("carol"), 0),
            werror::USER_NOT_FOUND
        );

        let a = run(
            &ADMIN,
            opnum::NETR_SESSION_ENUM,
            &session_stub(None, Some("ALICE"), 1, None, u32::MAX),
        );
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 1), Some(1));

        // One entry a page when the preferred length holds one; a resume
        // handle past the end lists nothing.
        for (resume, listed, after) in [
            (0, Some("\\\\10.0.0.5"), (2, Some(1), werror::MORE_DATA)),
            (1, Some("\\\\10.0.0.6"), (2, Some(0), werror::OK)),
            (u32::MAX, None, (2, Some(0), werror::OK)),
        ] {
            let stub = session_stub(None, None, 0, Some(resume), 10);
            let a = run(&ADMIN, opnum::NETR_SESSION_ENUM, &stub);
            let mut r = Reader::new(&a);
            assert_eq!(open_container(&mut r, 0), Some(listed.is_some() as u32));
            if let Some(client) = listed {
                assert!(r.pointer().unwrap());
                assert_eq!(r.wstring().unwrap(), client);
            }
            assert_eq!(close_answer(&mut r), after, "resume {resume}");
        }
    }

    fn connection_stub(qualifier: Option<&str>, level: u32) -> Vec<u8> {
        let mut w = Writer::new();
        w.wstring_pointer("\\\\NIMBUS");
        opt_string(&mut w, qualifier);
        enum_tail(&mut w, level, u32::MAX, Some(0));
        w.into_bytes()
    }

    /// Level-1 connections: (id, type, opens, users, time, user, netname).
    fn connections_1(answer: &[u8]) -> Vec<(u32, u32, u32, u32, u32, String, String)> {
        let mut r = Reader::new(answer);
        let count = open_container(&mut r, 1).unwrap();
        let mut fixed = Vec::new();
        for _ in 0..count {
            let ints: Vec<u32> = (0..5).map(|_| r.u32().unwrap()).collect();
            assert!(r.pointer().unwrap() && r.pointer().unwrap());
            fixed.push(ints);
        }
        let out = fixed
            .into_iter()
            .map(|i| {
                (
                    i[0],
                    i[1],
                    i[2],
                    i[3],
                    i[4],
                    r.wstring().unwrap(),
                    r.wstring().unwrap(),
                )
            })
            .collect();
        assert_eq!(close_answer(&mut r).2, werror::OK);
        out
    }

    #[test]
    fn connection_enum_by_share_and_by_computer() {
        let a = run(
            &ADMIN,
            opnum::NETR_CONNECTION_ENUM,
            &connection_stub(Some("DATA"), 1),
        );
        assert_eq!(
            connections_1(&a),
            [
                (
                    2,
                    STYPE_DISKTREE,
                    2,
                    1,
                    42,
                    "alice".into(),
                    "10.0.0.5".into()
                ),
                (1, STYPE_DISKTREE, 0, 1, 42, "bob".into(), "10.0.0.6".into()),
            ]
        );
        let a = run(
            &ADMIN,
            opnum::NETR_CONNECTION_ENUM,
            &connection_stub(Some("\\\\10.0.0.5"), 1),
        );
        assert_eq!(
            connections_1(&a),
            [
                (1, STYPE_IPC, 0, 1, 42, "alice".into(), "IPC$".into()),
                (2, STYPE_DISKTREE, 2, 1, 42, "alice".into(), "data".into()),
            ]
        );
        let a = run(
            &ADMIN,
            opnum::NETR_CONNECTION_ENUM,
            &connection_stub(Some("data"), 0),
        );
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 0), Some(2));
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (2, 1));
        assert_eq!(close_answer(&mut r), (2, Some(0), werror::OK));
        // A share without connections lists none.
        let a = run(
            &ADMIN,
            opnum::NETR_CONNECTION_ENUM,
            &connection_stub(Some("empty"), 0),
        );
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 0), Some(0));

        let status = |src: &Server, q, level| {
            refused(
                &run(src, opnum::NETR_CONNECTION_ENUM, &connection_stub(q, level)),
                level,
                CONNECTION_LEVELS.contains(&level),
            )
        };
        assert_eq!(status(&USER, Some("data"), 1), werror::ACCESS_DENIED);
        assert_eq!(status(&ADMIN, None, 1), werror::INVALID_PARAMETER);
        assert_eq!(status(&ADMIN, Some(""), 0), werror::INVALID_PARAMETER);
        assert_eq!(
            status(&ADMIN, Some("nosuch"), 0),
            werror::NET_NAME_NOT_FOUND
        );
        assert_eq!(
            status(&ADMIN, Some("\\\\10.9.9.9"), 0),
            werror::CLIENT_NAME_NOT_FOUND
        );
        assert_eq!(status(&ADMIN, Some("data"), 2), werror::INVALID_LEVEL);
    }

    fn file_stub(base: Option<&str>, user: Option<&str>, level: u32) -> Vec<u8> {
        let mut w = Writer::new();
        w.wstring_pointer("\\\\NIMBUS");
        opt_string(&mut w, base);
        opt_string(&mut w, user);
        enum_tail(&mut w, level, 0xffff, Some(0));
        w.into_bytes()
    }

    #[test]
    fn file_enum_encodes_levels_2_and_3() {
        let a = run(&ADMIN, opnum::NETR_FILE_ENUM, &file_stub(None, None, 3));
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 3), Some(2));
        let mut fixed = Vec::new();
        for _ in 0..2 {
            fixed.push((r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()));
            assert!(r.pointer().unwrap() && r.pointer().unwrap());
        }
        assert_eq!(
            fixed,
            [
                (11, PERM_FILE_READ, 0),
                (12, PERM_FILE_READ | PERM_FILE_WRITE, 3)
            ]
        );
        let strings: Vec<String> = (0..4).map(|_| r.wstring().unwrap()).collect();
        assert_eq!(
            strings,
            [
                "/srv/data/report.txt",
                "alice",
                "/srv/data/sub/notes.txt",
                "alice"
            ]
        );
        assert_eq!(close_answer(&mut r), (2, Some(0), werror::OK));

        let a = run(
            &ADMIN,
            opnum::NETR_FILE_ENUM,
            &file_stub(Some("/SRV/data/sub"), None, 2),
        );
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 2), Some(1));
        assert_eq!(r.u32().unwrap(), 12);
        assert_eq!(close_answer(&mut r), (1, Some(0), werror::OK));

        let a = run(
            &ADMIN,
            opnum::NETR_FILE_ENUM,
            &file_stub(None, Some("bob"), 3),
        );
        let mut r = Reader::new(&a);
        assert_eq!(open_container(&mut r, 3), Some(0));

        assert_eq!(
            refused(
                &run(&USER, opnum::NETR_FILE_ENUM, &file_stub(None, None, 3)),
                3,
                true
            ),
            werror::ACCESS_DENIED
        );
        assert_eq!(
            refused(
                &run(&ADMIN, opnum::NETR_FILE_ENUM, &file_stub(None, None, 1)),
                1,
                false
            ),
            werror::INVALID_LEVEL
        );
    }

    #[test]
    fn remote_tod_is_the_servers_clock_in_utc_fields() {
        let mut w = Writer::new();
        w.wstring_pointer("\\\\NIMBUS");
        let stub = w.into_bytes();
        let a = run(&USER, opnum::NETR_REMOTE_TOD, &stub);
        let mut r = Reader::new(&a);
        assert!(r.pointer().unwrap());
        let fields: Vec<u32> = (0..12).map(|_| r.u32().unwrap()).collect();
        assert_eq!(
            fields,
            [
                1_709_214_330,
                123_456,
                13,
                45,
                30,
                25,
                (-60i32) as u32,
                TOD_TINTERVAL,
                29,
                2,
                2024,
                4
            ]
        );
        assert_eq!(r.u32().unwrap(), werror::OK);
        assert!(r.u32().is_err());

        let nobody = Server {
            admin: false,
            may_enumerate: false,
        };
        let a = run(&nobody, opnum::NETR_REMOTE_TOD, &stub);
        let mut r = Reader::new(&a);
        assert!(!r.pointer().unwrap());
        assert_eq!(r.u32().unwrap(), werror::ACCESS_DENIED);
    }

    #[test]
    fn dates_are_gregorian() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(10_956), (1999, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
    }

    #[test]
    fn share_check_shares_no_device() {
        let mut w = Writer::new();
        w.null_pointer();
        w.wstring("C:");
        let stub = w.into_bytes();
        for (src, status) in [
            (&USER, werror::DEVICE_NOT_SHARED),
            (
                &Server {
                    admin: false,
                    may_enumerate: false,
                },
                werror::ACCESS_DENIED,
            ),
        ] {
            let a = run(src, opnum::NETR_SHARE_CHECK, &stub);
            assert_eq!(a, [0u32.to_le_bytes(), status.to_le_bytes()].concat());
        }
    }

    #[test]
    fn cut_stubs_are_refused_without_panic() {
        let stubs = [
            (
                opnum::NETR_SESSION_ENUM,
                session_stub(Some("\\\\10.0.0.5"), Some("alice"), 502, Some(0), 100),
            ),
            (
                opnum::NETR_CONNECTION_ENUM,
                connection_stub(Some("data"), 1),
            ),
            (
                opnum::NETR_FILE_ENUM,
                file_stub(Some("/srv"), Some("alice"), 3),
            ),
        ];
        for (op, stub) in stubs {
            assert!(call(op, &stub, &ADMIN).is_ok());
            for cut in 0..stub.len() {
                assert!(
                    call(op, &stub[..cut], &ADMIN).is_err(),
                    "opnum {op}, {cut} bytes"
                );
            }
        }
        // A container that claims entries the client cannot send.
        let mut w = Writer::new();
        w.null_pointer();
        w.null_pointer();
        w.null_pointer();
        w.u32(1);
        w.u32(1);
        w.pointer();
        w.u32(5);
        w.pointer();
        w.u32(5);
        w.u32(u32::MAX);
        w.null_pointer();
        assert_eq!(
            call(opnum::NETR_SESSION_ENUM, &w.into_bytes(), &ADMIN),
            Err(RpcError::BadStub)
        );
    }
}
