//! MS-WKST, the workstation service: the computer's name and workgroup,
//! which clients ask a server for when they browse it.

use crate::ndr::{Reader, Writer};
use crate::pdu::SyntaxId;
use crate::{werror, Host, RpcError, PLATFORM_ID_NT, VERSION_MAJOR, VERSION_MINOR};

/// MS-WKST 1.9: 6bffd098-a112-3610-9833-46c3f87e345a version 1.0.
pub const INTERFACE: SyntaxId = SyntaxId {
    uuid: [
        0x98, 0xd0, 0xff, 0x6b, 0x12, 0xa1, 0x10, 0x36, 0x98, 0x33, 0x46, 0xc3, 0xf8, 0x7e, 0x34,
        0x5a,
    ],
    major: 1,
    minor: 0,
};

pub mod opnum {
    pub const NETR_WKSTA_GET_INFO: u16 = 0;
}

/// Runs one wkssvc call; None for an operation not served.
pub fn call(opnum: u16, stub: &[u8], host: &Host) -> Result<Option<Vec<u8>>, RpcError> {
    match opnum {
        opnum::NETR_WKSTA_GET_INFO => wksta_get_info(stub, host).map(Some),
        _ => Ok(None),
    }
}

/// MS-WKST 3.2.4.1 NetrWkstaGetInfo, opnum 0: levels 100 and 101
/// (WKSTA_INFO_100/101, 2.2.5.1-2); 102 lists logged-on users and is for
/// administrators.
fn wksta_get_info(stub: &[u8], host: &Host) -> Result<Vec<u8>, RpcError> {
    let mut r = Reader::new(stub);
    let _server = r.wstring_pointer()?;
    let level = r.u32()?;
    let mut w = Writer::new();
    w.u32(level);
    let status = match level {
        100 | 101 => {
            w.pointer();
            w.u32(PLATFORM_ID_NT);
            w.pointer(); // computer name
            w.pointer(); // lan group
            w.u32(VERSION_MAJOR);
            w.u32(VERSION_MINOR);
            if level == 101 {
                w.pointer(); // lan root
            }
            w.wstring(&host.name);
            w.wstring(&host.workgroup);
            if level == 101 {
                w.wstring("");
            }
            werror::OK
        }
        102 => {
            w.null_pointer();
            werror::ACCESS_DENIED
        }
        _ => werror::INVALID_LEVEL,
    };
    w.u32(status);
    Ok(w.into_bytes())
}
