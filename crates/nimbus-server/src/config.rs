//! Server configuration: the TOML file format, its validation, and the
//! command-line overrides. Every error names the file, the key and the fix.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Whether authenticated sessions must sign every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SigningPolicy {
    /// Every request of an authenticated session must carry a valid signature.
    #[default]
    Required,
    /// Sign when the client asks for it (or requires it).
    Auto,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareConfig {
    pub name: String,
    pub path: PathBuf,
    pub read_only: bool,
    /// Allow unauthenticated (guest/anonymous) sessions to use this share.
    pub guest_ok: bool,
}

/// The validated configuration the server runs with.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: Vec<SocketAddr>,
    pub user_db: PathBuf,
    pub signing: SigningPolicy,
    pub shares: Vec<ShareConfig>,
    /// NetBIOS name reported in NTLM challenges.
    pub server_name: String,
    pub workgroup: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 445))],
            user_db: PathBuf::from("users.db"),
            signing: SigningPolicy::Required,
            shares: Vec::new(),
            server_name: "NIMBUS".into(),
            workgroup: "WORKGROUP".into(),
        }
    }
}

/// A configuration problem, with where it is and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub key: String,
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {} (fix: {})",
            self.file, self.key, self.problem, self.fix
        )
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Vec<String>>,
    user_db: Option<PathBuf>,
    server_name: Option<String>,
    workgroup: Option<String>,
    security: Option<RawSecurity>,
    #[serde(default)]
    share: Vec<RawShare>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    signing: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShare {
    name: String,
    path: PathBuf,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    guest_ok: bool,
}

impl Config {
    /// Parses and validates a TOML file. Returns every problem found, not
    /// just the first, so one run of `nimbus config check` shows them all.
    pub fn from_file(path: &Path) -> Result<Config, Vec<ConfigError>> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![ConfigError {
                file: file.clone(),
                key: "-".into(),
                problem: format!("cannot read the file: {e}"),
                fix: "pass the path of a readable TOML file to --config".into(),
            }]
        })?;
        Self::from_toml(&file, &text, path.parent())
    }

    /// `base` resolves relative paths (user_db, share paths) against the
    /// directory holding the config file.
    pub fn from_toml(
        file: &str,
        text: &str,
        base: Option<&Path>,
    ) -> Result<Config, Vec<ConfigError>> {
        let err = |key: &str, problem: String, fix: &str| ConfigError {
            file: file.to_string(),
            key: key.to_string(),
            problem,
            fix: fix.to_string(),
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .unwrap_or(0);
            vec![err(
                &format!("line {line}"),
                msg,
                "see README.md for the keys: listen, user_db, server_name, workgroup, [security] signing, [[share]] name/path/read_only/guest_ok",
            )]
        })?;
        let mut errors = Vec::new();
        let resolve = |p: PathBuf| match base {
            Some(b) if p.is_relative() && !b.as_os_str().is_empty() => b.join(p),
            _ => p,
        };
        let mut cfg = Config::default();
        if let Some(listen) = raw.listen {
            cfg.listen.clear();
            for (i, l) in listen.iter().enumerate() {
                match l.parse::<SocketAddr>() {
                    Ok(a) => cfg.listen.push(a),
                    Err(_) => errors.push(err(
                        &format!("listen[{i}]"),
                        format!("\"{l}\" is not an address and port"),
                        "write an IP address and port such as \"127.0.0.1:4450\" or \"[::1]:445\"",
                    )),
                }
            }
            if listen.is_empty() {
                errors.push(err(
                    "listen",
                    "no address given".into(),
                    "list at least one address, e.g. listen = [\"127.0.0.1:4450\"]",
                ));
            }
        }
        if let Some(db) = raw.user_db {
            cfg.user_db = resolve(db);
        }
        if let Some(n) = raw.server_name {
            cfg.server_name = n;
        }
        if let Some(w) = raw.workgroup {
            cfg.workgroup = w;
        }
        if let Some(sec) = raw.security {
            if let Some(s) = sec.signing {
                match s.as_str() {
                    "required" => cfg.signing = SigningPolicy::Required,
                    "auto" => cfg.signing = SigningPolicy::Auto,
                    other => errors.push(err(
                        "security.signing",
                        format!("unknown value \"{other}\""),
                        "write signing = \"required\" or signing = \"auto\"",
                    )),
                }
            }
        }
        for (i, s) in raw.share.into_iter().enumerate() {
            cfg.shares.push(ShareConfig {
                name: s.name,
                path: resolve(s.path),
                read_only: s.read_only,
                guest_ok: s.guest_ok,
            });
            let _ = i;
        }
        errors.extend(cfg.validate_shares(file));
        if errors.is_empty() {
            Ok(cfg)
        } else {
            Err(errors)
        }
    }

    /// Checks the shares: valid unique names, existing directories.
    pub fn validate_shares(&self, file: &str) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut seen = HashSet::new();
        for (i, s) in self.shares.iter().enumerate() {
            let key = format!("share[{i}]");
            let bad_char = s
                .name
                .chars()
                .any(|c| c.is_control() || "\\/:*?\"<>|[]+=;,".contains(c));
            if s.name.is_empty() || s.name.len() > 80 || bad_char {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.name"),
                    problem: format!("\"{}\" is not a valid share name", s.name),
                    fix: "use 1 to 80 letters, digits, '-', '_', '.', '$' or spaces".into(),
                });
            }
            if s.name.eq_ignore_ascii_case("IPC$") {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.name"),
                    problem: "IPC$ is reserved".into(),
                    fix: "choose another name".into(),
                });
            }
            if !seen.insert(s.name.to_lowercase()) {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.name"),
                    problem: format!(
                        "share \"{}\" is defined twice (names are case-insensitive)",
                        s.name
                    ),
                    fix: "give each share a distinct name".into(),
                });
            }
            if !s.path.is_dir() {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.path"),
                    problem: format!("\"{}\" is not an existing directory", s.path.display()),
                    fix: format!(
                        "create it (mkdir -p {}) or point path at an existing directory",
                        s.path.display()
                    ),
                });
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let dir = std::env::temp_dir();
        let text = format!(
            "listen = [\"127.0.0.1:4450\"]\nuser_db = \"users.db\"\n[security]\nsigning = \"required\"\n[[share]]\nname = \"data\"\npath = \"{}\"\nread_only = false\n",
            dir.display()
        );
        let cfg = Config::from_toml("t.toml", &text, Some(Path::new("/etc/nimbus"))).unwrap();
        assert_eq!(cfg.listen, vec!["127.0.0.1:4450".parse().unwrap()]);
        assert_eq!(cfg.user_db, PathBuf::from("/etc/nimbus/users.db"));
        assert_eq!(cfg.shares.len(), 1);
        assert_eq!(cfg.signing, SigningPolicy::Required);
    }

    #[test]
    fn reports_every_problem_with_key_and_fix() {
        let text = "listen = [\"nope\"]\n[security]\nsigning = \"maybe\"\n[[share]]\nname = \"a/b\"\npath = \"/definitely/missing\"\n";
        let errs = Config::from_toml("bad.toml", text, None).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert!(keys.contains(&"listen[0]"));
        assert!(keys.contains(&"security.signing"));
        assert!(keys.contains(&"share[0].name"));
        assert!(keys.contains(&"share[0].path"));
        assert!(errs.iter().all(|e| e.to_string().starts_with("bad.toml: ")));
    }

    #[test]
    fn unknown_keys_are_refused_with_a_line() {
        let errs =
            Config::from_toml("x.toml", "listen = []\nsigning = \"required\"\n", None).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].problem.contains("signing"), "{}", errs[0]);
    }
}
