//! SMB 3.x message encryption ciphers (MS-SMB2 3.1.4.3): AES-CCM and
//! AES-GCM with 128- and 256-bit keys, in place, with a detached 16-byte tag.

use aes::{Aes128, Aes256};
use aes_gcm::aead::generic_array::GenericArray;
use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes128Gcm, Aes256Gcm, KeyInit};
use ccm::consts::{U11, U16};
use ccm::Ccm;

use crate::wipe::Wiped;
use crate::CryptoError;

/// Length of the authentication tag (the TRANSFORM header's Signature).
pub const TAG_LEN: usize = 16;

/// Cipher identifiers of the SMB2_ENCRYPTION_CAPABILITIES negotiate context
/// (MS-SMB2 2.2.3.1.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CipherAlgorithm {
    /// AES-128-CCM: the only cipher of dialects 3.0 and 3.0.2 (id 1).
    Aes128Ccm,
    /// AES-128-GCM (id 2).
    Aes128Gcm,
    /// AES-256-CCM (id 3).
    Aes256Ccm,
    /// AES-256-GCM (id 4).
    Aes256Gcm,
}

impl CipherAlgorithm {
    /// Every cipher, in the server's default order of preference: GCM before
    /// CCM because CCM is serial (CBC-MAC) and several times slower.
    pub const ALL: [CipherAlgorithm; 4] = [
        CipherAlgorithm::Aes128Gcm,
        CipherAlgorithm::Aes256Gcm,
        CipherAlgorithm::Aes128Ccm,
        CipherAlgorithm::Aes256Ccm,
    ];

    /// The wire identifier.
    pub fn id(self) -> u16 {
        match self {
            CipherAlgorithm::Aes128Ccm => 1,
            CipherAlgorithm::Aes128Gcm => 2,
            CipherAlgorithm::Aes256Ccm => 3,
            CipherAlgorithm::Aes256Gcm => 4,
        }
    }

    /// Maps a wire identifier back; unknown ids give `None`.
    pub fn from_id(id: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.id() == id)
    }

    /// The name used in configuration files and logs, e.g. "AES-128-GCM".
    pub fn name(self) -> &'static str {
        match self {
            CipherAlgorithm::Aes128Ccm => "AES-128-CCM",
            CipherAlgorithm::Aes128Gcm => "AES-128-GCM",
            CipherAlgorithm::Aes256Ccm => "AES-256-CCM",
            CipherAlgorithm::Aes256Gcm => "AES-256-GCM",
        }
    }

    /// Parses a configuration name (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(name))
    }

    /// Key size in bytes.
    pub fn key_len(self) -> usize {
        match self {
            CipherAlgorithm::Aes128Ccm | CipherAlgorithm::Aes128Gcm => 16,
            CipherAlgorithm::Aes256Ccm | CipherAlgorithm::Aes256Gcm => 32,
        }
    }

    /// Nonce size in bytes: CCM uses the first 11 bytes of the TRANSFORM
    /// header's 16-byte Nonce field, GCM the first 12.
    pub fn nonce_len(self) -> usize {
        match self {
            CipherAlgorithm::Aes128Ccm | CipherAlgorithm::Aes256Ccm => 11,
            CipherAlgorithm::Aes128Gcm | CipherAlgorithm::Aes256Gcm => 12,
        }
    }

    /// Whether this is a GCM cipher.
    pub fn is_gcm(self) -> bool {
        matches!(
            self,
            CipherAlgorithm::Aes128Gcm | CipherAlgorithm::Aes256Gcm
        )
    }
}

/// Encrypts and decrypts messages with one key. Built once per session and
/// direction; wipes its key schedule on drop.
pub trait Aead: Send + Sync {
    /// The algorithm this object implements.
    fn algorithm(&self) -> CipherAlgorithm;

    /// Encrypts `data` in place and returns the tag. `nonce` must be exactly
    /// [`CipherAlgorithm::nonce_len`] bytes and never reused with this key.
    fn seal_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<[u8; TAG_LEN], CryptoError>;

    /// Decrypts `data` in place if `tag` authenticates it; on failure the
    /// content of `data` is unspecified and must be discarded.
    fn open_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptoError>;
}

/// Which library implements the ciphers of a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AeadBackend {
    Ring,
    RustCrypto,
}

