//! One open of a named pipe on IPC$: the RPC association on it (MS-RPCE
//! 3.3.3), the PDUs the client has written and the answers waiting to be
//! read, one PDU per message (the pipe is in message mode).
//!
//! The SMB session around the pipe is authenticated already; a client may
//! still ask for RPC's own logon and integrity or privacy on top (Samba's
//! `ncacn_np:HOST[sign]`, and smbtorture's witness tests for srvsvc), which
//! `crate::security` gives as on TCP.

use std::collections::VecDeque;
use std::net::IpAddr;

use nimbus_auth::Authenticator;

use crate::fragments::Reassembly;
use crate::pdu::{
    self, flags, ptype, result, Bind, BindAck, ContextResult, Header, Request, SecTrailer,
    SEC_TRAILER_LEN,
};
use crate::security::{RpcSecurity, AUTH_PAD};
use crate::{fault, HostSource, RpcError, Service};

/// The largest fragment this end sends and accepts (the value Windows
/// and Samba offer).
pub const MAX_FRAG: u16 = 4280;
/// C706 12.6.3.1: every implementation takes fragments this long.
const MIN_FRAG: u16 = 1432;
/// A request's stub, all fragments together: the calls served take a
/// few hundred bytes.
pub const MAX_STUB: usize = 64 * 1024;
/// Answers not yet read: beyond this a client writes without reading,
/// and the pipe is closed on it.
pub const MAX_QUEUED: usize = 1024 * 1024;
/// MS-RPCE 3.3.1.5.6: the association group a BIND without one joins.
const ASSOC_GROUP_BASE: u32 = 0x0001_2340;
/// C706 12.6.3.1 p_reject_reason_t values sent in a BIND_NAK.
const NAK_REASON_NOT_SPECIFIED: u16 = 0;
const NAK_AUTH_TYPE_NOT_RECOGNIZED: u16 = 8;
/// RPC_S_ACCESS_DENIED, as a fault status (MS-RPCE 3.3.1.5.2).
const ACCESS_DENIED: u32 = 0x0000_0005;

/// Why a write to the pipe failed: the pipe is closed (what the client
/// sent broke the protocol, said here for the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipeError(pub &'static str);

/// A read: the bytes, and whether the message goes on (the SMB answer is
/// STATUS_BUFFER_OVERFLOW, the rest comes with the next read).
#[derive(Debug, PartialEq, Eq)]
pub struct ReadResult {
    pub data: Vec<u8>,
    pub more: bool,
}

struct Association {
    /// The client's max_recv_frag, within ours.
    xmit_frag: u16,
    assoc_group: u32,
    /// Presentation contexts accepted (ids).
    contexts: Vec<u16>,
}

pub struct Pipe {
    service: Service,
    association: Option<Association>,
    /// Bytes of a PDU not complete yet.
    input: Vec<u8>,
    call: Reassembly,
    /// Answers, one PDU each; `read_at` bytes of the first are read.
    output: VecDeque<Vec<u8>>,
    read_at: usize,
    queued: usize,
    closed: bool,
    /// LSA policy handles opened on this pipe.
    policy_handles: crate::lsarpc::PolicyHandles,
    /// RPC's own logon, when the pipe offers one (`with_security`).
    security: Option<RpcSecurity>,
}

impl Pipe {
    /// A pipe whose BINDs with a logon are refused (BIND_NAK).
    pub fn new(service: Service) -> Pipe {
        Pipe {
            security: None,
            service,
            association: None,
            input: Vec::new(),
            call: Reassembly::default(),
            output: VecDeque::new(),
            read_at: 0,
            queued: 0,
            closed: false,
            policy_handles: Default::default(),
        }
    }

    /// A pipe that takes RPC's own logon through `authenticator` on a
    /// connection the client made to `local`.
    pub fn with_security(
        service: Service,
        authenticator: Authenticator,
        local: IpAddr,
        gate: Option<std::sync::Arc<dyn crate::security::LogonGate>>,
    ) -> Pipe {
        Pipe {
            security: Some(RpcSecurity::new(authenticator, local, gate)),
            ..Pipe::new(service)
        }
    }

    pub fn service(&self) -> Service {
        self.service
    }

    /// Whether an answer waits to be read.
    pub fn has_output(&self) -> bool {
        !self.output.is_empty()
    }

    /// The bytes the pipe holds for its client: answers not read yet, and
    /// what a request still arriving has brought so far. The server counts
    /// them against the connection's memory.
    pub fn buffered(&self) -> usize {
        self.queued + self.input.len() + self.call.held()
    }

    /// Closes the pipe and drops everything it holds, answers included:
    /// what the server does when the pipe would hold more than it may.
    /// Later writes fail as after a protocol error; reads find nothing.
    pub fn shut(&mut self) {
        self.closed = true;
        self.call.clear();
        self.input = Vec::new();
        self.output = VecDeque::new();
        self.read_at = 0;
        self.queued = 0;
    }

