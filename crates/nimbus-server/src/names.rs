//! SMB path names: validation, conversion to share-relative VFS paths, and
//! the wildcard matching of QUERY_DIRECTORY (MS-FSA 2.1.4.4).

use nimbus_wire::NtStatus;

/// Characters never valid in a file name component (MS-FSCC 2.1.5.2).
const INVALID_CHARS: &[char] = &['*', '?', '<', '>', '"', '|', ':'];

/// Turns a CREATE or rename name (`dir\file.txt`) into a VFS path
/// (`dir/file.txt`). The share root is "". A trailing `::$DATA` (the
/// unnamed data stream) is accepted; other streams are not supported.
pub fn to_vfs_path(name: &str) -> Result<String, NtStatus> {
    let mut name = name.strip_prefix('\\').unwrap_or(name);
    if let Some(stripped) = name.strip_suffix("::$DATA") {
        name = stripped;
    }
    let name = name.strip_suffix('\\').unwrap_or(name);
    if name.is_empty() {
        return Ok(String::new());
    }
    let mut out = String::with_capacity(name.len());
    for comp in name.split('\\') {
        if comp.is_empty() {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if comp == "." || comp == ".." {
            // Clients resolve dot components themselves; one on the wire is
            // an attempt to walk out of a directory.
            return Err(NtStatus::OBJECT_PATH_SYNTAX_BAD);
        }
        if comp.contains(':') {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if comp
            .chars()
            .any(|c| INVALID_CHARS.contains(&c) || (c as u32) < 0x20 || c == '/')
        {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if comp.len() > 255 {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(comp);
    }
    Ok(out)
}

/// The name of a VFS path as Windows reports it (`\dir\file.txt`).
pub fn to_smb_name(path: &str) -> String {
    let mut s = String::with_capacity(path.len() + 1);
    s.push('\\');
    s.push_str(&path.replace('/', "\\"));
    s
}

/// The parent of a VFS path ("" for top-level names and the root).
pub fn parent(path: &str) -> &str {
    path.rsplit_once('/').map(|(p, _)| p).unwrap_or("")
}

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether two names are equal ignoring case, as Windows compares names
/// (simple Unicode lower-case folding).
pub fn eq_ignore_case(a: &str, b: &str) -> bool {
    a.chars()
        .flat_map(char::to_lowercase)
        .eq(b.chars().flat_map(char::to_lowercase))
}

/// The directory entry a client means by `wanted` when it is not spelled
/// as on disk: the one equal to it ignoring case. If several differ only
/// in case, the smallest wins, so the answer does not depend on the order
/// the directory happens to list them in.
pub fn pick_ignoring_case<'a>(names: &'a [String], wanted: &str) -> Option<&'a str> {
    names
        .iter()
        .filter(|n| eq_ignore_case(n, wanted))
        .map(String::as_str)
        .min()
}

/// Whether a QUERY_DIRECTORY pattern has wildcards; without them it names
/// one entry exactly.
pub fn has_wildcards(pattern: &str) -> bool {
    pattern.contains(['*', '?', '<', '>', '"'])
}

/// Case-insensitive wildcard match with the DOS wildcards of MS-FSA 2.1.4.4:
/// `*` any run, `?` any one character, `<` (DOS_STAR) any run up to the last
/// dot, `>` (DOS_QM) any one character or nothing before a dot or the end,
/// `"` (DOS_DOT) a dot or the end. Iterative with memoisation, so a hostile
/// pattern cannot take exponential time.
pub fn wildcard_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().flat_map(char::to_lowercase).collect();
    let n: Vec<char> = name.chars().flat_map(char::to_lowercase).collect();
    // reach[j]: the first i pattern chars can match the first j name chars.
    let mut reach = vec![false; n.len() + 1];
    reach[0] = true;
    for (pi, &pc) in p.iter().enumerate() {
        let mut next = vec![false; n.len() + 1];
        match pc {
            '*' => {
                let mut any = false;
                for j in 0..=n.len() {
                    any |= reach[j];
                    next[j] = any;
                }
            }
            '<' => {
                // Matches up to (not including) the final dot, or everything
                // if there is no dot after the start point.
                let last_dot = n.iter().rposition(|c| *c == '.');
                for j in 0..=n.len() {
                    if !reach[j] {
                        continue;
                    }
                    next[j] = true;
                    for k in j + 1..=n.len() {
                        let consumed_dot = n[j..k].contains(&'.');
                        let beyond_last = last_dot.is_some_and(|d| k > d);
                        if consumed_dot && beyond_last {
                            break;
                        }
                        next[k] = true;
                    }
                }
            }
            '>' => {
                for j in 0..=n.len() {
                    if !reach[j] {
                        continue;
                    }
                    if j < n.len() && n[j] != '.' {
                        next[j + 1] = true;
                    }
                    // May match nothing at a dot or at the end.
                    if j == n.len() || n[j] == '.' {
                        next[j] = true;
                    }
                }
            }
            '"' => {
                for j in 0..=n.len() {
                    if !reach[j] {
                        continue;
                    }
                    if j < n.len() && n[j] == '.' {
                        next[j + 1] = true;
                    }
                    if j == n.len() {
                        next[j] = true;
                    }
                }
            }
            c => {
                for j in 0..n.len() {
                    if reach[j] && (c == '?' || n[j] == c) {
                        next[j + 1] = true;
                    }
                }
            }
        }
        reach = next;
        // A pattern that can match nothing more can stop early.
        if !reach.iter().any(|r| *r) && pi + 1 < p.len() {
            return false;
        }
    }
    reach[n.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_names() {
        assert_eq!(to_vfs_path("").unwrap(), "");
        assert_eq!(to_vfs_path("\\").unwrap(), "");
        assert_eq!(to_vfs_path("a\\b.txt").unwrap(), "a/b.txt");
        assert_eq!(to_vfs_path("\\a\\b\\").unwrap(), "a/b");
        assert_eq!(to_vfs_path("f::$DATA").unwrap(), "f");
        assert_eq!(
            to_vfs_path("..\\..\\etc\\passwd"),
            Err(NtStatus::OBJECT_PATH_SYNTAX_BAD)
        );
        assert_eq!(
            to_vfs_path("a\\..\\b"),
            Err(NtStatus::OBJECT_PATH_SYNTAX_BAD)
        );
        assert_eq!(to_vfs_path("a\\\\b"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("a*b"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("a/b"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("f:stream"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_smb_name("a/b"), "\\a\\b");
        assert_eq!(parent("a/b/c"), "a/b");
    }

    #[test]
    fn case_insensitive_names() {
        assert!(eq_ignore_case("T015-15.TXT", "t015-15.txt"));
        assert!(eq_ignore_case("ÄBC", "äbc"));
        assert!(!eq_ignore_case("abc", "abcd"));
        let names = vec![
            "b.txt".to_string(),
            "A.TXT".to_string(),
            "a.txt".to_string(),
        ];
        assert_eq!(pick_ignoring_case(&names, "a.Txt"), Some("A.TXT"));
        assert_eq!(pick_ignoring_case(&names, "c.txt"), None);
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*", "anything.txt"));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("*.TXT", "file.txt"));
        assert!(!wildcard_match("*.txt", "file.txt.bak"));
        assert!(wildcard_match("f?le.*", "FILE.doc"));
        assert!(!wildcard_match("f?le", "fle"));
        assert!(wildcard_match("<.txt", "a.b.txt"));
        assert!(wildcard_match("a>>", "a"));
        assert!(wildcard_match("a\"", "a"));
        assert!(wildcard_match("a\"txt", "a.txt"));
        // A pathological pattern finishes quickly.
        let p = "*a".repeat(200);
        assert!(!wildcard_match(&p, &"a".repeat(199)));
    }
}
