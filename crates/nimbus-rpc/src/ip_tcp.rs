//! One DCE/RPC association over TCP (`ncacn_ip_tcp`, MS-RPCE 2.1.1.1),
//! with the authentication a service reached over the network needs:
//! NTLMSSP or Kerberos, bare or in SPNEGO, at the integrity or privacy
//! level (MS-RPCE 3.3.1.5.2; the packet level is served as integrity,
//! `crate::pdu::auth::signs`), as the witness service asks of its clients
//! (MS-SWN 7: Windows refuses calls below integrity). The logon and the
//! verifiers are `crate::security`'s.
//!
//! No I/O, as the rest of the crate: the caller reads whole PDUs (the
//! header's frag_length says how long) and hands each to
//! [`Association::receive`]; it gets back PDUs to write and, when a call's
//! last fragment arrived, the call to run. Calls may be answered out of
//! order (the witness's AsyncNotify waits for an event while later calls
//! are answered), through [`Association::respond`] and
//! [`Association::fault`], whose PDUs must be written in the order they
//! are made: each carries the next signature sequence number.

use std::net::IpAddr;

use nimbus_auth::Authenticator;

use crate::fragments::Reassembly;
use crate::pdu::{
    self, auth, flags, ptype, result, Bind, BindAck, ContextResult, Header, Request, SecTrailer,
    SyntaxId, SEC_TRAILER_LEN,
};
pub use crate::security::{Caller, LogonGate};
use crate::security::{RpcSecurity, AUTH_PAD};
use crate::{fault, RpcError};

/// The largest fragment this end sends and accepts.
pub const MAX_FRAG: u16 = 5840;
/// C706 12.6.3.1: every implementation takes fragments this long.
const MIN_FRAG: u16 = 1432;
/// A request's stub, all fragments together: the calls served take a
/// few hundred bytes.
pub const MAX_STUB: usize = 64 * 1024;
/// Presentation contexts one association may hold.
const MAX_CONTEXTS: usize = 16;
/// MS-RPCE 3.3.1.5.6: the association group a BIND without one joins.
const ASSOC_GROUP: u32 = 0x0005_3a10;
/// RPC_S_ACCESS_DENIED, as a fault status (MS-RPCE 3.3.1.5.2).
const ACCESS_DENIED: u32 = 0x0000_0005;
/// C706 12.6.3.1 p_reject_reason_t values sent in a BIND_NAK.
const NAK_REASON_NOT_SPECIFIED: u16 = 0;
const NAK_AUTH_TYPE_NOT_RECOGNIZED: u16 = 8;

/// An interface the association serves, and whether its calls need
/// every PDU signed (the packet, integrity or privacy level).
#[derive(Clone, Copy, Debug)]
pub struct Served {
    pub syntax: SyntaxId,
    pub needs_integrity: bool,
}

/// A call whose fragments all arrived, to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub call_id: u32,
    pub context_id: u16,
    pub interface: SyntaxId,
    pub opnum: u16,
    pub stub: Vec<u8>,
}

/// What one received PDU produced.
#[derive(Debug, Default)]
pub struct Received {
    /// PDUs to write now, in order.
    pub out: Vec<Vec<u8>>,
    /// A call to run and answer.
    pub call: Option<Call>,
    /// The association must end (the reason, for the log) once `out` is
    /// written.
    pub close: Option<&'static str>,
}

pub struct Association {
    served: Vec<Served>,
    /// The client's max_recv_frag within ours; None before the BIND.
    xmit_frag: Option<u16>,
    /// The association group the BIND_ACK named.
    assoc_group: u32,
    /// The association ended: nothing more is answered on it.
    closed: bool,
    contexts: Vec<(u16, SyntaxId)>,
    security: RpcSecurity,
    partial: Reassembly,
}

