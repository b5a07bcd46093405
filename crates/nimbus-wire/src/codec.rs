//! Bounds-checked little-endian readers and writers shared by every message codec.
//!
//! Every read returns `WireError` instead of panicking, so a hostile or truncated
//! message can never take the server down.

use core::fmt;

/// Why a message could not be decoded. The server answers these with
/// STATUS_INVALID_PARAMETER (or drops the connection for framing errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireError {
    /// The message ended before a field.
    Truncated,
    /// A field holds a value the spec does not allow here.
    Invalid(&'static str),
    /// A StructureSize field does not match the command.
    BadStructureSize,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated => write!(f, "message truncated"),
            WireError::Invalid(what) => write!(f, "invalid field: {what}"),
            WireError::BadStructureSize => write!(f, "bad StructureSize"),
        }
    }
}

impl std::error::Error for WireError {}

pub type WireResult<T> = Result<T, WireError>;

/// Size of the SMB2 sync/async header (MS-SMB2 2.2.1). Buffer offsets in
/// message bodies count from the start of this header.
pub const HEADER_SIZE: usize = 64;

/// A cursor over a byte slice.
#[derive(Clone, Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn bytes(&mut self, n: usize) -> WireResult<&'a [u8]> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let out = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(out)
    }

    pub fn skip(&mut self, n: usize) -> WireResult<()> {
        self.bytes(n).map(|_| ())
    }

    pub fn array<const N: usize>(&mut self) -> WireResult<[u8; N]> {
        let b = self.bytes(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub fn u8(&mut self) -> WireResult<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16(&mut self) -> WireResult<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32(&mut self) -> WireResult<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> WireResult<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// Checks the StructureSize field every request body starts with.
    pub fn structure_size(&mut self, expected: u16) -> WireResult<()> {
        if self.u16()? == expected {
            Ok(())
        } else {
            Err(WireError::BadStructureSize)
        }
    }
}

/// Returns the `len` bytes at header-relative `offset` inside `body`
/// (the message without its 64-byte header). A zero length yields an empty
/// slice whatever the offset, as clients often send offset 0 with length 0.
pub fn body_buffer(body: &[u8], offset: usize, len: usize) -> WireResult<&[u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    let start = offset
        .checked_sub(HEADER_SIZE)
        .ok_or(WireError::Invalid("buffer offset inside header"))?;
    let end = start.checked_add(len).ok_or(WireError::Truncated)?;
    body.get(start..end).ok_or(WireError::Truncated)
}

/// Appends little-endian fields to a Vec.
pub trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_zeros(&mut self, n: usize);
    /// Pads with zeros until the length is a multiple of `align`.
    fn align_to(&mut self, align: usize);
    /// Pads with zeros until the length past `base` is a multiple of `align`.
    fn align_to_from(&mut self, base: usize, align: usize);
    /// Overwrites a u32 at `at` (for lengths and offsets known only later).
    fn patch_u32(&mut self, at: usize, v: u32);
    fn patch_u16(&mut self, at: usize, v: u16);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_zeros(&mut self, n: usize) {
        self.resize(self.len() + n, 0);
    }
    fn align_to(&mut self, align: usize) {
        let rem = self.len() % align;
        if rem != 0 {
            self.put_zeros(align - rem);
        }
    }
    fn align_to_from(&mut self, base: usize, align: usize) {
        let rem = (self.len() - base) % align;
        if rem != 0 {
            self.put_zeros(align - rem);
        }
    }
    fn patch_u32(&mut self, at: usize, v: u32) {
        self[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn patch_u16(&mut self, at: usize, v: u16) {
        self[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
}

/// Decodes UTF-16LE as used for every name on the wire. Unpaired surrogates
/// are refused rather than replaced, so that two different wire names never
/// map to the same file.
pub fn utf16le_to_string(bytes: &[u8]) -> WireResult<String> {
    if !bytes.len().is_multiple_of(2) {
        return Err(WireError::Invalid("odd UTF-16 length"));
    }
    let units = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]));
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .map_err(|_| WireError::Invalid("unpaired surrogate in name"))
}

pub fn put_utf16le(out: &mut Vec<u8>, s: &str) {
    for u in s.encode_utf16() {
        out.put_u16(u);
    }
}

pub fn utf16le(s: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len() * 2);
    put_utf16le(&mut v, s);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_refuses_overrun() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16().unwrap(), 0x0201);
        assert_eq!(r.u16(), Err(WireError::Truncated));
        assert_eq!(r.bytes(usize::MAX), Err(WireError::Truncated));
    }

    #[test]
    fn body_buffer_bounds() {
        let body = [0u8; 10];
        assert!(body_buffer(&body, 64, 10).is_ok());
        assert!(body_buffer(&body, 65, 10).is_err());
        assert!(body_buffer(&body, 10, 1).is_err());
        assert_eq!(body_buffer(&body, 0, 0).unwrap(), &[] as &[u8]);
    }

    #[test]
    fn utf16_round_trip_and_surrogates() {
        let s = "a\u{e9}\u{1F600}";
        assert_eq!(utf16le_to_string(&utf16le(s)).unwrap(), s);
        assert!(utf16le_to_string(&[0x00, 0xD8]).is_err());
        assert!(utf16le_to_string(&[0x41]).is_err());
    }
}
