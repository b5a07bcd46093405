//! The authentication acceptor: SPNEGO (RFC 4178, MS-SPNG) around an NTLMv2
//! acceptor (MS-NLMP 3.2) and, when configured, Kerberos (`kerberos`).
//! One [`AuthExchange`] per SESSION_SETUP exchange.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nimbus_crypto::{ct_eq, CryptoProvider, NtlmPrimitives};
use zeroize::Zeroizing;

use crate::auth_config::AuthConfig;
use crate::binding::{self, ServerNames};
use crate::kerberos::{self, KerberosAcceptor};
use crate::ntlm::{self, av, flags, Direction, MIC_OFFSET};
use crate::spnego::{self, NegState, OID_KRB5, OID_MS_KRB5, OID_NTLMSSP};
use crate::userdb::{utf16le, Reload, Reloader, UserDb};

/// Largest security token accepted. SMB2 SESSION_SETUP buffers from real
/// clients are a few KiB (Kerberos tickets with PACs can reach ~12 KiB).
const MAX_TOKEN: usize = 64 * 1024;

/// Seconds between 1601-01-01 (FILETIME epoch) and 1970-01-01.
const FILETIME_UNIX_OFFSET_SECS: u64 = 11_644_473_600;

/// Accepts logons against the local user database. Clones share it.
#[derive(Clone)]
pub struct Authenticator {
    shared: Arc<Shared>,
}

/// What every exchange of one acceptor shares.
struct Shared {
    provider: Arc<CryptoProvider>,
    users: Arc<RwLock<UserDb>>,
    config: AuthConfig,
    /// Re-reads the database file when it changes (None for a database
    /// built in memory).
    reloader: Option<Reloader>,
    /// The host names MsvAvTargetName may name.
    names: ServerNames,
    /// The NT hash unknown users are checked against, so that they cost
    /// the same HMACs as known ones (no user-enumeration timing oracle).
    /// Random per acceptor; an unknown user fails whatever it computes.
    dummy_hash: Zeroizing<[u8; 16]>,
    kerberos: Option<KerberosAcceptor>,
}

impl Shared {
    /// NTLM is offered and accepted: the provider has its primitives (not
    /// FIPS) and the Kerberos configuration does not turn it off.
    fn ntlm_allowed(&self) -> bool {
        self.provider.ntlm().is_some() && self.kerberos.as_ref().is_none_or(|k| k.ntlm)
    }

    /// Why an NTLM logon is refused when `ntlm_allowed` is false: the
    /// provider (FIPS) first, as it is why the configuration has NTLM off.
    fn ntlm_refusal(&self) -> AuthError {
        if self.provider.ntlm().is_none() {
            AuthError::NtlmDisabled
        } else {
            AuthError::NtlmTurnedOff
        }
    }

    /// The mechanisms offered, in order of preference.
    fn offered(&self) -> Vec<&'static [u8]> {
        let mut mechs = Vec::new();
        if self.kerberos.is_some() {
            mechs.extend([OID_MS_KRB5, OID_KRB5]);
        }
        // Without Kerberos NTLM stays listed even when the provider cannot
        // do it (FIPS): the logon then fails with a log line saying why.
        if self.ntlm_allowed() || mechs.is_empty() {
            mechs.push(OID_NTLMSSP);
        }
        mechs
    }
}

impl Authenticator {
    /// A new acceptor; `users` may be changed while the server runs. A
    /// database loaded from a file ([`UserDb::load`]) is reloaded when the
    /// file changes: logons look at most once a second.
    pub fn new(
        provider: Arc<CryptoProvider>,
        users: Arc<RwLock<UserDb>>,
        config: AuthConfig,
    ) -> Self {
        Self::with_kerberos(provider, users, config, None)
    }

    /// An acceptor that also (or, with `ntlm` off, only) accepts Kerberos.
    pub fn with_kerberos(
        provider: Arc<CryptoProvider>,
        users: Arc<RwLock<UserDb>>,
        config: AuthConfig,
        kerberos: Option<KerberosAcceptor>,
    ) -> Self {
        let reloader = Reloader::for_db(&users.read().unwrap_or_else(|p| p.into_inner()));
        let names = ServerNames::new(&config, ServerNames::system_host_name().as_deref());
        let mut dummy_hash = Zeroizing::new([0u8; 16]);
        provider.fill_random(&mut dummy_hash[..]);
        Authenticator {
            shared: Arc::new(Shared {
                provider,
                users,
                config,
                reloader,
                names,
                dummy_hash,
                kerberos,
            }),
        }
    }

    /// The server's machine SID, under which its users' SIDs are.
    pub fn machine_sid(&self) -> crate::MachineSid {
        self.users().machine_sid(&self.shared.provider)
    }

    /// The RID of user `name` (as it logged on), if it is in the database.
    pub fn user_rid(&self, name: &str) -> Option<u32> {
        self.users().rid(name)
    }

    /// The name of the user with RID `rid`.
    pub fn user_of_rid(&self, rid: u32) -> Option<String> {
        self.users().name_of_rid(rid).map(str::to_owned)
    }

    /// The RIDs of the server's groups user `name` is a member of.
    pub fn group_rids_of(&self, name: &str) -> Vec<u32> {
        self.users().group_rids_of(name)
    }

    /// The RID of the server's group `name`.
    pub fn group_rid(&self, name: &str) -> Option<u32> {
        self.users().group_rid(name)
    }

    /// The name of the server's group with RID `rid`.
    pub fn group_of_rid(&self, rid: u32) -> Option<String> {
        self.users().group_of_rid(rid).map(str::to_owned)
    }

