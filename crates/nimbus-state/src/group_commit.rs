//! Requests of several threads sent together: one thread sends what has
//! queued while nobody was sending, the others wait for its answer, and
//! whoever finds requests queued after that sends them next.
//!
//! A cluster node takes the ownership of each new file it opens in an etcd
//! transaction (`crate::cluster_store`), and etcd's cost is mostly per
//! request, not per operation (BENCHMARKS.md, `bench/etcd_txn_cost`): with
//! authentication on, each request's permission check alone costs
//! 100-200 µs of etcd CPU. So the takes of CREATEs that arrive while one
//! is under way go together in the next request. A request alone is sent
//! at once; only a request that would have waited behind another anyway
//! waits for the one before it to be answered.
//!
//! Written here because what it batches is this crate's own: the
//! transactions `EtcdStore::txns` sends as one.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::store::StateError;

/// Requests of type `R` answered with `T`, sent at most `most` at a time.
pub struct GroupCommit<R, T> {
    state: Mutex<State<R, T>>,
    answered: Condvar,
    most: usize,
}

struct State<R, T> {
    queue: VecDeque<(u64, R)>,
    answers: HashMap<u64, Result<T, StateError>>,
    next_ticket: u64,
    sending: bool,
}

/// Answers the requests of a batch whose sender left without answering
/// them (it panicked): they fail instead of waiting forever, and the next
/// waiter sends what is queued.
struct Sending<'a, R, T> {
    commit: &'a GroupCommit<R, T>,
    tickets: Vec<u64>,
    /// The sender's own request, whose answer nobody would collect.
    own: u64,
}

impl<R, T> Drop for Sending<'_, R, T> {
    fn drop(&mut self) {
        let mut s = self.commit.lock();
        for t in self.tickets.drain(..).filter(|t| *t != self.own) {
            s.answers.entry(t).or_insert_with(|| {
                Err(StateError::Unavailable(
                    "a batch of etcd requests was left unanswered".into(),
                ))
            });
        }
        s.sending = false;
        drop(s);
        self.commit.answered.notify_all();
    }
}

