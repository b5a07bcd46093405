//! One file's caching changes, one at a time: each holds the file's turn
//! from its read of the record to the node's table settled after its
//! write, so that the table (grants, directory leases, waiting requests,
//! break timers) follows each file's record in the order it was written.
//!
//! Why per file and not the table's lock: on a cluster node a write of a
//! file other nodes share is an etcd round trip, and one of a file being
//! handed over waits for its owner (up to twice the node TTL). Held across
//! that, the table's lock held up every caching change of the node, its
//! files in memory included. The turn holds up only the same file's
//! changes; the table's lock is now taken only for the moments that read
//! or change it, never across a store call.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use nimbus_state::FileKey;

/// The files whose turn is taken, and who waits for them.
#[derive(Default)]
pub(super) struct Turns {
    files: Mutex<HashMap<FileKey, Taken>>,
}

/// A file in `Turns`: there while its turn is taken or waited for.
struct Taken {
    held: bool,
    waiting: usize,
    /// Where the file's waiters wait (with `Turns::files`'s lock): one is
    /// woken per turn given back, not every waiter of every file. Made
    /// when the first waiter comes (most turns are never waited for).
    given_back: Option<Arc<Condvar>>,
}

/// A file's turn, given back when dropped.
pub(super) struct Turn<'a> {
    turns: &'a Turns,
    file: FileKey,
}

impl Turns {
    /// Waits until nobody else has `file`'s turn, and takes it. The wait
    /// is off the runtime worker: the holder may be waiting on etcd.
    pub(super) fn take(&self, file: FileKey) -> Turn<'_> {
        let mut files = nimbus_state::blocking::lock(&self.files);
        let entry = files.entry(file).or_insert_with(|| Taken {
            held: false,
            waiting: 0,
            given_back: None,
        });
        if entry.held {
            entry.waiting += 1;
            let given_back = entry.given_back.get_or_insert_with(Arc::default).clone();
            files = nimbus_state::blocking::off_worker(|| {
                given_back
                    .wait_while(files, |f| f.get(&file).is_some_and(|e| e.held))
                    .unwrap_or_else(|p| p.into_inner())
            });
            // The entry stayed while this thread waited: a drop that
            // finds nobody waiting removes it, and none else does.
            if let Some(entry) = files.get_mut(&file) {
                entry.waiting -= 1;
            }
        }
        if let Some(entry) = files.get_mut(&file) {
            entry.held = true;
        }
        Turn { turns: self, file }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut files = crate::sync::lock(&self.turns.files);
        let Some(entry) = files.get_mut(&self.file) else {
            return;
        };
        if entry.waiting == 0 {
            files.remove(&self.file);
            return;
        }
        entry.held = false;
        // One waiter goes on; if a newcomer takes the turn first, its
        // drop wakes the next.
        if let Some(given_back) = &entry.given_back {
            given_back.notify_one();
        }
    }
}

#[cfg(test)]
impl Turns {
    /// How many threads wait for `file`'s turn.
    pub(super) fn waiting(&self, file: FileKey) -> usize {
        crate::sync::lock(&self.files)
            .get(&file)
            .map_or(0, |e| e.waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_thread_at_a_time_has_a_files_turn_and_every_waiter_gets_it() {
        let turns = Arc::new(Turns::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let (a, b) = (FileKey::new(1, 1, 1), FileKey::new(1, 2, 1));
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let (turns, inside) = (turns.clone(), inside.clone());
                let file = if i % 2 == 0 { a } else { b };
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let _turn = turns.take(file);
                        // Each file's holders count in their own half.
                        let mine = if file == a { 1 } else { 1 << 16 };
                        let before = inside.fetch_add(mine, Ordering::SeqCst);
                        assert_eq!(before & (mine * 0xffff), 0, "two holders of one turn");
                        std::thread::yield_now();
                        inside.fetch_sub(mine, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Nothing is kept for files nobody holds or waits for.
        assert!(crate::sync::lock(&turns.files).is_empty());
    }
}
