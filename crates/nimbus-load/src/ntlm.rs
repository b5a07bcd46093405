//! The client's half of NTLMv2 (MS-NLMP 3.1.5, 3.3.2), as raw NTLMSSP
//! tokens in SESSION_SETUP: enough to log on to Nimbus and Samba with a
//! user and password and to derive the session key both ends sign with.
//! Written here because no maintained Rust crate offers an NTLM client
//! that takes its primitives from our CryptoProvider; the server's own
//! half (nimbus-auth) is the acceptor and shares no code path with this.

use std::time::{SystemTime, UNIX_EPOCH};

use nimbus_crypto::{CryptoProvider, NtlmPrimitives};
use nimbus_wire::codec::{utf16le, Put, Reader};

const SIGNATURE: &[u8; 8] = b"NTLMSSP\0";

/// MS-NLMP 2.2.2.5 NEGOTIATE flags this client sets.
const FLAGS: u32 = 0x0000_0001 // UNICODE
    | 0x0000_0004 // REQUEST_TARGET
    | 0x0000_0010 // SIGN
    | 0x0000_0200 // NTLM
    | 0x0000_8000 // ALWAYS_SIGN
    | 0x0008_0000 // EXTENDED_SESSIONSECURITY
    | 0x0080_0000 // TARGET_INFO
    | 0x2000_0000 // 128
    | 0x4000_0000 // KEY_EXCH
    | 0x8000_0000; // 56

/// MS-NLMP 2.2.2.1 AvId of MsvAvTimestamp.
const AV_TIMESTAMP: u16 = 7;

/// MS-NLMP 2.2.1.1 NEGOTIATE_MESSAGE: no domain or workstation supplied.
pub fn negotiate() -> Vec<u8> {
    let mut m = Vec::with_capacity(32);
    m.extend_from_slice(SIGNATURE);
    m.put_u32(1);
    m.put_u32(FLAGS);
    m.put_zeros(16);
    m
}

/// What the AUTHENTICATE message needs from the CHALLENGE_MESSAGE
/// (MS-NLMP 2.2.1.2).
struct Challenge<'a> {
    flags: u32,
    server_challenge: [u8; 8],
    target_info: &'a [u8],
}

fn parse_challenge(m: &[u8]) -> Result<Challenge<'_>, String> {
    let short = |_| "CHALLENGE_MESSAGE cut short".to_string();
    let mut r = Reader::new(m);
    if r.bytes(8).ok() != Some(&SIGNATURE[..]) || r.u32().ok() != Some(2) {
        return Err("the server's token is not an NTLM CHALLENGE_MESSAGE".into());
    }
    // TargetNameFields, then NegotiateFlags and ServerChallenge.
    r.skip(8).map_err(short)?;
    let flags = r.u32().map_err(short)?;
    let server_challenge = r.array::<8>().map_err(short)?;
    // Reserved, then TargetInfoFields: Len, MaxLen, BufferOffset.
    r.skip(8).map_err(short)?;
    let len = r.u16().map_err(short)? as usize;
    r.skip(2).map_err(short)?;
    let off = r.u32().map_err(short)? as usize;
    let target_info = off
        .checked_add(len)
        .and_then(|end| m.get(off..end))
        .ok_or("CHALLENGE_MESSAGE's TargetInfo lies outside it")?;
    Ok(Challenge {
        flags,
        server_challenge,
        target_info,
    })
}

/// MsvAvTimestamp's value, if the server sent one (MS-NLMP 3.1.5.1.2: the
/// client then uses it as its own time).
fn timestamp(pairs: &[u8]) -> Option<u64> {
    let mut r = Reader::new(pairs);
    while r.remaining() >= 4 {
        let id = r.u16().ok()?;
        let len = r.u16().ok()? as usize;
        let value = r.bytes(len).ok()?;
        if id == 0 {
            return None;
        }
        if id == AV_TIMESTAMP && len == 8 {
            return Some(u64::from_le_bytes(value.try_into().ok()?));
        }
    }
    None
}

fn filetime_now() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (since.as_secs() + 11_644_473_600) * 10_000_000 + u64::from(since.subsec_nanos() / 100)
}

