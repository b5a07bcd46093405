//! NTLMSSP messages and the NTLMv2 computations of MS-NLMP.

use nimbus_crypto::{NtlmPrimitives, Rc4Stream};

/// Every NTLMSSP message starts with this (MS-NLMP 2.2.1).
pub(crate) const SIGNATURE: &[u8; 8] = b"NTLMSSP\0";

/// NegotiateFlags bits (MS-NLMP 2.2.2.5).
pub(crate) mod flags {
    pub const UNICODE: u32 = 0x0000_0001;
    pub const REQUEST_TARGET: u32 = 0x0000_0004;
    pub const SIGN: u32 = 0x0000_0010;
    pub const SEAL: u32 = 0x0000_0020;
    pub const NTLM: u32 = 0x0000_0200;
    pub const ANONYMOUS: u32 = 0x0000_0800;
    pub const ALWAYS_SIGN: u32 = 0x0000_8000;
    pub const TARGET_TYPE_SERVER: u32 = 0x0002_0000;
    pub const EXTENDED_SESSIONSECURITY: u32 = 0x0008_0000;
    pub const TARGET_INFO: u32 = 0x0080_0000;
    pub const VERSION: u32 = 0x0200_0000;
    pub const NEGOTIATE_128: u32 = 0x2000_0000;
    pub const KEY_EXCH: u32 = 0x4000_0000;
    pub const NEGOTIATE_56: u32 = 0x8000_0000;
}

/// AV_PAIR AvId values (MS-NLMP 2.2.2.1).
pub(crate) mod av {
    pub const EOL: u16 = 0;
    pub const NB_COMPUTER_NAME: u16 = 1;
    pub const NB_DOMAIN_NAME: u16 = 2;
    pub const DNS_COMPUTER_NAME: u16 = 3;
    pub const DNS_DOMAIN_NAME: u16 = 4;
    pub const FLAGS: u16 = 6;
    pub const TIMESTAMP: u16 = 7;
    /// MsvAvTargetName: the SPN the client meant to reach, e.g. "cifs/host".
    pub const TARGET_NAME: u16 = 9;
    /// MsvAvChannelBindings: MD5 of the client's gss_channel_bindings_struct,
    /// or all zero without a channel.
    pub const CHANNEL_BINDINGS: u16 = 10;
    /// MsvAvFlags bit: the AUTHENTICATE message carries a MIC.
    pub const FLAG_MIC_PRESENT: u32 = 0x0000_0002;
}

/// VERSION structure we announce (MS-NLMP 2.2.2.10): 6.1 build 7601, NTLM
/// revision 15, which is what clients expect from a modern server.
pub(crate) const SERVER_VERSION: [u8; 8] = [6, 1, 0xb1, 0x1d, 0, 0, 0, 15];

/// Offset of the MIC in AUTHENTICATE_MESSAGE (MS-NLMP 2.2.1.3), after the
/// 8-byte Version field.
pub(crate) const MIC_OFFSET: usize = 72;
/// Size of the AUTHENTICATE header when a MIC is present.
const AUTH_HEADER_WITH_MIC: usize = MIC_OFFSET + 16;
/// Size of the fixed AUTHENTICATE header without Version and MIC.
const AUTH_HEADER_MIN: usize = 64;
/// Size of NTLMv2_CLIENT_CHALLENGE before its AvPairs (MS-NLMP 2.2.2.7).
pub(crate) const CLIENT_CHALLENGE_FIXED: usize = 28;
/// Most AV pairs we walk in a client blob; Windows sends about ten.
const MAX_AV_PAIRS: usize = 64;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Checks the signature and MessageType common to all three messages.
fn check_header(msg: &[u8], message_type: u32) -> Result<(), &'static str> {
    if msg.get(..8) != Some(&SIGNATURE[..]) {
        return Err("NTLMSSP: bad signature");
    }
    if u32_at(msg, 8) != Some(message_type) {
        return Err("NTLMSSP: unexpected message type");
    }
    Ok(())
}