pub(crate) fn new_aead(
    backend: AeadBackend,
    alg: CipherAlgorithm,
    key: &[u8],
) -> Result<Box<dyn Aead>, CryptoError> {
    if key.len() != alg.key_len() {
        return Err(CryptoError::BadKeyLength {
            expected: alg.key_len(),
            got: key.len(),
        });
    }
    let bad_key = || CryptoError::BadKeyLength {
        expected: alg.key_len(),
        got: key.len(),
    };
    Ok(match (backend, alg) {
        (AeadBackend::Ring, CipherAlgorithm::Aes128Gcm | CipherAlgorithm::Aes256Gcm) => {
            let ring_alg = if alg == CipherAlgorithm::Aes128Gcm {
                &ring::aead::AES_128_GCM
            } else {
                &ring::aead::AES_256_GCM
            };
            let unbound = ring::aead::UnboundKey::new(ring_alg, key).map_err(|_| bad_key())?;
            Box::new(RingGcm {
                alg,
                key: Wiped::new(ring::aead::LessSafeKey::new(unbound)),
            })
        }
        (_, CipherAlgorithm::Aes128Gcm) => Box::new(RustCryptoAead {
            alg,
            cipher: Aes128Gcm::new_from_slice(key).map_err(|_| bad_key())?,
        }),
        (_, CipherAlgorithm::Aes256Gcm) => Box::new(RustCryptoAead {
            alg,
            cipher: Aes256Gcm::new_from_slice(key).map_err(|_| bad_key())?,
        }),
        // No library we build offers CCM faster than RustCrypto's (AES-NI
        // block cipher, serial CBC-MAC); ring has no CCM at all.
        (_, CipherAlgorithm::Aes128Ccm) => Box::new(RustCryptoAead {
            alg,
            cipher: Ccm::<Aes128, U16, U11>::new_from_slice(key).map_err(|_| bad_key())?,
        }),
        (_, CipherAlgorithm::Aes256Ccm) => Box::new(RustCryptoAead {
            alg,
            cipher: Ccm::<Aes256, U16, U11>::new_from_slice(key).map_err(|_| bad_key())?,
        }),
    })
}

fn check_nonce(alg: CipherAlgorithm, nonce: &[u8]) -> Result<(), CryptoError> {
    if nonce.len() == alg.nonce_len() {
        Ok(())
    } else {
        Err(CryptoError::BadNonceLength {
            expected: alg.nonce_len(),
            got: nonce.len(),
        })
    }
}

/// ring's AES-GCM (AES-NI + PCLMULQDQ/VAES assembly from BoringSSL).
struct RingGcm {
    alg: CipherAlgorithm,
    key: Wiped<ring::aead::LessSafeKey>,
}

impl Aead for RingGcm {
    fn algorithm(&self) -> CipherAlgorithm {
        self.alg
    }

    fn seal_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<[u8; TAG_LEN], CryptoError> {
        check_nonce(self.alg, nonce)?;
        let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| CryptoError::TooLong)?;
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, ring::aead::Aad::from(aad), data)
            .map_err(|_| CryptoError::TooLong)?;
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    fn open_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptoError> {
        check_nonce(self.alg, nonce)?;
        let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| CryptoError::Authentication)?;
        self.key
            .open_in_place_separate_tag(
                nonce,
                ring::aead::Aad::from(aad),
                ring::aead::Tag::from(*tag),
                data,
                0..,
            )
            .map(|_| ())
            .map_err(|_| CryptoError::Authentication)
    }
}

/// Any RustCrypto AEAD with a 16-byte tag (AES-GCM, AES-CCM). The `aes`
/// crate's `zeroize` feature wipes the key schedule on drop.
struct RustCryptoAead<C> {
    alg: CipherAlgorithm,
    cipher: C,
}

