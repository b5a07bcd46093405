//! QUERY_DIRECTORY search patterns (MS-FSA 2.1.4.4 wildcards, the checks of
//! MS-FSA 2.1.5.6.3) on attacker-chosen input: the bytes before the first
//! NUL are the pattern (a NUL is never valid in one), the rest the name.
//! The server's matcher (one pass over a bit set of pattern positions,
//! runs of `*` and `<` collapsed) must agree with this file's oracle, a
//! memoised recursion written straight from the wildcard definitions.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nimbus_server::fuzz_api::search_pattern;

/// Names longer than this are cut: the oracle is quadratic in memory.
const MAX_NAME_CHARS: usize = 1024;

fuzz_target!(|data: &[u8]| {
    let (pattern, name) = match data.iter().position(|b| *b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let pattern = String::from_utf8_lossy(pattern);
    let name: String = String::from_utf8_lossy(name)
        .chars()
        .take(MAX_NAME_CHARS)
        .collect();
    let Some(matched) = search_pattern(&pattern, &name) else {
        return;
    };
    let pattern = if pattern.is_empty() { "*" } else { &pattern };
    assert_eq!(
        matched,
        oracle(pattern, &name),
        "pattern {pattern:?} name {name:?}"
    );
});

/// Whether `name` matches `pattern`, both lower-cased as the server does,
/// by the definitions: `*` any run; `?` one character; `<` any run that
/// does not take the name's last dot; `>` one character but a dot, or
/// nothing at a dot or the end; `"` a dot, or nothing at the end.
fn oracle(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().flat_map(char::to_lowercase).collect();
    let n: Vec<char> = name.chars().flat_map(char::to_lowercase).collect();
    let last_dot = n.iter().rposition(|c| *c == '.');
    // known[i][j]: whether p[i..] matches n[j..], filled from the end.
    let width = n.len() + 1;
    let mut known = vec![false; (p.len() + 1) * width];
    known[p.len() * width + n.len()] = true;
    for i in (0..p.len()).rev() {
        for j in (0..=n.len()).rev() {
            let rest = |ii: usize, jj: usize| known[ii * width + jj];
            let at_end = j == n.len();
            let here = if at_end { None } else { Some(n[j]) };
            known[i * width + j] = match p[i] {
                '*' => rest(i + 1, j) || (!at_end && rest(i, j + 1)),
                '<' => rest(i + 1, j) || (!at_end && Some(j) != last_dot && rest(i, j + 1)),
                '?' => !at_end && rest(i + 1, j + 1),
                '>' => match here {
                    None | Some('.') => rest(i + 1, j),
                    Some(_) => rest(i + 1, j + 1),
                },
                '"' => match here {
                    None => rest(i + 1, j),
                    Some(c) => c == '.' && rest(i + 1, j + 1),
                },
                c => here == Some(c) && rest(i + 1, j + 1),
            };
        }
    }
    known[0]
}
