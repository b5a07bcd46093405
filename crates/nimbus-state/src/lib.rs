//! Protocol state that more than one open (and, in a cluster, more than one
//! node) must agree on. `StateStore` is the transactional key-value seam;
//! `memory` is the single-node backend for what dies with the process,
//! `redb_store` the one on disk for what must outlive it; `share_modes` keeps the opens of each
//! file on top of it. Session keys and other secrets never go in here.

pub mod blocking;
pub mod byte_range;
pub mod caching;
pub mod cluster_store;
/// The suite every `StateStore` backend passes.
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod durable_record;
mod etcd_rpc;
pub mod etcd_seal;
pub mod etcd_store;
/// A real etcd cluster for tests, here and in the crates above.
#[cfg(any(test, feature = "conformance"))]
pub mod etcd_test_cluster;
pub mod etcd_watch;
mod file_key;
pub mod group_commit;
pub mod group_leases;
pub mod grouped_opens;
pub mod journal;
pub mod memory;
pub mod metrics_names;
pub mod records;
pub mod redb_store;
pub mod share_modes;
pub mod store;
/// Holds a thread at a point of the code, for tests here and above.
#[cfg(any(test, feature = "conformance"))]
pub mod test_gate;

pub use byte_range::{LockError, LockRange, RangeLock};
pub use cluster_store::{made_here, of_a_directory, opening_in, OpeningIn};
pub use etcd_store::EtcdStore;
pub use memory::MemoryStore;
pub use redb_store::RedbStore;
pub use share_modes::{AttributeOpen, FileKey, FileRecord, OpenRecord, ShareModes, SharingError};
pub use store::{Change, Durability, InPlace, Memo, StateError, StateStore, Together, Versioned};
