//! The server-wide budget of open files. Every open holds a descriptor, and
//! so does every connection's socket; when the process runs out, `accept()`
//! fails for everyone and so does every CREATE. So the descriptor limit is
//! raised to its hard limit at start, and opens are capped server-wide below
//! it, leaving room for `limits.max_connections` sockets and a reserve for
//! the descriptors a request uses for a moment (parent directories, probes,
//! directory listings, the user database, log files).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::limits::Limits;

/// Descriptors kept free for short-lived use beside sockets and opens.
pub const RESERVE: usize = 512;

/// The fewest opens worth serving with; below it the configuration cannot
/// work and the log says how to fix it.
const MIN_OPENS: usize = 16;

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit
/// in force afterwards.
pub fn raise_descriptor_limit() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: rl is a valid out pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return 1024;
    }
    if rl.rlim_cur < rl.rlim_max {
        let want = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        // SAFETY: want is a valid rlimit; failure leaves the old limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            rl.rlim_cur = rl.rlim_max;
        }
    }
    rl.rlim_cur
}

/// How many files may be open server-wide under a descriptor limit of
/// `soft`, and a warning for the log when the configuration asks for more
/// than that limit can hold.
pub fn open_file_cap(soft: u64, limits: &Limits) -> (usize, Option<String>) {
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    let room = soft
        .saturating_sub(limits.max_connections)
        .saturating_sub(RESERVE);
    match limits.max_open_files {
        Some(asked) if asked <= room => (asked, None),
        asked => {
            let cap = room.max(MIN_OPENS);
            let warning = (asked.is_some() || room < MIN_OPENS).then(|| {
                format!(
                    "the descriptor limit (RLIMIT_NOFILE) is {soft}: with limits.max_connections = \
                     {} and {RESERVE} kept in reserve, at most {cap} files can be open server-wide{}; \
                     raise the limit (`ulimit -n`, LimitNOFILE= in a systemd unit) or lower \
                     limits.max_connections",
                    limits.max_connections,
                    match asked {
                        Some(a) => format!(", not limits.max_open_files = {a}"),
                        None => String::new(),
                    }
                )
            });
            (cap, warning)
        }
    }
}

/// Counts the opens of the whole server against their cap.
pub struct OpenFiles {
    count: Arc<AtomicUsize>,
    cap: AtomicUsize,
    /// Unix second of the last refusal logged (one log line a second).
    last_logged: AtomicU64,
}

/// Held by an open for its life; gives its place back when dropped.
pub struct OpenFileSlot(Arc<AtomicUsize>);

impl Drop for OpenFileSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl OpenFiles {
    pub fn new(cap: usize) -> OpenFiles {
        OpenFiles {
            count: Arc::new(AtomicUsize::new(0)),
            cap: AtomicUsize::new(cap),
            last_logged: AtomicU64::new(0),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap.load(Ordering::Relaxed)
    }

    /// A reloaded configuration's cap. Opens above it stay; new ones wait
    /// until the count is below it.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// A place for one more open, or None when the server has `cap` open.
    pub fn reserve(&self) -> Option<OpenFileSlot> {
        let taken = self
            .count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap()).then_some(n + 1)
            });
        match taken {
            Ok(_) => Some(OpenFileSlot(self.count.clone())),
            Err(_) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                if self.last_logged.swap(now, Ordering::Relaxed) != now {
                    tracing::warn!(
                        "{} files are open server-wide, the most the descriptor limit allows \
                         (limits.max_open_files); CREATE refused with STATUS_TOO_MANY_OPENED_FILES",
                        self.cap()
                    );
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_connections: usize, max_open_files: Option<usize>) -> Limits {
        Limits {
            max_connections,
            max_connections_per_address: max_connections,
            max_open_files,
            ..Limits::default()
        }
    }

    #[test]
    fn cap_leaves_room_for_sockets_and_reserve() {
        assert_eq!(
            open_file_cap(1 << 20, &limits(4096, None)),
            ((1 << 20) - 4096 - RESERVE, None)
        );
        assert_eq!(
            open_file_cap(1 << 20, &limits(4096, Some(1000))),
            (1000, None)
        );
        let (cap, warning) = open_file_cap(1024, &limits(64, Some(5000)));
        assert_eq!(cap, 1024 - 64 - RESERVE);
        let warning = warning.expect("a warning");
        assert!(
            warning.contains("limits.max_open_files = 5000"),
            "{warning}"
        );
        assert!(warning.contains("ulimit -n"), "{warning}");
        let (cap, warning) = open_file_cap(1024, &limits(4096, None));
        assert_eq!(cap, MIN_OPENS);
        assert!(warning.is_some());
    }

    #[test]
    fn slots_are_counted_and_given_back() {
        let files = OpenFiles::new(2);
        let a = files.reserve().expect("first");
        let b = files.reserve().expect("second");
        assert!(files.reserve().is_none());
        drop(a);
        let c = files.reserve().expect("after one was given back");
        assert!(files.reserve().is_none());
        drop((b, c));
        assert_eq!(files.count.load(Ordering::Acquire), 0);
    }
}
