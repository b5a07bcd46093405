//! A problem in a configuration file, as `nimbus config check` and a
//! refused start or reload report it. Below `config` and `limits`, which
//! both make them.

use std::fmt;

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
