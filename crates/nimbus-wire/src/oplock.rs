//! Oplocks and leases on the wire: MS-SMB2 2.2.23 Oplock/Lease Break
//! Notification, 2.2.24 Acknowledgment, 2.2.25 Response, and the lease create
//! contexts 2.2.13.2.8 / 2.2.13.2.10 (request) and 2.2.14.2.10 / 2.2.14.2.11
//! (response).
//!
//! An OPLOCK_BREAK request carries either an oplock or a lease
//! acknowledgment; only its StructureSize tells which (MS-SMB2 3.3.5.22).

use crate::codec::{Put, Reader, WireError, WireResult};
use crate::file_id::FileId;

/// MS-SMB2 2.2.13 RequestedOplockLevel / 2.2.14 OplockLevel.
pub mod oplock_level {
    pub const NONE: u8 = 0x00;
    pub const II: u8 = 0x01;
    pub const EXCLUSIVE: u8 = 0x08;
    pub const BATCH: u8 = 0x09;
    pub const LEASE: u8 = 0xFF;
}

/// MS-SMB2 2.2.13.2.8 LeaseState bits.
pub mod lease_state {
    pub const NONE: u32 = 0;
    pub const READ: u32 = 0x1;
    pub const HANDLE: u32 = 0x2;
    pub const WRITE: u32 = 0x4;
}

/// MS-SMB2 2.2.13.2.10 / 2.2.14.2.10 LeaseFlags.
pub mod lease_flags {
    pub const BREAK_IN_PROGRESS: u32 = 0x2;
    pub const PARENT_LEASE_KEY_SET: u32 = 0x4;
}

/// MS-SMB2 2.2.23.2 Flags of a lease break notification.
pub const LEASE_BREAK_ACK_REQUIRED: u32 = 0x1;

/// MS-SMB2 2.2.23.1 Oplock Break Notification, 2.2.24.1 Oplock Break Acknowledgment
/// and 2.2.25.1 Oplock Break Response: one 24-byte layout.
///
/// StructureSize (2), OplockLevel (1), Reserved (1), Reserved2 (4), FileId (16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OplockBreak {
    pub oplock_level: u8,
    pub file_id: FileId,
}

impl OplockBreak {
    pub const STRUCTURE_SIZE: u16 = 24;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let oplock_level = r.u8()?;
        r.skip(1 + 4)?;
        Ok(OplockBreak {
            oplock_level,
            file_id: FileId::read(&mut r)?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(self.oplock_level);
        out.put_u8(0);
        out.put_u32(0);
        self.file_id.write(out);
    }
}

/// MS-SMB2 2.2.23.2 Lease Break Notification (StructureSize 44).
///
/// StructureSize (2), NewEpoch (2), Flags (4), LeaseKey (16),
/// CurrentLeaseState (4), NewLeaseState (4), BreakReason (4),
/// AccessMaskHint (4), ShareMaskHint (4). The last three are reserved and
/// written as 0; parsing ignores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseBreakNotification {
    /// Only meaningful for SMB 3.x; 0 for SMB 2.1.
    pub new_epoch: u16,
    /// `LEASE_BREAK_ACK_REQUIRED` or 0.
    pub flags: u32,
    pub lease_key: [u8; 16],
    pub current_state: u32,
    pub new_state: u32,
}

