//! What the server counts for Prometheus: the names, units and labels of
//! every metric, and one small function per event.
//!
//! The server only records, through the `metrics` facade; the binary
//! installs the exporter when `[metrics] listen` is set. Without it every
//! call here is a no-op, so a server without metrics pays for none.
//! Labels take few values (a command, an NTSTATUS name, a share, a limit),
//! never a client address, a user or a path.

use std::sync::OnceLock;
use std::time::Instant;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Histogram, Unit,
};
use nimbus_wire::{Command, NtStatus};

pub const REQUESTS: &str = "nimbus_smb_requests_total";
pub const REQUEST_SECONDS: &str = "nimbus_smb_request_duration_seconds";
pub const READ_BYTES: &str = "nimbus_smb_read_bytes_total";
pub const WRITTEN_BYTES: &str = "nimbus_smb_written_bytes_total";
pub const CONNECTIONS: &str = "nimbus_connections";
pub const REFUSED: &str = "nimbus_connections_refused_total";
pub const EVICTED: &str = "nimbus_connections_evicted_total";
pub const LOGONS: &str = "nimbus_logons_total";
pub const SESSIONS: &str = "nimbus_sessions";
pub const BREAKS: &str = "nimbus_breaks_sent_total";
pub const BREAK_TIMEOUTS: &str = "nimbus_break_timeouts_total";
pub const LOCK_WAITS: &str = "nimbus_byte_range_lock_waits_total";
pub const READER_WAITS: &str = "nimbus_connection_reader_waits_total";
pub const HANDLES_WAITING: &str = "nimbus_durable_handles_waiting";
pub const LEASE_PROVEN: &str = "nimbus_cluster_lease_proven";
pub const LEASE_RENEWALS: &str = "nimbus_cluster_lease_renewals_total";
pub const HEAP_IN_USE: &str = "nimbus_heap_in_use_bytes";
pub const RESIDENT: &str = "nimbus_resident_memory_bytes";

/// Buckets of the latency histograms, in seconds: from 50 µs (a cached
/// stat) to 30 s (a CREATE waiting out a break).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];

/// Describes every metric (its HELP line and unit), once, when the
/// exporter is installed.
pub fn describe() {
    describe_counter!(
        REQUESTS,
        "SMB2 requests answered, by command and final NTSTATUS"
    );
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "time from reading an SMB2 request to its final response, by command"
    );
    describe_counter!(READ_BYTES, Unit::Bytes, "bytes returned by READ, by share");
    describe_counter!(
        WRITTEN_BYTES,
        Unit::Bytes,
        "bytes written by WRITE, by share"
    );
    describe_gauge!(
        CONNECTIONS,
        "open client connections, by state (logged_on, not_logged_on)"
    );
    describe_counter!(
        REFUSED,
        "connections refused at accept, by the limit that refused them"
    );
    describe_counter!(
        EVICTED,
        "connections not logged on closed to make room for a new one"
    );
    describe_gauge!(
        SESSIONS,
        "sessions logged on, by dialect, signing algorithm and cipher (none when the session \
         does not sign, or encrypts nothing); refreshed every 2 s"
    );
    describe_counter!(
        BREAKS,
        "oplock and lease breaks sent to clients, by kind (oplock, lease)"
    );
    describe_counter!(
        BREAK_TIMEOUTS,
        "breaks not acknowledged within limits.oplock_break_timeout_secs"
    );
    describe_counter!(
        LOCK_WAITS,
        "byte-range LOCK requests that had to wait for a conflicting lock"
    );
    describe_counter!(
        READER_WAITS,
        "waits of a connection's reader for answers to go out before it took the next request \
         (for its slot, its frame's room or its answers' room), by the limit whose budget \
         was used up (limits.max_outstanding_requests or limits.max_connection_memory_bytes)"
    );
    describe_gauge!(
        HANDLES_WAITING,
        "durable and persistent handles waiting for their client to reconnect; refreshed every 2 s"
    );
    describe_gauge!(
        LEASE_PROVEN,
        "a cluster node's etcd lease: 1 while proven within node_ttl_secs, 0 once lost"
    );
    describe_counter!(
        LEASE_RENEWALS,
        "a cluster node's lease renewals, by result (ok, failed, lost)"
    );
    describe_gauge!(
        HEAP_IN_USE,
        Unit::Bytes,
        "memory the allocator has handed out and not had back (glibc's count); refreshed every 2 s"
    );
    describe_gauge!(
        RESIDENT,
        Unit::Bytes,
        "the process's resident set, freed pages the allocator keeps included; refreshed every 2 s"
    );
    use nimbus_state::metrics_names as state;
    describe_counter!(
        state::ETCD_REQUESTS,
        "a cluster node's calls to etcd, by RPC (Range, Txn, LeaseGrant, LeaseKeepAlive, \
         LeaseRevoke) and result (ok, error)"
    );
    describe_histogram!(
        state::ETCD_REQUEST_SECONDS,
        Unit::Seconds,
        "time of a cluster node's calls to etcd, by RPC, retries on other members included"
    );
    describe_counter!(
        state::FILES_TAKEN,
        "files a cluster node took into its memory, deciding them alone"
    );
    describe_counter!(
        state::FILES_GIVEN_BACK,
        "files a cluster node handed back to etcd"
    );
    describe_counter!(
        state::HANDOVER_REQUESTS,
        "requests a cluster node sent another to hand a file over"
    );
    describe_counter!(
        state::GONE_OWNERS_CLEARED,
        "ownerships of files by node runs that were gone, deleted from etcd by this node"
    );
    describe_counter!(
        LOGONS,
        "session logons, by method (ntlm, kerberos, guest, anonymous; unknown for a failure) \
         and result (success, failure)"
    );
}

