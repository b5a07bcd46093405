//! SPNEGO tokens (RFC 4178, with the NegTokenInit2 form of MS-SPNG 2.2.1).

use crate::der::{
    children, constructed, context, expect_only, expect_tlv, read_tlv, tlv, DerResult,
    TAG_ENUMERATED, TAG_GENERAL_STRING, TAG_OCTET_STRING, TAG_OID, TAG_SEQUENCE,
};

/// DER of OID 1.3.6.1.5.5.2 (SPNEGO), value octets only.
pub(crate) const OID_SPNEGO: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x02];
/// DER of OID 1.3.6.1.4.1.311.2.2.10 (NTLMSSP), value octets only.
pub(crate) const OID_NTLMSSP: &[u8] = &[0x2b, 0x06, 0x01, 0x04, 0x01, 0x82, 0x37, 0x02, 0x02, 0x0a];

/// DER of OID 1.2.840.113554.1.2.2 (Kerberos V5, RFC 4121), value octets only.
pub(crate) const OID_KRB5: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02];
/// DER of OID 1.2.840.48018.1.2.2, the Kerberos OID Windows sends first
/// (MS-SPNG 3.3.5.1: a mistyped copy of the above, treated the same).
pub(crate) const OID_MS_KRB5: &[u8] = &[0x2a, 0x86, 0x48, 0x82, 0xf7, 0x12, 0x01, 0x02, 0x02];

/// Most mechanisms a client may offer; real clients offer at most five.
const MAX_MECHS: usize = 32;

/// negState values of NegTokenResp (RFC 4178 4.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NegState {
    AcceptCompleted = 0,
    AcceptIncomplete = 1,
    /// Never sent: failures end the exchange with an NTSTATUS instead.
    #[allow(dead_code)]
    Reject = 2,
    RequestMic = 3,
}

/// A decoded NegTokenInit or NegTokenInit2 (RFC 4178 4.2.1; MS-SPNG 2.2.1).
#[derive(Debug)]
pub(crate) struct NegTokenInit<'a> {
    /// The `MechTypeList` SEQUENCE exactly as received: mechListMIC covers it.
    pub mech_types_raw: &'a [u8],
    /// The offered mechanism OIDs (value octets), in the client's order.
    pub mechs: Vec<&'a [u8]>,
    pub mech_token: Option<&'a [u8]>,
    pub mech_list_mic: Option<&'a [u8]>,
}

impl NegTokenInit<'_> {
    /// Position of NTLMSSP among the offered mechanisms.
    pub fn ntlm_position(&self) -> Option<usize> {
        self.mechs.iter().position(|m| *m == OID_NTLMSSP)
    }

    /// Position and OID of the first Kerberos mechanism offered (either
    /// spelling of its OID).
    pub fn kerberos_position(&self) -> Option<(usize, &'static [u8])> {
        self.mechs.iter().enumerate().find_map(|(i, m)| {
            [OID_MS_KRB5, OID_KRB5]
                .into_iter()
                .find(|k| k == m)
                .map(|k| (i, k))
        })
    }
}

/// A decoded NegTokenResp (RFC 4178 4.2.2).
#[derive(Debug, Default)]
pub(crate) struct NegTokenResp<'a> {
    pub neg_state: Option<u8>,
    pub supported_mech: Option<&'a [u8]>,
    pub response_token: Option<&'a [u8]>,
    pub mech_list_mic: Option<&'a [u8]>,
}

/// Parses an initial token: `[APPLICATION 0] { thisMech OID, [0] NegTokenInit }`
/// (RFC 2743 3.1 framing), or a bare `[0] NegTokenInit` some clients send.
/// The mechanism an RFC 2743 3.1 initial context token names (its
/// [APPLICATION 0] framing and OID), if it is one.
pub(crate) fn initial_token_mech(token: &[u8]) -> Option<&[u8]> {
    let app = expect_only(token, 0x60).ok()?;
    let (oid, _) = expect_tlv(app.value, TAG_OID).ok()?;
    Some(oid.value)
}

