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
        }
    }
}

impl std::error::Error for CryptoError {}
