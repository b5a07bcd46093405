//! A Nimbus node: `Server` (every service wired together, the shares,
//! the listeners), the connection loop, sessions, and what outlives a
//! connection: durable and persistent handles, their failover to other
//! nodes, the end of a session and the release of an open. Also what an
//! administrator sees and changes of a running node: status, reload.
//!
//! Below it: `nimbus-transport` (connection security, credits),
//! `nimbus-services` (opens, oplocks and leases, locks, notify, ACLs,
//! metrics) and `nimbus-cluster` (membership, relay, node-to-node
//! messages). It must not know the SMB2 handlers: the connection loop hands
//! each frame to a `connection::Dispatch`, which the crate above
//! (`nimbus-server`) implements.
//!
//! Start reading at [`Server`] (`server.rs`: what a node holds), then
//! `start.rs` (how it is built, run and stopped; the only module that
//! knows all the others) and `connection.rs`. A session sees its
//! connections only as `session::Channel`s, so sessions, durable handles
//! and failover never reach the connection loop.

pub mod admission;
pub mod apple;
// The layers below live in crates of their own; these paths keep the
// node's `crate::notify::...` and `nimbus_node::metrics::...` uses.
pub use nimbus_cluster::cluster;
pub use nimbus_cluster::{
    app_instance_handover, claims, cluster_notify, dir_leases, lease_ack_handover, let_go_handover,
    message, session_handover, witness_records,
};
pub use nimbus_services::metrics;
pub use nimbus_services::{
    accounts, acl, dir_budget, dosinfo, durable_handle, eas, errors, held_bytes, locks, log_limit,
    lookup, memory_use, notify, open, open_files, open_registry, oplocks, pending, share, sync,
    write_times,
};
pub use nimbus_transport::{arrivals, credits, security};
// `crate::config::...` and `nimbus_node::config::...` name the
// configuration crate's modules.
pub use nimbus_config::{config, limits};
pub mod connection;
pub mod directory_scope;
pub mod disconnected;
pub mod drain;
pub mod durable;
pub mod failover;
pub mod fileinfo;
pub mod gauges;
pub mod group_revoker;
pub mod interfaces;
pub mod lease_loss;
pub mod leaving;
pub mod logon_guard;
pub mod negotiated;
pub mod oplock_host;
pub mod persist;
pub mod release;
pub mod reload;
pub mod rpc_logon_gate;
pub mod server;
pub mod session;
pub mod session_end;
pub mod session_registry;
pub mod start;
pub mod status;
pub mod status_listing;
pub mod teardowns;
pub mod witness;
pub mod witness_admin;
pub mod witness_registry;

pub use config::{Config, ConfigError, LogFormat, ShareConfig, SigningPolicy};
pub use server::Server;
pub use start::{kerberos_acceptor, KeytabError, StartError};
