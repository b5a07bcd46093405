//! The Nimbus SMB2 server: the dispatch table, which walks a frame's
//! compound chain and checks credits, session, signature and tree once per
//! request, and one handler module per SMB2 command, each turning a typed
//! request into calls on the services and a typed response or an NTSTATUS.
//!
//! Below it: `nimbus-node` (`Server`, the connection loop, sessions,
//! durable handles), and under that the services, the cluster and the
//! transport. Handlers never call a crypto library and never see signing,
//! sealing or credits; the connection loop reaches them only through
//! `connection::Dispatch`, which [`dispatcher`] gives.
//!
//! Start reading at `dispatch.rs`, then `ctx.rs` (what a handler is given)
//! and the handler of the command you care about (`handlers/`).

// The layers below: these paths keep the handlers' `crate::server::...`,
// `crate::notify::...` uses, and `nimbus_server::status::...` for the
// binary.
pub use nimbus_node::connection::frames;
pub use nimbus_node::{
    accounts, acl, admission, app_instance_handover, apple, arrivals, claims, cluster,
    cluster_notify, config, connection, credits, dir_budget, dir_leases, directory_scope,
    disconnected, dosinfo, drain, durable, durable_handle, eas, errors, failover, fileinfo, gauges,
    held_bytes, interfaces, lease_ack_handover, lease_loss, leaving, let_go_handover, limits,
    locks, log_limit, logon_guard, lookup, memory_use, message, metrics, notify, open, open_files,
    open_registry, oplocks, pending, persist, release, reload, rpc_logon_gate, security, server,
    session, session_end, session_handover, session_registry, share, status, status_listing, sync,
    teardowns, witness, witness_admin, witness_records, write_times,
};
pub use nimbus_node::{
    kerberos_acceptor, Config, ConfigError, KeytabError, LogFormat, Server, ShareConfig,
    SigningPolicy, StartError,
};

#[cfg(all(test, feature = "fuzzing"))]
mod channel_tests;
mod ctx;
mod dispatch;
#[doc(hidden)]
#[cfg(feature = "fuzzing")]
pub mod fuzz_api;
mod handlers;

/// The SMB2 dispatcher that `Server::run` hands each connection's frames to.
pub fn dispatcher() -> std::sync::Arc<dyn connection::Dispatch> {
    std::sync::Arc::new(dispatch::Smb2)
}
