//! NTLM session security (MS-NLMP 3.4): signing and sealing of the
//! messages that follow an NTLM logon, for DCE/RPC's packet integrity
//! and privacy levels (MS-RPCE 3.3.1.5.2). SMB signs with its own keys
//! and never uses these.
//!
//! Only extended session security is served (NTLMv2 clients always
//! negotiate it): the keys are derived per direction (3.4.5.2-3), each
//! direction keeps one RC4 handle for its whole life (3.4.3), and a
//! signature is the 16-byte NTLMSSP_MESSAGE_SIGNATURE of 2.2.2.9.1.

use std::fmt;
use std::sync::Arc;

use nimbus_crypto::{ct_eq, CryptoProvider, Rc4Stream};
use zeroize::Zeroizing;

use crate::ntlm::{self, flags, Direction};

/// Length of an NTLMSSP_MESSAGE_SIGNATURE.
pub const SIGNATURE_LEN: usize = 16;

/// A message whose signature does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadSignature;

impl fmt::Display for BadSignature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the NTLMSSP message signature does not verify")
    }
}

impl std::error::Error for BadSignature {}

/// One direction's keys and running state.
struct Half {
    sign_key: Zeroizing<[u8; 16]>,
    seal: Box<dyn Rc4Stream>,
    seq: u32,
}

/// The server's end of one NTLM security context.
pub struct NtlmSessionSecurity {
    provider: Arc<CryptoProvider>,
    key_exch: bool,
    incoming: Half,
    outgoing: Half,
}

impl fmt::Debug for NtlmSessionSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NtlmSessionSecurity")
            .field("key_exch", &self.key_exch)
            .field("incoming_seq", &self.incoming.seq)
            .field("outgoing_seq", &self.outgoing.seq)
            .finish()
    }
}

impl NtlmSessionSecurity {
    /// The context of a logon whose ExportedSessionKey is `exported` and
    /// whose negotiated flags are `neg_flags`, its sequence numbers going
    /// on from `first_seq` (client to server, server to client); None when
    /// the provider has no NTLM primitives or the logon did not negotiate
    /// extended session security.
    pub(crate) fn new(
        provider: Arc<CryptoProvider>,
        exported: &[u8; 16],
        neg_flags: u32,
        first_seq: (u32, u32),
    ) -> Option<NtlmSessionSecurity> {
        if neg_flags & flags::EXTENDED_SESSIONSECURITY == 0 {
            return None;
        }
        let ntlm = provider.ntlm()?;
        let half = |dir: Direction| {
            let seal_key = Zeroizing::new(ntlm::seal_key(ntlm, exported, neg_flags, dir));
            Half {
                sign_key: Zeroizing::new(ntlm::sign_key(ntlm, exported, dir)),
                seal: ntlm.rc4_stream(&seal_key[..]),
                seq: 0,
            }
        };
        let mut incoming = half(Direction::ClientToServer);
        let mut outgoing = half(Direction::ServerToClient);
        incoming.seq = first_seq.0;
        outgoing.seq = first_seq.1;
        Some(NtlmSessionSecurity {
            key_exch: neg_flags & flags::KEY_EXCH != 0,
            incoming,
            outgoing,
            provider,
        })
    }

    fn mac(&self, half: &mut Half, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        // `new` found the primitives; a provider does not lose them.
        let Some(ntlm) = self.provider.ntlm() else {
            return [0; SIGNATURE_LEN];
        };
        let seal = if self.key_exch {
            Some(&mut *half.seal)
        } else {
            None
        };
        let sig = ntlm::mac(ntlm, &half.sign_key, seal, half.seq, message);
        half.seq = half.seq.wrapping_add(1);
        sig
    }

    /// Checks the client's signature of `message` (MS-NLMP 3.4.4.2, the
    /// next sequence number).
    pub fn verify(&mut self, message: &[u8], signature: &[u8]) -> Result<(), BadSignature> {
        let mut half = self.take_incoming();
        let expected = self.mac(&mut half, message);
        self.incoming = half;
        if ct_eq(&expected, signature) {
            Ok(())
        } else {
            Err(BadSignature)
        }
    }

    /// Signs `message` to the client.
    pub fn sign(&mut self, message: &[u8]) -> [u8; SIGNATURE_LEN] {
        let mut half = self.take_outgoing();
        let sig = self.mac(&mut half, message);
        self.outgoing = half;
        sig
    }

    /// Unseals the client's message in place (MS-NLMP 3.4.3): `pdu[data]`
    /// is decrypted, then the signature is checked over `pdu[..signed]`,
    /// which DCE/RPC makes the whole PDU up to the signature.
    pub fn unseal(
        &mut self,
        pdu: &mut [u8],
        data: std::ops::Range<usize>,
        signed: usize,
        signature: &[u8],
    ) -> Result<(), BadSignature> {
        let mut half = self.take_incoming();
        if let Some(d) = pdu.get_mut(data) {
            half.seal.apply(d);
        }
        let expected = self.mac(&mut half, pdu.get(..signed).unwrap_or_default());
        self.incoming = half;
        if ct_eq(&expected, signature) {
            Ok(())
        } else {
            Err(BadSignature)
        }
    }

