//! `nimbus bench crypto`: throughput of every SMB primitive of every crypto
//! provider built into this binary, on one core, in GB/s (10^9 bytes per
//! second), at the message sizes SMB uses: 4 KiB (metadata), 64 KiB (one
//! credit) and 1 MiB (large reads and writes). The last column says which
//! library the default provider took for each row on this CPU, and how
//! close it comes to the fastest provider measured.

use std::time::{Duration, Instant};

use nimbus_crypto::{CipherAlgorithm, CpuFeatures, CryptoProvider, Library, SigningAlgorithm};

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

/// The provider's name for the primitive a row of the table measures.
fn family(primitive: &str) -> &'static str {
    match primitive {
        p if p.contains("GCM") => "AES-GCM",
        p if p.contains("CCM") => "AES-CCM",
        p if p.contains("GMAC") => "AES-GMAC",
        p if p.contains("CMAC") => "AES-CMAC",
        p if p.contains("HMAC") => "HMAC-SHA256",
        _ => "SHA-512",
    }
}

/// The last column: the default's library for the row and its rate as a
/// share of the fastest library's. A library's rate is its best cell in
/// the row (providers share libraries: the cells of one library differ
/// only by measurement noise), e.g. "aws-lc 100%" or "ring 81% (aws-lc 12.31)".
fn default_cell(default: Option<Library>, cells: &[(Option<Library>, Option<f64>)]) -> String {
    let name = default.map_or("-", |l| l.name());
    let rate = |lib: Library| {
        cells
            .iter()
            .filter(|(l, _)| *l == Some(lib))
            .filter_map(|(_, v)| *v)
            .max_by(f64::total_cmp)
    };
    let best = cells
        .iter()
        .filter_map(|(l, _)| *l)
        .filter_map(|l| rate(l).map(|v| (l, v)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    match (default.and_then(rate), best) {
        (Some(mine), Some((lib, best))) if best > 0.0 => {
            let share = 100.0 * mine / best;
            if Some(lib) == default {
                format!("{name} 100%")
            } else {
                format!("{name} {share:.0}% ({} {best:.2})", lib.name())
            }
        }
        _ => format!("{name} -"),
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
    // `all()` puts the default first.
    let default = &providers[0];
    out.push_str(&format!(
        "This CPU: {}.\nThe default's AES-GCM: {} ({}).\n\n",
        CpuFeatures::detect().describe(),
        default.library_of("AES-GCM").map_or("-", |l| l.name()),
        default.gcm_why()
    ));
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
    header.push_str(" default's pick, % of fastest |");
    rule.push_str(&format!("{}|", "-".repeat(30)));
    out.push_str(&header);
    out.push('\n');
    out.push_str(&rule);
    out.push('\n');
    let mut buf = vec![0x5Au8; sizes.iter().map(|s| s.0).max().unwrap_or(0)];
    // A first run, not shown, so that the first row is not measured while
    // the core is still leaving a low clock state.
    if let (Some(mut op), Some(&(size, _))) = (operation(default, PRIMITIVES[0]), sizes.first()) {
        measure(&mut op, &mut buf[..size], min_per_case);
    }
    for primitive in PRIMITIVES {
        for &(size, label) in sizes {
            let mut row = format!("| {primitive:<17} | {label:<7} |");
            let mut cells = Vec::new();
            for p in &providers {
                let value = operation(p, primitive)
                    .map(|mut op| measure(&mut op, &mut buf[..size], min_per_case));
                let cell = value.map_or("-".into(), |v| format!("{v:.2}"));
                row.push_str(&format!(" {cell:>10} |"));
                cells.push((p.library_of(family(primitive)), value));
            }
            let pick = default.library_of(family(primitive));
            row.push_str(&format!(" {:<28} |", default_cell(pick, &cells)));
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
        assert!(table.contains("The default's AES-GCM: "), "{table}");
    }

    #[test]
    fn last_column_compares_libraries_not_providers() {
        let (ring, aws) = (Some(Library::Ring), Some(Library::AwsLc));
        // Two providers with aws-lc, noise between them: the library's
        // best cell is its rate, so the default is the fastest.
        let cells = [(aws, Some(9.0)), (ring, Some(7.0)), (aws, Some(10.0))];
        let aws_name = Library::AwsLc.name();
        assert_eq!(default_cell(aws, &cells), format!("{aws_name} 100%"));
        // ring faster: the default's best cell against ring's.
        let cells = [(aws, Some(5.0)), (ring, Some(10.0)), (aws, Some(5.5))];
        assert_eq!(
            default_cell(aws, &cells),
            format!("{aws_name} 55% (ring 10.00)")
        );
        // A primitive the default does not offer.
        assert_eq!(default_cell(None, &[(None, None)]), "- -");
        assert_eq!(family("AES-128-GCM open"), "AES-GCM");
        assert_eq!(family("AES-256-CCM"), "AES-CCM");
        assert_eq!(family("AES-128-GMAC"), "AES-GMAC");
        assert_eq!(family("SHA-512"), "SHA-512");
    }
}
