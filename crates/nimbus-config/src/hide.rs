//! Names shown hidden: a share's `hide_dot_files` and `hide_files` (Samba's
//! "hide dot files", on by default there too, and "hide files"). Files that
//! come from Unix are hidden by a leading dot (`.git`, `.bashrc`, a Mac's
//! `._` companions), which Windows does not know; a matching name is
//! reported with FILE_ATTRIBUTE_HIDDEN in listings and queries, which
//! Explorer honours. Nothing is stored: the rules may change at any time,
//! and overwriting such a file need not ask for HIDDEN again (MS-FSA
//! 2.1.5.1.2.1 checks the attributes the file holds: smbtorture
//! smb2.dosmode).

use nimbus_wire::fscc::{attributes, FileInfo};

use nimbus_vfs::names::SearchPattern;

pub struct HideNames {
    pub dot_files: bool,
    /// Matched against a name's last component without case, with the
    /// wildcards of a directory search (`*`, `?`).
    pub patterns: Vec<SearchPattern>,
}

/// A `hide_files` entry that is not a pattern of one name.
#[derive(Debug, PartialEq, Eq)]
pub enum BadPattern {
    Empty,
    /// Not a search pattern of one path component (it holds a separator,
    /// or a character no name may hold).
    NotANamePattern(String),
}

impl std::fmt::Display for BadPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BadPattern::Empty => f.write_str("an empty pattern hides nothing"),
            BadPattern::NotANamePattern(p) => write!(f, "\"{p}\" is not a name pattern"),
        }
    }
}

impl std::error::Error for BadPattern {}

impl HideNames {
    /// From a share's configuration; a pattern that is not a valid search
    /// pattern is the configuration's error.
    pub fn new(dot_files: bool, patterns: &[String]) -> Result<HideNames, BadPattern> {
        let patterns = patterns
            .iter()
            .map(|p| {
                if p.is_empty() {
                    return Err(BadPattern::Empty);
                }
                SearchPattern::parse(p).map_err(|_| BadPattern::NotANamePattern(p.clone()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HideNames {
            dot_files,
            patterns,
        })
    }

    /// Hides nothing (IPC$).
    pub fn none() -> HideNames {
        HideNames {
            dot_files: false,
            patterns: Vec::new(),
        }
    }

    /// Whether the entry `name` (one component) is shown hidden; "." and
    /// ".." never are.
    pub fn hides(&self, name: &str) -> bool {
        if name.is_empty() || name == "." || name == ".." {
            return false;
        }
        (self.dot_files && name.starts_with('.')) || self.patterns.iter().any(|p| p.matches(name))
    }

    /// Adds HIDDEN to `info` if the share-relative `path` names a hidden
    /// entry (the share's root never is).
    pub fn apply(&self, path: &str, info: &mut FileInfo) {
        let name = path.rsplit('/').next().unwrap_or("");
        if self.hides(name) {
            info.attributes = (info.attributes & !attributes::NORMAL) | attributes::HIDDEN;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_files_and_patterns_are_hidden_without_case() {
        let h = HideNames::new(true, &["hidefile".into(), "*.TMP".into(), "~$*".into()]).unwrap();
        for name in [
            ".git",
            ".bashrc",
            "._Photo.jpg",
            "hidefile",
            "HideFile",
            "a.tmp",
            "~$report.docx",
        ] {
            assert!(h.hides(name), "{name}");
        }
        for name in [
            "",
            ".",
            "..",
            "file",
            "hidefile2",
            "a.tmpx",
            "report.docx",
            "x.git",
        ] {
            assert!(!h.hides(name), "{name}");
        }
        let shown = HideNames::new(false, &[]).unwrap();
        assert!(!shown.hides(".git"));
        assert!(HideNames::new(true, &["a\\b".into()]).is_err());
        assert!(HideNames::new(true, &["".into()]).is_err());
    }

    #[test]
    fn hidden_replaces_normal_and_keeps_the_rest() {
        let h = HideNames::new(true, &[]).unwrap();
        let mut info = FileInfo {
            attributes: attributes::NORMAL,
            ..FileInfo::default()
        };
        h.apply("dir/.profile", &mut info);
        assert_eq!(info.attributes, attributes::HIDDEN);
        let mut info = FileInfo {
            attributes: attributes::DIRECTORY | attributes::READONLY,
            ..FileInfo::default()
        };
        h.apply(".config", &mut info);
        assert_eq!(
            info.attributes,
            attributes::DIRECTORY | attributes::READONLY | attributes::HIDDEN
        );
        let mut root = FileInfo {
            attributes: attributes::DIRECTORY,
            ..FileInfo::default()
        };
        h.apply("", &mut root);
        assert_eq!(root.attributes, attributes::DIRECTORY);
    }
}