fn command_name(command: u16) -> &'static str {
    match Command::from_u16(command) {
        Some(Command::Negotiate) => "negotiate",
        Some(Command::SessionSetup) => "session_setup",
        Some(Command::Logoff) => "logoff",
        Some(Command::TreeConnect) => "tree_connect",
        Some(Command::TreeDisconnect) => "tree_disconnect",
        Some(Command::Create) => "create",
        Some(Command::Close) => "close",
        Some(Command::Flush) => "flush",
        Some(Command::Read) => "read",
        Some(Command::Write) => "write",
        Some(Command::Lock) => "lock",
        Some(Command::Ioctl) => "ioctl",
        Some(Command::Cancel) => "cancel",
        Some(Command::Echo) => "echo",
        Some(Command::QueryDirectory) => "query_directory",
        Some(Command::ChangeNotify) => "change_notify",
        Some(Command::QueryInfo) => "query_info",
        Some(Command::SetInfo) => "set_info",
        Some(Command::OplockBreak) => "oplock_break",
        None => "unknown",
    }
}

fn status_name(status: NtStatus) -> &'static str {
    status.name().unwrap_or("OTHER")
}

/// Each command's latency histogram and success counter, registered at
/// the first request (after the exporter was installed, which is before
/// the server is made): a request then costs two atomic updates, not two
/// lookups by label. Other statuses are looked up by label; they are rare.
struct CommandMetrics {
    success: Counter,
    latency: Histogram,
}

fn command_metrics() -> &'static [CommandMetrics] {
    static COMMANDS: OnceLock<Vec<CommandMetrics>> = OnceLock::new();
    COMMANDS.get_or_init(|| {
        (0..=Command::OplockBreak as u16)
            .map(|c| {
                let command = command_name(c);
                CommandMetrics {
                    success: counter!(REQUESTS, "command" => command, "status" => status_name(NtStatus::SUCCESS)),
                    latency: histogram!(REQUEST_SECONDS, "command" => command),
                }
            })
            .collect()
    })
}

/// A request got its final response (not an interim STATUS_PENDING).
pub fn request_answered(command: u16, status: NtStatus, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    match command_metrics().get(command as usize) {
        Some(m) => {
            if status == NtStatus::SUCCESS {
                m.success.increment(1);
            } else {
                let name = command_name(command);
                counter!(REQUESTS, "command" => name, "status" => status_name(status)).increment(1);
            }
            m.latency.record(seconds);
        }
        None => {
            counter!(REQUESTS, "command" => "unknown", "status" => status_name(status))
                .increment(1);
            histogram!(REQUEST_SECONDS, "command" => "unknown").record(seconds);
        }
    }
}

