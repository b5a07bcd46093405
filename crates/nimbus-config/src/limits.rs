//! Resource limits (`[limits]` in the config file): every input a client
//! controls is bounded, each bound has a default suited to a real file
//! server, and each can be changed by the operator. Parsing checks every
//! value against the range it must lie in and says which key to fix.

use std::time::Duration;

use serde::Deserialize;

use crate::config_error::ConfigError;

/// Largest READ/WRITE/transact size Nimbus ever offers (LARGE_MTU, 2.1+).
pub const MAX_IO_SIZE: u32 = 8 * 1024 * 1024;
/// Room for headers beside the largest payload in one frame.
const FRAME_OVERHEAD: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest NBSS frame accepted; a longer length prefix closes the
    /// connection before anything is allocated.
    pub max_frame_bytes: usize,
    /// Credits a client may hold at once (the sequence window).
    pub max_credits: u16,
    /// Requests of one connection being processed or awaiting the send of
    /// their response; the next frame is not read until one finishes.
    pub max_outstanding_requests: usize,
    /// Bytes one connection may hold in received requests and their
    /// responses (a READ counts its credit charge in 64 KiB units); as much
    /// again in messages the server sends on its own (breaks, responses of
    /// requests that waited) that the client has not taken, beyond which
    /// the connection is closed as not reading, together with the answers
    /// its named pipes hold unread, beyond which a pipe write fails with
    /// STATUS_INSUFFICIENT_RESOURCES (`crate::held_bytes`).
    pub max_connection_memory_bytes: usize,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    /// Connections without a logged-on session.
    pub max_unauthenticated_connections: usize,
    /// A connection must log a session on within this long of connecting.
    pub unauthenticated_timeout: Duration,
    /// Once a frame's first byte has arrived, the rest must follow within
    /// this long (slow senders hold buffers).
    pub frame_timeout: Duration,
    /// Failed logons (within `failed_logon_window`) before a user name or
    /// a client address is refused for a back-off period.
    pub max_failed_logons_per_user: u32,
    pub max_failed_logons_per_address: u32,
    /// First back-off; it doubles with each further failure.
    pub logon_backoff: Duration,
    pub max_logon_backoff: Duration,
    /// Failures older than this are forgotten.
    pub failed_logon_window: Duration,
    /// How long an oplock or lease holder has to acknowledge a break before
    /// the server takes it as acknowledged and lets the waiting open go on
    /// (Windows: 35 s).
    pub oplock_break_timeout: Duration,
    pub max_open_files_per_session: usize,
    /// Named pipes one session may have open on IPC$ (they count as open
    /// files too); beyond, a CREATE of a pipe fails with
    /// STATUS_INSUFFICIENT_RESOURCES. A client uses one pipe per RPC service
    /// it talks to (srvsvc, wkssvc, lsarpc: Explorer, smbclient and
    /// rpcclient hold one to three at a time); 64 leaves room for many tools
    /// sharing a session, while each pipe may hold up to 1 MiB of answers
    /// its client has not read (`nimbus_rpc::pipe::MAX_QUEUED`).
    pub max_pipes_per_session: usize,
    /// Opens across the whole server; None: as many as the descriptor limit
    /// (RLIMIT_NOFILE, raised to its hard limit at start) leaves beside the
    /// connections' sockets and a reserve (see `open_files`).
    pub max_open_files: Option<usize>,
    /// Sessions one connection may hold, logged on or logging on.
    pub max_sessions_per_connection: usize,
    /// Connections one session may be bound to (multichannel), its first
    /// one included; 32 as on Windows.
    pub max_channels_per_session: usize,
    /// Of those, sessions whose SESSION_SETUP exchange is unfinished (each
    /// holds its authentication state).
    pub max_logons_in_progress: usize,
    /// Tree connects one session may hold.
    pub max_trees_per_session: usize,
    /// Requests of one connection answered STATUS_PENDING and still waiting
    /// (blocking locks); beyond, a request that would wait fails at once.
    pub max_pending_requests: usize,
    /// Byte-range locks one open may hold; a LOCK request that would pass
    /// it is refused whole with STATUS_INSUFFICIENT_RESOURCES. Windows has
    /// no fixed number (locks take kernel pool, which bounds them); the
    /// most a common application takes is Access/Jet's MaxLocksPerFile,
    /// 9,500 by default, which 16,384 leaves room for.
    pub max_byte_range_locks_per_open: usize,
    /// Byte-range locks on one file, all opens together, refused the same
    /// way. A file's locks are one record, rewritten (25 bytes a lock) on
    /// every LOCK and read by every READ and WRITE while it has any, so
    /// this bounds what one LOCK and one READ of the file cost: 65,536
    /// locks are a 1.6 MB record, four opens at the per-open cap.
    pub max_byte_range_locks_per_file: usize,
    /// Requests in one compound frame.
    pub max_compound_requests: usize,
    /// Bytes of directory entries returned by one QUERY_DIRECTORY.
    pub max_directory_response_bytes: usize,
    /// Names one directory enumeration holds in memory at once.
    pub max_directory_entries: usize,
    /// Directories watched on disk (inotify) at once for change notify, so
    /// that changes made outside SMB are reported; a WATCH_TREE takes one
    /// per directory of its tree. Beyond, changes made on disk in
    /// directories left unwatched go unseen (those made through SMB are
    /// always reported); 0 turns watching the disk off.
    pub max_inotify_watches: usize,
    /// How long a durable open is kept after its client's connection is
    /// lost, when the client names no timeout (v1 handles, and v2 ones
    /// asking for 0).
    pub durable_handle_timeout: Duration,
    /// The most a client may ask for in a v2 durable handle request.
    pub max_durable_handle_timeout: Duration,
    /// Durable opens kept without a connection, server-wide and per user;
    /// an open beyond either closes at its disconnect.
    pub max_durable_handles: usize,
    pub max_durable_handles_per_user: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: MAX_IO_SIZE as usize + FRAME_OVERHEAD,
            max_credits: 8192,
            max_outstanding_requests: 64,
            max_connection_memory_bytes: 32 * 1024 * 1024,
            max_connections: 4096,
            max_connections_per_address: 256,
            max_unauthenticated_connections: 512,
            unauthenticated_timeout: Duration::from_secs(30),
            frame_timeout: Duration::from_secs(120),
            max_failed_logons_per_user: 10,
            max_failed_logons_per_address: 30,
            logon_backoff: Duration::from_secs(2),
            max_logon_backoff: Duration::from_secs(300),
            failed_logon_window: Duration::from_secs(900),
            oplock_break_timeout: Duration::from_secs(35),
            max_open_files_per_session: 16384,
            max_pipes_per_session: 64,
            max_open_files: None,
            max_sessions_per_connection: 64,
            max_channels_per_session: 32,
            max_logons_in_progress: 8,
            max_trees_per_session: 1024,
            max_pending_requests: 256,
            max_byte_range_locks_per_open: 16384,
            max_byte_range_locks_per_file: 65536,
            max_compound_requests: 64,
            max_directory_response_bytes: 1024 * 1024,
            max_directory_entries: 1_000_000,
            max_inotify_watches: 8192,
            durable_handle_timeout: Duration::from_secs(60),
            max_durable_handle_timeout: Duration::from_secs(300),
            max_durable_handles: 16384,
            max_durable_handles_per_user: 4096,
        }
    }
}

