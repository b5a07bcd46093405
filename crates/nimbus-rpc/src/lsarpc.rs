//! The LSA calls (MS-LSAD, MS-LSAT) a client makes to show names for the
//! SIDs of a file's security descriptor, and SIDs for names typed into a
//! permissions dialog: LsarOpenPolicy and LsarOpenPolicy2, LsarClose,
//! LsarQueryInformationPolicy(2) for the domain the server belongs to,
//! LsarLookupSids/2/3 and LsarLookupNames/2.
//!
//! Accounts are a domain SID and a relative id, as Windows reports them:
//! the well-known ones are answered here, the others by the server
//! ([`HostSource::account_by_sid`], [`HostSource::account_by_name`]).

use nimbus_wire::dtyp::Sid;

use crate::ndr::{Reader, Writer};
use crate::pdu::SyntaxId;
use crate::{HostSource, RpcError};

/// MS-LSAT 1.9: 12345778-1234-abcd-ef00-0123456789ab version 0.0.
pub const INTERFACE: SyntaxId = SyntaxId {
    uuid: [
        0x78, 0x57, 0x34, 0x12, 0x34, 0x12, 0xcd, 0xab, 0xef, 0x00, 0x01, 0x23, 0x45, 0x67, 0x89,
        0xab,
    ],
    major: 0,
    minor: 0,
};

pub mod opnum {
    pub const CLOSE: u16 = 0;
    pub const OPEN_POLICY: u16 = 6;
    pub const QUERY_INFORMATION_POLICY: u16 = 7;
    pub const LOOKUP_NAMES: u16 = 14;
    pub const LOOKUP_SIDS: u16 = 15;
    pub const OPEN_POLICY2: u16 = 44;
    pub const QUERY_INFORMATION_POLICY2: u16 = 46;
    pub const LOOKUP_SIDS2: u16 = 57;
    pub const LOOKUP_NAMES2: u16 = 58;
    pub const LOOKUP_SIDS3: u16 = 76;
}

/// NTSTATUS values the calls return (MS-ERREF 2.3.1).
pub mod status {
    pub const SUCCESS: u32 = 0x0000_0000;
    pub const SOME_NOT_MAPPED: u32 = 0x0000_0107;
    pub const INVALID_HANDLE: u32 = 0xC000_0008;
    pub const INVALID_PARAMETER: u32 = 0xC000_000D;
    pub const ACCESS_DENIED: u32 = 0xC000_0022;
    pub const NONE_MAPPED: u32 = 0xC000_0073;
    pub const TOO_MANY_NAMES: u32 = 0xC000_0095;
    pub const INSUFFICIENT_RESOURCES: u32 = 0xC000_009A;
    pub const TOO_MANY_SIDS: u32 = 0xC000_017E;
}

/// MS-LSAT 2.2.13 SID_NAME_USE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SidNameUse {
    User = 1,
    Group = 2,
    Domain = 3,
    Alias = 4,
    WellKnownGroup = 5,
    Unknown = 8,
}

/// An account: its domain (name and SID) and its relative id in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub domain: String,
    pub domain_sid: Sid,
    pub name: String,
    pub rid: u32,
    pub kind: SidNameUse,
}

impl Account {
    pub fn sid(&self) -> Sid {
        let mut sid = self.domain_sid.clone();
        sid.sub_authorities.push(self.rid);
        sid
    }
}

/// MS-LSAT 3.1.4.5, 3.1.4.9: the most names and SIDs one call translates.
const MAX_NAMES: u32 = 1000;
const MAX_SIDS: u32 = 20480;
/// Policy handles one pipe may hold open.
const MAX_HANDLES: usize = 64;
/// MS-LSAD 2.2.4.1 POLICY_INFORMATION_CLASS PolicyPrimaryDomainInformation.
const POLICY_PRIMARY_DOMAIN_INFORMATION: u16 = 3;

/// The policy handles of one pipe (MS-LSAD 3.1.1.7): 20 bytes each, a
/// zero attribute word and a number unique within the pipe.
#[derive(Default)]
pub struct PolicyHandles {
    open: Vec<[u8; 20]>,
    issued: u64,
}