    /// Takes what the client wrote: every complete PDU in it is answered
    /// (answers queue for `read`). A protocol error closes the pipe; the
    /// answers queued before it can still be read.
    pub fn write<H: HostSource + ?Sized>(
        &mut self,
        data: &[u8],
        host: &H,
    ) -> Result<(), PipeError> {
        if self.closed {
            return Err(PipeError(
                "the pipe was closed by an earlier protocol error",
            ));
        }
        // Taken out of self while its PDUs are answered, so that each is
        // handled in place rather than copied.
        let mut input = std::mem::take(&mut self.input);
        input.extend_from_slice(data);
        let mut at = 0;
        let outcome = loop {
            let rest = &input[at..];
            if rest.len() < pdu::HEADER_LEN {
                break Ok(());
            }
            let hdr = match Header::parse(rest) {
                Ok(h) => h,
                Err(RpcError::Protocol(why)) => break Err(PipeError(why)),
                Err(RpcError::BadStub) => break Err(PipeError("bad PDU header")),
            };
            let len = hdr.frag_length as usize;
            if rest.len() < len {
                break Ok(());
            }
            at += len;
            if let Err(e) = self.pdu(&hdr, &rest[..len], host) {
                break Err(e);
            }
            if self.queued > MAX_QUEUED {
                break Err(PipeError("answers written for but not read"));
            }
        };
        if let Err(e) = outcome {
            self.closed = true;
            self.call.clear();
            return Err(e);
        }
        input.drain(..at);
        self.input = input;
        Ok(())
    }

    /// Up to `max` bytes of the next answer.
    pub fn read(&mut self, max: usize) -> Option<ReadResult> {
        let front = self.output.front()?;
        let end = self.read_at.saturating_add(max).min(front.len());
        let data = front[self.read_at..end].to_vec();
        if end == front.len() {
            self.queued -= front.len();
            self.output.pop_front();
            self.read_at = 0;
            Some(ReadResult { data, more: false })
        } else {
            self.read_at = end;
            Some(ReadResult { data, more: true })
        }
    }

    fn push(&mut self, pdu: Vec<u8>) {
        self.queued += pdu.len();
        self.output.push_back(pdu);
    }

    fn pdu<H: HostSource + ?Sized>(
        &mut self,
        hdr: &Header,
        pdu: &[u8],
        host: &H,
    ) -> Result<(), PipeError> {
        let auth = hdr.auth_length as usize;
        let body_end = pdu
            .len()
            .checked_sub(auth)
            .filter(|&e| e >= pdu::HEADER_LEN);
        let Some(body_end) = body_end else {
            return Err(PipeError("auth trailer longer than the PDU"));
        };
        let body = &pdu[pdu::HEADER_LEN..body_end];
        // The logon's token, after the sec_trailer that starts where the
        // body ends (a BIND's, an ALTER_CONTEXT's, an AUTH3's).
        let token = || -> Result<Option<(SecTrailer, &[u8])>, PipeError> {
            if auth == 0 {
                return Ok(None);
            }
            let (t, at) =
                SecTrailer::find(pdu, auth).map_err(|_| PipeError("malformed auth trailer"))?;
            Ok(Some((t, &pdu[at + SEC_TRAILER_LEN..])))
        };
        match hdr.ptype {
            ptype::BIND => {
                let body = &pdu[pdu::HEADER_LEN..body_start_of_trailer(pdu, auth)?];
                self.bind(hdr, body, token()?)
            }
            ptype::ALTER_CONTEXT => {
                let body = &pdu[pdu::HEADER_LEN..body_start_of_trailer(pdu, auth)?];
                self.alter_context(hdr, body, token()?)
            }
            ptype::AUTH3 => self.auth3(token()?),
            ptype::REQUEST
                if auth != 0 || self.security.as_ref().is_some_and(|s| s.caller().is_some()) =>
            {
                let mut owned = pdu.to_vec();
                self.protected_request(hdr, &mut owned, host)
            }
            ptype::REQUEST => self.request(hdr, body, host),
            _ => Err(PipeError("PDU type a client does not send")),
        }
    }

    /// A REQUEST with a verifier: checked (and unsealed) before it runs.
    fn protected_request<H: HostSource + ?Sized>(
        &mut self,
        hdr: &Header,
        pdu: &mut [u8],
        host: &H,
    ) -> Result<(), PipeError> {
        let Some(security) = self.security.as_mut() else {
            return Err(PipeError("a verifier on a pipe without a logon"));
        };
        let stub_start = if hdr.flags & flags::OBJECT_UUID != 0 {
            pdu::REQUEST_HEADER_LEN + 16
        } else {
            pdu::REQUEST_HEADER_LEN
        };
        let stub_end = security
            .check_request(hdr, pdu, stub_start)
            .map_err(PipeError)?;
        self.request(hdr, &pdu[pdu::HEADER_LEN..stub_end], host)
    }

    /// An AUTH3: the logon's last leg, which has no answer (MS-RPCE
    /// 3.3.1.5.2.2). A failed logon leaves the pipe, whose calls are then
    /// refused.
    fn auth3(&mut self, token: Option<(SecTrailer, &[u8])>) -> Result<(), PipeError> {
        let (Some(security), Some((trailer, token))) = (self.security.as_mut(), token) else {
            return Err(PipeError("AUTH3 without a logon under way"));
        };
        let leg = security.auth3_leg(trailer, token);
        self.call.clear();
        leg.map_err(PipeError)
    }

