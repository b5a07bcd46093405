//! The protocol state services of one node: the open registry and what an
//! open holds, oplocks and leases, byte-range locks, change notify, write
//! times, requests that
//! complete later (STATUS_PENDING), Windows permissions (ACLs), extended
//! attributes, and the budgets a connection's opens draw on. Also the
//! pieces every layer above uses: the one mutex helper (`sync::lock`) and
//! the metrics.
//!
//! Knows the state rules (`nimbus-state`), the file system (`nimbus-vfs`),
//! the wire format and connection security (`nimbus-transport`, to sign an
//! answer that completes later). Must not know the server, a connection,
//! a handler or etcd: delivery goes through narrow traits that the
//! layers above implement: a connection is a `pending::ResponseChannel`
//! and a session's channels an `oplocks::SessionChannels` (the server),
//! the way to other nodes an `oplocks::Notifier` forward and a
//! `notify::Relay` (the cluster).
//!
//! Start reading at [`open::Open`], then [`locks::ByteRangeLocks`] and
//! [`notify::ChangeNotify`].

pub mod accounts;
pub mod acl;
pub mod dir_budget;
pub mod dosinfo;
pub mod durable_handle;
pub mod eas;
pub mod errors;
pub mod held_bytes;
pub mod locks;
pub mod log_limit;
pub mod lookup;
pub mod memory_use;
pub mod metrics;
pub mod notify;
pub mod open;
pub mod open_files;
pub mod open_registry;
pub mod oplocks;
pub mod pending;
pub mod share;
pub mod sync;
pub mod write_times;

// The configuration and connection security live in crates of their own;
// these paths keep the modules' `crate::config::...` uses.
use nimbus_config::{config, hide, limits};
use nimbus_transport::security;
