//! SMB path names: validation, conversion to share-relative VFS paths, and
//! the search patterns of QUERY_DIRECTORY (MS-FSA 2.1.4.4, 2.1.5.6.3).

use nimbus_wire::NtStatus;

/// Characters never valid in a file name component (MS-FSCC 2.1.5.2).
const INVALID_CHARS: &[char] = &['*', '?', '<', '>', '"', '|', ':'];

/// Which data stream of a file a name means (MS-FSCC 2.1.5.3:
/// `file:stream:$DATA`, the type optional and in any case).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stream {
    /// No stream was named: the file (or directory) itself.
    Unnamed,
    /// `file::$DATA`: the unnamed data stream, named explicitly (which a
    /// directory does not have).
    UnnamedData,
    /// A named stream, spelled as given.
    Named(String),
}

/// The longest stream name, in UTF-16 code units (as a file name).
const MAX_STREAM_UTF16: usize = 255;

/// Splits `file:stream:type` into the file's name and its stream. Only
/// `$DATA` streams exist; an empty or other type, an empty name without a
/// type (`file:`) and a name with a path separator are OBJECT_NAME_INVALID.
/// Any other character, wildcards and control characters included, may be
/// in a stream name (smbtorture smb2.streams.names2 probes them all).
fn split_stream(name: &str) -> Result<(&str, Stream), NtStatus> {
    let Some((file, spec)) = name.split_once(':') else {
        return Ok((name, Stream::Unnamed));
    };
    let (stream, kind) = match spec.split_once(':') {
        Some((stream, kind)) => (stream, Some(kind)),
        None => (spec, None),
    };
    if kind.is_some_and(|k| !k.eq_ignore_ascii_case("$DATA")) {
        return Err(NtStatus::OBJECT_NAME_INVALID);
    }
    if stream.is_empty() {
        return match kind {
            Some(_) => Ok((file, Stream::UnnamedData)),
            None => Err(NtStatus::OBJECT_NAME_INVALID),
        };
    }
    if stream.contains(['\\', '/', '\0']) || stream.encode_utf16().count() > MAX_STREAM_UTF16 {
        return Err(NtStatus::OBJECT_NAME_INVALID);
    }
    Ok((file, Stream::Named(stream.to_string())))
}

/// Turns a CREATE or rename name (`dir\file.txt`) into a VFS path
/// (`dir/file.txt`). The share root is "". A trailing `::$DATA` (the
/// unnamed data stream) is accepted; a named stream is not (see
/// [`to_vfs_path_and_stream`]).
pub fn to_vfs_path(name: &str) -> Result<String, NtStatus> {
    match to_vfs_path_and_stream(name)? {
        (path, Stream::Unnamed | Stream::UnnamedData) => Ok(path),
        (_, Stream::Named(_)) => Err(NtStatus::OBJECT_NAME_INVALID),
    }
}

