//! The crypto provider: which implementation of each algorithm the server uses.

use std::fmt;
use std::sync::{Arc, OnceLock};

use sha2::{Digest, Sha512};

use crate::aead::{new_aead, Aead, AeadBackend, CipherAlgorithm};
use crate::cpu::{gcm_library, CpuFeatures};
use crate::kdf::smb_kdf;
use crate::library::Library;
use crate::ntlm::{NtlmPrimitives, RustCryptoNtlm};
use crate::signing::{hmac_sha256, new_signer, Signer, SigningAlgorithm};
use crate::CryptoError;

/// A set of algorithm implementations plus a random source.
///
/// Like rustls' provider, this is a plain value: the server holds one
/// `Arc<CryptoProvider>` and asks it for keyed objects. Each primitive names
/// the library that implements it, chosen by measurement (`nimbus bench
/// crypto`, BENCHMARKS.md).
pub struct CryptoProvider {
    name: &'static str,
    fips: bool,
    /// `None` in a FIPS provider: NTLM needs MD4, MD5 and RC4.
    ntlm: Option<&'static dyn NtlmPrimitives>,
    gcm: Library,
    /// Why `gcm` is what it is: the default provider's pick for this CPU.
    gcm_why: &'static str,
    /// `None` where no approved CCM with SMB's 11-byte nonce exists (FIPS:
    /// aws-lc-rs offers no such CCM).
    ccm: Option<Library>,
    gmac: Library,
    cmac: Library,
    /// HMAC-SHA256 signing and the SP800-108 KDF.
    hmac: Library,
    sha512: Library,
}

static DEFAULT: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
static RING: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
static RUSTCRYPTO: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
static AWSLC: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
#[cfg(feature = "fips")]
static FIPS: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
static RUSTCRYPTO_NTLM: RustCryptoNtlm = RustCryptoNtlm;
/// The `gcm_why` of a provider whose libraries are fixed.
const FIXED: &str = "fixed by this provider";

impl CryptoProvider {
    /// The default provider: the fastest implementation of each primitive
    /// (BENCHMARKS.md), AES-GCM's picked for the CPU this runs on
    /// (`cpu::gcm_library`). One shared instance.
    pub fn default_provider() -> Arc<CryptoProvider> {
        DEFAULT
            .get_or_init(|| {
                let gcm = gcm_library(&CpuFeatures::detect());
                Arc::new(Self::fastest_with_gcm("default", gcm.library, gcm.why))
            })
            .clone()
    }

    /// The default's libraries with ring's AES-GCM whatever the CPU, so
    /// that `nimbus bench crypto` shows ring's GCM beside AWS-LC's.
    pub fn ring_provider() -> Arc<CryptoProvider> {
        RING.get_or_init(|| Arc::new(Self::fastest_with_gcm("ring", Library::Ring, FIXED)))
            .clone()
    }

    /// The default's libraries for every primitive but AES-GCM, which
    /// comes from `gcm`.
    fn fastest_with_gcm(name: &'static str, gcm: Library, gcm_why: &'static str) -> CryptoProvider {
        CryptoProvider {
            name,
            fips: false,
            ntlm: Some(&RUSTCRYPTO_NTLM),
            gcm,
            gcm_why,
            ccm: Some(Library::RustCrypto),
            gmac: Library::AwsLc,
            cmac: Library::AwsLc,
            hmac: Library::AwsLc,
            sha512: Library::AwsLc,
        }
    }

    /// Pure RustCrypto, for comparison in `nimbus bench crypto` and for
    /// cross-checking the other providers in tests.
    pub fn rustcrypto_provider() -> Arc<CryptoProvider> {
        RUSTCRYPTO
            .get_or_init(|| {
                Arc::new(CryptoProvider {
                    name: "rustcrypto",
                    fips: false,
                    ntlm: Some(&RUSTCRYPTO_NTLM),
                    gcm: Library::RustCrypto,
                    gcm_why: FIXED,
                    ccm: Some(Library::RustCrypto),
                    gmac: Library::RustCrypto,
                    cmac: Library::RustCrypto,
                    hmac: Library::RustCrypto,
                    sha512: Library::RustCrypto,
                })
            })
            .clone()
    }

    /// AWS-LC for everything it offers (CCM from RustCrypto), for comparison.
    pub fn awslc_provider() -> Arc<CryptoProvider> {
        AWSLC
            .get_or_init(|| Arc::new(Self::fastest_with_gcm("aws-lc", Library::AwsLc, FIXED)))
            .clone()
    }

