//! The Nimbus SMB server: listeners, the connection loop, connection
//! security (signing), the dispatch table and one handler module per SMB2
//! command. Handlers never call a crypto library; they see typed requests
//! and return typed responses or an NTSTATUS.

mod accounts;
mod acl;
mod admission;
mod app_instance_handover;
mod apple;
mod arrivals;
mod claims;
pub mod cluster;
mod cluster_notify;
mod cluster_registry;
// The configuration lives in its own crate; these paths keep the
// server's `crate::config::...` and `nimbus_server::config::...` uses.
use nimbus_config::hide;
pub use nimbus_config::{config, limits};
mod connection;
mod credits;
mod dir_budget;
mod dir_leases;
mod dispatch;
mod dosinfo;
mod drain;
mod durable;
mod durable_handle;
mod eas;
mod errors;
mod failover;
mod fileinfo;
#[doc(hidden)]
#[cfg(feature = "fuzzing")]
pub mod fuzz_api;
mod gauges;
mod handlers;
mod held_bytes;
mod interfaces;
mod lease_ack_handover;
mod lease_loss;
mod locks;
mod log_limit;
mod logon_guard;
mod lookup;
mod memory_use;
pub mod metrics;
mod node_message;
mod notify;
mod open;
mod open_files;
mod open_registry;
mod oplocks;
mod pending;
mod persist;
pub mod reload;
mod security;
mod server;
mod session;
mod session_handover;
mod session_registry;
mod share;
pub mod status;
pub mod status_listing;
mod sync;
mod teardowns;
mod write_times;

pub use config::{Config, ConfigError, LogFormat, ShareConfig, SigningPolicy};
pub use server::{kerberos_acceptor, Server, StartError};