impl Association {
    /// A new association on a connection the client made to `local`.
    pub fn new(
        served: Vec<Served>,
        authenticator: Authenticator,
        local: IpAddr,
        gate: Option<std::sync::Arc<dyn LogonGate>>,
    ) -> Association {
        Association {
            served,
            xmit_frag: None,
            assoc_group: ASSOC_GROUP,
            closed: false,
            contexts: Vec::new(),
            security: RpcSecurity::new(authenticator, local, gate),
            partial: Reassembly::default(),
        }
    }

    /// The authenticated client, once its logon completed.
    pub fn caller(&self) -> Option<&Caller> {
        self.security.caller()
    }

    /// Handles one whole PDU (`pdu.len()` is its frag_length).
    pub fn receive(&mut self, mut pdu: Vec<u8>) -> Received {
        let hdr = match Header::parse(&pdu) {
            Ok(h) if h.frag_length as usize == pdu.len() => h,
            Ok(_) => return closing("fragment length is not the PDU's length"),
            Err(RpcError::Protocol(why)) => return closing(why),
            Err(RpcError::BadStub) => return closing("malformed PDU"),
        };
        if self.closed {
            return closing("the association ended");
        }
        let r = match hdr.ptype {
            ptype::BIND => self.bind(&hdr, &pdu),
            ptype::ALTER_CONTEXT => self.alter_context(&hdr, &pdu),
            ptype::AUTH3 => self.auth3(&hdr, &pdu),
            ptype::REQUEST => self.request(&hdr, &mut pdu),
            _ => Err("PDU type a client does not send"),
        };
        let r = r.unwrap_or_else(closing);
        self.closed |= r.close.is_some();
        r
    }

    /// Ends the association (its connection closed): later answers to
    /// calls still running are dropped, never sent unprotected.
    pub fn close(&mut self) {
        self.closed = true;
    }

