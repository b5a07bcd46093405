//! nimbus-crypto: the only crate in Nimbus that calls cryptographic libraries.
//!
//! Everything else (the server's connection security layer, the NTLM acceptor)
//! goes through a [`CryptoProvider`], so that a FIPS provider can later be
//! swapped in and refuse what FIPS forbids (MD4, MD5, RC4: see
//! [`CryptoProvider::ntlm`]).
//!
//! No primitive is implemented here: ring and RustCrypto crates do the work;
//! this crate only composes them the way MS-SMB2 and MS-NLMP require, and
//! picks the fastest library for each primitive (see `nimbus bench crypto`);
//! for AES-GCM that depends on the CPU, and `cpu` picks at start-up.
//!
//! The only `unsafe` is in `wipe`, which zeroes the key schedule of a library
//! type that does not wipe itself.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod aead;
mod awslc;
mod cpu;
mod error;
mod kdf;
mod library;
mod ntlm;
mod provider;
mod signing;
#[allow(unsafe_code)]
mod wipe;

pub use aead::{Aead, CipherAlgorithm, TAG_LEN};
pub use cpu::{gcm_library, CpuFeatures, Pick};
pub use error::CryptoError;
pub use library::Library;
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