pub(crate) fn parse_init(token: &[u8]) -> DerResult<NegTokenInit<'_>> {
    let choice = if token.first() == Some(&0x60) {
        let app = expect_only(token, 0x60)?;
        let (oid, rest) = expect_tlv(app.value, TAG_OID)?;
        if oid.value != OID_SPNEGO {
            return Err("SPNEGO: initial token is not for SPNEGO");
        }
        rest
    } else {
        token
    };
    let init = expect_only(choice, context(0))?;
    let seq = expect_only(init.value, TAG_SEQUENCE)?;
    let mut out = NegTokenInit {
        mech_types_raw: &[],
        mechs: Vec::new(),
        mech_token: None,
        mech_list_mic: None,
    };
    let mut seen_mech_types = false;
    for field in children(seq.value, 8)? {
        match field.tag {
            // mechTypes [0] MechTypeList
            t if t == context(0) => {
                let list = expect_only(field.value, TAG_SEQUENCE)?;
                for m in children(list.value, MAX_MECHS)? {
                    if m.tag != TAG_OID {
                        return Err("SPNEGO: mechTypes holds a non-OID");
                    }
                    out.mechs.push(m.value);
                }
                out.mech_types_raw = list.raw;
                seen_mech_types = true;
            }
            // reqFlags [1]: ignored (RFC 4178 says acceptors should ignore it).
            t if t == context(1) => {}
            // mechToken [2] OCTET STRING
            t if t == context(2) => {
                out.mech_token = Some(expect_only(field.value, TAG_OCTET_STRING)?.value);
            }
            // [3] is mechListMIC in RFC 4178 but negHints (a SEQUENCE) in
            // MS-SPNG's NegTokenInit2; tell them apart by the inner tag.
            t if t == context(3) => {
                let (inner, rest) = read_tlv(field.value)?;
                if !rest.is_empty() {
                    return Err("SPNEGO: trailing bytes in [3]");
                }
                if inner.tag == TAG_OCTET_STRING {
                    out.mech_list_mic = Some(inner.value);
                }
            }
            // mechListMIC [4] in NegTokenInit2
            t if t == context(4) => {
                out.mech_list_mic = Some(expect_only(field.value, TAG_OCTET_STRING)?.value);
            }
            _ => return Err("SPNEGO: unknown NegTokenInit field"),
        }
    }
    if !seen_mech_types {
        return Err("SPNEGO: NegTokenInit without mechTypes");
    }
    Ok(out)
}

/// Parses `[1] NegTokenResp`.
pub(crate) fn parse_resp(token: &[u8]) -> DerResult<NegTokenResp<'_>> {
    let resp = expect_only(token, context(1))?;
    let seq = expect_only(resp.value, TAG_SEQUENCE)?;
    let mut out = NegTokenResp::default();
    for field in children(seq.value, 8)? {
        match field.tag {
            t if t == context(0) => {
                let e = expect_only(field.value, TAG_ENUMERATED)?;
                match e.value {
                    [v] => out.neg_state = Some(*v),
                    _ => return Err("SPNEGO: bad negState"),
                }
            }
            t if t == context(1) => {
                out.supported_mech = Some(expect_only(field.value, TAG_OID)?.value);
            }
            t if t == context(2) => {
                out.response_token = Some(expect_only(field.value, TAG_OCTET_STRING)?.value);
            }
            t if t == context(3) => {
                out.mech_list_mic = Some(expect_only(field.value, TAG_OCTET_STRING)?.value);
            }
            _ => return Err("SPNEGO: unknown NegTokenResp field"),
        }
    }
    Ok(out)
}

/// Encodes `[1] NegTokenResp` (RFC 4178 4.2.2).
pub(crate) fn build_resp(
    state: NegState,
    supported_mech: Option<&[u8]>,
    response_token: Option<&[u8]>,
    mech_list_mic: Option<&[u8]>,
) -> Vec<u8> {
    let mut fields = constructed(context(0), &[&tlv(TAG_ENUMERATED, &[state as u8])]);
    if let Some(m) = supported_mech {
        fields.extend(constructed(context(1), &[&tlv(TAG_OID, m)]));
    }
    if let Some(t) = response_token {
        fields.extend(constructed(context(2), &[&tlv(TAG_OCTET_STRING, t)]));
    }
    if let Some(m) = mech_list_mic {
        fields.extend(constructed(context(3), &[&tlv(TAG_OCTET_STRING, m)]));
    }
    constructed(context(1), &[&tlv(TAG_SEQUENCE, &fields)])
}

/// The NegTokenInit2 a server puts in its SMB2 NEGOTIATE response
/// (MS-SPNG 2.2.1, 3.2.5.2): the mechanisms offered, in order of
/// preference, and the fixed hintName.
pub(crate) fn build_server_init(mechs: &[&[u8]]) -> Vec<u8> {
    let oids: Vec<Vec<u8>> = mechs.iter().map(|m| tlv(TAG_OID, m)).collect();
    let oids: Vec<&[u8]> = oids.iter().map(Vec::as_slice).collect();
    let mech_types = constructed(TAG_SEQUENCE, &oids);
    let hint = tlv(TAG_GENERAL_STRING, b"not_defined_in_RFC4178@please_ignore");
    let neg_hints = constructed(TAG_SEQUENCE, &[&tlv(context(0), &hint)]);
    let init2 = constructed(
        TAG_SEQUENCE,
        &[&tlv(context(0), &mech_types), &tlv(context(3), &neg_hints)],
    );
    constructed(0x60, &[&tlv(TAG_OID, OID_SPNEGO), &tlv(context(0), &init2)])
}

