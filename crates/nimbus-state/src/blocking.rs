//! Waiting inside a request handler that may run on an async runtime's
//! worker thread.
//!
//! A cluster node answers a CREATE or CLOSE of a file it owns from memory,
//! so such requests run in place on the connection's task like on a single
//! node (no hand-over to the blocking pool, which costs two thread wake-ups
//! per request). Only when a decision needs etcd (a file another node
//! uses, a record that must be written through) does the handler wait, and
//! then it tells the runtime first, which moves the worker's other tasks
//! to another thread meanwhile. On a blocking-pool thread, outside any
//! runtime, or on a current-thread runtime (unit tests), it just runs.

use tokio::runtime::{Handle, RuntimeFlavor};

/// Runs `f`, which may block for a while, without holding up the other
/// tasks of the worker it is called on.
pub fn off_worker<T>(f: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Locks `m`, waiting off the worker if another thread holds it (one that
/// may be waiting on etcd); a poisoned lock is taken as it is.
pub fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            off_worker(|| m.lock().unwrap_or_else(|p| p.into_inner()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_outside_a_runtime() {
        assert_eq!(off_worker(|| 7), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn runs_on_a_current_thread_runtime_without_panicking() {
        assert_eq!(off_worker(|| 8), 8);
    }

    #[test]
    fn lets_the_other_tasks_of_a_worker_run_while_it_waits() {
        // One worker: a task that waits (off the worker) for a second task
        // spawned on the same runtime can only finish if that task runs
        // meanwhile on the worker it left.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let got = rt.block_on(async {
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = tokio::spawn(async move {
                off_worker(|| rx.recv_timeout(std::time::Duration::from_secs(10)))
            });
            tokio::task::yield_now().await;
            tokio::spawn(async move { tx.send(9).unwrap() });
            waiter.await.unwrap()
        });
        assert_eq!(got, Ok(9));
    }
}