impl PolicyHandles {
    fn issue(&mut self) -> Option<[u8; 20]> {
        if self.open.len() >= MAX_HANDLES {
            return None;
        }
        self.issued += 1;
        let mut h = [0u8; 20];
        h[4..12].copy_from_slice(&self.issued.to_le_bytes());
        h[12..].copy_from_slice(b"nimbusLA");
        self.open.push(h);
        Some(h)
    }

    fn is_open(&self, h: &[u8]) -> bool {
        self.open.iter().any(|o| o[..] == *h)
    }

    fn close(&mut self, h: &[u8]) -> bool {
        let before = self.open.len();
        self.open.retain(|o| o[..] != *h);
        self.open.len() < before
    }
}

/// Runs one lsarpc call; None for an operation not served.
pub fn call<H: HostSource + ?Sized>(
    opnum: u16,
    stub: &[u8],
    host: &H,
    handles: &mut PolicyHandles,
) -> Result<Option<Vec<u8>>, RpcError> {
    let out = match opnum {
        opnum::OPEN_POLICY | opnum::OPEN_POLICY2 => open_policy(host, handles),
        opnum::CLOSE => close(stub, handles)?,
        opnum::QUERY_INFORMATION_POLICY | opnum::QUERY_INFORMATION_POLICY2 => {
            query_information(stub, host, handles)?
        }
        opnum::LOOKUP_SIDS => lookup_sids(stub, host, handles, Flavour::V1)?,
        opnum::LOOKUP_SIDS2 => lookup_sids(stub, host, handles, Flavour::V2)?,
        opnum::LOOKUP_SIDS3 => lookup_sids(stub, host, handles, Flavour::V3)?,
        opnum::LOOKUP_NAMES => lookup_names(stub, host, handles, Flavour::V1)?,
        opnum::LOOKUP_NAMES2 => lookup_names(stub, host, handles, Flavour::V2)?,
        _ => return Ok(None),
    };
    Ok(Some(out))
}

/// MS-LSAD 3.1.4.4.1/3.1.4.4.2 LsarOpenPolicy2 and LsarOpenPolicy: the
/// parameters (server name, object attributes, desired access) change
/// nothing here; whoever may browse the server may translate names.
fn open_policy<H: HostSource + ?Sized>(host: &H, handles: &mut PolicyHandles) -> Vec<u8> {
    let mut w = Writer::new();
    let handle = if host.may_look_up() {
        handles.issue().ok_or(status::INSUFFICIENT_RESOURCES)
    } else {
        Err(status::ACCESS_DENIED)
    };
    match handle {
        Ok(h) => {
            w.bytes(&h);
            w.u32(status::SUCCESS);
        }
        Err(s) => {
            w.bytes(&[0; 20]);
            w.u32(s);
        }
    }
    w.into_bytes()
}

/// MS-LSAD 3.1.4.9.4 LsarClose: the handle comes back zeroed.
fn close(stub: &[u8], handles: &mut PolicyHandles) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let h = r.bytes(20)?;
    let mut w = Writer::new();
    w.bytes(&[0; 20]);
    w.u32(if handles.close(h) {
        status::SUCCESS
    } else {
        status::INVALID_HANDLE
    });
    Ok(w.into_bytes())
}

/// MS-LSAD 3.1.4.4.4 LsarQueryInformationPolicy(2), class
/// PolicyPrimaryDomainInformation: a server in a workgroup names it, with
/// no SID. The others describe a domain member or controller, or need the
/// server's own SID, which a workgroup server does not announce.
fn query_information<H: HostSource + ?Sized>(
    stub: &[u8],
    host: &H,
    handles: &PolicyHandles,
) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let h = r.bytes(20)?;
    let class = r.u16()?;
    let mut w = Writer::new();
    if !handles.is_open(h) {
        w.null_pointer();
        w.u32(status::INVALID_HANDLE);
    } else if class != POLICY_PRIMARY_DOMAIN_INFORMATION {
        w.null_pointer();
        w.u32(status::INVALID_PARAMETER);
    } else {
        let workgroup = host.host().workgroup;
        w.pointer();
        w.u16(class); // the union's discriminant
        w.unicode_string_header(&workgroup);
        w.null_pointer(); // Sid
        w.unicode_string_units(&workgroup);
        w.u32(status::SUCCESS);
    }
    Ok(w.into_bytes())
}

