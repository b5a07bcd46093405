//! One DCE/RPC association over TCP (`ncacn_ip_tcp`, MS-RPCE 2.1.1.1),
//! with the authentication a service reached over the network needs:
//! NTLMSSP or Kerberos, bare or in SPNEGO, at the integrity or privacy
//! level (MS-RPCE 3.3.1.5.2), as the witness service asks of its clients
//! (MS-SWN 7: Windows refuses calls below integrity). The verifiers are
//! made and checked in `protection`.
//!
//! No I/O, as the rest of the crate: the caller reads whole PDUs (the
//! header's frag_length says how long) and hands each to
//! [`Association::receive`]; it gets back PDUs to write and, when a call's
//! last fragment arrived, the call to run. Calls may be answered out of
//! order (the witness's AsyncNotify waits for an event while later calls
//! are answered), through [`Association::respond`] and
//! [`Association::fault`], whose PDUs must be written in the order they
//! are made: each carries the next signature sequence number.
//!
//! A logon at the integrity or privacy level whose messages cannot be
//! protected is refused: NTLM without extended session security, and
//! Kerberos with an RC4 or DES key, without replay and sequence detection,
//! without header signing, or asking for privacy without the DCE style.

mod protection;

use std::net::IpAddr;

use nimbus_auth::{AuthStep, Authenticator};
use protection::{Layout, Protection};

use crate::fragments::Reassembly;
use crate::pdu::{
    self, auth, flags, ptype, result, Bind, BindAck, ContextResult, Header, Request, SecTrailer,
    SyntaxId, SEC_TRAILER_LEN,
};
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
/// Stub data of an authenticated PDU is padded to this (MS-RPCE 2.2.2.11:
/// Windows pads to 16, which also suits every cipher).
const AUTH_PAD: usize = 16;
/// RPC_S_ACCESS_DENIED, as a fault status (MS-RPCE 3.3.1.5.2).
const ACCESS_DENIED: u32 = 0x0000_0005;
/// C706 12.6.3.1 p_reject_reason_t values sent in a BIND_NAK.
const NAK_REASON_NOT_SPECIFIED: u16 = 0;
const NAK_AUTH_TYPE_NOT_RECOGNIZED: u16 = 8;

/// An interface the association serves, and whether its calls need the
/// integrity level.
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

/// Who the client proved to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub domain: String,
    /// The level every call of the association is protected at.
    pub level: u8,
}

enum Security {
    /// No authentication asked for.
    None,
    /// The logon failed: calls that need integrity are refused with
    /// ACCESS_DENIED, as the association's are after a failed AUTH3.
    Failed,
    /// Legs still to come.
    Pending {
        exchange: Box<nimbus_auth::AuthExchange>,
        auth_type: u8,
        level: u8,
        context_id: u32,
    },
    Done {
        caller: Caller,
        auth_type: u8,
        context_id: u32,
        /// The signing context, for levels at or above integrity.
        protection: Option<Protection>,
    },
}

/// What one leg of a logon left to do.
enum Leg {
    /// Answer with this token and wait for the next leg.
    More(Vec<u8>),
    /// The logon completed; a last token to send, if the PDU can carry one.
    Done(Option<Vec<u8>>),
}

pub struct Association {
    served: Vec<Served>,
    authenticator: Authenticator,
    local: IpAddr,
    /// The client's max_recv_frag within ours; None before the BIND.
    xmit_frag: Option<u16>,
    /// The association group the BIND_ACK named.
    assoc_group: u32,
    /// The association ended: nothing more is answered on it.
    closed: bool,
    contexts: Vec<(u16, SyntaxId)>,
    security: Security,
    /// The BIND asked for PFC_SUPPORT_HEADER_SIGN, and the BIND_ACK
    /// granted it.
    header_sign: bool,
    partial: Reassembly,
}

impl Association {
    /// A new association on a connection the client made to `local`.
    pub fn new(served: Vec<Served>, authenticator: Authenticator, local: IpAddr) -> Association {
        Association {
            served,
            authenticator,
            local,
            xmit_frag: None,
            assoc_group: ASSOC_GROUP,
            closed: false,
            contexts: Vec::new(),
            security: Security::None,
            header_sign: false,
            partial: Reassembly::default(),
        }
    }

