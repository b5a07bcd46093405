//! nimbus-auth: the user database and the SPNEGO acceptor (NTLMv2, and
//! Kerberos through the system's GSS-API).
//!
//! This crate knows tokens, not SMB: the server hands it the security buffer
//! of each SESSION_SETUP request and gets back a token to send and, at the
//! end, the user and the session key. All cryptography goes through
//! [`nimbus_crypto::CryptoProvider`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod acceptor;
mod auth_config;
mod binding;
mod der;
mod kerberos;
mod kerberos_security;
mod ntlm;
mod session_security;
mod spnego;
mod userdb;

pub use acceptor::{AuthError, AuthExchange, AuthResult, AuthStep, Authenticator};
pub use auth_config::AuthConfig;
pub use kerberos::{KerberosAcceptor, PrincipalMap};
pub use kerberos_security::KerberosSessionSecurity;
pub use nimbus_gssapi::GssError;
pub use session_security::{BadSignature, NtlmSessionSecurity, SIGNATURE_LEN};
pub use userdb::{MachineSid, NtHash, UserDb, UserDbError, FIRST_USER_RID};