/// Encodes a client NegTokenInit (tests only: the acceptor never sends one
/// except [`build_server_init`]).
#[cfg(test)]
pub(crate) fn build_client_init(mechs: &[&[u8]], mech_token: Option<&[u8]>) -> Vec<u8> {
    let oids: Vec<u8> = mechs.iter().flat_map(|m| tlv(TAG_OID, m)).collect();
    let mut fields = tlv(context(0), &tlv(TAG_SEQUENCE, &oids));
    if let Some(t) = mech_token {
        fields.extend(tlv(context(2), &tlv(TAG_OCTET_STRING, t)));
    }
    let init = tlv(context(0), &tlv(TAG_SEQUENCE, &fields));
    constructed(0x60, &[&tlv(TAG_OID, OID_SPNEGO), &init])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_initial_token_names_its_mechanism() {
        // A bare krb5 AP-REQ token: [APPLICATION 0] { krb5 OID, 01 00, AP-REQ }.
        let krb5 = constructed(0x60, &[&tlv(TAG_OID, OID_KRB5), &[0x01, 0x00, 0x6e, 0x00]]);
        assert_eq!(initial_token_mech(&krb5), Some(OID_KRB5));
        let spnego = build_client_init(&[OID_KRB5], None);
        assert_eq!(initial_token_mech(&spnego), Some(OID_SPNEGO));
        assert_eq!(initial_token_mech(b"NTLMSSP\0"), None);
        assert_eq!(initial_token_mech(&krb5[..3]), None);
        assert_eq!(initial_token_mech(&[]), None);
    }

    #[test]
    fn kerberos_is_found_under_either_oid_and_offered_first() {
        let init = build_client_init(&[OID_NTLMSSP, OID_KRB5, OID_MS_KRB5], None);
        let p = parse_init(&init).unwrap();
        assert_eq!(p.kerberos_position(), Some((1, OID_KRB5)));
        let init = build_client_init(&[OID_MS_KRB5, OID_KRB5, OID_NTLMSSP], None);
        assert_eq!(
            parse_init(&init).unwrap().kerberos_position(),
            Some((0, OID_MS_KRB5))
        );
        let init = build_client_init(&[OID_NTLMSSP], None);
        assert_eq!(parse_init(&init).unwrap().kerberos_position(), None);
        // What the server offers parses back in its order.
        let offer = build_server_init(&[OID_MS_KRB5, OID_KRB5, OID_NTLMSSP]);
        let p = parse_init(&offer).unwrap();
        assert_eq!(p.mechs, vec![OID_MS_KRB5, OID_KRB5, OID_NTLMSSP]);
    }

    /// The NegTokenInit2 Windows and Samba servers send, byte for byte
    /// (mechTypes = [NTLMSSP] only, fixed hint).
    #[test]
    fn server_init_layout() {
        let t = build_server_init(&[OID_NTLMSSP]);
        let want = "6048\
                    06062b0601050502\
                    a03e303c\
                    a00e300c060a2b06010401823702020a\
                    a32a3028a0261b24\
                    6e6f745f646566696e65645f696e5f5246433431373840706c656173655f69676e6f7265";
        let got: String = t.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
        let parsed = parse_init(&t).unwrap();
        assert_eq!(parsed.mechs, vec![OID_NTLMSSP]);
        assert!(parsed.mech_list_mic.is_none());
    }

    #[test]
    fn resp_round_trip() {
        let r = build_resp(
            NegState::AcceptIncomplete,
            Some(OID_NTLMSSP),
            Some(b"tok"),
            Some(b"mic"),
        );
        let p = parse_resp(&r).unwrap();
        assert_eq!(p.neg_state, Some(1));
        assert_eq!(p.supported_mech, Some(OID_NTLMSSP));
        assert_eq!(p.response_token, Some(&b"tok"[..]));
        assert_eq!(p.mech_list_mic, Some(&b"mic"[..]));
    }

    /// A real Windows client NegTokenInit: krb5 (MS), krb5, NEGOEX, NTLMSSP with
    /// an NTLMSSP NEGOTIATE would be long; check the shape with our own encoder
    /// and that every truncation is rejected without panicking.
    #[test]
    fn init_truncations_rejected() {
        let krb5: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02];
        let t = build_client_init(&[krb5, OID_NTLMSSP], Some(b"NTLMSSP\0\x01\0\0\0"));
        let p = parse_init(&t).unwrap();
        assert_eq!(p.ntlm_position(), Some(1));
        assert_eq!(p.mech_types_raw[0], 0x30);
        for n in 0..t.len() {
            assert!(parse_init(&t[..n]).is_err(), "truncation {n}");
        }
    }
}
