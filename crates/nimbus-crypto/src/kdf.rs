//! NIST SP800-108 KDF in counter mode with HMAC-SHA256, as MS-SMB2 3.1.4.2
//! uses it to derive the signing, encryption, decryption and application keys.

/// HMAC-SHA256 over the concatenation of parts: the KDF's PRF, from
/// whichever library the provider uses.
pub(crate) type Prf = fn(&[u8], &[&[u8]]) -> [u8; 32];

/// SP800-108 section 5.1 (counter mode), PRF = HMAC-SHA256, r = 32:
/// `K(i) = PRF(key, [i]_2 || fixed_input)` for i = 1.., concatenated and
/// truncated to `out.len()`.
///
/// `fixed_input` is taken verbatim; this is the shape NIST CAVP vectors use.
pub(crate) fn kdf_counter_hmac_sha256(prf: Prf, key: &[u8], fixed_input: &[u8], out: &mut [u8]) {
    for (i, chunk) in out.chunks_mut(32).enumerate() {
        // At most 2^32 - 1 blocks; SMB asks for 16 or 32 bytes, so the
        // counter cannot overflow in practice. Saturate rather than wrap.
        let counter = u32::try_from(i + 1).unwrap_or(u32::MAX).to_be_bytes();
        let block = prf(key, &[&counter, fixed_input]);
        chunk.copy_from_slice(&block[..chunk.len()]);
    }
}

