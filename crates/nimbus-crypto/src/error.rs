//! Errors from constructing keyed crypto objects.

use std::fmt;

/// Why a keyed object could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum CryptoError {
    /// The key has the wrong size for the algorithm.
    BadKeyLength {
        /// Size the algorithm needs, in bytes.
        expected: usize,
        /// Size that was passed.
        got: usize,
    },
    /// The provider does not offer the algorithm (e.g. FIPS mode and a legacy
    /// algorithm).
    NotApproved(&'static str),
    /// The nonce has the wrong size for the cipher.
    BadNonceLength {
        /// Size the cipher needs, in bytes.
        expected: usize,
        /// Size that was passed.
        got: usize,
    },
    /// Authenticated decryption failed: wrong key, nonce, data or tag.
    /// Nothing about the plaintext may be used.
    Authentication,
    /// The message is longer than the algorithm can protect with one nonce.
    TooLong,
}

impl fmt::Display for CryptoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CryptoError::BadKeyLength { expected, got } => {
                write!(f, "bad key length: expected {expected} bytes, got {got}")
            }
            CryptoError::NotApproved(what) => {
                write!(f, "{what} is not offered by this crypto provider")
            }
            CryptoError::BadNonceLength { expected, got } => {
                write!(f, "bad nonce length: expected {expected} bytes, got {got}")
            }
            CryptoError::Authentication => write!(f, "message failed authentication"),
            CryptoError::TooLong => write!(f, "message too long for the cipher"),
        }
    }
}

impl std::error::Error for CryptoError {}
