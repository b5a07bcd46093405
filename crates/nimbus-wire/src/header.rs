//! MS-SMB2 2.2.1 SMB2 Packet Header (sync 2.2.1.2 and async 2.2.1.1 forms).

use crate::codec::{Reader, WireError, WireResult, HEADER_SIZE};
use crate::status::NtStatus;

pub const PROTOCOL_ID: [u8; 4] = [0xFE, b'S', b'M', b'B'];
/// MS-SMB2 2.2.41 SMB2 TRANSFORM_HEADER protocol id.
pub const TRANSFORM_PROTOCOL_ID: [u8; 4] = [0xFD, b'S', b'M', b'B'];
/// MS-SMB 2.2.3.1: an SMB1 message, only ever answered when it is a negotiate.
pub const SMB1_PROTOCOL_ID: [u8; 4] = [0xFF, b'S', b'M', b'B'];

/// Byte range of the Signature field inside the header.
pub const SIGNATURE_RANGE: core::ops::Range<usize> = 48..64;

/// MS-SMB2 2.2.1 Command codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Command {
    Negotiate = 0x00,
    SessionSetup = 0x01,
    Logoff = 0x02,
    TreeConnect = 0x03,
    TreeDisconnect = 0x04,
    Create = 0x05,
    Close = 0x06,
    Flush = 0x07,
    Read = 0x08,
    Write = 0x09,
    Lock = 0x0A,
    Ioctl = 0x0B,
    Cancel = 0x0C,
    Echo = 0x0D,
    QueryDirectory = 0x0E,
    ChangeNotify = 0x0F,
    QueryInfo = 0x10,
    SetInfo = 0x11,
    OplockBreak = 0x12,
}

impl Command {
    pub fn from_u16(v: u16) -> Option<Command> {
        use Command::*;
        Some(match v {
            0x00 => Negotiate,
            0x01 => SessionSetup,
            0x02 => Logoff,
            0x03 => TreeConnect,
            0x04 => TreeDisconnect,
            0x05 => Create,
            0x06 => Close,
            0x07 => Flush,
            0x08 => Read,
            0x09 => Write,
            0x0A => Lock,
            0x0B => Ioctl,
            0x0C => Cancel,
            0x0D => Echo,
            0x0E => QueryDirectory,
            0x0F => ChangeNotify,
            0x10 => QueryInfo,
            0x11 => SetInfo,
            0x12 => OplockBreak,
            _ => return None,
        })
    }
}

/// MS-SMB2 2.2.1.2 Flags field.
pub mod flags {
    pub const SERVER_TO_REDIR: u32 = 0x0000_0001;
    pub const ASYNC_COMMAND: u32 = 0x0000_0002;
    pub const RELATED_OPERATIONS: u32 = 0x0000_0004;
    pub const SIGNED: u32 = 0x0000_0008;
    pub const PRIORITY_MASK: u32 = 0x0000_0070;
    pub const DFS_OPERATIONS: u32 = 0x1000_0000;
    pub const REPLAY_OPERATION: u32 = 0x2000_0000;
}

/// The SMB2 header, sync or async. `command` stays raw so that an unknown
/// command can still be answered with STATUS_INVALID_PARAMETER.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub credit_charge: u16,
    /// Status in responses; ChannelSequence (low 16 bits) in 3.x requests.
    pub status: NtStatus,
    pub command: u16,
    /// CreditRequest in requests, CreditResponse in responses.
    pub credits: u16,
    pub flags: u32,
    pub next_command: u32,
    pub message_id: u64,
    /// Async form: AsyncId; sync form: (TreeId << 32) | ProcessId.
    pub async_id: u64,
    pub tree_id: u32,
    /// Sync form: the Reserved field (Windows' ProcessId, 0xFEFF). A
    /// response carries its request's value back, as Samba and Windows do:
    /// a client may check the signature of a response against a header
    /// with its own value there (the Rust `smb` crate does).
    pub reserved: u32,
    pub session_id: u64,
    pub signature: [u8; 16],
}

/// The Reserved value of messages that answer no request (breaks), as
/// Windows sends it.
pub const DEFAULT_RESERVED: u32 = 0xFEFF;

/// Offsets of the SMB2 headers of a compound message (MS-SMB2 3.2.4.1.4,
/// NextCommand), at most `max` of them. Lenient: it stops at the first
/// offset that does not hold a whole header with the SMB2 protocol id; the
/// strict checks of a chain (alignment, bounds) belong to the dispatcher.
pub fn chain_offsets(msg: &[u8], max: usize) -> impl Iterator<Item = usize> + '_ {
    let mut next = Some(0usize);
    core::iter::from_fn(move || {
        let off = next.take()?;
        let h = msg.get(off..off.checked_add(HEADER_SIZE)?)?;
        if h[..4] != PROTOCOL_ID {
            return None;
        }
        let step = u32::from_le_bytes([h[20], h[21], h[22], h[23]]) as usize;
        if step != 0 {
            next = off.checked_add(step);
        }
        Some(off)
    })
    .take(max)
}

impl Header {
    /// MS-SMB2 2.2.1.2: in a 3.x request the Status field holds the
    /// ChannelSequence (low 16 bits) and 16 reserved bits.
    pub fn channel_sequence(&self) -> u16 {
        self.status.0 as u16
    }