impl LeaseBreakNotification {
    pub const STRUCTURE_SIZE: u16 = 44;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let new_epoch = r.u16()?;
        let flags = r.u32()?;
        let lease_key = r.array()?;
        let current_state = r.u32()?;
        let new_state = r.u32()?;
        // BreakReason, AccessMaskHint, ShareMaskHint.
        r.skip(3 * 4)?;
        Ok(LeaseBreakNotification {
            new_epoch,
            flags,
            lease_key,
            current_state,
            new_state,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(self.new_epoch);
        out.put_u32(self.flags);
        out.extend_from_slice(&self.lease_key);
        out.put_u32(self.current_state);
        out.put_u32(self.new_state);
        out.put_zeros(3 * 4);
    }
}

/// MS-SMB2 2.2.24.2 Lease Break Acknowledgment and 2.2.25.2 Lease Break Response (StructureSize 36).
///
/// StructureSize (2), Reserved (2), Flags (4), LeaseKey (16), LeaseState (4),
/// LeaseDuration (8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseBreakAck {
    /// Reserved by the spec (the receiver ignores it); kept as read.
    pub flags: u32,
    pub lease_key: [u8; 16],
    pub lease_state: u32,
    /// Reserved by the spec; kept as read.
    pub lease_duration: u64,
}

impl LeaseBreakAck {
    pub const STRUCTURE_SIZE: u16 = 36;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        r.skip(2)?;
        Ok(LeaseBreakAck {
            flags: r.u32()?,
            lease_key: r.array()?,
            lease_state: r.u32()?,
            lease_duration: r.u64()?,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(0);
        out.put_u32(self.flags);
        out.extend_from_slice(&self.lease_key);
        out.put_u32(self.lease_state);
        out.put_u64(self.lease_duration);
    }
}

/// What an OPLOCK_BREAK request carries, told apart by StructureSize (MS-SMB2 3.3.5.22).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakAck {
    Oplock(OplockBreak),
    Lease(LeaseBreakAck),
}

impl BreakAck {
    /// StructureSize 24 is an oplock acknowledgment, 36 a lease one; any
    /// other is `WireError::Invalid`, which the server answers with
    /// STATUS_INVALID_PARAMETER (MS-SMB2 3.3.5.22).
    pub fn parse(body: &[u8]) -> WireResult<Self> {
        match Reader::new(body).u16()? {
            OplockBreak::STRUCTURE_SIZE => OplockBreak::parse(body).map(BreakAck::Oplock),
            LeaseBreakAck::STRUCTURE_SIZE => LeaseBreakAck::parse(body).map(BreakAck::Lease),
            _ => Err(WireError::Invalid("OPLOCK_BREAK StructureSize")),
        }
    }
}

/// MS-SMB2 2.2.13.2.8 SMB2_CREATE_REQUEST_LEASE (32 bytes, v1) and 2.2.13.2.10
/// SMB2_CREATE_REQUEST_LEASE_V2 (52 bytes); the responses 2.2.14.2.10 / 2.2.14.2.11 have the same layouts.
///
/// v1: LeaseKey (16), LeaseState (4), LeaseFlags (4), LeaseDuration (8).
/// v2 appends ParentLeaseKey (16), Epoch (2), Reserved (2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseContext {
    /// 1 or 2, from the data length when parsed.
    pub version: u8,
    pub lease_key: [u8; 16],
    /// `lease_state` bits.
    pub state: u32,
    /// `lease_flags` bits.
    pub flags: u32,
    /// Reserved by the spec (sent as 0); kept as read.
    pub duration: u64,
    /// v2 only, zero in v1.
    pub parent_key: [u8; 16],
    /// v2 only, zero in v1.
    pub epoch: u16,
}

impl LeaseContext {
    /// Length of the v1 data (2.2.13.2.8).
    pub const V1_LEN: usize = 32;
    /// Length of the v2 data (2.2.13.2.10).
    pub const V2_LEN: usize = 52;

    /// The version comes from the data length: 52 bytes or more is v2, 32
    /// to 51 bytes is v1 (bytes past the form are ignored), anything
    /// shorter is `WireError::Truncated`.
    pub fn parse(data: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(data);
        let lease_key = r.array()?;
        let state = r.u32()?;
        let flags = r.u32()?;
        let duration = r.u64()?;
        let (version, parent_key, epoch) = if data.len() >= Self::V2_LEN {
            let parent_key = r.array()?;
            let epoch = r.u16()?;
            r.skip(2)?;
            (2, parent_key, epoch)
        } else {
            (1, [0; 16], 0)
        };
        Ok(LeaseContext {
            version,
            lease_key,
            state,
            flags,
            duration,
            parent_key,
            epoch,
        })
    }

