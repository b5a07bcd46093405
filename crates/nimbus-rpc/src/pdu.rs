//! Connection-oriented DCE/RPC PDUs (C706 chapter 12, MS-RPCE 2.2.2): the
//! common header and the bodies of BIND, ALTER_CONTEXT, REQUEST and their
//! answers.

use crate::RpcError;

/// C706 12.6.3.1: the common header of every connection-oriented PDU.
pub const HEADER_LEN: usize = 16;
/// REQUEST and RESPONSE add alloc_hint, p_cont_id and opnum/cancel_count.
pub const REQUEST_HEADER_LEN: usize = 24;

pub mod ptype {
    pub const REQUEST: u8 = 0;
    pub const RESPONSE: u8 = 2;
    pub const FAULT: u8 = 3;
    pub const BIND: u8 = 11;
    pub const BIND_ACK: u8 = 12;
    pub const BIND_NAK: u8 = 13;
    pub const ALTER_CONTEXT: u8 = 14;
    pub const ALTER_CONTEXT_RESP: u8 = 15;
    /// MS-RPCE 2.2.2.10: the third leg of a three-leg authentication.
    pub const AUTH3: u8 = 16;
}

/// C706 12.6.3.1 pfc_flags.
pub mod flags {
    pub const FIRST_FRAG: u8 = 0x01;
    pub const LAST_FRAG: u8 = 0x02;
    /// MS-RPCE 2.2.2.3 PFC_SUPPORT_HEADER_SIGN, in a BIND and its BIND_ACK
    /// (the same bit is PFC_PENDING_CANCEL in a REQUEST): the
    /// verifier covers the PDU's header and sec_trailer too.
    pub const SUPPORT_HEADER_SIGN: u8 = 0x04;
    pub const DID_NOT_EXECUTE: u8 = 0x20;
    pub const OBJECT_UUID: u8 = 0x80;
}

/// Little-endian integers, ASCII characters, IEEE floats: the only data
/// representation Windows sends and the only one served here.
pub const DREP_LITTLE_ENDIAN: [u8; 4] = [0x10, 0, 0, 0];

/// C706 12.6.3.1: the common header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ptype: u8,
    pub flags: u8,
    pub frag_length: u16,
    pub auth_length: u16,
    pub call_id: u32,
}

impl Header {
    /// Parses the header at the start of `buf`; the caller checks that
    /// frag_length bytes are there.
    pub fn parse(buf: &[u8]) -> Result<Header, RpcError> {
        let b = buf
            .get(..HEADER_LEN)
            .ok_or(RpcError::Protocol("PDU shorter than its header"))?;
        if b[0] != 5 || b[1] != 0 {
            return Err(RpcError::Protocol("not DCE/RPC version 5.0"));
        }
        if b[4] & 0xF0 != 0x10 {
            return Err(RpcError::Protocol("big-endian data representation"));
        }
        let frag_length = u16::from_le_bytes([b[8], b[9]]);
        if (frag_length as usize) < HEADER_LEN {
            return Err(RpcError::Protocol(
                "fragment length shorter than the header",
            ));
        }
        Ok(Header {
            ptype: b[2],
            flags: b[3],
            frag_length,
            auth_length: u16::from_le_bytes([b[10], b[11]]),
            call_id: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }

    /// Writes the header; `frag_length` is patched by `finish`.
    fn encode(ptype: u8, flags: u8, call_id: u32, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.extend_from_slice(&[5, 0, ptype, flags]);
        out.extend_from_slice(&DREP_LITTLE_ENDIAN);
        out.extend_from_slice(&[0, 0, 0, 0]); // frag_length, auth_length
        out.extend_from_slice(&call_id.to_le_bytes());
        start
    }

    /// Sets frag_length to the PDU's length from `start` and auth_length.
    pub(crate) fn set_lengths(start: usize, out: &mut [u8], auth_length: u16) {
        Header::finish(start, out);
        out[start + 10..start + 12].copy_from_slice(&auth_length.to_le_bytes());
    }

    fn finish(start: usize, out: &mut [u8]) {
        let len = (out.len() - start) as u16;
        out[start + 8..start + 10].copy_from_slice(&len.to_le_bytes());
    }
}

/// C706 11.2.5: an interface or transfer syntax, `p_syntax_id_t`: the
/// UUID in its wire (little-endian fields) form, and major and minor
/// version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntaxId {
    pub uuid: [u8; 16],
    pub major: u16,
    pub minor: u16,
}

impl SyntaxId {
    fn parse(b: &[u8]) -> SyntaxId {
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[..16]);
        SyntaxId {
            uuid,
            major: u16::from_le_bytes([b[16], b[17]]),
            minor: u16::from_le_bytes([b[18], b[19]]),
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.uuid);
        out.extend_from_slice(&self.major.to_le_bytes());
        out.extend_from_slice(&self.minor.to_le_bytes());
    }
}

