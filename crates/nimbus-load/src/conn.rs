//! One SMB 3.1.1 connection of the load generator: NEGOTIATE, an NTLMv2
//! logon, TREE_CONNECT and CREATE done one at a time, then frames built,
//! signed or sealed into one send buffer and answers read in batches.
//! Blocking sockets on a thread of its own: a pipelining client needs no
//! more, and every microsecond it spends is one the server cannot use on
//! a two-core machine.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_crypto::{CipherAlgorithm, CryptoProvider, Signer, SigningAlgorithm};
use nimbus_transport::security::{self, SessionCipher, Side};
use nimbus_wire::codec::HEADER_SIZE;
use nimbus_wire::create::CreateRequest;
use nimbus_wire::file_id::FileId;
use nimbus_wire::header::{flags, Header, TRANSFORM_PROTOCOL_ID};
use nimbus_wire::negotiate::{
    capabilities, cipher, context_type, id_list_context, parse_id_list, security_mode, Dialect,
    NegotiateRequest, NegotiateResponse, PreauthIntegrity, HASH_SHA512,
};
use nimbus_wire::session_setup::SessionSetupRequest;
use nimbus_wire::status::NtStatus;
use nimbus_wire::transform::{TransformHeader, TRANSFORM_HEADER_SIZE};
use nimbus_wire::tree_connect::TreeConnectRequest;
use nimbus_wire::Command;

use crate::ntlm;

/// How the session's requests and answers are protected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// Neither signed nor sealed: the server must not require signing.
    Plain,
    /// Every request and answer signed (SIGNING_REQUIRED).
    Signed,
    /// Every message after the logon sealed with AES-128-GCM.
    Encrypted,
}

/// Credits asked for on every request: enough for depth 128 and more.
const CREDITS_ASKED: u16 = 256;
/// The largest frame this client takes: a 1 MiB answer (the largest block
/// it asks for) and its headers, with room to spare; anything longer is a
/// protocol error.
const MAX_FRAME: usize = 8 << 20;
/// How long a connection waits for an answer before it gives up: a server
/// that stops answering ends the run instead of hanging it. Generous: Samba
/// logging on 1,000 connections at once left some unanswered for over a
/// minute.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);

/// An answer as the caller sees it: its id, status and body.
pub struct Answer<'a> {
    pub message_id: u64,
    pub status: NtStatus,
    pub tree_id: u32,
    pub body: &'a [u8],
}

pub struct Conn {
    sock: TcpStream,
    provider: Arc<CryptoProvider>,
    protection: Protection,
    session_id: u64,
    tree_id: u32,
    next_id: u64,
    /// Credits granted and not yet spent.
    credits: u64,
    signer: Option<Box<dyn Signer>>,
    cipher: Option<SessionCipher>,
    /// Received bytes; `rpos..rend` not yet taken as frames.
    rbuf: Vec<u8>,
    rpos: usize,
    rend: usize,
    /// The socket's read timeout is `fill`'s `wake`, not ANSWER_TIMEOUT.
    timed: bool,
    /// What NEGOTIATE chose, for the report.
    pub signing_algorithm: SigningAlgorithm,
}

/// The SMB2 header of a request.
fn request_header(command: Command, message_id: u64, tree_id: u32, session_id: u64) -> Header {
    Header {
        credit_charge: 1,
        status: NtStatus(0),
        command: command as u16,
        credits: CREDITS_ASKED,
        flags: 0,
        next_command: 0,
        message_id,
        async_id: 0,
        tree_id,
        reserved: 0xFEFF,
        session_id,
        signature: [0; 16],
    }
}

