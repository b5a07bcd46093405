//! MS-SMB2 2.2.26 SMB2 LOCK Request (with 2.2.26.1 SMB2_LOCK_ELEMENT) and
//! 2.2.27 SMB2 LOCK Response.

use crate::codec::{Put, Reader, WireError, WireResult};
use crate::file_id::FileId;

/// MS-SMB2 2.2.26.1 SMB2_LOCK_ELEMENT Flags.
pub mod lock_flags {
    pub const SHARED_LOCK: u32 = 0x0000_0001;
    pub const EXCLUSIVE_LOCK: u32 = 0x0000_0002;
    pub const UNLOCK: u32 = 0x0000_0004;
    pub const FAIL_IMMEDIATELY: u32 = 0x0000_0010;
}

/// MS-SMB2 2.2.26.1 SMB2_LOCK_ELEMENT: one range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockElement {
    pub offset: u64,
    pub length: u64,
    pub flags: u32,
}

impl LockElement {
    const SIZE: usize = 24;
}

/// MS-SMB2 2.2.26 SMB2 LOCK Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// LockSequenceNumber (low 4 bits) and LockSequenceIndex (high 28 bits).
    pub lock_sequence: u32,
    pub file_id: FileId,
    pub locks: Vec<LockElement>,
}

impl LockRequest {
    pub const STRUCTURE_SIZE: u16 = 48;

    /// Parses the request. LockCount must be at least one (MS-SMB2 3.3.5.14:
    /// zero is STATUS_INVALID_PARAMETER, which a malformed body also gets),
    /// and every element it counts must be in the body.
    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let count = r.u16()? as usize;
        let lock_sequence = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        if count == 0 {
            return Err(WireError::Invalid("LockCount is zero"));
        }
        // The count cannot promise more elements than the body holds, so it
        // bounds the allocation below.
        if r.remaining() < count * LockElement::SIZE {
            return Err(WireError::Truncated);
        }
        let mut locks = Vec::with_capacity(count);
        for _ in 0..count {
            let offset = r.u64()?;
            let length = r.u64()?;
            let flags = r.u32()?;
            r.skip(4)?;
            locks.push(LockElement {
                offset,
                length,
                flags,
            });
        }
        Ok(LockRequest {
            lock_sequence,
            file_id,
            locks,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.locks.len() as u16);
        out.put_u32(self.lock_sequence);
        self.file_id.write(out);
        for l in &self.locks {
            out.put_u64(l.offset);
            out.put_u64(l.length);
            out.put_u32(l.flags);
            out.put_u32(0);
        }
    }
}

/// MS-SMB2 2.2.27 SMB2 LOCK Response: StructureSize 4, Reserved.
pub fn encode_lock_response(out: &mut Vec<u8>) {
    out.put_u16(4);
    out.put_u16(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A LOCK request laid out by hand from MS-SMB2 2.2.26 / 2.2.26.1.
    #[test]
    fn hand_laid_request() {
        let mut b = Vec::new();
        b.extend_from_slice(&48u16.to_le_bytes()); // 0: StructureSize
        b.extend_from_slice(&2u16.to_le_bytes()); // 2: LockCount
        b.extend_from_slice(&0x31u32.to_le_bytes()); // 4: LockSequence (index 3, number 1)
        b.extend_from_slice(&7u64.to_le_bytes()); // 8: FileId.Persistent
        b.extend_from_slice(&9u64.to_le_bytes()); // 16: FileId.Volatile
        b.extend_from_slice(&100u64.to_le_bytes()); // 24: Locks[0].Offset
        b.extend_from_slice(&10u64.to_le_bytes()); // 32: Locks[0].Length
        b.extend_from_slice(&0x12u32.to_le_bytes()); // 40: EXCLUSIVE | FAIL_IMMEDIATELY
        b.extend_from_slice(&0u32.to_le_bytes()); // 44: Reserved
        b.extend_from_slice(&u64::MAX.to_le_bytes()); // 48: Locks[1].Offset
        b.extend_from_slice(&0u64.to_le_bytes()); // 56: Locks[1].Length
        b.extend_from_slice(&0x11u32.to_le_bytes()); // 64: SHARED | FAIL_IMMEDIATELY
        b.extend_from_slice(&0u32.to_le_bytes()); // 68: Reserved
        let req = LockRequest::parse(&b).unwrap();
        assert_eq!(req.lock_sequence, 0x31);
        assert_eq!(
            req.file_id,
            FileId {
                persistent: 7,
                volatile: 9
            }
        );
        assert_eq!(
            req.locks,
            [
                LockElement {
                    offset: 100,
                    length: 10,
                    flags: 0x12
                },
                LockElement {
                    offset: u64::MAX,
                    length: 0,
                    flags: 0x11
                }
            ]
        );
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out, b);
        for cut in 0..b.len() {
            assert!(LockRequest::parse(&b[..cut]).is_err(), "prefix {cut}");
        }
    }

    #[test]
    fn zero_count_and_overstated_count_refused() {
        let mut b = Vec::new();
        b.extend_from_slice(&48u16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&[0u8; 20]);
        b.extend_from_slice(&[0u8; 24]);
        assert!(LockRequest::parse(&b).is_err());
        b[2..4].copy_from_slice(&60000u16.to_le_bytes());
        assert_eq!(LockRequest::parse(&b), Err(WireError::Truncated));
    }

    #[test]
    fn response_layout() {
        let mut out = Vec::new();
        encode_lock_response(&mut out);
        assert_eq!(out, [4, 0, 0, 0]);
    }
}
