//! The server's configuration: the TOML file read and checked
//! (`config::Config`, `config::Config::load`), the per-connection and
//! per-server limits (`limits::Limits`), the names a share hides
//! (`hide::HideNames`), and the errors that name the file, the key and the
//! fix (`config_error::ConfigError`).
//!
//! It knows the libraries whose settings it checks (crypto, auth, state)
//! and nothing of the server that runs with it: no sockets, no sessions,
//! no handlers. Start reading from `config::Config`.

pub mod config;
pub mod config_error;
pub mod hide;
pub mod limits;
pub mod listeners;