    fn users(&self) -> std::sync::RwLockReadGuard<'_, UserDb> {
        self.shared.users.read().unwrap_or_else(|e| e.into_inner())
    }

    /// SPNEGO NegTokenInit2 for the SMB2 NEGOTIATE response security buffer
    /// (MS-SPNG 3.2.5.2): the mechanisms offered ([MS-KRB5, KRB5] when
    /// Kerberos is configured, then NTLMSSP unless it is off) and the fixed
    /// hint name.
    pub fn negotiate_token(&self) -> Vec<u8> {
        spnego::build_server_init(&self.shared.offered())
    }

    /// The signing and sealing context of a completed NTLM logon (MS-NLMP
    /// 3.4), for DCE/RPC's integrity and privacy levels; None for Kerberos,
    /// guest and anonymous logons, and NTLM without extended session
    /// security. Made on demand: an SMB logon never needs it.
    pub fn ntlm_session_security(&self, logon: &AuthResult) -> Option<crate::NtlmSessionSecurity> {
        if logon.guest || logon.anonymous {
            return None;
        }
        crate::NtlmSessionSecurity::new(
            self.shared.provider.clone(),
            &logon.session_key,
            logon.ntlm_flags?,
            logon.ntlm_first_seq,
        )
    }

    /// Begins one SESSION_SETUP exchange whose connection's local address
    /// is unknown: an MsvAvTargetName naming an IP address is refused.
    pub fn start(&self) -> AuthExchange {
        AuthExchange {
            shared: self.shared.clone(),
            local: None,
            state: State::Start,
            rpc: false,
            unanswered: false,
        }
    }

    /// Begins one SESSION_SETUP exchange on a connection the client made to
    /// `local` (an MsvAvTargetName may name this address).
    pub fn start_at(&self, local: IpAddr) -> AuthExchange {
        AuthExchange {
            shared: self.shared.clone(),
            local: Some(local),
            state: State::Start,
            rpc: false,
            unanswered: false,
        }
    }

    /// Begins one DCE/RPC logon (MS-RPCE 3.3.1.5.2) on a connection made to
    /// `local`: as `start_at`, but a Kerberos ticket may also be for the
    /// `host/` service (the one RPC clients ask for), and a Kerberos logon
    /// keeps its context for per-message protection
    /// ([`AuthResult::kerberos`]).
    pub fn start_rpc_at(&self, local: IpAddr) -> AuthExchange {
        AuthExchange {
            rpc: true,
            ..self.start_at(local)
        }
    }
}

/// What one step of an exchange produced.
#[derive(Debug)]
pub enum AuthStep {
    /// Send this token back (STATUS_MORE_PROCESSING_REQUIRED) and wait for
    /// the client's next one.
    Continue(Vec<u8>),
    /// The client is authenticated; send `output` in the final response.
    Complete(AuthResult),
}

/// A successful logon.
pub struct AuthResult {
    /// Final token for the last SESSION_SETUP response (may be empty).
    pub output: Vec<u8>,
    /// The user name: as stored in the database for a real user, as the
    /// client sent it for a guest, empty for anonymous.
    pub user: String,
    /// The domain the client sent.
    pub domain: String,
    /// ExportedSessionKey (MS-NLMP 3.1.5.1.2), the SMB2 session key; all
    /// zero for guest and anonymous logons, which cannot sign.
    pub session_key: Zeroizing<[u8; 16]>,
    /// The whole key the mechanism agreed on (MS-SMB2 3.3.5.5.3
    /// Session.FullSessionKey): 32 bytes for a Kerberos AES-256 subkey, from
    /// which 3.1.1's AES-256 ciphers derive their keys; for NTLM the same
    /// 16 bytes as `session_key`.
    pub full_session_key: Zeroizing<Vec<u8>>,
    /// How long the logon stays valid: the Kerberos ticket's remaining
    /// life (MS-SMB2 3.3.5.5.3 Session.ExpirationTime); None for NTLM,
    /// whose logons do not expire.
    pub expires_in: Option<std::time::Duration>,
    /// The Kerberos session key's type ("aes256-cts-hmac-sha1-96"); None
    /// for NTLM.
    pub key_type: Option<String>,
    /// Logged on as guest (unknown user with `allow_guest`).
    pub guest: bool,
    /// Anonymous logon (with `allow_guest`).
    pub anonymous: bool,
    /// The NegotiateFlags of an NTLM logon, for its session security
    /// ([`Authenticator::ntlm_session_security`]); None for Kerberos.
    pub ntlm_flags: Option<u32>,
    /// The sequence numbers NTLM session security goes on from, client to
    /// server and back: 1 in a direction whose SPNEGO mechListMIC took
    /// number 0 (MS-SPNG 3.3.5.1 restores the RC4 state after the MIC,
    /// but not the number), else 0.
    pub ntlm_first_seq: (u32, u32),
    /// A Kerberos logon's context, for per-message protection; kept only
    /// by exchanges begun with [`Authenticator::start_rpc_at`].
    pub kerberos: Option<Box<crate::KerberosSessionSecurity>>,
}

impl fmt::Debug for AuthResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthResult")
            .field("output_len", &self.output.len())
            .field("user", &self.user)
            .field("domain", &self.domain)
            .field("session_key", &"<redacted>")
            .field("guest", &self.guest)
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

