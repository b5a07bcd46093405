//! The security context of one DCE/RPC association (MS-RPCE 3.3.1.5.2),
//! shared by the two transports that carry one: TCP (`ip_tcp`) and named
//! pipes on IPC$ (`pipe`). It runs the logon's legs (NTLMSSP or Kerberos,
//! bare or in SPNEGO) through the SMB logon's acceptor, then checks each
//! request's verifier and protects each answer at the level the client
//! asked for; the verifiers themselves are `protection`'s.
//!
//! A logon at the packet, integrity or privacy level whose messages cannot be
//! protected is refused: NTLM without extended session security, and
//! Kerberos with an RC4 or DES key, without replay and sequence detection,
//! without header signing, or asking for privacy without the DCE style.

mod protection;

use std::net::IpAddr;
use std::sync::Arc;

use nimbus_auth::{AuthError, AuthStep, Authenticator, BadSignature};
use protection::{Layout, Protection};

use crate::pdu::{self, auth, Header, SecTrailer, SEC_TRAILER_LEN};

/// Stub data of an authenticated PDU is padded to this (MS-RPCE 2.2.2.11:
/// Windows pads to 16, which also suits every cipher).
pub(crate) const AUTH_PAD: usize = 16;

/// Who the client proved to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub user: String,
    pub domain: String,
    /// The level every call of the association is protected at.
    pub level: u8,
}

enum State {
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
        /// The signing context, for the levels that sign
        /// (`auth::signs`).
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

/// The server's failed-logon back-off (`limits.max_failed_logons_per_*`),
/// which RPC's own logons pass as SMB's do: a client that may not guess
/// passwords through SESSION_SETUP may not guess them through a pipe or
/// the witness port either. One per connection: it knows the client's
/// address.
pub trait LogonGate: Send + Sync {
    /// Whether `user` may log on now (a backed-off name or address is
    /// refused even with the right password, so guessing learns nothing).
    fn may_log_on(&self, user: &str) -> bool;
    /// A wrong password or an unknown user: counted, and logged as the
    /// server logs such refusals.
    fn failed(&self, user: &str, why: &AuthError);
    /// `user` logged on: the failures counted are cleared.
    fn succeeded(&self, user: &str);
}

pub(crate) struct RpcSecurity {
    authenticator: Authenticator,
    local: IpAddr,
    gate: Option<Arc<dyn LogonGate>>,
    state: State,
    /// The BIND asked for PFC_SUPPORT_HEADER_SIGN, and the BIND_ACK
    /// granted it.
    header_sign: bool,
}

impl RpcSecurity {
    /// No logon yet, on a connection the client made to `local`.
    pub fn new(
        authenticator: Authenticator,
        local: IpAddr,
        gate: Option<Arc<dyn LogonGate>>,
    ) -> RpcSecurity {
        RpcSecurity {
            authenticator,
            local,
            gate,
            state: State::None,
            header_sign: false,
        }
    }

    /// A BIND (the association's one): what an earlier, refused BIND
    /// left is forgotten, and its PFC_SUPPORT_HEADER_SIGN is what the
    /// BIND_ACK answers.
    pub fn bind(&mut self, header_sign: bool) {
        self.state = State::None;
        self.header_sign = header_sign;
    }

    pub fn header_sign(&self) -> bool {
        self.header_sign
    }

    /// The authenticated client, once its logon completed.
    pub fn caller(&self) -> Option<&Caller> {
        match &self.state {
            State::Done { caller, .. } => Some(caller),
            _ => None,
        }
    }

    /// A logon is under way.
    pub fn pending(&self) -> bool {
        matches!(self.state, State::Pending { .. })
    }

    /// A logon was begun and failed.
    pub fn failed(&self) -> bool {
        matches!(self.state, State::Failed)
    }

    /// A refused leg: a wrong password or unknown user goes to the gate.
    fn refused(&self, e: &AuthError) {
        match (&self.gate, e) {
            (Some(gate), AuthError::LogonFailure { user, .. }) => gate.failed(user, e),
            _ => tracing::info!("rpc: logon refused: {e}"),
        }
    }