    /// The authenticated client, once its logon completed.
    pub fn caller(&self) -> Option<&Caller> {
        match &self.security {
            Security::Done { caller, .. } => Some(caller),
            _ => None,
        }
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
        self.header_sign = hdr.flags & flags::SUPPORT_HEADER_SIGN != 0;
        if bind.max_recv_frag < MIN_FRAG {
            let mut out = Vec::new();
            pdu::encode_bind_nak(hdr.call_id, NAK_REASON_NOT_SPECIFIED, &mut out);
            return Ok(answer(out));
        }
        let mut reply_token = None;
        if let Some((trailer, token)) = token {
            match self.start_auth(trailer, token) {
                Ok(t) => reply_token = Some((trailer, t)),
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
            match self.next_leg(trailer, token) {
                Ok(Leg::More(t) | Leg::Done(Some(t))) => reply = Some((trailer, t)),
                Ok(Leg::Done(None)) => {}
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
            header_sign: ptype == ptype::BIND_ACK && self.header_sign,
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
        let was_pending = matches!(self.security, Security::Pending { .. });
        if let Security::Pending { exchange, .. } = &mut self.security {
            exchange.last_leg_unanswered();
        }
        match self.next_leg(trailer, token) {
            // AUTH3 has no answer (MS-RPCE 3.3.1.5.2.2): a last token
            // (SPNEGO's accept-completed) is not sent.
            Ok(Leg::Done(_)) => Ok(Received::default()),
            Ok(Leg::More(_)) => Err("an AUTH3 leg that needs another"),
            // A failed logon: its calls are refused (ACCESS_DENIED), as a
            // client expects to be told, rather than the connection cut.
            Err(_) if was_pending => Ok(Received::default()),
            Err(why) => Err(why),
        }
    }

    /// The first leg, from a BIND: what to answer in the BIND_ACK.
    fn start_auth(&mut self, trailer: SecTrailer, token: &[u8]) -> Result<Vec<u8>, String> {
        if !matches!(
            trailer.auth_type,
            auth::TYPE_NTLMSSP | auth::TYPE_SPNEGO | auth::TYPE_KRB5
        ) {
            return Err(format!(
                "authentication type {} (only NTLMSSP, Kerberos and SPNEGO are served)",
                trailer.auth_type
            ));
        }
        if !(auth::LEVEL_CONNECT..=auth::LEVEL_PRIVACY).contains(&trailer.auth_level) {
            return Err(format!("authentication level {}", trailer.auth_level));
        }
        if !token_fits(trailer.auth_type, token) {
            return Err(format!(
                "a token that is not of authentication type {}",
                trailer.auth_type
            ));
        }
        let mut exchange = Box::new(self.authenticator.start_rpc_at(self.local));
        match exchange.step(token) {
            Ok(AuthStep::Continue(t)) => {
                self.security = Security::Pending {
                    exchange,
                    auth_type: trailer.auth_type,
                    level: trailer.auth_level,
                    context_id: trailer.context_id,
                };
                Ok(t)
            }
            Ok(AuthStep::Complete(logon)) => {
                let token = logon.output.clone();
                self.complete(
                    logon,
                    trailer.auth_type,
                    trailer.auth_level,
                    trailer.context_id,
                )
                .map_err(String::from)?;
                Ok(token)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// A later leg: the token to answer with, if any. A leg when no logon
    /// is under way (an association already logged on, or never) is
    /// refused and leaves the association as it was.
    fn next_leg(&mut self, trailer: SecTrailer, token: &[u8]) -> Result<Leg, &'static str> {
        if !matches!(self.security, Security::Pending { .. }) {
            return Err("an authentication leg with no logon under way");
        }
        let Security::Pending {
            mut exchange,
            auth_type,
            level,
            context_id,
        } = std::mem::replace(&mut self.security, Security::Failed)
        else {
            return Err("an authentication leg with no logon under way");
        };
        if trailer.auth_type != auth_type
            || trailer.auth_level != level
            || trailer.context_id != context_id
        {
            return Err("an authentication leg that changes type, level or context");
        }
        match exchange.step(token) {
            Ok(AuthStep::Continue(t)) => {
                self.security = Security::Pending {
                    exchange,
                    auth_type,
                    level,
                    context_id,
                };
                Ok(Leg::More(t))
            }
            Ok(AuthStep::Complete(logon)) => {
                let output = logon.output.clone();
                self.complete(logon, auth_type, level, context_id)?;
                Ok(Leg::Done((!output.is_empty()).then_some(output)))
            }
            Err(e) => {
                tracing::info!("rpc: logon refused: {e}");
                Err("logon refused")
            }
        }
    }

    /// A completed logon: the association's caller and protection from
    /// now on. Fragments received before it are dropped: a call is
    /// protected whole or not at all.
    fn complete(
        &mut self,
        mut logon: nimbus_auth::AuthResult,
        auth_type: u8,
        level: u8,
        context_id: u32,
    ) -> Result<(), &'static str> {
        self.partial.clear();
        if logon.guest || logon.anonymous {
            tracing::info!("rpc: a guest or anonymous logon refused");
            self.security = Security::Failed;
            return Err("guest and anonymous logons may not use this service");
        }
        let protection = match logon.kerberos.take() {
            Some(gss) => Protection::kerberos(gss, level, self.header_sign),
            None => self
                .authenticator
                .ntlm_session_security(&logon)
                .map(|n| Protection::Ntlm(Box::new(n))),
        };
        if protection.is_none() && level >= auth::LEVEL_INTEGRITY {
            // Asked for protection this logon cannot give (see the module
            // comment): refused, not served at a lower level.
            tracing::info!(
                "rpc: {}\\{} asked for authentication level {level}, which its logon cannot \
                 protect (an RC4 or DES key, no replay detection or header signing, or \
                 sealing without the DCE style): refused",
                logon.domain,
                logon.user
            );
            self.security = Security::Failed;
            return Err("a logon whose messages cannot be protected at the level asked for");
        }
        tracing::info!(
            "rpc: {}\\{} logged on (authentication level {level})",
            logon.domain,
            logon.user
        );
        self.security = Security::Done {
            caller: Caller {
                user: logon.user,
                domain: logon.domain,
                level,
            },
            auth_type,
            context_id,
            protection,
        };
        Ok(())
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
        let stub_end = self.check_request(hdr, pdu, stub_start)?;
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
        if needs && level < auth::LEVEL_INTEGRITY {
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

    /// Checks (and, at the privacy level, unseals) a REQUEST's verifier;
    /// returns where its stub ends.
    fn check_request(
        &mut self,
        hdr: &Header,
        pdu: &mut [u8],
        stub_start: usize,
    ) -> Result<usize, &'static str> {
        let auth_len = hdr.auth_length as usize;
        let (protection, level, context, auth_type) = match &mut self.security {
            Security::Done {
                protection: Some(p),
                caller,
                context_id,
                auth_type,
            } if caller.level >= auth::LEVEL_INTEGRITY => {
                (p, caller.level, *context_id, *auth_type)
            }
            _ => {
                // Below integrity a verifier carries nothing to check.
                if auth_len == 0 {
                    return Ok(pdu.len());
                }
                let (t, at) = SecTrailer::find(pdu, auth_len).map_err(|_| "malformed trailer")?;
                return (at >= stub_start && (t.pad_length as usize) <= at - stub_start)
                    .then(|| at - t.pad_length as usize)
                    .ok_or("malformed trailer");
            }
        };
        if auth_len == 0 {
            return Err("a request without its signature");
        }
        let (t, at) = SecTrailer::find(pdu, auth_len).map_err(|_| "malformed trailer")?;
        if t.auth_level != level
            || t.context_id != context
            || t.auth_type != auth_type
            || at < stub_start
        {
            return Err("a request whose trailer is not the association's");
        }
        let pad = t.pad_length as usize;
        if pad > at - stub_start {
            return Err("auth padding longer than the stub");
        }
        if protection.verifier_len(level, at - stub_start) != Ok(auth_len) {
            return Err("a request without its signature");
        }
        let layout = Layout {
            stub: stub_start..at,
            signed: at + SEC_TRAILER_LEN,
        };
        protection
            .check(pdu, layout, level)
            .map_err(|_| "a request whose signature does not verify")?;
        Ok(at - pad)
    }

    /// The call's result, in as many RESPONSE fragments as the client's
    /// max_recv_frag needs, each signed or sealed at the association's
    /// level. Write them in the order made.
    pub fn respond(&mut self, call: &Call, stub: &[u8]) -> Vec<Vec<u8>> {
        if self.closed {
            return Vec::new();
        }
        let xmit = self.xmit_frag.unwrap_or(MIN_FRAG) as usize;
        let protected = self.protection();
        let verifier = match protected {
            Some((_, level, p)) => match p.verifier_len(level, xmit) {
                Ok(n) => n,
                Err(_) => return self.give_up(),
            },
            None => 0,
        };
        let overhead = pdu::REQUEST_HEADER_LEN
            + if protected.is_some() {
                AUTH_PAD + SEC_TRAILER_LEN + verifier
            } else {
                0
            };
        let protected = protected.map(|(trailer, level, _)| (trailer, level));
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
            if let Some((trailer, level)) = protected {
                if self.protect(&mut out, trailer, level).is_err() {
                    return self.give_up();
                }
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

    fn protection(&self) -> Option<(SecTrailer, u8, &Protection)> {
        match &self.security {
            Security::Done {
                caller,
                auth_type,
                context_id,
                protection: Some(p),
            } if caller.level >= auth::LEVEL_INTEGRITY => Some((
                SecTrailer {
                    auth_type: *auth_type,
                    auth_level: caller.level,
                    pad_length: 0,
                    context_id: *context_id,
                },
                caller.level,
                p,
            )),
            _ => None,
        }
    }

    /// Pads the stub of the RESPONSE in `out`, appends the trailer and
    /// signs or seals.
    fn protect(
        &mut self,
        out: &mut Vec<u8>,
        trailer: SecTrailer,
        level: u8,
    ) -> Result<(), nimbus_auth::BadSignature> {
        let Security::Done {
            protection: Some(p),
            ..
        } = &mut self.security
        else {
            return Err(nimbus_auth::BadSignature);
        };
        let stub_len = out.len() - pdu::REQUEST_HEADER_LEN;
        let pad = (AUTH_PAD - stub_len % AUTH_PAD) % AUTH_PAD;
        out.resize(out.len() + pad, 0);
        let stub_end = out.len();
        SecTrailer {
            pad_length: pad as u8,
            ..trailer
        }
        .encode(out);
        let signed = out.len();
        let verifier = p.verifier_len(level, stub_end - pdu::REQUEST_HEADER_LEN)?;
        let verifier_u16 = u16::try_from(verifier).map_err(|_| nimbus_auth::BadSignature)?;
        out.resize(signed + verifier, 0);
        Header::set_lengths(0, out, verifier_u16);
        let layout = Layout {
            stub: pdu::REQUEST_HEADER_LEN..stub_end,
            signed,
        };
        p.protect(out, layout, level)
    }
}

/// DER value octets of SPNEGO's OID (1.3.6.1.5.5.2), after its tag and
/// length in an InitialContextToken (RFC 2743 3.1).
const SPNEGO_OID: &[u8] = &[0x06, 0x06, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x02];

/// The first token of a logon is of the mechanism its auth_type names:
/// NTLMSSP's signature, SPNEGO's initial token, or a Kerberos token
/// (framed, or a bare AP-REQ as the DCE style sends it).
fn token_fits(auth_type: u8, token: &[u8]) -> bool {
    let ntlm = token.starts_with(b"NTLMSSP\0");
    // 0x60: [APPLICATION 0], its length (one to three bytes), the OID.
    let spnego = token.first() == Some(&0x60)
        && (2..=4).any(|at| token.get(at..at + SPNEGO_OID.len()) == Some(SPNEGO_OID));
    match auth_type {
        auth::TYPE_NTLMSSP => ntlm,
        auth::TYPE_SPNEGO => spnego,
        auth::TYPE_KRB5 => !ntlm && !spnego && matches!(token.first(), Some(0x60 | 0x6e)),
        _ => false,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_token_must_be_of_the_type_its_trailer_names() {
        let ntlm = b"NTLMSSP\0\x01\0\0\0".to_vec();
        let mut spnego = vec![0x60, 0x20];
        spnego.extend_from_slice(SPNEGO_OID);
        let mut long_spnego = vec![0x60, 0x82, 0x01, 0x00];
        long_spnego.extend_from_slice(SPNEGO_OID);
        let framed_krb5 = [0x60, 0x10, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12];
        let bare_ap_req = [0x6e, 0x82, 0x01, 0x00];
        assert!(token_fits(auth::TYPE_NTLMSSP, &ntlm));
        assert!(token_fits(auth::TYPE_SPNEGO, &spnego));
        assert!(token_fits(auth::TYPE_SPNEGO, &long_spnego));
        assert!(token_fits(auth::TYPE_KRB5, &framed_krb5));
        assert!(token_fits(auth::TYPE_KRB5, &bare_ap_req));
        for (t, token) in [
            (auth::TYPE_NTLMSSP, &spnego[..]),
            (auth::TYPE_NTLMSSP, &bare_ap_req[..]),
            (auth::TYPE_SPNEGO, &ntlm[..]),
            (auth::TYPE_SPNEGO, &framed_krb5[..]),
            (auth::TYPE_KRB5, &ntlm[..]),
            (auth::TYPE_KRB5, &spnego[..]),
            (auth::TYPE_KRB5, &[][..]),
            (99, &ntlm[..]),
        ] {
            assert!(!token_fits(t, token), "{t} {token:02x?}");
        }
    }
}
