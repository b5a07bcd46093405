//! The opens and closes of a file several cluster nodes share, written
//! together: concurrent writes from different clients are batched into
//! one etcd transaction where the semantics allow.
//!
//! On such a file a CREATE's share-mode check and caching contention are
//! one etcd transaction, and a close's leaving of both another
//! (`ShareModes::update_with`). The CREATEs and closes of the file that
//! come on this node while one such write is under way wait for it, and
//! the next write carries all of them: one transaction for as many opens
//! and closes as came meanwhile, where each would otherwise wait for the
//! one before and then make its own.
//!
//! The steps' rules are applied in the order the steps came, each to the
//! records as the steps before it left them, and the transaction's
//! compare-and-set proves the records they all started from, so each step
//! is decided as if it had been written alone at that point: a step that
//! is refused (a sharing violation) is refused on the current records,
//! and the steps after it go on. A write that loses to another node's
//! applies every step again to the records as they are now. Where the
//! records are in this node's memory (a file it holds, and every file of
//! a single node) nothing waits: each step is decided at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

use nimbus_state::caching::{Contention, FileCaching, Granted, Holder, LeaseId, OpenAsk, Want};
use nimbus_state::grouped_opens::GROUP_ENTRY;
use nimbus_state::records::{Decided, LockList, Record, LOCKS_PREFIX};
use nimbus_state::{FileKey, FileRecord, OpenRecord, ShareModes, SharingError, StateError};

use super::{caching_of, changed_opens, record_key, wake, Claimed, Oplocks, Summary, Target};

/// One CREATE's or close's change of a shared file's records.
#[derive(Clone, Copy)]
pub(super) enum Step {
    /// A CREATE: its share modes checked, then its caching contention (as
    /// `ShareModes::add_open`, then `Oplocks::contend`).
    Open { ask: OpenAsk, open: OpenRecord },
    /// A close: out of the share modes, unless it is the last open of a
    /// delete-pending file, and out of the caching (as
    /// `remove_open_unless_last_of_deleted`, then `Oplocks::forget`).
    Close { open_id: u64 },
    /// A CREATE that went ahead, counted by its `Open` step, is granted
    /// the caching it asked for (as `Oplocks::admit`); the share modes
    /// are only compared.
    Admit { ask: OpenAsk },
}

/// What came of a step.
pub(super) enum Stepped {
    Opened(Contention),
    /// Whether the open left the records (false: the last open of a
    /// delete-pending file, nothing done; its close goes step by step).
    Closed(bool),
    Admitted(Granted),
}

/// What a step's rule did to the records, before they are written.
enum Applied {
    Refused(SharingError),
    Opened(Contention, Vec<Target>),
    LastOfDeleted,
    Closed {
        open_id: u64,
        ended_break: bool,
        gone: Vec<LeaseId>,
    },
    Admitted(OpenAsk, Granted),
}

/// What a write of steps leaves to do outside the table and the batch.
#[derive(Default)]
struct AfterWrite {
    touched: Vec<FileKey>,
    sends: Vec<Target>,
    /// Opens that left: their breaks no longer end here.
    left: Vec<u64>,
    changed: Vec<u64>,
    woken: Vec<super::Waiter>,
}

/// A step's outcome; None: the records are not written together here.
pub(super) type Outcome = Option<Result<Stepped, SharingError>>;

#[derive(Default)]
struct Gathering {
    /// Steps waiting for the next write, in the order they came.
    steps: Vec<(u64, Step)>,
    /// Whether a thread is writing steps of the file now.
    writing: bool,
    /// Outcomes of written steps, until their threads take them.
    done: HashMap<u64, Outcome>,
}

/// The steps of shared files waiting to be written, per file.
#[derive(Default)]
pub(super) struct Gatherings {
    files: Mutex<HashMap<FileKey, Gathering>>,
    written: Condvar,
    next: AtomicU64,
}