/// Which generation of a lookup call: 2 adds Flags to each translation and
/// LookupOptions/ClientRevision to the request, 3 has no policy handle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavour {
    V1,
    V2,
    V3,
}

/// The domains a lookup's answers refer to (LSAPR_REFERENCED_DOMAIN_LIST),
/// each once, in the order first met.
#[derive(Default)]
struct Domains(Vec<(String, Sid)>);

impl Domains {
    fn index_of(&mut self, a: &Account) -> i32 {
        if let Some(i) = self.0.iter().position(|(_, sid)| *sid == a.domain_sid) {
            return i as i32;
        }
        self.0.push((a.domain.clone(), a.domain_sid.clone()));
        (self.0.len() - 1) as i32
    }

    /// [out] PLSAPR_REFERENCED_DOMAIN_LIST*: a pointer to Entries, the
    /// Domains pointer and MaxEntries, then the array and what each
    /// element points to.
    fn write(&self, w: &mut Writer) {
        w.pointer();
        w.u32(self.0.len() as u32);
        if self.0.is_empty() {
            w.null_pointer();
        } else {
            w.pointer();
        }
        w.u32(32); // MaxEntries, as Windows fills it
        if self.0.is_empty() {
            return;
        }
        w.u32(self.0.len() as u32);
        for (name, _) in &self.0 {
            w.unicode_string_header(name);
            w.pointer(); // Sid
        }
        for (name, sid) in &self.0 {
            w.unicode_string_units(name);
            w.sid(sid);
        }
    }
}

/// A lookup refused as a whole: no domains, no translations, nothing
/// mapped.
fn refused_lookup(status: u32) -> Vec<u8> {
    let mut w = Writer::new();
    w.null_pointer(); // ReferencedDomains
    w.u32(0); // the translations: Entries
    w.null_pointer(); // and the array
    w.u32(0); // MappedCount
    w.u32(status);
    w.into_bytes()
}

/// Each item's account, if it has one, with the index of its domain in
/// the list the answer refers to.
fn translate<T>(
    items: &[T],
    mut find: impl FnMut(&T) -> Option<Account>,
) -> (Domains, Vec<Option<(Account, i32)>>) {
    let mut domains = Domains::default();
    let found = items
        .iter()
        .map(|item| {
            let a = find(item)?;
            let i = domains.index_of(&a);
            Some((a, i))
        })
        .collect();
    (domains, found)
}

fn mapped_status(mapped: usize, asked: usize) -> u32 {
    if mapped == asked {
        status::SUCCESS
    } else if mapped == 0 {
        status::NONE_MAPPED
    } else {
        status::SOME_NOT_MAPPED
    }
}

/// The part of a lookup request after what is looked up: the
/// [in, out] translations (a client sends none), LookupLevel, MappedCount,
/// and for the later generations LookupOptions and ClientRevision.
fn skip_lookup_tail(r: &mut Reader<'_>, flavour: Flavour) -> Result<(), RpcError> {
    let _entries = r.u32()?;
    if r.pointer()? {
        return Err(RpcError::BadStub); // translations sent in: not a client's request
    }
    let _level = r.u16()?;
    let _mapped = r.u32()?;
    if flavour != Flavour::V1 {
        let _options = r.u32()?;
        let _revision = r.u32()?;
    }
    Ok(())
}

