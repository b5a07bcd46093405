//! The crypto provider: which implementation of each algorithm the server uses.

use std::fmt;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha512};

use crate::aead::{new_aead, Aead, AeadBackend, CipherAlgorithm};
use crate::kdf::smb_kdf;
use crate::ntlm::{NtlmPrimitives, RustCryptoNtlm};
use crate::signing::{hmac_sha256, new_signer, Signer, SigningAlgorithm};
use crate::CryptoError;

/// A set of algorithm implementations plus a random source.
///
/// Like rustls' provider, this is a plain value: the server holds one
/// `Arc<CryptoProvider>` and asks it for keyed objects.
pub struct CryptoProvider {
    name: &'static str,
    fips: bool,
    /// `None` in a FIPS provider: NTLM needs MD4, MD5 and RC4.
    ntlm: Option<&'static dyn NtlmPrimitives>,
    /// Library behind the GCM ciphers (CCM is RustCrypto's in every
    /// non-FIPS provider: nothing faster is on offer).
    gcm: AeadBackend,
}

static DEFAULT: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
static RUSTCRYPTO: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
static RUSTCRYPTO_NTLM: RustCryptoNtlm = RustCryptoNtlm;

impl CryptoProvider {
    /// The default provider: the fastest implementation of each primitive
    /// measured on x86_64 (BENCHMARKS.md): ring for AES-GCM, RustCrypto for
    /// the rest. One shared instance.
    pub fn default_provider() -> Arc<CryptoProvider> {
        DEFAULT
            .get_or_init(|| {
                Arc::new(CryptoProvider {
                    name: "default",
                    fips: false,
                    ntlm: Some(&RUSTCRYPTO_NTLM),
                    gcm: AeadBackend::Ring,
                })
            })
            .clone()
    }

    /// Pure RustCrypto, for comparison in `nimbus bench crypto` and for
    /// cross-checking the default provider's output in tests.
    pub fn rustcrypto_provider() -> Arc<CryptoProvider> {
        RUSTCRYPTO
            .get_or_init(|| {
                Arc::new(CryptoProvider {
                    name: "rustcrypto",
                    fips: false,
                    ntlm: Some(&RUSTCRYPTO_NTLM),
                    gcm: AeadBackend::RustCrypto,
                })
            })
            .clone()
    }

    /// Every provider built into this binary (for benchmarks and tests).
    pub fn all() -> Vec<Arc<CryptoProvider>> {
        vec![Self::default_provider(), Self::rustcrypto_provider()]
    }

    /// Short name for logs and `nimbus bench crypto`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether only FIPS-approved algorithms are offered.
    pub fn fips(&self) -> bool {
        self.fips
    }

    /// A signer for `alg` keyed with `key`.
    ///
    /// `key` must be 16 bytes for AES-CMAC and AES-GMAC (SMB2 signing keys are
    /// 128-bit); HMAC-SHA256 accepts any length (the 2.x signing key is the
    /// session key, 16 bytes from NTLM but possibly longer from Kerberos).
    pub fn signer(
        &self,
        alg: SigningAlgorithm,
        key: &[u8],
    ) -> Result<Box<dyn Signer>, CryptoError> {
        new_signer(alg, key)
    }

    /// An encryption cipher for `alg` keyed with `key` (16 bytes for the
    /// AES-128 ciphers, 32 for AES-256).
    pub fn cipher(&self, alg: CipherAlgorithm, key: &[u8]) -> Result<Box<dyn Aead>, CryptoError> {
        let backend = if alg.is_gcm() {
            self.gcm
        } else {
            AeadBackend::RustCrypto
        };
        new_aead(backend, alg, key)
    }

    /// NIST SP800-108 KDF in counter mode, PRF HMAC-SHA256, r=32,
    /// L = `out.len()*8`, as MS-SMB2 3.1.4.2 uses it:
    /// `out = HMAC(key, i(4B BE) || label || 0x00 || context || L(4B BE))` for
    /// i=1.. truncated.
    ///
    /// `label` and `context` are passed exactly: the caller includes any
    /// trailing NUL in the label bytes, e.g. `b"SMBSigningKey\0"`.
    pub fn kdf(&self, key: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
        smb_kdf(key, label, context, out);
    }

    /// SHA-512 of the concatenation of `parts` (SMB 3.1.1 preauth integrity,
    /// MS-SMB2 3.3.5.4).
    pub fn sha512(&self, parts: &[&[u8]]) -> [u8; 64] {
        let mut h = Sha512::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().into()
    }

    /// HMAC-SHA256 of the concatenation of `parts`.
    pub fn hmac_sha256(&self, key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        hmac_sha256(key, parts)
    }

    /// Fills `buf` from the operating system's CSPRNG.
    ///
    /// # Panics
    /// If the OS random source fails. Continuing with predictable challenges
    /// or nonces would be worse than stopping, and on Linux `getrandom(2)`
    /// only fails when the kernel lacks it.
    pub fn fill_random(&self, buf: &mut [u8]) {
        if let Err(e) = getrandom::getrandom(buf) {
            panic!("operating system random source failed: {e}");
        }
    }

    /// The legacy primitives NTLM needs, or `None` if this provider does not
    /// offer them (FIPS).
    pub fn ntlm(&self) -> Option<&dyn NtlmPrimitives> {
        self.ntlm
    }
}

impl fmt::Debug for CryptoProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptoProvider")
            .field("name", &self.name)
            .field("fips", &self.fips)
            .field("ntlm", &self.ntlm.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    #[test]
    fn default_provider_offers_everything() {
        let p = CryptoProvider::default_provider();
        assert_eq!(p.name(), "default");
        assert!(!p.fips());
        assert!(p.ntlm().is_some());
        assert!(Arc::ptr_eq(&p, &CryptoProvider::default_provider()));
    }

    /// FIPS 180-2 appendix C.1 ("abc").
    #[test]
    fn sha512_abc() {
        let p = CryptoProvider::default_provider();
        assert_eq!(
            p.sha512(&[b"a", b"bc"]).to_vec(),
            h(
                "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
               2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"
            )
        );
    }

    #[test]
    fn kdf_through_provider() {
        let p = CryptoProvider::default_provider();
        let mut out = [0u8; 16];
        p.kdf(
            &h("B4546771B515F766A86735532DD6C4F0"),
            b"SMB2AESCMAC\0",
            b"SmbSign\0",
            &mut out,
        );
        assert_eq!(out.to_vec(), h("F773CD23C18FD1E08EE510CADA7CF852"));
    }

    #[test]
    fn random_is_not_constant() {
        let p = CryptoProvider::default_provider();
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        p.fill_random(&mut a);
        p.fill_random(&mut b);
        assert_ne!(a, b);
    }
}
