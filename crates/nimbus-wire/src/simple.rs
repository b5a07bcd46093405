//! Bodies that carry nothing but a StructureSize of 4 and a reserved field:
//! MS-SMB2 2.2.7/2.2.8 LOGOFF, 2.2.11/2.2.12 TREE_DISCONNECT,
//! 2.2.28/2.2.29 ECHO, 2.2.30 CANCEL and 2.2.18 FLUSH Response.

use crate::codec::{Put, Reader, WireResult};

pub const EMPTY_STRUCTURE_SIZE: u16 = 4;

/// Checks an empty request body.
pub fn parse_empty(body: &[u8]) -> WireResult<()> {
    let mut r = Reader::new(body);
    r.structure_size(EMPTY_STRUCTURE_SIZE)?;
    r.u16()?;
    Ok(())
}

pub fn encode_empty(out: &mut Vec<u8>) {
    out.put_u16(EMPTY_STRUCTURE_SIZE);
    out.put_u16(0);
}

/// MS-SMB2 2.2.2 SMB2 ERROR Response, without error contexts.
pub fn encode_error(out: &mut Vec<u8>, data: &[u8]) {
    out.put_u16(9);
    out.put_u8(0); // ErrorContextCount
    out.put_u8(0);
    out.put_u32(data.len() as u32);
    if data.is_empty() {
        // The spec requires one byte of ErrorData even when ByteCount is 0.
        out.put_u8(0);
    } else {
        out.extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_error_bodies() {
        let mut out = Vec::new();
        encode_empty(&mut out);
        assert_eq!(out, [4, 0, 0, 0]);
        parse_empty(&out).unwrap();
        assert!(parse_empty(&[4, 0]).is_err());
        assert!(parse_empty(&[5, 0, 0, 0]).is_err());
        out.clear();
        encode_error(&mut out, &[]);
        assert_eq!(out, [9, 0, 0, 0, 0, 0, 0, 0, 0]);
    }
}
