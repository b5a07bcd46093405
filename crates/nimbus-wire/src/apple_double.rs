//! AppleDouble files (`._name`): where macOS keeps a file's Finder
//! information, resource fork and extended attributes on a file system
//! that has no place for them (FAT, a server without streams, a tar
//! archive). Layout of RFC 1740 (AppleSingle/AppleDouble version 2), all
//! integers big-endian:
//!
//! - header: magic 0x00051607, version 0x00020000, 16 bytes of filler
//!   ("Mac OS X        " when macOS wrote it), entry count (u16);
//! - entries of 12 bytes: id (u32), offset (u32), length (u32); id 9 is the
//!   Finder information, id 2 the resource fork.
//!
//! macOS stores the extended attributes inside the Finder information
//! entry, after its 32 bytes and 2 bytes of padding: an "ATTR" header
//! (magic, debug tag, total size, data start, data length, 3 reserved
//! u32, flags u16, count u16) and entries of offset (u32, from the start
//! of the file), length (u32), flags (u16), name length (u8, the NUL
//! included) and the name, each entry 4-byte aligned.

use crate::codec::{WireError, WireResult};

pub const MAGIC: u32 = 0x0005_1607;
pub const VERSION: u32 = 0x0002_0000;
/// The filler of an AppleDouble file macOS wrote; only those carry
/// extended attributes in this layout.
pub const MACOS_FILLER: &[u8; 16] = b"Mac OS X        ";
pub const ENTRY_RESOURCE_FORK: u32 = 2;
pub const ENTRY_FINDER_INFO: u32 = 9;
const FINDER_INFO_LEN: usize = 32;
const ATTR_MAGIC: &[u8; 4] = b"ATTR";
const HEADER_LEN: usize = 26;
const ENTRY_LEN: usize = 12;
const ATTR_HEADER_LEN: usize = 36;
/// More entries than RFC 1740 defines kinds of (15) is no AppleDouble file.
const MAX_ENTRIES: usize = 32;

/// What an AppleDouble file holds.
#[derive(Debug, PartialEq, Eq)]
pub struct AppleDouble<'a> {
    /// The 32 bytes of Finder information.
    pub finder_info: Option<&'a [u8]>,
    /// Where the resource fork lies in the file: (offset, length).
    pub resource_fork: Option<(u64, u64)>,
    /// Extended attributes: name (UTF-8, as macOS names them) and value.
    pub xattrs: Vec<(String, &'a [u8])>,
}

fn be32(b: &[u8], at: usize) -> WireResult<u32> {
    let bytes = b.get(at..at + 4).ok_or(WireError::Truncated)?;
    Ok(u32::from_be_bytes(
        bytes.try_into().map_err(|_| WireError::Truncated)?,
    ))
}

fn be16(b: &[u8], at: usize) -> WireResult<u16> {
    let bytes = b.get(at..at + 2).ok_or(WireError::Truncated)?;
    Ok(u16::from_be_bytes(
        bytes.try_into().map_err(|_| WireError::Truncated)?,
    ))
}

