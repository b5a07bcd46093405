//! The endpoint mapper's ept_map (C706 Appendix O, MS-RPCE 2.2.1.2.5 and
//! 3.3.3.1.1): a client that knows an interface but not its port asks
//! port 135 for it, as Windows and Samba's rpcclient do for the witness
//! service. Only ept_map is served, and only for the interfaces the
//! caller registers (the witness); the mapper needs no authentication.

use std::net::SocketAddrV4;

use crate::ndr::{Reader, Writer};
use crate::pdu::{SyntaxId, NDR20};
use crate::RpcError;

/// e1af8308-5d1f-11c9-91a4-08002b14a0fa version 3.0.
pub const INTERFACE: SyntaxId = SyntaxId {
    uuid: [
        0x08, 0x83, 0xaf, 0xe1, 0x1f, 0x5d, 0xc9, 0x11, 0x91, 0xa4, 0x08, 0x00, 0x2b, 0x14, 0xa0,
        0xfa,
    ],
    major: 3,
    minor: 0,
};

/// ept_map's operation number.
pub const OPNUM_MAP: u16 = 3;
/// EPT_S_NOT_REGISTERED (C706 Appendix N).
pub const NOT_REGISTERED: u32 = 0x16c9_a0d6;
/// A tower longer than this is not one a client sends (five floors of at
/// most 21 bytes each).
const MAX_TOWER: u32 = 1024;

/// C706 Appendix L: floor protocol identifiers.
mod floor {
    pub const UUID: u8 = 0x0d;
    pub const RPC_CO: u8 = 0x0b;
    pub const TCP: u8 = 0x07;
    pub const IP: u8 = 0x09;
}

/// What an ept_map asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapRequest {
    /// The interface of the tower's first floor (uuid, major, minor).
    pub interface: SyntaxId,
    pub handle: [u8; 20],
    /// How many towers the answer's array has room for (its size_is).
    pub max_towers: u32,
}

/// Decodes an ept_map request: `[in, ptr] uuid_p_t object, [in, ptr]
/// twr_p_t map_tower, [in, out] ept_lookup_handle_t *entry_handle, [in]
/// unsigned32 max_towers`.
pub fn decode_map(stub: &[u8]) -> Result<MapRequest, RpcError> {
    let mut r = Reader::new(stub);
    if r.pointer()? {
        r.bytes(16)?; // object uuid: not used to pick the endpoint
    }
    if !r.pointer()? {
        return Err(RpcError::BadStub);
    }
    let _max = r.u32()?;
    let len = r.u32()?;
    if len > MAX_TOWER {
        return Err(RpcError::BadStub);
    }
    let tower = r.bytes(len as usize)?;
    // The handle is aligned to 4 after the tower.
    let pad = (4 - len as usize % 4) % 4;
    r.bytes(pad)?;
    let mut handle = [0u8; 20];
    handle.copy_from_slice(r.bytes(20)?);
    let max_towers = r.u32()?;
    Ok(MapRequest {
        interface: first_floor(tower)?,
        handle,
        max_towers,
    })
}

/// The interface a tower's first floor names. Tower octets are packed,
/// not NDR-aligned: floor count, then per floor a counted left-hand side
/// and a counted right-hand side.
fn first_floor(tower: &[u8]) -> Result<SyntaxId, RpcError> {
    let u16_at = |at: usize| {
        tower
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .ok_or(RpcError::BadStub)
    };
    if u16_at(0)? == 0 || u16_at(2)? != 19 || u16_at(23)? != 2 {
        return Err(RpcError::BadStub);
    }
    let lhs = tower.get(4..23).ok_or(RpcError::BadStub)?;
    if lhs[0] != floor::UUID {
        return Err(RpcError::BadStub);
    }
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&lhs[1..17]);
    Ok(SyntaxId {
        uuid,
        major: u16::from_le_bytes([lhs[17], lhs[18]]),
        minor: u16_at(25)?,
    })
}

