//! The libraries a provider takes its primitives from.

/// A library that implements primitives for a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Library {
    /// ring (BoringSSL's assembly): AES-GCM with VAES on AVX2.
    Ring,
    /// AWS-LC through aws-lc-rs (the FIPS 140-3 module with feature `fips`):
    /// AES-GCM with VAES on AVX-512, GMAC, CMAC, HMAC-SHA256, SHA-512.
    AwsLc,
    /// The RustCrypto crates (aes, aes-gcm, ccm, cmac, hmac, sha2).
    RustCrypto,
}

impl Library {
    /// Short name for tables and logs.
    pub fn name(self) -> &'static str {
        match self {
            Library::Ring => "ring",
            Library::AwsLc => {
                if cfg!(feature = "fips") {
                    "aws-lc-fips"
                } else {
                    "aws-lc"
                }
            }
            Library::RustCrypto => "rustcrypto",
        }
    }
}
