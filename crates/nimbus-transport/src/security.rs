//! Connection security: key derivation (MS-SMB2 3.3.5.5.3), signing of
//! responses (3.3.4.1.1) and verification of requests (3.3.5.2.4),
//! encryption of responses (3.3.4.1.4) and decryption of requests
//! (3.3.5.2.1.1), and the 3.1.1 preauth integrity hash (3.3.5.4, 3.3.5.5).
//! The only place in the server that touches keys; all primitives come from
//! the CryptoProvider.

use std::sync::atomic::{AtomicU64, Ordering};

use nimbus_crypto::{Aead, CipherAlgorithm, CryptoError, CryptoProvider, Signer, SigningAlgorithm};
use nimbus_wire::header::{flags, SIGNATURE_RANGE};
use nimbus_wire::negotiate::Dialect;
use nimbus_wire::transform::{
    TransformHeader, AAD_RANGE, FLAG_ENCRYPTED, TAG_RANGE, TRANSFORM_HEADER_SIZE,
};
use nimbus_wire::Command;
use zeroize::Zeroizing;

/// A signing key ready to sign and verify: Session.SigningKey or a bound
/// channel's Channel.SigningKey (MS-SMB2 3.3.1.8, 3.3.1.14). Shared, so
/// that a response is signed with the key its request was verified with
/// even if it is sent long after (a pending request's final response).
pub type SigningKey = std::sync::Arc<dyn Signer>;

/// MS-SMB2 3.1.4.1: 8-byte MessageId, then bit 0 set for the server's
/// messages and bit 1 set for a CANCEL request.
pub fn gmac_nonce(msg: &[u8]) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    if msg.len() >= 64 {
        nonce[..8].copy_from_slice(&msg[24..32]);
        let fl = u32::from_le_bytes([msg[16], msg[17], msg[18], msg[19]]);
        let command = u16::from_le_bytes([msg[12], msg[13]]);
        let mut role = 0u32;
        if fl & flags::SERVER_TO_REDIR != 0 {
            role |= 1;
        }
        if command == Command::Cancel as u16 {
            role |= 2;
        }
        nonce[8..].copy_from_slice(&role.to_le_bytes());
    }
    nonce
}

/// Signs a complete response in place: sets SMB2_FLAGS_SIGNED, zeroes the
/// Signature field and writes the signature over the whole message.
pub fn sign(signer: &dyn Signer, msg: &mut [u8]) {
    let fl = u32::from_le_bytes([msg[16], msg[17], msg[18], msg[19]]) | flags::SIGNED;
    msg[16..20].copy_from_slice(&fl.to_le_bytes());
    msg[SIGNATURE_RANGE].fill(0);
    let nonce = gmac_nonce(msg);
    let sig = signer.sign(&nonce, msg);
    msg[SIGNATURE_RANGE].copy_from_slice(&sig);
}

/// Verifies a request's signature. The Signature field is zeroed while the
/// MAC is computed and restored afterwards, so the (possibly 8 MiB) message
/// is never copied.
pub fn verify(signer: &dyn Signer, msg: &mut [u8]) -> bool {
    if msg.len() < 64 {
        return false;
    }
    let mut received = [0u8; 16];
    received.copy_from_slice(&msg[SIGNATURE_RANGE]);
    msg[SIGNATURE_RANGE].fill(0);
    let nonce = gmac_nonce(msg);
    let computed = signer.sign(&nonce, msg);
    msg[SIGNATURE_RANGE].copy_from_slice(&received);
    nimbus_crypto::ct_eq(&computed, &received)
}

/// Derives the session's signer from the authentication's session key.
pub fn session_signer(
    provider: &CryptoProvider,
    dialect: Dialect,
    signing_algorithm: SigningAlgorithm,
    session_key: &[u8; 16],
    preauth_hash: &[u8; 64],
) -> Result<Box<dyn Signer>, nimbus_crypto::CryptoError> {
    let mut key = Zeroizing::new([0u8; 16]);
    match dialect {
        Dialect::Smb202 | Dialect::Smb210 => {
            key.copy_from_slice(session_key);
            return provider.signer(SigningAlgorithm::HmacSha256, &key[..]);
        }
        Dialect::Smb300 | Dialect::Smb302 => {
            provider.kdf(session_key, b"SMB2AESCMAC\0", b"SmbSign\0", &mut key[..]);
        }
        Dialect::Smb311 => {
            provider.kdf(session_key, b"SMBSigningKey\0", preauth_hash, &mut key[..]);
        }
    }
    provider.signer(signing_algorithm, &key[..])
}

