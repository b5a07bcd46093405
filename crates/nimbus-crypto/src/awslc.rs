//! AWS-LC (through aws-lc-rs) implementations of the SMB primitives.
//!
//! Key material lives in AWS-LC's own allocations (EVP_AEAD_CTX, CMAC_CTX,
//! HMAC_CTX), which AWS-LC cleanses when freed (OPENSSL_free and the
//! *_cleanup functions wipe before releasing), so these wrappers need no
//! wiping of their own.

use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, AES_256_GCM};
use aws_lc_rs::{cmac, digest, hmac};

use crate::aead::{Aead, CipherAlgorithm, TAG_LEN};
use crate::signing::{Signer, SigningAlgorithm};
use crate::CryptoError;

pub(crate) fn gcm(alg: CipherAlgorithm, key: &[u8]) -> Result<Box<dyn Aead>, CryptoError> {
    let lc_alg = match alg {
        CipherAlgorithm::Aes128Gcm => &AES_128_GCM,
        CipherAlgorithm::Aes256Gcm => &AES_256_GCM,
        _ => return Err(CryptoError::NotApproved(alg.name())),
    };
    let key = UnboundKey::new(lc_alg, key).map_err(|_| CryptoError::BadKeyLength {
        expected: alg.key_len(),
        got: key.len(),
    })?;
    Ok(Box::new(AwsLcGcm {
        alg,
        key: LessSafeKey::new(key),
    }))
}

struct AwsLcGcm {
    alg: CipherAlgorithm,
    key: LessSafeKey,
}

fn nonce12(nonce: &[u8]) -> Result<Nonce, CryptoError> {
    Nonce::try_assume_unique_for_key(nonce).map_err(|_| CryptoError::BadNonceLength {
        expected: 12,
        got: nonce.len(),
    })
}

impl Aead for AwsLcGcm {
    fn algorithm(&self) -> CipherAlgorithm {
        self.alg
    }

    fn seal_in_place(
        &self,
        nonce: &[u8],
        aad: &[u8],
        data: &mut [u8],
    ) -> Result<[u8; TAG_LEN], CryptoError> {
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce12(nonce)?, Aad::from(aad), data)
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
        self.key
            .open_in_place_separate_tag(nonce12(nonce)?, Aad::from(aad), tag, data)
            .map(|_| ())
            .map_err(|_| CryptoError::Authentication)
    }
}

pub(crate) fn signer(alg: SigningAlgorithm, key: &[u8]) -> Result<Box<dyn Signer>, CryptoError> {
    let bad = || CryptoError::BadKeyLength {
        expected: 16,
        got: key.len(),
    };
    Ok(match alg {
        SigningAlgorithm::HmacSha256 => Box::new(Hmac(hmac::Key::new(hmac::HMAC_SHA256, key))),
        SigningAlgorithm::AesCmac => {
            if key.len() != 16 {
                return Err(bad());
            }
            Box::new(Cmac(cmac::Key::new(cmac::AES_128, key).map_err(|_| bad())?))
        }
        SigningAlgorithm::AesGmac => {
            let key = UnboundKey::new(&AES_128_GCM, key).map_err(|_| bad())?;
            Box::new(Gmac(LessSafeKey::new(key)))
        }
    })
}

struct Hmac(hmac::Key);

impl Signer for Hmac {
    fn algorithm(&self) -> SigningAlgorithm {
        SigningAlgorithm::HmacSha256
    }
    fn sign(&self, _nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        let mut out = [0u8; 16];
        out.copy_from_slice(&hmac::sign(&self.0, message).as_ref()[..16]);
        out
    }
}

struct Cmac(cmac::Key);

impl Signer for Cmac {
    fn algorithm(&self) -> SigningAlgorithm {
        SigningAlgorithm::AesCmac
    }
    fn sign(&self, _nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        let mut out = [0u8; 16];
        // CMAC over a slice cannot fail; a zero signature would be refused
        // by the peer rather than accepted.
        if let Ok(tag) = cmac::sign(&self.0, message) {
            out.copy_from_slice(&tag.as_ref()[..16]);
        }
        out
    }
}

/// AES-128-GMAC: GCM with the message as AAD and nothing to encrypt.
struct Gmac(LessSafeKey);

impl Signer for Gmac {
    fn algorithm(&self) -> SigningAlgorithm {
        SigningAlgorithm::AesGmac
    }
    fn sign(&self, nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        let mut out = [0u8; 16];
        let nonce = Nonce::assume_unique_for_key(*nonce);
        if let Ok(tag) = self
            .0
            .seal_in_place_separate_tag(nonce, Aad::from(message), &mut [])
        {
            out.copy_from_slice(tag.as_ref());
        }
        out
    }
}

pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, key));
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.sign().as_ref());
    out
}

pub(crate) fn sha512(parts: &[&[u8]]) -> [u8; 64] {
    let mut ctx = digest::Context::new(&digest::SHA512);
    for p in parts {
        ctx.update(p);
    }
    let mut out = [0u8; 64];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}