/// MS-LSAT 3.1.4.8-3.1.4.11 LsarLookupSids, LsarLookupSids2, LsarLookupSids3.
fn lookup_sids<H: HostSource + ?Sized>(
    stub: &[u8],
    host: &H,
    handles: &PolicyHandles,
    flavour: Flavour,
) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let handle_ok = if flavour == Flavour::V3 {
        host.may_look_up()
    } else {
        let h = r.bytes(20)?;
        handles.is_open(h)
    };
    // LSAPR_SID_ENUM_BUFFER: Entries, then a pointer to an array of
    // pointers to SIDs.
    let entries = r.u32()?;
    let mut sids = Vec::new();
    if r.pointer()? {
        let count = r.u32()?;
        // Each entry takes at least its 4-byte pointer: a count the stub
        // cannot hold is refused before anything is allocated for it.
        if count != entries || count as usize > r.remaining() / 4 {
            return Err(RpcError::BadStub);
        }
        let mut present = Vec::with_capacity(count as usize);
        for _ in 0..count {
            present.push(r.pointer()?);
        }
        for p in present {
            sids.push(if p { Some(r.sid()?) } else { None });
        }
    } else if entries != 0 {
        return Err(RpcError::BadStub);
    }
    skip_lookup_tail(&mut r, flavour)?;

    let refusal = if !handle_ok {
        Some(if flavour == Flavour::V3 {
            status::ACCESS_DENIED
        } else {
            status::INVALID_HANDLE
        })
    } else if entries > MAX_SIDS {
        Some(status::TOO_MANY_SIDS)
    } else {
        None
    };
    if let Some(s) = refusal {
        return Ok(refused_lookup(s));
    }
    let (domains, found) = translate(&sids, |sid| {
        sid.as_ref().and_then(|s| account_by_sid(host, s))
    });
    let mut w = Writer::new();
    let mapped = found.iter().filter(|f| f.is_some()).count();
    domains.write(&mut w);
    // LSAPR_TRANSLATED_NAMES(_EX): Entries, a pointer to the array; each
    // element Use, Name, DomainIndex (and Flags); then the names' units.
    w.u32(found.len() as u32);
    if found.is_empty() {
        w.null_pointer();
    } else {
        w.pointer();
        w.u32(found.len() as u32);
        for f in &found {
            let (kind, name, index) = match f {
                Some((a, i)) => (a.kind, a.name.as_str(), *i),
                None => (SidNameUse::Unknown, "", -1),
            };
            w.u16(kind as u16);
            w.unicode_string_header(name);
            w.u32(index as u32);
            if flavour != Flavour::V1 {
                w.u32(0); // Flags
            }
        }
        for f in &found {
            w.unicode_string_units(f.as_ref().map_or("", |(a, _)| a.name.as_str()));
        }
    }
    w.u32(mapped as u32);
    w.u32(mapped_status(mapped, found.len()));
    Ok(w.into_bytes())
}

/// MS-LSAT 3.1.4.5-3.1.4.7 LsarLookupNames and LsarLookupNames2: each
/// name as `DOMAIN\name` or `name` alone.
fn lookup_names<H: HostSource + ?Sized>(
    stub: &[u8],
    host: &H,
    handles: &PolicyHandles,
    flavour: Flavour,
) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let handle_ok = handles.is_open(r.bytes(20)?);
    let count = r.u32()?;
    // [size_is(Count)] PRPC_UNICODE_STRING Names: the array in place
    // (conformance, then each string's header), then the units.
    let conformance = r.u32()?;
    // Each header takes 8 bytes: a count the stub cannot hold is refused
    // before anything is allocated for it.
    if conformance != count || count as usize > r.remaining() / 8 {
        return Err(RpcError::BadStub);
    }
    let mut headers = Vec::with_capacity(count as usize);
    for _ in 0..count {
        headers.push(r.unicode_string_header()?);
    }
    let mut names = Vec::with_capacity(headers.len());
    for (len, _max, present) in headers {
        names.push(if present {
            r.unicode_string_units(len)?
        } else {
            String::new()
        });
    }
    skip_lookup_tail(&mut r, flavour)?;

    let refusal = if !handle_ok {
        Some(status::INVALID_HANDLE)
    } else if count > MAX_NAMES {
        Some(status::TOO_MANY_NAMES)
    } else {
        None
    };
    if let Some(s) = refusal {
        return Ok(refused_lookup(s));
    }
    let (domains, found) = translate(&names, |n| account_by_name(host, n));
    let mut w = Writer::new();
    let mapped = found.iter().filter(|f| f.is_some()).count();
    domains.write(&mut w);
    // LSAPR_TRANSLATED_SIDS(_EX): Entries, a pointer to the array; each
    // element Use, RelativeId, DomainIndex (and Flags).
    w.u32(found.len() as u32);
    if found.is_empty() {
        w.null_pointer();
    } else {
        w.pointer();
        w.u32(found.len() as u32);
        for f in &found {
            let (kind, rid, index) = match f {
                Some((a, i)) => (a.kind, a.rid, *i),
                None => (SidNameUse::Unknown, 0, -1),
            };
            w.u16(kind as u16);
            w.u32(rid);
            w.u32(index as u32);
            if flavour != Flavour::V1 {
                w.u32(0);
            }
        }
    }
    w.u32(mapped as u32);
    w.u32(mapped_status(mapped, found.len()));
    Ok(w.into_bytes())
}