/// A session's encryption state: one cipher per direction and the counter
/// that makes every nonce of the server's key unique.
pub struct SessionCipher {
    /// Session.EncryptionKey: protects what the server sends.
    encryptor: Box<dyn Aead>,
    /// Session.DecryptionKey: opens what the client sends.
    decryptor: Box<dyn Aead>,
    /// The counter of the nonces sealed under Session.EncryptionKey. The key
    /// belongs to the session, not the connection (MS-SMB2 3.3.5.5.3), so
    /// with multichannel every channel bound to the session must seal
    /// through this one SessionCipher (the session's shared Arc), never a
    /// per-channel copy or a re-derivation that restarts the count: a nonce
    /// used twice under AES-GCM gives away the GHASH key and the XOR of the
    /// two messages. The counter is atomic, so channels sealing at once
    /// still take distinct values.
    next_nonce: AtomicU64,
}

/// Which end of the connection a `SessionCipher` serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Server,
    Client,
}

/// Why an encrypted message was not accepted; the connection is closed.
#[derive(Debug, PartialEq, Eq)]
pub enum DecryptError {
    Malformed(&'static str),
    Authentication,
}

impl SessionCipher {
    /// Derives both keys from the session key (MS-SMB2 3.3.5.5.3).
    pub fn derive(
        provider: &CryptoProvider,
        dialect: Dialect,
        alg: CipherAlgorithm,
        session_key: &[u8],
        preauth_hash: &[u8; 64],
    ) -> Result<SessionCipher, CryptoError> {
        Self::derive_for(
            provider,
            dialect,
            alg,
            session_key,
            preauth_hash,
            Side::Server,
        )
    }

    /// Derives both keys as `side` holds them: a client seals with the
    /// key the server opens with, and opens with the one it seals with
    /// (MS-SMB2 3.2.5.3.1). The client side serves the load generator,
    /// which must pay the same crypto a client pays.
    pub fn derive_for(
        provider: &CryptoProvider,
        dialect: Dialect,
        alg: CipherAlgorithm,
        session_key: &[u8],
        preauth_hash: &[u8; 64],
        side: Side,
    ) -> Result<SessionCipher, CryptoError> {
        let n = alg.key_len();
        let mut enc = Zeroizing::new([0u8; 32]);
        let mut dec = Zeroizing::new([0u8; 32]);
        if dialect == Dialect::Smb311 {
            provider.kdf(
                session_key,
                b"SMBS2CCipherKey\0",
                preauth_hash,
                &mut enc[..n],
            );
            provider.kdf(
                session_key,
                b"SMBC2SCipherKey\0",
                preauth_hash,
                &mut dec[..n],
            );
        } else {
            provider.kdf(session_key, b"SMB2AESCCM\0", b"ServerOut\0", &mut enc[..n]);
            provider.kdf(session_key, b"SMB2AESCCM\0", b"ServerIn \0", &mut dec[..n]);
        }
        if side == Side::Client {
            std::mem::swap(&mut enc, &mut dec);
        }
        Ok(SessionCipher {
            encryptor: provider.cipher(alg, &enc[..n])?,
            decryptor: provider.cipher(alg, &dec[..n])?,
            next_nonce: AtomicU64::new(1),
        })
    }

    pub fn algorithm(&self) -> CipherAlgorithm {
        self.encryptor.algorithm()
    }

    /// Decrypts a received TRANSFORM message in place. On success the SMB2
    /// message(s) are `frame[TRANSFORM_HEADER_SIZE..]`.
    pub fn open(&self, hdr: &TransformHeader, frame: &mut [u8]) -> Result<(), DecryptError> {
        if hdr.flags != FLAG_ENCRYPTED {
            return Err(DecryptError::Malformed(
                "transform flags are not 'encrypted'",
            ));
        }
        if frame.len().checked_sub(TRANSFORM_HEADER_SIZE)
            != Some(hdr.original_message_size as usize)
        {
            return Err(DecryptError::Malformed(
                "OriginalMessageSize does not match the frame",
            ));
        }
        let n = self.decryptor.algorithm().nonce_len();
        let (head, data) = frame.split_at_mut(TRANSFORM_HEADER_SIZE);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&head[TAG_RANGE]);
        self.decryptor
            .open_in_place(&hdr.nonce[..n], &head[AAD_RANGE], data, &tag)
            .map_err(|_| DecryptError::Authentication)
    }