/// Why an exchange failed. The SMB layer maps `Malformed` to
/// STATUS_INVALID_PARAMETER, `NotSupported` to STATUS_NOT_SUPPORTED and the
/// rest (wrong credentials, NTLMv1, relays, refused anonymous logons) to
/// STATUS_LOGON_FAILURE.
#[derive(Debug)]
#[non_exhaustive]
pub enum AuthError {
    /// The token does not decode.
    Malformed(&'static str),
    /// The credentials were wrong (or the user is unknown).
    LogonFailure {
        /// The user name the client sent.
        user: String,
        /// What check failed (for the log, never for the client).
        reason: &'static str,
    },
    /// A valid request for something this server does not offer (a
    /// mechanism other than NTLM, NTLM without Unicode, ...).
    NotSupported(&'static str),
    /// The right credentials, meant for another service or channel: the
    /// MsvAvTargetName or MsvAvChannelBindings of the client's blob say the
    /// logon was relayed here (see the `binding` module).
    WrongTarget {
        /// The user name the client sent.
        user: String,
        /// What check failed.
        reason: &'static str,
        /// The offending value (the SPN, or the bindings in hex).
        value: String,
    },
    /// Anonymous logon while guest access is off.
    AnonymousRefused,
    /// The crypto provider offers no NTLM primitives (FIPS mode).
    NtlmDisabled,
    /// NTLM is turned off by configuration (`[kerberos] ntlm = false`).
    NtlmTurnedOff,
    /// A Kerberos logon failed: a bad ticket (the GSS-API library's reason:
    /// clock skew, a key not in the keytab, a replay...) or a principal
    /// with no user.
    Kerberos {
        /// The client's principal, if it got that far.
        principal: String,
        /// Why (for the log, never for the client).
        reason: String,
    },
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::Malformed(what) => write!(f, "malformed security token: {what}"),
            AuthError::LogonFailure { user, reason } => {
                write!(f, "logon failure for user {user:?}: {reason}")
            }
            AuthError::NotSupported(what) => write!(f, "not supported: {what}"),
            AuthError::WrongTarget {
                user,
                reason,
                value,
            } => write!(
                f,
                "logon of user {user:?} refused: {reason}: {value:?} (NTLM relayed from \
                 another service?)"
            ),
            AuthError::AnonymousRefused => {
                f.write_str("anonymous logon refused (guest access is off)")
            }
            AuthError::NtlmDisabled => f.write_str(
                "NTLM logon refused: FIPS mode ([security] fips = true) turns NTLM off, as it \
                     needs MD4, MD5 and RC4, which FIPS does not approve; the client must log on \
                     with Kerberos",
            ),
            AuthError::NtlmTurnedOff => f.write_str(
                "NTLM logon refused: NTLM is turned off ([kerberos] ntlm = false); the client \
                 must log on with Kerberos",
            ),
            AuthError::Kerberos { principal, reason } if principal.is_empty() => {
                write!(f, "Kerberos logon refused: {reason}")
            }
            AuthError::Kerberos { principal, reason } => {
                write!(f, "Kerberos logon of {principal:?} refused: {reason}")
            }
        }
    }
}

impl std::error::Error for AuthError {}

/// SPNEGO context kept between legs.
struct SpnegoCtx {
    /// The client's MechTypeList as received, for mechListMIC.
    mech_types: Vec<u8>,
    /// NTLMSSP was the client's first choice; if not, RFC 4178 section 5
    /// makes the mechListMIC exchange mandatory (downgrade protection).
    ntlm_preferred: bool,
}

/// Everything the AUTHENTICATE check needs from the first leg.
struct Pending {
    spnego: Option<SpnegoCtx>,
    negotiate: Vec<u8>,
    challenge: Vec<u8>,
    server_challenge: [u8; 8],
    /// The flags of our CHALLENGE: the negotiated NegFlg.
    flags: u32,
}

/// A Kerberos exchange between legs.
struct KerberosPending {
    gss: nimbus_gssapi::AcceptContext,
    /// The client's MechTypeList as received, for mechListMIC.
    mech_types: Vec<u8>,
    /// Kerberos was not the client's first choice: RFC 4178 5 makes the
    /// mechListMIC exchange mandatory.
    mic_required: bool,
    /// The context is established; what is left is the client's MIC.
    established: Option<Box<kerberos::KerberosLogon>>,
    /// Our mechListMIC was sent.
    mic_sent: bool,
    /// The client sent Kerberos tokens without SPNEGO around them (MS-SMB2
    /// 3.3.5.5.3 hands the buffer to GSS-API as it is; Windows and Samba
    /// take a bare krb5 token, and Python's smbprotocol sends one): the
    /// answers are bare too.
    raw: bool,
}

enum State {
    Start,
    AwaitKerberos(Box<KerberosPending>),
    /// SPNEGO chose NTLMSSP but the client has not sent an NTLM NEGOTIATE.
    AwaitNtlmNegotiate(SpnegoCtx),
    AwaitAuthenticate(Box<Pending>),
    /// Completed or failed: no more tokens are accepted.
    Finished,
}

/// The outcome of checking an AUTHENTICATE message.
struct Verified {
    user: String,
    domain: String,
    session_key: Zeroizing<[u8; 16]>,
    guest: bool,
    anonymous: bool,
    /// The AUTHENTICATE carried a (verified) MIC.
    mic_present: bool,
}

/// The DER tag of a bare Kerberos AP-REQ.
const AP_REQ_TAG: u8 = 0x6e;

/// One SESSION_SETUP exchange.
pub struct AuthExchange {
    shared: Arc<Shared>,
    /// The address the client connected to, if known.
    local: Option<IpAddr>,
    state: State,
    /// A DCE/RPC logon ([`Authenticator::start_rpc_at`]).
    rpc: bool,
    /// The next leg's answer is not sent (DCE/RPC's AUTH3).
    unanswered: bool,
}

impl AuthExchange {
    /// Feeds the security buffer of one SESSION_SETUP request.
    ///
    /// Accepts SPNEGO (NegTokenInit with NTLMSSP NEGOTIATE as mechToken, then
    /// NegTokenResp with AUTHENTICATE) and raw NTLMSSP tokens. After an error
    /// or completion, every further call fails.
    pub fn step(&mut self, input: &[u8]) -> Result<AuthStep, AuthError> {
        if input.len() > MAX_TOKEN {
            self.state = State::Finished;
            return Err(AuthError::Malformed("security token too large"));
        }
        // Any error leaves the exchange Finished.
        match std::mem::replace(&mut self.state, State::Finished) {
            State::Start => self.step_start(input),
            State::AwaitNtlmNegotiate(ctx) => self.step_await_negotiate(ctx, input),
            State::AwaitAuthenticate(p) => self.step_authenticate(*p, input),
            State::AwaitKerberos(k) => self.step_kerberos(*k, input),
            State::Finished => Err(AuthError::Malformed(
                "authentication exchange already finished",
            )),
        }
    }

