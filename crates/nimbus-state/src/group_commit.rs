//! Requests of several threads sent together: one thread sends what has
//! queued, the others wait for its answer, and whoever finds requests
//! queued when the batch out is answered sends them next.
//!
//! A cluster node takes the ownership of each new file it opens in an etcd
//! transaction (`crate::cluster_store`), and etcd's cost is mostly per
//! request, not per operation (BENCHMARKS.md, `bench/etcd_txn_cost`): with
//! authentication on, each request's permission check alone costs
//! 100-200 µs of etcd CPU. So the takes of CREATEs that arrive while one
//! is under way go together in the next request. A request that finds no
//! batch out is sent at once. One that finds a batch out waits for it to
//! be answered, which costs it up to one round trip more than being sent
//! alone, but no longer than `patience`: a batch out that long is taken
//! for stuck (a member failing over, a connection that hangs), and what
//! queued behind it goes out without it, up to `most_out` batches at once.
//!
//! Each request is answered on its own: a batch the store could not send
//! fails each of its requests, but one request's bad answer (a record
//! that does not decode, say) fails that request alone.
//!
//! Written here because what it batches is this crate's own: the
//! transactions `EtcdStore::txns` sends as one.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::store::StateError;

/// What `send` answers a batch with: an error for the whole batch (it was
/// not sent, or not answered), or each request's answer in order.
pub type Answers<T> = Result<Vec<Result<T, StateError>>, StateError>;

/// Requests of type `R` answered with `T`, sent at most `most` at a time.
pub struct GroupCommit<R, T> {
    state: Mutex<State<R, T>>,
    answered: Condvar,
    most: usize,
    most_out: usize,
    patience: Duration,
}

struct State<R, T> {
    queue: VecDeque<(u64, R)>,
    answers: HashMap<u64, Result<T, StateError>>,
    /// Requests whose submitter left (its `send` panicked) while they
    /// were out in another's batch: their answers are dropped.
    abandoned: HashSet<u64>,
    next_ticket: u64,
    /// When each batch out was sent, by its number.
    out: Vec<(u64, Instant)>,
    next_batch: u64,
}

impl<R, T> State<R, T> {
    fn answer(&mut self, ticket: u64, answer: Result<T, StateError>) {
        if !self.abandoned.remove(&ticket) {
            self.answers.insert(ticket, answer);
        }
    }
}

/// A batch out. Dropped when it is answered, or when its sender left
/// without answering it (its `send` panicked): then its requests fail
/// instead of waiting forever, and the sender's own request, wherever it
/// is, is forgotten (nobody would collect its answer).
struct Sending<'a, R, T> {
    commit: &'a GroupCommit<R, T>,
    batch: u64,
    tickets: Vec<u64>,
    own: u64,
    own_in_batch: bool,
}

impl<R, T> Drop for Sending<'_, R, T> {
    fn drop(&mut self) {
        let mut s = self.commit.lock();
        for t in self.tickets.drain(..).filter(|t| *t != self.own) {
            s.answer(
                t,
                Err(StateError::Unavailable(
                    "a batch of etcd requests was left unanswered".into(),
                )),
            );
        }
        if std::thread::panicking() && !self.own_in_batch {
            let before = s.queue.len();
            s.queue.retain(|(t, _)| *t != self.own);
            if s.queue.len() == before && s.answers.remove(&self.own).is_none() {
                s.abandoned.insert(self.own);
            }
        }
        let batch = self.batch;
        s.out.retain(|(b, _)| *b != batch);
        drop(s);
        self.commit.answered.notify_all();
    }
}

impl<R, T> GroupCommit<R, T> {
    /// At most `most` requests in one batch (at least one), and at most
    /// `most_out` batches out at once (at least one), the next sent while
    /// others are out only once the last sent has been out `patience`.
    pub fn new(most: usize, most_out: usize, patience: Duration) -> GroupCommit<R, T> {
        GroupCommit {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                answers: HashMap::new(),
                abandoned: HashSet::new(),
                next_ticket: 0,
                out: Vec::new(),
                next_batch: 0,
            }),
            answered: Condvar::new(),
            most: most.max(1),
            most_out: most_out.max(1),
            patience,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<R, T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long until a waiter may send what is queued: zero when it may
    /// now, None when only an answer can let it.
    fn turn_in(&self, s: &State<R, T>) -> Option<Duration> {
        if s.queue.is_empty() || s.out.len() >= self.most_out {
            return None;
        }
        let newest = s.out.iter().map(|(_, at)| *at).max();
        Some(newest.map_or(Duration::ZERO, |at| {
            self.patience.saturating_sub(at.elapsed())
        }))
    }

