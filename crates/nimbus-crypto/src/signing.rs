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
        hex::decode(s.replace([' ', '\n'], "")).unwrap()
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

    /// The signers a vector must pass through: the RustCrypto one built
    /// here, and every provider's (default, rustcrypto, aws-lc, and fips
    /// when built with `--features fips`).
    fn signers(alg: SigningAlgorithm, key: &[u8]) -> Vec<(String, Box<dyn Signer>)> {
        let mut v = vec![("new_signer".to_string(), new_signer(alg, key).unwrap())];
        for p in crate::CryptoProvider::all() {
            v.push((p.name().to_string(), p.signer(alg, key).unwrap()));
        }
        assert!(v.len() >= 4, "default, rustcrypto and aws-lc providers");
        for (who, s) in &v {
            assert_eq!(s.algorithm(), alg, "{who}");
        }
        v
    }

    /// RFC 4231 section 4, test cases 1, 2, 3, 6 and 7 (6 and 7 with a
    /// 131-byte key, hashed first). The signer returns the first 16 bytes.
    const RFC4231: &[(&str, &str, &str)] = &[
        (
            "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b",
            "4869205468657265", // "Hi There"
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        ),
        (
            "4a656665", // "Jefe"
            "7768617420646f2079612077616e7420666f72206e6f7468696e673f",
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        ),
        (
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "dddddddddddddddddddddddddddddddddddddddddddddddddd\
             dddddddddddddddddddddddddddddddddddddddddddddddddd",
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        ),
        (
            "AA*131",
            // "Test Using Larger Than Block-Size Key - Hash Key First"
            "54657374205573696e67204c6172676572205468616e20426c6f636b2d53697a\
             65204b6579202d2048617368204b6579204669727374",
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
        ),
        (
            "AA*131",
            // "This is a test using a larger than block-size key and a larger
            // than block-size data. The key needs to be hashed before being
            // used by the HMAC algorithm."
            "5468697320697320612074657374207573696e672061206c6172676572207468\
             616e20626c6f636b2d73697a65206b657920616e642061206c61726765722074\
             68616e20626c6f636b2d73697a6520646174612e20546865206b6579206e6565\
             647320746f20626520686173686564206265666f7265206265696e6720757365\
             642062792074686520484d414320616c676f726974686d2e",
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
        ),
    ];

    fn rfc4231_key(k: &str) -> Vec<u8> {
        if k == "AA*131" {
            vec![0xaa; 131]
        } else {
            h(k)
        }
    }

    #[test]
    fn hmac_sha256_rfc4231_on_every_provider() {
        for &(key, data, mac) in RFC4231 {
            let (key, data, mac) = (rfc4231_key(key), h(data), h(mac));
            assert_eq!(hmac_sha256(&key, &[&data]).to_vec(), mac);
            // Split input, as the KDF and NTLM callers pass it.
            let (a, b) = data.split_at(data.len() / 2);
            for p in crate::CryptoProvider::all() {
                assert_eq!(p.hmac_sha256(&key, &[a, b]).to_vec(), mac, "{}", p.name());
            }
            for (who, s) in signers(SigningAlgorithm::HmacSha256, &key) {
                assert_eq!(s.sign(&[0; 12], &data).to_vec(), mac[..16], "{who}");
            }
        }
    }

    /// RFC 4493 section 4, examples 1-4.
    #[test]
    fn aes_cmac_rfc4493_on_every_provider() {
        let key = h("2b7e151628aed2a6abf7158809cf4f3c");
        let msg = h(
            "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51\
                     30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710",
        );
        let cases = [
            (0, "bb1d6929e95937287fa37d129b756746"),
            (16, "070a16b46b4d4144f79bdd9dd04a287c"),
            (40, "dfa66747de9ae63030ca32611497c827"),
            (64, "51f0bebf7e3b9d92fc49741779363cfe"),
        ];
        for (who, s) in signers(SigningAlgorithm::AesCmac, &key) {
            for (len, tag) in cases {
                assert_eq!(
                    s.sign(&[0; 12], &msg[..len]).to_vec(),
                    h(tag),
                    "{who} len {len}"
                );
            }
        }
    }

    /// NIST CAVP gcmEncryptExtIV128.rsp, [Keylen=128][IVlen=96][PTlen=0]:
    /// AADlen=0 Count 0 and AADlen=128 Count 0 (GMAC = GCM with AAD only).
    #[test]
    fn aes_gmac_nist_gcm_aad_only_on_every_provider() {
        let cases = [
            (
                "11754cd72aec309bf52f7687212e8957",
                "3c819d9a9bed087615030b65",
                "",
                "250327c674aaf477aef2675748cf6971",
            ),
            (
                "77be63708971c4e240d1cb79e8d77feb",
                "e0e00f19fed7ba0136a797f3",
                "7a43ec1d9c0a5a78a0b16533a6213cab",
                "209fcc8d3675ed938e9c7166709dd946",
            ),
        ];
        for (key, nonce, aad, tag) in cases {
            let nonce: [u8; 12] = h(nonce).try_into().unwrap();
            for (who, s) in signers(SigningAlgorithm::AesGmac, &h(key)) {
                assert_eq!(s.sign(&nonce, &h(aad)).to_vec(), h(tag), "{who}");
            }
        }
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
