//! nimbus-services' oplock and lease service (crates/nimbus-services/src/
//! oplocks.rs) as the harness runs it, step for step but without
//! connections or a clock: a break "sent" is counted, an acknowledgement
//! timer is an entry in `timers` that the input fires when it likes (a
//! stale one does nothing, as the server's serial check makes it), and a
//! waiting request woken is handed back to be run again. Every call into
//! the rules is checked against the state before it (`calls`).

use nimbus_state::caching::{
    AckError, Acked, BreakOrder, Contention, FileCaching, Granted, Holder,
};
use nimbus_state::caching::{LeaseId, OpenAsk, OpenEntry, Want};
use nimbus_state::FileKey;

use crate::calls;
use crate::input::CreateReq;

/// A request that runs again when the breaks on its file end.
#[derive(Clone, Copy, Debug)]
pub enum Deferred {
    Create(CreateReq),
    Rename { open_id: u64 },
}

#[derive(Clone, Copy, Debug)]
pub struct Waiter {
    pub async_id: u64,
    pub client: u8,
    pub request: Deferred,
}

/// One file's caching state and what hangs on it.
#[derive(Debug)]
pub struct Entry {
    pub key: FileKey,
    pub state: FileCaching,
    /// The opens admitted (each has a way to its client for breaks).
    pub routes: Vec<u64>,
    pub waiters: Vec<Waiter>,
    /// Which break each holder's live timer belongs to.
    pub break_serial: Vec<(Holder, u64)>,
}

/// An acknowledgement timer, started with the break it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timer {
    pub file: FileKey,
    pub holder: Holder,
    pub serial: u64,
}

#[derive(Default)]
pub struct Oplocks {
    pub files: Vec<Entry>,
    /// The file each lease is on.
    pub lease_files: Vec<(LeaseId, FileKey)>,
    /// Timers not yet fired, live or stale.
    pub timers: Vec<Timer>,
    next_serial: u64,
    /// Break notifications sent, and acknowledgements that led to a further
    /// break, for the report.
    pub breaks_sent: usize,
    pub follow_ups: usize,
}

impl Oplocks {
    fn index(&self, file: FileKey) -> Option<usize> {
        self.files.iter().position(|e| e.key == file)
    }

    fn index_or_insert(&mut self, file: FileKey) -> usize {
        self.index(file).unwrap_or_else(|| {
            self.files.push(Entry {
                key: file,
                state: FileCaching::default(),
                routes: Vec::new(),
                waiters: Vec::new(),
                break_serial: Vec::new(),
            });
            self.files.len() - 1
        })
    }

    pub fn state(&self, file: FileKey) -> Option<&FileCaching> {
        self.index(file).map(|i| &self.files[i].state)
    }

    /// Drops `file`'s entry once nothing is cached, open or waiting there.
    fn prune(&mut self, file: FileKey) {
        if let Some(i) = self.index(file) {
            let e = &self.files[i];
            if e.state.is_empty() && e.waiters.is_empty() {
                self.files.remove(i);
            }
        }
    }

    /// An open's breaks first; a go-ahead counts the open at once.
    pub fn contend(&mut self, file: FileKey, ask: &OpenAsk) -> Contention {
        let i = self.index_or_insert(file);
        let e = &mut self.files[i];
        let before = e.state.clone();
        let c = e.state.contend(ask);
        calls::breaks(&before, &e.state, &c.breaks);
        // The server parks the CREATE only while a break is under way and
        // otherwise runs it again at once: a wait with nothing breaking
        // would spin for ever.
        assert!(
            !c.wait || e.state.breaking(),
            "contend says wait, but no break is under way: {:?}",
            e.state
        );
        if !c.wait && !ask.sharing_violation {
            e.state.opens.push(OpenEntry {
                open_id: ask.open_id,
                stat: nimbus_state::caching::stat_open(ask.access),
            });
        }
        self.prepare_breaks(file, &c.breaks);
        self.prune(file);
        c
    }

    /// Whether `lease` may be used on `file`: a lease key names one file.
    pub fn lease_fits(&self, lease: LeaseId, file: FileKey) -> bool {
        match self.lease_files.iter().find(|(l, _)| *l == lease) {
            None => true,
            Some((_, k)) => *k == file,
        }
    }

