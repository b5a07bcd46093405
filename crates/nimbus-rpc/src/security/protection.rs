//! The verifier of an authenticated PDU at the integrity and privacy
//! levels (MS-RPCE 2.2.2.11, 3.3.1.5.2), for each mechanism:
//!
//! - NTLM (MS-NLMP 3.4): a 16-byte signature over the PDU from its header
//!   to its sec_trailer, whether or not the two sides sign headers;
//! - Kerberos (RFC 4121 4.2): at integrity a MIC token, at privacy a wrap
//!   token in DCE style, over the stub and padding alone, or also over the
//!   header before it and the sec_trailer after it when the BIND and
//!   BIND_ACK set PFC_SUPPORT_HEADER_SIGN.

use std::ops::Range;

use nimbus_auth::{BadSignature, KerberosSessionSecurity, NtlmSessionSecurity, SIGNATURE_LEN};

use crate::pdu::auth;

/// One association's signing and sealing context.
pub(super) enum Protection {
    Ntlm(Box<NtlmSessionSecurity>),
    Kerberos {
        gss: Box<KerberosSessionSecurity>,
        header_sign: bool,
    },
}

/// Where the parts of an authenticated PDU are: the stub and its padding,
/// then the sec_trailer, then the verifier from `signed` to the end.
pub(super) struct Layout {
    pub stub: Range<usize>,
    pub signed: usize,
}

impl Protection {
    /// A Kerberos context that can protect at `level`; None when its key
    /// type has no MIC length here, when the client did not ask for replay
    /// and sequence detection or for header signing (the BIND is not
    /// protected, so a client that would sign headers could be made not
    /// to, leaving the opnum and the padding open to change), or when it
    /// asked for sealing without the DCE style and confidentiality.
    pub fn kerberos(
        gss: Box<KerberosSessionSecurity>,
        level: u8,
        header_sign: bool,
    ) -> Option<Protection> {
        let usable = gss.mic_len().is_some()
            && gss.detects_replays()
            && header_sign
            && (level < auth::LEVEL_PRIVACY || gss.can_seal());
        usable.then_some(Protection::Kerberos { gss, header_sign })
    }

    /// The verifier's length for `stub_len` bytes of padded stub.
    pub fn verifier_len(&self, level: u8, stub_len: usize) -> Result<usize, BadSignature> {
        match self {
            Protection::Ntlm(_) => Ok(SIGNATURE_LEN),
            Protection::Kerberos { gss, .. } if level == auth::LEVEL_PRIVACY => {
                gss.seal_len(stub_len)
            }
            Protection::Kerberos { gss, .. } => gss.mic_len().ok_or(BadSignature),
        }
    }

    /// Checks a received PDU's verifier and, at privacy, unseals its stub
    /// in place.
    pub fn check(&mut self, pdu: &mut [u8], at: Layout, level: u8) -> Result<(), BadSignature> {
        let Layout { stub, signed } = at;
        match self {
            Protection::Ntlm(n) => {
                let sig: [u8; SIGNATURE_LEN] =
                    pdu[signed..].try_into().map_err(|_| BadSignature)?;
                if level == auth::LEVEL_PRIVACY {
                    n.unseal(pdu, stub, signed, &sig)
                } else {
                    n.verify(&pdu[..signed], &sig)
                }
            }
            Protection::Kerberos { gss, header_sign } => {
                if level < auth::LEVEL_PRIVACY {
                    let covered = if *header_sign {
                        &pdu[..signed]
                    } else {
                        &pdu[stub]
                    };
                    return gss.verify(covered, &pdu[signed..]);
                }
                let (before, data, after, token) = split(pdu, &stub, signed, *header_sign);
                gss.unseal(before, data, after, token)
            }
        }
    }

    /// Fills the verifier (the zeroed bytes from `signed` on) of a PDU to
    /// send and, at privacy, seals its stub in place.
    pub fn protect(&mut self, out: &mut [u8], at: Layout, level: u8) -> Result<(), BadSignature> {
        let Layout { stub, signed } = at;
        match self {
            Protection::Ntlm(n) => {
                let sig = if level == auth::LEVEL_PRIVACY {
                    n.seal(out, stub, signed)
                } else {
                    n.sign(&out[..signed])
                };
                out[signed..].copy_from_slice(&sig);
                Ok(())
            }
            Protection::Kerberos { gss, header_sign } => {
                if level < auth::LEVEL_PRIVACY {
                    let covered = if *header_sign {
                        &out[..signed]
                    } else {
                        &out[stub]
                    };
                    let mic = gss.sign(covered)?;
                    let place = out.get_mut(signed..).ok_or(BadSignature)?;
                    if place.len() != mic.len() {
                        return Err(BadSignature);
                    }
                    place.copy_from_slice(&mic);
                    return Ok(());
                }
                let (before, data, after, token) = split(out, &stub, signed, *header_sign);
                gss.seal(before, data, after, token)
            }
        }
    }
}

/// The PDU as GSS-API's DCE-style wrap sees it: what comes before the stub
/// and what lies between the stub and the verifier (both signed only when
/// headers are), the stub, and the verifier.
fn split<'a>(
    pdu: &'a mut [u8],
    stub: &Range<usize>,
    signed: usize,
    header_sign: bool,
) -> (&'a [u8], &'a mut [u8], &'a [u8], &'a mut [u8]) {
    let (head, rest) = pdu.split_at_mut(stub.start);
    let (data, rest) = rest.split_at_mut(stub.end - stub.start);
    let (trailer, token) = rest.split_at_mut(signed - stub.end);
    if header_sign {
        (head, data, trailer, token)
    } else {
        (&[], data, &[], token)
    }
}