    /// The first leg, from a BIND: what to answer in the BIND_ACK.
    pub fn start(&mut self, trailer: SecTrailer, token: &[u8]) -> Result<Vec<u8>, String> {
        if !matches!(
            trailer.auth_type,
            auth::TYPE_NTLMSSP | auth::TYPE_SPNEGO | auth::TYPE_KRB5
        ) {
            return Err(format!(
                "authentication type {} (only NTLMSSP, Kerberos and SPNEGO are served)",
                trailer.auth_type
            ));
        }
        // Level 3 (CALL) cannot be served as it asks (`auth::LEVEL_CALL`):
        // refused rather than served as if it were.
        if ![
            auth::LEVEL_CONNECT,
            auth::LEVEL_PKT,
            auth::LEVEL_INTEGRITY,
            auth::LEVEL_PRIVACY,
        ]
        .contains(&trailer.auth_level)
        {
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
                self.state = State::Pending {
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
            Err(e) => {
                self.refused(&e);
                Err(e.to_string())
            }
        }
    }

    /// A later leg: the token to answer with, if any. A leg when no logon
    /// is under way (an association already logged on, or never) is
    /// refused and leaves the association as it was. `unanswered`: the
    /// leg came in an AUTH3, whose answer is never sent.
    fn next_leg(
        &mut self,
        trailer: SecTrailer,
        token: &[u8],
        unanswered: bool,
    ) -> Result<Leg, &'static str> {
        if !matches!(self.state, State::Pending { .. }) {
            return Err("an authentication leg with no logon under way");
        }
        let State::Pending {
            mut exchange,
            auth_type,
            level,
            context_id,
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err("an authentication leg with no logon under way");
        };
        if trailer.auth_type != auth_type
            || trailer.auth_level != level
            || trailer.context_id != context_id
        {
            return Err("an authentication leg that changes type, level or context");
        }
        if unanswered {
            exchange.last_leg_unanswered();
        }
        match exchange.step(token) {
            Ok(AuthStep::Continue(t)) => {
                self.state = State::Pending {
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
                self.refused(&e);
                Err("logon refused")
            }
        }
    }

    /// A leg that came in an ALTER_CONTEXT: the token its answer carries,
    /// if any.
    pub fn context_leg(
        &mut self,
        trailer: SecTrailer,
        token: &[u8],
    ) -> Result<Option<Vec<u8>>, &'static str> {
        match self.next_leg(trailer, token, false)? {
            Leg::More(t) | Leg::Done(Some(t)) => Ok(Some(t)),
            Leg::Done(None) => Ok(None),
        }
    }

    /// A leg that came in an AUTH3, which has no answer (MS-RPCE
    /// 3.3.1.5.2.2): a last token (SPNEGO's accept-completed) is not sent.
    /// A logon that fails there is not an error of the association: its
    /// calls are refused (ACCESS_DENIED), as a client expects to be told.
    pub fn auth3_leg(&mut self, trailer: SecTrailer, token: &[u8]) -> Result<(), &'static str> {
        let was_pending = self.pending();
        match self.next_leg(trailer, token, true) {
            Ok(Leg::Done(_)) => Ok(()),
            Ok(Leg::More(_)) => Err("an AUTH3 leg that needs another"),
            Err(_) if was_pending => Ok(()),
            Err(why) => Err(why),
        }
    }

