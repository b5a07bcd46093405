//! nimbus-auth: the user database and the SPNEGO / NTLMv2 acceptor.
//!
//! This crate knows tokens, not SMB: the server hands it the security buffer
//! of each SESSION_SETUP request and gets back a token to send and, at the
//! end, the user and the session key. All cryptography goes through
//! [`nimbus_crypto::CryptoProvider`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acceptor;
mod binding;
mod der;
mod ntlm;
mod spnego;
mod userdb;

pub use acceptor::{AuthConfig, AuthError, AuthExchange, AuthResult, AuthStep, Authenticator};
pub use userdb::{NtHash, UserDb, UserDbError};
