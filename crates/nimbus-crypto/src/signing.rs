//! SMB2 message signing (MS-SMB2 3.1.4.1).
//!
//! A [`Signer`] is built once per session/channel signing key and then used for
//! every message; it keeps the (expanded) key and wipes it on drop.

use aes::Aes128;
use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes128Gcm, KeyInit, Nonce};
use cmac::{Cmac, Mac};
use hmac::Hmac;
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::CryptoError;

/// Signing algorithm identifiers of the SMB2_SIGNING_CAPABILITIES negotiate
/// context (MS-SMB2 2.2.3.1.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SigningAlgorithm {
    /// HMAC-SHA256 truncated to 16 bytes: dialects 2.0.2 and 2.1 (id 0).
    HmacSha256,
    /// AES-128-CMAC: dialects 3.0 and later (id 1).
    AesCmac,
    /// AES-128-GMAC: 3.1.1 with the signing capabilities context (id 2).
    AesGmac,
}

impl SigningAlgorithm {
    /// The wire identifier (MS-SMB2 2.2.3.1.7 SigningAlgorithms).
    pub fn id(self) -> u16 {
        match self {
            SigningAlgorithm::HmacSha256 => 0x0000,
            SigningAlgorithm::AesCmac => 0x0001,
            SigningAlgorithm::AesGmac => 0x0002,
        }
    }

    /// Maps a wire identifier back; unknown ids give `None` (a client may offer
    /// algorithms we do not know and we must skip them, not fail).
    pub fn from_id(id: u16) -> Option<Self> {
        match id {
            0x0000 => Some(SigningAlgorithm::HmacSha256),
            0x0001 => Some(SigningAlgorithm::AesCmac),
            0x0002 => Some(SigningAlgorithm::AesGmac),
            _ => None,
        }
    }
}

/// Computes SMB2 message signatures with one key.
pub trait Signer: Send + Sync {
    /// The algorithm this signer implements.
    fn algorithm(&self) -> SigningAlgorithm;
    /// 16-byte SMB2 signature of `message` (the whole SMB2 message with its
    /// Signature field already zeroed).
    ///
    /// `nonce` is used only by AES-GMAC (MS-SMB2 3.1.4.1: 8-byte MessageId LE
    /// then 4 bytes flags); others ignore it. HMAC-SHA256 output is truncated
    /// to 16 bytes.
    fn sign(&self, nonce: &[u8; 12], message: &[u8]) -> [u8; 16];
}

/// Builds the signer for `alg`; see [`crate::CryptoProvider::signer`].
pub(crate) fn new_signer(
    alg: SigningAlgorithm,
    key: &[u8],
) -> Result<Box<dyn Signer>, CryptoError> {
    match alg {
        SigningAlgorithm::HmacSha256 => Ok(Box::new(HmacSha256Signer {
            key: Zeroizing::new(key.to_vec()),
        })),
        SigningAlgorithm::AesCmac => {
            let key = key16(key)?;
            let mac = <Cmac<Aes128> as KeyInit>::new_from_slice(&key[..]).map_err(|_| {
                CryptoError::BadKeyLength {
                    expected: 16,
                    got: key.len(),
                }
            })?;
            Ok(Box::new(AesCmacSigner { mac }))
        }
        SigningAlgorithm::AesGmac => {
            let key = key16(key)?;
            let gcm =
                Aes128Gcm::new_from_slice(&key[..]).map_err(|_| CryptoError::BadKeyLength {
                    expected: 16,
                    got: key.len(),
                })?;
            Ok(Box::new(AesGmacSigner { gcm }))
        }
    }
}

/// SMB2 signing keys are 128-bit for AES (MS-SMB2 3.3.5.5.3: SigningKey is 16 bytes).
fn key16(key: &[u8]) -> Result<Zeroizing<[u8; 16]>, CryptoError> {
    let arr: [u8; 16] = key.try_into().map_err(|_| CryptoError::BadKeyLength {
        expected: 16,
        got: key.len(),
    })?;
    Ok(Zeroizing::new(arr))
}

/// HMAC-SHA256 signer (MS-SMB2 3.1.4.1, dialects 2.0.2 and 2.1).
struct HmacSha256Signer {
    // The raw key, not a keyed HMAC state: `Hmac` does not wipe its pads on
    // drop, and 2.x signing is not on a hot enough path to need the cache.
    key: Zeroizing<Vec<u8>>,
}

impl Signer for HmacSha256Signer {
    fn algorithm(&self) -> SigningAlgorithm {
        SigningAlgorithm::HmacSha256
    }

    fn sign(&self, _nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        let full = hmac_sha256(&self.key, &[message]);
        let mut out = [0u8; 16];
        out.copy_from_slice(&full[..16]);
        out
    }
}

/// AES-128-CMAC signer (MS-SMB2 3.1.4.1, dialect 3.0 and later).
struct AesCmacSigner {
    // Keyed once; cloned per message so the key schedule is not recomputed.
    // Built with cmac/aes `zeroize`, so the schedule is wiped on drop.
    mac: Cmac<Aes128>,
}