    fn bind(&mut self, hdr: &Header, pdu: &[u8]) -> Result<Received, &'static str> {
        if self.xmit_frag.is_some() {
            // MS-RPCE 3.3.1.5.3: one BIND per association.
            let mut out = Vec::new();
            pdu::encode_bind_nak(hdr.call_id, NAK_REASON_NOT_SPECIFIED, &mut out);
            return Ok(Received {
                out: vec![out],
                call: None,
                close: Some("second BIND on one association"),
            });
        }
        let (bind, token) = parse_bind(hdr, pdu)?;
        self.security
            .bind(hdr.flags & flags::SUPPORT_HEADER_SIGN != 0);
        if bind.max_recv_frag < MIN_FRAG {
            let mut out = Vec::new();
            pdu::encode_bind_nak(hdr.call_id, NAK_REASON_NOT_SPECIFIED, &mut out);
            return Ok(answer(out));
        }
        let mut reply_token = None;
        if let Some((trailer, token)) = token {
            match self.security.start(trailer, token) {
                Ok(t) => {
                    // A call is protected whole or not at all.
                    self.partial.clear();
                    reply_token = Some((trailer, t));
                }
                Err(why) => {
                    tracing::info!("rpc: BIND refused: {why}");
                    let mut out = Vec::new();
                    pdu::encode_bind_nak(hdr.call_id, NAK_AUTH_TYPE_NOT_RECOGNIZED, &mut out);
                    return Ok(answer(out));
                }
            }
        }
        let xmit = bind.max_recv_frag.min(MAX_FRAG);
        self.xmit_frag = Some(xmit);
        if bind.assoc_group_id != 0 {
            self.assoc_group = bind.assoc_group_id;
        }
        Ok(self.context_ack(ptype::BIND_ACK, hdr.call_id, xmit, &bind, reply_token))
    }

    fn alter_context(&mut self, hdr: &Header, pdu: &[u8]) -> Result<Received, &'static str> {
        let Some(xmit) = self.xmit_frag else {
            return Err("ALTER_CONTEXT before BIND");
        };
        let (bind, token) = parse_bind(hdr, pdu)?;
        let mut reply = None;
        if let Some((trailer, token)) = token {
            // A leg of the logon (SPNEGO's last one comes this way).
            let leg = self.security.context_leg(trailer, token);
            self.partial.clear();
            match leg {
                Ok(t) => reply = t.map(|t| (trailer, t)),
                Err(why) => {
                    let mut out = Vec::new();
                    pdu::encode_fault(hdr.call_id, 0, ACCESS_DENIED, true, &mut out);
                    return Ok(Received {
                        out: vec![out],
                        call: None,
                        close: Some(why),
                    });
                }
            }
        }
        Ok(self.context_ack(ptype::ALTER_CONTEXT_RESP, hdr.call_id, xmit, &bind, reply))
    }

    /// The BIND_ACK or ALTER_CONTEXT_RESP: the contexts judged (and those
    /// accepted recorded), and the logon's next token if there is one.
    fn context_ack(
        &mut self,
        ptype: u8,
        call_id: u32,
        xmit: u16,
        bind: &Bind,
        token: Option<(SecTrailer, Vec<u8>)>,
    ) -> Received {
        let results = self.accept_contexts(bind);
        let mut out = Vec::new();
        BindAck {
            ptype,
            call_id,
            max_xmit_frag: xmit,
            max_recv_frag: MAX_FRAG,
            assoc_group_id: self.assoc_group,
            secondary_address: "",
            results: &results,
            header_sign: ptype == ptype::BIND_ACK && self.security.header_sign(),
        }
        .encode(&mut out);
        if let Some((trailer, token)) = token {
            pdu::append_auth(&mut out, 0, trailer, &token);
        }
        answer(out)
    }

    fn auth3(&mut self, hdr: &Header, pdu: &[u8]) -> Result<Received, &'static str> {
        if hdr.auth_length == 0 {
            return Err("AUTH3 without a token");
        }
        let (trailer, at) = SecTrailer::find(pdu, hdr.auth_length as usize)
            .map_err(|_| "AUTH3 with a malformed trailer")?;
        let token = &pdu[at + SEC_TRAILER_LEN..];
        let leg = self.security.auth3_leg(trailer, token);
        self.partial.clear();
        leg.map(|()| Received::default())
    }

    /// Judges a BIND's or ALTER_CONTEXT's contexts and records those
    /// accepted: a context id named again takes its new interface, and
    /// beyond `MAX_CONTEXTS` a new one is refused.
    fn accept_contexts(&mut self, bind: &Bind) -> Vec<ContextResult> {
        let served = &self.served;
        let mut results = pdu::judge_contexts(bind, |s| served.iter().any(|x| x.syntax == *s));
        for (c, r) in bind.contexts.iter().zip(results.iter_mut()) {
            if r.result != result::ACCEPTANCE {
                continue;
            }
            if let Some(known) = self.contexts.iter_mut().find(|(id, _)| *id == c.id) {
                known.1 = c.abstract_syntax;
            } else if self.contexts.len() < MAX_CONTEXTS {
                self.contexts.push((c.id, c.abstract_syntax));
            } else {
                r.result = result::PROVIDER_REJECTION;
                r.reason = pdu::reason::NONE;
                r.transfer_syntax = SyntaxId {
                    uuid: [0; 16],
                    major: 0,
                    minor: 0,
                };
            }
        }
        results
    }

    fn request(&mut self, hdr: &Header, pdu: &mut [u8]) -> Result<Received, &'static str> {
        if self.xmit_frag.is_none() {
            return Err("REQUEST before BIND");
        }
        let stub_start = if hdr.flags & flags::OBJECT_UUID != 0 {
            pdu::REQUEST_HEADER_LEN + 16
        } else {
            pdu::REQUEST_HEADER_LEN
        };
        let stub_end = self.security.check_request(hdr, pdu, stub_start)?;
        let req = Request::parse(hdr, &pdu[pdu::HEADER_LEN..stub_end])
            .map_err(|_| "malformed REQUEST")?;
        let Some(p) = self.partial.add(hdr, &req, MAX_STUB)? else {
            return Ok(Received::default());
        };
        let Some(&(_, interface)) = self.contexts.iter().find(|(id, _)| *id == p.context_id) else {
            return Ok(answer(fault_pdu(p.call_id, p.context_id, fault::UNK_IF)));
        };
        let needs = self
            .served
            .iter()
            .any(|s| s.syntax == interface && s.needs_integrity);
        let level = self.caller().map_or(0, |c| c.level);
        if needs && !auth::signs(level) {
            return Ok(answer(fault_pdu(p.call_id, p.context_id, ACCESS_DENIED)));
        }
        Ok(Received {
            out: Vec::new(),
            call: Some(Call {
                call_id: p.call_id,
                context_id: p.context_id,
                interface,
                opnum: p.opnum,
                stub: p.stub,
            }),
            close: None,
        })
    }

    /// The call's result, in as many RESPONSE fragments as the client's
    /// max_recv_frag needs, each signed or sealed at the association's
    /// level. Write them in the order made.
    pub fn respond(&mut self, call: &Call, stub: &[u8]) -> Vec<Vec<u8>> {
        if self.closed {
            return Vec::new();
        }
        let xmit = self.xmit_frag.unwrap_or(MIN_FRAG) as usize;
        let overhead = match self.security.overhead(xmit) {
            Ok(extra) => pdu::REQUEST_HEADER_LEN + extra.unwrap_or(0),
            Err(_) => return self.give_up(),
        };
        // Every fragment but the last carries a multiple of 16 (so of 8,
        // C706 12.6.3.4) stub bytes.
        let chunk = ((xmit - overhead) / AUTH_PAD) * AUTH_PAD;
        let mut pdus = Vec::new();
        for (pfc, alloc_hint, range) in crate::fragments::split(stub.len(), chunk) {
            let mut out = Vec::with_capacity(overhead + range.len());
            pdu::encode_response(
                call.call_id,
                pfc,
                alloc_hint,
                call.context_id,
                &stub[range],
                &mut out,
            );
            if self.security.protect(&mut out).is_err() {
                return self.give_up();
            }
            pdus.push(out);
        }
        pdus
    }

    /// A verifier could not be made (the GSS-API library refused): the
    /// association ends rather than answer unprotected.
    fn give_up(&mut self) -> Vec<Vec<u8>> {
        tracing::warn!("rpc: an answer could not be protected; the association ends");
        self.closed = true;
        Vec::new()
    }

    /// Whether the association ended (its connection should close).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// A fault in answer to `call`.
    pub fn fault(&self, call: &Call, status: u32) -> Vec<u8> {
        fault_pdu(call.call_id, call.context_id, status)
    }
}

