//! nimbus-auth
