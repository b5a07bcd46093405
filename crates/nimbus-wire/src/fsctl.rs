//! Payloads of the file-system controls the server carries out on a file:
//! server-side copy (MS-SMB2 2.2.31.1, 2.2.32.1, 2.2.32.3) and the sparse
//! file and compression controls of MS-FSCC 2.3. The IOCTL around them is
//! in `ioctl`.

use crate::codec::{Put, Reader, WireResult};

/// Length of a resume key (MS-SMB2 2.2.32.3): opaque to the client.
pub const RESUME_KEY_LEN: usize = 24;
/// MS-SMB2 3.3.5.15.5: OutputCount of the resume key response is 32.
pub const RESUME_KEY_RESPONSE_LEN: usize = 32;

/// MS-SMB2 2.2.32.3 SRV_REQUEST_RESUME_KEY Response: ResumeKey (24),
/// ContextLength (4, zero: no context), and the 4 reserved bytes that make
/// the 32 bytes Windows returns.
pub fn encode_resume_key_response(out: &mut Vec<u8>, key: &[u8; RESUME_KEY_LEN]) {
    out.extend_from_slice(key);
    out.put_u32(0);
    out.put_u32(0);
}

/// MS-SMB2 2.2.31.1.1 SRV_COPYCHUNK: one range to copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyChunk {
    pub source_offset: u64,
    pub target_offset: u64,
    pub length: u32,
}

impl CopyChunk {
    pub const LEN: usize = 24;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64(self.source_offset);
        out.put_u64(self.target_offset);
        out.put_u32(self.length);
        out.put_u32(0); // Reserved
    }
}

/// MS-SMB2 2.2.31.1 SRV_COPYCHUNK_COPY. The chunks stay in the request's
/// buffer and are decoded one at a time, so a huge ChunkCount costs nothing
/// before it is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyChunkCopy<'a> {
    pub source_key: [u8; RESUME_KEY_LEN],
    pub chunk_count: u32,
    chunks: &'a [u8],
}

impl<'a> CopyChunkCopy<'a> {
    /// SourceKey, ChunkCount and Reserved: the part before the chunks.
    pub const HEADER_LEN: usize = 32;

    /// Decodes the fixed part; whether the buffer also holds every chunk it
    /// announces is `has_all_chunks`.
    pub fn parse(input: &'a [u8]) -> WireResult<Self> {
        let mut r = Reader::new(input);
        let source_key = r.array()?;
        let chunk_count = r.u32()?;
        let _reserved = r.u32()?;
        let chunks = r.bytes(r.remaining())?;
        Ok(CopyChunkCopy {
            source_key,
            chunk_count,
            chunks,
        })
    }

    /// MS-SMB2 3.3.5.15.6: an InputCount shorter than ChunkCount chunks is
    /// refused like a request over the limits.
    pub fn has_all_chunks(&self) -> bool {
        (self.chunks.len() / CopyChunk::LEN) as u64 >= u64::from(self.chunk_count)
    }

    /// The first ChunkCount chunks (fewer if the buffer ends first).
    pub fn chunks(&self) -> impl Iterator<Item = CopyChunk> + '_ {
        self.chunks
            .chunks_exact(CopyChunk::LEN)
            .take(self.chunk_count as usize)
            .map(|c| {
                let mut r = Reader::new(c);
                // The slice is exactly LEN bytes: the reads cannot fail.
                CopyChunk {
                    source_offset: r.u64().unwrap_or(0),
                    target_offset: r.u64().unwrap_or(0),
                    length: r.u32().unwrap_or(0),
                }
            })
    }

    pub fn encode(source_key: &[u8; RESUME_KEY_LEN], chunks: &[CopyChunk], out: &mut Vec<u8>) {
        out.extend_from_slice(source_key);
        out.put_u32(chunks.len() as u32);
        out.put_u32(0);
        for c in chunks {
            c.encode(out);
        }
    }
}

/// MS-SMB2 2.2.32.1 SRV_COPYCHUNK_RESPONSE. After a copy: chunks written,
/// bytes of a chunk written only in part, total bytes. After a request over
/// the limits: the server's limits in the same three fields (3.3.5.15.6.2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyChunkResponse {
    pub chunks_written: u32,
    pub chunk_bytes_written: u32,
    pub total_bytes_written: u32,
}

impl CopyChunkResponse {
    pub const LEN: usize = 12;

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.chunks_written);
        out.put_u32(self.chunk_bytes_written);
        out.put_u32(self.total_bytes_written);
    }

    pub fn parse(buf: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(buf);
        Ok(CopyChunkResponse {
            chunks_written: r.u32()?,
            chunk_bytes_written: r.u32()?,
            total_bytes_written: r.u32()?,
        })
    }
}

