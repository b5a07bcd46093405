//! Records in etcd authenticated between the cluster's nodes: every value
//! a node writes carries an HMAC-SHA256 tag, under a key all nodes share
//! (`[cluster] secret_file`), over the record's full etcd key and its
//! value; a value read without a valid tag is refused.
//!
//! Why, on top of etcd's TLS and roles: every node acts on what it reads
//! there (opens to take over, breaks to send, files to let go of), so
//! whoever can write the cluster's prefix could otherwise make a node act
//! for them: a forged open record reclaimed on another node, say. With
//! the tag, an etcd credential alone (a leaked client certificate, an
//! operator's etcdctl, a backup restored by hand) lets its holder delete
//! or replay records, which a node can only fail on, but not forge one.
//!
//! The full key is in the tag, so a value cannot be moved to another key
//! (another open's id, another node's box, another cluster's prefix). The
//! MAC is aws-lc-rs's HMAC (constant-time verification, the FIPS module in
//! a FIPS build); only the framing, a tag after the value, is ours.

use aws_lc_rs::hmac;

/// Bytes of the tag after each value.
pub const TAG_LEN: usize = 32;

/// The fewest bytes `[cluster] secret_file` must hold: a key guessed is a
/// key forged with.
pub const MIN_SECRET: usize = 32;

/// Tells this use of the cluster secret from any other the secret may
/// one day have (the tag key is derived from it, never the secret itself).
const PURPOSE: &[u8] = b"nimbus etcd record tag v1";

/// The key the tags are made with.
pub struct RecordKey {
    key: hmac::Key,
}

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(..)")
    }
}

/// A cluster secret too short to derive the record key from.
#[derive(Debug, PartialEq, Eq)]
pub struct ShortSecret {
    /// Its length, in bytes.
    pub len: usize,
}

impl std::fmt::Display for ShortSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes; the cluster secret needs at least {MIN_SECRET} random bytes",
            self.len
        )
    }
}

impl std::error::Error for ShortSecret {}

impl RecordKey {
    /// The record key of cluster secret `secret` (the bytes of
    /// `[cluster] secret_file`), or why it cannot be one.
    pub fn from_secret(secret: &[u8]) -> Result<RecordKey, ShortSecret> {
        if secret.len() < MIN_SECRET {
            return Err(ShortSecret { len: secret.len() });
        }
        let derived = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), PURPOSE);
        Ok(RecordKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()),
        })
    }

    fn context(&self, full_key: &[u8]) -> hmac::Context {
        let mut cx = hmac::Context::with_key(&self.key);
        // The key's length first: key and value cannot be split elsewhere.
        cx.update(&(full_key.len() as u64).to_be_bytes());
        cx.update(full_key);
        cx
    }

    /// `value` as it is written under `full_key`: the value, then its tag.
    pub fn seal(&self, full_key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut cx = self.context(full_key);
        cx.update(value);
        let tag = cx.sign();
        let mut out = Vec::with_capacity(value.len() + TAG_LEN);
        out.extend_from_slice(value);
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// The value of `sealed` as read under `full_key`, if its tag is one
    /// this key made for that key and value.
    pub fn open<'a>(&self, full_key: &[u8], sealed: &'a [u8]) -> Option<&'a [u8]> {
        let split = sealed.len().checked_sub(TAG_LEN)?;
        let (value, tag) = sealed.split_at(split);
        let mut cx = self.context(full_key);
        cx.update(value);
        let expected = cx.sign();
        aws_lc_rs::constant_time::verify_slices_are_equal(expected.as_ref(), tag)
            .ok()
            .map(|()| value)
    }
}

/// Why a record was refused.
pub const FORGED: &str = "a record in etcd without a valid tag of this cluster's secret \
                          (written by something other than a node of this cluster, or by \
                          one with another [cluster] secret_file)";

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> RecordKey {
        RecordKey::from_secret(&[byte; MIN_SECRET]).unwrap()
    }

    #[test]
    fn a_sealed_value_opens_only_under_its_key_and_secret() {
        let k = key(7);
        let sealed = k.seal(b"/nimbus/open/1", b"record");
        assert_eq!(sealed.len(), 6 + TAG_LEN);
        assert_eq!(k.open(b"/nimbus/open/1", &sealed), Some(&b"record"[..]));
        // Another key, another secret, a changed value or tag, a short value.
        assert_eq!(k.open(b"/nimbus/open/2", &sealed), None);
        assert_eq!(key(8).open(b"/nimbus/open/1", &sealed), None);
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert_eq!(k.open(b"/nimbus/open/1", &bad), None, "byte {i} flipped");
        }
        assert_eq!(k.open(b"/nimbus/open/1", &sealed[1..]), None);
        assert_eq!(k.open(b"/nimbus/open/1", b"short"), None);
        // The split between key and value is fixed by the key's length.
        let tag = &k.seal(b"ab", b"c")[1..];
        assert_eq!(k.open(b"a", &[&b"bc"[..], tag].concat()), None);
        // An empty value is sealed too.
        assert_eq!(k.open(b"k", &k.seal(b"k", b"")), Some(&b""[..]));
    }

    #[test]
    fn a_short_secret_is_refused() {
        assert!(RecordKey::from_secret(&[1; MIN_SECRET - 1]).is_err());
    }
}