    /// Seals `pdu[data]` in place to the client and returns the signature
    /// of `pdu[..signed]` as it was before sealing.
    pub fn seal(
        &mut self,
        pdu: &mut [u8],
        data: std::ops::Range<usize>,
        signed: usize,
    ) -> [u8; SIGNATURE_LEN] {
        let mut half = self.take_outgoing();
        // The MAC is of the plaintext, but its checksum is encrypted with
        // the handle after the data (3.4.3): compute the HMAC first, seal,
        // then let `mac` encrypt the checksum.
        let Some(ntlm) = self.provider.ntlm() else {
            self.outgoing = half;
            return [0; SIGNATURE_LEN];
        };
        let plain_mac = ntlm::mac(
            ntlm,
            &half.sign_key,
            None,
            half.seq,
            pdu.get(..signed).unwrap_or_default(),
        );
        if let Some(d) = pdu.get_mut(data) {
            half.seal.apply(d);
        }
        let mut sig = plain_mac;
        if self.key_exch {
            half.seal.apply(&mut sig[4..12]);
        }
        half.seq = half.seq.wrapping_add(1);
        self.outgoing = half;
        sig
    }

    fn take_incoming(&mut self) -> Half {
        std::mem::replace(&mut self.incoming, Half::placeholder())
    }

    fn take_outgoing(&mut self) -> Half {
        std::mem::replace(&mut self.outgoing, Half::placeholder())
    }
}

/// A running RC4 state that never runs: what a `Half` holds for the
/// instant its real state is borrowed out.
struct Idle;

impl Rc4Stream for Idle {
    fn apply(&mut self, _data: &mut [u8]) {}
}

impl Half {
    fn placeholder() -> Half {
        Half {
            sign_key: Zeroizing::new([0; 16]),
            seal: Box::new(Idle),
            seq: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// MS-NLMP 4.2.4.4: "Plaintext" sealed with extended session security
    /// and key exchange, sequence number 0, by the client; the server's
    /// end unseals and verifies it, and a changed byte fails.
    #[test]
    fn ms_nlmp_4_2_4_4_unseal_and_a_changed_byte_fails() {
        let provider = CryptoProvider::default_provider();
        let exported: [u8; 16] = [0x55; 16];
        let neg = flags::NEGOTIATE_128 | flags::KEY_EXCH | flags::EXTENDED_SESSIONSECURITY;
        let mut server =
            NtlmSessionSecurity::new(provider.clone(), &exported, neg, (0, 0)).unwrap();
        let mut client_view =
            NtlmSessionSecurity::new(provider.clone(), &exported, neg, (0, 0)).unwrap();
        // The client's direction is our incoming one: swap to play client.
        std::mem::swap(&mut client_view.incoming, &mut client_view.outgoing);
        let plaintext = crate::userdb::utf16le("Plaintext");
        let mut sealed = plaintext.clone();
        let n = sealed.len();
        let sig = client_view.seal(&mut sealed, 0..n, n);
        assert_eq!(sealed, h("54e50165bf1936dc996020c1811b0f06fb5f"));
        assert_eq!(sig.to_vec(), h("010000007fb38ec5c55d497600000000"));
        let mut opened = sealed.clone();
        server.unseal(&mut opened, 0..n, n, &sig).unwrap();
        assert_eq!(opened, plaintext);
        // The next message, with a byte changed, does not verify.
        let mut second = plaintext.clone();
        let sig2 = client_view.seal(&mut second, 0..n, n);
        second[3] ^= 1;
        assert_eq!(
            server.unseal(&mut second, 0..n, n, &sig2),
            Err(BadSignature)
        );
    }

    /// Signing alone: the server verifies what the client signs, in order,
    /// and refuses a replayed signature (its sequence number has passed).
    #[test]
    fn signatures_follow_the_sequence() {
        let provider = CryptoProvider::default_provider();
        let exported: [u8; 16] = [7; 16];
        let neg = flags::EXTENDED_SESSIONSECURITY | flags::KEY_EXCH | flags::NEGOTIATE_128;
        let mut server =
            NtlmSessionSecurity::new(provider.clone(), &exported, neg, (0, 0)).unwrap();
        let mut client = NtlmSessionSecurity::new(provider, &exported, neg, (0, 0)).unwrap();
        std::mem::swap(&mut client.incoming, &mut client.outgoing);
        let a = client.sign(b"first");
        let b = client.sign(b"second");
        server.verify(b"first", &a).unwrap();
        assert_eq!(server.verify(b"first", &a), Err(BadSignature));
        // The failed check used sequence number 1; "second" was signed
        // with it, so it no longer verifies either: a connection whose
        // check failed is closed.
        assert_eq!(server.verify(b"second", &b), Err(BadSignature));
    }
}
