//! A minimal DER reader and writer, enough for SPNEGO (RFC 4178) tokens.
//!
//! Only what SPNEGO uses is supported: single-byte tags (tag numbers below
//! 31) and definite lengths of at most four length octets. The reader never
//! allocates and checks every length against the input, so it cannot panic or
//! over-read on hostile tokens. Nesting is bounded by construction: the SPNEGO
//! parser walks a fixed schema (at most six levels deep) instead of recursing
//! over arbitrary input.

/// Errors are static strings: the acceptor only reports "malformed".
pub(crate) type DerResult<T> = Result<T, &'static str>;

/// Tag of a SEQUENCE / SEQUENCE OF.
pub(crate) const TAG_SEQUENCE: u8 = 0x30;
/// Tag of an OBJECT IDENTIFIER.
pub(crate) const TAG_OID: u8 = 0x06;
/// Tag of an OCTET STRING.
pub(crate) const TAG_OCTET_STRING: u8 = 0x04;
/// Tag of an ENUMERATED.
pub(crate) const TAG_ENUMERATED: u8 = 0x0a;
/// Tag of a GeneralString.
pub(crate) const TAG_GENERAL_STRING: u8 = 0x1b;

/// Tag of a constructed context-specific field `[n]`.
pub(crate) const fn context(n: u8) -> u8 {
    0xa0 | n
}

/// One decoded tag-length-value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tlv<'a> {
    pub tag: u8,
    /// The value octets.
    pub value: &'a [u8],
    /// The whole encoding, tag and length included (as received, byte-exact).
    pub raw: &'a [u8],
}

/// Reads one TLV from the front of `input`; returns it and the rest.
pub(crate) fn read_tlv(input: &[u8]) -> DerResult<(Tlv<'_>, &[u8])> {
    let (&tag, after_tag) = input.split_first().ok_or("DER: truncated tag")?;
    if tag & 0x1f == 0x1f {
        return Err("DER: multi-byte tags are not supported");
    }
    let (&first, mut rest) = after_tag.split_first().ok_or("DER: truncated length")?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 {
            return Err("DER: indefinite length");
        }
        if n > 4 {
            return Err("DER: length too large");
        }
        if rest.len() < n {
            return Err("DER: truncated length");
        }
        let (octets, r) = rest.split_at(n);
        rest = r;
        octets
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b))
    };
    if rest.len() < len {
        return Err("DER: value runs past the end of the token");
    }
    let header = input.len() - rest.len();
    let (value, rest) = rest.split_at(len);
    let raw = &input[..header + len];
    Ok((Tlv { tag, value, raw }, rest))
}

/// Reads one TLV that must carry `tag`.
pub(crate) fn expect_tlv(input: &[u8], tag: u8) -> DerResult<(Tlv<'_>, &[u8])> {
    let (tlv, rest) = read_tlv(input)?;
    if tlv.tag != tag {
        return Err("DER: unexpected tag");
    }
    Ok((tlv, rest))
}

/// Reads a TLV with `tag` that must fill `input` exactly.
pub(crate) fn expect_only(input: &[u8], tag: u8) -> DerResult<Tlv<'_>> {
    let (tlv, rest) = expect_tlv(input, tag)?;
    if !rest.is_empty() {
        return Err("DER: trailing bytes");
    }
    Ok(tlv)
}

/// Iterates over the TLVs of a constructed value, with an upper bound on
/// their number so a token of many tiny elements cannot cost much.
pub(crate) fn children(value: &[u8], max: usize) -> DerResult<Vec<Tlv<'_>>> {
    let mut out = Vec::new();
    let mut rest = value;
    while !rest.is_empty() {
        if out.len() == max {
            return Err("DER: too many elements");
        }
        let (tlv, r) = read_tlv(rest)?;
        out.push(tlv);
        rest = r;
    }
    Ok(out)
}

/// Encodes a TLV with a minimal definite length.
pub(crate) fn tlv(tag: u8, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 6);
    out.push(tag);
    let len = value.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = (len as u32).to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (4 - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(value);
    out
}

/// Encodes a constructed TLV from already-encoded parts.
pub(crate) fn constructed(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    tlv(tag, &parts.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_short_and_long_lengths() {
        for len in [0usize, 1, 127, 128, 255, 256, 70000] {
            let v = vec![0x5a; len];
            let enc = tlv(TAG_OCTET_STRING, &v);
            let (t, rest) = read_tlv(&enc).unwrap();
            assert!(rest.is_empty());
            assert_eq!(t.tag, TAG_OCTET_STRING);
            assert_eq!(t.value, &v[..]);
            assert_eq!(t.raw, &enc[..]);
        }
        assert_eq!(tlv(0x04, &[0; 128])[..3], [0x04, 0x81, 0x80]);
        assert_eq!(tlv(0x04, &[0; 256])[..4], [0x04, 0x82, 0x01, 0x00]);
    }

    #[test]
    fn rejects_bad_encodings() {
        assert!(read_tlv(&[]).is_err());
        assert!(read_tlv(&[0x04]).is_err());
        assert!(read_tlv(&[0x04, 0x80]).is_err()); // indefinite
        assert!(read_tlv(&[0x04, 0x85, 1, 1, 1, 1, 1]).is_err()); // 5 length octets
        assert!(read_tlv(&[0x04, 0x82, 0x01]).is_err());
        assert!(read_tlv(&[0x04, 0x02, 0x00]).is_err());
        assert!(read_tlv(&[0x1f, 0x01, 0x00]).is_err());
        assert!(read_tlv(&[0x04, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(expect_only(&[0x04, 0x00, 0x00], 0x04).is_err());
        assert!(children(&[0x04, 0x00, 0x04, 0x00, 0x04, 0x00], 2).is_err());
    }
}