/// Ends a write of gathered steps however it ends: their outcomes go to
/// their threads (an error for each, if the write did not finish), and
/// the next steps may be written.
struct Writing<'a> {
    gatherings: &'a Gatherings,
    file: FileKey,
    tickets: Vec<u64>,
    outcomes: Option<Vec<Outcome>>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let outcomes = self.outcomes.take().unwrap_or_else(|| {
            self.tickets
                .iter()
                .map(|_| Some(Err(unfinished())))
                .collect()
        });
        let mut files = nimbus_state::blocking::lock(&self.gatherings.files);
        let entry = files.entry(self.file).or_default();
        entry.writing = false;
        entry
            .done
            .extend(self.tickets.iter().copied().zip(outcomes));
        drop(files);
        self.gatherings.written.notify_all();
    }
}

fn unfinished() -> SharingError {
    SharingError::Store(StateError::Unavailable(
        "a write of a file's records did not finish".into(),
    ))
}

/// The same error for another step (a write's error is every step's).
fn copy_error(e: &SharingError) -> SharingError {
    match e {
        SharingError::Violation => SharingError::Violation,
        SharingError::DeletePending => SharingError::DeletePending,
        SharingError::Store(e) => SharingError::Store(e.clone_message()),
    }
}

impl Oplocks {
    /// Runs `step` on `file`'s share-mode and caching records, written
    /// with the other steps of the file that come meanwhile. None: the
    /// file's records are not written together here (this node holds
    /// them, or the store is a single node's), and nothing was done.
    pub(super) fn together(&self, file: FileKey, step: Step, share_modes: &ShareModes) -> Outcome {
        if self.store.is_local(&record_key(file)) {
            return None;
        }
        let g = &self.gatherings;
        let ticket = g.next.fetch_add(1, Ordering::Relaxed);
        let mut files = nimbus_state::blocking::lock(&g.files);
        files.entry(file).or_default().steps.push((ticket, step));
        loop {
            let entry = files.entry(file).or_default();
            if let Some(outcome) = entry.done.remove(&ticket) {
                if entry.steps.is_empty() && entry.done.is_empty() && !entry.writing {
                    files.remove(&file);
                }
                return outcome;
            }
            if !entry.writing {
                // This thread writes what has gathered, its own step and
                // those that came while the last write was under way.
                entry.writing = true;
                let steps = std::mem::take(&mut entry.steps);
                drop(files);
                let mut writing = Writing {
                    gatherings: g,
                    file,
                    tickets: steps.iter().map(|(t, _)| *t).collect(),
                    outcomes: None,
                };
                let (outcomes, after) = self.write_steps(file, &steps, share_modes);
                writing.outcomes = Some(outcomes);
                drop(writing);
                // Once the next steps may be written: a break sent to a
                // disconnected durable open closes it, and that close is
                // a step of this file.
                self.after_write(file, after);
                files = nimbus_state::blocking::lock(&g.files);
                continue;
            }
            files = nimbus_state::blocking::off_worker(|| {
                g.written.wait(files).unwrap_or_else(|p| p.into_inner())
            });
        }
    }