impl Conn {
    /// Connects, negotiates 3.1.1, logs on and connects to `share`.
    pub fn open(
        addr: &str,
        share_unc: &str,
        user: &str,
        domain: &str,
        password: &str,
        protection: Protection,
    ) -> Result<Conn, String> {
        let sock = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        sock.set_nodelay(true).map_err(|e| e.to_string())?;
        sock.set_read_timeout(Some(ANSWER_TIMEOUT))
            .map_err(|e| e.to_string())?;
        sock.set_write_timeout(Some(ANSWER_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let mut c = Conn {
            sock,
            provider: CryptoProvider::default_provider(),
            protection,
            session_id: 0,
            tree_id: 0,
            next_id: 0,
            credits: 1,
            signer: None,
            cipher: None,
            rbuf: vec![0; 1 << 20],
            rpos: 0,
            rend: 0,
            timed: false,
            signing_algorithm: SigningAlgorithm::AesCmac,
        };
        let (preauth, cipher_id) = c.negotiate()?;
        c.log_on(preauth, cipher_id, user, domain, password)?;
        c.tree_connect(share_unc)?;
        Ok(c)
    }

    fn security_mode(&self) -> u16 {
        if self.protection == Protection::Signed {
            security_mode::SIGNING_ENABLED | security_mode::SIGNING_REQUIRED
        } else {
            security_mode::SIGNING_ENABLED
        }
    }

    /// MS-SMB2 3.2.4.2.2.2: 3.1.1 only, SHA-512 preauth, AES-128-GCM,
    /// and GMAC or CMAC signing. Returns the preauth hash so far and the
    /// cipher the server chose.
    fn negotiate(&mut self) -> Result<([u8; 64], Option<u16>), String> {
        let mut salt = vec![0u8; 32];
        self.provider.fill_random(&mut salt);
        let mut guid = [0u8; 16];
        self.provider.fill_random(&mut guid);
        let req = NegotiateRequest {
            security_mode: self.security_mode(),
            capabilities: capabilities::LARGE_MTU | capabilities::ENCRYPTION,
            client_guid: guid,
            dialects: vec![Dialect::Smb311 as u16],
            contexts: vec![
                PreauthIntegrity {
                    hash_algorithms: vec![HASH_SHA512],
                    salt,
                }
                .to_context(),
                id_list_context(
                    context_type::ENCRYPTION_CAPABILITIES,
                    &[cipher::AES_128_GCM],
                ),
                id_list_context(
                    context_type::SIGNING_CAPABILITIES,
                    &[
                        SigningAlgorithm::AesGmac.id(),
                        SigningAlgorithm::AesCmac.id(),
                    ],
                ),
            ],
        };
        let mut body = Vec::new();
        req.encode(&mut body);
        let sent = self.send_setup(Command::Negotiate, &body)?;
        let (msg, hdr) = self.recv_setup()?;
        if hdr.status != NtStatus::SUCCESS {
            return Err(format!("NEGOTIATE: {:?}", hdr.status));
        }
        let resp = NegotiateResponse::parse(&msg[HEADER_SIZE..])
            .map_err(|e| format!("NEGOTIATE answer: {e:?}"))?;
        if resp.dialect != Dialect::Smb311 as u16 {
            return Err(format!(
                "the server chose dialect {:#06x}, not 3.1.1",
                resp.dialect
            ));
        }
        let mut cipher_id = None;
        for ctx in &resp.contexts {
            // The server's choice: a list of one (MS-SMB2 2.2.4.1.2, 2.2.4.1.7).
            let first = parse_id_list(&ctx.data)
                .ok()
                .and_then(|ids| ids.first().copied());
            match ctx.context_type {
                context_type::ENCRYPTION_CAPABILITIES => cipher_id = first,
                context_type::SIGNING_CAPABILITIES => {
                    if let Some(alg) = first.and_then(SigningAlgorithm::from_id) {
                        self.signing_algorithm = alg;
                    }
                }
                _ => {}
            }
        }
        let h = self.provider.sha512(&[&[0u8; 64], &sent]);
        Ok((self.provider.sha512(&[&h, &msg]), cipher_id))
    }

    /// SESSION_SETUP with raw NTLMSSP tokens (MS-SMB2 3.2.4.2.3), keeping
    /// the session's preauth hash (3.2.5.3.1), then the keys.
    fn log_on(
        &mut self,
        mut preauth: [u8; 64],
        cipher_id: Option<u16>,
        user: &str,
        domain: &str,
        password: &str,
    ) -> Result<(), String> {
        let mode = self.security_mode() as u8;
        let setup = |token: &[u8]| {
            let mut body = Vec::new();
            SessionSetupRequest {
                flags: 0,
                security_mode: mode,
                capabilities: 0,
                previous_session_id: 0,
                security_buffer: token,
            }
            .encode(&mut body);
            body
        };
        let sent = self.send_setup(Command::SessionSetup, &setup(&ntlm::negotiate()))?;
        preauth = self.provider.sha512(&[&preauth, &sent]);
        let (msg, hdr) = self.recv_setup()?;
        if hdr.status != NtStatus::MORE_PROCESSING_REQUIRED {
            return Err(format!("SESSION_SETUP (NTLM NEGOTIATE): {:?}", hdr.status));
        }
        preauth = self.provider.sha512(&[&preauth, &msg]);
        self.session_id = hdr.session_id;
        let challenge = security_buffer(&msg)?;
        let (token, session_key) =
            ntlm::authenticate(&self.provider, challenge, user, domain, password)?;
        let sent = self.send_setup(Command::SessionSetup, &setup(&token))?;
        preauth = self.provider.sha512(&[&preauth, &sent]);
        let (mut msg, hdr) = self.recv_setup()?;
        if hdr.status != NtStatus::SUCCESS {
            return Err(format!("SESSION_SETUP as {user}: {:?}", hdr.status));
        }
        let signer = security::session_signer(
            &self.provider,
            Dialect::Smb311,
            self.signing_algorithm,
            &session_key,
            &preauth,
        )
        .map_err(|e| format!("signing key: {e:?}"))?;
        // 3.2.5.3.1: the final answer is signed with the new key; checking
        // it proves both ends derived the same keys.
        if hdr.flags & flags::SIGNED == 0 || !security::verify(signer.as_ref(), &mut msg) {
            return Err("the SESSION_SETUP answer is not signed with the session's key".into());
        }
        self.signer = Some(signer);
        if self.protection == Protection::Encrypted {
            let alg = cipher_id
                .and_then(CipherAlgorithm::from_id)
                .ok_or("the server chose no cipher, so this session cannot be encrypted")?;
            self.cipher = Some(
                SessionCipher::derive_for(
                    &self.provider,
                    Dialect::Smb311,
                    alg,
                    &session_key,
                    &preauth,
                    Side::Client,
                )
                .map_err(|e| format!("cipher keys: {e:?}"))?,
            );
        }
        Ok(())
    }

    fn tree_connect(&mut self, unc: &str) -> Result<(), String> {
        let mut body = Vec::new();
        TreeConnectRequest {
            flags: 0,
            path: unc.to_string(),
        }
        .encode(&mut body);
        let (tree_id, _) = self.call(Command::TreeConnect, &body)?;
        self.tree_id = tree_id;
        Ok(())
    }

    /// Opens `name` for reading and writing without caching; returns the
    /// handle and the file's length.
    pub fn open_file(&mut self, name: &str) -> Result<(FileId, u64), String> {
        let mut body = Vec::new();
        encode_open(&mut body, name, 0x0012_019F);
        let (_, resp) = self.call(Command::Create, &body)?;
        opened(&resp).ok_or_else(|| "CREATE answer cut short".into())
    }

    /// One request and its answer, outside the measured window: the
    /// answer's TreeId and body.
    fn call(&mut self, command: Command, body: &[u8]) -> Result<(u32, Vec<u8>), String> {
        let mut out = Vec::new();
        let id = self.queue(&mut out, command, 0, |b| b.extend_from_slice(body))?;
        self.send(&out)?;
        let mut got = None;
        while got.is_none() {
            self.receive(None, &mut |a: Answer<'_>| {
                if a.message_id == id {
                    got = Some((a.status, a.tree_id, a.body.to_vec()));
                }
                Ok(())
            })?;
        }
        match got {
            Some((NtStatus::SUCCESS, tree_id, resp)) => Ok((tree_id, resp)),
            Some((status, _, _)) => Err(format!("{command:?}: {status:?}")),
            None => Err(format!("{command:?}: no answer")),
        }
    }

    /// Credits granted and not yet spent: how many more requests may go.
    pub fn credits(&self) -> u64 {
        self.credits
    }

    /// Appends one request, framed and protected as the session is, to
    /// `out`; `body` writes its body. `payload` is the larger of the data
    /// it sends and the data it asks for, which sets its CreditCharge
    /// (MS-SMB2 3.2.4.1.5: one credit, and one MessageId, per 64 KiB).
    /// Returns its MessageId.
    pub fn queue(
        &mut self,
        out: &mut Vec<u8>,
        command: Command,
        payload: usize,
        body: impl FnOnce(&mut Vec<u8>),
    ) -> Result<u64, String> {
        let charge = charge(payload);
        if self.credits < u64::from(charge) {
            return Err("too few credits left to send with".into());
        }
        self.credits -= u64::from(charge);
        let id = self.next_id;
        self.next_id += u64::from(charge);
        let frame_at = out.len();
        out.extend_from_slice(&[0; 4]);
        if self.cipher.is_some() {
            out.extend_from_slice(&[0; TRANSFORM_HEADER_SIZE]);
        }
        let msg_at = out.len();
        let mut header = request_header(command, id, self.tree_id, self.session_id);
        header.credit_charge = charge;
        header.write(out);
        body(out);
        if let Some(cipher) = &self.cipher {
            cipher
                .seal(self.session_id, &mut out[frame_at + 4..])
                .map_err(|e| format!("seal: {e:?}"))?;
        } else if self.protection == Protection::Signed || command == Command::TreeConnect {
            // MS-SMB2 3.2.4.1.1: on 3.1.1 a TREE_CONNECT is signed even
            // when the session does not sign.
            if let Some(signer) = &self.signer {
                security::sign(signer.as_ref(), &mut out[msg_at..]);
            }
        }
        let len = out.len() - frame_at - 4;
        if len >= 1 << 24 {
            return Err("a request longer than a frame may be".into());
        }
        out[frame_at..frame_at + 4].copy_from_slice(&(len as u32).to_be_bytes());
        Ok(id)
    }

    /// Sends a batch whole. The batches this client makes never fill both
    /// directions at once (large requests get small answers, and the other
    /// way round), so a blocking write cannot wait on a server that waits
    /// for it to read.
    pub fn send(&mut self, out: &[u8]) -> Result<(), String> {
        self.sock.write_all(out).map_err(|e| format!("send: {e}"))
    }

    /// A setup request, sent at once; returns its SMB2 message for the
    /// preauth hash.
    fn send_setup(&mut self, command: Command, body: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        self.queue(&mut out, command, 0, |b| b.extend_from_slice(body))?;
        self.send(&out)?;
        Ok(out[4..].to_vec())
    }

    /// The next final answer, whole and untouched (setup answers are
    /// neither sealed nor, but for the last, signed), with its header; an
    /// interim (PENDING) answer is skipped.
    fn recv_setup(&mut self) -> Result<(Vec<u8>, Header), String> {
        loop {
            let (s, e) = loop {
                if let Some(range) = self.next_frame()? {
                    break range;
                }
                self.fill(None)?;
            };
            let msg = self.rbuf[s..e].to_vec();
            let hdr = Header::parse(&msg).map_err(|e| format!("answer header: {e:?}"))?;
            self.credits += u64::from(hdr.credits);
            if !(hdr.status == NtStatus::PENDING && hdr.is_async()) {
                return Ok((msg, hdr));
            }
        }
    }

    /// The bounds of the next whole frame in the buffer, taken from it, or
    /// None if more must be read first.
    fn next_frame(&mut self) -> Result<Option<(usize, usize)>, String> {
        let have = self.rend - self.rpos;
        if have < 4 {
            return Ok(None);
        }
        let head = &self.rbuf[self.rpos..self.rpos + 4];
        let len = u32::from_be_bytes([0, head[1], head[2], head[3]]) as usize;
        if head[0] != 0 || !(HEADER_SIZE..=MAX_FRAME).contains(&len) {
            return Err(format!(
                "a frame of {len} bytes (type {}) from the server",
                head[0]
            ));
        }
        if have < 4 + len {
            if self.rbuf.len() < 4 + len {
                self.rbuf.resize(4 + len, 0);
            }
            return Ok(None);
        }
        let s = self.rpos + 4;
        self.rpos = s + len;
        Ok(Some((s, s + len)))
    }

    /// Reads what the socket holds (blocking for at least one byte, or
    /// until `wake`: then Ok(false)), first moving a partial frame to the
    /// buffer's start.
    fn fill(&mut self, wake: Option<Instant>) -> Result<bool, String> {
        if self.rpos == self.rend {
            self.rpos = 0;
            self.rend = 0;
        } else if self.rpos > 0 {
            self.rbuf.copy_within(self.rpos..self.rend, 0);
            self.rend -= self.rpos;
            self.rpos = 0;
        }
        let timeout = match wake {
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left.min(ANSWER_TIMEOUT)),
                // Already late: take what has come without waiting.
                _ => return self.fill_now(),
            },
            None => None,
        };
        if timeout.is_some() || self.timed {
            let set = timeout.unwrap_or(ANSWER_TIMEOUT);
            self.sock
                .set_read_timeout(Some(set))
                .map_err(|e| e.to_string())?;
            self.timed = timeout.is_some();
        }
        let n = match self.sock.read(&mut self.rbuf[self.rend..]) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if wake.is_some() {
                    return Ok(false);
                }
                return Err(format!(
                    "the server answered nothing for {ANSWER_TIMEOUT:?}"
                ));
            }
            Err(e) => return Err(format!("receive: {e}")),
        };
        if n == 0 {
            return Err("the server closed the connection".into());
        }
        self.rend += n;
        Ok(true)
    }

    /// `fill` without waiting: Ok(false) if nothing has come.
    fn fill_now(&mut self) -> Result<bool, String> {
        self.sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        let read = self.sock.read(&mut self.rbuf[self.rend..]);
        self.sock
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        match read {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.rend += n;
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(format!("receive: {e}")),
        }
    }

    /// Waits for answers (no longer than until `wake`) and hands each to
    /// `each`: opened or checked as the session is protected, interim
    /// (PENDING) answers skipped. Returns how many were handed over.
    pub fn receive(
        &mut self,
        wake: Option<Instant>,
        each: &mut dyn FnMut(Answer<'_>) -> Result<(), String>,
    ) -> Result<usize, String> {
        let mut handed = 0;
        loop {
            let Some((s, e)) = self.next_frame()? else {
                if handed > 0 || !self.fill(wake)? {
                    return Ok(handed);
                }
                continue;
            };
            let frame = &mut self.rbuf[s..e];
            let msg: &mut [u8] = if frame[..4] == TRANSFORM_PROTOCOL_ID {
                let cipher = self
                    .cipher
                    .as_ref()
                    .ok_or("a sealed answer on a session without keys")?;
                let th = TransformHeader::parse(frame)
                    .map_err(|e| format!("transform header: {e:?}"))?;
                cipher
                    .open(&th, frame)
                    .map_err(|e| format!("sealed answer: {e:?}"))?;
                &mut frame[TRANSFORM_HEADER_SIZE..]
            } else {
                if self.cipher.is_some() {
                    return Err("an answer in clear on an encrypted session".into());
                }
                frame
            };
            let hdr = Header::parse(msg).map_err(|e| format!("answer header: {e:?}"))?;
            self.credits += u64::from(hdr.credits);
            let interim = hdr.status == NtStatus::PENDING && hdr.is_async();
            if self.protection == Protection::Signed && !interim {
                let good = hdr.is_signed()
                    && self
                        .signer
                        .as_ref()
                        .is_some_and(|signer| security::verify(signer.as_ref(), msg));
                if !good {
                    return Err(format!(
                        "an answer to {} not signed with the session's key",
                        hdr.message_id
                    ));
                }
            }
            if interim {
                continue;
            }
            handed += 1;
            each(Answer {
                message_id: hdr.message_id,
                status: hdr.status,
                tree_id: hdr.tree_id,
                body: &msg[HEADER_SIZE..],
            })?;
        }
    }
}