    /// A completed logon: the association's caller and protection from
    /// now on.
    fn complete(
        &mut self,
        mut logon: nimbus_auth::AuthResult,
        auth_type: u8,
        level: u8,
        context_id: u32,
    ) -> Result<(), &'static str> {
        if logon.guest || logon.anonymous {
            tracing::info!("rpc: a guest or anonymous logon refused");
            self.state = State::Failed;
            return Err("guest and anonymous logons may not use this service");
        }
        if let Some(gate) = &self.gate {
            if !gate.may_log_on(&logon.user) {
                self.state = State::Failed;
                return Err("a logon while its user or address is backed off");
            }
            gate.succeeded(&logon.user);
        }
        let protection = match logon.kerberos.take() {
            Some(gss) => Protection::kerberos(gss, level, self.header_sign),
            None => self
                .authenticator
                .ntlm_session_security(&logon)
                .map(|n| Protection::Ntlm(Box::new(n))),
        };
        if protection.is_none() && auth::signs(level) {
            // Asked for protection this logon cannot give (see the module
            // comment): refused, not served at a lower level.
            tracing::info!(
                "rpc: {}\\{} asked for authentication level {level}, which its logon cannot \
                 protect (an RC4 or DES key, no replay detection or header signing, or \
                 sealing without the DCE style): refused",
                logon.domain,
                logon.user
            );
            self.state = State::Failed;
            return Err("a logon whose messages cannot be protected at the level asked for");
        }
        tracing::info!(
            "rpc: {}\\{} logged on (authentication level {level})",
            logon.domain,
            logon.user
        );
        self.state = State::Done {
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

    /// Checks (and, at the privacy level, unseals) a REQUEST's verifier;
    /// returns where its stub ends.
    pub fn check_request(
        &mut self,
        hdr: &Header,
        pdu: &mut [u8],
        stub_start: usize,
    ) -> Result<usize, &'static str> {
        let auth_len = hdr.auth_length as usize;
        let (protection, level, context, auth_type) = match &mut self.state {
            State::Done {
                protection: Some(p),
                caller,
                context_id,
                auth_type,
            } if auth::signs(caller.level) => (p, caller.level, *context_id, *auth_type),
            State::Done {
                caller,
                context_id,
                auth_type,
                ..
            } => {
                // At the connect level a verifier carries nothing to check,
                // but its trailer must be the association's: a request that
                // says it was signed while the logon was not is refused.
                if auth_len == 0 {
                    return Ok(pdu.len());
                }
                let (t, at) = SecTrailer::find(pdu, auth_len).map_err(|_| "malformed trailer")?;
                if t.auth_level != caller.level
                    || t.context_id != *context_id
                    || t.auth_type != *auth_type
                {
                    return Err("a request whose trailer is not the association's");
                }
                return (at >= stub_start && (t.pad_length as usize) <= at - stub_start)
                    .then(|| at - t.pad_length as usize)
                    .ok_or("malformed trailer");
            }
            _ if auth_len == 0 => return Ok(pdu.len()),
            // A verifier where no logon was ever asked for.
            State::None => return Err("a request with a verifier but no logon"),
            _ => {
                // A logon that failed or is not done: its calls are refused
                // (ACCESS_DENIED) by the caller, which needs the stub's end.
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

    /// What protecting a fragment of at most `xmit` bytes adds to it
    /// (padding, sec_trailer, verifier); None when answers go
    /// unprotected.
    pub fn overhead(&self, xmit: usize) -> Result<Option<usize>, BadSignature> {
        match self.protection() {
            Some((_, level, p)) => Ok(Some(
                AUTH_PAD + SEC_TRAILER_LEN + p.verifier_len(level, xmit)?,
            )),
            None => Ok(None),
        }
    }

    fn protection(&self) -> Option<(SecTrailer, u8, &Protection)> {
        match &self.state {
            State::Done {
                caller,
                auth_type,
                context_id,
                protection: Some(p),
            } if auth::signs(caller.level) => Some((
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
    /// signs or seals; nothing when answers go unprotected.
    pub fn protect(&mut self, out: &mut Vec<u8>) -> Result<(), BadSignature> {
        let Some((trailer, level, _)) = self.protection() else {
            return Ok(());
        };
        let State::Done {
            protection: Some(p),
            ..
        } = &mut self.state
        else {
            return Err(BadSignature);
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
        let verifier_u16 = u16::try_from(verifier).map_err(|_| BadSignature)?;
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
