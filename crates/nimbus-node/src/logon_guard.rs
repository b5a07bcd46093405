//! Failed-logon back-off, per user name and per client address: after too
//! many failures, logons are refused for a while, the wait doubling with
//! each further failure. Password guessing becomes slow without locking
//! anyone out for good.
//!
//! While a name or address is backed off, a logon is refused whether or not
//! its password was right, so the refusal tells a guesser nothing. Pure
//! state with the time passed in, so it is tested without a clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::limits::Limits;
use crate::sync::lock;

/// Entries kept at most per table; beyond it, forgotten entries are purged
/// and, if that is not enough, the ones whose back-off ends soonest go.
const MAX_ENTRIES: usize = 100_000;

#[derive(Clone, Copy, Debug)]
struct Failures {
    count: u32,
    last: Instant,
    blocked_until: Option<Instant>,
}

/// Why a logon is refused without looking at its password.
#[derive(Debug, PartialEq, Eq)]
pub enum BackedOff {
    User { remaining: Duration },
    Address { remaining: Duration },
}

struct Table<K> {
    limit: u32,
    entries: HashMap<K, Failures>,
}

impl<K: Hash + Eq + Clone> Table<K> {
    fn blocked(&mut self, key: &K, now: Instant, window: Duration) -> Option<Duration> {
        let f = self.entries.get(key)?;
        if now.saturating_duration_since(f.last) > window
            && f.blocked_until.is_none_or(|u| u <= now)
        {
            self.entries.remove(key);
            return None;
        }
        f.blocked_until
            .and_then(|u| u.checked_duration_since(now))
            .filter(|d| !d.is_zero())
    }

    fn fail(&mut self, key: K, now: Instant, cfg: &Limits) {
        if self.entries.len() >= MAX_ENTRIES && !self.entries.contains_key(&key) {
            self.purge(now, cfg.failed_logon_window);
        }
        let f = self.entries.entry(key).or_insert(Failures {
            count: 0,
            last: now,
            blocked_until: None,
        });
        if now.saturating_duration_since(f.last) > cfg.failed_logon_window {
            f.count = 0;
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
        if f.count >= self.limit {
            let doublings = (f.count - self.limit).min(20);
            let wait = cfg
                .logon_backoff
                .saturating_mul(1 << doublings)
                .min(cfg.max_logon_backoff);
            f.blocked_until = Some(now + wait);
        }
    }

    fn purge(&mut self, now: Instant, window: Duration) {
        self.entries.retain(|_, f| {
            now.saturating_duration_since(f.last) <= window
                || f.blocked_until.is_some_and(|u| u > now)
        });
        if self.entries.len() >= MAX_ENTRIES {
            // Still full (a flood of distinct names): keep the half that
            // stays blocked longest.
            let mut ends: Vec<Instant> = self
                .entries
                .values()
                .map(|f| f.blocked_until.unwrap_or(f.last))
                .collect();
            ends.sort_unstable();
            let cut = ends[ends.len() / 2];
            self.entries
                .retain(|_, f| f.blocked_until.unwrap_or(f.last) > cut);
        }
    }
}

pub struct LogonGuard {
    users: Mutex<Table<String>>,
    addresses: Mutex<Table<IpAddr>>,
}

impl LogonGuard {
    pub fn new(limits: &Limits) -> Self {
        LogonGuard {
            users: Mutex::new(Table {
                limit: limits.max_failed_logons_per_user,
                entries: HashMap::new(),
            }),
            addresses: Mutex::new(Table {
                limit: limits.max_failed_logons_per_address,
                entries: HashMap::new(),
            }),
        }
    }

    /// Takes the failure counts of a reloaded configuration; the failures
    /// counted so far stay.
    pub fn set_limits(&self, limits: &Limits) {
        lock(&self.users).limit = limits.max_failed_logons_per_user;
        lock(&self.addresses).limit = limits.max_failed_logons_per_address;
    }

    /// Failures are counted per account as the user database finds it: two
    /// spellings that reach one account ("sam", "SAM", "ſam" with U+017F
    /// long s) share one budget, and so do spellings of an unknown name, so
    /// a guesser cannot multiply budgets by respelling.
    fn user_key(user: &str) -> String {
        nimbus_auth::UserDb::canonical_key(user)
    }

    /// Whether a logon by `user` from `addr` must be refused now.
    pub fn check(
        &self,
        user: &str,
        addr: IpAddr,
        now: Instant,
        limits: &Limits,
    ) -> Result<(), BackedOff> {
        let window = limits.failed_logon_window;
        // An IPv4 client of a dual-stack listener has one budget, however
        // its address is spelled.
        let addr = addr.to_canonical();
        let address_blocked = lock(&self.addresses).blocked(&addr, now, window);
        if let Some(remaining) = address_blocked {
            return Err(BackedOff::Address { remaining });
        }
        let user_blocked = lock(&self.users).blocked(&Self::user_key(user), now, window);
        if let Some(remaining) = user_blocked {
            return Err(BackedOff::User { remaining });
        }
        Ok(())
    }