/// MS-NLMP 2.2.1.1 NEGOTIATE_MESSAGE. Only the flags matter to the server;
/// the domain and workstation hints are ignored (clients rarely send them).
pub(crate) fn parse_negotiate(msg: &[u8]) -> Result<u32, &'static str> {
    check_header(msg, 1)?;
    u32_at(msg, 12).ok_or("NTLMSSP: NEGOTIATE too short")
}

/// Reads a (Len, MaxLen, BufferOffset) field descriptor (MS-NLMP 2.2.1.3)
/// at `at` and returns the bytes it points to and its offset.
fn field(msg: &[u8], at: usize) -> Result<(&[u8], usize), &'static str> {
    let len = usize::from(u16_at(msg, at).ok_or("NTLMSSP: truncated header")?);
    let off = u32_at(msg, at + 4).ok_or("NTLMSSP: truncated header")? as usize;
    if len == 0 {
        // Empty fields may carry any offset; they point at nothing.
        return Ok((&[], usize::MAX));
    }
    let end = off.checked_add(len).ok_or("NTLMSSP: field overflows")?;
    let data = msg
        .get(off..end)
        .ok_or("NTLMSSP: field runs past the message")?;
    Ok((data, off))
}

/// MS-NLMP 2.2.1.3 AUTHENTICATE_MESSAGE, fields borrowed from the message.
#[derive(Debug)]
pub(crate) struct AuthenticateMessage<'a> {
    pub lm_response: &'a [u8],
    pub nt_response: &'a [u8],
    pub domain: &'a [u8],
    pub user: &'a [u8],
    pub encrypted_session_key: &'a [u8],
    pub flags: u32,
    /// Whether the header is long enough to hold Version and MIC, i.e. every
    /// payload field starts at or after offset 88.
    pub has_mic_room: bool,
}

pub(crate) fn parse_authenticate(msg: &[u8]) -> Result<AuthenticateMessage<'_>, &'static str> {
    check_header(msg, 3)?;
    if msg.len() < AUTH_HEADER_MIN {
        return Err("NTLMSSP: AUTHENTICATE too short");
    }
    let (lm_response, o1) = field(msg, 12)?;
    let (nt_response, o2) = field(msg, 20)?;
    let (domain, o3) = field(msg, 28)?;
    let (user, o4) = field(msg, 36)?;
    let (_workstation, o5) = field(msg, 44)?;
    let (encrypted_session_key, o6) = field(msg, 52)?;
    let flags = u32_at(msg, 60).ok_or("NTLMSSP: AUTHENTICATE too short")?;
    let payload_start = [o1, o2, o3, o4, o5, o6]
        .into_iter()
        .min()
        .unwrap_or(usize::MAX);
    if payload_start < AUTH_HEADER_MIN {
        return Err("NTLMSSP: payload overlaps the header");
    }
    let has_mic_room = msg.len() >= AUTH_HEADER_WITH_MIC && payload_start >= AUTH_HEADER_WITH_MIC;
    Ok(AuthenticateMessage {
        lm_response,
        nt_response,
        domain,
        user,
        encrypted_session_key,
        flags,
        has_mic_room,
    })
}

/// Finds AV pair `id` in an AV_PAIR list (MS-NLMP 2.2.2.1); stops at MsvAvEOL.
pub(crate) fn find_av_pair(mut pairs: &[u8], id: u16) -> Result<Option<&[u8]>, &'static str> {
    for _ in 0..MAX_AV_PAIRS {
        let (Some(av_id), Some(len)) = (u16_at(pairs, 0), u16_at(pairs, 2)) else {
            // A list without EOL: tolerated (the blob may be padded oddly),
            // but nothing more can be found.
            return Ok(None);
        };
        if av_id == av::EOL {
            return Ok(None);
        }
        let value = pairs
            .get(4..4 + usize::from(len))
            .ok_or("NTLMSSP: AV pair runs past the blob")?;
        if av_id == id {
            return Ok(Some(value));
        }
        pairs = &pairs[4 + usize::from(len)..];
    }
    Err("NTLMSSP: too many AV pairs")
}

/// Appends one AV_PAIR.
pub(crate) fn push_av_pair(out: &mut Vec<u8>, id: u16, value: &[u8]) {
    out.extend_from_slice(&id.to_le_bytes());
    // Values are our own configuration strings; clamp rather than wrap.
    let len = u16::try_from(value.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&value[..usize::from(len)]);
}