impl<R, T> GroupCommit<R, T> {
    /// At most `most` requests in one batch (at least one).
    pub fn new(most: usize) -> GroupCommit<R, T> {
        GroupCommit {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                answers: HashMap::new(),
                next_ticket: 0,
                sending: false,
            }),
            answered: Condvar::new(),
            most: most.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<R, T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `request`'s answer, sent alone or with others' by `send`, which
    /// answers a batch in order: an error answers each of its requests,
    /// and a request it leaves without an answer fails.
    pub fn submit(
        &self,
        request: R,
        send: impl Fn(&[R]) -> Result<Vec<T>, StateError>,
    ) -> Result<T, StateError> {
        let mut s = self.lock();
        let ticket = s.next_ticket;
        s.next_ticket = s.next_ticket.wrapping_add(1);
        s.queue.push_back((ticket, request));
        loop {
            if let Some(answer) = s.answers.remove(&ticket) {
                return answer;
            }
            if !s.sending && !s.queue.is_empty() {
                s.sending = true;
                let n = s.queue.len().min(self.most);
                let (tickets, batch): (Vec<u64>, Vec<R>) = s.queue.drain(..n).unzip();
                drop(s);
                let mut guard = Sending {
                    commit: self,
                    tickets,
                    own: ticket,
                };
                let answers = send(&batch);
                let mut s2 = self.lock();
                match answers {
                    Ok(answers) => {
                        let mut answers = answers.into_iter();
                        for t in guard.tickets.drain(..) {
                            let a = answers.next().ok_or_else(|| {
                                StateError::Unavailable(
                                    "etcd answered fewer requests than were sent together".into(),
                                )
                            });
                            s2.answers.insert(t, a);
                        }
                    }
                    Err(e) => {
                        for t in guard.tickets.drain(..) {
                            s2.answers.insert(t, Err(e.clone_message()));
                        }
                    }
                }
                drop(s2);
                // Marks the sending done and wakes the waiters.
                drop(guard);
                s = self.lock();
                continue;
            }
            s = crate::blocking::off_worker(|| {
                self.answered.wait(s).unwrap_or_else(|p| p.into_inner())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn a_request_alone_is_sent_at_once_and_alone() {
        let c: GroupCommit<u32, u32> = GroupCommit::new(8);
        let sizes = Mutex::new(Vec::new());
        let a = c.submit(7, |b| {
            sizes.lock().unwrap().push(b.len());
            Ok(b.iter().map(|x| x * 2).collect())
        });
        assert_eq!(a.unwrap(), 14);
        assert_eq!(*sizes.lock().unwrap(), vec![1]);
    }

    #[test]
    fn requests_that_arrive_while_one_is_sent_go_together_and_each_gets_its_own_answer() {
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(64));
        let sends = Arc::new(AtomicUsize::new(0));
        // The first send waits until the other threads have queued.
        let queued = Arc::new(Barrier::new(2));
        let first = {
            let (c, sends, queued) = (c.clone(), sends.clone(), queued.clone());
            std::thread::spawn(move || {
                c.submit(0, |b| {
                    sends.fetch_add(1, Ordering::SeqCst);
                    if b == [0] {
                        queued.wait();
                    }
                    Ok(b.iter().map(|x| x + 100).collect())
                })
            })
        };
        // Wait until the first is being sent.
        while sends.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let others: Vec<_> = (1..=5u32)
            .map(|i| {
                let (c, sends) = (c.clone(), sends.clone());
                std::thread::spawn(move || {
                    c.submit(i, |b| {
                        sends.fetch_add(1, Ordering::SeqCst);
                        Ok(b.iter().map(|x| x + 100).collect())
                    })
                })
            })
            .collect();
        // Each of the five is queued once the queue holds five.
        loop {
            if c.lock().queue.len() == 5 {
                break;
            }
            std::thread::yield_now();
        }
        queued.wait();
        assert_eq!(first.join().unwrap().unwrap(), 100);
        for (i, t) in others.into_iter().enumerate() {
            assert_eq!(t.join().unwrap().unwrap(), 101 + i as u32);
        }
        assert_eq!(
            sends.load(Ordering::SeqCst),
            2,
            "five queued requests, one send"
        );
    }

    #[test]
    fn a_failed_or_short_batch_fails_each_request_it_left_unanswered() {
        let c: GroupCommit<u32, u32> = GroupCommit::new(8);
        let e = c.submit(1, |_| Err(StateError::Unavailable("down".into())));
        assert!(matches!(e, Err(StateError::Unavailable(w)) if w == "down"));
        let short = c.submit(1, |_| Ok(Vec::new()));
        assert!(short.is_err());
        // Still usable afterwards.
        assert_eq!(c.submit(3, |b| Ok(b.to_vec())).unwrap(), 3);
    }

    #[test]
    fn a_sender_that_panics_fails_its_batch_and_leaves_the_next_to_send() {
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(8));
        let c2 = c.clone();
        let r = std::thread::spawn(move || c2.submit(1, |_| panic!("sender died"))).join();
        assert!(r.is_err());
        assert_eq!(c.submit(2, |b| Ok(b.to_vec())).unwrap(), 2);
    }

    #[test]
    fn batches_hold_at_most_the_limit() {
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(2));
        let biggest = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..16u32)
            .map(|i| {
                let (c, biggest) = (c.clone(), biggest.clone());
                std::thread::spawn(move || {
                    c.submit(i, |b| {
                        biggest.fetch_max(b.len(), Ordering::SeqCst);
                        Ok(b.to_vec())
                    })
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            assert_eq!(t.join().unwrap().unwrap(), i as u32);
        }
        assert!(biggest.load(Ordering::SeqCst) <= 2);
    }
}
