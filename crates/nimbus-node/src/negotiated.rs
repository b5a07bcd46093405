//! What NEGOTIATE settled for a connection, kept by the connection and by
//! each session it made: a channel bound later must match it.

use nimbus_crypto::{CipherAlgorithm, SigningAlgorithm};
use nimbus_wire::negotiate::Dialect;

/// What NEGOTIATE settled (MS-SMB2 3.3.1.7 Connection).
pub struct Negotiated {
    pub dialect: Dialect,
    pub client_guid: [u8; 16],
    pub client_security_mode: u16,
    pub client_capabilities: u32,
    pub client_dialects: Vec<u16>,
    pub server_security_mode: u16,
    pub server_capabilities: u32,
    pub signing_algorithm: SigningAlgorithm,
    /// Connection.CipherId: None if the client cannot encrypt.
    pub cipher: Option<CipherAlgorithm>,
    pub max_io: u32,
}
