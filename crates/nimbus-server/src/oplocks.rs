//! The server's oplocks and leases: per file, the caching state that
//! `nimbus_state::caching` rules over, the CREATEs waiting for breaks to be
//! acknowledged, and the way to each holder's client. This service applies
//! the rules' decisions: it sends break notifications (MS-SMB2 3.3.4.6 and
//! 3.3.4.7) on the holder's connection, starts the acknowledgement timer
//! (`oplock_break_timeout`, 35 s by default as on Windows), and wakes the
//! waiting CREATEs when a break is acknowledged, times out, or its holder
//! closes. One mutex over the table: every step is a few comparisons, and
//! files nobody caches hold no entry.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use nimbus_state::caching::{
    self, AckError, Acked, BreakOrder, Contention, FileCaching, Granted, Holder, LeaseId, OpenAsk,
};
use nimbus_state::FileKey;
use nimbus_wire::header::{flags, Command, Header};
use nimbus_wire::oplock::{LeaseBreakNotification, OplockBreak, LEASE_BREAK_ACK_REQUIRED};
use nimbus_wire::{FileId, NtStatus};

use crate::connection::Connection;
use crate::security::SessionCipher;
use crate::session::lock;

/// How to reach the client of one open.
#[derive(Clone)]
pub struct Route {
    pub conn: Weak<Connection>,
    pub session_id: u64,
    pub file_id: FileId,
    /// Seal breaks with this session's cipher (the session or the tree
    /// requires encryption); otherwise they go in the clear, unsigned, as
    /// Windows sends them.
    pub seal: Option<Arc<SessionCipher>>,
}

/// A CREATE waiting for breaks on a file to end.
struct Waiter {
    async_id: u64,
    wake: Box<dyn FnOnce() + Send>,
}

#[derive(Default)]
struct FileEntry {
    state: FileCaching,
    routes: HashMap<u64, Route>,
    waiters: Vec<Waiter>,
    /// Which break each holder's timer belongs to: an acknowledged break
    /// followed by a new one must not be timed out by the old timer.
    break_serial: HashMap<Holder, u64>,
}

#[derive(Default)]
struct Table {
    files: HashMap<FileKey, FileEntry>,
    /// The file each lease is on (a lease key names one file).
    lease_files: HashMap<LeaseId, FileKey>,
    /// Directories that hold a lease: changes inside them must break it.
    dirs: HashSet<FileKey>,
    next_serial: u64,
}

impl Table {
    /// Drops `file`'s entry once nothing is cached, open or waiting there.
    fn prune(&mut self, file: FileKey) {
        if let Some(e) = self.files.get(&file) {
            if e.state.is_empty() && e.waiters.is_empty() {
                self.files.remove(&file);
                self.dirs.remove(&file);
            }
        }
    }
}

pub struct Oplocks {
    table: Arc<Mutex<Table>>,
    break_timeout: Duration,
    /// How many directories hold a lease, read without the lock: while
    /// none does, a change to a file costs no look-up of its directory.
    dir_leases: AtomicUsize,
}

/// What an acknowledgement came to.
pub enum AckOutcome {
    Done(Acked),
    Refused(AckError),
}

impl Oplocks {
    pub fn new(break_timeout: Duration) -> Oplocks {
        Oplocks {
            table: Arc::new(Mutex::new(Table::default())),
            break_timeout,
            dir_leases: AtomicUsize::new(0),
        }
    }

    /// Sends what an open of `file` requires of other holders first. When
    /// the answer is to wait, the caller parks its CREATE with `wait`. An
    /// open that may go on is counted among the file's opens at once (so
    /// that a racing open cannot be granted write caching beside it); it
    /// must be `admit`ted or `forget`ten.
    pub fn contend(&self, file: FileKey, ask: &OpenAsk) -> Contention {
        let (contention, sends) = {
            let mut t = lock(&self.table);
            let entry = t.files.entry(file).or_default();
            let c = entry.state.contend(ask);
            if !c.wait && !ask.sharing_violation {
                entry.state.opens.push(caching::OpenEntry {
                    open_id: ask.open_id,
                    stat: caching::stat_open(ask.access),
                });
            }
            let sends = self.prepare_breaks(&mut t, file, &c.breaks);
            t.prune(file);
            self.count_dirs(&t);
            (c, sends)
        };
        self.send(sends);
        contention
    }