    /// The FIPS provider: only AWS-LC's validated module; no CCM (not offered
    /// with SMB's nonce size by the module's API) and no NTLM primitives.
    #[cfg(feature = "fips")]
    pub fn fips_provider() -> Arc<CryptoProvider> {
        FIPS.get_or_init(|| {
            Arc::new(CryptoProvider {
                name: "fips",
                fips: true,
                ntlm: None,
                gcm: Library::AwsLc,
                gcm_why: "FIPS: AWS-LC's FIPS module only",
                ccm: None,
                gmac: Library::AwsLc,
                cmac: Library::AwsLc,
                hmac: Library::AwsLc,
                sha512: Library::AwsLc,
            })
        })
        .clone()
    }

    /// The FIPS provider if this binary was built with it (cargo feature
    /// `fips`), else `None`.
    pub fn fips_if_built() -> Option<Arc<CryptoProvider>> {
        #[cfg(feature = "fips")]
        return Some(Self::fips_provider());
        #[cfg(not(feature = "fips"))]
        None
    }

    /// Every provider built into this binary (for benchmarks and tests),
    /// the default first.
    pub fn all() -> Vec<Arc<CryptoProvider>> {
        let mut v = vec![
            Self::default_provider(),
            Self::ring_provider(),
            Self::awslc_provider(),
            Self::rustcrypto_provider(),
        ];
        v.extend(Self::fips_if_built());
        v
    }

    /// Which library implements each primitive, for `nimbus bench crypto`.
    pub fn libraries(&self) -> Vec<(&'static str, Option<Library>)> {
        vec![
            ("AES-GCM", Some(self.gcm)),
            ("AES-CCM", self.ccm),
            ("AES-GMAC", Some(self.gmac)),
            ("AES-CMAC", Some(self.cmac)),
            ("HMAC-SHA256", Some(self.hmac)),
            ("SHA-512", Some(self.sha512)),
        ]
    }

    /// The library behind one of `libraries()`'s primitive names.
    pub fn library_of(&self, primitive: &str) -> Option<Library> {
        self.libraries()
            .into_iter()
            .find(|(name, _)| *name == primitive)
            .and_then(|(_, lib)| lib)
    }