/// MS-FSCC 2.3.85 FSCTL_SET_ZERO_DATA Request (FILE_ZERO_DATA_INFORMATION).
/// Both fields are signed on the wire; negative values are refused by the
/// handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZeroDataInformation {
    pub file_offset: i64,
    pub beyond_final_zero: i64,
}

impl ZeroDataInformation {
    pub const LEN: usize = 16;

    pub fn parse(input: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(input);
        Ok(ZeroDataInformation {
            file_offset: r.u64()? as i64,
            beyond_final_zero: r.u64()? as i64,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64(self.file_offset as u64);
        out.put_u64(self.beyond_final_zero as u64);
    }
}

/// MS-FSCC 2.3.51/2.3.52 FILE_ALLOCATED_RANGE_BUFFER: the range asked
/// about in an FSCTL_QUERY_ALLOCATED_RANGES request, and each entry of the
/// reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatedRange {
    pub file_offset: i64,
    pub length: i64,
}

impl AllocatedRange {
    pub const LEN: usize = 16;

    /// Decodes the first range; bytes after it are ignored, as Windows
    /// ignores them.
    pub fn parse(input: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(input);
        Ok(AllocatedRange {
            file_offset: r.u64()? as i64,
            length: r.u64()? as i64,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u64(self.file_offset as u64);
        out.put_u64(self.length as u64);
    }
}

/// MS-FSCC 2.3.8 FSCTL_DUPLICATE_EXTENTS_TO_FILE Request
/// (DUPLICATE_EXTENTS_DATA): the source's SMB2 FileId, then offsets and
/// length, signed on the wire (negative values are refused by the handler).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DuplicateExtents {
    pub source: crate::FileId,
    pub source_offset: i64,
    pub target_offset: i64,
    pub byte_count: i64,
}

impl DuplicateExtents {
    pub const LEN: usize = 40;