    /// Applies `steps` in order to the file's records and writes them in
    /// one transaction, and settles the table as each step's own update
    /// would have; what is then to be done outside the table and the
    /// batch (`after_write`) comes back with the outcomes.
    fn write_steps(
        &self,
        file: FileKey,
        steps: &[(u64, Step)],
        share_modes: &ShareModes,
    ) -> (Vec<Outcome>, AfterWrite) {
        let turn = self.turn(file);
        let (steps, claimed, asking) = self.claim_for_admits(file, steps);
        // Read (and proven) by the write itself, where an admit asks.
        let locks_key = asking.then(|| file.record_key(LOCKS_PREFIX));
        let watch = self.watching();
        // Joins of licensed groups alone, on a node whose lease is proven:
        // an answer that changes nothing and goes on at once (no break to
        // wait for, which a stale memo may show) stands on the records
        // remembered (nimbus_state::grouped_opens, joins without a read).
        let grouped = share_modes.grouped();
        let licensed = steps.iter().all(|step| match step {
            Step::Open { open, .. } => {
                open.share_access & GROUP_ENTRY != 0 && grouped.licensed(open.open_id)
            }
            _ => false,
        });
        let trusted = |(applied, _): &(Vec<Applied>, Summary)| {
            licensed && applied.iter().all(goes_on_at_once)
        };
        let written = share_modes.update_with_trusting(
            file,
            &record_key(file),
            locks_key.as_deref(),
            trusted,
            |rec, s: &mut FileCaching, locks| {
                let before = if watch { caching_of(s) } else { Vec::new() };
                let locked = holds_locks(locks);
                let mut applied: Vec<Applied> = steps
                    .iter()
                    .map(|step| self.apply_step(share_modes, rec, s, step, locked))
                    .collect();
                // A lease whose last open closed and that a later admit
                // of the batch granted again (a client reusing the key)
                // still names this file.
                for a in &mut applied {
                    if let Applied::Closed { gone, .. } = a {
                        gone.retain(|id| s.grant(Holder::Lease(*id)).is_none());
                    }
                }
                let mut summary = Summary::of(s);
                if watch {
                    summary.changed = changed_opens(&before, s);
                    summary.changed.retain(|id| !told_by_create(&steps, *id));
                }
                (applied, summary)
            },
        );
        let (applied, summary) = match written {
            Some(Ok((v, decided))) => {
                if decided != Decided::Remembered {
                    // Its entry proven in the records (written or read),
                    // with no delete-pending: a group's joins may go
                    // without a read from now on, unless revoked.
                    for (step, a) in steps.iter().zip(&v.0) {
                        if let (Step::Open { open, .. }, true) = (step, goes_on_at_once(a)) {
                            if open.share_access & GROUP_ENTRY != 0 {
                                grouped.license(open.open_id);
                            }
                        }
                    }
                }
                v
            }
            not_written => {
                self.table().give_back(file, claimed);
                let outcomes = match not_written {
                    Some(Err(e)) => steps.iter().map(|_| Some(Err(copy_error(&e)))).collect(),
                    _ => steps.iter().map(|_| None).collect(),
                };
                return (outcomes, AfterWrite::default());
            }
        };
        let mut t = self.table();
        let mut sends = Vec::new();
        let (mut left, mut gone_leases) = (Vec::new(), Vec::new());
        let (mut closed, mut ended_break) = (false, false);
        let mut outcomes = Vec::with_capacity(applied.len());
        for a in applied {
            outcomes.push(Some(match a {
                Applied::Refused(e) => Err(e),
                Applied::Opened(c, to) => {
                    sends.extend(self.prepare_breaks(&mut t, file, to));
                    Ok(Stepped::Opened(c))
                }
                Applied::LastOfDeleted => Ok(Stepped::Closed(false)),
                Applied::Admitted(ask, granted) => {
                    // As `admit`: other nodes learn of a directory lease
                    // before its client does (`after_write`).
                    if ask.is_dir && matches!(ask.want, Want::Lease { .. }) && t.dirs.insert(file) {
                        t.dirs_touched.push(file);
                    }
                    Ok(Stepped::Admitted(granted))
                }
                Applied::Closed {
                    open_id,
                    ended_break: ended,
                    gone,
                } => {
                    left.push(open_id);
                    closed = true;
                    ended_break |= ended;
                    gone_leases.extend(gone);
                    Ok(Stepped::Closed(true))
                }
            }));
        }
        // As `forget`: requests waiting on a break that ended with a
        // closed open, or on a file no longer breaking, go on.
        let wake_them = closed && (ended_break || !summary.breaking);
        let (woken, touched) = self.settle_leaving(&mut t, file, wake_them, gone_leases, &summary);
        drop(t);
        drop(turn);
        self.forget_gone_groups();
        let after = AfterWrite {
            touched,
            sends,
            left,
            changed: summary.changed,
            woken,
        };
        (outcomes, after)
    }