/// MS-NLMP 2.2.1.2 CHALLENGE_MESSAGE.
pub(crate) fn build_challenge(
    flags: u32,
    server_challenge: &[u8; 8],
    target_name: &[u8],
    target_info: &[u8],
) -> Vec<u8> {
    const HEADER: usize = 56;
    let mut m = Vec::with_capacity(HEADER + target_name.len() + target_info.len());
    m.extend_from_slice(SIGNATURE);
    m.extend_from_slice(&2u32.to_le_bytes());
    let name_len = target_name.len().min(usize::from(u16::MAX)) as u16;
    let info_len = target_info.len().min(usize::from(u16::MAX)) as u16;
    // TargetNameFields
    m.extend_from_slice(&name_len.to_le_bytes());
    m.extend_from_slice(&name_len.to_le_bytes());
    m.extend_from_slice(&(HEADER as u32).to_le_bytes());
    m.extend_from_slice(&flags.to_le_bytes());
    m.extend_from_slice(server_challenge);
    m.extend_from_slice(&[0u8; 8]); // Reserved
                                    // TargetInfoFields
    m.extend_from_slice(&info_len.to_le_bytes());
    m.extend_from_slice(&info_len.to_le_bytes());
    m.extend_from_slice(&((HEADER + usize::from(name_len)) as u32).to_le_bytes());
    if flags & flags::VERSION != 0 {
        m.extend_from_slice(&SERVER_VERSION);
    } else {
        m.extend_from_slice(&[0u8; 8]);
    }
    m.extend_from_slice(&target_name[..usize::from(name_len)]);
    m.extend_from_slice(&target_info[..usize::from(info_len)]);
    m
}

/// NTOWFv2 (MS-NLMP 3.3.2): HMAC_MD5(NT hash, UTF16LE(UPPER(user) || domain)).
pub(crate) fn ntowfv2(
    ntlm: &dyn NtlmPrimitives,
    nt_hash: &[u8; 16],
    user: &str,
    domain: &str,
) -> [u8; 16] {
    let upper = crate::userdb::utf16le(&user.to_uppercase());
    let dom = crate::userdb::utf16le(domain);
    count_hmac();
    ntlm.hmac_md5(nt_hash, &[&upper, &dom])
}

/// Checks an NTLMv2 response (MS-NLMP 3.3.2, 3.2.5.1.2): for each domain
/// spelling in turn, ResponseKeyNT = NTOWFv2(nt_hash, user, domain) and
/// NTProofStr = HMAC_MD5(ResponseKeyNT, ServerChallenge || blob), compared
/// in constant time with the client's. Returns the ResponseKeyNT that
/// matched. A wrong password always costs `2 * domains.len()` HMACs,
/// whatever the hash, which is what lets unknown users be checked against
/// a dummy hash at the same cost as known ones.
pub(crate) fn ntlmv2_response_key(
    ntlm: &dyn NtlmPrimitives,
    nt_hash: &[u8; 16],
    user: &str,
    domains: &[&str],
    server_challenge: &[u8; 8],
    nt_proof: &[u8],
    blob: &[u8],
) -> Option<zeroize::Zeroizing<[u8; 16]>> {
    for d in domains {
        let key = zeroize::Zeroizing::new(ntowfv2(ntlm, nt_hash, user, d));
        count_hmac();
        let expected = ntlm.hmac_md5(&key[..], &[server_challenge, blob]);
        if nimbus_crypto::ct_eq(&expected, nt_proof) {
            return Some(key);
        }
    }
    None
}

#[cfg(test)]
thread_local! {
    /// HMACs computed by this thread's response checks (tests only).
    pub(crate) static HMACS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[inline]
fn count_hmac() {
    #[cfg(test)]
    HMACS.with(|c| c.set(c.get() + 1));
}

const CLIENT_SIGN_MAGIC: &[u8] = b"session key to client-to-server signing key magic constant\0";
const SERVER_SIGN_MAGIC: &[u8] = b"session key to server-to-client signing key magic constant\0";
const CLIENT_SEAL_MAGIC: &[u8] = b"session key to client-to-server sealing key magic constant\0";
const SERVER_SEAL_MAGIC: &[u8] = b"session key to server-to-client sealing key magic constant\0";

/// Which end a key belongs to.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Direction {
    ClientToServer,
    ServerToClient,
}

