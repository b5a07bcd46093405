//! The clients' requests as nimbus-server's handlers carry them out
//! (handlers/create.rs, close.rs, oplock_break.rs, write.rs, set_info.rs,
//! lock.rs, deferred.rs, connection teardown), reduced to their calls into
//! the state services. Names, paths and the disk are left out: every file
//! exists, and a file deleted is at once replaced by a new one with
//! another identity.

use std::sync::Arc;

use nimbus_state::byte_range::{valid_range, LockRange};
use nimbus_state::caching::{self, AckError, Granted, LeaseId, OpenAsk, Want};
use nimbus_state::{FileKey, MemoryStore, OpenRecord, ShareModes, SharingError};

use crate::input::{Caching, CreateReq, Op, DELETE, DIR, FILES, WRITE_DATA};
use crate::input::{APPEND_DATA, SYNCHRONIZE};
use crate::lock_service::{Locks, Outcome};
use crate::oplock_service::{Deferred, Oplocks, Timer, Waiter};
use crate::Report;

/// An open handle.
#[derive(Clone, Debug)]
pub struct Open {
    pub id: u64,
    pub client: u8,
    pub file: usize,
    pub key: FileKey,
    /// Granted access (what share modes see).
    pub access: u32,
    /// What the caching rules saw (an overwrite writes).
    pub ask_access: u32,
    pub lease: Option<LeaseId>,
    /// The parent directory's lease the client named.
    pub parent: Option<LeaseId>,
    pub delete_on_close: bool,
    /// Wrote data: its close changes the directory listing.
    pub wrote: bool,
}

/// A CREATE past the caching check and not yet granted (the server opens
/// the file on disk in between; other requests run meanwhile).
#[derive(Clone, Debug)]
pub struct Stalled {
    pub req: CreateReq,
    pub ask: OpenAsk,
    /// The access granted (what share modes see).
    pub access: u32,
    pub key: FileKey,
    pub async_id: Option<u64>,
}

pub struct World {
    pub oplocks: Oplocks,
    pub locks: Locks,
    pub shares: ShareModes,
    /// How many times each file was deleted (and replaced).
    pub generation: [u64; FILES],
    pub opens: Vec<Open>,
    pub stalled: Vec<Stalled>,
    /// Requests answered STATUS_PENDING and not yet completed.
    pub outstanding: Vec<u64>,
    next_open: u64,
    next_async: u64,
    pub report: Report,
}

pub fn client_guid(client: u8) -> [u8; 16] {
    [client + 1; 16]
}

pub fn lease_key(key: u8) -> [u8; 16] {
    [key + 0xA0; 16]
}

/// What the server asks the rules for (create.rs: directories are leased
/// but never get oplocks; a parent key and an epoch only in version 2).
fn want(req: &CreateReq, is_dir: bool) -> Want {
    match req.caching {
        Caching::Nothing => Want::Nothing,
        Caching::Oplock(_) if is_dir => Want::Nothing,
        Caching::Oplock(level) => Want::Oplock(level),
        Caching::Lease {
            key,
            state,
            version,
            parent,
            epoch,
        } => Want::Lease {
            id: LeaseId {
                client: client_guid(req.client),
                key: lease_key(key),
            },
            state,
            version,
            parent_key: parent.filter(|_| version == 2).map(lease_key),
            epoch: if version == 2 { epoch } else { 0 },
        },
    }
}

/// The open's lease and the parent lease its changes come through.
fn leases(want: &Want) -> (Option<LeaseId>, Option<LeaseId>) {
    match *want {
        Want::Lease { id, parent_key, .. } => (
            Some(id),
            parent_key.map(|key| LeaseId {
                client: id.client,
                key,
            }),
        ),
        _ => (None, None),
    }
}

impl World {
    pub fn new() -> Self {
        World {
            oplocks: Oplocks::default(),
            locks: Locks::default(),
            shares: ShareModes::new(Arc::new(MemoryStore::new())),
            generation: [0; FILES],
            opens: Vec::new(),
            stalled: Vec::new(),
            outstanding: Vec::new(),
            next_open: 0,
            next_async: 0,
            report: Report::default(),
        }
    }

    /// The identity file `file` has now.
    pub fn key(&self, file: usize) -> FileKey {
        FileKey {
            dev: 1,
            ino: file as u64,
            gen: self.generation[file],
        }
    }

    fn pick_open(&self, pick: u8) -> Option<Open> {
        if self.opens.is_empty() {
            return None;
        }
        Some(self.opens[usize::from(pick) % self.opens.len()].clone())
    }

    fn go_async(&mut self) -> u64 {
        self.next_async += 1;
        self.outstanding.push(self.next_async);
        self.next_async
    }

