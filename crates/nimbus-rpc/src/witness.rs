//! The Service Witness Protocol's calls (MS-SWN 3.1.4) as NDR: what a
//! client sends and what the server answers. The registrations and the
//! events behind them are the server's (`nimbus-node`'s witness module);
//! this module only decodes and encodes, bounded as every decoder here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::ndr::{Reader, Writer};
use crate::pdu::SyntaxId;
use crate::RpcError;

/// MS-SWN 2.1: ccd8c074-d0e5-4a40-92b4-d074faa6ba28 version 1.1.
pub const INTERFACE: SyntaxId = SyntaxId {
    uuid: [
        0x74, 0xc0, 0xd8, 0xcc, 0xe5, 0xd0, 0x40, 0x4a, 0x92, 0xb4, 0xd0, 0x74, 0xfa, 0xa6, 0xba,
        0x28,
    ],
    major: 1,
    minor: 1,
};

/// MS-SWN 3.1.4: the operations.
pub mod opnum {
    pub const GET_INTERFACE_LIST: u16 = 0;
    pub const REGISTER: u16 = 1;
    pub const UNREGISTER: u16 = 2;
    pub const ASYNC_NOTIFY: u16 = 3;
    pub const REGISTER_EX: u16 = 4;
}

/// MS-SWN 2.2.2.1-3: the protocol versions.
pub const VERSION_1: u32 = 0x0001_0001;
pub const VERSION_2: u32 = 0x0002_0000;

/// Win32 errors the calls return (MS-SWN 3.1.4, MS-ERREF 2.2).
pub mod werror {
    pub const OK: u32 = 0;
    pub const INVALID_PARAMETER: u32 = 87;
    pub const NOT_FOUND: u32 = 1168;
    pub const REVISION_MISMATCH: u32 = 1306;
    pub const INVALID_STATE: u32 = 5023;
    pub const NO_SYSTEM_RESOURCES: u32 = 1450;
    /// An AsyncNotify that waited past the registration's timeout.
    pub const TIMEOUT: u32 = 1460;
    /// RPC_S_CALL_CANCELLED: an AsyncNotify whose registration went.
    pub const CALL_CANCELLED: u32 = 1818;
}

/// MS-SWN 2.2.2.4 WITNESS_INTERFACE_INFO state.
pub const STATE_AVAILABLE: u16 = 0x01;
pub const STATE_UNAVAILABLE: u16 = 0xff;
/// MS-SWN 2.2.2.4 flags.
const IPV4_VALID: u32 = 0x01;
const IPV6_VALID: u32 = 0x02;
const WITNESS_IF: u32 = 0x04;
/// MS-SWN 2.2.2.4: InterfaceGroupName is 260 WCHARs.
const GROUP_NAME_UNITS: usize = 260;

/// One interface of the cluster, as GetInterfaceList lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceInfo {
    /// The node's name (InterfaceGroupName).
    pub group_name: String,
    pub available: bool,
    pub addr: IpAddr,
    /// A client may use this interface's witness service: every node's
    /// but the one the client asks (MS-SWN 3.1.4.1).
    pub witness_if: bool,
}

/// MS-SWN 3.1.4.1 WitnessrGetInterfaceList's answer: `[out]
/// PWITNESS_INTERFACE_LIST *InterfaceList` and the result.
pub fn encode_interface_list(list: &[InterfaceInfo]) -> Vec<u8> {
    let mut w = Writer::new();
    w.pointer(); // *InterfaceList
    w.u32(list.len() as u32);
    w.pointer(); // InterfaceInfo
    w.u32(list.len() as u32); // conformance
    for i in list {
        let mut name: Vec<u16> = i
            .group_name
            .encode_utf16()
            .take(GROUP_NAME_UNITS - 1)
            .collect();
        name.resize(GROUP_NAME_UNITS, 0);
        for u in name {
            w.u16(u);
        }
        w.u32(VERSION_2);
        w.u16(if i.available {
            STATE_AVAILABLE
        } else {
            STATE_UNAVAILABLE
        });
        let (v4, v6, mut flags) = match i.addr {
            IpAddr::V4(a) => (a, Ipv6Addr::UNSPECIFIED, IPV4_VALID),
            IpAddr::V6(a) => (Ipv4Addr::UNSPECIFIED, a, IPV6_VALID),
        };
        if i.witness_if {
            flags |= WITNESS_IF;
        }
        // Both addresses in network order (MS-SWN 2.2.2.4).
        w.u32(u32::from_le_bytes(v4.octets()));
        for pair in v6.octets().chunks_exact(2) {
            w.u16(u16::from_le_bytes([pair[0], pair[1]]));
        }
        w.u32(flags);
    }
    w.u32(werror::OK);
    w.into_bytes()
}

/// MS-SWN 3.1.4.5, RegisterEx Flags: WITNESS_REGISTER_IP_NOTIFICATION asks for
/// IP_CHANGE notifications.
pub const REGISTER_IP_NOTIFICATION: u32 = 0x1;