    /// The next leg's answer will not reach the client (it comes in a
    /// DCE/RPC AUTH3, which has none): nothing that uses up a sequence
    /// number (our SPNEGO mechListMIC) is made for it.
    pub fn last_leg_unanswered(&mut self) {
        self.unanswered = true;
    }

    fn step_start(&mut self, input: &[u8]) -> Result<AuthStep, AuthError> {
        if input.is_empty() {
            // A client that got no token in NEGOTIATE starts with an empty
            // buffer; offer our mechanisms, as Samba and Windows do.
            self.state = State::Start;
            return Ok(AuthStep::Continue(spnego::build_server_init(
                &self.shared.offered(),
            )));
        }
        if input.starts_with(ntlm::SIGNATURE) {
            let (challenge, pending) = self.ntlm_negotiate(None, input)?;
            self.state = State::AwaitAuthenticate(Box::new(pending));
            return Ok(AuthStep::Continue(challenge));
        }
        if spnego::initial_token_mech(input).is_some_and(|m| [OID_KRB5, OID_MS_KRB5].contains(&m)) {
            return self.kerberos_raw(input);
        }
        // The DCE style sends its AP-REQ (RFC 4120 5.5.1, [APPLICATION 14])
        // without GSS-API's framing (RFC 4121 4.1); the library takes it so.
        if self.rpc && input[0] == AP_REQ_TAG {
            return self.kerberos_raw(input);
        }
        match input[0] {
            0x60 | 0xa0 => self.spnego_init(input),
            _ => Err(AuthError::Malformed("unknown security token")),
        }
    }

    /// A bare Kerberos initial token (no SPNEGO): accepted as it is.
    fn kerberos_raw(&mut self, input: &[u8]) -> Result<AuthStep, AuthError> {
        let Some(k) = &self.shared.kerberos else {
            return Err(AuthError::NotSupported("Kerberos is not configured"));
        };
        let pending = KerberosPending {
            gss: k.context(),
            mech_types: Vec::new(),
            mic_required: false,
            established: None,
            mic_sent: false,
            raw: true,
        };
        self.kerberos_token(pending, input, None, None)
    }

    /// Handles a NegTokenInit (RFC 4178 4.2.1).
    fn spnego_init(&mut self, input: &[u8]) -> Result<AuthStep, AuthError> {
        let init = spnego::parse_init(input).map_err(AuthError::Malformed)?;
        // The client's first mechanism this server accepts.
        let kerberos = init
            .kerberos_position()
            .filter(|_| self.shared.kerberos.is_some());
        let ntlm_pos = init.ntlm_position();
        if let Some((kpos, oid)) = kerberos {
            if ntlm_pos.is_none_or(|n| kpos < n) || !self.shared.ntlm_allowed() {
                return self.kerberos_init(&init, kpos, oid);
            }
        }
        let pos = match ntlm_pos {
            Some(_) if !self.shared.ntlm_allowed() && self.shared.kerberos.is_some() => {
                return Err(self.shared.ntlm_refusal())
            }
            Some(p) => p,
            None => {
                return Err(AuthError::NotSupported(
                    "the client offers no mechanism this server has (NTLMSSP, or Kerberos \
                     when configured)",
                ))
            }
        };
        let ctx = SpnegoCtx {
            mech_types: init.mech_types_raw.to_vec(),
            ntlm_preferred: pos == 0,
        };
        match init.mech_token {
            Some(tok) if tok.starts_with(ntlm::SIGNATURE) => {
                let (challenge, pending) = self.ntlm_negotiate(Some(ctx), tok)?;
                self.state = State::AwaitAuthenticate(Box::new(pending));
                Ok(AuthStep::Continue(spnego::build_resp(
                    NegState::AcceptIncomplete,
                    Some(OID_NTLMSSP),
                    Some(&challenge),
                    None,
                )))
            }
            Some(_) if pos == 0 => Err(AuthError::Malformed("optimistic token is not NTLMSSP")),
            _ => {
                // No usable optimistic token (none, or one for the client's
                // preferred Kerberos): name NTLMSSP and let the client start
                // it. request-mic when it was not the client's first choice.
                let state = if ctx.ntlm_preferred {
                    NegState::AcceptIncomplete
                } else {
                    NegState::RequestMic
                };
                self.state = State::AwaitNtlmNegotiate(ctx);
                Ok(AuthStep::Continue(spnego::build_resp(
                    state,
                    Some(OID_NTLMSSP),
                    None,
                    None,
                )))
            }
        }
    }

    fn step_await_negotiate(
        &mut self,
        ctx: SpnegoCtx,
        input: &[u8],
    ) -> Result<AuthStep, AuthError> {
        match input.first() {
            Some(0xa1) => {
                let resp = spnego::parse_resp(input).map_err(AuthError::Malformed)?;
                let tok = resp.response_token.ok_or(AuthError::Malformed(
                    "NegTokenResp without NTLMSSP NEGOTIATE",
                ))?;
                let (challenge, pending) = self.ntlm_negotiate(Some(ctx), tok)?;
                self.state = State::AwaitAuthenticate(Box::new(pending));
                Ok(AuthStep::Continue(spnego::build_resp(
                    NegState::AcceptIncomplete,
                    None,
                    Some(&challenge),
                    None,
                )))
            }
            // A client may instead restart with a new NegTokenInit.
            Some(0x60) | Some(0xa0) => self.spnego_init(input),
            _ => Err(AuthError::Malformed("expected a SPNEGO NegTokenResp")),
        }
    }

    fn ntlm(&self) -> Result<&dyn NtlmPrimitives, AuthError> {
        if !self.shared.ntlm_allowed() {
            return Err(self.shared.ntlm_refusal());
        }
        self.shared.provider.ntlm().ok_or(AuthError::NtlmDisabled)
    }

