//! Legacy primitives NTLM needs (MS-NLMP 3.3 and 3.4): MD4, MD5, HMAC-MD5 and
//! RC4. A FIPS provider offers none of them, which is how NTLM gets turned off.

use hmac::{Hmac, Mac};
use md4::{Digest, Md4};
use md5::Md5;
use rc4::consts::{U16, U5, U7, U8};
use rc4::{KeyInit, Rc4, StreamCipher};

/// MD4, MD5, HMAC-MD5 and RC4 as NTLM uses them.
pub trait NtlmPrimitives: Send + Sync {
    /// MD4 digest (the NT hash is MD4 of the UTF-16LE password).
    fn md4(&self, data: &[u8]) -> [u8; 16];
    /// MD5 digest of the concatenation of `parts`.
    fn md5(&self, parts: &[&[u8]]) -> [u8; 16];
    /// HMAC-MD5 of the concatenation of `parts`.
    fn hmac_md5(&self, key: &[u8], parts: &[&[u8]]) -> [u8; 16];
    /// RC4 with a fresh keystream from its start, in place.
    ///
    /// Keys are 5, 7, 8 or 16 bytes, the only sizes NTLM produces; any other
    /// size is a programming error and panics.
    fn rc4(&self, key: &[u8], data: &mut [u8]);
    /// A stateful RC4 keystream, for NTLM sealing where one handle is used for
    /// the whole session (MS-NLMP 3.4.3). Same key sizes as [`Self::rc4`].
    fn rc4_stream(&self, key: &[u8]) -> Box<dyn Rc4Stream>;
}

/// A running RC4 keystream.
pub trait Rc4Stream: Send {
    /// XORs the next `data.len()` keystream bytes into `data`.
    fn apply(&mut self, data: &mut [u8]);
}

/// The RustCrypto-backed implementation.
pub(crate) struct RustCryptoNtlm;

impl NtlmPrimitives for RustCryptoNtlm {
    fn md4(&self, data: &[u8]) -> [u8; 16] {
        Md4::digest(data).into()
    }

    fn md5(&self, parts: &[&[u8]]) -> [u8; 16] {
        let mut h = Md5::new();
        for p in parts {
            h.update(p);
        }
        h.finalize().into()
    }

    fn hmac_md5(&self, key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
        let mut mac = match <Hmac<Md5> as KeyInit>::new_from_slice(key) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts any key length"),
        };
        for p in parts {
            mac.update(p);
        }
        mac.finalize().into_bytes().into()
    }

    fn rc4(&self, key: &[u8], data: &mut [u8]) {
        self.rc4_stream(key).apply(data);
    }

    fn rc4_stream(&self, key: &[u8]) -> Box<dyn Rc4Stream> {
        // The rc4 crate fixes the key size in the type; NTLM needs only these.
        fn boxed<C: StreamCipher + KeyInit + Send + 'static>(key: &[u8]) -> Box<dyn Rc4Stream> {
            match C::new_from_slice(key) {
                Ok(c) => Box::new(RustCryptoRc4(c)),
                Err(_) => unreachable!("length matched before"),
            }
        }
        match key.len() {
            5 => boxed::<Rc4<U5>>(key),
            7 => boxed::<Rc4<U7>>(key),
            8 => boxed::<Rc4<U8>>(key),
            16 => boxed::<Rc4<U16>>(key),
            n => panic!("RC4 key of {n} bytes: NTLM only uses 5, 7, 8 or 16"),
        }
    }
}

/// Wraps an rc4 cipher (built with `zeroize`, so its state is wiped on drop).
struct RustCryptoRc4<C>(C);

impl<C: StreamCipher + Send> Rc4Stream for RustCryptoRc4<C> {
    fn apply(&mut self, data: &mut [u8]) {
        self.0.apply_keystream(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    /// RFC 1320 appendix A.5.
    #[test]
    fn md4_rfc1320() {
        let p = RustCryptoNtlm;
        assert_eq!(p.md4(b"").to_vec(), h("31d6cfe0d16ae931b73c59d7e0c089c0"));
        assert_eq!(
            p.md4(b"abc").to_vec(),
            h("a448017aaf21d8525fc10ae87aa6729d")
        );
    }

    /// RFC 1321 appendix A.5.
    #[test]
    fn md5_rfc1321() {
        let p = RustCryptoNtlm;
        assert_eq!(p.md5(&[]).to_vec(), h("d41d8cd98f00b204e9800998ecf8427e"));
        assert_eq!(
            p.md5(&[b"a", b"bc"]).to_vec(),
            h("900150983cd24fb0d6963f7d28e17f72")
        );
    }

    /// RFC 2202 section 2, test cases 1 and 2.
    #[test]
    fn hmac_md5_rfc2202() {
        let p = RustCryptoNtlm;
        assert_eq!(
            p.hmac_md5(&[0x0b; 16], &[b"Hi There"]).to_vec(),
            h("9294727a3638bb1c13f48ef8158bfc9d")
        );
        assert_eq!(
            p.hmac_md5(b"Jefe", &[b"what do ya want ", b"for nothing?"])
                .to_vec(),
            h("750c783e6ab0b503eaa86e310a5db738")
        );
    }

    /// RFC 6229 section 2: 40-bit and 128-bit keys, keystream offsets 0 and 16.
    #[test]
    fn rc4_rfc6229() {
        let p = RustCryptoNtlm;
        let mut ks = [0u8; 16];
        p.rc4(&h("0102030405"), &mut ks);
        assert_eq!(ks.to_vec(), h("b2396305f03dc027ccc3524a0a1118a8"));

        let key = h("0102030405060708090a0b0c0d0e0f10");
        let mut ks = [0u8; 32];
        p.rc4(&key, &mut ks);
        assert_eq!(
            ks.to_vec(),
            h("9ac7cc9a609d1ef7b2932899cde41b975248c4959014126a6e8a84f11d1a9e1c")
        );
        // The stateful stream continues where it left off.
        let mut s = p.rc4_stream(&key);
        let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
        s.apply(&mut a);
        s.apply(&mut b);
        assert_eq!([a, b].concat(), ks.to_vec());
    }
}