    /// A request is answered; a pending one leaves the outstanding list.
    fn complete(&mut self, async_id: Option<u64>) {
        if let Some(id) = async_id {
            let at = self
                .outstanding
                .iter()
                .position(|&o| o == id)
                .unwrap_or_else(|| panic!("request {id} answered twice or never pending"));
            self.outstanding.remove(at);
            self.report.completed += 1;
        }
    }

    pub fn apply(&mut self, op: Op) {
        match op {
            Op::Create(req) => self.create(req, None),
            Op::Finish { pick, fail } => {
                if !self.stalled.is_empty() {
                    self.finish(usize::from(pick) % self.stalled.len(), fail);
                }
            }
            Op::Close { pick } => {
                if !self.opens.is_empty() {
                    self.close(usize::from(pick) % self.opens.len());
                }
            }
            Op::AckOplock { pick, level } => self.ack_oplock(pick, level),
            Op::AckLease { client, key, state } => {
                let id = LeaseId {
                    client: client_guid(client),
                    key: lease_key(key),
                };
                if let Some((_, woken)) = self.oplocks.ack_lease(id, state) {
                    self.run(woken);
                }
            }
            Op::Timeout { pick } => {
                if !self.oplocks.timers.is_empty() {
                    let at = usize::from(pick) % self.oplocks.timers.len();
                    let t = self.oplocks.timers.remove(at);
                    self.fire(t);
                }
            }
            Op::Write { pick, set_eof } => self.write(pick, set_eof),
            Op::Rename { pick } => {
                if let Some(o) = self.pick_open(pick) {
                    self.rename(o.id, o.client, None);
                }
            }
            Op::Delete { pick } => self.delete(pick),
            Op::ChildChange { client, key } => {
                let by = key.map(|k| LeaseId {
                    client: client_guid(client),
                    key: lease_key(k),
                });
                let dir = self.key(DIR);
                self.oplocks.contend_children(dir, by);
            }
            Op::Lock {
                pick,
                ranges,
                fail_immediately,
            } => self.lock(pick, &ranges, fail_immediately),
            Op::Unlock { pick, ranges } => {
                if let Some(o) = self.pick_open(pick) {
                    for id in self.locks.unlock(o.key, o.id, &ranges) {
                        self.complete(Some(id));
                    }
                }
            }
            Op::Cancel { pick } => self.cancel(pick),
            Op::Disconnect { client } => self.disconnect(client),
        }
    }

    /// Runs woken requests again, from the start, as deferred.rs does.
    pub(crate) fn run(&mut self, woken: Vec<Waiter>) {
        for w in woken {
            self.report.retried += 1;
            match w.request {
                Deferred::Create(req) => self.create(req, Some(w.async_id)),
                Deferred::Rename { open_id } => self.rename(open_id, w.client, Some(w.async_id)),
            }
        }
    }

    fn park(&mut self, file: FileKey, w: Waiter) {
        if let Some(now) = self.oplocks.wait(file, w) {
            self.run(vec![now]);
        }
    }

    /// CREATE of an existing file (create.rs): share modes, then other
    /// holders' breaks (waiting for them), then the grant.
    fn create(&mut self, req: CreateReq, async_id: Option<u64>) {
        let is_dir = req.file == DIR;
        // Refused before caching is considered: an overwritten directory,
        // delete-on-close without DELETE (or of the non-empty directory).
        if (is_dir && req.overwrite)
            || (req.delete_on_close && (req.access & DELETE == 0 || is_dir))
        {
            return self.complete(async_id);
        }
        let key = self.key(req.file);
        let want = want(&req, is_dir);
        if let Want::Lease { id, .. } = want {
            if !self.oplocks.lease_fits(id, key) {
                return self.complete(async_id);
            }
        }
        let access = if is_dir {
            req.access & !SYNCHRONIZE
        } else {
            req.access
        };
        self.next_open += 1;
        let open_id = self.next_open;
        let mut ask = OpenAsk {
            open_id,
            access: if req.overwrite {
                access | WRITE_DATA
            } else {
                access
            },
            overwrite: req.overwrite,
            sharing_violation: false,
            is_dir,
            has_byte_range_locks: self.locks.has_locks(key),
            want,
        };
        let record = OpenRecord {
            open_id,
            access,
            share_access: req.share,
        };
        match self.shares.add_open(key, record) {
            Ok(()) => {}
            Err(SharingError::Violation) => ask.sharing_violation = true,
            Err(SharingError::DeletePending) => return self.complete(async_id),
            Err(SharingError::Store(e)) => panic!("memory store: {e:?}"),
        }
        let c = self.oplocks.contend(key, &ask);
        if c.wait {
            if !ask.sharing_violation {
                self.remove_share(key, open_id);
            }
            let async_id = async_id.unwrap_or_else(|| self.go_async());
            self.report.parked += 1;
            let w = Waiter {
                async_id,
                client: req.client,
                request: Deferred::Create(req),
            };
            return self.park(key, w);
        }
        if ask.sharing_violation {
            return self.complete(async_id);
        }
        self.stalled.push(Stalled {
            req,
            ask,
            access,
            key,
            async_id,
        });
        if !req.stall {
            self.finish(self.stalled.len() - 1, false);
        }
    }