/// [`to_vfs_path`] of a name that may end in a stream: the file's path and
/// the stream meant.
pub fn to_vfs_path_and_stream(name: &str) -> Result<(String, Stream), NtStatus> {
    let name = name.strip_prefix('\\').unwrap_or(name);
    let (name, stream) = split_stream(name)?;
    let name = name.strip_suffix('\\').unwrap_or(name);
    if name.is_empty() {
        return Ok((String::new(), stream));
    }
    let mut out = String::with_capacity(name.len());
    // '/' separates components too, as Samba takes it: no Windows client
    // sends one (it is no character of a file name, MS-FSCC 2.1.5.2), and
    // smbtorture's smb2.timestamps names a file `dir/file` (Windows
    // answers OBJECT_NAME_INVALID there, Samba opens `dir\file`). Every
    // component is checked alike whichever separator came before it.
    for comp in name.split(['\\', '/']) {
        if comp.is_empty() {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if comp == "." || comp == ".." {
            // A dot component names the directory before it, or that
            // directory's parent: `a\b\..` is `a`, as Samba resolves it
            // (smbtorture smb2.notify.tree watches `zqy\..`). The names are
            // taken as written, never through a link on disk, so the path
            // stays in the share; one that would climb above the share's
            // root is refused (smb2.mkdir: `..\..\..`).
            if comp == ".." {
                match out.rfind('/') {
                    Some(cut) => out.truncate(cut),
                    None if !out.is_empty() => out.clear(),
                    None => return Err(NtStatus::OBJECT_PATH_SYNTAX_BAD),
                }
            }
            continue;
        }
        if comp
            .chars()
            .any(|c| INVALID_CHARS.contains(&c) || (c as u32) < 0x20)
        {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if comp.len() > 255 {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        // The share's store of named streams is the server's own.
        if out.is_empty() && eq_ignore_case(comp, crate::STORE_DIR) {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(comp);
    }
    Ok((out, stream))
}

/// Characters an 8.3 name may hold besides letters and digits (MS-FSCC
/// 2.1.5.2.1).
const DOS_SPECIALS: &str = "$%'-_@~`!(){}^#&";

fn dos_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || DOS_SPECIALS.contains(c)
}

/// Whether `name` is a valid 8.3 name as it stands (MS-FSCC 2.1.5.2.1): 1
/// to 8 characters, then optionally a dot and 1 to 3 more, all of the DOS
/// set.
pub fn is_8dot3(name: &str) -> bool {
    let (base, ext) = match name.split_once('.') {
        Some((b, e)) => (b, Some(e)),
        None => (name, None),
    };
    (1..=8).contains(&base.len())
        && base.chars().all(dos_char)
        && ext.is_none_or(|e| (1..=3).contains(&e.len()) && e.chars().all(dos_char))
}

/// The 8.3 name (MS-FSCC 2.1.5.2.1) of a file named `long`, as
/// FileAlternateNameInformation and the directory classes with a short
/// name report it: the name itself in capitals where it is one, otherwise
/// made from it, Windows' way for names that collide often: two
/// characters of the name, four hex digits of a hash of the whole name
/// (ignoring case), `~1`, and three characters of its extension
/// (`testsmb2_file.dat` is `TE8C1B~1.DAT`). It depends on the name alone,
/// not on what else the directory holds, so every node and every restart
/// gives the same one, and `lookup` finds the file by it; two names of one
/// directory may share one (1 in 65536 when their first two characters
/// and extension agree), and then it reaches the smaller.
pub fn dos_name(long: &str) -> String {
    if is_8dot3(long) {
        return long.to_ascii_uppercase();
    }
    let (base, ext) = match long.rsplit_once('.') {
        Some((b, e)) if !b.is_empty() => (b, e),
        _ => (long, ""),
    };
    let keep = |s: &str, n: usize| -> String {
        s.chars()
            .filter(|c| dos_char(*c))
            .take(n)
            .map(|c| c.to_ascii_uppercase())
            .collect()
    };
    // FNV-1a over the name as compared (lower case), folded to 16 bits.
    let mut h: u32 = 0x811c_9dc5;
    for b in long.to_lowercase().bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    let hash = (h >> 16) ^ (h & 0xffff);
    let mut out = format!("{}{hash:04X}~1", keep(base, 2));
    let ext = keep(ext, 3);
    if !ext.is_empty() {
        out.push('.');
        out.push_str(&ext);
    }
    out
}

/// Whether a name a client gave may be a made 8.3 name (`dos_name` of a
/// longer one), to look for when no file has it as its name.
pub fn may_be_dos_name(name: &str) -> bool {
    name.contains('~') && is_8dot3(name)
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

/// The longest file name component, in UTF-16 code units (MS-FSCC 2.1.5:
/// a component is at most 255 characters). No name can be longer, so no
/// longer search pattern can be valid.
pub const MAX_COMPONENT_UTF16: usize = 255;

/// Characters a search pattern must not contain: a path separator or any
/// other character invalid in a name component (MS-FSCC 2.1.5.2), except
/// the wildcards of MS-FSA 2.1.4.4, which a pattern may use.
fn invalid_in_pattern(c: char) -> bool {
    matches!(c, '\\' | '/' | ':' | '|') || (c as u32) < 0x20
}

/// Whether a QUERY_DIRECTORY pattern has wildcards; without them it names
/// one entry exactly.
pub fn has_wildcards(pattern: &str) -> bool {
    pattern.contains(WILDCARDS)
}

/// The wildcards of MS-FSA 2.1.4.4.
const WILDCARDS: [char; 5] = ['*', '?', '<', '>', '"'];

fn is_wildcard(c: char) -> bool {
    WILDCARDS.contains(&c)
}

/// The most pattern positions a valid pattern can have: 255 characters,
/// each lower-cased to at most 3 (`char::to_lowercase`).
const MAX_TOKENS: usize = MAX_COMPONENT_UTF16 * 3;
/// Words of a set of pattern positions 0..=MAX_TOKENS.
const WORDS: usize = (MAX_TOKENS + 1).div_ceil(64);
type Bits = [u64; WORDS];

/// A QUERY_DIRECTORY search pattern (MS-SMB2 3.3.5.18 FileName), checked
/// and compiled once per request, then matched against each entry
/// case-insensitively with the wildcards of MS-FSA 2.1.4.4: `*` any run,
/// `?` any one character, `<` (DOS_STAR) any run that does not take the
/// name's last dot, `>` (DOS_QM) any one character but a dot, or nothing
/// at a dot or the end, `"` (DOS_DOT) a dot, or nothing at the end.
///
/// Cost: the pattern is at most 255 characters (see [`SearchPattern::parse`]),
/// and a match is one pass over the name, advancing the set of pattern
/// positions reached (a bit set of at most 12 words; 1 for patterns under
/// 64 characters) by a few word operations per name character. No
/// allocation per name. The matcher this replaced took O(pattern × name)
/// per name with two allocations per pattern character, and
/// O(pattern × name³) for `<`: a 16,384-character `<` pattern took 3 s per
/// 200-character name without a dot (76 s for a directory of 20 such
/// names, hours for 2000); now such a pattern is refused at once, and the
/// worst 255-character pattern matches 2000 such names in milliseconds.
///
/// A directory entry matches when its name or its 8.3 name does (MS-FSA
/// 2.1.5.6.3 tests both Link.Name and Link.ShortName), as on Windows (and
/// on Samba for the names it mangles): a search for `PRxxxx~1.TXT`, as
/// `dir`, `del` and FindFirstFile make, finds `Program Notes.txt`, and
/// `*.htm` also lists `page.html` (its 8.3 name is `PAxxxx~1.HTM`).
pub struct SearchPattern {
    text: String,
    /// None: the pattern matches every name (`*`, or empty).
    nfa: Option<Nfa>,
    /// Whether the pattern can match a made 8.3 name at all: every literal
    /// character is one an 8.3 name holds, and without wildcards it is
    /// one itself. Other patterns (most of them) make no 8.3 name.
    reaches_dos_names: bool,
}

/// One pattern position per token of the lower-cased pattern; position
/// `accept` (the token count) is reached when the whole pattern matched.
/// Each mask holds the positions whose token is of one kind.
struct Nfa {
    accept: usize,
    /// Words in use: (accept + 1) bits.
    words: usize,
    /// `*`: takes any character and stays; may match nothing.
    star: Bits,
    /// `<`: takes any character but the name's last dot and stays; may
    /// match nothing.
    dos_star: Bits,
    /// `?`: takes any one character.
    any: Bits,
    /// `>`: takes one character that is not a dot; matches nothing at a
    /// dot or at the end.
    dos_qm: Bits,
    /// `"`: takes a dot; matches nothing at the end.
    dos_dot: Bits,
    /// Literal characters, sorted, with the positions that take each.
    literals: Vec<(char, Bits)>,
    /// Positions that may match nothing: in the middle of a name, before a
    /// dot, and at the end.
    skip_plain: Bits,
    skip_at_dot: Bits,
    skip_at_end: Bits,
}

impl SearchPattern {
    /// Checks and compiles a pattern. MS-FSA 2.1.5.6.3: a FileNamePattern
    /// that is not a valid name component (MS-FSCC 2.1.5), wildcards, "."
    /// and ".." excepted, fails with STATUS_OBJECT_NAME_INVALID. So a
    /// pattern longer than a component can be (255 UTF-16 code units) or
    /// with a path separator (`\`, `/`) is refused, as Samba refuses `\`
    /// and `/` (smbd_smb2_query_directory_send). Refusing before any work
    /// also bounds the matcher: a 32 KiB pattern costs one scan of it. An
    /// empty pattern means `*` (MS-FSA 2.1.5.6.3).
    pub fn parse(pattern: &str) -> Result<SearchPattern, NtStatus> {
        if pattern.encode_utf16().count() > MAX_COMPONENT_UTF16 {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        if pattern.chars().any(invalid_in_pattern) {
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        let text = if pattern.is_empty() { "*" } else { pattern };
        let nfa = Nfa::compile(text)?;
        let reaches_dos_names = nfa.is_some()
            && if has_wildcards(text) {
                text.chars()
                    .all(|c| dos_char(c) || c == '.' || is_wildcard(c))
            } else {
                may_be_dos_name(text)
            };
        Ok(SearchPattern {
            text: text.to_string(),
            nfa,
            reaches_dos_names,
        })
    }

    /// The pattern as the client sent it (`*` for an empty one).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `name` matches, ignoring case as Windows compares names.
    pub fn matches(&self, name: &str) -> bool {
        match &self.nfa {
            None => true,
            Some(nfa) => nfa.matches(name),
        }
    }

    /// Whether the directory entry `name` (never "." or "..") matches by
    /// its name or by its 8.3 name (`dos_name`; a name that is 8.3 already
    /// has no other).
    pub fn matches_entry(&self, name: &str) -> bool {
        self.matches(name)
            || (self.reaches_dos_names && !is_8dot3(name) && self.matches(&dos_name(name)))
    }
}

/// A pattern character as a matcher step.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Token {
    Star,
    DosStar,
    Any,
    DosQm,
    DosDot,
    Literal(char),
}

/// The tokens of a pattern, lower-cased once (per request, not per entry),
/// with every run of `*` and `<` collapsed into one token: a run holding a
/// `*` into `*`, a run of `<` alone into `<`. Both are exact, by the
/// definitions above: `<` from a position reaches every position up to the
/// name's last dot (or the end, once past it), and so does `<<`; `*<` and
/// `<*` reach every later position, as `*` does.
fn tokens(pattern: &str) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::with_capacity(pattern.len());
    for c in pattern.chars().flat_map(char::to_lowercase) {
        let t = match c {
            '*' => Token::Star,
            '<' => Token::DosStar,
            '?' => Token::Any,
            '>' => Token::DosQm,
            '"' => Token::DosDot,
            c => Token::Literal(c),
        };
        match (out.last_mut(), t) {
            (Some(last @ (Token::Star | Token::DosStar)), Token::Star | Token::DosStar) => {
                if t == Token::Star {
                    *last = Token::Star;
                }
            }
            _ => out.push(t),
        }
    }
    out
}

fn set(bits: &mut Bits, i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

impl Nfa {
    /// None for a pattern that matches every name.
    fn compile(pattern: &str) -> Result<Option<Nfa>, NtStatus> {
        let toks = tokens(pattern);
        if toks == [Token::Star] {
            return Ok(None);
        }
        if toks.len() > MAX_TOKENS {
            // Cannot happen for a pattern of at most 255 characters.
            return Err(NtStatus::OBJECT_NAME_INVALID);
        }
        let zero = [0u64; WORDS];
        let mut nfa = Nfa {
            accept: toks.len(),
            words: (toks.len() + 1).div_ceil(64),
            star: zero,
            dos_star: zero,
            any: zero,
            dos_qm: zero,
            dos_dot: zero,
            literals: Vec::new(),
            skip_plain: zero,
            skip_at_dot: zero,
            skip_at_end: zero,
        };
        for (i, t) in toks.iter().enumerate() {
            match *t {
                Token::Star => set(&mut nfa.star, i),
                Token::DosStar => set(&mut nfa.dos_star, i),
                Token::Any => set(&mut nfa.any, i),
                Token::DosQm => set(&mut nfa.dos_qm, i),
                Token::DosDot => set(&mut nfa.dos_dot, i),
                Token::Literal(c) => match nfa.literals.binary_search_by_key(&c, |(l, _)| *l) {
                    Ok(k) => set(&mut nfa.literals[k].1, i),
                    Err(k) => {
                        let mut b = zero;
                        set(&mut b, i);
                        nfa.literals.insert(k, (c, b));
                    }
                },
            }
        }
        for w in 0..WORDS {
            nfa.skip_plain[w] = nfa.star[w] | nfa.dos_star[w];
            nfa.skip_at_dot[w] = nfa.skip_plain[w] | nfa.dos_qm[w];
            nfa.skip_at_end[w] = nfa.skip_at_dot[w] | nfa.dos_dot[w];
        }
        Ok(Some(nfa))
    }

    fn matches(&self, name: &str) -> bool {
        // The last dot, found on the name as given: lower-casing maps no
        // other character to a dot and a dot only to itself (tested below).
        let last_dot = name.rfind('.');
        let mut chars = name
            .char_indices()
            .flat_map(|(i, ch)| {
                ch.to_lowercase()
                    .map(move |c| (c, c == '.' && Some(i) == last_dot))
            })
            .peekable();
        let zero = [0u64; WORDS];
        let mut reached = zero;
        reached[0] = 1;
        reached = self.skip(&reached, chars.peek().map(|(c, _)| *c));
        while let Some((c, is_last_dot)) = chars.next() {
            let lit = match self.literals.binary_search_by_key(&c, |(l, _)| *l) {
                Ok(k) => &self.literals[k].1,
                Err(_) => &zero,
            };
            let takes_one = if c == '.' {
                &self.dos_dot
            } else {
                &self.dos_qm
            };
            let mut next = zero;
            let mut carry = 0;
            let mut any = 0;
            for w in 0..self.words {
                let r = reached[w];
                let advance = r & (self.any[w] | lit[w] | takes_one[w]);
                let mut stay = r & self.star[w];
                if !is_last_dot {
                    stay |= r & self.dos_star[w];
                }
                next[w] = (advance << 1) | carry | stay;
                carry = advance >> 63;
                any |= next[w];
            }
            if any == 0 {
                return false;
            }
            reached = self.skip(&next, chars.peek().map(|(c, _)| *c));
        }
        reached[self.accept / 64] & (1 << (self.accept % 64)) != 0
    }

    /// `reached` plus every position reachable from it by tokens that match
    /// nothing before `next` (None: at the end of the name). A position in
    /// a run of such tokens reaches every later position of the run and
    /// the one after it; adding the reached run positions to the run mask
    /// carries a bit through each run to the position after it, in one
    /// pass (the flipped bits are exactly those positions).
    fn skip(&self, reached: &Bits, next: Option<char>) -> Bits {
        let runs = match next {
            None => &self.skip_at_end,
            Some('.') => &self.skip_at_dot,
            Some(_) => &self.skip_plain,
        };
        let mut out = *reached;
        let mut carry = 0u64;
        for w in 0..self.words {
            let (sum, c1) = runs[w].overflowing_add(reached[w] & runs[w]);
            let (sum, c2) = sum.overflowing_add(carry);
            carry = u64::from(c1 || c2);
            out[w] |= sum ^ runs[w];
        }
        out
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_index_folds_as_names_compare() {
        // nimbus_vfs::NameIndex keys names by `fold`; it must put together
        // exactly the names eq_ignore_case takes for one.
        let names = [
            "a", "A", "file.TXT", "File.txt", "ß", "SS", "ss", "İ", "i̇", "i", "I", "Σ", "σ", "ς",
            "ǅ", "ǆ", "Ǆ", "K", "k", "\u{212A}", "Ω", "\u{2126}", "",
        ];
        for a in names {
            for b in names {
                assert_eq!(
                    eq_ignore_case(a, b),
                    crate::fold(a) == crate::fold(b),
                    "{a:?} {b:?}"
                );
            }
        }
    }

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
        assert_eq!(to_vfs_path("a\\..\\b").unwrap(), "b");
        assert_eq!(to_vfs_path("a\\b\\..").unwrap(), "a");
        assert_eq!(to_vfs_path("a\\b\\.\\c").unwrap(), "a/b/c");
        assert_eq!(to_vfs_path("a\\..").unwrap(), "");
        assert_eq!(
            to_vfs_path("a\\..\\.."),
            Err(NtStatus::OBJECT_PATH_SYNTAX_BAD)
        );
        assert_eq!(to_vfs_path(".\\a").unwrap(), "a");
        assert_eq!(to_vfs_path(".").unwrap(), "");
        assert_eq!(
            to_vfs_path("a\\..\\.NIMBUS-streams\\x"),
            Err(NtStatus::OBJECT_NAME_INVALID)
        );
        assert_eq!(to_vfs_path("a\\\\b"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("a*b"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("a/b").unwrap(), "a/b");
        assert_eq!(to_vfs_path("a/b\\c").unwrap(), "a/b/c");
        assert_eq!(to_vfs_path("a//b"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("a/../b").unwrap(), "b");
        assert_eq!(to_vfs_path("/a"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_vfs_path("f:stream"), Err(NtStatus::OBJECT_NAME_INVALID));
        assert_eq!(to_smb_name("a/b"), "\\a\\b");
        assert_eq!(parent("a/b/c"), "a/b");
        assert_eq!(
            to_vfs_path(".NIMBUS-streams\\x"),
            Err(NtStatus::OBJECT_NAME_INVALID)
        );
        assert_eq!(
            to_vfs_path("d\\.nimbus-streams"),
            Ok("d/.nimbus-streams".into())
        );
    }

    #[test]
    fn dos_names() {
        assert_eq!(dos_name("README.TXT"), "README.TXT");
        assert_eq!(dos_name("abc.txt"), "ABC.TXT");
        assert_eq!(dos_name("$x~1"), "$X~1");
        for long in [
            "testsmb2_file.dat",
            "Long File Name.docx",
            ".bashrc",
            "a.b.c",
            "ÄÖÜ.txt",
            "name.",
        ] {
            let short = dos_name(long);
            assert!(is_8dot3(&short), "{long} -> {short}");
            assert!(may_be_dos_name(&short), "{long} -> {short}");
            // The same whatever the case it is asked in.
            assert_eq!(dos_name(&long.to_uppercase()), short);
        }
        assert!(dos_name("Long File Name.docx").starts_with("LO"));
        assert!(dos_name("Long File Name.docx").ends_with("~1.DOC"));
        assert_ne!(
            dos_name("Long File Name 1.docx"),
            dos_name("Long File Name 2.docx")
        );
        assert!(!may_be_dos_name("plain.txt"));
    }

    /// MS-FSA 2.1.5.6.3: an entry matches by its name or its 8.3 name.
    #[test]
    fn patterns_match_dos_names_of_entries() {
        let long = "Long File Name.docx";
        let short = dos_name(long);
        let entry = |p: &str| SearchPattern::parse(p).unwrap().matches_entry(long);
        assert!(entry(&short));
        assert!(entry(&short.to_lowercase()));
        assert!(entry("*.doc"));
        assert!(entry("LO????~1.*"));
        assert!(entry("*.docx"));
        assert!(!entry("*.xls"));
        assert!(!entry("LO0000~9.DOC"));
        // A pattern no 8.3 name can match does not make one.
        let p = SearchPattern::parse("*.doc+").unwrap();
        assert!(!p.reaches_dos_names && !p.matches_entry(long));
        assert!(!SearchPattern::parse("plain.txt").unwrap().reaches_dos_names);
        // An 8.3 name is its own: `abc.txt` is not found as `ABC~1.TXT`.
        let p = SearchPattern::parse("*~*").unwrap();
        assert!(!p.matches_entry("abc.txt"));
        assert!(p.matches_entry(long));
    }

    /// The stream forms smbtorture smb2.streams.io, names and names2 use.
    #[test]
    fn stream_names() {
        let named = |s: &str| Stream::Named(s.to_string());
        let split = |n: &str| to_vfs_path_and_stream(n);
        assert_eq!(split("d\\f"), Ok(("d/f".into(), Stream::Unnamed)));
        assert_eq!(
            split("d\\f::$DATA"),
            Ok(("d/f".into(), Stream::UnnamedData))
        );
        assert_eq!(split("f::$dAtA"), Ok(("f".into(), Stream::UnnamedData)));
        assert_eq!(split("f:Stream One"), Ok(("f".into(), named("Stream One"))));
        assert_eq!(split("f:S:$DaTa"), Ok(("f".into(), named("S"))));
        assert_eq!(
            split("f:?Stream*:$DATA"),
            Ok(("f".into(), named("?Stream*")))
        );
        assert_eq!(
            split("f:\u{5}Stream\n One"),
            Ok(("f".into(), named("\u{5}Stream\n One")))
        );
        assert_eq!(split(":s"), Ok((String::new(), named("s"))));
        for bad in [
            "f:",
            "f:s:",
            "f:s:$FOO",
            "f:s:?D*a",
            "f:s:$DATAx",
            "f:Stream:0x3A:$DATA",
            "f:a/b",
            "f:a\\b",
            "d\\stream*:?Stream*:$DATA",
            "d:s\\f",
        ] {
            assert_eq!(split(bad), Err(NtStatus::OBJECT_NAME_INVALID), "{bad}");
        }
        assert_eq!(
            split(&format!("f:{}", "x".repeat(256))),
            Err(NtStatus::OBJECT_NAME_INVALID)
        );
        assert!(split(&format!("f:{}", "x".repeat(255))).is_ok());
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

    /// The matcher this module had before SearchPattern, kept as the
    /// reference the new one must agree with: a direct dynamic program over
    /// (pattern prefix, name prefix), one pattern character at a time.
    fn reference_match(pattern: &str, name: &str) -> bool {
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
                    // Matches up to (not including) the final dot, or
                    // everything if there is no dot after the start point.
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

    fn matches(pattern: &str, name: &str) -> bool {
        // The handler gave the reference `*` for an empty pattern.
        let compiled = SearchPattern::parse(pattern).unwrap();
        let new = compiled.matches(name);
        assert_eq!(
            new,
            reference_match(compiled.as_str(), name),
            "pattern {pattern:?} name {name:?}"
        );
        new
    }

    #[test]
    fn wildcards() {
        assert!(matches("*", "anything.txt"));
        assert!(matches("*", ""));
        assert!(matches("", "anything.txt"));
        assert!(matches("*.TXT", "file.txt"));
        assert!(!matches("*.txt", "file.txt.bak"));
        assert!(matches("f?le.*", "FILE.doc"));
        assert!(!matches("f?le", "fle"));
        assert!(matches("<.txt", "a.b.txt"));
        assert!(matches("a>>", "a"));
        assert!(matches("a\"", "a"));
        assert!(matches("a\"txt", "a.txt"));
        // A pathological pattern finishes quickly.
        let p = "*a".repeat(127);
        assert!(!matches(&p, &"a".repeat(126)));
        assert!(matches(&p, &"a".repeat(127)));
    }

    #[test]
    fn each_wildcard() {
        // `*`: any run, dots included.
        assert!(matches("a*", "a"));
        assert!(matches("a*z", "a.b.c.z"));
        assert!(!matches("a*z", "a.b.c.y"));
        // `?`: exactly one character, a dot included.
        assert!(matches("a?c", "a.c"));
        assert!(!matches("a?", "a"));
        assert!(!matches("??", "abc"));
        // `<` (DOS_STAR): any run that stops before the last dot.
        assert!(matches("<", "abc"));
        assert!(matches("<", ""));
        assert!(!matches("<", "a.b"));
        assert!(matches("<.b", "a.x.b"));
        assert!(matches("<.<", "a.x.b"));
        assert!(!matches("<c", "a.bc"));
        assert!(matches("a.<", "a.bc"));
        assert!(matches("<.*", "a.b.c"));
        assert!(matches("<\"*", "a.b.c"));
        // `>` (DOS_QM): one character but a dot, or nothing at a dot or the end.
        assert!(matches("a>", "ab"));
        assert!(matches("a>", "a"));
        assert!(!matches("a>", "a."));
        assert!(matches("a>.txt", "a.txt"));
        assert!(matches("a>>>.txt", "ab.txt"));
        assert!(!matches("a>.txt", "abc.txt"));
        assert!(!matches(">", "abc"));
        // `"` (DOS_DOT): a dot, or nothing at the end.
        assert!(matches("a\"", "a."));
        assert!(!matches("a\"", "ab"));
        assert!(matches("a\"\"", "a"));
        assert!(matches("a\"*", "a.b"));
        // Case: both sides fold, including characters that fold to two.
        assert!(matches("İ*", "i\u{307}x"));
        assert!(matches("ÄB?", "äbc"));
        assert!(matches("*SS", "ss"));
    }

    #[test]
    fn runs_collapse() {
        use Token::*;
        assert!(tokens("**") == [Star]);
        assert!(tokens("a*<*<b") == [Literal('a'), Star, Literal('b')]);
        assert!(tokens("<<<") == [DosStar]);
        assert!(tokens("<<*") == [Star]);
        assert!(tokens(">>\"\"") == [DosQm, DosQm, DosDot, DosDot]);
        assert!(tokens("<?<") == [DosStar, Any, DosStar]);
        assert!(SearchPattern::parse("*<**").unwrap().nfa.is_none());
    }

    #[test]
    fn patterns_are_checked() {
        let ok = |p: &str| SearchPattern::parse(p).is_ok();
        let invalid =
            |p: &str| SearchPattern::parse(p).err() == Some(NtStatus::OBJECT_NAME_INVALID);
        assert!(ok("."));
        assert!(ok(".."));
        assert!(ok("*.txt"));
        assert!(ok(&"<".repeat(255)));
        assert!(invalid(&"<".repeat(256)));
        assert!(invalid(&"*?<".repeat(10_923)));
        // Counted in UTF-16 code units: a character beyond the BMP is two.
        assert!(ok(&"😀".repeat(127)));
        assert!(invalid(&"😀".repeat(128)));
        // Three-byte UTF-8 characters are one unit each.
        assert!(ok(&"€".repeat(255)));
        for p in [
            "a/b", "/", "a\\b", "\\", "..\\x", "a:b", "a|b", "a\0", "\t*",
        ] {
            assert!(invalid(p), "{p:?}");
        }
        assert_eq!(SearchPattern::parse("").unwrap().as_str(), "*");
        assert_eq!(SearchPattern::parse("a*").unwrap().as_str(), "a*");
    }

    /// The last-dot rule is applied to the name as given, before folding:
    /// only a dot folds to a dot, and it folds to itself alone.
    #[test]
    fn only_a_dot_folds_to_a_dot() {
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let folded: Vec<char> = c.to_lowercase().collect();
            if c == '.' {
                assert_eq!(folded, ['.']);
            } else {
                assert!(!folded.contains(&'.'), "{c:?}");
            }
        }
    }

    /// Every pattern of up to 4 symbols against every name of up to 4
    /// characters, and random longer ones: the new matcher (collapsing,
    /// bit-parallel) agrees with the reference.
    #[test]
    fn agrees_with_reference() {
        fn all(alphabet: &[char], max: usize) -> Vec<String> {
            let mut out = vec![String::new()];
            let mut last = vec![String::new()];
            for _ in 0..max {
                let mut next = Vec::new();
                for s in &last {
                    for c in alphabet {
                        let mut t = s.clone();
                        t.push(*c);
                        next.push(t);
                    }
                }
                out.extend(next.iter().cloned());
                last = next;
            }
            out
        }
        let patterns = all(&['a', '.', '*', '?', '<', '>', '"'], 4);
        let names = all(&['a', 'B', '.'], 4);
        for p in &patterns {
            let compiled = SearchPattern::parse(p).unwrap();
            for n in &names {
                assert_eq!(
                    compiled.matches(n),
                    reference_match(compiled.as_str(), n),
                    "pattern {p:?} name {n:?}"
                );
            }
        }

        // xorshift64: deterministic, no dependency.
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound as u64) as usize
        };
        let pattern_chars = ['a', 'b', 'A', 'İ', '.', '*', '?', '<', '>', '"'];
        let name_chars = ['a', 'b', 'B', 'i', '\u{307}', '.'];
        for round in 0..30_000 {
            let long = round % 50 == 0;
            let nlen = if long { 60 + next(100) } else { next(16) };
            let n: String = (0..nlen)
                .map(|_| name_chars[next(name_chars.len())])
                .collect();
            let p: String = if long {
                // Long patterns, cut from the name so that they match far
                // into it, past the first 64-bit word of positions.
                n.chars()
                    .map(|c| match next(12) {
                        0 => '?',
                        1 => '>',
                        2 => '<',
                        3 => '*',
                        4 if c == '.' => '"',
                        5 => c.to_uppercase().next().unwrap_or(c),
                        _ => c,
                    })
                    .collect()
            } else {
                (0..next(14))
                    .map(|_| pattern_chars[next(pattern_chars.len())])
                    .collect()
            };
            let compiled = SearchPattern::parse(&p).unwrap();
            assert_eq!(
                compiled.matches(&n),
                reference_match(compiled.as_str(), &n),
                "pattern {p:?} name {n:?}"
            );
        }
    }

    /// Matches that need every word of the position set and runs of
    /// skippable tokens that cross word boundaries.
    #[test]
    fn long_patterns_cross_words() {
        let name = format!("{}.{}", "x".repeat(150), "y".repeat(100));
        for p in [
            format!("{}.{}", "?".repeat(150), "y".repeat(100)),
            format!("{}\"{}", ">".repeat(150), "?".repeat(100)),
            format!("<{}", "y".repeat(100)),
            format!("{}<.{}*", "x".repeat(63), "y".repeat(90)),
            format!("{}{}", ">".repeat(120), "*"),
            // 'İ' folds to two characters: 510 positions, 8 words.
            format!("{}*", "İ".repeat(254)),
        ] {
            assert_eq!(
                SearchPattern::parse(&p).unwrap().matches(&name),
                reference_match(&p, &name),
                "pattern {p:?}"
            );
        }
        let upper = "İ".repeat(255);
        let lower = "i\u{307}".repeat(255);
        assert!(matches(&upper, &lower));
        assert!(!matches(&upper, &lower[..lower.len() - "\u{307}".len()]));
    }

    /// The worst patterns the length cap allows, against long names: a
    /// linear pass each (the reference takes seconds per name for these).
    #[test]
    fn hostile_patterns_stay_cheap() {
        let names: Vec<String> = (0..2000)
            .map(|i| format!("{i:04}{}", "n".repeat(200)))
            .collect();
        let dotted: Vec<String> = (0..2000)
            .map(|i| format!("{i:04}{}.{}", "n.".repeat(90), "x".repeat(20)))
            .collect();
        let start = std::time::Instant::now();
        for p in [
            "<?".repeat(127),
            "*?<".repeat(85),
            ">".repeat(255),
            "?*".repeat(127),
        ] {
            let p = SearchPattern::parse(&p).unwrap();
            for n in names.iter().chain(&dotted) {
                std::hint::black_box(p.matches(n));
            }
        }
        // Generous: well under a second in a debug build.
        assert!(start.elapsed() < std::time::Duration::from_secs(20));
    }
}