/// A CREATE opening the existing file `name` with `access`, sharing
/// everything, without caching (MS-SMB2 2.2.13).
pub fn encode_open(out: &mut Vec<u8>, name: &str, access: u32) {
    CreateRequest {
        requested_oplock_level: 0,
        impersonation_level: 2,
        desired_access: access,
        file_attributes: 0,
        share_access: 7,
        create_disposition: 1,
        create_options: 0x40,
        name: name.to_string(),
        contexts: Vec::new(),
    }
    .encode(out);
}

/// The handle and the file's length (EndofFile) of a CREATE answer's
/// body (MS-SMB2 2.2.14).
pub fn opened(body: &[u8]) -> Option<(FileId, u64)> {
    let field = |at: usize| Some(u64::from_le_bytes(body.get(at..at + 8)?.try_into().ok()?));
    let file = FileId {
        persistent: field(64)?,
        volatile: field(72)?,
    };
    Some((file, field(48)?))
}

/// The CreditCharge of a request moving `payload` bytes.
pub fn charge(payload: usize) -> u16 {
    (payload.saturating_sub(1) / 65536 + 1).min(u16::MAX as usize) as u16
}

/// The security buffer of a SESSION_SETUP answer (MS-SMB2 2.2.6).
fn security_buffer(msg: &[u8]) -> Result<&[u8], String> {
    let body = &msg[HEADER_SIZE.min(msg.len())..];
    let off = body
        .get(4..6)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let len = body
        .get(6..8)
        .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    match (off, len) {
        (Some(off), Some(len)) => msg
            .get(off..off + len)
            .ok_or_else(|| "SESSION_SETUP answer's buffer lies outside it".into()),
        _ => Err("SESSION_SETUP answer cut short".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_charged_one_credit_per_64_kib() {
        assert_eq!(charge(0), 1);
        assert_eq!(charge(4096), 1);
        assert_eq!(charge(65536), 1);
        assert_eq!(charge(65537), 2);
        assert_eq!(charge(1 << 20), 16);
    }
}
