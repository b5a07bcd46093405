//! MS-SMB2 2.2.31 SMB2 IOCTL Request, 2.2.32 Response, and the FSCTL
//! payloads the server answers.

use crate::codec::{body_buffer, Put, Reader, WireResult, HEADER_SIZE};
use crate::file_id::FileId;

/// MS-SMB2 2.2.31 Flags.
pub const IOCTL_IS_FSCTL: u32 = 0x1;

/// Control codes (MS-SMB2 2.2.31, MS-FSCC 2.3).
pub mod ctl_code {
    pub const FSCTL_DFS_GET_REFERRALS: u32 = 0x0006_0194;
    pub const FSCTL_PIPE_TRANSCEIVE: u32 = 0x0011_C017;
    pub const FSCTL_SRV_COPYCHUNK: u32 = 0x0014_40F2;
    pub const FSCTL_SRV_COPYCHUNK_WRITE: u32 = 0x0014_80F2;
    pub const FSCTL_SRV_ENUMERATE_SNAPSHOTS: u32 = 0x0014_4064;
    pub const FSCTL_SRV_REQUEST_RESUME_KEY: u32 = 0x0014_0078;
    pub const FSCTL_QUERY_NETWORK_INTERFACE_INFO: u32 = 0x0014_01FC;
    pub const FSCTL_VALIDATE_NEGOTIATE_INFO: u32 = 0x0014_0204;
    pub const FSCTL_GET_REPARSE_POINT: u32 = 0x0009_00A8;
    pub const FSCTL_CREATE_OR_GET_OBJECT_ID: u32 = 0x0009_00C0;
    pub const FSCTL_GET_COMPRESSION: u32 = 0x0009_003C;
    pub const FSCTL_SET_COMPRESSION: u32 = 0x0009_C040;
    pub const FSCTL_SET_SPARSE: u32 = 0x0009_00C4;
    pub const FSCTL_SET_ZERO_DATA: u32 = 0x0009_80C8;
    pub const FSCTL_QUERY_ALLOCATED_RANGES: u32 = 0x0009_40CF;
    pub const FSCTL_DUPLICATE_EXTENTS_TO_FILE: u32 = 0x0009_8344;
    /// MS-SMB2 2.2.31.3: makes an open resilient.
    pub const FSCTL_LMR_REQUEST_RESILIENCY: u32 = 0x0014_01D4;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoctlRequest<'a> {
    pub ctl_code: u32,
    pub file_id: FileId,
    pub input: &'a [u8],
    pub max_input_response: u32,
    pub max_output_response: u32,
    pub flags: u32,
}

impl<'a> IoctlRequest<'a> {
    pub const STRUCTURE_SIZE: u16 = 57;