impl<C> Aead for RustCryptoAead<C>
where
    C: AeadInPlace<TagSize = U16> + Send + Sync,
{
    fn algorithm(&self) -> CipherAlgorithm {
        self.alg
    }

    fn seal_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<[u8; TAG_LEN], CryptoError> {
        check_nonce(self.alg, nonce)?;
        let tag = self
            .cipher
            .encrypt_in_place_detached(GenericArray::from_slice(nonce), aad, data)
            .map_err(|_| CryptoError::TooLong)?;
        Ok(tag.into())
    }

    fn open_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<(), CryptoError> {
        check_nonce(self.alg, nonce)?;
        self.cipher
            .decrypt_in_place_detached(
                GenericArray::from_slice(nonce),
                aad,
                data,
                GenericArray::from_slice(tag),
            )
            .map_err(|_| CryptoError::Authentication)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s.replace([' ', '\n'], "")).unwrap()
    }

    const BACKENDS: [AeadBackend; 2] = [AeadBackend::Ring, AeadBackend::RustCrypto];

    #[test]
    fn ids_names_and_sizes() {
        for c in CipherAlgorithm::ALL {
            assert_eq!(CipherAlgorithm::from_id(c.id()), Some(c));
            assert_eq!(CipherAlgorithm::from_name(c.name()), Some(c));
            assert_eq!(
                CipherAlgorithm::from_name(&c.name().to_lowercase()),
                Some(c)
            );
        }
        assert_eq!(CipherAlgorithm::from_id(0), None);
        assert_eq!(CipherAlgorithm::from_id(5), None);
        assert_eq!(CipherAlgorithm::Aes256Ccm.key_len(), 32);
        assert_eq!(CipherAlgorithm::Aes128Ccm.nonce_len(), 11);
        assert_eq!(CipherAlgorithm::Aes256Gcm.nonce_len(), 12);
    }

    /// NIST GCM test vector (McGrew & Viega, "The Galois/Counter Mode of
    /// Operation", test case 4: AES-128, 60-byte plaintext, 20-byte AAD).
    #[test]
    fn aes128_gcm_known_answer() {
        let key = h("feffe9928665731c6d6a8f9467308308");
        let nonce = h("cafebabefacedbaddecaf888");
        let aad = h("feedfacedeadbeeffeedfacedeadbeefabaddad2");
        let pt = h(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                    1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
        );
        let ct = h(
            "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e\
                    21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091",
        );
        let tag = h("5bc94fbc3221a5db94fae95ae7121a47");
        for b in BACKENDS {
            let aead = new_aead(b, CipherAlgorithm::Aes128Gcm, &key).unwrap();
            let mut data = pt.clone();
            let t = aead.seal_in_place(&nonce, &aad, &mut data).unwrap();
            assert_eq!(data, ct, "{b:?}");
            assert_eq!(t.to_vec(), tag, "{b:?}");
            aead.open_in_place(&nonce, &aad, &mut data, &t).unwrap();
            assert_eq!(data, pt, "{b:?}");
        }
    }

    /// Same paper, test case 16: AES-256.
    #[test]
    fn aes256_gcm_known_answer() {
        let key = h("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308");
        let nonce = h("cafebabefacedbaddecaf888");
        let aad = h("feedfacedeadbeeffeedfacedeadbeefabaddad2");
        let pt = h(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72\
                    1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39",
        );
        let ct = h(
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa\
                    8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662",
        );
        let tag = h("76fc6ece0f4e1768cddf8853bb2d551b");
        for b in BACKENDS {
            let aead = new_aead(b, CipherAlgorithm::Aes256Gcm, &key).unwrap();
            let mut data = pt.clone();
            let t = aead.seal_in_place(&nonce, &aad, &mut data).unwrap();
            assert_eq!(data, ct, "{b:?}");
            assert_eq!(t.to_vec(), tag, "{b:?}");
        }
    }

    #[test]
    fn tampering_is_detected_everywhere() {
        for b in BACKENDS {
            for alg in CipherAlgorithm::ALL {
                let key = vec![0x42; alg.key_len()];
                let nonce = vec![7; alg.nonce_len()];
                let aead = new_aead(b, alg, &key).unwrap();
                let pt = b"SMB2 message body of some length".to_vec();
                let mut data = pt.clone();
                let tag = aead.seal_in_place(&nonce, b"aad", &mut data).unwrap();
                assert_ne!(data, pt);
                let mut bad = data.clone();
                bad[3] ^= 1;
                assert!(aead.open_in_place(&nonce, b"aad", &mut bad, &tag).is_err());
                let mut bad = data.clone();
                assert!(aead.open_in_place(&nonce, b"aaD", &mut bad, &tag).is_err());
                let mut bad_tag = tag;
                bad_tag[15] ^= 0x80;
                let mut bad = data.clone();
                assert!(aead
                    .open_in_place(&nonce, b"aad", &mut bad, &bad_tag)
                    .is_err());
                aead.open_in_place(&nonce, b"aad", &mut data, &tag).unwrap();
                assert_eq!(data, pt, "{b:?} {alg:?}");
                assert!(aead.seal_in_place(&[0; 16], b"", &mut []).is_err());
            }
        }
    }

    #[test]
    fn wrong_key_length_is_refused() {
        for b in BACKENDS {
            for alg in CipherAlgorithm::ALL {
                assert!(new_aead(b, alg, &[0; 24]).is_err());
            }
        }
    }

    /// Both backends agree on every cipher (CCM has one implementation, so
    /// this chiefly cross-checks ring against RustCrypto for GCM).
    #[test]
    fn backends_agree() {
        for alg in CipherAlgorithm::ALL {
            let key: Vec<u8> = (0..alg.key_len() as u8).collect();
            let nonce = vec![9; alg.nonce_len()];
            let mut outs = Vec::new();
            for b in BACKENDS {
                let mut data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
                let tag = new_aead(b, alg, &key)
                    .unwrap()
                    .seal_in_place(&nonce, &[1, 2, 3], &mut data)
                    .unwrap();
                outs.push((data, tag));
            }
            assert_eq!(outs[0], outs[1], "{alg:?}");
        }
    }
}