/// Parses the start of an AppleDouble file of `file_len` bytes: `head`
/// must hold the header, the entry table and the Finder information entry
/// (with its extended attributes); the resource fork is only located,
/// checked to lie within the file.
pub fn parse(head: &[u8], file_len: u64) -> WireResult<AppleDouble<'_>> {
    if be32(head, 0)? != MAGIC || be32(head, 4)? != VERSION {
        return Err(WireError::Invalid("AppleDouble magic or version"));
    }
    let macos = head.get(8..24) == Some(&MACOS_FILLER[..]);
    let count = be16(head, 24)? as usize;
    if count > MAX_ENTRIES {
        return Err(WireError::Invalid("AppleDouble entry count"));
    }
    let mut out = AppleDouble {
        finder_info: None,
        resource_fork: None,
        xattrs: Vec::new(),
    };
    for i in 0..count {
        let at = HEADER_LEN + i * ENTRY_LEN;
        let id = be32(head, at)?;
        let offset = u64::from(be32(head, at + 4)?);
        let len = u64::from(be32(head, at + 8)?);
        if offset + len > file_len {
            return Err(WireError::Invalid("AppleDouble entry past the end"));
        }
        match id {
            ENTRY_RESOURCE_FORK => out.resource_fork = Some((offset, len)),
            ENTRY_FINDER_INFO => {
                let (offset, len) = (offset as usize, len as usize);
                if len < FINDER_INFO_LEN {
                    return Err(WireError::Invalid("AppleDouble Finder information"));
                }
                let entry = head.get(offset..offset + len).ok_or(WireError::Truncated)?;
                out.finder_info = Some(&entry[..FINDER_INFO_LEN]);
                if macos && len > FINDER_INFO_LEN + 2 + ATTR_HEADER_LEN {
                    out.xattrs = xattrs(head, offset + FINDER_INFO_LEN + 2, offset + len)?;
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// The extended attributes of the "ATTR" block at `at`, which with their
/// values must lie before `end` (the end of the Finder information entry).
fn xattrs(head: &[u8], at: usize, end: usize) -> WireResult<Vec<(String, &[u8])>> {
    if head.get(at..at + 4) != Some(&ATTR_MAGIC[..]) {
        return Ok(Vec::new());
    }
    let count = be16(head, at + 34)? as usize;
    let mut pos = at + ATTR_HEADER_LEN;
    let mut out = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let offset = be32(head, pos)? as usize;
        let len = be32(head, pos + 4)? as usize;
        let name_len = *head.get(pos + 10).ok_or(WireError::Truncated)? as usize;
        let name = head
            .get(pos + 11..pos + 11 + name_len)
            .ok_or(WireError::Truncated)?;
        // The name ends with its NUL.
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        let name =
            std::str::from_utf8(name).map_err(|_| WireError::Invalid("xattr name not UTF-8"))?;
        let value_end = offset.checked_add(len).ok_or(WireError::Truncated)?;
        if offset < at || value_end > end {
            return Err(WireError::Invalid("xattr value outside its entry"));
        }
        let value = head.get(offset..value_end).ok_or(WireError::Truncated)?;
        if !name.is_empty() {
            out.push((name.to_string(), value));
        }
        pos = (pos + 11 + name_len).next_multiple_of(4);
        if pos > end {
            return Err(WireError::Invalid("xattr entries past their block"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An AppleDouble file as macOS writes it: Finder information with two
    /// extended attributes, then a resource fork.
    pub fn sample() -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&MAGIC.to_be_bytes());
        f.extend_from_slice(&VERSION.to_be_bytes());
        f.extend_from_slice(MACOS_FILLER);
        f.extend_from_slice(&2u16.to_be_bytes());
        let finder_at = HEADER_LEN + 2 * ENTRY_LEN; // 0x32
                                                    // Finder info, pad, ATTR header, 2 entries, then the values.
        let mut finder = Vec::new();
        finder.extend_from_slice(b"TESTSLOW");
        finder.resize(FINDER_INFO_LEN + 2, 0);
        let attr_at = finder_at + finder.len();
        let names: [&[u8]; 2] = [b"com.apple.metadata:_kMDItemUserTags\0", b"foo:bar\0"];
        let values: [&[u8]; 2] = [b"bplist00", b"baz"];
        let mut entries = Vec::new();
        let entries_len: usize = names
            .iter()
            .map(|n| (11 + n.len()).next_multiple_of(4))
            .sum();
        let mut value_at = attr_at + ATTR_HEADER_LEN + entries_len;
        for (n, v) in names.iter().zip(values) {
            entries.extend_from_slice(&(value_at as u32).to_be_bytes());
            entries.extend_from_slice(&(v.len() as u32).to_be_bytes());
            entries.extend_from_slice(&0u16.to_be_bytes());
            entries.push(n.len() as u8);
            entries.extend_from_slice(n);
            entries.resize(entries.len().next_multiple_of(4), 0);
            value_at += v.len();
        }
        let mut attr = Vec::new();
        attr.extend_from_slice(ATTR_MAGIC);
        attr.extend_from_slice(&[0u8; 30]);
        attr.extend_from_slice(&2u16.to_be_bytes());
        attr.extend_from_slice(&entries);
        for v in values {
            attr.extend_from_slice(v);
        }
        finder.extend_from_slice(&attr);
        let rsrc_at = finder_at + finder.len();
        let rsrc = b"resource fork bytes";
        for (id, at, len) in [
            (ENTRY_FINDER_INFO, finder_at, finder.len()),
            (ENTRY_RESOURCE_FORK, rsrc_at, rsrc.len()),
        ] {
            f.extend_from_slice(&id.to_be_bytes());
            f.extend_from_slice(&(at as u32).to_be_bytes());
            f.extend_from_slice(&(len as u32).to_be_bytes());
        }
        f.extend_from_slice(&finder);
        f.extend_from_slice(rsrc);
        f
    }

    #[test]
    fn finder_info_xattrs_and_resource_fork_are_found() {
        let f = sample();
        let ad = parse(&f, f.len() as u64).unwrap();
        assert_eq!(&ad.finder_info.unwrap()[..8], b"TESTSLOW");
        let (at, len) = ad.resource_fork.unwrap();
        assert_eq!(&f[at as usize..(at + len) as usize], b"resource fork bytes");
        assert_eq!(
            ad.xattrs,
            vec![
                (
                    "com.apple.metadata:_kMDItemUserTags".to_string(),
                    &b"bplist00"[..]
                ),
                ("foo:bar".to_string(), &b"baz"[..]),
            ]
        );
    }

    #[test]
    fn every_cut_and_every_bad_field_is_an_error_never_a_panic() {
        let f = sample();
        for cut in 0..f.len() {
            let _ = parse(&f[..cut], f.len() as u64);
            let _ = parse(&f[..cut], cut as u64);
        }
        for i in 0..f.len() {
            for b in [0u8, 0x7F, 0xFF] {
                let mut g = f.clone();
                g[i] = b;
                let _ = parse(&g, g.len() as u64);
            }
        }
        // A resource fork said to lie past the end of the file.
        assert!(parse(&f, 100).is_err());
        let mut g = f.clone();
        g[0] = 0;
        g[1] = 0;
        g[2] = 0;
        g[3] = 1;
        assert!(parse(&g, g.len() as u64).is_err());
    }
}