    pub fn parse(body: &'a [u8]) -> WireResult<Self> {
        let mut r = Reader::new(body);
        r.structure_size(Self::STRUCTURE_SIZE)?;
        r.skip(2)?;
        let ctl_code = r.u32()?;
        let file_id = FileId::read(&mut r)?;
        let in_off = r.u32()? as usize;
        let in_len = r.u32()? as usize;
        let max_input_response = r.u32()?;
        let _out_off = r.u32()?;
        let _out_len = r.u32()?;
        let max_output_response = r.u32()?;
        let flags = r.u32()?;
        let _reserved2 = r.u32()?;
        Ok(IoctlRequest {
            ctl_code,
            file_id,
            input: body_buffer(body, in_off, in_len)?,
            max_input_response,
            max_output_response,
            flags,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u16(Self::STRUCTURE_SIZE);
        out.put_u16(0);
        out.put_u32(self.ctl_code);
        self.file_id.write(out);
        out.put_u32((HEADER_SIZE + 56) as u32);
        out.put_u32(self.input.len() as u32);
        out.put_u32(self.max_input_response);
        out.put_u32(0);
        out.put_u32(0);
        out.put_u32(self.max_output_response);
        out.put_u32(self.flags);
        out.put_u32(0);
        out.extend_from_slice(self.input);
    }
}

pub fn encode_ioctl_response(out: &mut Vec<u8>, ctl_code: u32, file_id: FileId, output: &[u8]) {
    out.put_u16(49);
    out.put_u16(0);
    out.put_u32(ctl_code);
    file_id.write(out);
    let data_off = (HEADER_SIZE + 48) as u32;
    out.put_u32(data_off); // InputOffset
    out.put_u32(0); // InputCount
    out.put_u32(data_off);
    out.put_u32(output.len() as u32);
    out.put_u32(0);
    out.put_u32(0);
    out.extend_from_slice(output);
}

/// MS-SMB2 2.2.31.4 VALIDATE_NEGOTIATE_INFO Request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidateNegotiateInfo {
    pub capabilities: u32,
    pub guid: [u8; 16],
    pub security_mode: u16,
    pub dialects: Vec<u16>,
}

impl ValidateNegotiateInfo {
    pub fn parse(input: &[u8]) -> WireResult<Self> {
        let mut r = Reader::new(input);
        let capabilities = r.u32()?;
        let guid = r.array()?;
        let security_mode = r.u16()?;
        let count = r.u16()? as usize;
        let dialects = (0..count).map(|_| r.u16()).collect::<WireResult<_>>()?;
        Ok(ValidateNegotiateInfo {
            capabilities,
            guid,
            security_mode,
            dialects,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.put_u32(self.capabilities);
        out.extend_from_slice(&self.guid);
        out.put_u16(self.security_mode);
        out.put_u16(self.dialects.len() as u16);
        for d in &self.dialects {
            out.put_u16(*d);
        }
    }
}

/// MS-SMB2 2.2.32.6 VALIDATE_NEGOTIATE_INFO Response.
pub fn encode_validate_negotiate_response(
    out: &mut Vec<u8>,
    capabilities: u32,
    guid: &[u8; 16],
    security_mode: u16,
    dialect: u16,
) {
    out.put_u32(capabilities);
    out.extend_from_slice(guid);
    out.put_u16(security_mode);
    out.put_u16(dialect);
}

/// One address for MS-SMB2 2.2.32.5 NETWORK_INTERFACE_INFO.
#[derive(Clone, Debug)]
pub struct NetworkInterface {
    pub if_index: u32,
    pub capability: u32,
    pub link_speed: u64,
    pub addr: std::net::IpAddr,
}

/// MS-SMB2 2.2.32.5: a chain of 152-byte entries linked by Next, each with
/// a 128-byte SOCKADDR_STORAGE.
pub fn encode_network_interfaces(out: &mut Vec<u8>, ifaces: &[NetworkInterface]) {
    for (i, iface) in ifaces.iter().enumerate() {
        let start = out.len();
        out.put_u32(if i + 1 < ifaces.len() { 152 } else { 0 });
        out.put_u32(iface.if_index);
        out.put_u32(iface.capability);
        out.put_u32(0);
        out.put_u64(iface.link_speed);
        match iface.addr {
            std::net::IpAddr::V4(a) => {
                out.put_u16(0x0002);
                out.put_u16(0);
                out.extend_from_slice(&a.octets());
            }
            std::net::IpAddr::V6(a) => {
                out.put_u16(0x0017);
                out.put_u16(0);
                out.put_u32(0);
                out.extend_from_slice(&a.octets());
            }
        }
        out.resize(start + 152, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_and_validate_round_trip() {
        let mut vni = Vec::new();
        let v = ValidateNegotiateInfo {
            capabilities: 0x7f,
            guid: [2; 16],
            security_mode: 1,
            dialects: vec![0x0300, 0x0302],
        };
        v.encode(&mut vni);
        let req = IoctlRequest {
            ctl_code: ctl_code::FSCTL_VALIDATE_NEGOTIATE_INFO,
            file_id: FileId::RELATED,
            input: &vni,
            max_input_response: 0,
            max_output_response: 24,
            flags: IOCTL_IS_FSCTL,
        };
        let mut out = Vec::new();
        req.encode(&mut out);
        let parsed = IoctlRequest::parse(&out).unwrap();
        assert_eq!(parsed, req);
        assert_eq!(ValidateNegotiateInfo::parse(parsed.input).unwrap(), v);
    }

    /// An IOCTL request carrying FSCTL_VALIDATE_NEGOTIATE_INFO, laid out by
    /// hand from MS-SMB2 2.2.31 and 2.2.31.4 (offsets from the start of the
    /// body; buffer offsets count from the start of the 64-byte header).
    const VALIDATE_NEGOTIATE_REQUEST: &str = concat!(
        "3900",             // 0  StructureSize 57
        "0000",             // 2  Reserved
        "04021400",         // 4  CtlCode FSCTL_VALIDATE_NEGOTIATE_INFO 0x00140204
        "ffffffffffffffff", // 8  FileId.Persistent: all ones, as 3.3.5.15 requires
        "ffffffffffffffff", // 16 FileId.Volatile
        "78000000",         // 24 InputOffset 0x78 = 64 + 56
        "20000000",         // 28 InputCount 32
        "00000000",         // 32 MaxInputResponse
        "00000000",         // 36 OutputOffset: no output buffer
        "00000000",         // 40 OutputCount
        "18000000",         // 44 MaxOutputResponse 24
        "01000000",         // 48 Flags SMB2_0_IOCTL_IS_FSCTL
        "00000000",         // 52 Reserved2
        // 56 Buffer: VALIDATE_NEGOTIATE_INFO request, offsets from its start
        "7f000000",                         // 0  Capabilities
        "00112233445566778899aabbccddeeff", // 4  Guid
        "0100",                             // 20 SecurityMode SIGNING_ENABLED
        "0400",                             // 22 DialectCount 4
        "0202100200030203",                 // 24 Dialects 2.0.2 2.1 3.0 3.0.2
    );

    #[test]
    fn parses_hand_laid_validate_negotiate_request() {
        let body = hex::decode(VALIDATE_NEGOTIATE_REQUEST).unwrap();
        let req = IoctlRequest::parse(&body).unwrap();
        assert_eq!(req.ctl_code, ctl_code::FSCTL_VALIDATE_NEGOTIATE_INFO);
        assert_eq!(req.file_id, FileId::RELATED);
        assert_eq!(req.input, &body[56..]);
        assert_eq!(req.max_input_response, 0);
        assert_eq!(req.max_output_response, 24);
        assert_eq!(req.flags, IOCTL_IS_FSCTL);
        let vni = ValidateNegotiateInfo::parse(req.input).unwrap();
        assert_eq!(
            vni,
            ValidateNegotiateInfo {
                capabilities: 0x7f,
                guid: [
                    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc,
                    0xdd, 0xee, 0xff
                ],
                security_mode: 1,
                dialects: vec![0x0202, 0x0210, 0x0300, 0x0302],
            }
        );
        // The encoders lay out the same bytes.
        let mut input = Vec::new();
        vni.encode(&mut input);
        assert_eq!(input, req.input);
        let mut out = Vec::new();
        req.encode(&mut out);
        assert_eq!(out, body);
    }

    /// The IOCTL response to it, by hand from MS-SMB2 2.2.32 and 2.2.32.6.
    #[test]
    fn validate_negotiate_response_matches_hand_laid_layout() {
        let expected = hex::decode(concat!(
            "3100",             // 0  StructureSize 49
            "0000",             // 2  Reserved
            "04021400",         // 4  CtlCode FSCTL_VALIDATE_NEGOTIATE_INFO
            "ffffffffffffffff", // 8  FileId.Persistent
            "ffffffffffffffff", // 16 FileId.Volatile
            "70000000",         // 24 InputOffset 0x70 = 64 + 48
            "00000000",         // 28 InputCount: no input returned
            "70000000",         // 32 OutputOffset 0x70
            "18000000",         // 36 OutputCount 24
            "00000000",         // 40 Flags
            "00000000",         // 44 Reserved2
            // 48 Buffer: VALIDATE_NEGOTIATE_INFO response
            "46000000",                         // 0  Capabilities
            "ffeeddccbbaa99887766554433221100", // 4  Guid
            "0300",                             // 20 SecurityMode: enabled | required
            "0203",                             // 22 Dialect 3.0.2
        ))
        .unwrap();
        let guid = [
            0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22,
            0x11, 0x00,
        ];
        let mut output = Vec::new();
        encode_validate_negotiate_response(&mut output, 0x46, &guid, 3, 0x0302);
        let mut out = Vec::new();
        encode_ioctl_response(
            &mut out,
            ctl_code::FSCTL_VALIDATE_NEGOTIATE_INFO,
            FileId::RELATED,
            &output,
        );
        assert_eq!(out, expected);
    }

    #[test]
    fn interface_entries_are_152_bytes() {
        let mut out = Vec::new();
        let iface = NetworkInterface {
            if_index: 1,
            capability: 0,
            link_speed: 10_000_000_000,
            addr: "127.0.0.1".parse().unwrap(),
        };
        encode_network_interfaces(&mut out, &[iface.clone(), iface]);
        assert_eq!(out.len(), 304);
        assert_eq!(&out[0..4], &152u32.to_le_bytes());
        assert_eq!(&out[152..156], &0u32.to_le_bytes());
        assert_eq!(&out[28..32], &[127, 0, 0, 1]);
    }
}