/// SIGNKEY with extended session security (MS-NLMP 3.4.5.2).
pub(crate) fn sign_key(ntlm: &dyn NtlmPrimitives, exported: &[u8; 16], dir: Direction) -> [u8; 16] {
    let magic = match dir {
        Direction::ClientToServer => CLIENT_SIGN_MAGIC,
        Direction::ServerToClient => SERVER_SIGN_MAGIC,
    };
    ntlm.md5(&[exported, magic])
}

/// SEALKEY with extended session security (MS-NLMP 3.4.5.3): the session
/// key weakened to 56 or 40 bits unless NEGOTIATE_128, then MD5 with magic.
pub(crate) fn seal_key(
    ntlm: &dyn NtlmPrimitives,
    exported: &[u8; 16],
    neg_flags: u32,
    dir: Direction,
) -> [u8; 16] {
    let key: &[u8] = if neg_flags & flags::NEGOTIATE_128 != 0 {
        exported
    } else if neg_flags & flags::NEGOTIATE_56 != 0 {
        &exported[..7]
    } else {
        &exported[..5]
    };
    let magic = match dir {
        Direction::ClientToServer => CLIENT_SEAL_MAGIC,
        Direction::ServerToClient => SERVER_SEAL_MAGIC,
    };
    ntlm.md5(&[key, magic])
}

