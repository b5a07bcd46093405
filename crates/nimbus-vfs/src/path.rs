//! Share-relative path parsing.

use std::ffi::CString;

use crate::error::{VfsError, VfsResult};
use crate::sys::cstring;

/// A validated share-relative path: zero or more single-name components.
///
/// Empty components and "." are dropped ("a//b/./c" is "a/b/c"); a leading '/' or any ".."
/// component is refused as [`VfsError::Escape`]; a NUL byte is [`VfsError::NameInvalid`].
#[derive(Debug)]
pub(crate) struct SharePath<'a> {
    comps: Vec<&'a str>,
}

impl<'a> SharePath<'a> {
    pub(crate) fn parse(path: &'a str) -> VfsResult<SharePath<'a>> {
        if path.starts_with('/') {
            return Err(VfsError::Escape);
        }
        if path.contains('\0') {
            return Err(VfsError::NameInvalid);
        }
        let mut comps = Vec::new();
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => return Err(VfsError::Escape),
                name => comps.push(name),
            }
        }
        Ok(SharePath { comps })
    }

    #[cfg(test)]
    pub(crate) fn is_root(&self) -> bool {
        self.comps.is_empty()
    }

    /// The whole path as a C string relative to the root ("." for the root).
    pub(crate) fn full(&self) -> VfsResult<CString> {
        if self.comps.is_empty() {
            return Ok(c".".to_owned());
        }
        cstring(&self.comps.join("/"))
    }

    /// The parent path relative to the root ("." when the parent is the root) and the final
    /// name. `None` for the root itself.
    pub(crate) fn split_last(&self) -> VfsResult<Option<(CString, CString)>> {
        let Some((last, parent)) = self.comps.split_last() else {
            return Ok(None);
        };
        let parent = if parent.is_empty() {
            c".".to_owned()
        } else {
            cstring(&parent.join("/"))?
        };
        Ok(Some((parent, cstring(last)?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_normalises_and_refuses() {
        assert!(SharePath::parse("").unwrap().is_root());
        assert!(SharePath::parse("./").unwrap().is_root());
        let p = SharePath::parse("a//b/./c/").unwrap();
        assert_eq!(p.comps, ["a", "b", "c"]);
        let (parent, name) = p.split_last().unwrap().unwrap();
        assert_eq!(parent.to_str().unwrap(), "a/b");
        assert_eq!(name.to_str().unwrap(), "c");
        let (parent, _) = SharePath::parse("x")
            .unwrap()
            .split_last()
            .unwrap()
            .unwrap();
        assert_eq!(parent.to_str().unwrap(), ".");
        assert!(matches!(SharePath::parse("../x"), Err(VfsError::Escape)));
        assert!(matches!(
            SharePath::parse("a/../../x"),
            Err(VfsError::Escape)
        ));
        assert!(matches!(SharePath::parse("a/.."), Err(VfsError::Escape)));
        assert!(matches!(SharePath::parse("/etc"), Err(VfsError::Escape)));
        assert!(matches!(
            SharePath::parse("a\0b"),
            Err(VfsError::NameInvalid)
        ));
    }
}