    /// Kerberos chosen from a NegTokenInit: the optimistic token is
    /// accepted when Kerberos is the client's first choice; otherwise the
    /// client is told to start it (and both sides then sign the mechanism
    /// list, RFC 4178 5).
    fn kerberos_init(
        &mut self,
        init: &spnego::NegTokenInit<'_>,
        pos: usize,
        oid: &'static [u8],
    ) -> Result<AuthStep, AuthError> {
        let Some(k) = &self.shared.kerberos else {
            return Err(AuthError::NotSupported("Kerberos is not configured"));
        };
        let pending = KerberosPending {
            gss: k.context(),
            mech_types: init.mech_types_raw.to_vec(),
            mic_required: pos != 0,
            established: None,
            mic_sent: false,
            raw: false,
        };
        match init.mech_token {
            Some(tok) if pos == 0 => self.kerberos_token(pending, tok, Some(oid), None),
            _ => {
                let state = if pending.mic_required {
                    NegState::RequestMic
                } else {
                    NegState::AcceptIncomplete
                };
                self.state = State::AwaitKerberos(Box::new(pending));
                Ok(AuthStep::Continue(spnego::build_resp(
                    state,
                    Some(oid),
                    None,
                    None,
                )))
            }
        }
    }

    /// A NegTokenResp of a Kerberos exchange: the next context token, or
    /// the client's mechListMIC.
    fn step_kerberos(&mut self, p: KerberosPending, input: &[u8]) -> Result<AuthStep, AuthError> {
        if p.raw {
            return self.kerberos_token(p, input, None, None);
        }
        let resp = spnego::parse_resp(input).map_err(AuthError::Malformed)?;
        match resp.response_token {
            Some(tok) if p.established.is_none() => {
                self.kerberos_token(p, tok, None, resp.mech_list_mic)
            }
            _ => self.kerberos_finish(p, Vec::new(), resp.mech_list_mic, None),
        }
    }

    /// Feeds one Kerberos token to the GSS-API context.
    fn kerberos_token(
        &mut self,
        mut p: KerberosPending,
        token: &[u8],
        oid: Option<&'static [u8]>,
        client_mic: Option<&[u8]>,
    ) -> Result<AuthStep, AuthError> {
        let refused = |e: nimbus_gssapi::GssError| AuthError::Kerberos {
            principal: String::new(),
            reason: e.to_string(),
        };
        let accepted = p.gss.step(token).map_err(refused)?;
        if !accepted.complete && p.raw {
            self.state = State::AwaitKerberos(Box::new(p));
            return Ok(AuthStep::Continue(accepted.output));
        }
        if !accepted.complete {
            self.state = State::AwaitKerberos(Box::new(p));
            return Ok(AuthStep::Continue(spnego::build_resp(
                NegState::AcceptIncomplete,
                oid,
                Some(&accepted.output),
                None,
            )));
        }
        let Some(k) = &self.shared.kerberos else {
            return Err(AuthError::NotSupported("Kerberos is not configured"));
        };
        // The database as an NTLM logon sees it: a user removed a moment
        // ago logs on no more with a ticket than with a password.
        self.reload_users();
        let users = self.shared.users.read().unwrap_or_else(|e| e.into_inner());
        let logon = k
            .logon(&p.gss, &users, self.shared.provider.fips(), self.rpc)
            .map_err(|(principal, reason)| AuthError::Kerberos { principal, reason })?;
        drop(users);
        p.established = Some(Box::new(logon));
        if p.mic_required && client_mic.is_none() {
            // Our MIC now; the client's comes in its next token.
            let mic = p.gss.get_mic(&p.mech_types).map_err(refused)?;
            p.mic_sent = true;
            self.state = State::AwaitKerberos(Box::new(p));
            return Ok(AuthStep::Continue(spnego::build_resp(
                NegState::AcceptIncomplete,
                oid,
                Some(&accepted.output),
                Some(&mic),
            )));
        }
        self.kerberos_finish(p, accepted.output, client_mic, oid)
    }

    /// Completes an established Kerberos exchange, checking the client's
    /// mechListMIC when one is required or sent. `oid` names the mechanism
    /// in the first answer of the exchange.
    fn kerberos_finish(
        &mut self,
        p: KerberosPending,
        output: Vec<u8>,
        client_mic: Option<&[u8]>,
        oid: Option<&'static [u8]>,
    ) -> Result<AuthStep, AuthError> {
        let Some(logon) = p.established else {
            return Err(AuthError::Malformed(
                "NegTokenResp without a Kerberos token",
            ));
        };
        let refuse = |reason: String| AuthError::Kerberos {
            principal: logon.user.clone(),
            reason,
        };
        match client_mic {
            Some(mic) => p
                .gss
                .verify_mic(&p.mech_types, mic)
                .map_err(|e| refuse(format!("bad SPNEGO mechListMIC: {e}")))?,
            None if p.mic_required => {
                return Err(refuse(
                    "missing SPNEGO mechListMIC after choosing a non-preferred mechanism".into(),
                ))
            }
            None => {}
        }
        // RFC 4178 5: a client that sent its MIC gets ours (the DCE style's
        // last leg carries the client's MIC with its token).
        let mic = match client_mic {
            Some(_) if !p.mic_sent && !p.raw && !self.unanswered => Some(
                p.gss
                    .get_mic(&p.mech_types)
                    .map_err(|e| refuse(format!("gss_get_mic: {e}")))?,
            ),
            _ => None,
        };
        let token = (!output.is_empty()).then_some(&output[..]);
        let logon = *logon;
        let output = if p.raw {
            output
        } else {
            spnego::build_resp(NegState::AcceptCompleted, oid, token, mic.as_deref())
        };
        let kerberos = self
            .rpc
            .then(|| Box::new(crate::KerberosSessionSecurity::new(p.gss, logon.enctype)));
        Ok(AuthStep::Complete(AuthResult {
            output,
            user: logon.user,
            domain: logon.realm,
            session_key: logon.session_key,
            full_session_key: logon.full_session_key,
            expires_in: logon.expires_in,
            key_type: Some(logon.key_type),
            guest: false,
            anonymous: false,
            ntlm_flags: None,
            ntlm_first_seq: (0, 0),
            kerberos,
        }))
    }

