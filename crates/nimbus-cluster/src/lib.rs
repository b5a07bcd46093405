//! The cluster: membership of the nodes in etcd (`cluster::Membership`),
//! the claims of a failover, the registry of change-notify watches and the
//! relay of changes between nodes, the directories whose leases other
//! nodes' clients hold, and the messages nodes send each other
//! (`message::ClusterMessage`): breaks, requests to let go of a durable
//! open, and the requests a client's request can wait on (a previous
//! session, an application instance, a lease acknowledgement that lives
//! on another node).
//!
//! Knows the store (`nimbus-state`) and the services' traits
//! (`nimbus-services`, e.g. `notify::Relay`); must not know the server, a
//! connection or a handler. Everything read from etcd is decoded as
//! untrusted input.
//!
//! Start reading at [`cluster::Membership`], then
//! [`cluster_notify`].

pub mod app_instance_handover;
pub mod claims;
pub mod cluster;
pub mod cluster_notify;
pub mod cluster_registry;
pub mod dir_leases;
pub mod group_revoke;
pub mod interest;
pub mod lease_ack_handover;
pub mod let_go_handover;
pub mod message;
pub mod node_message;
pub mod notify_recent;
pub mod session_handover;
pub mod sweeper;
pub mod unposted;
pub mod witness_move;
pub mod witness_records;

// The configuration and the services live in crates of their own; these
// paths keep the modules' `crate::config::...` uses.
use nimbus_config::config;
use nimbus_services::{errors, metrics, notify, open, oplocks, sync};