fn sid(authority: u64, subs: &[u32]) -> Sid {
    Sid {
        authority,
        sub_authorities: subs.to_vec(),
    }
}

/// MS-DTYP 2.4.2.4: the well-known accounts a security descriptor of this
/// server may hold or a user may type, as (domain, domain SID, name, rid,
/// use).
fn well_known() -> Vec<Account> {
    let nt = "NT AUTHORITY";
    let builtin = "BUILTIN";
    let table: [(&str, Sid, &str, u32, SidNameUse); 11] = [
        ("", sid(1, &[]), "Everyone", 0, SidNameUse::WellKnownGroup),
        (
            "",
            sid(3, &[]),
            "CREATOR OWNER",
            0,
            SidNameUse::WellKnownGroup,
        ),
        (
            "",
            sid(3, &[]),
            "CREATOR GROUP",
            1,
            SidNameUse::WellKnownGroup,
        ),
        (nt, sid(5, &[]), "NETWORK", 2, SidNameUse::WellKnownGroup),
        (
            nt,
            sid(5, &[]),
            "ANONYMOUS LOGON",
            7,
            SidNameUse::WellKnownGroup,
        ),
        (
            nt,
            sid(5, &[]),
            "Authenticated Users",
            11,
            SidNameUse::WellKnownGroup,
        ),
        (nt, sid(5, &[]), "SYSTEM", 18, SidNameUse::WellKnownGroup),
        (
            builtin,
            sid(5, &[32]),
            "Administrators",
            544,
            SidNameUse::Alias,
        ),
        (builtin, sid(5, &[32]), "Users", 545, SidNameUse::Alias),
        (builtin, sid(5, &[32]), "Guests", 546, SidNameUse::Alias),
        (
            "",
            sid(3, &[]),
            "OWNER RIGHTS",
            4,
            SidNameUse::WellKnownGroup,
        ),
    ];
    table
        .into_iter()
        .map(|(domain, domain_sid, name, rid, kind)| Account {
            domain: domain.to_string(),
            domain_sid,
            name: name.to_string(),
            rid,
            kind,
        })
        .collect()
}

fn account_by_sid<H: HostSource + ?Sized>(host: &H, sid: &Sid) -> Option<Account> {
    well_known()
        .into_iter()
        .find(|a| a.sid() == *sid)
        .or_else(|| host.account_by_sid(sid))
}