    /// Takes a CREATE's record out of the share modes. create.rs ignores
    /// whether that was the last record of a delete-pending file: a CREATE
    /// that waits or fails never deletes the file.
    fn remove_share(&mut self, key: FileKey, open_id: u64) {
        let _ = self.shares.remove_open(key, open_id);
    }

    /// The rest of a CREATE: the open goes ahead, or fails on disk.
    pub(crate) fn finish(&mut self, at: usize, fail: bool) {
        let s = self.stalled.remove(at);
        let open_id = s.ask.open_id;
        if fail {
            self.remove_share(s.key, open_id);
            let woken = self.oplocks.forget(s.key, open_id);
            self.complete(s.async_id);
            return self.run(woken);
        }
        let (lease, parent) = leases(&s.ask.want);
        if s.req.overwrite {
            self.child_changed(s.req.file, parent);
        }
        let granted = self.oplocks.admit(s.key, &s.ask);
        let lease = lease.filter(|_| matches!(granted, Granted::Lease { .. }));
        self.report.opened += 1;
        self.opens.push(Open {
            id: open_id,
            client: s.req.client,
            file: s.req.file,
            key: s.key,
            access: s.access,
            ask_access: s.ask.access,
            lease,
            parent,
            delete_on_close: s.req.delete_on_close,
            wrote: false,
        });
        if s.req.delete_on_close {
            // Others' cached handles would keep the file: asked to go now.
            self.oplocks.contend_handles(s.key, open_id);
        }
        self.complete(s.async_id);
    }

    /// dir_leases.rs: a change to `file` shows in its directory's listing
    /// (the directory itself sits in the share root, which has no lease).
    fn child_changed(&mut self, file: usize, by: Option<LeaseId>) {
        if file != DIR {
            let dir = self.key(DIR);
            self.oplocks.contend_children(dir, by);
        }
    }

    /// close.rs `release`.
    pub(crate) fn close(&mut self, at: usize) {
        let o = self.opens.remove(at);
        let (ended, granted) = self.locks.release_open(o.key, o.id);
        for id in ended.into_iter().chain(granted) {
            self.complete(Some(id));
        }
        if o.delete_on_close {
            self.set_delete_pending(o.key);
            self.oplocks.contend_handles(o.key, o.id);
        }
        let deleted = self
            .shares
            .remove_open(o.key, o.id)
            .unwrap_or_else(|e| panic!("memory store: {e:?}"));
        if deleted {
            self.generation[o.file] += 1;
            self.report.deleted += 1;
        }
        if deleted || o.wrote {
            self.child_changed(o.file, o.parent);
        }
        let woken = self.oplocks.forget(o.key, o.id);
        if deleted {
            assert!(
                self.oplocks.state(o.key).is_none() && !self.locks.has_locks(o.key),
                "a deleted file keeps state: {:?}",
                self.oplocks.state(o.key)
            );
        }
        self.run(woken);
    }

    fn set_delete_pending(&mut self, key: FileKey) {
        self.shares
            .set_delete_pending(key, true)
            .unwrap_or_else(|e| panic!("memory store: {e:?}"));
    }

    /// oplock_break.rs: only NONE and II are acknowledgements; II for a
    /// break to none is taken as none.
    fn ack_oplock(&mut self, pick: u8, level: u8) {
        let Some(o) = self.pick_open(pick) else {
            return;
        };
        if level != caching::OPLOCK_NONE && level != caching::OPLOCK_II {
            return;
        }
        let (result, woken) = self.oplocks.ack_oplock(o.key, o.id, level);
        let woken = match result {
            Err(AckError::TooMuch) => self.oplocks.ack_oplock(o.key, o.id, caching::OPLOCK_NONE).1,
            _ => woken,
        };
        self.run(woken);
    }

    pub(crate) fn fire(&mut self, t: Timer) {
        let live = self.oplocks.live(&t);
        let woken = self.oplocks.fire(t);
        self.report.timeouts += usize::from(live);
        self.run(woken);
    }