    /// A go-ahead open's grant; a lease key granted on another file since
    /// the CREATE checked it gives no lease.
    pub fn admit(&mut self, file: FileKey, ask: &OpenAsk) -> Granted {
        let mut ask = *ask;
        if let Want::Lease { id, .. } = ask.want {
            if !self.lease_fits(id, file) {
                ask.want = Want::Nothing;
            }
        }
        let ask = &ask;
        let i = self.index_or_insert(file);
        let e = &mut self.files[i];
        let before = e.state.clone();
        e.state.opens.retain(|o| o.open_id != ask.open_id);
        let granted = e.state.admit(ask);
        calls::granted(&before, &e.state, ask, granted);
        e.routes.push(ask.open_id);
        if let Want::Lease { id, .. } = ask.want {
            self.lease_files.retain(|(l, _)| *l != id);
            self.lease_files.push((id, file));
        }
        granted
    }

    /// An open closed or its CREATE failed; returns the waiters to run.
    pub fn forget(&mut self, file: FileKey, open_id: u64) -> Vec<Waiter> {
        let Some(i) = self.index(file) else {
            return Vec::new();
        };
        let e = &mut self.files[i];
        let (ended_break, gone) = e.state.remove_open_and_leases(open_id);
        e.routes.retain(|&o| o != open_id);
        let woken = if ended_break || !e.state.breaking() {
            std::mem::take(&mut e.waiters)
        } else {
            Vec::new()
        };
        self.prune(file);
        self.lease_files.retain(|(l, _)| !gone.contains(l));
        woken
    }

    /// Parks a request until the file's breaks end; hands it back when
    /// they ended already.
    pub fn wait(&mut self, file: FileKey, w: Waiter) -> Option<Waiter> {
        match self.index(file) {
            Some(i) if self.files[i].state.breaking() => {
                self.files[i].waiters.push(w);
                None
            }
            _ => Some(w),
        }
    }

    /// CANCEL of a parked request: whether it was parked here.
    pub fn withdraw(&mut self, file: FileKey, async_id: u64) -> bool {
        let Some(i) = self.index(file) else {
            return false;
        };
        let e = &mut self.files[i];
        let before = e.waiters.len();
        e.waiters.retain(|w| w.async_id != async_id);
        let found = e.waiters.len() != before;
        self.prune(file);
        found
    }

    pub fn ack_oplock(
        &mut self,
        file: FileKey,
        open_id: u64,
        level: u8,
    ) -> (Result<Acked, AckError>, Vec<Waiter>) {
        let state = nimbus_state::caching::oplock_state(level);
        self.ack(file, Holder::Oplock(open_id), state, |s| {
            s.ack_oplock(open_id, level)
        })
    }

    /// None when no file knows the lease.
    pub fn ack_lease(
        &mut self,
        id: LeaseId,
        state: u32,
    ) -> Option<(Result<Acked, AckError>, Vec<Waiter>)> {
        let file = self.lease_files.iter().find(|(l, _)| *l == id)?.1;
        Some(self.ack(file, Holder::Lease(id), state, |s| s.ack_lease(id, state)))
    }

    fn ack(
        &mut self,
        file: FileKey,
        holder: Holder,
        state: u32,
        f: impl FnOnce(&mut FileCaching) -> Result<Acked, AckError>,
    ) -> (Result<Acked, AckError>, Vec<Waiter>) {
        let Some(i) = self.index(file) else {
            return (Err(AckError::NotBreaking), Vec::new());
        };
        let e = &mut self.files[i];
        let before = e.state.clone();
        let result = f(&mut e.state);
        calls::ack(&before, &e.state, holder, state, &result);
        let Ok(acked) = result else {
            return (result, Vec::new());
        };
        let woken = if e.state.breaking() {
            Vec::new()
        } else {
            std::mem::take(&mut e.waiters)
        };
        if acked.follow_up.is_some() {
            self.follow_ups += 1;
        }
        let follow: Vec<BreakOrder> = acked.follow_up.into_iter().collect();
        self.prepare_breaks(file, &follow);
        (Ok(acked), woken)
    }