    /// Answers an NTLMSSP NEGOTIATE with a CHALLENGE (MS-NLMP 3.2.5.1.1).
    fn ntlm_negotiate(
        &self,
        spnego: Option<SpnegoCtx>,
        msg: &[u8],
    ) -> Result<(Vec<u8>, Pending), AuthError> {
        self.ntlm()?;
        let client = ntlm::parse_negotiate(msg).map_err(AuthError::Malformed)?;
        if client & flags::UNICODE == 0 {
            return Err(AuthError::NotSupported("NTLM without UNICODE strings"));
        }
        // Echo what the client asked for among what we support; always
        // offer NTLMv2 target info and name ourselves as a server.
        const ECHOED: u32 = flags::UNICODE
            | flags::SIGN
            | flags::SEAL
            | flags::ALWAYS_SIGN
            | flags::EXTENDED_SESSIONSECURITY
            | flags::VERSION
            | flags::NEGOTIATE_128
            | flags::KEY_EXCH
            | flags::NEGOTIATE_56;
        let neg_flags = (client & ECHOED)
            | flags::NTLM
            | flags::REQUEST_TARGET
            | flags::TARGET_INFO
            | flags::TARGET_TYPE_SERVER;

        let mut server_challenge = [0u8; 8];
        self.shared.provider.fill_random(&mut server_challenge);
        let target_name = utf16le(&self.shared.config.netbios_computer);
        let target_info = self.target_info(filetime_now());
        let challenge =
            ntlm::build_challenge(neg_flags, &server_challenge, &target_name, &target_info);
        let pending = Pending {
            spnego,
            negotiate: msg.to_vec(),
            challenge: challenge.clone(),
            server_challenge,
            flags: neg_flags,
        };
        Ok((challenge, pending))
    }

    /// TargetInfo AV pairs (MS-NLMP 2.2.2.1), in the order Windows sends them.
    fn target_info(&self, filetime: u64) -> Vec<u8> {
        let c = &self.shared.config;
        let mut out = Vec::new();
        ntlm::push_av_pair(&mut out, av::NB_DOMAIN_NAME, &utf16le(&c.netbios_domain));
        ntlm::push_av_pair(
            &mut out,
            av::NB_COMPUTER_NAME,
            &utf16le(&c.netbios_computer),
        );
        if !c.dns_domain.is_empty() {
            ntlm::push_av_pair(&mut out, av::DNS_DOMAIN_NAME, &utf16le(&c.dns_domain));
        }
        if !c.dns_computer.is_empty() {
            ntlm::push_av_pair(&mut out, av::DNS_COMPUTER_NAME, &utf16le(&c.dns_computer));
        }
        // With a timestamp present, clients must send a MIC (MS-NLMP 3.1.5.1.2).
        ntlm::push_av_pair(&mut out, av::TIMESTAMP, &filetime.to_le_bytes());
        ntlm::push_av_pair(&mut out, av::EOL, &[]);
        out
    }

    fn step_authenticate(&mut self, p: Pending, input: &[u8]) -> Result<AuthStep, AuthError> {
        let Some(ctx) = &p.spnego else {
            if !input.starts_with(ntlm::SIGNATURE) {
                return Err(AuthError::Malformed("expected an NTLMSSP AUTHENTICATE"));
            }
            let v = self.verify_authenticate(&p, input, false)?;
            return Ok(AuthStep::Complete(result(v, p.flags, Vec::new())));
        };
        let resp = spnego::parse_resp(input).map_err(AuthError::Malformed)?;
        let auth = resp.response_token.ok_or(AuthError::Malformed(
            "NegTokenResp without NTLMSSP AUTHENTICATE",
        ))?;
        let mic_needed = resp.mech_list_mic.is_some() || !ctx.ntlm_preferred;
        let v = self.verify_authenticate(&p, auth, mic_needed)?;

        let mut server_mic = None;
        if !v.guest && !v.anonymous {
            let needed = resp.mech_list_mic.is_some() || v.mic_present || !ctx.ntlm_preferred;
            if needed {
                server_mic = Some(self.mech_list_mic(&p, ctx, &v, resp.mech_list_mic)?);
            }
        }
        let output = spnego::build_resp(
            NegState::AcceptCompleted,
            None,
            None,
            server_mic.as_ref().map(|m| &m[..]),
        );
        let mut r = result(v, p.flags, output);
        r.ntlm_first_seq = (
            u32::from(resp.mech_list_mic.is_some()),
            u32::from(server_mic.is_some()),
        );
        Ok(AuthStep::Complete(r))
    }