/// WitnessrRegister (3.1.4.2) and WitnessrRegisterEx (3.1.4.5) requests;
/// Register has no share name, flags or timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Register {
    pub version: u32,
    pub net_name: Option<String>,
    pub share_name: Option<String>,
    pub ip_address: Option<String>,
    pub client_computer_name: Option<String>,
    /// WITNESS_REGISTER_IP_NOTIFICATION (0x1) asks for IP_CHANGE.
    pub flags: u32,
    /// Seconds an AsyncNotify waits at most (0: Register's default).
    pub timeout: u32,
}

/// Decodes a WitnessrRegister request.
pub fn decode_register(stub: &[u8]) -> Result<Register, RpcError> {
    let mut r = Reader::new(stub);
    Ok(Register {
        version: r.u32()?,
        net_name: r.wstring_pointer()?,
        ip_address: r.wstring_pointer()?,
        client_computer_name: r.wstring_pointer()?,
        share_name: None,
        flags: 0,
        timeout: 0,
    })
}

/// Decodes a WitnessrRegisterEx request.
pub fn decode_register_ex(stub: &[u8]) -> Result<Register, RpcError> {
    let mut r = Reader::new(stub);
    Ok(Register {
        version: r.u32()?,
        net_name: r.wstring_pointer()?,
        share_name: r.wstring_pointer()?,
        ip_address: r.wstring_pointer()?,
        client_computer_name: r.wstring_pointer()?,
        flags: r.u32()?,
        timeout: r.u32()?,
    })
}

/// A context handle (C706 policy handle: 20 bytes).
pub type Handle = [u8; 20];

/// Decodes the context handle UnRegister and AsyncNotify take.
pub fn decode_handle(stub: &[u8]) -> Result<Handle, RpcError> {
    let mut r = Reader::new(stub);
    let b = r.bytes(20)?;
    let mut h = [0u8; 20];
    h.copy_from_slice(b);
    Ok(h)
}

/// Register's and RegisterEx's answer: the handle (all zero on failure)
/// and the result.
pub fn encode_register_answer(handle: Option<&Handle>, result: u32) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(handle.unwrap_or(&[0; 20]));
    w.u32(result);
    w.into_bytes()
}

/// An answer that is only a result (UnRegister, and a failed
/// GetInterfaceList, whose list pointer is null).
pub fn encode_result(result: u32, with_null_pointer: bool) -> Vec<u8> {
    let mut w = Writer::new();
    if with_null_pointer {
        w.null_pointer();
    }
    w.u32(result);
    w.into_bytes()
}

/// What an AsyncNotify reports (MS-SWN 2.2.2.5-7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// RESOURCE_CHANGE: the named resource (an interface's node name or
    /// address) became available or unavailable.
    ResourceChange { name: String, available: bool },
    /// CLIENT_MOVE: move to one of these addresses.
    ClientMove(Vec<IpAddr>),
    /// SHARE_MOVE: the share moved to these addresses.
    ShareMove(Vec<IpAddr>),
    /// IP_CHANGE: these addresses came online (true) or went offline.
    IpChange(Vec<(IpAddr, bool)>),
}

/// MS-SWN 2.2.2.5-7: the message types.
mod message_type {
    pub const RESOURCE_CHANGE: u32 = 1;
    pub const CLIENT_MOVE: u32 = 2;
    pub const SHARE_MOVE: u32 = 3;
    pub const IP_CHANGE: u32 = 4;
}

/// MS-SWN 2.2.2.6 IPADDR_INFO flags.
const IPADDR_V4: u32 = 0x01;
const IPADDR_V6: u32 = 0x02;
const IPADDR_ONLINE: u32 = 0x08;
const IPADDR_OFFLINE: u32 = 0x10;
/// MS-SWN 2.2.2.5: ChangeType.
const RESOURCE_AVAILABLE: u32 = 0x01;
const RESOURCE_UNAVAILABLE: u32 = 0xff;