    pub fn parse(input: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(input);
        let source = crate::FileId::read(&mut r)?;
        Ok(DuplicateExtents {
            source,
            source_offset: r.u64()? as i64,
            target_offset: r.u64()? as i64,
            byte_count: r.u64()? as i64,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        self.source.write(out);
        out.put_u64(self.source_offset as u64);
        out.put_u64(self.target_offset as u64);
        out.put_u64(self.byte_count as u64);
    }
}

/// MS-FSCC FSCTL_SET_SPARSE Request (FILE_SET_SPARSE_BUFFER, one BOOLEAN):
/// a request without the buffer sets the flag, as on Windows; any nonzero
/// byte is TRUE.
pub fn set_sparse_requested(input: &[u8]) -> bool {
    input.first().is_none_or(|b| *b != 0)
}

/// MS-FSCC 2.3.18 / 2.3.67 CompressionState values.
pub mod compression {
    pub const NONE: u16 = 0x0000;
    pub const DEFAULT: u16 = 0x0001;
    pub const LZNT1: u16 = 0x0002;
}

/// MS-FSCC 2.3.67 FSCTL_SET_COMPRESSION Request: one USHORT.
pub fn parse_compression_state(input: &[u8]) -> WireResult<u16> {
    Reader::new(input).u16()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::WireError;

    /// A SRV_COPYCHUNK_COPY laid out by hand from MS-SMB2 2.2.31.1 and
    /// 2.2.31.1.1: two chunks.
    const COPYCHUNK_COPY: &str = concat!(
        "000102030405060708090a0b0c0d0e0f1011121314151617", // 0  SourceKey
        "02000000",                                         // 24 ChunkCount 2
        "00000000",                                         // 28 Reserved
        "0010000000000000",                                 // 32 SourceOffset 4096
        "0000000000000000",                                 // 40 TargetOffset 0
        "00100000",                                         // 48 Length 4096
        "00000000",                                         // 52 Reserved
        "0000000000000000",                                 // 56 SourceOffset 0
        "0000000000010000",                                 // 64 TargetOffset 2^40
        "00001000",                                         // 72 Length 1 MiB
        "00000000",                                         // 76 Reserved
    );

    #[test]
    fn parses_hand_laid_copychunk_copy() {
        let buf = hex::decode(COPYCHUNK_COPY).unwrap();
        let c = CopyChunkCopy::parse(&buf).unwrap();
        let key: Vec<u8> = (0..24).collect();
        assert_eq!(c.source_key.as_slice(), key.as_slice());
        assert_eq!(c.chunk_count, 2);
        assert!(c.has_all_chunks());
        let chunks: Vec<CopyChunk> = c.chunks().collect();
        assert_eq!(
            chunks,
            [
                CopyChunk {
                    source_offset: 4096,
                    target_offset: 0,
                    length: 4096
                },
                CopyChunk {
                    source_offset: 0,
                    target_offset: 1 << 40,
                    length: 1 << 20
                },
            ]
        );
        let mut again = Vec::new();
        CopyChunkCopy::encode(&c.source_key, &chunks, &mut again);
        assert_eq!(again, buf);
    }

    #[test]
    fn copychunk_counts_are_checked_against_the_buffer() {
        let buf = hex::decode(COPYCHUNK_COPY).unwrap();
        // One chunk missing: announced 2, holds 1.
        let short = CopyChunkCopy::parse(&buf[..56]).unwrap();
        assert!(!short.has_all_chunks());
        assert_eq!(short.chunks().count(), 1);
        // A ChunkCount of 2^32-1 with no chunks decodes without allocating.
        let mut huge = buf[..32].to_vec();
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        let h = CopyChunkCopy::parse(&huge).unwrap();
        assert!(!h.has_all_chunks());
        assert_eq!(h.chunks().count(), 0);
        // Fewer than the fixed 32 bytes is not a request.
        assert_eq!(
            CopyChunkCopy::parse(&buf[..31]).unwrap_err(),
            WireError::Truncated
        );
    }

    #[test]
    fn copychunk_response_and_resume_key_layouts() {
        let mut out = Vec::new();
        CopyChunkResponse {
            chunks_written: 256,
            chunk_bytes_written: 1 << 20,
            total_bytes_written: 16 << 20,
        }
        .encode(&mut out);
        assert_eq!(hex::encode(&out), "000100000000100000000001");
        assert_eq!(
            CopyChunkResponse::parse(&out).unwrap().total_bytes_written,
            16 << 20
        );
        let mut key = Vec::new();
        encode_resume_key_response(&mut key, &[7; RESUME_KEY_LEN]);
        assert_eq!(key.len(), RESUME_KEY_RESPONSE_LEN);
        assert_eq!(&key[24..], &[0; 8]);
    }

    #[test]
    fn duplicate_extents_layout() {
        // MS-FSCC 2.3.8: FileHandle (persistent, volatile), then the three
        // 64-bit values.
        let buf = hex::decode(concat!(
            "0100000000000000",
            "0200000000000000",
            "0040000000000000",
            "0080000000000000",
            "0040000000000000",
        ))
        .unwrap();
        let d = DuplicateExtents::parse(&buf).unwrap();
        assert_eq!(
            d,
            DuplicateExtents {
                source: crate::FileId {
                    persistent: 1,
                    volatile: 2
                },
                source_offset: 16384,
                target_offset: 32768,
                byte_count: 16384,
            }
        );
        let mut again = Vec::new();
        d.encode(&mut again);
        assert_eq!(again, buf);
        assert!(DuplicateExtents::parse(&buf[..39]).is_err());
    }

    #[test]
    fn sparse_zero_data_and_ranges() {
        assert!(set_sparse_requested(&[]));
        assert!(set_sparse_requested(&[0xFF]));
        assert!(set_sparse_requested(&[1, 0, 0]));
        assert!(!set_sparse_requested(&[0; 100]));
        // FILE_ZERO_DATA_INFORMATION: FileOffset 4096, BeyondFinalZero 8192.
        let z = hex::decode("00100000000000000020000000000000").unwrap();
        let parsed = ZeroDataInformation::parse(&z).unwrap();
        assert_eq!(
            parsed,
            ZeroDataInformation {
                file_offset: 4096,
                beyond_final_zero: 8192
            }
        );
        let mut again = Vec::new();
        parsed.encode(&mut again);
        assert_eq!(again, z);
        assert!(ZeroDataInformation::parse(&z[..15]).is_err());
        // A negative length stays negative for the handler to refuse.
        let r = hex::decode("0002000000000000ffffffffffffffff").unwrap();
        assert_eq!(
            AllocatedRange::parse(&r).unwrap(),
            AllocatedRange {
                file_offset: 512,
                length: -1
            }
        );
        assert!(AllocatedRange::parse(&r[..8]).is_err());
        assert_eq!(
            parse_compression_state(&[1, 0]).unwrap(),
            compression::DEFAULT
        );
        assert!(parse_compression_state(&[1]).is_err());
    }
}