/// The five-floor tower of `interface` over TCP at `at` (C706 Appendix L).
fn tower(interface: &SyntaxId, at: SocketAddrV4) -> Vec<u8> {
    let mut t = Vec::with_capacity(75);
    t.extend_from_slice(&5u16.to_le_bytes());
    let mut uuid_floor = |s: &SyntaxId| {
        t.extend_from_slice(&19u16.to_le_bytes());
        t.push(floor::UUID);
        t.extend_from_slice(&s.uuid);
        t.extend_from_slice(&s.major.to_le_bytes());
        t.extend_from_slice(&2u16.to_le_bytes());
        t.extend_from_slice(&s.minor.to_le_bytes());
    };
    uuid_floor(interface);
    uuid_floor(&NDR20);
    let mut simple = |id: u8, rhs: &[u8]| {
        t.extend_from_slice(&1u16.to_le_bytes());
        t.push(id);
        t.extend_from_slice(&(rhs.len() as u16).to_le_bytes());
        t.extend_from_slice(rhs);
    };
    simple(floor::RPC_CO, &[0, 0]);
    // The port and address in network order.
    simple(floor::TCP, &at.port().to_be_bytes());
    simple(floor::IP, &at.ip().octets());
    t
}

/// ept_map's answer: the handle back (no lookup continues), the towers
/// found (`at`: the interface's endpoint, if it is served) and the status.
pub fn encode_map(req: &MapRequest, at: Option<SocketAddrV4>) -> Vec<u8> {
    let mut w = Writer::new();
    w.bytes(&[0; 20]);
    match at {
        Some(at) => {
            let t = tower(&req.interface, at);
            w.u32(1); // num_towers
            w.u32(req.max_towers.max(1)); // max_count: size_is(max_towers)
            w.u32(0); // offset
            w.u32(1); // actual_count
            w.pointer();
            w.u32(t.len() as u32); // conformance of tower_octet_string
            w.u32(t.len() as u32); // tower_length
            w.bytes(&t);
            w.u32(0);
        }
        None => {
            w.u32(0); // num_towers
            w.u32(req.max_towers); // max_count
            w.u32(0); // offset
            w.u32(0); // actual_count
            w.u32(NOT_REGISTERED);
        }
    }
    w.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::witness;

    fn request(tower_bytes: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.null_pointer();
        w.pointer();
        w.u32(tower_bytes.len() as u32);
        w.u32(tower_bytes.len() as u32);
        w.bytes(tower_bytes);
        w.u32(0); // aligns; the handle's first word
        w.bytes(&[0; 16]);
        w.u32(4);
        w.into_bytes()
    }

    #[test]
    fn a_map_of_the_witness_answers_its_port_and_address() {
        let asked = tower(&witness::INTERFACE, "0.0.0.0:0".parse().unwrap());
        let req = decode_map(&request(&asked)).unwrap();
        assert_eq!(req.interface, witness::INTERFACE);
        let b = encode_map(&req, Some("127.0.0.2:5445".parse().unwrap()));
        let t = tower(&witness::INTERFACE, "127.0.0.2:5445".parse().unwrap());
        assert_eq!(t.len(), 75);
        // Port and address are the tower's last bytes, in network order.
        assert_eq!(
            &t[t.len() - 16..],
            &[1, 0, 7, 2, 0, 0x15, 0x45, 1, 0, 9, 4, 0, 127, 0, 0, 2][..]
        );
        assert_eq!(&b[20..24], &1u32.to_le_bytes());
        assert_eq!(&b[48..48 + t.len()], &t[..]);
        assert_eq!(&b[b.len() - 4..], &[0, 0, 0, 0]);
        let none = encode_map(&req, None);
        assert_eq!(&none[none.len() - 4..], &NOT_REGISTERED.to_le_bytes());
    }

    #[test]
    fn cut_and_oversized_requests_are_refused() {
        let asked = tower(&witness::INTERFACE, "0.0.0.0:0".parse().unwrap());
        let stub = request(&asked);
        for cut in 0..stub.len() {
            assert!(decode_map(&stub[..cut]).is_err(), "{cut}");
        }
        let mut w = Writer::new();
        w.null_pointer();
        w.pointer();
        w.u32(u32::MAX);
        w.u32(u32::MAX);
        assert!(decode_map(&w.into_bytes()).is_err());
    }
}