/// NDR 2.0, 8a885d04-1ceb-11c9-9fe8-08002b104860 version 2 (C706 Appendix I).
pub const NDR20: SyntaxId = SyntaxId {
    uuid: [
        0x04, 0x5d, 0x88, 0x8a, 0xeb, 0x1c, 0xc9, 0x11, 0x9f, 0xe8, 0x08, 0x00, 0x2b, 0x10, 0x48,
        0x60,
    ],
    major: 2,
    minor: 0,
};

/// MS-RPCE 3.3.1.5.3: bind time feature negotiation offers itself as a
/// transfer syntax 6cb71c2c-9812-4540-XXXX-000000000000 whose bytes 8-9
/// carry the feature bits.
pub fn is_bind_time_features(s: &SyntaxId) -> bool {
    s.uuid[..8] == [0x2c, 0x1c, 0xb7, 0x6c, 0x12, 0x98, 0x40, 0x45] && s.uuid[10..] == [0; 6]
}

/// One presentation context of a BIND or ALTER_CONTEXT (C706 12.6.3.1
/// p_cont_elem_t).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextElem {
    pub id: u16,
    pub abstract_syntax: SyntaxId,
    pub transfer_syntaxes: Vec<SyntaxId>,
}

/// C706 12.6.4.3 BIND and 12.6.4.1 ALTER_CONTEXT (the same body).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    pub max_xmit_frag: u16,
    pub max_recv_frag: u16,
    pub assoc_group_id: u32,
    pub contexts: Vec<ContextElem>,
}

impl Bind {
    /// `body` is the PDU after the common header, without auth trailer.
    pub fn parse(body: &[u8]) -> Result<Bind, RpcError> {
        const BAD: RpcError = RpcError::Protocol("BIND body cut short");
        let fixed = body.get(..12).ok_or(BAD)?;
        let count = fixed[8] as usize;
        let mut at = 12;
        let mut contexts = Vec::with_capacity(count);
        for _ in 0..count {
            let head = body.get(at..at + 24).ok_or(BAD)?;
            let id = u16::from_le_bytes([head[0], head[1]]);
            let n_transfer = head[2] as usize;
            if n_transfer == 0 {
                return Err(RpcError::Protocol(
                    "presentation context without transfer syntax",
                ));
            }
            let abstract_syntax = SyntaxId::parse(&head[4..24]);
            at += 24;
            let list = body.get(at..at + 20 * n_transfer).ok_or(BAD)?;
            at += 20 * n_transfer;
            contexts.push(ContextElem {
                id,
                abstract_syntax,
                transfer_syntaxes: list.chunks_exact(20).map(SyntaxId::parse).collect(),
            });
        }
        Ok(Bind {
            max_xmit_frag: u16::from_le_bytes([fixed[0], fixed[1]]),
            max_recv_frag: u16::from_le_bytes([fixed[2], fixed[3]]),
            assoc_group_id: u32::from_le_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]),
            contexts,
        })
    }
}

/// C706 12.6.3.1 p_cont_def_result_t.
pub mod result {
    pub const ACCEPTANCE: u16 = 0;
    pub const PROVIDER_REJECTION: u16 = 2;
    /// MS-RPCE 2.2.2.4: the answer to a bind time feature negotiation.
    pub const NEGOTIATE_ACK: u16 = 3;
}

/// C706 12.6.3.1 p_provider_reason_t.
pub mod reason {
    pub const NONE: u16 = 0;
    pub const ABSTRACT_SYNTAX_NOT_SUPPORTED: u16 = 1;
    pub const TRANSFER_SYNTAXES_NOT_SUPPORTED: u16 = 2;
}

/// The answer to one presentation context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextResult {
    pub result: u16,
    pub reason: u16,
    pub transfer_syntax: SyntaxId,
}

/// C706 12.6.4.4 BIND_ACK and 12.6.4.2 ALTER_CONTEXT_RESP.
pub struct BindAck<'a> {
    pub ptype: u8,
    pub call_id: u32,
    pub max_xmit_frag: u16,
    pub max_recv_frag: u16,
    pub assoc_group_id: u32,
    /// The port spec: the pipe's name, `\PIPE\srvsvc`; empty in an
    /// ALTER_CONTEXT_RESP.
    pub secondary_address: &'a str,
    pub results: &'a [ContextResult],
    /// Answers a BIND's PFC_SUPPORT_HEADER_SIGN.
    pub header_sign: bool,
}