    /// Whether `lease` may be used on `file` (None: a file about to be
    /// created): a lease key names one file (MS-SMB2 3.3.5.9.8).
    pub fn lease_fits(&self, lease: LeaseId, file: Option<FileKey>) -> bool {
        match lock(&self.table).lease_files.get(&lease) {
            None => true,
            Some(k) => Some(*k) == file,
        }
    }

    /// Records an open that went ahead and returns what it was granted.
    pub fn admit(&self, file: FileKey, ask: &OpenAsk, route: Route) -> Granted {
        let mut t = lock(&self.table);
        let mut ask = *ask;
        if let caching::Want::Lease { id, .. } = ask.want {
            // `lease_fits` was asked before the file was opened; a CREATE
            // naming the same key on another file may have been granted
            // its lease meanwhile. A key names one file: this open gets no
            // lease (found by the state_rules fuzz target).
            if t.lease_files.get(&id).is_some_and(|k| *k != file) {
                ask.want = caching::Want::Nothing;
            }
        }
        let ask = &ask;
        let entry = t.files.entry(file).or_default();
        entry.state.opens.retain(|o| o.open_id != ask.open_id);
        let granted = entry.state.admit(ask);
        entry.routes.insert(ask.open_id, route);
        if let caching::Want::Lease { id, .. } = ask.want {
            t.lease_files.insert(id, file);
            if ask.is_dir {
                t.dirs.insert(file);
                self.count_dirs(&t);
            }
        }
        granted
    }

    /// Forgets an open: closed, or its CREATE failed after `contend`.
    /// Wakes the CREATEs waiting on a break that went with it.
    pub fn forget(&self, file: FileKey, open_id: u64) {
        let woken = {
            let mut t = lock(&self.table);
            let Some(entry) = t.files.get_mut(&file) else {
                return;
            };
            // The leases this open shared, to see which went with it.
            let shared: Vec<LeaseId> = entry
                .state
                .grants
                .iter()
                .filter_map(|g| match g.holder {
                    Holder::Lease(id) if g.opens.contains(&open_id) => Some(id),
                    _ => None,
                })
                .collect();
            let ended_break = entry.state.remove_open(open_id);
            entry.routes.remove(&open_id);
            let woken = if ended_break || !entry.state.breaking() {
                std::mem::take(&mut entry.waiters)
            } else {
                Vec::new()
            };
            let gone: Vec<LeaseId> = shared
                .into_iter()
                .filter(|id| entry.state.grant(Holder::Lease(*id)).is_none())
                .collect();
            t.prune(file);
            self.count_dirs(&t);
            for id in gone {
                t.lease_files.remove(&id);
            }
            woken
        };
        wake(woken);
    }

    /// Parks a CREATE until the file's breaks end; `wake` retries it. If
    /// they ended already (acknowledged between the CREATE's check and
    /// now), it is retried at once.
    pub fn wait(&self, file: FileKey, async_id: u64, wake_fn: Box<dyn FnOnce() + Send>) {
        let now = {
            let mut t = lock(&self.table);
            match t.files.get_mut(&file) {
                Some(entry) if entry.state.breaking() => {
                    entry.waiters.push(Waiter {
                        async_id,
                        wake: wake_fn,
                    });
                    None
                }
                _ => Some(wake_fn),
            }
        };
        if let Some(w) = now {
            spawn(w);
        }
    }

    /// Takes a waiting CREATE out (cancelled, or its connection went).
    pub fn withdraw(&self, file: FileKey, async_id: u64) {
        let mut t = lock(&self.table);
        if let Some(entry) = t.files.get_mut(&file) {
            entry.waiters.retain(|w| w.async_id != async_id);
            t.prune(file);
            self.count_dirs(&t);
        }
    }

    /// OPLOCK_BREAK acknowledgement of an oplock.
    pub fn ack_oplock(&self, file: FileKey, open_id: u64, level: u8) -> AckOutcome {
        self.ack(file, |s| s.ack_oplock(open_id, level))
    }

    /// OPLOCK_BREAK acknowledgement of a lease; None when the lease is
    /// unknown.
    pub fn ack_lease(&self, id: LeaseId, state: u32) -> Option<AckOutcome> {
        let file = *lock(&self.table).lease_files.get(&id)?;
        Some(self.ack(file, |s| s.ack_lease(id, state)))
    }