/// A share's byte counters, registered once when the share is made (a
/// READ or WRITE then costs an atomic add, no lookup).
pub struct ShareCounters {
    read: Counter,
    written: Counter,
}

impl ShareCounters {
    pub fn new(share: &str) -> ShareCounters {
        ShareCounters {
            read: counter!(READ_BYTES, "share" => share.to_owned()),
            written: counter!(WRITTEN_BYTES, "share" => share.to_owned()),
        }
    }

    pub fn read(&self, n: usize) {
        self.read.increment(n as u64);
    }

    pub fn written(&self, n: usize) {
        self.written.increment(n as u64);
    }
}

/// The connections now open, after an admission, a logon or a close.
pub fn connections(total: usize, not_logged_on: usize) {
    gauge!(CONNECTIONS, "state" => "not_logged_on").set(not_logged_on as f64);
    gauge!(CONNECTIONS, "state" => "logged_on").set(total.saturating_sub(not_logged_on) as f64);
}

/// `limit` is the configuration key that refused the connection.
pub fn refused(limit: &'static str) {
    counter!(REFUSED, "limit" => limit).increment(1);
}

pub fn evicted() {
    counter!(EVICTED).increment(1);
}

pub fn logon(method: &'static str, success: bool) {
    let result = if success { "success" } else { "failure" };
    counter!(LOGONS, "method" => method, "result" => result).increment(1);
}

/// A break sent to a client: `lease`, or an oplock's.
pub fn break_sent(lease: bool) {
    let kind = if lease { "lease" } else { "oplock" };
    counter!(BREAKS, "kind" => kind).increment(1);
}

pub fn break_timed_out() {
    counter!(BREAK_TIMEOUTS).increment(1);
}

pub fn lock_waited() {
    counter!(LOCK_WAITS).increment(1);
}

/// A connection's reader waited for room: `limit` is the configuration
/// key whose budget its requests in flight had used up.
pub fn reader_waited(limit: &'static str) {
    counter!(READER_WAITS, "limit" => limit).increment(1);
}

/// The sessions now, by (dialect, signing, cipher): every group seen
/// before and gone now is set to 0, so that a scrape never shows a count
/// that ended.
pub fn sessions(
    groups: &std::collections::HashMap<(&'static str, &'static str, &'static str), usize>,
) {
    use std::collections::HashSet;
    type Key = (&'static str, &'static str, &'static str);
    static SEEN: std::sync::Mutex<Option<HashSet<Key>>> = std::sync::Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let seen = seen.get_or_insert_with(HashSet::new);
    for key in seen.iter() {
        if !groups.contains_key(key) {
            gauge!(SESSIONS, "dialect" => key.0, "signing" => key.1, "encryption" => key.2)
                .set(0.0);
        }
    }
    for (key, n) in groups {
        gauge!(SESSIONS, "dialect" => key.0, "signing" => key.1, "encryption" => key.2)
            .set(*n as f64);
        seen.insert(*key);
    }
}

pub fn handles_waiting(n: usize) {
    gauge!(HANDLES_WAITING).set(n as f64);
}

/// The process's memory: the heap in use and the resident set, in bytes
/// (`crate::memory_use`); a figure the system does not give is not set.
pub fn memory(heap_in_use: Option<u64>, resident: Option<u64>) {
    if let Some(n) = heap_in_use {
        gauge!(HEAP_IN_USE).set(n as f64);
    }
    if let Some(n) = resident {
        gauge!(RESIDENT).set(n as f64);
    }
}

/// A cluster node's lease renewal: "ok", "failed" (tried again soon) or
/// "lost" (etcd had ended it).
pub fn lease_renewal(result: &'static str) {
    counter!(LEASE_RENEWALS, "result" => result).increment(1);
}

pub fn lease_proven(proven: bool) {
    gauge!(LEASE_PROVEN).set(if proven { 1.0 } else { 0.0 });
}