/// The AUTHENTICATE_MESSAGE (MS-NLMP 2.2.1.3) answering `challenge`, and
/// the exported session key (3.3.2 with KEY_EXCH: a random key sent
/// RC4-encrypted under the session base key).
pub fn authenticate(
    provider: &CryptoProvider,
    challenge: &[u8],
    user: &str,
    domain: &str,
    password: &str,
) -> Result<(Vec<u8>, [u8; 16]), String> {
    let ntlm: &dyn NtlmPrimitives = provider
        .ntlm()
        .ok_or("this crypto provider offers no NTLM primitives (FIPS)")?;
    let c = parse_challenge(challenge)?;
    // NTOWFv2 (MS-NLMP 3.3.2).
    let nt_hash = ntlm.md4(&utf16le(password));
    let identity = utf16le(&(user.to_uppercase() + domain));
    let response_key = ntlm.hmac_md5(&nt_hash, &[&identity]);
    let mut client_challenge = [0u8; 8];
    provider.fill_random(&mut client_challenge);
    let time = timestamp(c.target_info).unwrap_or_else(filetime_now);
    // temp: Responserversion, HiResponserversion, Z(6), Time,
    // ClientChallenge, Z(4), ServerName (the AV pairs), Z(4).
    let mut temp = vec![1u8, 1, 0, 0, 0, 0, 0, 0];
    temp.put_u64(time);
    temp.extend_from_slice(&client_challenge);
    temp.put_zeros(4);
    temp.extend_from_slice(c.target_info);
    temp.put_zeros(4);
    let proof = ntlm.hmac_md5(&response_key, &[&c.server_challenge, &temp]);
    let mut nt_response = proof.to_vec();
    nt_response.extend_from_slice(&temp);
    let base_key = ntlm.hmac_md5(&response_key, &[&proof]);
    let mut exported = [0u8; 16];
    let mut encrypted_key = Vec::new();
    if c.flags & FLAGS & 0x4000_0000 != 0 {
        provider.fill_random(&mut exported);
        encrypted_key = exported.to_vec();
        ntlm.rc4(&base_key, &mut encrypted_key);
    } else {
        exported = base_key;
    }
    // With a timestamp from the server, LmChallengeResponse is Z(24).
    let lm_response = [0u8; 24];
    let fields: [&[u8]; 6] = [
        &lm_response,
        &nt_response,
        &utf16le(domain),
        &utf16le(user),
        &[],
        &encrypted_key,
    ];
    const HEAD: usize = 64;
    let mut m = Vec::with_capacity(HEAD + fields.iter().map(|f| f.len()).sum::<usize>());
    m.extend_from_slice(SIGNATURE);
    m.put_u32(3);
    let mut at = HEAD;
    for f in &fields {
        m.put_u16(f.len() as u16);
        m.put_u16(f.len() as u16);
        m.put_u32(at as u32);
        at += f.len();
    }
    m.put_u32(FLAGS & c.flags);
    for f in &fields {
        m.extend_from_slice(f);
    }
    Ok((m, exported))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_challenge_cut_short_or_pointing_outside_is_refused() {
        assert!(parse_challenge(b"NTLMSSP\0").is_err());
        let mut m = b"NTLMSSP\0".to_vec();
        m.put_u32(2);
        m.put_zeros(28);
        // TargetInfoFields (offset 40): 4 bytes at 1000, beyond the message.
        m.put_u16(4);
        m.put_u16(4);
        m.put_u32(1000);
        m.put_zeros(8);
        assert!(parse_challenge(&m).is_err());
        m[44..48].copy_from_slice(&48u32.to_le_bytes());
        assert!(parse_challenge(&m).is_ok());
    }

    #[test]
    fn the_server_timestamp_is_found_among_the_av_pairs() {
        let mut pairs = Vec::new();
        pairs.put_u16(2);
        pairs.put_u16(2);
        pairs.put_u16(0x41);
        pairs.put_u16(AV_TIMESTAMP);
        pairs.put_u16(8);
        pairs.put_u64(0x0123_4567_89ab_cdef);
        pairs.put_u32(0);
        assert_eq!(timestamp(&pairs), Some(0x0123_4567_89ab_cdef));
        assert_eq!(timestamp(&pairs[..6]), None);
    }
}
