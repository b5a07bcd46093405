//! Extended attributes as SET_INFO, QUERY_INFO and the CREATE EA_BUFFER
//! context carry them: MS-FSCC 2.4.15 FILE_FULL_EA_INFORMATION (a chain of
//! entries) and 2.4.15.1 FILE_GET_EA_INFORMATION (a chain of names).

use crate::codec::{Put, Reader, WireError, WireResult};

/// MS-FSCC 2.4.15 Flags: the EA must be understood to use the file.
pub const FILE_NEED_EA: u8 = 0x80;

/// One FILE_FULL_EA_INFORMATION entry, borrowed from its buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FullEa<'a> {
    pub flags: u8,
    pub name: &'a [u8],
    pub value: &'a [u8],
}

/// Bytes of an entry before its padding: NextEntryOffset, Flags,
/// EaNameLength, EaValueLength, the name, its NUL, the value.
pub fn full_ea_len(name_len: usize, value_len: usize) -> usize {
    8 + name_len + 1 + value_len
}

/// Decodes a chain of FILE_FULL_EA_INFORMATION entries. Every entry must
/// lie within the buffer, its name end with a NUL, and a NextEntryOffset
/// step past its entry to a 4-byte boundary: otherwise the list is
/// inconsistent (the offset of the faulty entry is the error's).
pub fn parse_full_ea_list(buf: &[u8]) -> Result<Vec<FullEa<'_>>, usize> {
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let entry = buf.get(at..).ok_or(at)?;
        let mut r = Reader::new(entry);
        let parsed = (|| -> WireResult<(u32, FullEa<'_>)> {
            let next = r.u32()?;
            let flags = r.u8()?;
            let name_len = r.u8()? as usize;
            let value_len = r.u16()? as usize;
            let name = r.bytes(name_len)?;
            if r.u8()? != 0 {
                return Err(WireError::Invalid("EA name not NUL-terminated"));
            }
            let value = r.bytes(value_len)?;
            Ok((next, FullEa { flags, name, value }))
        })();
        let (next, ea) = parsed.map_err(|_| at)?;
        out.push(ea);
        if next == 0 {
            return Ok(out);
        }
        let next = next as usize;
        if next < full_ea_len(ea.name.len(), ea.value.len()) || !next.is_multiple_of(4) {
            return Err(at);
        }
        at += next;
    }
}

/// Encodes entries as a FILE_FULL_EA_INFORMATION chain, each after the
/// first 4-byte aligned.
pub fn encode_full_ea_list<'a>(entries: impl IntoIterator<Item = FullEa<'a>>, out: &mut Vec<u8>) {
    let mut prev: Option<usize> = None;
    for ea in entries {
        if let Some(p) = prev {
            while !(out.len() - p).is_multiple_of(4) {
                out.push(0);
            }
            let next = (out.len() - p) as u32;
            out[p..p + 4].copy_from_slice(&next.to_le_bytes());
        }
        prev = Some(out.len());
        out.put_u32(0);
        out.push(ea.flags);
        out.push(ea.name.len() as u8);
        out.put_u16(ea.value.len() as u16);
        out.extend_from_slice(ea.name);
        out.push(0);
        out.extend_from_slice(ea.value);
    }
}

/// Decodes a chain of FILE_GET_EA_INFORMATION entries: the names asked
/// for, in order.
pub fn parse_get_ea_list(buf: &[u8]) -> Result<Vec<&[u8]>, usize> {
    let mut out = Vec::new();
    let mut at = 0usize;
    loop {
        let entry = buf.get(at..).ok_or(at)?;
        let mut r = Reader::new(entry);
        let parsed = (|| -> WireResult<(u32, &[u8])> {
            let next = r.u32()?;
            let len = r.u8()? as usize;
            let name = r.bytes(len)?;
            if r.u8()? != 0 {
                return Err(WireError::Invalid("EA name not NUL-terminated"));
            }
            Ok((next, name))
        })();
        let (next, name) = parsed.map_err(|_| at)?;
        out.push(name);
        if next == 0 {
            return Ok(out);
        }
        let next = next as usize;
        if next < 5 + name.len() + 1 || !next.is_multiple_of(4) {
            return Err(at);
        }
        at += next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two entries laid out by hand from MS-FSCC 2.4.15: "A" = "xy" with
    /// FILE_NEED_EA (12 bytes, already 4-aligned), then "BC" = "".
    const TWO_EAS: &str = concat!(
        "0c000000", // NextEntryOffset 12
        "80",       // Flags FILE_NEED_EA
        "01",       // EaNameLength 1
        "0200",     // EaValueLength 2
        "4100",     // "A" NUL
        "7879",     // "xy"
        "00000000", // NextEntryOffset 0: the last
        "00",       // Flags
        "02",       // EaNameLength 2
        "0000",     // EaValueLength 0
        "424300",   // "BC" NUL
    );

    #[test]
    fn full_ea_lists_round_trip() {
        let buf = hex::decode(TWO_EAS).unwrap();
        let list = parse_full_ea_list(&buf).unwrap();
        assert_eq!(
            list,
            [
                FullEa {
                    flags: FILE_NEED_EA,
                    name: b"A",
                    value: b"xy"
                },
                FullEa {
                    flags: 0,
                    name: b"BC",
                    value: b""
                },
            ]
        );
        let mut again = Vec::new();
        encode_full_ea_list(list.iter().copied(), &mut again);
        assert_eq!(again, buf);
        assert_eq!(full_ea_len(1, 2), 12);
    }

    #[test]
    fn inconsistent_lists_name_their_faulty_entry() {
        let buf = hex::decode(TWO_EAS).unwrap();
        // Cut inside the second entry, then inside the first.
        assert_eq!(parse_full_ea_list(&buf[..18]), Err(12));
        assert_eq!(parse_full_ea_list(&buf[..10]), Err(0));
        // A NextEntryOffset inside its own entry, or not 4-aligned.
        let mut short = buf.clone();
        short[0] = 8;
        assert_eq!(parse_full_ea_list(&short), Err(0));
        // Padding between entries is allowed.
        let mut padded = buf[..12].to_vec();
        padded[0] = 16;
        padded.extend_from_slice(&[0; 4]);
        padded.extend_from_slice(&buf[12..]);
        assert_eq!(parse_full_ea_list(&padded).unwrap().len(), 2);
        assert_eq!(parse_full_ea_list(&short), Err(0));
        let mut odd = buf.clone();
        odd[0] = 13;
        assert_eq!(parse_full_ea_list(&odd), Err(0));
        // A name without its NUL.
        let mut no_nul = buf.clone();
        no_nul[9] = b'!';
        assert_eq!(parse_full_ea_list(&no_nul), Err(0));
        assert_eq!(parse_full_ea_list(&[]), Err(0));
    }

    #[test]
    fn get_ea_lists() {
        // MS-FSCC 2.4.15.1: "A", then "BC".
        let buf = hex::decode(concat!(
            "08000000", "01", "4100", "00", "00000000", "02", "424300"
        ))
        .unwrap();
        assert_eq!(parse_get_ea_list(&buf).unwrap(), [b"A".as_slice(), b"BC"]);
        assert_eq!(parse_get_ea_list(&buf[..10]), Err(8));
        let mut bad = buf.clone();
        bad[0] = 4;
        assert_eq!(parse_get_ea_list(&bad), Err(0));
    }
}
