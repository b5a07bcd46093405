//! NDR 2.0 (C706 chapter 14, as MS-RPCE 2.2.5 profiles it): little-endian
//! integers aligned to their size, unique pointers as referent ids with
//! the pointee deferred, conformant varying strings. Only what the
//! interfaces of this crate marshal.
//!
//! Alignment is relative to the start of the stub data, which every PDU
//! places at an 8-aligned offset.

use nimbus_wire::dtyp::Sid;

use crate::RpcError;

/// Longest string accepted from a client, in UTF-16 code units. Server,
/// share and computer names are far shorter (share names: 80).
pub const MAX_STRING_UNITS: u32 = 1024;

/// Builds a stub. Referent ids of unique pointers count up from
/// 0x00020000, as Windows numbers them; any non-zero value is valid.
pub struct Writer {
    buf: Vec<u8>,
    next_referent: u32,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new()
    }
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            buf: Vec::new(),
            next_referent: 0x0002_0000,
        }
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn align(&mut self, n: usize) {
        let pad = (n - self.buf.len() % n) % n;
        self.buf.resize(self.buf.len() + pad, 0);
    }

    pub fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u16(&mut self, v: u16) {
        self.align(2);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    /// Bytes as they are (a context handle, a GUID).
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }

    /// MS-DTYP 2.3.10 RPC_UNICODE_STRING where it stands: Length and
    /// MaximumLength in bytes, then the pointer to the units, which NDR
    /// defers (`unicode_string_units`). An empty string still points to
    /// an empty array.
    pub fn unicode_string_header(&mut self, s: &str) {
        let bytes = (s.encode_utf16().count() * 2).min(u16::MAX as usize - 1) as u16;
        // The structure holds a pointer: it is 4-aligned, whatever precedes
        // it (a 16-bit SID_NAME_USE in a translated name).
        self.align(4);
        self.u16(bytes);
        self.u16(bytes);
        self.pointer();
    }

    /// The deferred units of an RPC_UNICODE_STRING: a conformant varying
    /// array, no terminating NUL.
    pub fn unicode_string_units(&mut self, s: &str) {
        let units: Vec<u16> = s.encode_utf16().take(u16::MAX as usize / 2).collect();
        self.u32(units.len() as u32);
        self.u32(0);
        self.u32(units.len() as u32);
        for u in units {
            self.buf.extend_from_slice(&u.to_le_bytes());
        }
    }

    /// MS-DTYP 2.4.2.3 RPC_SID, a conformant structure: the count of
    /// sub-authorities first, as its conformance.
    pub fn sid(&mut self, sid: &Sid) {
        self.u32(sid.sub_authorities.len() as u32);
        self.u8(1);
        self.u8(sid.sub_authorities.len() as u8);
        self.bytes(&sid.authority.to_be_bytes()[2..]);
        for s in &sid.sub_authorities {
            self.u32(*s);
        }
    }

    /// A non-null unique (or full) pointer: its referent id. The caller
    /// writes the pointee where NDR defers it.
    pub fn pointer(&mut self) {
        let id = self.next_referent;
        self.next_referent = self.next_referent.wrapping_add(4);
        self.u32(id);
    }

    pub fn null_pointer(&mut self) {
        self.u32(0);
    }

    /// A `[string] wchar_t*` pointee: MaximumCount, Offset 0, ActualCount,
    /// then the UTF-16LE units with their terminating NUL.
    pub fn wstring(&mut self, s: &str) {
        let units: Vec<u16> = s.encode_utf16().chain(std::iter::once(0)).collect();
        self.u32(units.len() as u32);
        self.u32(0);
        self.u32(units.len() as u32);
        for u in units {
            self.buf.extend_from_slice(&u.to_le_bytes());
        }
    }

    /// A unique pointer to a string, written in place (a top-level
    /// parameter, whose pointee follows it at once).
    pub fn wstring_pointer(&mut self, s: &str) {
        self.pointer();
        self.wstring(s);
    }
}