impl BindAck<'_> {
    pub fn encode(&self, out: &mut Vec<u8>) {
        let header_sign = if self.header_sign {
            flags::SUPPORT_HEADER_SIGN
        } else {
            0
        };
        let start = Header::encode(
            self.ptype,
            flags::FIRST_FRAG | flags::LAST_FRAG | header_sign,
            self.call_id,
            out,
        );
        out.extend_from_slice(&self.max_xmit_frag.to_le_bytes());
        out.extend_from_slice(&self.max_recv_frag.to_le_bytes());
        out.extend_from_slice(&self.assoc_group_id.to_le_bytes());
        // port_any_t: length with the NUL, the characters, padding to 4.
        if self.secondary_address.is_empty() {
            out.extend_from_slice(&0u16.to_le_bytes());
        } else {
            out.extend_from_slice(&(self.secondary_address.len() as u16 + 1).to_le_bytes());
            out.extend_from_slice(self.secondary_address.as_bytes());
            out.push(0);
        }
        while !(out.len() - start).is_multiple_of(4) {
            out.push(0);
        }
        out.extend_from_slice(&[self.results.len() as u8, 0, 0, 0]);
        for r in self.results {
            out.extend_from_slice(&r.result.to_le_bytes());
            out.extend_from_slice(&r.reason.to_le_bytes());
            r.transfer_syntax.encode(out);
        }
        Header::finish(start, out);
    }
}

/// C706 12.6.4.5 BIND_NAK: provider_reject_reason, then the protocol
/// versions supported (5.0).
pub fn encode_bind_nak(call_id: u32, reject_reason: u16, out: &mut Vec<u8>) {
    let start = Header::encode(
        ptype::BIND_NAK,
        flags::FIRST_FRAG | flags::LAST_FRAG,
        call_id,
        out,
    );
    out.extend_from_slice(&reject_reason.to_le_bytes());
    out.extend_from_slice(&[1, 5, 0]);
    Header::finish(start, out);
}

/// C706 12.6.4.9 REQUEST: what follows the common header.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub context_id: u16,
    pub opnum: u16,
    pub stub: &'a [u8],
}

