//! Which library the default provider takes for AES-GCM on the CPU it runs on.
//!
//! AES-GCM is the one primitive whose fastest library depends on the CPU:
//! each library has its own code for the newest vector extensions, and
//! none for the other's. The facts the rule below rests on (x86_64):
//! - AWS-LC has an AES-GCM for AVX-512 with VAES and VPCLMULQDQ (it needs
//!   AVX512F, DQ, BW and VL too). Without all of them it runs the AES-NI
//!   code that both libraries take from OpenSSL (aesni-gcm, AVX and MOVBE).
//! - ring has an AES-GCM for VAES and VPCLMULQDQ on 256-bit AVX2 registers,
//!   and no AVX-512 code. Without VAES it runs the same AES-NI code.
//! - Measured with `nimbus bench crypto` (BENCHMARKS.md): on an EPYC with
//!   AVX-512, VAES and VPCLMULQDQ, AWS-LC seals at 1.2-1.7x ring's rate
//!   (runs on different days); with AWS-LC's AVX-512 code turned off on
//!   the same core, and on an EPYC with VAES and AVX2 but no AVX-512, ring
//!   seals at 1.7-2x AWS-LC's.
//!
//! The choice is made from CPU features rather than from a calibration
//! (timing each library for a few milliseconds at start-up): a timing taken
//! while the machine is busy (a node restarting under load, a noisy VM
//! neighbour, a core in a low clock state) can pick the slower library, and
//! two nodes of one cluster could then differ for no reason an operator can
//! see. The features name the exact code each library will run, the same
//! on every start. Either library gives the same bytes on the wire; the
//! provider tests check every library against the same vectors.

use crate::library::Library;

/// The CPU features the AES-GCM choice depends on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AES-NI.
    pub aes_ni: bool,
    /// PCLMULQDQ (carry-less multiply, for GHASH).
    pub pclmulqdq: bool,
    /// AVX2.
    pub avx2: bool,
    /// VAES: AES rounds on whole vector registers.
    pub vaes: bool,
    /// VPCLMULQDQ: carry-less multiply on whole vector registers.
    pub vpclmulqdq: bool,
    /// AVX512F, DQ, BW and VL together, enabled by the operating system.
    pub avx512: bool,
}

impl CpuFeatures {
    /// The features of the CPU this runs on (all false off x86_64).
    pub fn detect() -> CpuFeatures {
        #[cfg(target_arch = "x86_64")]
        {
            CpuFeatures {
                aes_ni: std::arch::is_x86_feature_detected!("aes"),
                pclmulqdq: std::arch::is_x86_feature_detected!("pclmulqdq"),
                avx2: std::arch::is_x86_feature_detected!("avx2"),
                vaes: std::arch::is_x86_feature_detected!("vaes"),
                vpclmulqdq: std::arch::is_x86_feature_detected!("vpclmulqdq"),
                avx512: std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        CpuFeatures::default()
    }

    /// The features present, for logs: "AES-NI PCLMULQDQ AVX2 VAES ...".
    pub fn describe(&self) -> String {
        let names = [
            (self.aes_ni, "AES-NI"),
            (self.pclmulqdq, "PCLMULQDQ"),
            (self.avx2, "AVX2"),
            (self.vaes, "VAES"),
            (self.vpclmulqdq, "VPCLMULQDQ"),
            (self.avx512, "AVX-512"),
        ];
        let present: Vec<&str> = names
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
        if present.is_empty() {
            "none of AES-NI, PCLMULQDQ, AVX2, VAES, VPCLMULQDQ, AVX-512".into()
        } else {
            present.join(" ")
        }
    }
}

/// A library picked for a primitive, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    /// The library.
    pub library: Library,
    /// Why, in a few words, for the start-up log and `nimbus bench crypto`.
    pub why: &'static str,
}

/// The AES-GCM library for a CPU with `cpu`'s features.
pub fn gcm_library(cpu: &CpuFeatures) -> Pick {
    let wide = cpu.vaes && cpu.vpclmulqdq;
    if wide && cpu.avx512 {
        Pick {
            library: Library::AwsLc,
            why: "AVX-512 with VAES and VPCLMULQDQ: AWS-LC's AVX-512 AES-GCM (ring has none)",
        }
    } else if wide && cpu.avx2 {
        Pick {
            library: Library::Ring,
            why: "VAES and VPCLMULQDQ without AVX-512: ring's AVX2 VAES AES-GCM (AWS-LC has none)",
        }
    } else if cpu.aes_ni && cpu.pclmulqdq {
        Pick {
            library: Library::Ring,
            why: "AES-NI without VAES: both libraries run the same AES-NI code; ring",
        }
    } else {
        Pick {
            library: Library::Ring,
            why: "no AES-NI, or not x86_64: ring (AWS-LC not measured against it there)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(aes_ni: bool, avx2: bool, vaes: bool, avx512: bool) -> CpuFeatures {
        CpuFeatures {
            aes_ni,
            pclmulqdq: aes_ni,
            avx2,
            vaes,
            vpclmulqdq: vaes,
            avx512,
        }
    }

    #[test]
    fn each_cpu_case_gets_its_library() {
        let cases = [
            (
                "AVX-512 + VAES",
                cpu(true, true, true, true),
                Library::AwsLc,
            ),
            ("AVX2 + VAES", cpu(true, true, true, false), Library::Ring),
            ("AES-NI only", cpu(true, true, false, false), Library::Ring),
            (
                "AES-NI, no AVX2",
                cpu(true, false, false, false),
                Library::Ring,
            ),
            ("no AES-NI", cpu(false, false, false, false), Library::Ring),
            // AVX-512 without VAES (Skylake-SP): AWS-LC's AVX-512 code
            // needs VAES, so it would run the shared AES-NI code.
            (
                "AVX-512, no VAES",
                cpu(true, true, false, true),
                Library::Ring,
            ),
        ];
        for (name, features, want) in cases {
            let pick = gcm_library(&features);
            assert_eq!(pick.library, want, "{name}: {}", pick.why);
            assert!(!pick.why.is_empty());
        }
    }

    #[test]
    fn vaes_without_vpclmulqdq_is_not_the_wide_path() {
        let mut f = cpu(true, true, true, true);
        f.vpclmulqdq = false;
        assert_eq!(gcm_library(&f).library, Library::Ring);
    }

    #[test]
    fn description_names_what_is_present() {
        assert_eq!(
            cpu(true, true, false, false).describe(),
            "AES-NI PCLMULQDQ AVX2"
        );
        assert!(CpuFeatures::default().describe().starts_with("none of"));
        // Whatever this machine has, detection does not panic and agrees
        // with itself.
        assert_eq!(CpuFeatures::detect(), CpuFeatures::detect());
    }
}