/// MS-SMB2 3.1.4.2 form: fixed input = `label || 0x00 || context || [L]_2`,
/// L = `out.len() * 8` as 32-bit big-endian.
///
/// Label and context are passed exactly (the caller includes any trailing NUL
/// of the label, e.g. `b"SMBSigningKey\0"`), then the spec's separator byte.
pub(crate) fn smb_kdf(prf: Prf, key: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) {
    let bits = u32::try_from(out.len().saturating_mul(8)).unwrap_or(u32::MAX);
    let mut fixed = Vec::with_capacity(label.len() + 1 + context.len() + 4);
    fixed.extend_from_slice(label);
    fixed.push(0);
    fixed.extend_from_slice(context);
    fixed.extend_from_slice(&bits.to_be_bytes());
    kdf_counter_hmac_sha256(prf, key, &fixed, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::hmac_sha256;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// The PRFs a provider may build the KDF on: RustCrypto's HMAC and
    /// AWS-LC's (its FIPS module when built with `--features fips`).
    const PRFS: [(&str, Prf); 2] = [
        ("rustcrypto", hmac_sha256),
        ("aws-lc", crate::awslc::hmac_sha256),
    ];

    /// NIST CAVP KDFCTR_gen.rsp, [PRF=HMAC_SHA256][CTRLOCATION=BEFORE_FIXED]
    /// [RLEN=32_BITS], COUNT=0 (L=128) and COUNT=10 (L=256), on both PRFs.
    #[test]
    fn cavp_counter_mode_hmac_sha256() {
        let cases = [
            (
                "dd1d91b7d90b2bd3138533ce92b272fbf8a369316aefe242e659cc0ae238afe0",
                "01322b96b30acd197979444e468e1c5c6859bf1b1cf951b7e725303e237e46b8\
                64a145fab25e517b08f8683d0315bb2911d80a0e8aba17f3b413faac",
                "10621342bfb0fd40046c0e29f2cfdbf0",
            ),
            (
                "e204d6d466aad507ffaf6d6dab0a5b26152c9e21e764370464e360c8fbc765c6",
                "7b03b98d9f94b899e591f3ef264b71b193fba7043c7e953cde23bc5384bc1a62\
                93580115fae3495fd845dadbd02bd6455cf48d0f62b33e62364a3a80",
                "770dfab6a6a4a4bee0257ff335213f78d8287b4fd537d5c1fffa956910e7c779",
            ),
        ];
        for (key, fixed, want) in cases {
            for (who, prf) in PRFS {
                let mut out = vec![0u8; want.len() / 2];
                kdf_counter_hmac_sha256(prf, &h(key), &h(fixed), &mut out);
                assert_eq!(out, h(want), "{who}");
            }
        }
    }

    /// Published SMB 3.x key derivations: (session key, label, context,
    /// derived key).
    const SMB_KDF_VECTORS: &[(&str, &[u8], &str, &str)] = &[
        // Microsoft Open Specifications blog "Encryption in SMB 3.0: a
        // protocol perspective" (2012): the signing, encryption, decryption
        // and application keys derived from SessionKey B4546771....
        (
            "B4546771B515F766A86735532DD6C4F0",
            b"SMB2AESCMAC\0",
            "536d625369676e00", // "SmbSign\0"
            "F773CD23C18FD1E08EE510CADA7CF852",
        ),
        (
            "B4546771B515F766A86735532DD6C4F0",
            b"SMB2AESCCM\0",
            "536572766572496e2000", // "ServerIn \0"
            "261B72350558F2E9DCF613070383EDBF",
        ),
        (
            "B4546771B515F766A86735532DD6C4F0",
            b"SMB2AESCCM\0",
            "5365727665724f757400", // "ServerOut\0"
            "8FE2B57EC34D2DB5B1A9727F526BBDB5",
        ),
        (
            "B4546771B515F766A86735532DD6C4F0",
            b"SMB2APP\0",
            "536d6252706300", // "SmbRpc\0"
            "77432F808CE99156B5BC6A3676D730D1",
        ),
        // Blog "SMB 3.1.1 Pre-authentication integrity in Windows 10"
        // (2015): SigningKey from SessionKey and the final preauth hash.
        (
            "270E1BA896585EEB7AF3472D3B4C75A7",
            b"SMBSigningKey\0",
            "0DD13628CC3ED218EF9DF9772D436D0887AB9814BFAE63A80AA845F36909DB79\
             28622DDDAD522D9751640A459762C5A9D6BB084CBB3CE6BDADEF5D5BCE3C6C01",
            "73FE7A9A77BEF0BDE49C650D8CCB5F76",
        ),
        // Blog "SMB 3.1.1 Encryption in Windows 10" (2015), appendix A.1
        // (AES-128-GCM): the client-to-server and server-to-client keys.
        (
            "419FDDF34C1E001909D362AE7FB6AF79",
            b"SMBC2SCipherKey\0",
            "B23F3CBFD69487D9832B79B1594A367CDD950909B774C3A4C412B4FCEA9EDDDB\
             A7DB256BA2EA30E977F11F9B113247578E0E915C6D2A513B8F2FCA5707DC8770",
            "A2F5E80E5D59103034F32E52F698E5EC",
        ),
        (
            "419FDDF34C1E001909D362AE7FB6AF79",
            b"SMBS2CCipherKey\0",
            "B23F3CBFD69487D9832B79B1594A367CDD950909B774C3A4C412B4FCEA9EDDDB\
             A7DB256BA2EA30E977F11F9B113247578E0E915C6D2A513B8F2FCA5707DC8770",
            "748C50868C90F302962A5C35F5F9A8BF",
        ),
        // The same post, appendix A.2 (AES-128-CCM).
        (
            "07B7F69C1E2581662DF6987E88F9E891",
            b"SMBC2SCipherKey\0",
            "DECF98A420718718F22090D3580FCC5E484BD310FA1268210C6E86335A8891E7\
             67F5BCD99FA5A7859D665AD07A73EA94E1BCDB7CFA69A6962A28A244138340B1",
            "DFAAA31AAE40A2485D47AC4DF09FDA1D",
        ),
        (
            "07B7F69C1E2581662DF6987E88F9E891",
            b"SMBS2CCipherKey\0",
            "DECF98A420718718F22090D3580FCC5E484BD310FA1268210C6E86335A8891E7\
             67F5BCD99FA5A7859D665AD07A73EA94E1BCDB7CFA69A6962A28A244138340B1",
            "95C544AEF6072680DA1CE49A68A97FA6",
        ),
    ];

    /// Every published SMB key derivation, through both PRFs and through
    /// every provider's `kdf` (default, rustcrypto, aws-lc, and fips when
    /// built with `--features fips`).
    #[test]
    fn smb_key_derivation_examples_on_every_provider() {
        let providers = crate::CryptoProvider::all();
        assert!(providers.len() >= 3);
        for &(session_key, label, context, want) in SMB_KDF_VECTORS {
            let (key, context, want) = (h(session_key), h(context), h(want));
            let what = String::from_utf8_lossy(label);
            for (who, prf) in PRFS {
                let mut out = [0u8; 16];
                smb_kdf(prf, &key, label, &context, &mut out);
                assert_eq!(out.to_vec(), want, "{who} {what}");
            }
            for p in &providers {
                let mut out = [0u8; 16];
                p.kdf(&key, label, &context, &mut out);
                assert_eq!(out.to_vec(), want, "{} {what}", p.name());
            }
        }
    }
}
