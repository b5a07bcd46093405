//! Connection security: key derivation (MS-SMB2 3.3.5.5.3), signing of
//! responses (3.3.4.1.1) and verification of requests (3.3.5.2.4), and the
//! 3.1.1 preauth integrity hash (3.3.5.4, 3.3.5.5). The only place in the
//! server that touches keys; all primitives come from the CryptoProvider.

use nimbus_crypto::{CryptoProvider, Signer, SigningAlgorithm};
use nimbus_wire::header::{flags, SIGNATURE_RANGE};
use nimbus_wire::negotiate::Dialect;
use nimbus_wire::Command;
use zeroize::Zeroizing;

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
