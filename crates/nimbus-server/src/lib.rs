//! The Nimbus SMB server: listeners, the connection loop, the dispatch
//! table and one handler module per SMB2 command, the services still tied
//! to `Server` (durable and persistent handles and their failover,
//! sessions, status), and `Server::new`, which wires every layer.
//!
//! Below it: `nimbus-transport` (connection security, credits),
//! `nimbus-services` (opens, oplocks and leases, locks, notify, ACLs,
//! metrics) and `nimbus-cluster` (membership, relay, node-to-node
//! messages). Nothing
//! here may be imported by them. Handlers never call a crypto library;
//! they see typed requests and return typed responses or an NTSTATUS.
//!
//! Start reading at [`Server`] (`server.rs`), then `dispatch.rs` and
//! `connection.rs`.

mod admission;
mod apple;
// The layers below live in crates of their own; these paths keep the
// server's `crate::notify::...` and `nimbus_server::metrics::...` uses.
pub use nimbus_cluster::cluster;
use nimbus_cluster::{
    app_instance_handover, claims, cluster_notify, dir_leases, lease_ack_handover, let_go_handover,
    message, session_handover,
};
pub use nimbus_services::metrics;
use nimbus_services::{
    accounts, acl, dir_budget, dosinfo, durable_handle, eas, errors, held_bytes, locks, log_limit,
    lookup, memory_use, notify, open, open_files, open_registry, oplocks, pending, share, sync,
    write_times,
};
use nimbus_transport::{arrivals, credits, security};
// `crate::config::...` and `nimbus_server::config::...` name the
// configuration crate's modules.
pub use nimbus_config::{config, limits};
mod connection;
mod dispatch;
mod drain;
mod durable;
mod failover;
mod fileinfo;
#[doc(hidden)]
#[cfg(feature = "fuzzing")]
pub mod fuzz_api;
mod gauges;
mod handlers;
mod interfaces;
mod lease_loss;
mod logon_guard;
mod persist;
pub mod reload;
mod server;
mod session;
mod session_registry;
pub mod status;
pub mod status_listing;
mod teardowns;

pub use config::{Config, ConfigError, LogFormat, ShareConfig, SigningPolicy};
pub use server::{kerberos_acceptor, KeytabError, Server, StartError};