fn account_by_name<H: HostSource + ?Sized>(host: &H, full: &str) -> Option<Account> {
    let (domain, name) = match full.split_once('\\') {
        Some((d, n)) => (Some(d), n),
        None => (None, full),
    };
    if name.is_empty() {
        return None;
    }
    let domain_matches = |a: &Account| domain.is_none_or(|d| d.eq_ignore_ascii_case(&a.domain));
    well_known()
        .into_iter()
        .find(|a| a.name.eq_ignore_ascii_case(name) && domain_matches(a))
        .or_else(|| host.account_by_name(domain, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Host, HostSource};

    /// A server with one Unix user (alice, 1000) and one Unix group
    /// (staff, 50).
    struct Unix {
        may: bool,
    }

    fn unix_account(domain: &str, authority_sub: u32, name: &str, id: u32) -> Account {
        Account {
            domain: domain.to_string(),
            domain_sid: sid(22, &[authority_sub]),
            name: name.to_string(),
            rid: id,
            kind: if authority_sub == 1 {
                SidNameUse::User
            } else {
                SidNameUse::Alias
            },
        }
    }

    impl HostSource for Unix {
        fn host(&self) -> Host {
            Host {
                name: "NIMBUS".into(),
                workgroup: "WORKGROUP".into(),
                comment: String::new(),
                shares: Vec::new(),
                may_enumerate: self.may,
            }
        }

        fn account_by_sid(&self, s: &Sid) -> Option<Account> {
            match (s.authority, s.sub_authorities.as_slice()) {
                (22, [1, 1000]) => Some(unix_account("Unix User", 1, "alice", 1000)),
                (22, [2, 50]) => Some(unix_account("Unix Group", 2, "staff", 50)),
                _ => None,
            }
        }

        fn account_by_name(&self, domain: Option<&str>, name: &str) -> Option<Account> {
            match (domain, name) {
                (None | Some("Unix User"), "alice") => {
                    Some(unix_account("Unix User", 1, "alice", 1000))
                }
                (None | Some("Unix Group"), "staff") => {
                    Some(unix_account("Unix Group", 2, "staff", 50))
                }
                _ => None,
            }
        }
    }

    fn open(handles: &mut PolicyHandles, host: &Unix) -> [u8; 20] {
        let out = call(opnum::OPEN_POLICY2, &[], host, handles)
            .unwrap()
            .unwrap();
        assert_eq!(out.len(), 24);
        assert_eq!(&out[20..], &status::SUCCESS.to_le_bytes());
        out[..20].try_into().unwrap()
    }

    fn lookup_sids_request(handle: Option<&[u8; 20]>, sids: &[Option<Sid>], v2: bool) -> Vec<u8> {
        let mut w = Writer::new();
        if let Some(h) = handle {
            w.bytes(h);
        }
        w.u32(sids.len() as u32);
        w.pointer();
        w.u32(sids.len() as u32);
        for s in sids {
            if s.is_some() {
                w.pointer();
            } else {
                w.null_pointer();
            }
        }
        for s in sids.iter().flatten() {
            w.sid(s);
        }
        w.u32(0); // TranslatedNames.Entries
        w.null_pointer();
        w.u16(1); // LookupLevel
        w.u32(0); // MappedCount
        if v2 {
            w.u32(0);
            w.u32(2);
        }
        w.into_bytes()
    }

    /// Decodes a lookup's ReferencedDomains: (name, SID) of each.
    fn read_domains(r: &mut Reader<'_>) -> Vec<(String, Sid)> {
        if !r.pointer().unwrap() {
            return Vec::new();
        }
        let entries = r.u32().unwrap();
        let present = r.pointer().unwrap();
        let _max = r.u32().unwrap();
        if !present {
            return Vec::new();
        }
        assert_eq!(r.u32().unwrap(), entries);
        let headers: Vec<_> = (0..entries)
            .map(|_| {
                let h = r.unicode_string_header().unwrap();
                assert!(r.pointer().unwrap());
                h
            })
            .collect();
        headers
            .into_iter()
            .map(|(len, _, _)| (r.unicode_string_units(len).unwrap(), r.sid().unwrap()))
            .collect()
    }

    /// (domains, [(use, name, domain index)], mapped count, status).
    type Names = (Vec<(String, Sid)>, Vec<(u16, String, i32)>, u32, u32);

    fn read_names(out: &[u8], v2: bool) -> Names {
        let mut r = Reader::new(out);
        let domains = read_domains(&mut r);
        let entries = r.u32().unwrap();
        let mut names = Vec::new();
        if r.pointer().unwrap() {
            assert_eq!(r.u32().unwrap(), entries);
            let mut heads = Vec::new();
            for _ in 0..entries {
                let kind = r.u16().unwrap();
                let (len, _, present) = r.unicode_string_header().unwrap();
                assert!(present);
                let index = r.u32().unwrap() as i32;
                if v2 {
                    r.u32().unwrap();
                }
                heads.push((kind, len, index));
            }
            for (kind, len, index) in heads {
                names.push((kind, r.unicode_string_units(len).unwrap(), index));
            }
        }
        let mapped = r.u32().unwrap();
        let status = r.u32().unwrap();
        assert_eq!(r.remaining(), 0);
        (domains, names, mapped, status)
    }

    #[test]
    fn sids_are_named_with_their_domains() {
        let host = Unix { may: true };
        let mut handles = PolicyHandles::default();
        let h = open(&mut handles, &host);
        let sids = [
            Some(Sid::unix_user(1000)),
            Some(Sid::everyone()),
            Some(Sid::unix_group(50)),
            Some(Sid::unix_user(4242)),
            Some(sid(5, &[18])),
        ];
        for (op, v2, handle) in [
            (opnum::LOOKUP_SIDS, false, Some(&h)),
            (opnum::LOOKUP_SIDS2, true, Some(&h)),
            (opnum::LOOKUP_SIDS3, true, None),
        ] {
            let req = lookup_sids_request(handle, &sids, v2);
            let out = call(op, &req, &host, &mut handles).unwrap().unwrap();
            let (domains, names, mapped, st) = read_names(&out, v2);
            assert_eq!(
                domains,
                [
                    ("Unix User".to_string(), sid(22, &[1])),
                    (String::new(), sid(1, &[])),
                    ("Unix Group".to_string(), sid(22, &[2])),
                    ("NT AUTHORITY".to_string(), sid(5, &[])),
                ]
            );
            assert_eq!(
                names,
                [
                    (1, "alice".to_string(), 0),
                    (5, "Everyone".to_string(), 1),
                    (4, "staff".to_string(), 2),
                    (8, String::new(), -1),
                    (5, "SYSTEM".to_string(), 3),
                ]
            );
            assert_eq!((mapped, st), (4, status::SOME_NOT_MAPPED), "opnum {op}");
        }
        // Only unknown SIDs (and a null one): none mapped.
        let req = lookup_sids_request(Some(&h), &[Some(sid(5, &[21, 1, 2, 3, 500])), None], false);
        let (domains, names, mapped, st) = read_names(
            &call(opnum::LOOKUP_SIDS, &req, &host, &mut handles)
                .unwrap()
                .unwrap(),
            false,
        );
        assert!(domains.is_empty());
        assert_eq!(names.len(), 2);
        assert_eq!((mapped, st), (0, status::NONE_MAPPED));
    }

    fn lookup_names_request(h: &[u8; 20], names: &[&str], v2: bool) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(h);
        w.u32(names.len() as u32);
        w.u32(names.len() as u32);
        for n in names {
            w.unicode_string_header(n);
        }
        for n in names {
            w.unicode_string_units(n);
        }
        w.u32(0);
        w.null_pointer();
        w.u16(1);
        w.u32(0);
        if v2 {
            w.u32(0);
            w.u32(2);
        }
        w.into_bytes()
    }

    #[test]
    fn names_are_translated_to_domain_and_rid() {
        let host = Unix { may: true };
        let mut handles = PolicyHandles::default();
        let h = open(&mut handles, &host);
        let names = [
            "alice",
            "Unix Group\\staff",
            "everyone",
            "NT AUTHORITY\\SYSTEM",
            "nobody-here",
            "Unix Group\\alice",
        ];
        for (op, v2) in [(opnum::LOOKUP_NAMES, false), (opnum::LOOKUP_NAMES2, true)] {
            let out = call(
                op,
                &lookup_names_request(&h, &names, v2),
                &host,
                &mut handles,
            )
            .unwrap()
            .unwrap();
            let mut r = Reader::new(&out);
            let domains = read_domains(&mut r);
            assert_eq!(domains.len(), 4);
            let entries = r.u32().unwrap();
            assert!(r.pointer().unwrap());
            assert_eq!(r.u32().unwrap(), entries);
            let sids: Vec<(u16, u32, i32)> = (0..entries)
                .map(|_| {
                    let kind = r.u16().unwrap();
                    let rid = r.u32().unwrap();
                    let index = r.u32().unwrap() as i32;
                    if v2 {
                        r.u32().unwrap();
                    }
                    (kind, rid, index)
                })
                .collect();
            assert_eq!(
                sids,
                [
                    (1, 1000, 0),
                    (4, 50, 1),
                    (5, 0, 2),
                    (5, 18, 3),
                    (8, 0, -1),
                    (8, 0, -1)
                ]
            );
            assert_eq!(r.u32().unwrap(), 4);
            assert_eq!(r.u32().unwrap(), status::SOME_NOT_MAPPED);
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn handles_are_per_pipe_and_closed_once() {
        let host = Unix { may: true };
        let mut handles = PolicyHandles::default();
        let h = open(&mut handles, &host);
        let mut other = PolicyHandles::default();
        let req = lookup_sids_request(Some(&h), &[Some(Sid::everyone())], false);
        let out = call(opnum::LOOKUP_SIDS, &req, &host, &mut other)
            .unwrap()
            .unwrap();
        assert_eq!(read_names(&out, false).3, status::INVALID_HANDLE);
        // Query: the workgroup, no SID.
        let mut q = h.to_vec();
        q.extend_from_slice(&3u16.to_le_bytes());
        let out = call(opnum::QUERY_INFORMATION_POLICY, &q, &host, &mut handles)
            .unwrap()
            .unwrap();
        let mut r = Reader::new(&out);
        assert!(r.pointer().unwrap());
        assert_eq!(r.u16().unwrap(), 3);
        let (len, _, present) = r.unicode_string_header().unwrap();
        assert!(present);
        assert!(!r.pointer().unwrap());
        assert_eq!(r.unicode_string_units(len).unwrap(), "WORKGROUP");
        assert_eq!(r.u32().unwrap(), status::SUCCESS);
        q[20] = 12;
        let out = call(opnum::QUERY_INFORMATION_POLICY2, &q, &host, &mut handles)
            .unwrap()
            .unwrap();
        assert_eq!(out, [0, 0, 0, 0, 0x0D, 0, 0, 0xC0]);
        // Close: once.
        let out = call(opnum::CLOSE, &h, &host, &mut handles)
            .unwrap()
            .unwrap();
        assert_eq!(&out[..20], &[0; 20]);
        assert_eq!(&out[20..], &status::SUCCESS.to_le_bytes());
        let out = call(opnum::CLOSE, &h, &host, &mut handles)
            .unwrap()
            .unwrap();
        assert_eq!(&out[20..], &status::INVALID_HANDLE.to_le_bytes());
        // Whoever may not browse may not open a policy either.
        let out = call(opnum::OPEN_POLICY, &[], &Unix { may: false }, &mut handles)
            .unwrap()
            .unwrap();
        assert_eq!(&out[20..], &status::ACCESS_DENIED.to_le_bytes());
        let mut full = PolicyHandles::default();
        for _ in 0..MAX_HANDLES {
            open(&mut full, &host);
        }
        let out = call(opnum::OPEN_POLICY2, &[], &host, &mut full)
            .unwrap()
            .unwrap();
        assert_eq!(&out[20..], &status::INSUFFICIENT_RESOURCES.to_le_bytes());
    }

    #[test]
    fn malformed_lookups_are_bad_stubs() {
        let host = Unix { may: true };
        let mut handles = PolicyHandles::default();
        let h = open(&mut handles, &host);
        // A count the stub cannot hold, a count unlike Entries, cut stubs.
        let mut huge = Writer::new();
        huge.bytes(&h);
        huge.u32(u32::MAX);
        huge.pointer();
        huge.u32(u32::MAX);
        assert!(call(opnum::LOOKUP_SIDS, &huge.into_bytes(), &host, &mut handles).is_err());
        let mut req = lookup_sids_request(Some(&h), &[Some(Sid::everyone())], false);
        req[20] = 2;
        assert!(call(opnum::LOOKUP_SIDS, &req, &host, &mut handles).is_err());
        let req = lookup_sids_request(Some(&h), &[Some(Sid::everyone())], false);
        for cut in [0, 10, 24, 30, req.len() - 1] {
            assert!(
                call(opnum::LOOKUP_SIDS, &req[..cut], &host, &mut handles).is_err(),
                "{cut}"
            );
        }
        // A SID with more sub-authorities than MS-DTYP allows.
        let mut w = Writer::new();
        w.bytes(&h);
        w.u32(1);
        w.pointer();
        w.u32(1);
        w.pointer();
        w.u32(16);
        w.u8(1);
        w.u8(16);
        assert!(call(opnum::LOOKUP_SIDS, &w.into_bytes(), &host, &mut handles).is_err());
        let mut names = lookup_names_request(&h, &["alice"], false);
        names[24] = 9; // conformance unlike Count
        assert!(call(opnum::LOOKUP_NAMES, &names, &host, &mut handles).is_err());
        assert_eq!(call(99, &[], &host, &mut handles).unwrap(), None);
    }
}
