//! `nimbus bench crypto`: throughput of every SMB primitive of every crypto
//! provider built into this binary, on one core, in GB/s (10^9 bytes per
//! second), at the message sizes SMB uses: 4 KiB (metadata), 64 KiB (one
//! credit) and 1 MiB (large reads and writes).

use std::time::{Duration, Instant};

use nimbus_crypto::{CipherAlgorithm, CryptoProvider, SigningAlgorithm};

const SIZES: [(usize, &str); 3] = [(4 << 10, "4 KiB"), (64 << 10, "64 KiB"), (1 << 20, "1 MiB")];

/// One measured operation over a buffer of the given size.
type Op<'a> = Box<dyn FnMut(&mut [u8]) + 'a>;

/// What `bench crypto` measures; each yields an operation per provider, or
/// None if the provider does not offer it.
const PRIMITIVES: [&str; 9] = [
    "AES-128-GCM",
    "AES-256-GCM",
    "AES-128-CCM",
    "AES-256-CCM",
    "AES-128-GMAC",
    "AES-128-CMAC",
    "HMAC-SHA256",
    "SHA-512",
    "AES-128-GCM open",
];

fn operation<'a>(p: &'a CryptoProvider, primitive: &str) -> Option<Op<'a>> {
    let cipher = |alg: CipherAlgorithm| -> Option<Op<'a>> {
        let aead = p.cipher(alg, &vec![7u8; alg.key_len()]).ok()?;
        let nonce = vec![1u8; alg.nonce_len()];
        Some(Box::new(move |buf: &mut [u8]| {
            let _ = aead.seal_in_place(&nonce, &[0u8; 32], buf);
        }))
    };
    let signer = |alg: SigningAlgorithm| -> Option<Op<'a>> {
        let s = p.signer(alg, &[7u8; 16]).ok()?;
        Some(Box::new(move |buf: &mut [u8]| {
            std::hint::black_box(s.sign(&[1u8; 12], buf));
        }))
    };
    match primitive {
        "AES-128-GCM" => cipher(CipherAlgorithm::Aes128Gcm),
        "AES-256-GCM" => cipher(CipherAlgorithm::Aes256Gcm),
        "AES-128-CCM" => cipher(CipherAlgorithm::Aes128Ccm),
        "AES-256-CCM" => cipher(CipherAlgorithm::Aes256Ccm),
        "AES-128-GMAC" => signer(SigningAlgorithm::AesGmac),
        "AES-128-CMAC" => signer(SigningAlgorithm::AesCmac),
        "HMAC-SHA256" => signer(SigningAlgorithm::HmacSha256),
        "SHA-512" => Some(Box::new(move |buf: &mut [u8]| {
            std::hint::black_box(p.sha512(&[buf]));
        })),
        "AES-128-GCM open" => {
            // Decrypt what was sealed once; the buffer is restored each time
            // from its ciphertext so every run authenticates successfully.
            let aead = p.cipher(CipherAlgorithm::Aes128Gcm, &[7u8; 16]).ok()?;
            let mut sealed: Vec<u8> = Vec::new();
            let mut tag = [0u8; 16];
            Some(Box::new(move |buf: &mut [u8]| {
                if sealed.len() != buf.len() {
                    sealed = buf.to_vec();
                    tag = aead
                        .seal_in_place(&[1u8; 12], &[0u8; 32], &mut sealed)
                        .unwrap_or([0; 16]);
                }
                buf.copy_from_slice(&sealed);
                let _ = aead.open_in_place(&[1u8; 12], &[0u8; 32], buf, &tag);
            }))
        }
        _ => None,
    }
}

/// Runs `op` repeatedly for at least `min` (after a warm-up) and returns GB/s.
fn measure(op: &mut Op<'_>, buf: &mut [u8], min: Duration) -> f64 {
    op(buf);
    let start = Instant::now();
    let mut bytes = 0usize;
    while start.elapsed() < min {
        for _ in 0..8 {
            op(buf);
            bytes += buf.len();
        }
    }
    bytes as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// Measures everything and returns the table as text.
pub fn run(min_per_case: Duration) -> String {
    run_sizes(min_per_case, &SIZES)
}

fn run_sizes(min_per_case: Duration, sizes: &[(usize, &str)]) -> String {
    let providers = CryptoProvider::all();
    let mut out = String::new();
    out.push_str("Crypto throughput, one core, GB/s (10^9 bytes/s); ");
    out.push_str("\"AES-128-GCM open\" includes restoring the ciphertext (one memcpy).\n\n");
    out.push_str("Providers (library per primitive):\n");
    for p in &providers {
        let libs: Vec<String> = p
            .libraries()
            .iter()
            .map(|(what, lib)| format!("{what}={}", lib.map_or("-", |l| l.name())))
            .collect();
        out.push_str(&format!("  {:<11} {}\n", p.name(), libs.join(" ")));
    }
    out.push('\n');
    let mut header = format!("| {:<17} | {:<7} |", "primitive", "size");
    let mut rule = format!("|{}|{}|", "-".repeat(19), "-".repeat(9));
    for p in &providers {
        header.push_str(&format!(" {:>10} |", p.name()));
        rule.push_str(&format!("{}|", "-".repeat(12)));
    }
    out.push_str(&header);
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let mut buf = vec![0x5Au8; sizes.iter().map(|s| s.0).max().unwrap_or(0)];
    for primitive in PRIMITIVES {
        for &(size, label) in sizes {
            let mut row = format!("| {primitive:<17} | {label:<7} |");
            for p in &providers {
                let cell = match operation(p, primitive) {
                    Some(mut op) => {
                        format!("{:.2}", measure(&mut op, &mut buf[..size], min_per_case))
                    }
                    None => "-".into(),
                };
                row.push_str(&format!(" {cell:>10} |"));
            }
            out.push_str(&row);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_provider_offers_every_primitive_except_fips_ccm() {
        for p in CryptoProvider::all() {
            for primitive in PRIMITIVES {
                let offered = operation(&p, primitive).is_some();
                let ccm = primitive.contains("CCM");
                assert_eq!(offered, !(p.fips() && ccm), "{} {primitive}", p.name());
            }
        }
    }

    #[test]
    fn table_has_a_row_per_primitive_and_size() {
        // A tiny size keeps this quick in a debug build, where RustCrypto's
        // code is unoptimised; the sizes themselves are constants.
        let table = run_sizes(Duration::from_micros(1), &[(64, "64 B"), (128, "128 B")]);
        let rows = table
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| primitive"))
            .count();
        assert_eq!(rows, PRIMITIVES.len() * 2);
        assert!(!table.contains("NaN") && !table.contains("inf"));
    }
}