    /// Encrypts `buf` = `[52-byte slot][SMB2 message(s)]` in place and fills
    /// the slot with the TRANSFORM header. Fails only if the nonce counter
    /// is exhausted (2^64 messages), in which case nothing may be sent.
    pub fn seal(&self, session_id: u64, buf: &mut [u8]) -> Result<(), CryptoError> {
        let counter = self
            .next_nonce
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1))
            .map_err(|_| CryptoError::TooLong)?;
        let mut nonce = [0u8; 16];
        nonce[..8].copy_from_slice(&counter.to_le_bytes());
        self.seal_with_nonce(nonce, session_id, buf)
    }

    /// `seal` with a given Nonce field (the bytes beyond the cipher's nonce
    /// length are sent as given and authenticated as part of the AAD).
    fn seal_with_nonce(
        &self,
        nonce: [u8; 16],
        session_id: u64,
        buf: &mut [u8],
    ) -> Result<(), CryptoError> {
        if buf.len() < TRANSFORM_HEADER_SIZE {
            return Err(CryptoError::TooLong);
        }
        let (head, data) = buf.split_at_mut(TRANSFORM_HEADER_SIZE);
        let head: &mut [u8; TRANSFORM_HEADER_SIZE] =
            head.try_into().map_err(|_| CryptoError::TooLong)?;
        TransformHeader {
            signature: [0; 16],
            nonce,
            original_message_size: u32::try_from(data.len()).map_err(|_| CryptoError::TooLong)?,
            flags: FLAG_ENCRYPTED,
            session_id,
        }
        .write_into(head);
        let n = self.encryptor.algorithm().nonce_len();
        let tag = self
            .encryptor
            .seal_in_place(&nonce[..n], &head[AAD_RANGE], data)?;
        head[TAG_RANGE].copy_from_slice(&tag);
        Ok(())
    }
}