    fn bind(
        &mut self,
        hdr: &Header,
        body: &[u8],
        token: Option<(SecTrailer, &[u8])>,
    ) -> Result<(), PipeError> {
        let bind = Bind::parse(body).map_err(|_| PipeError("malformed BIND"))?;
        let mut out = Vec::new();
        if self.association.is_some() {
            // MS-RPCE 3.3.1.5.3: one BIND per association; more contexts
            // come with ALTER_CONTEXT.
            pdu::encode_bind_nak(hdr.call_id, NAK_REASON_NOT_SPECIFIED, &mut out);
            self.push(out);
            return Err(PipeError("second BIND on one association"));
        }
        if bind.max_recv_frag < MIN_FRAG {
            pdu::encode_bind_nak(hdr.call_id, NAK_REASON_NOT_SPECIFIED, &mut out);
            self.push(out);
            return Ok(());
        }
        if let Some(security) = self.security.as_mut() {
            security.bind(hdr.flags & flags::SUPPORT_HEADER_SIGN != 0);
        }
        let mut reply = None;
        if let Some((trailer, token)) = token {
            let started = match self.security.as_mut() {
                Some(security) => security.start(trailer, token),
                None => Err("RPC logons are not offered on this pipe".to_string()),
            };
            match started {
                Ok(t) => reply = Some((trailer, t)),
                Err(why) => {
                    tracing::info!("rpc: a pipe's BIND refused: {why}");
                    pdu::encode_bind_nak(hdr.call_id, NAK_AUTH_TYPE_NOT_RECOGNIZED, &mut out);
                    self.push(out);
                    return Ok(());
                }
            }
        }
        let results = self.judge_contexts(&bind);
        let assoc_group = if bind.assoc_group_id != 0 {
            bind.assoc_group_id
        } else {
            ASSOC_GROUP_BASE
        };
        let association = Association {
            xmit_frag: bind.max_recv_frag.min(MAX_FRAG),
            assoc_group,
            contexts: accepted(&bind, &results),
        };
        BindAck {
            ptype: ptype::BIND_ACK,
            call_id: hdr.call_id,
            max_xmit_frag: association.xmit_frag,
            max_recv_frag: MAX_FRAG,
            assoc_group_id: association.assoc_group,
            secondary_address: self.service.endpoint(),
            results: &results,
            header_sign: self.security.as_ref().is_some_and(|s| s.header_sign()),
        }
        .encode(&mut out);
        if let Some((trailer, token)) = reply {
            pdu::append_auth(&mut out, 0, trailer, &token);
        }
        self.association = Some(association);
        self.push(out);
        Ok(())
    }

    fn alter_context(
        &mut self,
        hdr: &Header,
        body: &[u8],
        token: Option<(SecTrailer, &[u8])>,
    ) -> Result<(), PipeError> {
        let bind = Bind::parse(body).map_err(|_| PipeError("malformed ALTER_CONTEXT"))?;
        if self.association.is_none() {
            return Err(PipeError("ALTER_CONTEXT before BIND"));
        }
        let mut reply = None;
        if let Some((trailer, token)) = token {
            // A leg of the logon (SPNEGO's last one comes this way).
            let Some(security) = self.security.as_mut() else {
                return Err(PipeError("a logon leg on a pipe without a logon"));
            };
            let leg = security.context_leg(trailer, token);
            self.call.clear();
            match leg {
                Ok(t) => reply = t.map(|t| (trailer, t)),
                Err(why) => {
                    let mut out = Vec::new();
                    pdu::encode_fault(hdr.call_id, 0, ACCESS_DENIED, true, &mut out);
                    self.push(out);
                    return Err(PipeError(why));
                }
            }
        }
        let results = self.judge_contexts(&bind);
        let Some(a) = self.association.as_mut() else {
            return Err(PipeError("ALTER_CONTEXT before BIND"));
        };
        for id in accepted(&bind, &results) {
            if !a.contexts.contains(&id) && a.contexts.len() < 64 {
                a.contexts.push(id);
            }
        }
        let mut out = Vec::new();
        BindAck {
            ptype: ptype::ALTER_CONTEXT_RESP,
            call_id: hdr.call_id,
            max_xmit_frag: a.xmit_frag,
            max_recv_frag: MAX_FRAG,
            assoc_group_id: a.assoc_group,
            secondary_address: "",
            results: &results,
            header_sign: false,
        }
        .encode(&mut out);
        if let Some((trailer, token)) = reply {
            pdu::append_auth(&mut out, 0, trailer, &token);
        }
        self.push(out);
        Ok(())
    }

    /// C706 12.6.3.1 / MS-RPCE 3.3.1.5.3: each context is accepted when
    /// it names this pipe's interface and offers NDR 2.0.
    fn judge_contexts(&self, bind: &Bind) -> Vec<ContextResult> {
        let ours = self.service.interface();
        pdu::judge_contexts(bind, |s| *s == ours)
    }