    /// What a write of steps leaves to do once the table and the batch
    /// are free: in the order a step-by-step open and close would have
    /// done it (an open's breaks are sent before a later step's close
    /// takes its open's route away: a lease's break goes to its first
    /// open, which may be that one).
    fn after_write(&self, file: FileKey, after: AfterWrite) {
        self.publish_dirs(after.touched);
        self.send(file, after.sends);
        for open_id in after.left {
            self.notifier.unregister(open_id);
        }
        self.tell(after.changed);
        wake(after.woken);
    }

    /// One step's rules, on the records as the steps before it left them.
    fn apply_step(
        &self,
        share_modes: &ShareModes,
        rec: &mut FileRecord,
        s: &mut FileCaching,
        step: &Step,
        locked: bool,
    ) -> Applied {
        match *step {
            Step::Open { ask, open } => match share_modes.admit_rule(rec, open) {
                Err(e) => Applied::Refused(e),
                Ok(()) => {
                    let (c, to) = self.contend_rule(s, &ask);
                    Applied::Opened(c, to)
                }
            },
            Step::Close { open_id } => {
                if share_modes.leave_rule(rec, open_id) {
                    return Applied::LastOfDeleted;
                }
                let (ended_break, gone) = s.remove_open_and_leases(open_id);
                Applied::Closed {
                    open_id,
                    ended_break,
                    gone,
                }
            }
            Step::Admit { mut ask } => {
                ask.has_byte_range_locks |= locked && asks_caching(&ask);
                s.opens.retain(|o| o.open_id != ask.open_id);
                Applied::Admitted(ask, s.admit(&ask))
            }
        }
    }

    /// As `admit` does before its write (`Table::claim_for_admit`), for
    /// each admit of the write. The steps as they are to be applied, what
    /// was claimed, and whether an admit asks for caching (which byte-range
    /// locks take read and handle caching from: the write then reads the
    /// lock record too, `asks_caching`).
    fn claim_for_admits(&self, file: FileKey, steps: &[(u64, Step)]) -> (Vec<Step>, Claimed, bool) {
        let mut claimed = Claimed::default();
        let mut asking = false;
        let mut t = self.table();
        let steps = steps
            .iter()
            .map(|(_, step)| match *step {
                Step::Admit { mut ask } => {
                    asking |= asks_caching(&ask);
                    t.claim_for_admit(file, &mut ask, &mut claimed);
                    Step::Admit { ask }
                }
                other => other,
            })
            .collect();
        (steps, claimed, asking)
    }
}

/// Whether an admit's grant depends on the file's byte-range locks: it
/// asks for caching, and does not overwrite the file (MS-FSA: locks take
/// read and handle caching away, an overwrite's grant stands regardless).
fn asks_caching(ask: &OpenAsk) -> bool {
    !matches!(ask.want, Want::Nothing) && !ask.overwrite
}

/// Whether the lock record's encoded value (`records::LockList`; None:
/// there is none) holds a lock. One that does not decode counts as
/// locked: no read or handle caching is granted beside locks nobody could
/// read.
fn holds_locks(value: Option<&[u8]>) -> bool {
    value.is_some_and(|v| LockList::decode(v).map_or(true, |list| !list.0.is_empty()))
}

/// An open admitted that waits for no break and sends none: what a join
/// without a read may be (a break under way in a stale memo may be over).
fn goes_on_at_once(a: &Applied) -> bool {
    matches!(a, Applied::Opened(c, to) if !c.wait && c.breaks.is_empty() && to.is_empty())
}

