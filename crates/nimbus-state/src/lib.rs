//! nimbus-state