    pub fn failed(&self, user: &str, addr: IpAddr, now: Instant, limits: &Limits) {
        lock(&self.addresses).fail(addr.to_canonical(), now, limits);
        if !user.is_empty() {
            lock(&self.users).fail(Self::user_key(user), now, limits);
        }
    }

    /// A successful logon clears the user's and the address's failures.
    pub fn succeeded(&self, user: &str, addr: IpAddr) {
        lock(&self.addresses).entries.remove(&addr.to_canonical());
        lock(&self.users).entries.remove(&Self::user_key(user));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_failed_logons_per_user: 3,
            max_failed_logons_per_address: 5,
            logon_backoff: Duration::from_secs(2),
            max_logon_backoff: Duration::from_secs(10),
            failed_logon_window: Duration::from_secs(60),
            ..Limits::default()
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn user_backs_off_and_doubles() {
        let l = Limits {
            max_failed_logons_per_address: 100,
            ..limits()
        };
        let g = LogonGuard::new(&l);
        let t0 = Instant::now();
        for _ in 0..2 {
            g.failed("Alice", A, t0, &l);
            assert_eq!(g.check("alice", B, t0, &l), Ok(()));
        }
        g.failed("alice", B, t0, &l);
        assert_eq!(
            g.check("ALICE", B, t0, &l),
            Err(BackedOff::User {
                remaining: Duration::from_secs(2)
            })
        );
        // Other users are not affected.
        assert_eq!(g.check("bob", B, t0, &l), Ok(()));
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(g.check("alice", B, t1, &l), Ok(()));
        // The next failure doubles the wait, up to the maximum.
        g.failed("alice", B, t1, &l);
        assert!(
            matches!(g.check("alice", B, t1, &l), Err(BackedOff::User { remaining }) if remaining == Duration::from_secs(4))
        );
        for _ in 0..10 {
            g.failed("alice", B, t1, &l);
        }
        assert!(
            matches!(g.check("alice", B, t1, &l), Err(BackedOff::User { remaining }) if remaining == Duration::from_secs(10))
        );
        // A success (after the wait) forgets the failures.
        g.succeeded("alice", B);
        assert_eq!(g.check("alice", B, t1, &l), Ok(()));
    }

    #[test]
    fn spellings_of_one_account_share_one_budget() {
        let l = Limits {
            max_failed_logons_per_address: 100,
            ..limits()
        };
        let g = LogonGuard::new(&l);
        let t0 = Instant::now();
        // The user database finds "sam" under each of these (U+017F long s
        // upper-cases to 'S'); to_lowercase would have made three budgets.
        g.failed("sam", A, t0, &l);
        g.failed("ſam", A, t0, &l);
        g.failed("SAM", B, t0, &l);
        assert!(matches!(
            g.check("Sam", A, t0, &l),
            Err(BackedOff::User { .. })
        ));
        assert!(matches!(
            g.check("ſAM", B, t0, &l),
            Err(BackedOff::User { .. })
        ));
        // Unknown names are folded the same way: "ß" reaches "SS".
        g.failed("maß", A, t0, &l);
        g.failed("MASS", A, t0, &l);
        g.failed("mass", A, t0, &l);
        assert!(matches!(
            g.check("Maß", A, t0, &l),
            Err(BackedOff::User { .. })
        ));
        // A success under one spelling clears them all.
        g.succeeded("ſam", A);
        assert_eq!(g.check("sam", A, t0, &l), Ok(()));
    }

    #[test]
    fn address_backs_off_across_user_names() {
        let l = limits();
        let g = LogonGuard::new(&l);
        let t0 = Instant::now();
        for i in 0..5 {
            g.failed(&format!("user{i}"), A, t0, &l);
        }
        assert!(matches!(
            g.check("someone", A, t0, &l),
            Err(BackedOff::Address { .. })
        ));
        assert_eq!(g.check("someone", B, t0, &l), Ok(()));
    }

    #[test]
    fn old_failures_are_forgotten() {
        let l = limits();
        let g = LogonGuard::new(&l);
        let t0 = Instant::now();
        g.failed("carol", A, t0, &l);
        g.failed("carol", A, t0, &l);
        let later = t0 + Duration::from_secs(61);
        g.failed("carol", A, later, &l);
        assert_eq!(g.check("carol", A, later, &l), Ok(()));
    }

    #[test]
    fn table_size_is_bounded() {
        let l = limits();
        let mut t = Table {
            limit: 1,
            entries: HashMap::new(),
        };
        let t0 = Instant::now();
        for i in 0..(MAX_ENTRIES + 10) {
            t.fail(i, t0 + Duration::from_millis(i as u64), &l);
        }
        assert!(t.entries.len() <= MAX_ENTRIES);
    }
}
