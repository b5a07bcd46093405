//! The pieces of the node-to-node requests a client's request waits on
//! (`crate::session_handover`, `crate::app_instance_handover`): numbers
//! little-endian, strings as a 16-bit length and UTF-8, each bounded, and
//! nothing left over. Values from etcd are untrusted: anything else is
//! refused, never allocated past the message.

/// Longest string a message carries (a node name, a user or domain name, a
/// share name, a SID); longer ones are cut when writing and refused when
/// reading.
pub const MAX_STRING: usize = 1024;

/// Appends `strings`, each cut at `MAX_STRING` bytes (at a character's
/// start, so that what is sent still decodes).
pub fn put_strings(v: &mut Vec<u8>, strings: &[&str]) {
    for s in strings {
        let mut end = s.len().min(MAX_STRING);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        let b = &s.as_bytes()[..end];
        v.extend_from_slice(&(b.len() as u16).to_le_bytes());
        v.extend_from_slice(b);
    }
}

/// Exactly `N` strings, ending the message; None otherwise.
pub fn take_strings<const N: usize>(mut rest: &[u8]) -> Option<[String; N]> {
    let mut strings: [String; N] = std::array::from_fn(|_| String::new());
    for s in &mut strings {
        let (len, tail) = rest.split_first_chunk::<2>()?;
        let len = u16::from_le_bytes(*len) as usize;
        if len > MAX_STRING || tail.len() < len {
            return None;
        }
        *s = String::from_utf8(tail[..len].to_vec()).ok()?;
        rest = &tail[len..];
    }
    rest.is_empty().then_some(strings)
}

/// A little-endian u64 and what follows it.
pub fn take_u64(b: &[u8]) -> Option<(u64, &[u8])> {
    let (n, rest) = b.split_first_chunk::<8>()?;
    Some((u64::from_le_bytes(*n), rest))
}

/// A request number and a yes or no, ending the message: the answers.
pub fn take_answer(b: &[u8]) -> Option<(u64, bool)> {
    match take_u64(b)? {
        (nonce, [0]) => Some((nonce, false)),
        (nonce, [1]) => Some((nonce, true)),
        _ => None,
    }
}

/// An answer: tag, request number, yes or no.
pub fn answer(tag: u8, nonce: u64, yes: bool) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&nonce.to_le_bytes());
    v.push(yes as u8);
    v
}

/// For the message modules' tests: `decode` refuses every message cut
/// short of `whole`, and `whole` with a byte more.
#[cfg(test)]
pub fn assert_refuses_cuts_and_extras<T>(whole: &[u8], decode: impl Fn(&[u8]) -> Option<T>) {
    for len in 0..whole.len() {
        assert!(decode(&whole[..len]).is_none(), "cut at {len}");
    }
    let mut longer = whole.to_vec();
    longer.push(0);
    assert!(decode(&longer).is_none(), "a byte more");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_round_trip_and_a_long_one_is_refused() {
        let mut v = Vec::new();
        put_strings(&mut v, &["n1", "", "S-1-5-21-9"]);
        assert_eq!(
            take_strings::<3>(&v),
            Some(["n1".to_string(), String::new(), "S-1-5-21-9".to_string()])
        );
        assert_eq!(take_strings::<2>(&v), None, "left over");
        let mut long = ((MAX_STRING + 1) as u16).to_le_bytes().to_vec();
        long.extend(vec![b'a'; MAX_STRING + 1]);
        assert_eq!(take_strings::<1>(&long), None);
        assert_eq!(
            take_strings::<1>(&[0xff, 0xff, b'a']),
            None,
            "longer than the message"
        );
        // Cut inside a two-byte character: cut before it instead.
        let name = format!("{}é", "a".repeat(MAX_STRING - 1));
        let mut v = Vec::new();
        put_strings(&mut v, &[&name]);
        assert_eq!(take_strings::<1>(&v), Some(["a".repeat(MAX_STRING - 1)]));
    }
}