    /// write.rs, or SET_INFO end-of-file.
    fn write(&mut self, pick: u8, set_eof: bool) {
        let Some(o) = self.pick_open(pick) else {
            return;
        };
        let needed = if set_eof {
            WRITE_DATA
        } else {
            WRITE_DATA | APPEND_DATA
        };
        if o.file == DIR || o.access & needed == 0 {
            return;
        }
        self.oplocks.contend_readers(o.key, o.id);
        if set_eof {
            self.child_changed(o.file, o.parent);
        } else if let Some(open) = self.opens.iter_mut().find(|x| x.id == o.id) {
            open.wrote = true;
        }
    }

    /// set_info.rs rename: waits while other leases give up handle
    /// caching; run again from the start when they did.
    fn rename(&mut self, open_id: u64, client: u8, async_id: Option<u64>) {
        let Some(o) = self.opens.iter().find(|o| o.id == open_id).cloned() else {
            // The handle closed while the rename waited.
            return self.complete(async_id);
        };
        if o.access & DELETE == 0 {
            return self.complete(async_id);
        }
        if self.oplocks.contend_handles(o.key, o.id) {
            let async_id = async_id.unwrap_or_else(|| self.go_async());
            self.report.parked += 1;
            let w = Waiter {
                async_id,
                client,
                request: Deferred::Rename { open_id },
            };
            return self.park(o.key, w);
        }
        // Out of the directory's listing and back in under the new name.
        self.child_changed(o.file, o.parent);
        self.child_changed(o.file, o.parent);
        self.complete(async_id);
    }

    /// SET_INFO FileDispositionInformation (the directory is never empty).
    fn delete(&mut self, pick: u8) {
        let Some(o) = self.pick_open(pick) else {
            return;
        };
        if o.access & DELETE == 0 || o.file == DIR {
            return;
        }
        self.set_delete_pending(o.key);
        self.oplocks.contend_handles(o.key, o.id);
    }

    /// lock.rs: several elements must all fail immediately; a lock ends
    /// others' read caching before it is tried.
    fn lock(&mut self, pick: u8, ranges: &[(u64, u64, bool)], fail_immediately: bool) {
        let Some(o) = self.pick_open(pick) else {
            return;
        };
        if ranges.len() > 1 && !fail_immediately {
            return;
        }
        if ranges.iter().any(|&(off, len, _)| !valid_range(off, len)) {
            return;
        }
        let ranges: Vec<LockRange> = ranges
            .iter()
            .map(|&(offset, length, exclusive)| LockRange {
                offset,
                length,
                exclusive,
            })
            .collect();
        self.oplocks.contend_readers(o.key, o.id);
        let blocking = ranges.len() == 1 && !fail_immediately;
        // The id the request gets if it goes async (counted only then).
        let async_id = blocking.then_some(self.next_async + 1);
        match self.locks.lock(o.key, o.id, ranges, async_id) {
            Outcome::Granted | Outcome::Refused => {}
            Outcome::Waiting => {
                let id = self.go_async();
                debug_assert_eq!(Some(id), async_id);
                self.report.lock_waits += 1;
            }
        }
    }

    /// Every request waiting, as (file, async id, client, is a lock).
    pub(crate) fn waiters(&self) -> Vec<(FileKey, u64, u8, bool)> {
        let mut v: Vec<_> = self
            .oplocks
            .files
            .iter()
            .flat_map(|e| {
                e.waiters
                    .iter()
                    .map(|w| (e.key, w.async_id, w.client, false))
            })
            .collect();
        for f in &self.locks.files {
            for w in &f.waiting {
                let client = self
                    .opens
                    .iter()
                    .find(|o| o.id == w.owner)
                    .map_or(u8::MAX, |o| o.client);
                v.push((f.key, w.async_id, client, true));
            }
        }
        v
    }

    fn withdraw(&mut self, (file, async_id, _, is_lock): (FileKey, u64, u8, bool)) {
        let found = if is_lock {
            self.locks.withdraw(file, async_id)
        } else {
            self.oplocks.withdraw(file, async_id)
        };
        assert!(found, "waiter {async_id} listed but not withdrawn");
        self.complete(Some(async_id));
    }

    fn cancel(&mut self, pick: u8) {
        let all = self.waiters();
        if !all.is_empty() {
            self.withdraw(all[usize::from(pick) % all.len()]);
        }
    }

    /// connection.rs teardown: every waiter ends, then every handle closes.
    fn disconnect(&mut self, client: u8) {
        for w in self.waiters() {
            if w.2 == client {
                self.withdraw(w);
            }
        }
        while let Some(at) = self.opens.iter().position(|o| o.client == client) {
            self.close(at);
        }
    }
}