#[cfg(test)]
#[path = "security_vectors.rs"]
mod vectors;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gmac_nonce_layout() {
        let mut msg = vec![0u8; 64];
        msg[24..32].copy_from_slice(&0x0102030405060708u64.to_le_bytes());
        msg[16] = flags::SERVER_TO_REDIR as u8;
        let n = gmac_nonce(&msg);
        assert_eq!(&n[..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(&n[8..], &[1, 0, 0, 0]);
        msg[16] = 0;
        msg[12] = Command::Cancel as u8;
        assert_eq!(&gmac_nonce(&msg)[8..], &[2, 0, 0, 0]);
    }

    /// The server's seal is opened by a peer holding the mirrored keys, for
    /// every dialect family and cipher; nonces differ per message.
    #[test]
    fn seal_open_round_trip_with_mirrored_keys() {
        let provider = CryptoProvider::default_provider();
        let preauth = [3u8; 64];
        for dialect in [Dialect::Smb300, Dialect::Smb311] {
            for alg in CipherAlgorithm::ALL {
                let server =
                    SessionCipher::derive(&provider, dialect, alg, &[9; 16], &preauth).unwrap();
                // The client's view: what the server encrypts, it decrypts.
                let client = SessionCipher {
                    encryptor: provider
                        .cipher(alg, &derived(&provider, dialect, alg, &preauth, true))
                        .unwrap(),
                    decryptor: provider
                        .cipher(alg, &derived(&provider, dialect, alg, &preauth, false))
                        .unwrap(),
                    next_nonce: AtomicU64::new(1),
                };
                let msg = b"\xfeSMB response bytes".to_vec();
                let mut buf = vec![0u8; TRANSFORM_HEADER_SIZE];
                buf.extend_from_slice(&msg);
                server.seal(0x1234, &mut buf).unwrap();
                let hdr = TransformHeader::parse(&buf).unwrap();
                assert_eq!(hdr.session_id, 0x1234);
                assert_eq!(hdr.original_message_size as usize, msg.len());
                let mut again = vec![0u8; TRANSFORM_HEADER_SIZE];
                again.extend_from_slice(&msg);
                server.seal(0x1234, &mut again).unwrap();
                assert_ne!(buf[20..36], again[20..36], "nonce reused");
                client.open(&hdr, &mut buf).unwrap();
                assert_eq!(&buf[TRANSFORM_HEADER_SIZE..], &msg[..]);
                // A request from the client opens with the server's key.
                let mut req = vec![0u8; TRANSFORM_HEADER_SIZE];
                req.extend_from_slice(b"\xfeSMB request");
                client.seal(0x1234, &mut req).unwrap();
                let rh = TransformHeader::parse(&req).unwrap();
                let mut tampered = req.clone();
                tampered[60] ^= 1;
                assert_eq!(
                    server.open(&rh, &mut tampered),
                    Err(DecryptError::Authentication)
                );
                server.open(&rh, &mut req).unwrap();
                assert_eq!(&req[TRANSFORM_HEADER_SIZE..], b"\xfeSMB request");
                // `derive_for(Side::Client)` is that same client view.
                let derived_client = SessionCipher::derive_for(
                    &provider,
                    dialect,
                    alg,
                    &[9; 16],
                    &preauth,
                    Side::Client,
                )
                .unwrap();
                let mut sealed = vec![0u8; TRANSFORM_HEADER_SIZE];
                sealed.extend_from_slice(&msg);
                server.seal(0x1234, &mut sealed).unwrap();
                let sh = TransformHeader::parse(&sealed).unwrap();
                derived_client.open(&sh, &mut sealed).unwrap();
                assert_eq!(&sealed[TRANSFORM_HEADER_SIZE..], &msg[..]);
                let mut up = vec![0u8; TRANSFORM_HEADER_SIZE];
                up.extend_from_slice(b"\xfeSMB request");
                derived_client.seal(0x1234, &mut up).unwrap();
                let uh = TransformHeader::parse(&up).unwrap();
                server.open(&uh, &mut up).unwrap();
            }
        }
    }

    fn derived(
        p: &CryptoProvider,
        dialect: Dialect,
        alg: CipherAlgorithm,
        preauth: &[u8; 64],
        client_to_server: bool,
    ) -> Vec<u8> {
        let mut k = vec![0u8; alg.key_len()];
        let (label, ctx): (&[u8], &[u8]) = match (dialect, client_to_server) {
            (Dialect::Smb311, true) => (b"SMBC2SCipherKey\0", preauth),
            (Dialect::Smb311, false) => (b"SMBS2CCipherKey\0", preauth),
            (_, true) => (b"SMB2AESCCM\0", b"ServerIn \0"),
            (_, false) => (b"SMB2AESCCM\0", b"ServerOut\0"),
        };
        p.kdf(&[9; 16], label, ctx, &mut k);
        k
    }

    #[test]
    fn malformed_transform_is_refused() {
        let provider = CryptoProvider::default_provider();
        let c = SessionCipher::derive(
            &provider,
            Dialect::Smb311,
            CipherAlgorithm::Aes128Gcm,
            &[1; 16],
            &[0; 64],
        )
        .unwrap();
        let mut buf = vec![0u8; TRANSFORM_HEADER_SIZE + 10];
        c.seal(1, &mut buf).unwrap();
        let mut hdr = TransformHeader::parse(&buf).unwrap();
        hdr.original_message_size += 1;
        assert!(matches!(
            c.open(&hdr, &mut buf),
            Err(DecryptError::Malformed(_))
        ));
        hdr.original_message_size -= 1;
        hdr.flags = 2;
        assert!(matches!(
            c.open(&hdr, &mut buf),
            Err(DecryptError::Malformed(_))
        ));
    }

    #[test]
    fn sign_then_verify_and_tamper() {
        let provider = CryptoProvider::default_provider();
        for alg in [
            SigningAlgorithm::HmacSha256,
            SigningAlgorithm::AesCmac,
            SigningAlgorithm::AesGmac,
        ] {
            let signer = provider.signer(alg, &[7u8; 16]).unwrap();
            let mut msg = vec![0xFE, b'S', b'M', b'B'];
            msg.resize(100, 0x55);
            sign(signer.as_ref(), &mut msg);
            assert!(verify(signer.as_ref(), &mut msg), "{alg:?}");
            msg[99] ^= 1;
            assert!(!verify(signer.as_ref(), &mut msg), "{alg:?}");
        }
    }
}