/// The message of a notification (MS-SWN 2.2.2.5 RESOURCE_CHANGE or 2.2.2.7
/// IPADDR_INFO_LIST), in its own little-endian, unaligned layout.
fn message(n: &Notification) -> (u32, Vec<u8>) {
    let ip_list = |addrs: &mut dyn Iterator<Item = (IpAddr, u32)>| {
        let entries: Vec<(IpAddr, u32)> = addrs.collect();
        let mut m = Vec::with_capacity(12 + 24 * entries.len());
        m.extend_from_slice(&((12 + 24 * entries.len()) as u32).to_le_bytes());
        m.extend_from_slice(&0u32.to_le_bytes());
        m.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (addr, extra) in entries {
            let (v4, v6, kind) = match addr {
                IpAddr::V4(a) => (a, Ipv6Addr::UNSPECIFIED, IPADDR_V4),
                IpAddr::V6(a) => (Ipv4Addr::UNSPECIFIED, a, IPADDR_V6),
            };
            m.extend_from_slice(&(kind | extra).to_le_bytes());
            m.extend_from_slice(&v4.octets());
            m.extend_from_slice(&v6.octets());
        }
        m
    };
    match n {
        Notification::ResourceChange { name, available } => {
            let units: Vec<u16> = name.encode_utf16().chain([0]).collect();
            let mut m = Vec::with_capacity(8 + 2 * units.len());
            m.extend_from_slice(&((8 + 2 * units.len()) as u32).to_le_bytes());
            let t = if *available {
                RESOURCE_AVAILABLE
            } else {
                RESOURCE_UNAVAILABLE
            };
            m.extend_from_slice(&t.to_le_bytes());
            for u in units {
                m.extend_from_slice(&u.to_le_bytes());
            }
            (message_type::RESOURCE_CHANGE, m)
        }
        Notification::ClientMove(a) => (
            message_type::CLIENT_MOVE,
            ip_list(&mut a.iter().map(|x| (*x, IPADDR_ONLINE))),
        ),
        Notification::ShareMove(a) => (
            message_type::SHARE_MOVE,
            ip_list(&mut a.iter().map(|x| (*x, IPADDR_ONLINE))),
        ),
        Notification::IpChange(a) => (
            message_type::IP_CHANGE,
            ip_list(
                &mut a
                    .iter()
                    .map(|(x, on)| (*x, if *on { IPADDR_ONLINE } else { IPADDR_OFFLINE })),
            ),
        ),
    }
}

/// WitnessrAsyncNotify's answer (MS-SWN 3.1.4.4, 2.2.2.8 RESP_ASYNC_NOTIFY):
/// one message, or on failure a null response and the error.
pub fn encode_notify(n: Result<&Notification, u32>) -> Vec<u8> {
    let mut w = Writer::new();
    let n = match n {
        Ok(n) => n,
        Err(e) => return encode_result(e, true),
    };
    let (kind, m) = message(n);
    w.pointer(); // *pResp
    w.u32(kind);
    w.u32(m.len() as u32);
    w.u32(1); // NumberOfMessages
    w.pointer(); // MessageBuffer
    w.u32(m.len() as u32); // conformance
    w.bytes(&m);
    w.u32(werror::OK);
    w.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_ex_decodes_and_a_cut_stub_is_refused() {
        let mut w = Writer::new();
        w.u32(VERSION_2);
        w.wstring_pointer("NIMBUS");
        w.wstring_pointer("data");
        w.wstring_pointer("127.0.0.2");
        w.null_pointer();
        w.u32(1);
        w.u32(30);
        let stub = w.into_bytes();
        let r = decode_register_ex(&stub).unwrap();
        assert_eq!(r.version, VERSION_2);
        assert_eq!(r.net_name.as_deref(), Some("NIMBUS"));
        assert_eq!(r.share_name.as_deref(), Some("data"));
        assert_eq!(r.ip_address.as_deref(), Some("127.0.0.2"));
        assert_eq!(r.client_computer_name, None);
        assert_eq!((r.flags, r.timeout), (1, 30));
        for cut in 0..stub.len() {
            assert!(decode_register_ex(&stub[..cut]).is_err(), "{cut}");
        }
        assert!(decode_handle(&[0; 19]).is_err());
    }

    /// The layout of MS-SWN 2.2.2.4: 552 bytes per interface, the name
    /// fixed at 260 units, both addresses in network order.
    #[test]
    fn an_interface_list_entry_is_552_bytes() {
        let list = [InterfaceInfo {
            group_name: "n1".into(),
            available: true,
            addr: "127.0.0.2".parse().unwrap(),
            witness_if: true,
        }];
        let b = encode_interface_list(&list);
        // referent, count, referent, conformance, entry, result
        assert_eq!(b.len(), 16 + 552 + 4);
        let e = &b[16..16 + 552];
        assert_eq!(&e[..6], &[b'n', 0, b'1', 0, 0, 0]);
        assert_eq!(&e[520..524], &VERSION_2.to_le_bytes());
        assert_eq!(&e[524..526], &[1, 0]);
        assert_eq!(&e[528..532], &[127, 0, 0, 2]);
        assert_eq!(&e[548..552], &(IPV4_VALID | WITNESS_IF).to_le_bytes());
    }

    #[test]
    fn a_resource_change_is_length_type_and_name() {
        let b = encode_notify(Ok(&Notification::ResourceChange {
            name: "n1".into(),
            available: false,
        }));
        let m = [14, 0, 0, 0, 0xff, 0, 0, 0, b'n', 0, b'1', 0, 0, 0];
        let mut want = vec![
            0, 0, 2, 0, 1, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 4, 0, 2, 0, 14, 0, 0, 0,
        ];
        want.extend_from_slice(&m);
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0]); // pad to 4, result
        assert_eq!(b, want);
        let moved = encode_notify(Ok(&Notification::ClientMove(vec!["127.0.0.3"
            .parse()
            .unwrap()])));
        // 24 header bytes, then a list of one: 12 + 24.
        assert_eq!(&moved[24..28], &36u32.to_le_bytes());
        assert_eq!(&moved[36..40], &(IPADDR_V4 | IPADDR_ONLINE).to_le_bytes());
        assert_eq!(&moved[40..44], &[127, 0, 0, 3]);
    }
}