impl Limits {
    /// The READ/WRITE/transact size offered to 2.1+ clients: the largest
    /// multiple of 64 KiB that fits a frame beside its headers.
    pub fn max_io(&self) -> u32 {
        let fits = self.max_frame_bytes.saturating_sub(FRAME_OVERHEAD) as u32;
        (fits / 65536 * 65536).clamp(65536, MAX_IO_SIZE)
    }
}

/// `[limits]` as written in the file.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    max_frame_bytes: Option<u64>,
    max_credits: Option<u64>,
    max_outstanding_requests: Option<u64>,
    max_connection_memory_bytes: Option<u64>,
    max_connections: Option<u64>,
    max_connections_per_address: Option<u64>,
    max_unauthenticated_connections: Option<u64>,
    unauthenticated_timeout_secs: Option<u64>,
    frame_timeout_secs: Option<u64>,
    max_failed_logons_per_user: Option<u64>,
    max_failed_logons_per_address: Option<u64>,
    logon_backoff_secs: Option<u64>,
    max_logon_backoff_secs: Option<u64>,
    failed_logon_window_secs: Option<u64>,
    oplock_break_timeout_secs: Option<u64>,
    max_open_files_per_session: Option<u64>,
    max_pipes_per_session: Option<u64>,
    max_open_files: Option<u64>,
    max_sessions_per_connection: Option<u64>,
    max_channels_per_session: Option<u64>,
    max_logons_in_progress: Option<u64>,
    max_trees_per_session: Option<u64>,
    max_pending_requests: Option<u64>,
    max_byte_range_locks_per_open: Option<u64>,
    max_byte_range_locks_per_file: Option<u64>,
    max_compound_requests: Option<u64>,
    max_directory_response_bytes: Option<u64>,
    max_directory_entries: Option<u64>,
    max_inotify_watches: Option<u64>,
    durable_handle_timeout_secs: Option<u64>,
    max_durable_handle_timeout_secs: Option<u64>,
    max_durable_handles: Option<u64>,
    max_durable_handles_per_user: Option<u64>,
}