impl<'a> Request<'a> {
    pub fn parse(hdr: &Header, body: &'a [u8]) -> Result<Request<'a>, RpcError> {
        let fixed = body
            .get(..8)
            .ok_or(RpcError::Protocol("REQUEST body cut short"))?;
        let skip = if hdr.flags & flags::OBJECT_UUID != 0 {
            8 + 16
        } else {
            8
        };
        let stub = body
            .get(skip..)
            .ok_or(RpcError::Protocol("REQUEST body cut short"))?;
        Ok(Request {
            context_id: u16::from_le_bytes([fixed[4], fixed[5]]),
            opnum: u16::from_le_bytes([fixed[6], fixed[7]]),
            stub,
        })
    }
}

/// C706 12.6.4.10 RESPONSE: one fragment of a call's result.
pub fn encode_response(
    call_id: u32,
    pfc_flags: u8,
    alloc_hint: u32,
    context_id: u16,
    stub: &[u8],
    out: &mut Vec<u8>,
) {
    let start = Header::encode(ptype::RESPONSE, pfc_flags, call_id, out);
    out.extend_from_slice(&alloc_hint.to_le_bytes());
    out.extend_from_slice(&context_id.to_le_bytes());
    out.extend_from_slice(&[0, 0]); // cancel_count, reserved
    out.extend_from_slice(stub);
    Header::finish(start, out);
}

/// C706 12.6.4.7 FAULT.
pub fn encode_fault(
    call_id: u32,
    context_id: u16,
    status: u32,
    did_not_execute: bool,
    out: &mut Vec<u8>,
) {
    let mut pfc = flags::FIRST_FRAG | flags::LAST_FRAG;
    if did_not_execute {
        pfc |= flags::DID_NOT_EXECUTE;
    }
    let start = Header::encode(ptype::FAULT, pfc, call_id, out);
    out.extend_from_slice(&0u32.to_le_bytes()); // alloc_hint
    out.extend_from_slice(&context_id.to_le_bytes());
    out.extend_from_slice(&[0, 0]); // cancel_count, reserved
    out.extend_from_slice(&status.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // reserved
    Header::finish(start, out);
}

/// Which presentation contexts of a BIND or ALTER_CONTEXT are accepted
/// (C706 12.6.3.1, MS-RPCE 3.3.1.5.3): those that name an interface
/// `served` takes and offer NDR 2.0. A bind time feature negotiation
/// (MS-RPCE 2.2.2.14) is acknowledged with no feature granted.
pub fn judge_contexts(bind: &Bind, served: impl Fn(&SyntaxId) -> bool) -> Vec<ContextResult> {
    const NONE: SyntaxId = SyntaxId {
        uuid: [0; 16],
        major: 0,
        minor: 0,
    };
    let refused = |reason| ContextResult {
        result: result::PROVIDER_REJECTION,
        reason,
        transfer_syntax: NONE,
    };
    bind.contexts
        .iter()
        .map(|c| {
            if c.transfer_syntaxes.iter().any(is_bind_time_features) {
                ContextResult {
                    result: result::NEGOTIATE_ACK,
                    reason: 0,
                    transfer_syntax: NONE,
                }
            } else if !served(&c.abstract_syntax) {
                refused(reason::ABSTRACT_SYNTAX_NOT_SUPPORTED)
            } else if c.transfer_syntaxes.contains(&NDR20) {
                ContextResult {
                    result: result::ACCEPTANCE,
                    reason: reason::NONE,
                    transfer_syntax: NDR20,
                }
            } else {
                refused(reason::TRANSFER_SYNTAXES_NOT_SUPPORTED)
            }
        })
        .collect()
}

/// MS-RPCE 2.2.1.1.7-8: the authentication services and levels.
pub mod auth {
    pub const TYPE_SPNEGO: u8 = 9;
    /// RPC_C_AUTHN_GSS_KERBEROS: bare Kerberos (GSS-API) tokens.
    pub const TYPE_KRB5: u8 = 16;
    /// RPC_C_AUTHN_WINNT: NTLMSSP tokens.
    pub const TYPE_NTLMSSP: u8 = 10;
    pub const LEVEL_CONNECT: u8 = 2;
    /// RPC_C_AUTHN_LEVEL_CALL: protects only a call's first fragment, which
    /// the per-message protections here cannot express; refused.
    pub const LEVEL_CALL: u8 = 3;
    /// RPC_C_AUTHN_LEVEL_PKT: served as integrity (every PDU signed, as
    /// Samba serves it): the client gets more than it asked for.
    pub const LEVEL_PKT: u8 = 4;
    pub const LEVEL_INTEGRITY: u8 = 5;
    pub const LEVEL_PRIVACY: u8 = 6;

    /// Whether every PDU of an association at `level` is signed or sealed
    /// here.
    pub fn signs(level: u8) -> bool {
        level == LEVEL_PKT || level >= LEVEL_INTEGRITY
    }
}

/// MS-RPCE 2.2.2.11 sec_trailer: what precedes the auth_value at the end
/// of an authenticated PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecTrailer {
    pub auth_type: u8,
    pub auth_level: u8,
    pub pad_length: u8,
    pub context_id: u32,
}

/// Length of a sec_trailer.
pub const SEC_TRAILER_LEN: usize = 8;

impl SecTrailer {
    /// The trailer of a PDU with auth_length `auth`, and where it starts.
    pub fn find(pdu: &[u8], auth: usize) -> Result<(SecTrailer, usize), RpcError> {
        let at = pdu
            .len()
            .checked_sub(auth + SEC_TRAILER_LEN)
            .filter(|&a| a >= HEADER_LEN)
            .ok_or(RpcError::Protocol("auth trailer longer than the PDU"))?;
        let b = &pdu[at..at + SEC_TRAILER_LEN];
        Ok((
            SecTrailer {
                auth_type: b[0],
                auth_level: b[1],
                pad_length: b[2],
                context_id: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            },
            at,
        ))
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.auth_type, self.auth_level, self.pad_length, 0]);
        out.extend_from_slice(&self.context_id.to_le_bytes());
    }
}

/// Appends an auth verifier to the PDU that starts at `start` in `out`
/// (padded to 4 first, as the trailer must be aligned) and fixes its
/// lengths.
pub fn append_auth(out: &mut Vec<u8>, start: usize, trailer: SecTrailer, value: &[u8]) {
    let pad = (4 - (out.len() - start) % 4) % 4;
    out.resize(out.len() + pad, 0);
    SecTrailer {
        pad_length: pad as u8,
        ..trailer
    }
    .encode(out);
    out.extend_from_slice(value);
    Header::set_lengths(start, out, value.len() as u16);
}