    /// A write, truncation or byte-range lock through `writer_open`.
    pub fn contend_readers(&mut self, file: FileKey, writer_open: u64) {
        let Some(i) = self.index(file) else {
            return;
        };
        let e = &mut self.files[i];
        if e.state.grants.is_empty() {
            return;
        }
        let before = e.state.clone();
        let breaks = e.state.contend_readers(writer_open);
        calls::breaks(&before, &e.state, &breaks);
        self.prepare_breaks(file, &breaks);
    }

    /// A rename or delete through `by`: whether to wait for the breaks.
    pub fn contend_handles(&mut self, file: FileKey, by: u64) -> bool {
        let Some(i) = self.index(file) else {
            return false;
        };
        let e = &mut self.files[i];
        let before = e.state.clone();
        let c = e.state.contend_handles(by);
        calls::breaks(&before, &e.state, &c.breaks);
        assert!(
            !c.wait || e.state.breaking(),
            "contend_handles says wait, but no break is under way: {:?}",
            e.state
        );
        self.prepare_breaks(file, &c.breaks);
        c.wait
    }

    /// A change inside directory `dir`, made through parent lease `by`.
    pub fn contend_children(&mut self, dir: FileKey, by: Option<LeaseId>) {
        let Some(i) = self.index(dir) else {
            return;
        };
        let e = &mut self.files[i];
        let before = e.state.clone();
        let breaks = e.state.contend_children(by);
        calls::breaks(&before, &e.state, &breaks);
        self.prepare_breaks(dir, &breaks);
    }

    /// Sends the breaks (to the route of the holder's first open) and
    /// starts a timer for each that needs an acknowledgement. A break
    /// with no route is neither sent nor timed, as in the server; the
    /// invariants then find a break under way that nothing will end.
    fn prepare_breaks(&mut self, file: FileKey, breaks: &[BreakOrder]) {
        for b in breaks {
            self.next_serial += 1;
            let serial = self.next_serial;
            let Some(i) = self.index(file) else {
                continue;
            };
            let e = &mut self.files[i];
            let open_id = match b.holder {
                Holder::Oplock(id) => Some(id),
                Holder::Lease(_) => e
                    .state
                    .grant(b.holder)
                    .and_then(|g| g.opens.first().copied()),
            };
            if !open_id.is_some_and(|id| e.routes.contains(&id)) {
                continue;
            }
            self.breaks_sent += 1;
            if b.ack_required {
                e.break_serial.retain(|(h, _)| *h != b.holder);
                e.break_serial.push((b.holder, serial));
                self.timers.push(Timer {
                    file,
                    holder: b.holder,
                    serial,
                });
            }
        }
    }

    /// Whether `t` is the timer of the break its holder is under now.
    pub fn live(&self, t: &Timer) -> bool {
        self.index(t.file).is_some_and(|i| {
            self.files[i]
                .break_serial
                .iter()
                .any(|&(h, s)| h == t.holder && s == t.serial)
        })
    }

    /// A timer fires: if its break still stands, the holder loses all
    /// caching. Returns the waiters to run.
    pub fn fire(&mut self, t: Timer) -> Vec<Waiter> {
        let Some(i) = self.index(t.file) else {
            return Vec::new();
        };
        let e = &mut self.files[i];
        if !e
            .break_serial
            .iter()
            .any(|&(h, s)| h == t.holder && s == t.serial)
        {
            return Vec::new();
        }
        e.break_serial.retain(|(h, _)| *h != t.holder);
        if !e.state.break_timed_out(t.holder) {
            return Vec::new();
        }
        if e.state.breaking() {
            Vec::new()
        } else {
            std::mem::take(&mut e.waiters)
        }
    }

    /// Some break under way: its file, holder and the state it was sent.
    pub fn first_breaking(&self) -> Option<(FileKey, Holder, u32)> {
        self.files.iter().find_map(|e| {
            e.state
                .grants
                .iter()
                .find_map(|g| g.breaking.map(|b| (e.key, g.holder, b.sent)))
        })
    }
}
