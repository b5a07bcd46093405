//! The one way the server's crates (services, cluster, server) take a
//! mutex: ignoring poisoning, because a
//! panic in one request must not make every later request that needs the
//! same table panic too. Imports nothing, so that any module may use it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking over a lock a panicking thread left poisoned.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
