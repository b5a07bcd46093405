//! nimbus-crypto: the only crate in Nimbus that calls cryptographic libraries.
//!
//! Everything else (the server's connection security layer, the NTLM acceptor)
//! goes through a [`CryptoProvider`], so that a FIPS provider can later be
//! swapped in and refuse what FIPS forbids (MD4, MD5, RC4: see
//! [`CryptoProvider::ntlm`]).
//!
//! No primitive is implemented here: RustCrypto crates do the work; this crate
//! only composes them the way MS-SMB2 and MS-NLMP require.
//!
//! # Seam for SMB 3.x encryption
//! AEAD ciphers for the TRANSFORM header (MS-SMB2 3.1.4.3: AES-128/256-CCM and
//! AES-128/256-GCM, in place, detached 16-byte tag) will be added as a
//! `CryptoProvider::cipher(alg, key) -> Box<dyn Aead>` constructor beside
//! [`CryptoProvider::signer`], with key types wiped on drop like the signers.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod error;
mod kdf;
mod ntlm;
mod provider;
mod signing;

pub use error::CryptoError;
pub use ntlm::{NtlmPrimitives, Rc4Stream};
pub use provider::CryptoProvider;
pub use signing::{Signer, SigningAlgorithm};

/// Compares two byte strings in constant time (for equal lengths).
///
/// Returns `false` if the lengths differ; lengths are not secret in any of our
/// uses (MACs and signatures have fixed sizes).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::ct_eq;

    #[test]
    fn ct_eq_compares_content_and_length() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
