//! What the cluster's state layer counts for the Prometheus endpoint:
//! calls to etcd by RPC, and files moving between nodes. Through the
//! `metrics` facade: nothing is recorded until the binary installs an
//! exporter, and the names are described there (nimbus-server's
//! `metrics::describe`).

use std::time::Instant;

use metrics::{counter, histogram};

/// Calls to etcd by RPC ("Range", "Txn", "LeaseGrant", "LeaseKeepAlive",
/// "LeaseRevoke", "Status") and result ("ok", "error").
pub const ETCD_REQUESTS: &str = "nimbus_etcd_requests_total";
/// Their latency, retries on other members included.
pub const ETCD_REQUEST_SECONDS: &str = "nimbus_etcd_request_duration_seconds";
/// Files this node took into its memory (it decides them alone).
pub const FILES_TAKEN: &str = "nimbus_cluster_files_taken_total";
/// Files it handed back to etcd (asked by another node, idle, or leaving).
pub const FILES_GIVEN_BACK: &str = "nimbus_cluster_files_given_back_total";
/// Requests it sent another node to hand a file over.
pub const HANDOVER_REQUESTS: &str = "nimbus_cluster_handover_requests_total";
/// Ownerships of files by node runs that were gone (died, left, lost
/// their lease) that it deleted from etcd.
pub const GONE_OWNERS_CLEARED: &str = "nimbus_cluster_gone_owners_cleared_total";

pub(crate) fn etcd_call(kind: &'static str, ok: bool, started: Instant) {
    let result = if ok { "ok" } else { "error" };
    counter!(ETCD_REQUESTS, "kind" => kind, "result" => result).increment(1);
    histogram!(ETCD_REQUEST_SECONDS, "kind" => kind).record(started.elapsed().as_secs_f64());
}

pub(crate) fn file_taken() {
    counter!(FILES_TAKEN).increment(1);
}

pub(crate) fn file_given_back() {
    counter!(FILES_GIVEN_BACK).increment(1);
}

pub(crate) fn handover_asked() {
    counter!(HANDOVER_REQUESTS).increment(1);
}

pub(crate) fn gone_owner_cleared() {
    counter!(GONE_OWNERS_CLEARED).increment(1);
}
