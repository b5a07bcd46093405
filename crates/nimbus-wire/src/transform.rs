//! SMB2 TRANSFORM_HEADER (MS-SMB2 2.2.41): the 52-byte header in front of an
//! encrypted message. Parsing and layout only; the cipher is applied by the
//! server's connection security layer.

use std::ops::Range;

use crate::codec::{Reader, WireError, WireResult};
use crate::header::TRANSFORM_PROTOCOL_ID;

/// Size of the TRANSFORM header.
pub const TRANSFORM_HEADER_SIZE: usize = 52;
/// The Signature field: the AEAD tag.
pub const TAG_RANGE: Range<usize> = 4..20;
/// The bytes the AEAD authenticates without encrypting: from Nonce through
/// SessionId (MS-SMB2 3.1.4.3).
pub const AAD_RANGE: Range<usize> = 20..52;
/// Flags (3.1.1) / EncryptionAlgorithm (3.0, 3.0.2): both say "encrypted"
/// with the value 0x0001, whatever the cipher.
pub const FLAG_ENCRYPTED: u16 = 0x0001;

/// MS-SMB2 2.2.41 SMB2 TRANSFORM_HEADER.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformHeader {
    pub signature: [u8; 16],
    /// 11 bytes used by CCM, 12 by GCM; the rest must be zero.
    pub nonce: [u8; 16],
    /// Size of the SMB2 message(s) that follow, before encryption.
    pub original_message_size: u32,
    pub flags: u16,
    pub session_id: u64,
}

impl TransformHeader {
    /// Parses the first 52 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> WireResult<TransformHeader> {
        let mut r = Reader::new(buf);
        if r.array::<4>()? != TRANSFORM_PROTOCOL_ID {
            return Err(WireError::Invalid("transform protocol id"));
        }
        let signature = r.array::<16>()?;
        let nonce = r.array::<16>()?;
        let original_message_size = r.u32()?;
        let _reserved = r.u16()?;
        let flags = r.u16()?;
        let session_id = r.u64()?;
        Ok(TransformHeader {
            signature,
            nonce,
            original_message_size,
            flags,
            session_id,
        })
    }

    /// Writes the header into its 52-byte slot.
    pub fn write_into(&self, slot: &mut [u8; TRANSFORM_HEADER_SIZE]) {
        slot[0..4].copy_from_slice(&TRANSFORM_PROTOCOL_ID);
        slot[TAG_RANGE].copy_from_slice(&self.signature);
        slot[20..36].copy_from_slice(&self.nonce);
        slot[36..40].copy_from_slice(&self.original_message_size.to_le_bytes());
        slot[40..42].copy_from_slice(&[0, 0]);
        slot[42..44].copy_from_slice(&self.flags.to_le_bytes());
        slot[44..52].copy_from_slice(&self.session_id.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field offsets as MS-SMB2 2.2.41 lays them out.
    #[test]
    fn round_trip_and_layout() {
        let hdr = TransformHeader {
            signature: [0xAA; 16],
            nonce: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 0, 0, 0, 0],
            original_message_size: 0x74,
            flags: FLAG_ENCRYPTED,
            session_id: 0x8e40014000011,
        };
        let mut slot = [0u8; TRANSFORM_HEADER_SIZE];
        hdr.write_into(&mut slot);
        assert_eq!(&slot[..4], b"\xfdSMB");
        assert_eq!(&slot[36..40], &[0x74, 0, 0, 0]);
        assert_eq!(&slot[42..44], &[1, 0]);
        assert_eq!(&slot[44..52], &0x8e40014000011u64.to_le_bytes());
        assert_eq!(&slot[AAD_RANGE][..11], &hdr.nonce[..11]);
        assert_eq!(TransformHeader::parse(&slot).unwrap(), hdr);
    }

    #[test]
    fn refuses_short_or_foreign_input() {
        let mut slot = [0u8; TRANSFORM_HEADER_SIZE];
        TransformHeader {
            signature: [0; 16],
            nonce: [0; 16],
            original_message_size: 0,
            flags: 1,
            session_id: 1,
        }
        .write_into(&mut slot);
        for n in 0..TRANSFORM_HEADER_SIZE {
            assert!(TransformHeader::parse(&slot[..n]).is_err(), "{n}");
        }
        slot[0] = 0xFE;
        assert!(TransformHeader::parse(&slot).is_err());
    }
}