/// Whether the change of `open_id`'s caching in a write of `steps` is its
/// CREATE's to record: it was admitted, and no later step opened or
/// admitted (and so could have broken or joined its grant). As `admit`,
/// which does not tell the server of its own open.
fn told_by_create(steps: &[Step], open_id: u64) -> bool {
    let Some(at) = steps
        .iter()
        .position(|s| matches!(s, Step::Admit { ask } if ask.open_id == open_id))
    else {
        return false;
    };
    !steps[at + 1..]
        .iter()
        .any(|s| matches!(s, Step::Open { .. } | Step::Admit { .. }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use nimbus_state::caching::Want;
    use nimbus_state::conformance::SharedMemory;
    use nimbus_state::records::{self, CACHING_PREFIX};

    use super::*;

    const K: FileKey = FileKey::new(1, 7, 1);
    const READ_DATA: u32 = 0x1;
    const WRITE_DATA: u32 = 0x2;
    const SHARE_READ: u32 = 0x1;

    fn opening(open_id: u64, access: u32) -> (OpenAsk, OpenRecord) {
        opening_for(open_id, access, Want::Nothing)
    }

    fn opening_for(open_id: u64, access: u32, want: Want) -> (OpenAsk, OpenRecord) {
        let ask = OpenAsk {
            open_id,
            access,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want,
        };
        let open = OpenRecord {
            open_id,
            access,
            share_access: SHARE_READ,
        };
        (ask, open)
    }

    /// Whether an open's contention, written with its share-mode entry,
    /// lets it go on without waiting for a break.
    fn goes_on(o: &Oplocks, ask: &OpenAsk, sm: &ShareModes, open: OpenRecord) -> bool {
        !o.contend_opening(K, ask, sm, open).unwrap().unwrap().wait
    }

    /// The opens the file's share-mode and caching records name.
    fn named(sm: &ShareModes, store: &SharedMemory) -> (Vec<u64>, Vec<u64>) {
        let shared = sm
            .record(K)
            .unwrap()
            .opens
            .iter()
            .map(|o| o.open_id)
            .collect();
        let key = K.record_key(CACHING_PREFIX);
        let caching = records::read::<FileCaching>(store, &key).unwrap();
        (shared, caching.opens.iter().map(|o| o.open_id).collect())
    }

    /// How many steps of the file wait for the next write.
    fn gathered(o: &Oplocks) -> usize {
        let files = o.gatherings.files.lock().unwrap();
        files.get(&K).map_or(0, |g| g.steps.len())
    }

    /// Waits until `n` steps of the file wait for the next write. A count
    /// and not a change of it: a step's thread may gather before its
    /// spawner looks.
    fn wait_gathered(o: &Oplocks, n: usize, what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while gathered(o) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never gathered"
            );
            std::thread::yield_now();
        }
        assert_eq!(gathered(o), n, "{what}: more steps gathered than came");
    }

    #[test]
    fn opens_and_closes_that_come_during_a_write_go_in_the_next_one() {
        let store = Arc::new(SharedMemory::default());
        let oplocks = Arc::new(Oplocks::new(Duration::from_secs(35), store.clone()));
        let sm = Arc::new(ShareModes::new(store.clone()));
        // Four readers, one write each (each alone).
        for id in 1..=4 {
            let (ask, open) = opening(id, READ_DATA);
            let c = oplocks
                .contend_opening(K, &ask, &sm, open)
                .unwrap()
                .unwrap();
            assert!(!c.wait);
        }
        assert_eq!(store.writes(), 4);
        assert_eq!(named(&sm, &store), (vec![1, 2, 3, 4], vec![1, 2, 3, 4]));

        // Reader 1's close is being written when three more steps come:
        // reader 2 closes, a writer opens (refused: readers 3 and 4 share
        // only reading), reader 3 closes.
        store.close_gate();
        let first = {
            let (o, s) = (oplocks.clone(), sm.clone());
            std::thread::spawn(move || o.forget_closing(K, 1, &s))
        };
        store.wait_held(1);
        let steps: Vec<_> = [(2, None), (5, Some(WRITE_DATA)), (3, None)]
            .into_iter()
            .enumerate()
            .map(|(at, (id, writing))| {
                let (o, s) = (oplocks.clone(), sm.clone());
                let thread = std::thread::spawn(move || match writing {
                    None => o
                        .forget_closing(K, id, &s)
                        .map(|r| r.map(|left| left.to_string())),
                    Some(access) => {
                        let (ask, open) = opening(id, access);
                        o.contend_opening(K, &ask, &s, open)
                            .map(|r| r.map(|c| format!("{c:?}")))
                    }
                });
                // One at a time, so that the test knows their order.
                wait_gathered(&oplocks, at + 1, &format!("step {id}"));
                thread
            })
            .collect();
        // None of them wrote: they wait for the write under way.
        assert_eq!(store.writes(), 4);
        store.open_gate();
        assert!(matches!(first.join().unwrap(), Some(Ok(true))));
        let outcomes: Vec<String> = steps
            .into_iter()
            .map(|t| match t.join().unwrap() {
                Some(Ok(s)) => s,
                Some(Err(SharingError::Violation)) => "violation".into(),
                other => format!("{:?}", other.map(|r| r.is_ok())),
            })
            .collect();
        assert_eq!(outcomes[0], "true");
        assert_eq!(outcomes[1], "violation");
        assert_eq!(outcomes[2], "true");
        // Reader 1's close, then the three steps together: two writes.
        assert_eq!(store.writes(), 6);
        assert_eq!(named(&sm, &store), (vec![4], vec![4]));
    }

    #[test]
    fn alike_opens_of_a_node_write_the_shared_records_once_and_their_closes_once() {
        // Readers of one node, each opening and closing the file: one
        // entry in both records stands for all of them
        // (nimbus_state::grouped_opens), written by the first open and
        // the last close alone.
        let store = Arc::new(SharedMemory::default());
        let oplocks = Oplocks::new(Duration::from_secs(35), store.clone());
        let sm = ShareModes::new(store.clone());
        let open_member = |id: u64| {
            let (ask, open) = opening(id, READ_DATA);
            let entry = sm.join_group(K, open, id);
            let ask = OpenAsk {
                open_id: entry.open_id,
                ..ask
            };
            oplocks.contend_opening(K, &ask, &sm, entry).unwrap()
        };
        for id in 1..=4 {
            assert!(!open_member(id).unwrap().wait);
        }
        assert_eq!(store.writes(), 1);
        assert_eq!(named(&sm, &store), (vec![1], vec![1]));
        // A writer of another node is refused by the entry, as by each
        // reader (they share only reading).
        let (ask, open) = opening(9, WRITE_DATA);
        assert!(matches!(
            oplocks.contend_opening(K, &ask, &sm, open),
            Some(Err(SharingError::Violation))
        ));
        // Members close: nothing to write until the last.
        for id in [1, 3, 2] {
            assert_eq!(sm.grouped().entry_to_leave(id), None);
        }
        assert_eq!(sm.grouped().entry_to_leave(4), Some(1));
        assert!(matches!(oplocks.forget_closing(K, 1, &sm), Some(Ok(true))));
        assert_eq!(store.writes(), 2);
        assert_eq!(named(&sm, &store), (vec![], vec![]));
        let (ask, open) = opening(9, WRITE_DATA);
        assert!(goes_on(&oplocks, &ask, &sm, open));
    }

    #[test]
    fn admits_of_leases_that_come_during_a_write_go_in_the_next_one() {
        // Windows asks for a lease with every open: each admit would be a
        // transaction of its own on a file the nodes share.
        use nimbus_state::caching::{HANDLE, READ};
        let store = Arc::new(SharedMemory::default());
        let oplocks = Arc::new(Oplocks::new(Duration::from_secs(35), store.clone()));
        let sm = Arc::new(ShareModes::new(store.clone()));
        let lease = |id: u64| LeaseId {
            client: [1; 16],
            key: [id as u8; 16],
        };
        let asks: Vec<OpenAsk> = (1..=3)
            .map(|id| {
                let want = Want::Lease {
                    id: lease(id),
                    state: READ | HANDLE,
                    version: 2,
                    parent_key: None,
                    epoch: 0,
                };
                let (ask, open) = opening_for(id, READ_DATA, want);
                let c = oplocks
                    .contend_opening(K, &ask, &sm, open)
                    .unwrap()
                    .unwrap();
                assert!(!c.wait);
                ask
            })
            .collect();
        assert_eq!(store.writes(), 3);

        // Open 1's admit is being written when the other two come.
        store.close_gate();
        let admit = |ask: OpenAsk| {
            let (o, s) = (oplocks.clone(), sm.clone());
            std::thread::spawn(move || o.admit_counted(K, &ask, super::super::tests::route(), &s))
        };
        let first = admit(asks[0]);
        store.wait_held(1);
        let later: Vec<_> = asks[1..]
            .iter()
            .enumerate()
            .map(|(at, ask)| {
                let thread = admit(*ask);
                wait_gathered(&oplocks, at + 1, "admit");
                thread
            })
            .collect();
        store.open_gate();
        for t in std::iter::once(first).chain(later) {
            assert!(matches!(
                t.join().unwrap(),
                Granted::Lease { state, .. } if state == READ | HANDLE
            ));
        }
        // Open 1's admit, then the other two together.
        assert_eq!(store.writes(), 5);
        let caching = records::read::<FileCaching>(&*store, &K.record_key(CACHING_PREFIX)).unwrap();
        assert_eq!(caching.grants.len(), 3);
        // Each key names this file now, and no other.
        let elsewhere = FileKey::new(1, 8, 1);
        assert!((1..=3).all(|id| oplocks.lease_fits(lease(id), Some(K))
            && !oplocks.lease_fits(lease(id), Some(elsewhere))));
    }

    #[test]
    fn a_lock_taken_while_an_admit_is_written_keeps_read_and_handle_caching_from_it() {
        // Another node locks a range of the file after the admit read the
        // lock record and before its write: the write, which proves the
        // lock record's version with the others, must not go through on
        // the record it read, and the lease is granted as beside a lock.
        use nimbus_state::byte_range::RangeLock;
        use nimbus_state::caching::{HANDLE, READ};
        use nimbus_state::StateStore;
        let store = Arc::new(SharedMemory::default());
        let oplocks = Arc::new(Oplocks::new(Duration::from_secs(35), store.clone()));
        let sm = Arc::new(ShareModes::new(store.clone()));
        let want = Want::Lease {
            id: LeaseId {
                client: [1; 16],
                key: [1; 16],
            },
            state: READ | HANDLE,
            version: 2,
            parent_key: None,
            epoch: 0,
        };
        let (ask, open) = opening_for(1, READ_DATA, want);
        assert!(goes_on(&oplocks, &ask, &sm, open));

        store.close_gate_on(&K.record_key(CACHING_PREFIX));
        let admitting = {
            let (o, s) = (oplocks.clone(), sm.clone());
            std::thread::spawn(move || o.admit_counted(K, &ask, super::super::tests::route(), &s))
        };
        store.wait_held(1);
        let lock = LockList(vec![RangeLock {
            owner: 77,
            offset: 0,
            length: 10,
            exclusive: true,
        }]);
        let locks_key = K.record_key(LOCKS_PREFIX);
        assert!(store
            .compare_and_set(&locks_key, None, Some(lock.encode()))
            .unwrap()
            .is_some());
        store.open_gate();
        assert!(matches!(
            admitting.join().unwrap(),
            Granted::Lease { state: 0, .. }
        ));
    }

    #[test]
    fn a_lease_key_closed_and_granted_again_in_one_write_still_names_its_file() {
        // A client closes the last open of its lease and opens the file
        // again with the same key; both are written together.
        use nimbus_state::caching::{HANDLE, READ};
        let store = Arc::new(SharedMemory::default());
        let oplocks = Arc::new(Oplocks::new(Duration::from_secs(35), store.clone()));
        let sm = Arc::new(ShareModes::new(store.clone()));
        let key = LeaseId {
            client: [1; 16],
            key: [9; 16],
        };
        let with_lease = Want::Lease {
            id: key,
            state: READ | HANDLE,
            version: 2,
            parent_key: None,
            epoch: 0,
        };
        let route = super::super::tests::route;
        let open = |id: u64, want: Want| {
            let (ask, open) = opening_for(id, READ_DATA, want);
            assert!(
                !oplocks
                    .contend_opening(K, &ask, &sm, open)
                    .unwrap()
                    .unwrap()
                    .wait
            );
            ask
        };
        let first = open(1, with_lease);
        oplocks.admit_counted(K, &first, route(), &sm);
        open(3, Want::Nothing);
        let again = open(2, with_lease);

        // Open 3's close is being written when open 1 closes (the lease's
        // last open) and open 2 is admitted with the same key.
        store.close_gate();
        let held = {
            let (o, s) = (oplocks.clone(), sm.clone());
            std::thread::spawn(move || o.forget_closing(K, 3, &s))
        };
        store.wait_held(1);
        let mut threads = Vec::new();
        for step in 0..2 {
            let (o, s) = (oplocks.clone(), sm.clone());
            threads.push(std::thread::spawn(move || {
                if step == 0 {
                    assert!(matches!(o.forget_closing(K, 1, &s), Some(Ok(true))));
                } else {
                    o.admit_counted(K, &again, route(), &s);
                }
            }));
            wait_gathered(&oplocks, step + 1, &format!("step {step}"));
        }
        store.open_gate();
        held.join().unwrap();
        for t in threads {
            t.join().unwrap();
        }
        let caching = records::read::<FileCaching>(&*store, &K.record_key(CACHING_PREFIX)).unwrap();
        assert_eq!(caching.grant(Holder::Lease(key)).unwrap().opens, vec![2]);
        // The key still names this file: its acknowledgements find it, and
        // no other file may take it.
        assert!(!oplocks.lease_fits(key, Some(FileKey::new(1, 8, 1))));
        assert!(oplocks.ack_lease(key, READ).is_some());
    }

    #[test]
    fn a_close_caused_by_a_written_open_is_written_after_it() {
        // A break to a disconnected durable open closes that open, and its
        // close is a step of the same file: it must not wait for the write
        // that sent the break (it did, forever).
        let store = Arc::new(SharedMemory::default());
        let sm = Arc::new(ShareModes::new(store.clone()));
        // The node closes the open the break went to.
        struct Closes(std::sync::Weak<Oplocks>, Arc<ShareModes>);
        impl crate::oplocks::OplockHost for Closes {
            fn disconnected_break(&self, open_id: u64, _: nimbus_state::caching::BreakOrder) {
                if let Some(o) = self.0.upgrade() {
                    let _ = o.forget_closing(K, open_id, &self.1);
                }
            }
        }
        let oplocks = Arc::new_cyclic(|o| {
            Oplocks::new(Duration::from_secs(35), store.clone())
                .with_host(Arc::new(Closes(o.clone(), sm.clone())))
        });
        // Open 1 holds a batch oplock, and its client is gone.
        let share_all = |(ask, open): (OpenAsk, OpenRecord)| {
            (
                ask,
                OpenRecord {
                    share_access: 0x7,
                    ..open
                },
            )
        };
        let (ask, open) = share_all(opening_for(
            1,
            READ_DATA | WRITE_DATA,
            Want::Oplock(nimbus_state::caching::OPLOCK_BATCH),
        ));
        oplocks
            .contend_opening(K, &ask, &sm, open)
            .unwrap()
            .unwrap();
        oplocks.admit(K, &ask, super::super::tests::route());
        oplocks.detach(1);
        // Open 2 breaks it: the break closes open 1, and open 2 goes on.
        let (ask, open) = share_all(opening(2, READ_DATA | WRITE_DATA));
        let (done, got) = std::sync::mpsc::channel();
        let (o, s) = (oplocks.clone(), sm.clone());
        std::thread::spawn(move || {
            let _ = done.send(o.contend_opening(K, &ask, &s, open).map(|r| r.is_ok()));
        });
        let answer = got.recv_timeout(Duration::from_secs(10));
        assert!(matches!(answer, Ok(Some(true))), "{answer:?}");
        assert_eq!(named(&sm, &store).0, vec![2]);
    }
}