    /// Why this provider's AES-GCM comes from its library.
    pub fn gcm_why(&self) -> &'static str {
        self.gcm_why
    }

    /// One line for the start-up log: each library and what it does here.
    pub fn summary(&self) -> String {
        let mut by_library: Vec<(Library, Vec<&str>)> = Vec::new();
        for (what, lib) in self.libraries() {
            let Some(lib) = lib else { continue };
            match by_library.iter_mut().find(|(l, _)| *l == lib) {
                Some((_, names)) => names.push(what),
                None => by_library.push((lib, vec![what])),
            }
        }
        let parts: Vec<String> = by_library
            .iter()
            .map(|(lib, names)| format!("{} from {}", names.join(", "), lib.name()))
            .collect();
        format!(
            "crypto provider \"{}\": {}; AES-GCM: {}",
            self.name,
            parts.join("; "),
            self.gcm_why
        )
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
        let lib = match alg {
            SigningAlgorithm::HmacSha256 => self.hmac,
            SigningAlgorithm::AesCmac => self.cmac,
            SigningAlgorithm::AesGmac => self.gmac,
        };
        match lib {
            Library::AwsLc => crate::awslc::signer(alg, key),
            // ring has no CMAC; its GMAC (GCM with AAD only) is slower than
            // either other library's, so it is never chosen for signing.
            Library::Ring | Library::RustCrypto => new_signer(alg, key),
        }
    }

    /// An encryption cipher for `alg` keyed with `key` (16 bytes for the
    /// AES-128 ciphers, 32 for AES-256).
    pub fn cipher(&self, alg: CipherAlgorithm, key: &[u8]) -> Result<Box<dyn Aead>, CryptoError> {
        let lib = if alg.is_gcm() {
            self.gcm
        } else {
            self.ccm.ok_or(CryptoError::NotApproved(alg.name()))?
        };
        match lib {
            Library::AwsLc => crate::awslc::gcm(alg, key),
            Library::Ring => new_aead(AeadBackend::Ring, alg, key),
            Library::RustCrypto => new_aead(AeadBackend::RustCrypto, alg, key),
        }
    }

    /// Whether this provider can encrypt with `alg`.
    pub fn offers_cipher(&self, alg: CipherAlgorithm) -> bool {
        alg.is_gcm() || self.ccm.is_some()
    }

    /// NIST SP800-108 KDF in counter mode, PRF HMAC-SHA256, r=32,
    /// L = `out.len()*8`, as MS-SMB2 3.1.4.2 uses it:
    /// `out = HMAC(key, i(4B BE) || label || 0x00 || context || L(4B BE))` for
    /// i=1.. truncated.
    ///
    /// `label` and `context` are passed exactly: the caller includes any
    /// trailing NUL in the label bytes, e.g. `b"SMBSigningKey\0"`.
    pub fn kdf(&self, key: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
        let prf = match self.hmac {
            Library::AwsLc => crate::awslc::hmac_sha256,
            Library::Ring | Library::RustCrypto => hmac_sha256,
        };
        smb_kdf(prf, key, label, context, out);
    }

    /// SHA-512 of the concatenation of `parts` (SMB 3.1.1 preauth integrity,
    /// MS-SMB2 3.3.5.4).
    pub fn sha512(&self, parts: &[&[u8]]) -> [u8; 64] {
        if self.sha512 == Library::AwsLc {
            return crate::awslc::sha512(parts);
        }
        let mut h = Sha512::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().into()
    }

    /// HMAC-SHA256 of the concatenation of `parts`.
    pub fn hmac_sha256(&self, key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
        match self.hmac {
            Library::AwsLc => crate::awslc::hmac_sha256(key, parts),
            Library::Ring | Library::RustCrypto => hmac_sha256(key, parts),
        }
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
            .field("libraries", &self.libraries())
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

    #[test]
    fn default_takes_the_gcm_library_picked_for_this_cpu() {
        let p = CryptoProvider::default_provider();
        let pick = gcm_library(&CpuFeatures::detect());
        assert_eq!(p.library_of("AES-GCM"), Some(pick.library));
        assert_eq!(p.gcm_why(), pick.why);
        let line = p.summary();
        assert!(line.contains(pick.why), "{line}");
        assert!(line.contains("AES-CCM from rustcrypto"), "{line}");
        // Both GCM libraries are among the providers the vectors and the
        // agreement test run through, whichever the default took.
        let gcms: Vec<_> = CryptoProvider::all()
            .iter()
            .filter_map(|p| p.library_of("AES-GCM"))
            .collect();
        for lib in [Library::Ring, Library::AwsLc, Library::RustCrypto] {
            assert!(gcms.contains(&lib), "{lib:?} missing from {gcms:?}");
        }
    }

    /// Every provider gives the same answers for every keyed primitive.
    #[test]
    fn providers_agree() {
        let msg: Vec<u8> = (0..3000u32).map(|i| (i * 31) as u8).collect();
        let reference = CryptoProvider::rustcrypto_provider();
        for p in CryptoProvider::all() {
            for alg in [
                SigningAlgorithm::HmacSha256,
                SigningAlgorithm::AesCmac,
                SigningAlgorithm::AesGmac,
            ] {
                let a = p.signer(alg, &[5; 16]).unwrap().sign(&[1; 12], &msg);
                let b = reference
                    .signer(alg, &[5; 16])
                    .unwrap()
                    .sign(&[1; 12], &msg);
                assert_eq!(a, b, "{} {alg:?}", p.name());
            }
            for alg in CipherAlgorithm::ALL {
                if !p.offers_cipher(alg) {
                    assert!(p.cipher(alg, &vec![0; alg.key_len()]).is_err());
                    continue;
                }
                let key = vec![3; alg.key_len()];
                let nonce = vec![4; alg.nonce_len()];
                let (mut a, mut b) = (msg.clone(), msg.clone());
                let ta = p
                    .cipher(alg, &key)
                    .unwrap()
                    .seal_in_place(&nonce, b"x", &mut a)
                    .unwrap();
                let tb = reference
                    .cipher(alg, &key)
                    .unwrap()
                    .seal_in_place(&nonce, b"x", &mut b)
                    .unwrap();
                assert_eq!((a.clone(), ta), (b, tb), "{} {alg:?}", p.name());
                p.cipher(alg, &key)
                    .unwrap()
                    .open_in_place(&nonce, b"x", &mut a, &ta)
                    .unwrap();
                assert_eq!(a, msg);
            }
            let mut k1 = [0u8; 32];
            let mut k2 = [0u8; 32];
            p.kdf(&[9; 16], b"SMBC2SCipherKey\0", &[7; 64], &mut k1);
            reference.kdf(&[9; 16], b"SMBC2SCipherKey\0", &[7; 64], &mut k2);
            assert_eq!(k1, k2, "{}", p.name());
            assert_eq!(
                p.sha512(&[b"ab", b"c"]),
                reference.sha512(&[b"abc"]),
                "{}",
                p.name()
            );
        }
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