/// Reads a stub; every read is bounds-checked and every count is judged
/// before anything is allocated from it.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    fn align(&mut self, n: usize) -> Result<(), RpcError> {
        let pad = (n - self.pos % n) % n;
        self.take(pad).map(|_| ())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RpcError> {
        let end = self.pos.checked_add(n).ok_or(RpcError::BadStub)?;
        let bytes = self.buf.get(self.pos..end).ok_or(RpcError::BadStub)?;
        self.pos = end;
        Ok(bytes)
    }

    pub fn u32(&mut self) -> Result<u32, RpcError> {
        self.align(4)?;
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u16(&mut self) -> Result<u16, RpcError> {
        self.align(2)?;
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u8(&mut self) -> Result<u8, RpcError> {
        Ok(self.take(1)?[0])
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], RpcError> {
        self.take(n)
    }

    /// Bytes not read yet: what bounds any count the stub announces.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// An RPC_UNICODE_STRING where it stands: (Length, MaximumLength,
    /// whether its units follow where NDR defers them).
    pub fn unicode_string_header(&mut self) -> Result<(u16, u16, bool), RpcError> {
        self.align(4)?;
        let len = self.u16()?;
        let max = self.u16()?;
        let present = self.pointer()?;
        if len > max || len % 2 != 0 {
            return Err(RpcError::BadStub);
        }
        Ok((len, max, present))
    }

    /// The deferred units of an RPC_UNICODE_STRING whose header gave
    /// `len` bytes.
    pub fn unicode_string_units(&mut self, len: u16) -> Result<String, RpcError> {
        let max = self.u32()?;
        let offset = self.u32()?;
        let actual = self.u32()?;
        if max > MAX_STRING_UNITS || offset != 0 || actual > max || actual * 2 != u32::from(len) {
            return Err(RpcError::BadStub);
        }
        let bytes = self.take(actual as usize * 2)?;
        let units: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        String::from_utf16(&units).map_err(|_| RpcError::BadStub)
    }

    /// An RPC_SID (see `Writer::sid`); at most 15 sub-authorities, as
    /// MS-DTYP 2.4.2.2 allows.
    pub fn sid(&mut self) -> Result<Sid, RpcError> {
        let conformance = self.u32()?;
        let revision = self.u8()?;
        let count = self.u8()?;
        if revision != 1 || count > 15 || u32::from(count) != conformance {
            return Err(RpcError::BadStub);
        }
        let auth = self.take(6)?;
        let mut authority = [0u8; 8];
        authority[2..].copy_from_slice(auth);
        let sub_authorities = (0..count)
            .map(|_| self.u32())
            .collect::<Result<Vec<u32>, RpcError>>()?;
        Ok(Sid {
            authority: u64::from_be_bytes(authority),
            sub_authorities,
        })
    }

    /// A unique pointer's referent id: whether a pointee follows.
    pub fn pointer(&mut self) -> Result<bool, RpcError> {
        Ok(self.u32()? != 0)
    }

    /// A `[string] wchar_t*` pointee (see `Writer::wstring`), without its
    /// terminating NUL.
    pub fn wstring(&mut self) -> Result<String, RpcError> {
        let max = self.u32()?;
        let offset = self.u32()?;
        let actual = self.u32()?;
        // C706 14.3.3.4: the varying part lies within the conformant one.
        if max > MAX_STRING_UNITS || offset != 0 || actual > max {
            return Err(RpcError::BadStub);
        }
        let bytes = self.take(actual as usize * 2)?;
        let mut units: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if units.last() == Some(&0) {
            units.pop();
        }
        String::from_utf16(&units).map_err(|_| RpcError::BadStub)
    }

    /// A unique pointer to a string, pointee in place: None when null.
    pub fn wstring_pointer(&mut self) -> Result<Option<String>, RpcError> {
        if self.pointer()? {
            self.wstring().map(Some)
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_pointer_is_referent_counts_and_units_padded_to_four() {
        let mut w = Writer::new();
        w.wstring_pointer("IPC$");
        w.u32(7);
        assert_eq!(
            hex::encode(w.into_bytes()),
            concat!(
                "00000200",
                "05000000",
                "00000000",
                "05000000",
                "490050004300240000000000", // I P C $ NUL, then 2 bytes of padding
                "07000000"
            )
        );
    }

    #[test]
    fn strings_read_back() {
        let mut w = Writer::new();
        w.wstring_pointer("données");
        w.null_pointer();
        let bytes = w.into_bytes();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.wstring_pointer().unwrap().as_deref(), Some("données"));
        assert_eq!(r.wstring_pointer().unwrap(), None);
        assert!(r.u32().is_err());
    }

    #[test]
    fn bad_counts_are_refused() {
        for (max, offset, actual) in [
            (4, 0, 5),
            (4, 1, 3),
            (MAX_STRING_UNITS + 1, 0, 1),
            (9, 0, 9),
        ] {
            let mut w = Writer::new();
            w.u32(max);
            w.u32(offset);
            w.u32(actual);
            w.u32(0x0041_0041);
            let bytes = w.into_bytes();
            assert!(
                Reader::new(&bytes).wstring().is_err(),
                "{max} {offset} {actual}"
            );
        }
    }
}
