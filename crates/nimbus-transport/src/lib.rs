//! What a connection needs below the requests it carries: connection
//! security (key derivation, signing, sealing), the credit window, and the
//! order in which a connection's requests may run.
//!
//! Knows the wire format and the crypto provider; knows no handler, no
//! service and no socket, so a second transport (QUIC) can use the same
//! pieces. Start reading at [`security::SessionCipher`] and
//! [`security::sign`], then [`credits::CreditWindow`].

pub mod arrivals;
pub mod credits;
pub mod security;
