//! Repeated warnings, aggregated: the first occurrence of a reason is
//! logged, then at most one line per reason and interval, with the number
//! of occurrences it stands for. A flood of failed logons or refused
//! connections then costs the log a few lines, not one per attempt, and
//! the first one still shows at once.
//!
//! Reasons are a fixed set of names (`&'static str`), so the table stays
//! as small as the code that uses it. One process-wide table, like the
//! log itself.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// At most one line per reason this often.
pub const INTERVAL: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Repeats {
    reasons: Mutex<HashMap<&'static str, Entry>>,
}

struct Entry {
    unlogged: u64,
    last_line: Instant,
}

impl Repeats {
    /// Counts one occurrence of `reason` at `now`: Some(n) when a line is
    /// due, standing for `n` occurrences (this one included); None when it
    /// is only counted.
    pub fn occurred_at(&self, reason: &'static str, now: Instant) -> Option<u64> {
        let mut reasons = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
        match reasons.get_mut(reason) {
            None => {
                reasons.insert(
                    reason,
                    Entry {
                        unlogged: 0,
                        last_line: now,
                    },
                );
                Some(1)
            }
            Some(e) => {
                e.unlogged += 1;
                if now.saturating_duration_since(e.last_line) >= INTERVAL {
                    e.last_line = now;
                    Some(std::mem::take(&mut e.unlogged))
                } else {
                    None
                }
            }
        }
    }
}

/// `Repeats::occurred_at` now, on the process's table.
pub fn occurred(reason: &'static str) -> Option<u64> {
    static TABLE: OnceLock<Repeats> = OnceLock::new();
    TABLE
        .get_or_init(Repeats::default)
        .occurred_at(reason, Instant::now())
}

/// "" for a single occurrence, else " (N times since this was last
/// logged)": the suffix of an aggregated line.
pub fn times(n: u64) -> String {
    if n <= 1 {
        String::new()
    } else {
        format!(" ({n} times since this was last logged)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_is_logged_then_one_line_per_interval_with_a_count() {
        let r = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(r.occurred_at("logon", t0), Some(1));
        for i in 1..1000 {
            assert_eq!(r.occurred_at("logon", t0 + Duration::from_millis(i)), None);
        }
        // Another reason has its own line.
        assert_eq!(r.occurred_at("refused", t0), Some(1));
        // The interval passed: one line for the 999 since, and this one.
        assert_eq!(r.occurred_at("logon", t0 + INTERVAL), Some(1000));
        assert_eq!(
            r.occurred_at("logon", t0 + INTERVAL + Duration::from_secs(1)),
            None
        );
        assert_eq!(times(1), "");
        assert_eq!(times(1000), " (1000 times since this was last logged)");
    }
}