    pub fn parse(msg: &[u8]) -> WireResult<Header> {
        let mut r = Reader::new(msg);
        if r.array::<4>()? != PROTOCOL_ID {
            return Err(WireError::Invalid("protocol id"));
        }
        if r.u16()? != HEADER_SIZE as u16 {
            return Err(WireError::BadStructureSize);
        }
        let credit_charge = r.u16()?;
        let status = NtStatus(r.u32()?);
        let command = r.u16()?;
        let credits = r.u16()?;
        let flags = r.u32()?;
        let next_command = r.u32()?;
        let message_id = r.u64()?;
        let (async_id, reserved, tree_id) = if flags & flags::ASYNC_COMMAND != 0 {
            (r.u64()?, 0, 0)
        } else {
            let reserved = r.u32()?;
            (0, reserved, r.u32()?)
        };
        let session_id = r.u64()?;
        let signature = r.array()?;
        Ok(Header {
            credit_charge,
            status,
            command,
            credits,
            flags,
            next_command,
            message_id,
            async_id,
            tree_id,
            reserved,
            session_id,
            signature,
        })
    }

    pub fn is_async(&self) -> bool {
        self.flags & flags::ASYNC_COMMAND != 0
    }

    pub fn is_related(&self) -> bool {
        self.flags & flags::RELATED_OPERATIONS != 0
    }

    pub fn is_signed(&self) -> bool {
        self.flags & flags::SIGNED != 0
    }

    /// Writes the header into a reserved 64-byte slot, so a response body
    /// can be built first and its header filled in afterwards, without a
    /// temporary buffer per response.
    pub fn write_into(&self, slot: &mut [u8; HEADER_SIZE]) {
        slot[0..4].copy_from_slice(&PROTOCOL_ID);
        slot[4..6].copy_from_slice(&(HEADER_SIZE as u16).to_le_bytes());
        slot[6..8].copy_from_slice(&self.credit_charge.to_le_bytes());
        slot[8..12].copy_from_slice(&self.status.0.to_le_bytes());
        slot[12..14].copy_from_slice(&self.command.to_le_bytes());
        slot[14..16].copy_from_slice(&self.credits.to_le_bytes());
        slot[16..20].copy_from_slice(&self.flags.to_le_bytes());
        slot[20..24].copy_from_slice(&self.next_command.to_le_bytes());
        slot[24..32].copy_from_slice(&self.message_id.to_le_bytes());
        if self.is_async() {
            slot[32..40].copy_from_slice(&self.async_id.to_le_bytes());
        } else {
            // Sync form: Reserved (see the field), then TreeId.
            slot[32..36].copy_from_slice(&self.reserved.to_le_bytes());
            slot[36..40].copy_from_slice(&self.tree_id.to_le_bytes());
        }
        slot[40..48].copy_from_slice(&self.session_id.to_le_bytes());
        slot[48..64].copy_from_slice(&self.signature);
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        let mut slot = [0u8; HEADER_SIZE];
        self.write_into(&mut slot);
        out.extend_from_slice(&slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_offsets_follow_next_command() {
        let mut msg = vec![0u8; 3 * HEADER_SIZE + 16];
        for off in [0, 72, 144] {
            msg[off..off + 4].copy_from_slice(&PROTOCOL_ID);
        }
        msg[20..24].copy_from_slice(&72u32.to_le_bytes());
        msg[72 + 20..72 + 24].copy_from_slice(&72u32.to_le_bytes());
        assert_eq!(chain_offsets(&msg, 64).collect::<Vec<_>>(), [0, 72, 144]);
        assert_eq!(chain_offsets(&msg, 2).count(), 2);
        // A NextCommand pointing past the end, or at no header, ends the walk.
        msg[72 + 20..72 + 24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(chain_offsets(&msg, 64).collect::<Vec<_>>(), [0, 72]);
        assert_eq!(chain_offsets(&msg[..10], 64).count(), 0);
    }

    #[test]
    fn round_trip_sync_and_async() {
        let mut h = Header {
            credit_charge: 1,
            status: NtStatus::SUCCESS,
            command: Command::Create as u16,
            credits: 31,
            flags: flags::SIGNED | flags::RELATED_OPERATIONS,
            next_command: 0x78,
            message_id: 7,
            async_id: 0,
            tree_id: 5,
            reserved: 0x1234_5678,
            session_id: 0x1122334455667788,
            signature: [9; 16],
        };
        let mut out = Vec::new();
        h.write(&mut out);
        assert_eq!(out.len(), HEADER_SIZE);
        assert_eq!(Header::parse(&out).unwrap(), h);

        h.flags |= flags::ASYNC_COMMAND;
        h.tree_id = 0;
        h.reserved = 0;
        h.async_id = 0xABCD;
        out.clear();
        h.write(&mut out);
        assert_eq!(Header::parse(&out).unwrap(), h);
    }

    #[test]
    fn refuses_truncated_and_foreign() {
        let mut out = Vec::new();
        Header {
            credit_charge: 0,
            status: NtStatus::SUCCESS,
            command: 0,
            credits: 0,
            flags: 0,
            next_command: 0,
            message_id: 0,
            async_id: 0,
            tree_id: 0,
            reserved: 0,
            session_id: 0,
            signature: [0; 16],
        }
        .write(&mut out);
        for n in 0..HEADER_SIZE {
            assert!(Header::parse(&out[..n]).is_err());
        }
        out[0] = 0xFF;
        assert!(Header::parse(&out).is_err());
    }
}