    fn ack(
        &self,
        file: FileKey,
        f: impl FnOnce(&mut FileCaching) -> Result<Acked, AckError>,
    ) -> AckOutcome {
        let (outcome, sends, woken) = {
            let mut t = lock(&self.table);
            let Some(entry) = t.files.get_mut(&file) else {
                return AckOutcome::Refused(AckError::NotBreaking);
            };
            let acked = match f(&mut entry.state) {
                Ok(a) => a,
                Err(e) => return AckOutcome::Refused(e),
            };
            let woken = if entry.state.breaking() {
                Vec::new()
            } else {
                std::mem::take(&mut entry.waiters)
            };
            let follow: Vec<BreakOrder> = acked.follow_up.into_iter().collect();
            let sends = self.prepare_breaks(&mut t, file, &follow);
            (AckOutcome::Done(acked), sends, woken)
        };
        self.send(sends);
        wake(woken);
        outcome
    }

    /// Another open writes, truncates or locks: read caching of the other
    /// holders goes, without waiting (MS-FSA 2.1.4.12).
    pub fn contend_readers(&self, file: FileKey, writer_open: u64) {
        let sends = {
            let mut t = lock(&self.table);
            let Some(entry) = t.files.get_mut(&file) else {
                return;
            };
            if entry.state.grants.is_empty() {
                return;
            }
            let breaks = entry.state.contend_readers(writer_open);
            self.prepare_breaks(&mut t, file, &breaks)
        };
        self.send(sends);
    }

    /// The file is being deleted or renamed through `by`: other holders'
    /// handle caching goes. Returns whether a holder keeps it until it
    /// acknowledges (a rename then `wait`s; a delete goes on).
    pub fn contend_handles(&self, file: FileKey, by: u64) -> bool {
        let (wait, sends) = {
            let mut t = lock(&self.table);
            let Some(entry) = t.files.get_mut(&file) else {
                return false;
            };
            let c = entry.state.contend_handles(by);
            (c.wait, self.prepare_breaks(&mut t, file, &c.breaks))
        };
        self.send(sends);
        wait
    }

    /// Whether any directory holds a lease now.
    pub fn has_dir_leases(&self) -> bool {
        self.dir_leases.load(Ordering::Acquire) != 0
    }

    fn count_dirs(&self, t: &Table) {
        self.dir_leases.store(t.dirs.len(), Ordering::Release);
    }

    /// Something changed inside directory `dir`: its leases go to none,
    /// except the one `by` names (the client's own parent lease). Nobody
    /// waits for these acknowledgements.
    pub fn contend_children(&self, dir: FileKey, by: Option<LeaseId>) {
        let sends = {
            let mut t = lock(&self.table);
            let Some(entry) = t.files.get_mut(&dir) else {
                return;
            };
            let breaks = entry.state.contend_children(by);
            self.prepare_breaks(&mut t, dir, &breaks)
        };
        self.send(sends);
    }

    /// Turns break orders into messages with their routes, and starts the
    /// acknowledgement timers. Under the table lock; sending happens after.
    fn prepare_breaks(&self, t: &mut Table, file: FileKey, breaks: &[BreakOrder]) -> Vec<Outbound> {
        let mut out = Vec::new();
        for b in breaks {
            t.next_serial += 1;
            let serial = t.next_serial;
            let Some(entry) = t.files.get_mut(&file) else {
                continue;
            };
            let open_id = match b.holder {
                Holder::Oplock(id) => Some(id),
                Holder::Lease(_) => entry
                    .state
                    .grant(b.holder)
                    .and_then(|g| g.opens.first().copied()),
            };
            let Some(route) = open_id.and_then(|id| entry.routes.get(&id)).cloned() else {
                continue;
            };
            if b.ack_required {
                entry.break_serial.insert(b.holder, serial);
                self.start_timer(file, b.holder, serial);
            }
            out.push(Outbound { order: *b, route });
        }
        out
    }

    fn start_timer(&self, file: FileKey, holder: Holder, serial: u64) {
        let table = Arc::downgrade(&self.table);
        let after = self.break_timeout;
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            tokio::time::sleep(after).await;
            let Some(table) = table.upgrade() else {
                return;
            };
            let woken = {
                let mut t = lock(&table);
                let Some(entry) = t.files.get_mut(&file) else {
                    return;
                };
                if entry.break_serial.get(&holder) != Some(&serial) {
                    return;
                }
                entry.break_serial.remove(&holder);
                if !entry.state.break_timed_out(holder) {
                    return;
                }
                tracing::info!("break of {holder:?} not acknowledged in {after:?}; taken as done");
                if entry.state.breaking() {
                    Vec::new()
                } else {
                    std::mem::take(&mut entry.waiters)
                }
            };
            wake(woken);
        });
    }

    fn send(&self, sends: Vec<Outbound>) {
        for s in sends {
            s.send();
        }
    }
}