    fn request<H: HostSource + ?Sized>(
        &mut self,
        hdr: &Header,
        body: &[u8],
        host: &H,
    ) -> Result<(), PipeError> {
        let req = Request::parse(hdr, body).map_err(|_| PipeError("malformed REQUEST"))?;
        let Some(a) = self.association.as_ref() else {
            return Err(PipeError("REQUEST before BIND"));
        };
        let known_context = a.contexts.contains(&req.context_id);
        let call = match self.call.add(hdr, &req, MAX_STUB) {
            Ok(Some(call)) => call,
            Ok(None) => return Ok(()),
            Err(why) => return self.refuse(hdr.call_id, req.context_id, why),
        };
        if !known_context {
            let mut out = Vec::new();
            pdu::encode_fault(call.call_id, call.context_id, fault::UNK_IF, true, &mut out);
            self.push(out);
            return Ok(());
        }
        if self
            .security
            .as_ref()
            .is_some_and(|s| s.failed() || s.pending())
        {
            // The client asked for a logon that did not complete.
            let mut out = Vec::new();
            pdu::encode_fault(call.call_id, call.context_id, ACCESS_DENIED, true, &mut out);
            self.push(out);
            return Ok(());
        }
        // The server is described only for a call that runs.
        let answer = self
            .service
            .call(call.opnum, &call.stub, host, &mut self.policy_handles);
        match answer {
            Ok(stub) => return self.respond(call.call_id, call.context_id, &stub),
            Err(status) => {
                let mut out = Vec::new();
                pdu::encode_fault(
                    call.call_id,
                    call.context_id,
                    status,
                    status == fault::OP_RNG_ERROR,
                    &mut out,
                );
                self.push(out);
            }
        }
        Ok(())
    }

    /// A fragment out of order or too long: the call fails with a
    /// protocol error and the pipe closes (MS-RPCE 3.3.3.5.1).
    fn refuse(
        &mut self,
        call_id: u32,
        context_id: u16,
        why: &'static str,
    ) -> Result<(), PipeError> {
        self.call.clear();
        let mut out = Vec::new();
        pdu::encode_fault(call_id, context_id, fault::PROTO_ERROR, true, &mut out);
        self.push(out);
        Err(PipeError(why))
    }

    /// The call's result in as many RESPONSE fragments as the client's
    /// max_recv_frag needs; every fragment but the last carries a
    /// multiple of 8 stub bytes (C706 12.6.3.4).
    fn respond(&mut self, call_id: u32, context_id: u16, stub: &[u8]) -> Result<(), PipeError> {
        let xmit = self.association.as_ref().map_or(MIN_FRAG, |a| a.xmit_frag) as usize;
        let overhead = match self.security.as_ref().map(|s| s.overhead(xmit)) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(n))) => Some(n),
            Some(Err(_)) => return self.give_up(),
        };
        // Protected fragments' stubs are padded to 16 (so to 8).
        let chunk = match overhead {
            Some(n) => ((xmit - pdu::REQUEST_HEADER_LEN - n) / AUTH_PAD) * AUTH_PAD,
            None => ((xmit - pdu::REQUEST_HEADER_LEN) / 8) * 8,
        };
        // Made whole before any is queued: an answer is sent complete and
        // protected, or not at all.
        let mut fragments = Vec::new();
        for (pfc, alloc_hint, range) in crate::fragments::split(stub.len(), chunk) {
            let mut out = Vec::with_capacity(pdu::REQUEST_HEADER_LEN + range.len());
            pdu::encode_response(call_id, pfc, alloc_hint, context_id, &stub[range], &mut out);
            if let Some(security) = self.security.as_mut() {
                if security.protect(&mut out).is_err() {
                    return self.give_up();
                }
            }
            fragments.push(out);
        }
        for out in fragments {
            self.push(out);
        }
        Ok(())
    }

    /// An answer could not be protected (the GSS-API library refused):
    /// the pipe closes rather than answer unprotected.
    fn give_up(&mut self) -> Result<(), PipeError> {
        Err(PipeError("an answer that could not be protected"))
    }
}

/// Where a BIND's or ALTER_CONTEXT's body ends: at its sec_trailer when
/// it carries a token (the padding before the trailer is not the body's).
fn body_start_of_trailer(pdu: &[u8], auth_len: usize) -> Result<usize, PipeError> {
    if auth_len == 0 {
        return Ok(pdu.len());
    }
    SecTrailer::find(pdu, auth_len)
        .map(|(_, at)| at)
        .map_err(|_| PipeError("malformed auth trailer"))
}