/// A BIND or ALTER_CONTEXT's body and its auth verifier's trailer and
/// token, if any.
#[allow(clippy::type_complexity)]
fn parse_bind<'a>(
    hdr: &Header,
    pdu: &'a [u8],
) -> Result<(Bind, Option<(SecTrailer, &'a [u8])>), &'static str> {
    let auth_len = hdr.auth_length as usize;
    let (body_end, token) = if auth_len == 0 {
        (pdu.len(), None)
    } else {
        let (t, at) = SecTrailer::find(pdu, auth_len).map_err(|_| "malformed trailer")?;
        (at, Some((t, &pdu[at + SEC_TRAILER_LEN..])))
    };
    let bind = Bind::parse(&pdu[pdu::HEADER_LEN..body_end]).map_err(|_| "malformed BIND")?;
    Ok((bind, token))
}

fn fault_pdu(call_id: u32, context_id: u16, status: u32) -> Vec<u8> {
    let mut out = Vec::new();
    pdu::encode_fault(
        call_id,
        context_id,
        status,
        status == fault::OP_RNG_ERROR || status == fault::UNK_IF || status == ACCESS_DENIED,
        &mut out,
    );
    out
}

fn answer(pdu: Vec<u8>) -> Received {
    Received {
        out: vec![pdu],
        call: None,
        close: None,
    }
}

fn closing(why: &'static str) -> Received {
    Received {
        out: Vec::new(),
        call: None,
        close: Some(why),
    }
}