/// Reads one key: absent keeps the default, out of range is an error that
/// gives the range.
struct Reader<'a> {
    file: &'a str,
    errors: Vec<ConfigError>,
}

impl Reader<'_> {
    fn get(&mut self, key: &str, value: Option<u64>, min: u64, max: u64, default: u64) -> u64 {
        match value {
            None => default,
            Some(v) if (min..=max).contains(&v) => v,
            Some(v) => {
                self.errors.push(ConfigError {
                    file: self.file.to_string(),
                    key: format!("limits.{key}"),
                    problem: format!("{v} is outside {min}..={max}"),
                    fix: format!(
                        "write a value from {min} to {max}, or remove the key for the default {default}"
                    ),
                });
                default
            }
        }
    }

    /// A key without a fixed default: absent is None.
    fn optional(
        &mut self,
        key: &str,
        value: Option<u64>,
        min: u64,
        max: u64,
        absent: &str,
    ) -> Option<u64> {
        let v = value?;
        if (min..=max).contains(&v) {
            return Some(v);
        }
        self.errors.push(ConfigError {
            file: self.file.to_string(),
            key: format!("limits.{key}"),
            problem: format!("{v} is outside {min}..={max}"),
            fix: format!("write a value from {min} to {max}, or remove the key {absent}"),
        });
        None
    }

    fn secs(&mut self, key: &str, value: Option<u64>, min: u64, max: u64, d: Duration) -> Duration {
        Duration::from_secs(self.get(key, value, min, max, d.as_secs()))
    }

    fn relation(&mut self, ok: bool, key: &str, problem: String, fix: String) {
        if !ok {
            self.errors.push(ConfigError {
                file: self.file.to_string(),
                key: format!("limits.{key}"),
                problem,
                fix,
            });
        }
    }
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