fn accepted(bind: &Bind, results: &[ContextResult]) -> Vec<u16> {
    bind.contexts
        .iter()
        .zip(results)
        .filter(|(_, r)| r.result == result::ACCEPTANCE)
        .map(|(c, _)| c.id)
        .take(64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ndr::{Reader, Writer};
    use crate::pdu::SyntaxId;
    use crate::pdu::{flags, reason};
    use crate::{srvsvc, werror, Host, ShareEntry, ShareKind};

    const NDR64: SyntaxId = SyntaxId {
        uuid: [
            0x33, 0x05, 0x71, 0x71, 0xba, 0xbe, 0x37, 0x49, 0x83, 0x19, 0xb5, 0xdb, 0xef, 0x9c,
            0xcc, 0x36,
        ],
        major: 1,
        minor: 0,
    };
    const BTFN: SyntaxId = SyntaxId {
        uuid: [
            0x2c, 0x1c, 0xb7, 0x6c, 0x12, 0x98, 0x40, 0x45, 0x03, 0x00, 0, 0, 0, 0, 0, 0,
        ],
        major: 1,
        minor: 0,
    };

    fn host(n: usize) -> Host {
        let mut shares: Vec<ShareEntry> = (0..n)
            .map(|i| ShareEntry {
                name: format!("share{i}"),
                kind: ShareKind::Disk,
                comment: format!("comment {i}"),
                current_uses: i as u32,
                encrypt_data: false,
            })
            .collect();
        shares.push(ShareEntry {
            name: "IPC$".into(),
            kind: ShareKind::Ipc,
            comment: "Remote IPC".into(),
            current_uses: 0,
            encrypt_data: false,
        });
        Host {
            name: "NIMBUS".into(),
            workgroup: "WORKGROUP".into(),
            comment: "Nimbus".into(),
            shares,
            may_enumerate: true,
        }
    }

    fn header(ptype: u8, pfc: u8, call_id: u32, body: &[u8]) -> Vec<u8> {
        let mut out = vec![5, 0, ptype, pfc, 0x10, 0, 0, 0];
        out.extend_from_slice(&((16 + body.len()) as u16).to_le_bytes());
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&call_id.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    fn syntax(s: &SyntaxId) -> Vec<u8> {
        let mut v = s.uuid.to_vec();
        v.extend_from_slice(&s.major.to_le_bytes());
        v.extend_from_slice(&s.minor.to_le_bytes());
        v
    }

    fn bind_pdu(max_recv: u16, contexts: &[(u16, SyntaxId, Vec<SyntaxId>)]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&MAX_FRAG.to_le_bytes());
        body.extend_from_slice(&max_recv.to_le_bytes());
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&[contexts.len() as u8, 0, 0, 0]);
        for (id, abs, ts) in contexts {
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&[ts.len() as u8, 0]);
            body.extend(syntax(abs));
            for t in ts {
                body.extend(syntax(t));
            }
        }
        header(ptype::BIND, 3, 1, &body)
    }

    fn request_pdu(pfc: u8, call_id: u32, opnum: u16, stub: &[u8]) -> Vec<u8> {
        let mut body = Vec::new();
        body.extend_from_slice(&(stub.len() as u32).to_le_bytes());
        body.extend_from_slice(&0u16.to_le_bytes());
        body.extend_from_slice(&opnum.to_le_bytes());
        body.extend_from_slice(stub);
        header(ptype::REQUEST, pfc, call_id, &body)
    }

    fn bound(max_recv: u16, h: &Host) -> Pipe {
        let mut p = Pipe::new(Service::Srvsvc);
        p.write(
            &bind_pdu(max_recv, &[(0, srvsvc::INTERFACE, vec![pdu::NDR20])]),
            h,
        )
        .unwrap();
        p.read(usize::MAX).unwrap();
        p
    }

    fn enum_stub(level: u32, resume: Option<u32>, preferred: u32) -> Vec<u8> {
        let mut w = Writer::new();
        w.wstring_pointer("\\\\127.0.0.1");
        crate::srvsvc::tests::enum_tail(&mut w, level, preferred, resume);
        w.into_bytes()
    }

    /// Reads every answer PDU; returns (ptype, pfc flags, stub) of each.
    fn answers(p: &mut Pipe) -> Vec<(u8, u8, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(r) = p.read(usize::MAX) {
            assert!(!r.more);
            let d = r.data;
            let len = u16::from_le_bytes([d[8], d[9]]) as usize;
            assert_eq!(len, d.len());
            out.push((d[2], d[3], d[24.min(d.len())..].to_vec()));
        }
        out
    }

    /// Level-1 entries of a NetrShareEnum answer: (name, type, comment),
    /// and TotalEntries, the resume value and the status.
    /// (name, type, comment) of one level-1 entry.
    type Entry1 = (String, u32, String);

    fn decode_enum_1(stub: &[u8]) -> (Vec<Entry1>, u32, Option<u32>, u32) {
        let mut r = Reader::new(stub);
        assert_eq!(r.u32().unwrap(), 1);
        assert_eq!(r.u32().unwrap(), 1);
        assert!(r.pointer().unwrap());
        let count = r.u32().unwrap();
        let mut entries = Vec::new();
        if r.pointer().unwrap() {
            assert_eq!(r.u32().unwrap(), count);
            let mut types = Vec::new();
            for _ in 0..count {
                assert!(r.pointer().unwrap());
                types.push(r.u32().unwrap());
                assert!(r.pointer().unwrap());
            }
            for t in types {
                let name = r.wstring().unwrap();
                let comment = r.wstring().unwrap();
                entries.push((name, t, comment));
            }
        }
        let (total, resume, status) = crate::srvsvc::tests::close_answer(&mut r);
        (entries, total, resume, status)
    }

    #[test]
    fn bind_accepts_ndr_for_the_pipes_interface_only() {
        let h = host(1);
        let mut p = Pipe::new(Service::Srvsvc);
        let bind = bind_pdu(
            MAX_FRAG,
            &[
                (0, srvsvc::INTERFACE, vec![pdu::NDR20]),
                (1, srvsvc::INTERFACE, vec![NDR64]),
                (2, srvsvc::INTERFACE, vec![BTFN]),
                (3, crate::wkssvc::INTERFACE, vec![pdu::NDR20]),
            ],
        );
        p.write(&bind, &h).unwrap();
        let ack = p.read(usize::MAX).unwrap().data;
        assert_eq!(ack[2], ptype::BIND_ACK);
        // max_xmit, max_recv, assoc group, "\PIPE\srvsvc" (13 with NUL).
        assert_eq!(u16::from_le_bytes([ack[16], ack[17]]), MAX_FRAG);
        assert_ne!(u32::from_le_bytes([ack[20], ack[21], ack[22], ack[23]]), 0);
        assert_eq!(u16::from_le_bytes([ack[24], ack[25]]), 13);
        assert_eq!(&ack[26..39], b"\\PIPE\\srvsvc\0");
        let results = &ack[40..]; // 26 + 13 = 39, padded to 40
        assert_eq!(results[0], 4);
        let result = |i: usize| {
            let r = &results[4 + 24 * i..];
            (
                u16::from_le_bytes([r[0], r[1]]),
                u16::from_le_bytes([r[2], r[3]]),
                r[4..24].to_vec(),
            )
        };
        assert_eq!(result(0), (result::ACCEPTANCE, 0, syntax(&pdu::NDR20)));
        assert_eq!(
            result(1),
            (
                result::PROVIDER_REJECTION,
                reason::TRANSFER_SYNTAXES_NOT_SUPPORTED,
                vec![0; 20]
            )
        );
        assert_eq!(result(2).0, result::NEGOTIATE_ACK);
        assert_eq!(
            result(3),
            (
                result::PROVIDER_REJECTION,
                reason::ABSTRACT_SYNTAX_NOT_SUPPORTED,
                vec![0; 20]
            )
        );
        assert_eq!(
            u16::from_le_bytes([ack[8], ack[9]]) as usize,
            40 + 4 + 4 * 24
        );

        // A call on the rejected context fails; on the accepted one it runs.
        let mut body = Vec::new();
        body.extend_from_slice(&0u32.to_le_bytes());
        body.extend_from_slice(&1u16.to_le_bytes());
        body.extend_from_slice(&srvsvc::opnum::NETR_SHARE_ENUM.to_le_bytes());
        body.extend(enum_stub(1, None, u32::MAX));
        p.write(&header(ptype::REQUEST, 3, 2, &body), &h).unwrap();
        let a = answers(&mut p);
        assert_eq!(a[0].0, ptype::FAULT);
        assert_eq!(&a[0].2[..4], &fault::UNK_IF.to_le_bytes());
    }

    #[test]
    fn share_enum_lists_every_share_with_type_and_comment() {
        let h = host(2);
        let mut p = bound(MAX_FRAG, &h);
        p.write(
            &request_pdu(
                3,
                7,
                srvsvc::opnum::NETR_SHARE_ENUM,
                &enum_stub(1, Some(0), u32::MAX),
            ),
            &h,
        )
        .unwrap();
        let a = answers(&mut p);
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].0, a[0].1), (ptype::RESPONSE, 3));
        let (entries, total, resume, status) = decode_enum_1(&a[0].2);
        assert_eq!(
            entries,
            vec![
                ("share0".into(), 0, "comment 0".into()),
                ("share1".into(), 0, "comment 1".into()),
                ("IPC$".into(), 0x8000_0003, "Remote IPC".into())
            ]
        );
        assert_eq!((total, resume, status), (3, Some(0), werror::OK));
    }

    #[test]
    fn share_enum_pages_with_a_resume_handle() {
        let h = host(40);
        let mut p = bound(MAX_FRAG, &h);
        let mut seen = Vec::new();
        let mut resume = 0;
        for round in 0.. {
            assert!(round < 41);
            p.write(
                &request_pdu(
                    3,
                    round + 1,
                    srvsvc::opnum::NETR_SHARE_ENUM,
                    &enum_stub(1, Some(resume), 200),
                ),
                &h,
            )
            .unwrap();
            let a = answers(&mut p);
            let (entries, total, next, status) = decode_enum_1(&a[0].2);
            assert_eq!(total, 41);
            assert!(!entries.is_empty() && entries.len() < 41);
            seen.extend(entries.into_iter().map(|e| e.0));
            if status == werror::OK {
                break;
            }
            assert_eq!(status, werror::MORE_DATA);
            resume = next.unwrap();
        }
        let all: Vec<String> = h.shares.iter().map(|s| s.name.clone()).collect();
        assert_eq!(seen, all);
    }

    #[test]
    fn long_answers_are_fragmented_to_the_clients_size() {
        let h = host(200);
        let mut p = bound(MIN_FRAG, &h);
        p.write(
            &request_pdu(
                3,
                9,
                srvsvc::opnum::NETR_SHARE_ENUM,
                &enum_stub(1, None, u32::MAX),
            ),
            &h,
        )
        .unwrap();
        let a = answers(&mut p);
        assert!(a.len() > 3);
        let mut stub = Vec::new();
        for (i, (t, pfc, s)) in a.iter().enumerate() {
            assert_eq!(*t, ptype::RESPONSE);
            assert_eq!(*pfc & flags::FIRST_FRAG != 0, i == 0);
            assert_eq!(*pfc & flags::LAST_FRAG != 0, i == a.len() - 1);
            assert!(s.len() + 24 <= MIN_FRAG as usize);
            if i < a.len() - 1 {
                assert_eq!(s.len() % 8, 0);
            }
            stub.extend_from_slice(s);
        }
        let (entries, total, _, status) = decode_enum_1(&stub);
        assert_eq!((entries.len(), total, status), (201, 201, werror::OK));
    }

    #[test]
    fn reads_smaller_than_a_message_continue_it() {
        let h = host(3);
        let mut p = bound(MAX_FRAG, &h);
        p.write(
            &request_pdu(
                3,
                2,
                srvsvc::opnum::NETR_SHARE_ENUM,
                &enum_stub(1, None, u32::MAX),
            ),
            &h,
        )
        .unwrap();
        let first = p.read(10).unwrap();
        assert!(first.more);
        let rest = p.read(usize::MAX).unwrap();
        assert!(!rest.more);
        let len = u16::from_le_bytes([first.data[8], first.data[9]]) as usize;
        assert_eq!(first.data.len() + rest.data.len(), len);
        assert!(p.read(10).is_none());
    }

    #[test]
    fn buffered_counts_unread_answers_and_partial_input_and_shut_drops_them() {
        let h = host(3);
        let mut p = Pipe::new(Service::Srvsvc);
        assert_eq!(p.buffered(), 0);
        let bind = bind_pdu(MAX_FRAG, &[(0, srvsvc::INTERFACE, vec![pdu::NDR20])]);
        // Half a PDU waits in the input.
        p.write(&bind[..10], &h).unwrap();
        assert_eq!(p.buffered(), 10);
        p.write(&bind[10..], &h).unwrap();
        let ack = p.buffered();
        assert!(ack > 0 && p.has_output());
        let req = request_pdu(
            3,
            2,
            srvsvc::opnum::NETR_SHARE_ENUM,
            &enum_stub(1, None, u32::MAX),
        );
        p.write(&req, &h).unwrap();
        let both = p.buffered();
        assert!(both > ack);
        // A read of part of an answer frees nothing until the answer is read.
        let part = p.read(10).unwrap();
        assert!(part.more);
        assert_eq!(p.buffered(), both);
        p.read(usize::MAX).unwrap();
        assert_eq!(p.buffered(), both - ack);
        p.shut();
        assert_eq!(p.buffered(), 0);
        assert!(p.read(usize::MAX).is_none());
        assert!(p.write(&req, &h).is_err());
    }

    #[test]
    fn fragmented_requests_are_joined_and_disordered_ones_refused() {
        let h = host(1);
        let stub = enum_stub(1, None, u32::MAX);
        let (a, b) = stub.split_at(8);
        let mut p = bound(MAX_FRAG, &h);
        p.write(
            &request_pdu(flags::FIRST_FRAG, 4, srvsvc::opnum::NETR_SHARE_ENUM, a),
            &h,
        )
        .unwrap();
        assert!(!p.has_output());
        // One write may also hold a PDU cut in two.
        let last = request_pdu(flags::LAST_FRAG, 4, srvsvc::opnum::NETR_SHARE_ENUM, b);
        p.write(&last[..5], &h).unwrap();
        p.write(&last[5..], &h).unwrap();
        let (entries, ..) = decode_enum_1(&answers(&mut p)[0].2);
        assert_eq!(entries.len(), 2);

        for bad in [
            vec![request_pdu(flags::LAST_FRAG, 5, 15, b)],
            vec![
                request_pdu(flags::FIRST_FRAG, 5, 15, a),
                request_pdu(flags::FIRST_FRAG, 6, 15, a),
            ],
            vec![
                request_pdu(flags::FIRST_FRAG, 5, 15, a),
                request_pdu(flags::LAST_FRAG, 6, 15, b),
            ],
        ] {
            let mut p = bound(MAX_FRAG, &h);
            let mut result = Ok(());
            for pdu in &bad {
                result = p.write(pdu, &h);
            }
            assert!(result.is_err());
            let a = answers(&mut p);
            assert_eq!(a.last().unwrap().0, ptype::FAULT);
            assert_eq!(&a.last().unwrap().2[..4], &fault::PROTO_ERROR.to_le_bytes());
            assert!(
                p.write(&request_pdu(3, 9, 15, &stub), &h).is_err(),
                "closed after a protocol error"
            );
        }
    }

    #[test]
    fn oversized_requests_are_refused() {
        let h = host(1);
        let mut p = bound(MAX_FRAG, &h);
        let chunk = vec![0u8; 4000];
        let mut result = p.write(&request_pdu(flags::FIRST_FRAG, 3, 15, &chunk), &h);
        for _ in 0..(MAX_STUB / chunk.len()) {
            if result.is_err() {
                break;
            }
            result = p.write(&request_pdu(0, 3, 15, &chunk), &h);
        }
        assert!(result.is_err());
    }

    #[test]
    fn unknown_operations_and_bad_stubs_fault() {
        let h = host(1);
        let mut p = bound(MAX_FRAG, &h);
        p.write(&request_pdu(3, 2, 99, &[]), &h).unwrap();
        p.write(
            &request_pdu(3, 3, srvsvc::opnum::NETR_SHARE_ENUM, &[1, 2, 3]),
            &h,
        )
        .unwrap();
        let a = answers(&mut p);
        assert_eq!(a[0].0, ptype::FAULT);
        assert_eq!(&a[0].2[..4], &fault::OP_RNG_ERROR.to_le_bytes());
        assert_eq!(a[1].0, ptype::FAULT);
        assert_eq!(&a[1].2[..4], &fault::BAD_STUB_DATA.to_le_bytes());
    }

    #[test]
    fn protocol_errors_close_the_pipe() {
        let h = host(1);
        // Not version 5; a request before any bind; a second bind.
        let mut bad_version = bind_pdu(MAX_FRAG, &[(0, srvsvc::INTERFACE, vec![pdu::NDR20])]);
        bad_version[0] = 4;
        assert!(Pipe::new(Service::Srvsvc).write(&bad_version, &h).is_err());
        assert!(Pipe::new(Service::Srvsvc)
            .write(&request_pdu(3, 1, 15, &[]), &h)
            .is_err());
        let mut p = bound(MAX_FRAG, &h);
        assert!(p
            .write(
                &bind_pdu(MAX_FRAG, &[(0, srvsvc::INTERFACE, vec![pdu::NDR20])]),
                &h
            )
            .is_err());
        assert_eq!(answers(&mut p)[0].0, ptype::BIND_NAK);
        // A fragment length below the header's own.
        let mut short = request_pdu(3, 1, 15, &[]);
        short[8] = 4;
        assert!(bound(MAX_FRAG, &h).write(&short, &h).is_err());
    }

    #[test]
    fn share_get_info_and_server_get_info() {
        let h = host(1);
        let mut p = bound(MAX_FRAG, &h);
        let mut w = Writer::new();
        w.null_pointer();
        w.wstring("SHARE0");
        w.u32(1);
        p.write(
            &request_pdu(3, 2, srvsvc::opnum::NETR_SHARE_GET_INFO, &w.into_bytes()),
            &h,
        )
        .unwrap();
        let mut w = Writer::new();
        w.null_pointer();
        w.wstring("nope");
        w.u32(1);
        p.write(
            &request_pdu(3, 3, srvsvc::opnum::NETR_SHARE_GET_INFO, &w.into_bytes()),
            &h,
        )
        .unwrap();
        let mut w = Writer::new();
        w.null_pointer();
        w.u32(101);
        p.write(
            &request_pdu(3, 4, srvsvc::opnum::NETR_SERVER_GET_INFO, &w.into_bytes()),
            &h,
        )
        .unwrap();
        let a = answers(&mut p);

        let mut r = Reader::new(&a[0].2);
        assert_eq!(r.u32().unwrap(), 1);
        assert!(r.pointer().unwrap());
        assert!(r.pointer().unwrap());
        assert_eq!(r.u32().unwrap(), 0);
        assert!(r.pointer().unwrap());
        assert_eq!(r.wstring().unwrap(), "share0");
        assert_eq!(r.wstring().unwrap(), "comment 0");
        assert_eq!(r.u32().unwrap(), werror::OK);

        let mut r = Reader::new(&a[1].2);
        assert_eq!(r.u32().unwrap(), 1);
        assert!(!r.pointer().unwrap());
        assert_eq!(r.u32().unwrap(), werror::NET_NAME_NOT_FOUND);

        let mut r = Reader::new(&a[2].2);
        assert_eq!(r.u32().unwrap(), 101);
        assert!(r.pointer().unwrap());
        assert_eq!(r.u32().unwrap(), 500);
        assert!(r.pointer().unwrap());
        assert_eq!(
            (r.u32().unwrap(), r.u32().unwrap(), r.u32().unwrap()),
            (10, 0, 0x9003)
        );
        assert!(r.pointer().unwrap());
        assert_eq!(r.wstring().unwrap(), "NIMBUS");
        assert_eq!(r.wstring().unwrap(), "Nimbus");
        assert_eq!(r.u32().unwrap(), werror::OK);
    }

    #[test]
    fn callers_who_may_not_enumerate_are_refused() {
        let mut h = host(1);
        h.may_enumerate = false;
        let mut p = bound(MAX_FRAG, &h);
        p.write(
            &request_pdu(
                3,
                2,
                srvsvc::opnum::NETR_SHARE_ENUM,
                &enum_stub(1, None, u32::MAX),
            ),
            &h,
        )
        .unwrap();
        let a = answers(&mut p);
        let mut r = Reader::new(&a[0].2);
        assert_eq!((r.u32().unwrap(), r.u32().unwrap()), (1, 1));
        assert!(!r.pointer().unwrap());
        assert_eq!(r.u32().unwrap(), 0);
        assert!(!r.pointer().unwrap());
        assert_eq!(r.u32().unwrap(), werror::ACCESS_DENIED);
    }
}