    /// `request`'s answer, sent alone or with others' by `send`. Every
    /// caller of one `GroupCommit` must pass the same `send`: whoever
    /// sends a batch sends the others' requests with its own `send`.
    /// A request `send` leaves without an answer fails.
    pub fn submit(&self, request: R, send: impl Fn(&[R]) -> Answers<T>) -> Result<T, StateError> {
        let mut s = self.lock();
        let ticket = s.next_ticket;
        s.next_ticket = s.next_ticket.wrapping_add(1);
        s.queue.push_back((ticket, request));
        loop {
            if let Some(answer) = s.answers.remove(&ticket) {
                return answer;
            }
            match self.turn_in(&s) {
                Some(wait) if wait.is_zero() => {
                    let n = s.queue.len().min(self.most);
                    let (tickets, batch): (Vec<u64>, Vec<R>) = s.queue.drain(..n).unzip();
                    let number = s.next_batch;
                    s.next_batch = s.next_batch.wrapping_add(1);
                    s.out.push((number, Instant::now()));
                    drop(s);
                    let mut guard = Sending {
                        commit: self,
                        batch: number,
                        own_in_batch: tickets.contains(&ticket),
                        tickets,
                        own: ticket,
                    };
                    let answers = send(&batch);
                    let mut s2 = self.lock();
                    match answers {
                        Ok(answers) => {
                            let mut answers = answers.into_iter();
                            for t in guard.tickets.drain(..) {
                                let a = answers.next().unwrap_or_else(|| {
                                    Err(StateError::Unavailable(
                                        "etcd answered fewer requests than were sent together"
                                            .into(),
                                    ))
                                });
                                s2.answer(t, a);
                            }
                        }
                        Err(e) => {
                            for t in guard.tickets.drain(..) {
                                s2.answer(t, Err(e.clone_message()));
                            }
                        }
                    }
                    drop(s2);
                    // Marks the batch answered and wakes the waiters.
                    drop(guard);
                    s = self.lock();
                }
                Some(wait) => {
                    s = crate::blocking::off_worker(|| {
                        self.answered
                            .wait_timeout(s, wait)
                            .unwrap_or_else(|p| p.into_inner())
                            .0
                    });
                }
                None => {
                    s = crate::blocking::off_worker(|| {
                        self.answered.wait(s).unwrap_or_else(|p| p.into_inner())
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{mpsc, Arc, Barrier};

    const LONG: Duration = Duration::from_secs(600);

    fn doubled(b: &[u32]) -> Answers<u32> {
        Ok(b.iter().map(|x| Ok(x * 2)).collect())
    }

    #[test]
    fn a_request_alone_is_sent_at_once_and_alone() {
        let c: GroupCommit<u32, u32> = GroupCommit::new(8, 4, LONG);
        let sizes = Mutex::new(Vec::new());
        let a = c.submit(7, |b| {
            sizes.lock().unwrap().push(b.len());
            doubled(b)
        });
        assert_eq!(a.unwrap(), 14);
        assert_eq!(*sizes.lock().unwrap(), vec![1]);
    }

    /// Submits 0, whose `send` is held until `1..=n` are queued behind
    /// it; then their answers, in order, and how many sends there were.
    fn queued_behind_one(
        n: u32,
        answer: fn(u32) -> Result<u32, StateError>,
    ) -> (Result<u32, StateError>, Vec<Result<u32, StateError>>, usize) {
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(64, 4, LONG));
        let sends = Arc::new(AtomicUsize::new(0));
        let queued = Arc::new(Barrier::new(2));
        let send = {
            let (sends, queued) = (sends.clone(), queued.clone());
            move |b: &[u32]| -> Answers<u32> {
                sends.fetch_add(1, Ordering::SeqCst);
                if b == [0] {
                    queued.wait();
                }
                Ok(b.iter().map(|x| answer(*x)).collect())
            }
        };
        let first = {
            let (c, send) = (c.clone(), send.clone());
            std::thread::spawn(move || c.submit(0, send))
        };
        while sends.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        let others: Vec<_> = (1..=n)
            .map(|i| {
                let (c, send) = (c.clone(), send.clone());
                std::thread::spawn(move || c.submit(i, send))
            })
            .collect();
        while c.lock().queue.len() < n as usize {
            std::thread::yield_now();
        }
        queued.wait();
        let first = first.join().unwrap();
        let others = others.into_iter().map(|t| t.join().unwrap()).collect();
        (first, others, sends.load(Ordering::SeqCst))
    }

    #[test]
    fn requests_that_arrive_while_one_is_sent_go_together_and_each_gets_its_own_answer() {
        let (first, others, sends) = queued_behind_one(5, |x| Ok(x + 100));
        assert_eq!(first.unwrap(), 100);
        for (i, a) in others.into_iter().enumerate() {
            assert_eq!(a.unwrap(), 101 + i as u32);
        }
        assert_eq!(sends, 2, "five queued requests, one send");
    }

    #[test]
    fn one_bad_answer_in_a_batch_fails_that_request_alone() {
        let (_, others, sends) = queued_behind_one(3, |x| {
            if x == 2 {
                Err(StateError::Corrupt("a record that does not decode"))
            } else {
                Ok(x)
            }
        });
        assert_eq!(sends, 2);
        assert_eq!(others[0].as_ref().unwrap(), &1);
        assert!(matches!(others[1], Err(StateError::Corrupt(_))));
        assert_eq!(others[2].as_ref().unwrap(), &3);
    }

    #[test]
    fn a_batch_out_longer_than_patience_does_not_hold_the_next() {
        let c: Arc<GroupCommit<u32, u32>> =
            Arc::new(GroupCommit::new(64, 4, Duration::from_millis(20)));
        let (release, released) = mpsc::channel::<()>();
        let released = Mutex::new(released);
        let stuck = {
            let c = c.clone();
            std::thread::spawn(move || {
                c.submit(0, |b| {
                    // Answered only once the request behind it was.
                    let heard = released
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(10));
                    match heard {
                        Ok(()) => doubled(b),
                        Err(_) => Err(StateError::Unavailable("held past the next".into())),
                    }
                })
            })
        };
        while c.lock().out.is_empty() {
            std::thread::yield_now();
        }
        assert_eq!(c.submit(1, doubled).unwrap(), 2);
        release.send(()).unwrap();
        assert_eq!(stuck.join().unwrap().unwrap(), 0);
    }

    #[test]
    fn a_failed_or_short_batch_fails_each_request_it_left_unanswered() {
        let c: GroupCommit<u32, u32> = GroupCommit::new(8, 4, LONG);
        let e = c.submit(1, |_| Err(StateError::Unavailable("down".into())));
        assert!(matches!(e, Err(StateError::Unavailable(w)) if w == "down"));
        let short = c.submit(1, |_| Ok(Vec::new()));
        assert!(short.is_err());
        // Still usable afterwards.
        assert_eq!(c.submit(3, doubled).unwrap(), 6);
    }

    #[test]
    fn a_sender_that_panics_fails_its_batch_and_leaves_the_next_to_send() {
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(8, 4, LONG));
        let c2 = c.clone();
        let r = std::thread::spawn(move || c2.submit(1, |_| panic!("sender died"))).join();
        assert!(r.is_err());
        assert_eq!(c.submit(2, doubled).unwrap(), 4);
        let s = c.lock();
        assert!(s.queue.is_empty() && s.answers.is_empty() && s.out.is_empty());
    }

    #[test]
    fn a_sender_that_panics_before_its_own_request_was_sent_leaves_nothing_behind() {
        // One request to a batch, and another's queued first: the sender
        // sends that one, and its own is still queued when it panics.
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(1, 4, LONG));
        c.lock().queue.push_back((1000, 9));
        let c2 = c.clone();
        let r = std::thread::spawn(move || c2.submit(1, |_| panic!("sender died"))).join();
        assert!(r.is_err());
        let s = c.lock();
        assert!(
            s.queue.is_empty(),
            "the panicked sender's request stays queued"
        );
        assert_eq!(s.answers.keys().collect::<Vec<_>>(), vec![&1000]);
        assert!(s.abandoned.is_empty() && s.out.is_empty());
    }

    #[test]
    fn batches_hold_at_most_the_limit() {
        let c: Arc<GroupCommit<u32, u32>> = Arc::new(GroupCommit::new(2, 4, LONG));
        let biggest = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..16u32)
            .map(|i| {
                let (c, biggest) = (c.clone(), biggest.clone());
                std::thread::spawn(move || {
                    c.submit(i, |b| {
                        biggest.fetch_max(b.len(), Ordering::SeqCst);
                        doubled(b)
                    })
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            assert_eq!(t.join().unwrap().unwrap(), 2 * i as u32);
        }
        assert!(biggest.load(Ordering::SeqCst) <= 2);
    }
}
