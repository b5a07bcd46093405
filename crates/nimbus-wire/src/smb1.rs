//! The one SMB1 message the server looks at: a multi-protocol
//! SMB_COM_NEGOTIATE (MS-SMB 2.2.4.5.1 / MS-CIFS 2.2.4.52.1) that offers SMB2.
//! SMB1 itself is never served; MS-SMB2 3.3.5.3.1 says to answer with an
//! SMB2 NEGOTIATE response.

use crate::codec::Reader;

const SMB_COM_NEGOTIATE: u8 = 0x72;
const SMB1_HEADER_SIZE: usize = 32;

/// What an SMB1 negotiate offers of SMB2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Smb1Offer {
    /// "SMB 2.???": the client can go on with an SMB2 negotiate (answer 0x02FF).
    Wildcard,
    /// Only "SMB 2.002" (answer 0x0202).
    Smb202,
    /// No SMB2 dialect, or not a negotiate at all: disconnect.
    None,
}

pub fn smb1_negotiate_offer(msg: &[u8]) -> Smb1Offer {
    if msg.len() < SMB1_HEADER_SIZE + 3
        || msg[..4] != crate::header::SMB1_PROTOCOL_ID
        || msg[4] != SMB_COM_NEGOTIATE
    {
        return Smb1Offer::None;
    }
    let mut r = Reader::new(&msg[SMB1_HEADER_SIZE..]);
    let Ok(word_count) = r.u8() else {
        return Smb1Offer::None;
    };
    if r.skip(word_count as usize * 2).is_err() {
        return Smb1Offer::None;
    }
    let Ok(byte_count) = r.u16() else {
        return Smb1Offer::None;
    };
    let Ok(bytes) = r.bytes((byte_count as usize).min(r.remaining())) else {
        return Smb1Offer::None;
    };
    // Dialect strings: 0x02 buffer format, then a NUL-terminated ASCII name.
    let mut best = Smb1Offer::None;
    for d in bytes.split(|b| *b == 0) {
        match d.strip_prefix(&[0x02]) {
            Some(b"SMB 2.???") => best = Smb1Offer::Wildcard,
            Some(b"SMB 2.002") if best == Smb1Offer::None => best = Smb1Offer::Smb202,
            _ => {}
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn negotiate(dialects: &[&str]) -> Vec<u8> {
        let mut m = vec![0xFF, b'S', b'M', b'B', SMB_COM_NEGOTIATE];
        m.resize(SMB1_HEADER_SIZE, 0);
        let mut bytes = Vec::new();
        for d in dialects {
            bytes.push(2);
            bytes.extend_from_slice(d.as_bytes());
            bytes.push(0);
        }
        m.push(0);
        m.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        m.extend_from_slice(&bytes);
        m
    }

    #[test]
    fn offers() {
        assert_eq!(
            smb1_negotiate_offer(&negotiate(&["NT LM 0.12", "SMB 2.002", "SMB 2.???"])),
            Smb1Offer::Wildcard
        );
        assert_eq!(
            smb1_negotiate_offer(&negotiate(&["NT LM 0.12", "SMB 2.002"])),
            Smb1Offer::Smb202
        );
        assert_eq!(
            smb1_negotiate_offer(&negotiate(&["NT LM 0.12"])),
            Smb1Offer::None
        );
        let m = negotiate(&["SMB 2.???"]);
        for n in 0..m.len() {
            let _ = smb1_negotiate_offer(&m[..n]);
        }
    }
}
