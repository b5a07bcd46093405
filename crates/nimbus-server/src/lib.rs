//! nimbus-server