impl Signer for AesCmacSigner {
    fn algorithm(&self) -> SigningAlgorithm {
        SigningAlgorithm::AesCmac
    }

    fn sign(&self, _nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        let mut mac = self.mac.clone();
        mac.update(message);
        mac.finalize().into_bytes().into()
    }
}

/// AES-128-GMAC signer: AES-GCM with the message as AAD and no plaintext
/// (MS-SMB2 3.1.4.1).
struct AesGmacSigner {
    gcm: Aes128Gcm,
}

impl Signer for AesGmacSigner {
    fn algorithm(&self) -> SigningAlgorithm {
        SigningAlgorithm::AesGmac
    }

    fn sign(&self, nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        // Empty plaintext: GCM's only failure is a plaintext longer than
        // 2^36 - 32 bytes, which cannot happen here; the AAD bound (2^61 bytes)
        // is beyond any addressable slice. Keep a non-panicking fallback anyway.
        match self
            .gcm
            .encrypt_in_place_detached(Nonce::from_slice(nonce), message, &mut [])
        {
            Ok(tag) => tag.into(),
            Err(_) => [0u8; 16],
        }
    }
}

/// HMAC-SHA256 over the concatenation of `parts`.
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length (longer keys are hashed), so this cannot fail.
    let mut mac = match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts any key length"),
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    #[test]
    fn ids_round_trip() {
        for alg in [
            SigningAlgorithm::HmacSha256,
            SigningAlgorithm::AesCmac,
            SigningAlgorithm::AesGmac,
        ] {
            assert_eq!(SigningAlgorithm::from_id(alg.id()), Some(alg));
        }
        assert_eq!(SigningAlgorithm::AesGmac.id(), 2);
        assert_eq!(SigningAlgorithm::from_id(3), None);
    }

    /// RFC 4231 test cases 1 and 2; the signer returns the first 16 bytes.
    #[test]
    fn hmac_sha256_rfc4231() {
        let t1 = hmac_sha256(&[0x0b; 20], &[b"Hi There"]);
        assert_eq!(
            t1.to_vec(),
            h("b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7")
        );
        let t2 = hmac_sha256(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(
            t2.to_vec(),
            h("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        );
        let s = new_signer(SigningAlgorithm::HmacSha256, b"Jefe").unwrap();
        assert_eq!(s.algorithm(), SigningAlgorithm::HmacSha256);
        assert_eq!(
            s.sign(&[0; 12], b"what do ya want for nothing?").to_vec(),
            h("5bdcc146bf60754e6a042426089575c7")
        );
    }

    /// RFC 4493 section 4, examples 1-4.
    #[test]
    fn aes_cmac_rfc4493() {
        let key = h("2b7e151628aed2a6abf7158809cf4f3c");
        let msg = h(
            "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51\
                     30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710",
        );
        let s = new_signer(SigningAlgorithm::AesCmac, &key).unwrap();
        let cases = [
            (0, "bb1d6929e95937287fa37d129b756746"),
            (16, "070a16b46b4d4144f79bdd9dd04a287c"),
            (40, "dfa66747de9ae63030ca32611497c827"),
            (64, "51f0bebf7e3b9d92fc49741779363cfe"),
        ];
        for (len, tag) in cases {
            assert_eq!(s.sign(&[0; 12], &msg[..len]).to_vec(), h(tag), "len {len}");
        }
    }

    /// NIST CAVP gcmEncryptExtIV128.rsp, [Keylen=128][IVlen=96][PTlen=0]:
    /// AADlen=0 Count 0 and AADlen=128 Count 0 (GMAC = GCM with AAD only).
    #[test]
    fn aes_gmac_nist_gcm_aad_only() {
        let s = new_signer(
            SigningAlgorithm::AesGmac,
            &h("11754cd72aec309bf52f7687212e8957"),
        )
        .unwrap();
        let nonce: [u8; 12] = h("3c819d9a9bed087615030b65").try_into().unwrap();
        assert_eq!(
            s.sign(&nonce, b"").to_vec(),
            h("250327c674aaf477aef2675748cf6971")
        );

        let s = new_signer(
            SigningAlgorithm::AesGmac,
            &h("77be63708971c4e240d1cb79e8d77feb"),
        )
        .unwrap();
        let nonce: [u8; 12] = h("e0e00f19fed7ba0136a797f3").try_into().unwrap();
        assert_eq!(
            s.sign(&nonce, &h("7a43ec1d9c0a5a78a0b16533a6213cab"))
                .to_vec(),
            h("209fcc8d3675ed938e9c7166709dd946")
        );
    }

    #[test]
    fn aes_signers_reject_wrong_key_length() {
        for alg in [SigningAlgorithm::AesCmac, SigningAlgorithm::AesGmac] {
            match new_signer(alg, &[0u8; 15]) {
                Err(CryptoError::BadKeyLength {
                    expected: 16,
                    got: 15,
                }) => {}
                Err(e) => panic!("unexpected error {e}"),
                Ok(_) => panic!("15-byte key accepted"),
            }
        }
    }
}