    /// Checks the client's mechListMIC (if any) and computes ours (RFC 4178
    /// 5; MS-SPNG 3.1.5.1): NTLMSSP signatures, sequence number 0, over the
    /// client's MechTypeList as received.
    fn mech_list_mic(
        &self,
        p: &Pending,
        ctx: &SpnegoCtx,
        v: &Verified,
        client_mic: Option<&[u8]>,
    ) -> Result<[u8; 16], AuthError> {
        let ntlm = self.ntlm()?;
        if p.flags & flags::EXTENDED_SESSIONSECURITY == 0 {
            return Err(AuthError::NotSupported(
                "NTLM signing without extended session security",
            ));
        }
        let key_exch = p.flags & flags::KEY_EXCH != 0;
        let sign = |dir: Direction| {
            let sk = Zeroizing::new(ntlm::sign_key(ntlm, &v.session_key, dir));
            let mut seal = key_exch.then(|| {
                let ck = Zeroizing::new(ntlm::seal_key(ntlm, &v.session_key, p.flags, dir));
                ntlm.rc4_stream(&ck[..])
            });
            ntlm::mac(ntlm, &sk, seal.as_deref_mut(), 0, &ctx.mech_types)
        };
        match client_mic {
            Some(mic) if !ct_eq(mic, &sign(Direction::ClientToServer)) => {
                return Err(AuthError::LogonFailure {
                    user: v.user.clone(),
                    reason: "bad SPNEGO mechListMIC",
                });
            }
            Some(_) => {}
            None if !ctx.ntlm_preferred => {
                return Err(AuthError::LogonFailure {
                    user: v.user.clone(),
                    reason: "missing SPNEGO mechListMIC after choosing a non-preferred mechanism",
                });
            }
            // A client that put a MIC in its AUTHENTICATE (MsvAvFlags 0x2,
            // MS-NLMP 2.2.2.1, 3.1.5.1.2) has the keys to sign the
            // mechanism list and does (MS-SPNG 3.3.5.1 gives the key state
            // it uses): without it, the SPNEGO layer around the NTLM
            // messages is unprotected (RFC 4178 5), e.g. stripped by a man
            // in the middle. Windows and Samba refuse such a logon too.
            None if v.mic_present => {
                return Err(AuthError::LogonFailure {
                    user: v.user.clone(),
                    reason: "missing SPNEGO mechListMIC although the NTLM AUTHENTICATE has a MIC",
                });
            }
            None => {}
        }
        Ok(sign(Direction::ServerToClient))
    }

    /// Checks an AUTHENTICATE message (MS-NLMP 3.2.5.1.2), NTLMv2 only.
    /// `mic_needed`: SPNEGO will need a mechListMIC whatever the message
    /// says (the client sent one, or NTLM was not its first choice).
    fn verify_authenticate(
        &self,
        p: &Pending,
        msg: &[u8],
        mic_needed: bool,
    ) -> Result<Verified, AuthError> {
        let ntlm = self.ntlm()?;
        let a = ntlm::parse_authenticate(msg).map_err(AuthError::Malformed)?;
        let user = utf16_string(a.user)?;
        let domain = utf16_string(a.domain)?;

        let anonymous = a.flags & flags::ANONYMOUS != 0
            || (user.is_empty()
                && a.nt_response.is_empty()
                && (a.lm_response.is_empty() || a.lm_response == [0]));
        if anonymous {
            if !self.shared.config.allow_guest {
                return Err(AuthError::AnonymousRefused);
            }
            return Ok(Verified {
                user: String::new(),
                domain: String::new(),
                session_key: Zeroizing::new([0; 16]),
                guest: false,
                anonymous: true,
                mic_present: false,
            });
        }
        if a.nt_response.len() == 24 {
            // NTLMv1 (a 24-byte response) is refused as a failed logon, as
            // Samba's smbd does: the client learns nothing beyond "no".
            return Err(AuthError::LogonFailure {
                user,
                reason: "NTLMv1 response (only NTLMv2 is accepted)",
            });
        }
        if a.nt_response.len() < 16 + ntlm::CLIENT_CHALLENGE_FIXED {
            return Err(AuthError::Malformed("NTLMv2 response too short"));
        }
        // A client challenge whose AV pairs do not parse is malformed
        // whoever sent it (STATUS_INVALID_PARAMETER, as Samba answers the
        // NetApp-style response of smbtorture smb2.session.ntlmssp_bug14932),
        // found before any hash is computed.
        ntlm::find_av_pair(
            &a.nt_response[16 + ntlm::CLIENT_CHALLENGE_FIXED..],
            av::FLAGS,
        )
        .map_err(AuthError::Malformed)?;
        if user.is_empty() {
            return Err(AuthError::LogonFailure {
                user,
                reason: "empty user name",
            });
        }
        // Everything the message alone decides is checked before the
        // password: a refusal that came only after a right password would
        // tell a guesser so, past the failed-logon back-off.
        if p.flags & flags::KEY_EXCH != 0 && !matches!(a.encrypted_session_key.len(), 0 | 16) {
            return Err(AuthError::Malformed(
                "EncryptedRandomSessionKey is not 16 bytes",
            ));
        }
        let av_pairs = &a.nt_response[16 + ntlm::CLIENT_CHALLENGE_FIXED..];
        let av_flags = ntlm::find_av_pair(av_pairs, av::FLAGS)
            .map_err(AuthError::Malformed)?
            .and_then(|v| v.get(..4))
            .map(|v| u32::from_le_bytes([v[0], v[1], v[2], v[3]]))
            .unwrap_or(0);
        let mic_present = av_flags & av::FLAG_MIC_PRESENT != 0;
        if mic_present && !a.has_mic_room {
            return Err(AuthError::Malformed("MIC announced but no room for it"));
        }
        // A mechListMIC (MS-SPNG 3.1.5.1) needs extended session security.
        if (mic_present || mic_needed)
            && p.spnego.is_some()
            && p.flags & flags::EXTENDED_SESSIONSECURITY == 0
        {
            return Err(AuthError::NotSupported(
                "NTLM signing without extended session security",
            ));
        }
        self.check_binding(ntlm, av_pairs, &user)?;

        self.reload_users();
        let found = {
            let db = self
                .shared
                .users
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match (db.canonical_name(&user), db.nt_hash(&user)) {
                (Some(name), Some(hash)) => {
                    Some((name.to_owned(), Zeroizing::new(*hash.as_bytes())))
                }
                _ => None,
            }
        };
        let known = found.is_some();
        // An unknown user is checked against the dummy hash: the same
        // NTOWFv2 and NTProofStr HMACs as a known user with a wrong
        // password, so the time taken does not tell which names exist.
        let (stored_name, nt_hash) =
            found.unwrap_or_else(|| (user.clone(), self.shared.dummy_hash.clone()));

        let (nt_proof, blob) = a.nt_response.split_at(16);
        // Clients differ in the domain they hash: try the one sent, then its
        // upper case, then none (MS-NLMP 3.2.5.1.2 lets servers try variants).
        let upper = domain.to_uppercase();
        let mut candidates = vec![domain.as_str()];
        if upper != domain {
            candidates.push(upper.as_str());
        }
        if !domain.is_empty() {
            candidates.push("");
        }
        let owf = ntlm::ntlmv2_response_key(
            ntlm,
            &nt_hash,
            &user,
            &candidates,
            &p.server_challenge,
            nt_proof,
            blob,
        );
        if !known {
            if self.shared.config.allow_guest {
                return Ok(Verified {
                    user,
                    domain,
                    session_key: Zeroizing::new([0; 16]),
                    guest: true,
                    anonymous: false,
                    mic_present: false,
                });
            }
            return Err(AuthError::LogonFailure {
                user,
                reason: "unknown user",
            });
        }
        let Some(owf) = owf else {
            return Err(AuthError::LogonFailure {
                user,
                reason: "wrong password",
            });
        };

        // MS-NLMP 3.3.2: for NTLMv2, KeyExchangeKey = SessionBaseKey.
        let key_exchange_key = Zeroizing::new(ntlm.hmac_md5(&owf[..], &[nt_proof]));
        let mut exported = Zeroizing::new(*key_exchange_key);
        // A client may decline the exchange (no key): KeyExchangeKey stays.
        if p.flags & flags::KEY_EXCH != 0 && a.encrypted_session_key.len() == 16 {
            exported.copy_from_slice(a.encrypted_session_key);
            ntlm.rc4(&key_exchange_key[..], &mut exported[..]);
        }

        if mic_present {
            let mut zeroed = msg.to_vec();
            let mic = msg[MIC_OFFSET..MIC_OFFSET + 16].to_vec();
            zeroed[MIC_OFFSET..MIC_OFFSET + 16].fill(0);
            let expected = ntlm.hmac_md5(&exported[..], &[&p.negotiate, &p.challenge, &zeroed]);
            if !ct_eq(&expected, &mic) {
                return Err(AuthError::LogonFailure {
                    user,
                    reason: "bad NTLM MIC",
                });
            }
        }

        Ok(Verified {
            user: stored_name,
            domain,
            session_key: exported,
            guest: false,
            anonymous: false,
            mic_present,
        })
    }
}