/// NTLMSSP_MESSAGE_SIGNATURE with extended session security (MS-NLMP
/// 2.2.2.9.1, 3.4.4.2): Version 1, the first 8 bytes of
/// HMAC_MD5(SigningKey, SeqNum || message) - RC4-encrypted with the sealing
/// handle when KEY_EXCH was negotiated - and SeqNum.
pub(crate) fn mac(
    ntlm: &dyn NtlmPrimitives,
    sign_key: &[u8; 16],
    seal: Option<&mut (dyn Rc4Stream + 'static)>,
    seq: u32,
    message: &[u8],
) -> [u8; 16] {
    let full = ntlm.hmac_md5(sign_key, &[&seq.to_le_bytes(), message]);
    let mut checksum = [0u8; 8];
    checksum.copy_from_slice(&full[..8]);
    if let Some(s) = seal {
        s.apply(&mut checksum);
    }
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&1u32.to_le_bytes());
    out[4..12].copy_from_slice(&checksum);
    out[12..].copy_from_slice(&seq.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_crypto::CryptoProvider;

    fn h(s: &str) -> Vec<u8> {
        hex::decode(s).unwrap()
    }

    fn h16(s: &str) -> [u8; 16] {
        h(s).try_into().unwrap()
    }

    /// MS-NLMP 4.2.4: NTLMv2 with User/Domain/Password, server challenge
    /// 0123456789abcdef, client challenge aa.., time 0, random session key 55..
    #[test]
    fn ms_nlmp_4_2_4_ntlmv2() {
        let p = CryptoProvider::default_provider();
        let ntlm = p.ntlm().unwrap();
        let nt_hash = ntlm.md4(&crate::userdb::utf16le("Password"));
        assert_eq!(nt_hash, h16("a4f49c406510bdcab6824ee7c30fd852"));

        // 4.2.4.1.1 NTOWFv2
        let owf = ntowfv2(ntlm, &nt_hash, "User", "Domain");
        assert_eq!(owf, h16("0c868a403bfd7a93a3001ef22ef02e3f"));

        // 4.2.4.2.2 NTLMv2 response: NTProofStr over ServerChallenge || temp.
        let server_challenge = h("0123456789abcdef");
        let temp = h("01010000000000000000000000000000aaaaaaaaaaaaaaaa00000000\
                      02000c0044006f006d00610069006e0001000c005300650072007600650072000000000000000000");
        let proof = ntlm.hmac_md5(&owf, &[&server_challenge, &temp]);
        assert_eq!(proof, h16("68cd0ab851e51c96aabc927bebef6a1c"));

        // 4.2.4.1.2 SessionBaseKey
        let base = ntlm.hmac_md5(&owf, &[&proof]);
        assert_eq!(base, h16("8de40ccadbc14a82f15cb0ad0de95ca3"));

        // 4.2.4.2.3 EncryptedSessionKey = RC4(KeyExchangeKey, RandomSessionKey)
        let mut key = [0x55u8; 16];
        ntlm.rc4(&base, &mut key);
        assert_eq!(key, h16("c5dad2544fc9799094ce1ce90bc9d03e"));
        // ...and the acceptor's direction: decrypt back.
        ntlm.rc4(&base, &mut key);
        assert_eq!(key, [0x55; 16]);
    }

    /// MS-NLMP 4.2.4.4 GSS_WrapEx: client keys from session key 55.., then
    /// "Plaintext" sealed and signed (seq 0) with one RC4 handle.
    #[test]
    fn ms_nlmp_4_2_4_4_wrap() {
        let p = CryptoProvider::default_provider();
        let ntlm = p.ntlm().unwrap();
        let exported = [0x55u8; 16];
        let neg = flags::NEGOTIATE_128 | flags::KEY_EXCH | flags::EXTENDED_SESSIONSECURITY;
        let sk = sign_key(ntlm, &exported, Direction::ClientToServer);
        let ck = seal_key(ntlm, &exported, neg, Direction::ClientToServer);
        assert_eq!(sk, h16("4788dc861b4782f35d43fd98fe1a2d39"));
        assert_eq!(ck, h16("59f600973cc4960a25480a7c196e4c58"));

        let plaintext = crate::userdb::utf16le("Plaintext");
        let mut sealed = plaintext.clone();
        let mut handle = ntlm.rc4_stream(&ck);
        handle.apply(&mut sealed);
        assert_eq!(sealed, h("54e50165bf1936dc996020c1811b0f06fb5f"));
        let sig = mac(ntlm, &sk, Some(handle.as_mut()), 0, &plaintext);
        assert_eq!(sig.to_vec(), h("010000007fb38ec5c55d497600000000"));

        // The server-to-client direction of the same example.
        let sk = sign_key(ntlm, &exported, Direction::ServerToClient);
        let ck = seal_key(ntlm, &exported, neg, Direction::ServerToClient);
        let mut sealed = plaintext.clone();
        let mut handle = ntlm.rc4_stream(&ck);
        handle.apply(&mut sealed);
        assert_eq!(sealed, h("160871b730ba74e946c453d7465b54278dd0"));
        let sig = mac(ntlm, &sk, Some(handle.as_mut()), 0, &plaintext);
        assert_eq!(sig.to_vec(), h("01000000b298b847ce7c580700000000"));
    }

    #[test]
    fn av_pairs_bounded() {
        let mut l = Vec::new();
        push_av_pair(&mut l, av::NB_DOMAIN_NAME, b"D\0");
        push_av_pair(&mut l, av::FLAGS, &2u32.to_le_bytes());
        push_av_pair(&mut l, av::EOL, &[]);
        assert_eq!(
            find_av_pair(&l, av::FLAGS).unwrap(),
            Some(&2u32.to_le_bytes()[..])
        );
        assert_eq!(find_av_pair(&l, av::TIMESTAMP).unwrap(), None);
        assert!(find_av_pair(&[6, 0, 10, 0, 1], av::FLAGS).is_err());
        assert_eq!(find_av_pair(&[6], av::FLAGS).unwrap(), None);
    }

    #[test]
    fn authenticate_field_bounds() {
        let mut m = vec![0u8; 88];
        m[..8].copy_from_slice(SIGNATURE);
        m[8] = 3;
        // NtChallengeResponse: len 10 at offset 85 -> past the end.
        m[20] = 10;
        m[24] = 85;
        assert!(parse_authenticate(&m).is_err());
        // Offset u32::MAX must not overflow.
        m[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_authenticate(&m).is_err());
        // Payload overlapping the header is refused.
        m[24..28].copy_from_slice(&8u32.to_le_bytes());
        assert!(parse_authenticate(&m).is_err());
    }
}