impl RawLimits {
    pub fn validate(self, file: &str) -> Result<Limits, Vec<ConfigError>> {
        let d = Limits::default();
        let mut r = Reader {
            file,
            errors: Vec::new(),
        };
        let max_frame = (MAX_IO_SIZE as usize + FRAME_OVERHEAD) as u64;
        let l = Limits {
            max_frame_bytes: r.get(
                "max_frame_bytes",
                self.max_frame_bytes,
                128 * KIB,
                max_frame,
                d.max_frame_bytes as u64,
            ) as usize,
            max_credits: r.get(
                "max_credits",
                self.max_credits,
                16,
                u16::MAX as u64,
                d.max_credits as u64,
            ) as u16,
            max_outstanding_requests: r.get(
                "max_outstanding_requests",
                self.max_outstanding_requests,
                1,
                4096,
                d.max_outstanding_requests as u64,
            ) as usize,
            max_connection_memory_bytes: r.get(
                "max_connection_memory_bytes",
                self.max_connection_memory_bytes,
                256 * KIB,
                64 * 1024 * MIB,
                d.max_connection_memory_bytes as u64,
            ) as usize,
            max_connections: r.get(
                "max_connections",
                self.max_connections,
                1,
                1 << 20,
                d.max_connections as u64,
            ) as usize,
            max_connections_per_address: r.get(
                "max_connections_per_address",
                self.max_connections_per_address,
                1,
                1 << 20,
                d.max_connections_per_address as u64,
            ) as usize,
            max_unauthenticated_connections: r.get(
                "max_unauthenticated_connections",
                self.max_unauthenticated_connections,
                1,
                1 << 20,
                d.max_unauthenticated_connections as u64,
            ) as usize,
            unauthenticated_timeout: r.secs(
                "unauthenticated_timeout_secs",
                self.unauthenticated_timeout_secs,
                1,
                3600,
                d.unauthenticated_timeout,
            ),
            oplock_break_timeout: r.secs(
                "oplock_break_timeout_secs",
                self.oplock_break_timeout_secs,
                1,
                3600,
                d.oplock_break_timeout,
            ),
            frame_timeout: r.secs(
                "frame_timeout_secs",
                self.frame_timeout_secs,
                1,
                3600,
                d.frame_timeout,
            ),
            max_failed_logons_per_user: r.get(
                "max_failed_logons_per_user",
                self.max_failed_logons_per_user,
                1,
                1_000_000,
                d.max_failed_logons_per_user as u64,
            ) as u32,
            max_failed_logons_per_address: r.get(
                "max_failed_logons_per_address",
                self.max_failed_logons_per_address,
                1,
                1_000_000,
                d.max_failed_logons_per_address as u64,
            ) as u32,
            logon_backoff: r.secs(
                "logon_backoff_secs",
                self.logon_backoff_secs,
                1,
                86400,
                d.logon_backoff,
            ),
            max_logon_backoff: r.secs(
                "max_logon_backoff_secs",
                self.max_logon_backoff_secs,
                1,
                86400,
                d.max_logon_backoff,
            ),
            failed_logon_window: r.secs(
                "failed_logon_window_secs",
                self.failed_logon_window_secs,
                1,
                7 * 86400,
                d.failed_logon_window,
            ),
            max_open_files_per_session: r.get(
                "max_open_files_per_session",
                self.max_open_files_per_session,
                1,
                1 << 24,
                d.max_open_files_per_session as u64,
            ) as usize,
            max_pipes_per_session: r.get(
                "max_pipes_per_session",
                self.max_pipes_per_session,
                1,
                65536,
                d.max_pipes_per_session as u64,
            ) as usize,
            max_open_files: r
                .optional(
                    "max_open_files",
                    self.max_open_files,
                    16,
                    1 << 30,
                    "to let the descriptor limit decide",
                )
                .map(|v| v as usize),
            max_sessions_per_connection: r.get(
                "max_sessions_per_connection",
                self.max_sessions_per_connection,
                1,
                65536,
                d.max_sessions_per_connection as u64,
            ) as usize,
            max_channels_per_session: r.get(
                "max_channels_per_session",
                self.max_channels_per_session,
                1,
                256,
                d.max_channels_per_session as u64,
            ) as usize,
            max_logons_in_progress: r.get(
                "max_logons_in_progress",
                self.max_logons_in_progress,
                1,
                65536,
                d.max_logons_in_progress as u64,
            ) as usize,
            max_trees_per_session: r.get(
                "max_trees_per_session",
                self.max_trees_per_session,
                1,
                65536,
                d.max_trees_per_session as u64,
            ) as usize,
            max_pending_requests: r.get(
                "max_pending_requests",
                self.max_pending_requests,
                1,
                65536,
                d.max_pending_requests as u64,
            ) as usize,
            max_byte_range_locks_per_open: r.get(
                "max_byte_range_locks_per_open",
                self.max_byte_range_locks_per_open,
                1,
                1 << 20,
                d.max_byte_range_locks_per_open as u64,
            ) as usize,
            max_byte_range_locks_per_file: r.get(
                "max_byte_range_locks_per_file",
                self.max_byte_range_locks_per_file,
                1,
                1 << 20,
                d.max_byte_range_locks_per_file as u64,
            ) as usize,
            max_compound_requests: r.get(
                "max_compound_requests",
                self.max_compound_requests,
                4,
                4096,
                d.max_compound_requests as u64,
            ) as usize,
            max_directory_response_bytes: r.get(
                "max_directory_response_bytes",
                self.max_directory_response_bytes,
                64 * KIB,
                MAX_IO_SIZE as u64,
                d.max_directory_response_bytes as u64,
            ) as usize,
            max_directory_entries: r.get(
                "max_directory_entries",
                self.max_directory_entries,
                1000,
                100_000_000,
                d.max_directory_entries as u64,
            ) as usize,
            max_inotify_watches: r.get(
                "max_inotify_watches",
                self.max_inotify_watches,
                0,
                1 << 20,
                d.max_inotify_watches as u64,
            ) as usize,
            durable_handle_timeout: r.secs(
                "durable_handle_timeout_secs",
                self.durable_handle_timeout_secs,
                1,
                86400,
                d.durable_handle_timeout,
            ),
            max_durable_handle_timeout: r.secs(
                "max_durable_handle_timeout_secs",
                self.max_durable_handle_timeout_secs,
                1,
                86400,
                d.max_durable_handle_timeout,
            ),
            max_durable_handles: r.get(
                "max_durable_handles",
                self.max_durable_handles,
                0,
                1 << 24,
                d.max_durable_handles as u64,
            ) as usize,
            max_durable_handles_per_user: r.get(
                "max_durable_handles_per_user",
                self.max_durable_handles_per_user,
                0,
                1 << 24,
                d.max_durable_handles_per_user as u64,
            ) as usize,
        };
        // One frame of the largest size and the largest response it may ask
        // for must fit the connection's budget, or that request would wait
        // forever.
        let needed = l.max_frame_bytes + l.max_io() as usize;
        r.relation(
            l.max_connection_memory_bytes >= needed,
            "max_connection_memory_bytes",
            format!(
                "{} cannot hold one largest frame and its response ({needed} bytes with max_frame_bytes = {})",
                l.max_connection_memory_bytes, l.max_frame_bytes
            ),
            format!("raise it to at least {needed}, or lower max_frame_bytes"),
        );
        r.relation(
            l.max_connections_per_address <= l.max_connections,
            "max_connections_per_address",
            format!(
                "{} is more than max_connections ({})",
                l.max_connections_per_address, l.max_connections
            ),
            "make it at most max_connections".into(),
        );
        r.relation(
            l.max_logons_in_progress <= l.max_sessions_per_connection,
            "max_logons_in_progress",
            format!(
                "{} is more than max_sessions_per_connection ({})",
                l.max_logons_in_progress, l.max_sessions_per_connection
            ),
            "make it at most max_sessions_per_connection".into(),
        );
        r.relation(
            l.max_byte_range_locks_per_open <= l.max_byte_range_locks_per_file,
            "max_byte_range_locks_per_open",
            format!(
                "{} is more than max_byte_range_locks_per_file ({})",
                l.max_byte_range_locks_per_open, l.max_byte_range_locks_per_file
            ),
            "make it at most max_byte_range_locks_per_file".into(),
        );
        r.relation(
            l.max_logon_backoff >= l.logon_backoff,
            "max_logon_backoff_secs",
            format!(
                "{} s is shorter than logon_backoff_secs ({} s)",
                l.max_logon_backoff.as_secs(),
                l.logon_backoff.as_secs()
            ),
            "make it at least logon_backoff_secs".into(),
        );
        if r.errors.is_empty() {
            Ok(l)
        } else {
            Err(r.errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Limits, Vec<ConfigError>> {
        let raw: RawLimits = toml::from_str(text).expect("valid TOML");
        raw.validate("t.toml")
    }

    #[test]
    fn defaults_are_consistent() {
        let d = parse("").unwrap();
        assert_eq!(d, Limits::default());
        assert_eq!(d.max_io(), MAX_IO_SIZE);
    }

    #[test]
    fn values_are_read_and_ranges_checked() {
        let l = parse(
            "max_frame_bytes = 1114112\nmax_connection_memory_bytes = 4194304\n\
             unauthenticated_timeout_secs = 5\nmax_compound_requests = 8\n",
        )
        .unwrap();
        assert_eq!(l.max_frame_bytes, 1114112);
        assert_eq!(l.max_io(), 1024 * 1024);
        assert_eq!(l.unauthenticated_timeout, Duration::from_secs(5));
        assert_eq!(l.max_compound_requests, 8);
        assert_eq!(l.max_open_files, None);
        assert_eq!(l.max_inotify_watches, 8192);
        assert_eq!(
            parse("max_inotify_watches = 0\n")
                .unwrap()
                .max_inotify_watches,
            0
        );
        let errs = parse("max_inotify_watches = 2000000\n").unwrap_err();
        assert_eq!(errs[0].key, "limits.max_inotify_watches");
        assert_eq!(l.max_pipes_per_session, 64);
        assert_eq!(
            parse("max_pipes_per_session = 3\n")
                .unwrap()
                .max_pipes_per_session,
            3
        );
        let errs = parse("max_pipes_per_session = 0\n").unwrap_err();
        assert_eq!(errs[0].key, "limits.max_pipes_per_session");
        assert!(errs[0].fix.contains("from 1 to 65536"), "{}", errs[0]);

        let l = parse(
            "max_open_files = 500\nmax_sessions_per_connection = 4\n\
             max_logons_in_progress = 2\nmax_trees_per_session = 3\n",
        )
        .unwrap();
        assert_eq!(
            (
                l.max_open_files,
                l.max_sessions_per_connection,
                l.max_logons_in_progress,
                l.max_trees_per_session
            ),
            (Some(500), 4, 2, 3)
        );
        let errs = parse("max_open_files = 3\nmax_logons_in_progress = 100\n").unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            ["limits.max_open_files", "limits.max_logons_in_progress"]
        );
        assert!(errs[0].fix.contains("descriptor limit"), "{}", errs[0]);

        let errs = parse("max_frame_bytes = 100\nmax_credits = 70000\n").unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["limits.max_frame_bytes", "limits.max_credits"]);
        assert!(errs[0].fix.contains("131072"), "{}", errs[0]);
    }

    #[test]
    fn byte_range_lock_caps_are_read_and_checked() {
        let d = parse("").unwrap();
        assert_eq!(
            (
                d.max_byte_range_locks_per_open,
                d.max_byte_range_locks_per_file
            ),
            (16384, 65536)
        );
        let l = parse(
            "max_byte_range_locks_per_open = 3
max_byte_range_locks_per_file = 5
",
        )
        .unwrap();
        assert_eq!(
            (
                l.max_byte_range_locks_per_open,
                l.max_byte_range_locks_per_file
            ),
            (3, 5)
        );
        let errs = parse(
            "max_byte_range_locks_per_open = 0
",
        )
        .unwrap_err();
        assert_eq!(errs[0].key, "limits.max_byte_range_locks_per_open");
        assert!(errs[0].fix.contains("from 1 to 1048576"), "{}", errs[0]);
        let errs = parse(
            "max_byte_range_locks_per_file = 100
",
        )
        .unwrap_err();
        assert_eq!(errs[0].key, "limits.max_byte_range_locks_per_open");
        assert!(errs[0]
            .problem
            .contains("max_byte_range_locks_per_file (100)"));
    }

    #[test]
    fn relations_between_keys_are_checked() {
        let errs = parse(
            "max_connection_memory_bytes = 1048576\nmax_connections = 10\n\
             max_connections_per_address = 11\nlogon_backoff_secs = 60\nmax_logon_backoff_secs = 30\n",
        )
        .unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "limits.max_connection_memory_bytes",
                "limits.max_connections_per_address",
                "limits.max_logon_backoff_secs"
            ]
        );
    }
}
