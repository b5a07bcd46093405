//! MS-SMB2 2.2.19 SMB2 READ Request and 2.2.20 Response.

use crate::codec::{Put, Reader, WireResult, HEADER_SIZE};
use crate::file_id::FileId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    pub flags: u8,
    pub length: u32,
    pub offset: u64,
    pub file_id: FileId,
    pub minimum_count: u32,
}

impl ReadRequest {
    pub const STRUCTURE_SIZE: u16 = 49;

    pub fn parse(body: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        let _padding = r.u8()?;
        let flags = r.u8()?;
        let length = r.u32()?;
        let offset = r.u64()?;
        let file_id = FileId::read(&mut r)?;
        let minimum_count = r.u32()?;
        // Channel, RemainingBytes and the channel info matter only for RDMA,
        // but belong to the fixed part: a body without them is truncated.
        let _channel = r.u32()?;
        let _remaining_bytes = r.u32()?;
        let _read_channel_info_offset = r.u16()?;
        let _read_channel_info_length = r.u16()?;
        Ok(ReadRequest {
            flags,
            length,
            offset,
            file_id,
            minimum_count,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u8(0);
        out.put_u8(self.flags);
        out.put_u32(self.length);
        out.put_u64(self.offset);
        self.file_id.write(out);
        out.put_u32(self.minimum_count);
        out.put_u32(0);
        out.put_u32(0);
        out.put_u16(0);
        out.put_u16(0);
        out.put_u8(0);
    }
}

/// Size of the READ response body before its data.
pub const READ_RESPONSE_FIXED: usize = 16;

/// Writes the 16-byte READ response body; the data follows directly, at
/// header offset 80, so the file can be read straight into the send buffer.
pub fn encode_read_response_head(out: &mut Vec<u8>, data_length: u32) {
    out.put_u16(17);
    out.put_u8((HEADER_SIZE + READ_RESPONSE_FIXED) as u8);
    out.put_u8(0);
    out.put_u32(data_length);
    out.put_u32(0); // DataRemaining
    out.put_u32(0); // Flags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let req = ReadRequest {
            flags: 0,
            length: 65536,
            offset: 1 << 40,
            file_id: FileId {
                persistent: 3,
                volatile: 4,
            },
            minimum_count: 0,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out.len(), 49);
        assert_eq!(ReadRequest::parse(&out).unwrap(), req);
        let mut resp = Vec::new();
        encode_read_response_head(&mut resp, 10);
        assert_eq!(resp.len(), READ_RESPONSE_FIXED);
        assert_eq!(resp[2], 80);
    }

    /// A READ request laid out by hand from MS-SMB2 2.2.19 (offsets from
    /// the start of the body, which follows the 64-byte header).
    const READ_REQUEST: &str = concat!(
        "3100",             // 0  StructureSize 49
        "50",               // 2  Padding 0x50 (where the client wants the data)
        "01",               // 3  Flags SMB2_READFLAG_READ_UNBUFFERED
        "00000100",         // 4  Length 0x10000
        "0020000001000000", // 8  Offset 0x1_0000_2000
        "1122334455667788", // 16 FileId.Persistent
        "99aabbccddeeff00", // 24 FileId.Volatile
        "00020000",         // 32 MinimumCount 512
        "00000000",         // 36 Channel SMB2_CHANNEL_NONE
        "00000000",         // 40 RemainingBytes
        "0000",             // 44 ReadChannelInfoOffset
        "0000",             // 46 ReadChannelInfoLength
        "00",               // 48 Buffer: one byte, ignored
    );

    #[test]
    fn parses_hand_laid_request() {
        let body = hex::decode(READ_REQUEST).unwrap();
        assert_eq!(body.len(), 49);
        let req = ReadRequest::parse(&body).unwrap();
        assert_eq!(
            req,
            ReadRequest {
                flags: 0x01,
                length: 0x1_0000,
                offset: 0x1_0000_2000,
                file_id: FileId {
                    persistent: 0x8877_6655_4433_2211,
                    volatile: 0x00ff_eedd_ccbb_aa99,
                },
                minimum_count: 512,
            }
        );
        // The encoder lays out the same bytes, except that it leaves
        // Padding zero.
        let mut out = Vec::new();
        req.encode(&mut out);
        let mut expected = body.clone();
        expected[2] = 0;
        assert_eq!(out, expected);
    }

    /// The READ response body of Microsoft's "SMB 3.1.1 Encryption in
    /// Windows 10" example (Open Specifications blog, appendix A.1, the
    /// decrypted server response), field by field as MS-SMB2 2.2.20 lays
    /// it out: 23 bytes of data read.
    #[test]
    fn response_head_matches_published_layout() {
        let expected = hex::decode(concat!(
            "1100",     // 0  StructureSize 17
            "50",       // 2  DataOffset 0x50: header (64) + this fixed part (16)
            "00",       // 3  Reserved
            "17000000", // 4  DataLength 23
            "00000000", // 8  DataRemaining
            "00000000", // 12 Reserved2 (Flags in 3.1.1)
            // 16 Buffer: "Smb3 encryption testing"
            "536d623320656e6372797074696f6e2074657374696e67",
        ))
        .unwrap();
        let data = b"Smb3 encryption testing";
        let mut out = Vec::new();
        encode_read_response_head(&mut out, data.len() as u32);
        out.extend_from_slice(data);
        assert_eq!(out, expected);
    }
}