    /// Writes the 32- or 52-byte form according to `version` (2 gives the
    /// 52-byte form, anything else the 32-byte one).
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.lease_key);
        out.put_u32(self.state);
        out.put_u32(self.flags);
        out.put_u64(self.duration);
        if self.version == 2 {
            out.extend_from_slice(&self.parent_key);
            out.put_u16(self.epoch);
            out.put_u16(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 16] = [
        0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E,
        0x1F,
    ];
    const PARENT: [u8; 16] = [0xA5; 16];

    fn encoded(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = Vec::new();
        f(&mut out);
        out
    }

    /// Every proper prefix is refused, and none panics.
    fn all_prefixes_refused<T>(b: &[u8], parse: fn(&[u8]) -> WireResult<T>) {
        for cut in 0..b.len() {
            assert!(parse(&b[..cut]).is_err(), "prefix {cut}");
        }
    }

    /// Oplock break acknowledgment laid out by hand from MS-SMB2 2.2.24.1.
    #[test]
    fn hand_laid_oplock_break() {
        let mut b = Vec::new();
        b.extend_from_slice(&24u16.to_le_bytes()); // 0: StructureSize
        b.push(0x01); // 2: OplockLevel (II)
        b.push(0xEE); // 3: Reserved (ignored)
        b.extend_from_slice(&0xDEAD_BEEFu32.to_le_bytes()); // 4: Reserved2 (ignored)
        b.extend_from_slice(&7u64.to_le_bytes()); // 8: FileId.Persistent
        b.extend_from_slice(&9u64.to_le_bytes()); // 16: FileId.Volatile
        assert_eq!(b.len(), 24);
        let ob = OplockBreak::parse(&b).unwrap();
        assert_eq!(ob.oplock_level, oplock_level::II);
        assert_eq!(
            ob.file_id,
            FileId {
                persistent: 7,
                volatile: 9
            }
        );
        // Encoding writes the reserved fields as zero.
        let out = encoded(|o| ob.encode(o));
        b[3] = 0;
        b[4..8].fill(0);
        assert_eq!(out, b);
        all_prefixes_refused(&b, OplockBreak::parse);
    }

    /// Lease break notification laid out by hand from MS-SMB2 2.2.23.2.
    #[test]
    fn hand_laid_lease_break_notification() {
        let mut b = Vec::new();
        b.extend_from_slice(&44u16.to_le_bytes()); // 0: StructureSize
        b.extend_from_slice(&3u16.to_le_bytes()); // 2: NewEpoch
        b.extend_from_slice(&1u32.to_le_bytes()); // 4: Flags (ACK_REQUIRED)
        b.extend_from_slice(&KEY); // 8: LeaseKey
        b.extend_from_slice(&7u32.to_le_bytes()); // 24: CurrentLeaseState (RWH)
        b.extend_from_slice(&3u32.to_le_bytes()); // 28: NewLeaseState (RH)
        b.extend_from_slice(&0u32.to_le_bytes()); // 32: BreakReason
        b.extend_from_slice(&0u32.to_le_bytes()); // 36: AccessMaskHint
        b.extend_from_slice(&0u32.to_le_bytes()); // 40: ShareMaskHint
        assert_eq!(b.len(), 44);
        let n = LeaseBreakNotification::parse(&b).unwrap();
        assert_eq!(n.new_epoch, 3);
        assert_eq!(n.flags, LEASE_BREAK_ACK_REQUIRED);
        assert_eq!(n.lease_key, KEY);
        assert_eq!(
            n.current_state,
            lease_state::READ | lease_state::HANDLE | lease_state::WRITE
        );
        assert_eq!(n.new_state, lease_state::READ | lease_state::HANDLE);
        assert_eq!(encoded(|o| n.encode(o)), b);
        all_prefixes_refused(&b, LeaseBreakNotification::parse);
    }

    /// Lease break acknowledgment laid out by hand from MS-SMB2 2.2.24.2.
    #[test]
    fn hand_laid_lease_break_ack() {
        let mut b = Vec::new();
        b.extend_from_slice(&36u16.to_le_bytes()); // 0: StructureSize
        b.extend_from_slice(&0u16.to_le_bytes()); // 2: Reserved
        b.extend_from_slice(&0u32.to_le_bytes()); // 4: Flags
        b.extend_from_slice(&KEY); // 8: LeaseKey
        b.extend_from_slice(&1u32.to_le_bytes()); // 24: LeaseState (R)
        b.extend_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes()); // 28: LeaseDuration
        assert_eq!(b.len(), 36);
        let a = LeaseBreakAck::parse(&b).unwrap();
        assert_eq!(
            a,
            LeaseBreakAck {
                flags: 0,
                lease_key: KEY,
                lease_state: lease_state::READ,
                lease_duration: 0x0102_0304_0506_0708,
            }
        );
        assert_eq!(encoded(|o| a.encode(o)), b);
        all_prefixes_refused(&b, LeaseBreakAck::parse);
    }

    /// SMB2_CREATE_REQUEST_LEASE laid out by hand from MS-SMB2 2.2.13.2.8.
    #[test]
    fn hand_laid_lease_context_v1() {
        let mut b = Vec::new();
        b.extend_from_slice(&KEY); // 0: LeaseKey
        b.extend_from_slice(&5u32.to_le_bytes()); // 16: LeaseState (RW)
        b.extend_from_slice(&2u32.to_le_bytes()); // 20: LeaseFlags (BREAK_IN_PROGRESS)
        b.extend_from_slice(&0u64.to_le_bytes()); // 24: LeaseDuration
        assert_eq!(b.len(), LeaseContext::V1_LEN);
        let c = LeaseContext::parse(&b).unwrap();
        assert_eq!(
            c,
            LeaseContext {
                version: 1,
                lease_key: KEY,
                state: lease_state::READ | lease_state::WRITE,
                flags: lease_flags::BREAK_IN_PROGRESS,
                duration: 0,
                parent_key: [0; 16],
                epoch: 0,
            }
        );
        assert_eq!(encoded(|o| c.encode(o)), b);
        for cut in 0..b.len() {
            assert_eq!(LeaseContext::parse(&b[..cut]), Err(WireError::Truncated));
        }
    }

    /// SMB2_CREATE_REQUEST_LEASE_V2 laid out by hand from MS-SMB2 2.2.13.2.10.
    #[test]
    fn hand_laid_lease_context_v2() {
        let mut b = Vec::new();
        b.extend_from_slice(&KEY); // 0: LeaseKey
        b.extend_from_slice(&7u32.to_le_bytes()); // 16: LeaseState (RWH)
        b.extend_from_slice(&4u32.to_le_bytes()); // 20: Flags (PARENT_LEASE_KEY_SET)
        b.extend_from_slice(&0u64.to_le_bytes()); // 24: LeaseDuration
        b.extend_from_slice(&PARENT); // 32: ParentLeaseKey
        b.extend_from_slice(&0x1234u16.to_le_bytes()); // 48: Epoch
        b.extend_from_slice(&0u16.to_le_bytes()); // 50: Reserved
        assert_eq!(b.len(), LeaseContext::V2_LEN);
        let c = LeaseContext::parse(&b).unwrap();
        assert_eq!(c.version, 2);
        assert_eq!(c.lease_key, KEY);
        assert_eq!(c.state, 7);
        assert_eq!(c.flags, lease_flags::PARENT_LEASE_KEY_SET);
        assert_eq!(c.duration, 0);
        assert_eq!(c.parent_key, PARENT);
        assert_eq!(c.epoch, 0x1234);
        assert_eq!(encoded(|o| c.encode(o)), b);

        // Shorter than v1: truncated. From 32 up to 51 bytes: read as v1.
        for cut in 0..b.len() {
            let got = LeaseContext::parse(&b[..cut]);
            if cut < LeaseContext::V1_LEN {
                assert_eq!(got, Err(WireError::Truncated), "prefix {cut}");
            } else {
                let v1 = got.unwrap();
                assert_eq!((v1.version, v1.parent_key, v1.epoch), (1, [0; 16], 0));
                assert_eq!((v1.lease_key, v1.state), (KEY, 7));
            }
        }
        // Trailing bytes past the v2 form are ignored.
        let mut longer = b.clone();
        longer.extend_from_slice(&[0xFF; 8]);
        assert_eq!(LeaseContext::parse(&longer), Ok(c));
    }

    #[test]
    fn lease_context_encode_follows_version() {
        let v2 = LeaseContext {
            version: 2,
            lease_key: KEY,
            state: lease_state::READ,
            flags: lease_flags::PARENT_LEASE_KEY_SET,
            duration: 0,
            parent_key: PARENT,
            epoch: 9,
        };
        let v1 = LeaseContext { version: 1, ..v2 };
        let b2 = encoded(|o| v2.encode(o));
        let b1 = encoded(|o| v1.encode(o));
        assert_eq!(b2.len(), LeaseContext::V2_LEN);
        assert_eq!(b1.len(), LeaseContext::V1_LEN);
        assert_eq!(b2[..32], b1[..]);
        assert_eq!(LeaseContext::parse(&b2), Ok(v2));
        // v1 drops the v2-only fields.
        assert_eq!(
            LeaseContext::parse(&b1),
            Ok(LeaseContext {
                parent_key: [0; 16],
                epoch: 0,
                ..v1
            })
        );
    }

    #[test]
    fn break_ack_dispatches_on_structure_size() {
        let ob = OplockBreak {
            oplock_level: oplock_level::NONE,
            file_id: FileId {
                persistent: 1,
                volatile: 2,
            },
        };
        let la = LeaseBreakAck {
            flags: 0,
            lease_key: KEY,
            lease_state: lease_state::NONE,
            lease_duration: 0,
        };
        let ob_bytes = encoded(|o| ob.encode(o));
        let la_bytes = encoded(|o| la.encode(o));
        assert_eq!(BreakAck::parse(&ob_bytes), Ok(BreakAck::Oplock(ob)));
        assert_eq!(BreakAck::parse(&la_bytes), Ok(BreakAck::Lease(la)));

        // Any other StructureSize, including the notification's 44.
        for size in [0u16, 4, 23, 25, 35, 37, 44, 0xFFFF] {
            let mut b = la_bytes.clone();
            b[..2].copy_from_slice(&size.to_le_bytes());
            assert!(
                matches!(BreakAck::parse(&b), Err(WireError::Invalid(_))),
                "StructureSize {size}"
            );
        }
        // A body cut short is truncated, whichever form it announces.
        for b in [&ob_bytes, &la_bytes] {
            for cut in 0..b.len() {
                assert_eq!(BreakAck::parse(&b[..cut]), Err(WireError::Truncated));
            }
        }
    }

    #[test]
    fn wrong_structure_size_refused() {
        let mut b = encoded(|o| {
            OplockBreak {
                oplock_level: oplock_level::BATCH,
                file_id: FileId::default(),
            }
            .encode(o)
        });
        b[0] = 36;
        assert_eq!(OplockBreak::parse(&b), Err(WireError::BadStructureSize));
        let mut b = encoded(|o| {
            LeaseBreakAck {
                flags: 0,
                lease_key: KEY,
                lease_state: 0,
                lease_duration: 0,
            }
            .encode(o)
        });
        b[0] = 24;
        assert_eq!(LeaseBreakAck::parse(&b), Err(WireError::BadStructureSize));
    }
}