/// A break notification on its way to a client.
struct Outbound {
    order: BreakOrder,
    route: Route,
}

impl Outbound {
    fn send(self) {
        let Some(conn) = self.route.conn.upgrade() else {
            return;
        };
        if conn.is_closing() {
            return;
        }
        let b = self.order;
        tracing::debug!(
            "{}: break {:?} from {:#x} to {:#x} (ack {})",
            conn.peer,
            b.holder,
            b.from,
            b.to,
            b.ack_required
        );
        // MS-SMB2 3.3.4.6 / 3.3.4.7: MessageId all ones, no credits; an
        // oplock break names the open's session, a lease break none.
        let session_id = match b.holder {
            Holder::Oplock(_) => self.route.session_id,
            Holder::Lease(_) => 0,
        };
        let header = Header {
            credit_charge: 0,
            status: NtStatus::SUCCESS,
            command: Command::OplockBreak as u16,
            credits: 0,
            flags: flags::SERVER_TO_REDIR,
            next_command: 0,
            message_id: u64::MAX,
            async_id: 0,
            tree_id: 0,
            session_id,
            signature: [0; 16],
        };
        let seal = self
            .route
            .seal
            .clone()
            .map(|cipher| (self.route.session_id, cipher));
        let file_id = self.route.file_id;
        crate::pending::send_message(
            &conn,
            &header,
            |out| match b.holder {
                Holder::Oplock(_) => OplockBreak {
                    oplock_level: caching::oplock_level(b.to),
                    file_id,
                }
                .encode(out),
                Holder::Lease(id) => LeaseBreakNotification {
                    new_epoch: if b.version >= 2 { b.epoch } else { 0 },
                    flags: if b.ack_required {
                        LEASE_BREAK_ACK_REQUIRED
                    } else {
                        0
                    },
                    lease_key: id.key,
                    current_state: b.from,
                    new_state: b.to,
                }
                .encode(out),
            },
            None,
            seal.as_ref(),
        );
    }
}

fn spawn(f: Box<dyn FnOnce() + Send>) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move { f() });
        }
        Err(_) => f(),
    }
}

fn wake(waiters: Vec<Waiter>) {
    for w in waiters {
        spawn(w.wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use caching::Want;

    fn route() -> Route {
        Route {
            conn: Weak::new(),
            session_id: 1,
            file_id: FileId {
                persistent: 1,
                volatile: 1,
            },
            seal: None,
        }
    }

    #[test]
    fn racing_creates_cannot_put_one_lease_key_on_two_files() {
        let oplocks = Oplocks::new(Duration::from_secs(35));
        let id = LeaseId {
            client: [1; 16],
            key: [2; 16],
        };
        let (x, y) = (FileKey { dev: 1, ino: 1 }, FileKey { dev: 1, ino: 2 });
        let ask = |open_id| OpenAsk {
            open_id,
            access: 0x1,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want: Want::Lease {
                id,
                state: caching::READ,
                version: 2,
                parent_key: None,
                epoch: 0,
            },
        };
        // Both CREATEs check the key before either is granted.
        assert!(oplocks.lease_fits(id, Some(x)) && oplocks.lease_fits(id, Some(y)));
        oplocks.contend(x, &ask(1));
        oplocks.contend(y, &ask(2));
        assert!(matches!(
            oplocks.admit(x, &ask(1), route()),
            Granted::Lease {
                state: caching::READ,
                ..
            }
        ));
        assert_eq!(
            oplocks.admit(y, &ask(2), route()),
            Granted::Oplock(caching::OPLOCK_NONE)
        );
        // The key still names the first file, and goes with its last open.
        assert!(!oplocks.lease_fits(id, Some(y)));
        oplocks.forget(y, 2);
        assert!(oplocks.lease_fits(id, Some(x)) && !oplocks.lease_fits(id, Some(y)));
        oplocks.forget(x, 1);
        assert!(oplocks.lease_fits(id, Some(y)));
    }
}