impl AuthExchange {
    /// Picks up changes to the user database file (at most one stat() a
    /// second, see `Reloader`); a file that cannot be used is logged and
    /// the users loaded before stay.
    fn reload_users(&self) {
        let Some(r) = &self.shared.reloader else {
            return;
        };
        match r.check(&self.shared.users, Instant::now()) {
            Reload::Unchanged => {}
            Reload::Reloaded { users } => tracing::info!(
                "user database {} changed: reloaded, {users} user(s)",
                r.path().display()
            ),
            Reload::Failed(e) => {
                tracing::error!("{e}; not reloaded: the users loaded before stay in use")
            }
        }
    }

    /// Relay protection on a verified AUTHENTICATE: MsvAvTargetName must
    /// name this server and MsvAvChannelBindings no channel (MS-NLMP
    /// 2.2.2.1, 3.2.5.1.2; the rule is in the `binding` module). The AV
    /// pairs are covered by NTProofStr, so they are the client's own.
    fn check_binding(
        &self,
        ntlm: &dyn NtlmPrimitives,
        av_pairs: &[u8],
        user: &str,
    ) -> Result<(), AuthError> {
        let refuse = |reason, value| AuthError::WrongTarget {
            user: user.to_owned(),
            reason,
            value,
        };
        if let Some(raw) =
            ntlm::find_av_pair(av_pairs, av::TARGET_NAME).map_err(AuthError::Malformed)?
        {
            let spn = utf16_string(raw)?;
            tracing::debug!("NTLM AUTHENTICATE of {user:?}: MsvAvTargetName {spn:?}");
            self.shared
                .names
                .check_target_name(&spn, self.local)
                .map_err(|reason| refuse(reason, spn.clone()))?;
        }
        if let Some(cb) =
            ntlm::find_av_pair(av_pairs, av::CHANNEL_BINDINGS).map_err(AuthError::Malformed)?
        {
            let hex: String = cb.iter().map(|b| format!("{b:02x}")).collect();
            tracing::debug!("NTLM AUTHENTICATE of {user:?}: MsvAvChannelBindings {hex}");
            binding::check_channel_bindings(ntlm, cb).map_err(|reason| refuse(reason, hex))?;
        }
        Ok(())
    }
}

fn result(v: Verified, flags: u32, output: Vec<u8>) -> AuthResult {
    AuthResult {
        ntlm_flags: Some(flags),
        ntlm_first_seq: (0, 0),
        kerberos: None,
        output,
        user: v.user,
        domain: v.domain,
        full_session_key: Zeroizing::new(v.session_key.to_vec()),
        expires_in: None,
        key_type: None,
        session_key: v.session_key,
        guest: v.guest,
        anonymous: v.anonymous,
    }
}

/// Decodes a UTF-16LE field (UNICODE is always negotiated).
fn utf16_string(b: &[u8]) -> Result<String, AuthError> {
    if !b.len().is_multiple_of(2) {
        return Err(AuthError::Malformed("odd-length UTF-16 string"));
    }
    let units = b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .map_err(|_| AuthError::Malformed("invalid UTF-16 string"))
}

/// Now as a Windows FILETIME (100 ns ticks since 1601).
fn filetime_now() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() + FILETIME_UNIX_OFFSET_SECS) * 10_000_000 + u64::from(d.subsec_nanos() / 100)
}

#[cfg(test)]
#[path = "acceptor_tests.rs"]
mod tests;
