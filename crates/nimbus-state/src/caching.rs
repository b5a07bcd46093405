//! The caching rights of one file, oplocks and leases alike, as pure rules:
//! which opens must be broken before a new open may go on, whether it must
//! wait for their acknowledgement, what it is granted, and what an
//! acknowledgement, a timeout or a close changes (MS-SMB2 3.3.5.9 and
//! 3.3.5.22, MS-FSA 2.1.4.12 and 2.1.5.17-18).
//!
//! Oplocks are kept as the lease states they stand for (MS-SMB2 3.3.1.4):
//! level II is Read, exclusive is Read+Write, batch is Read+Write+Handle.
//! One set of rules then covers both; only what may be granted and what a
//! break may go to differ. The service that sends breaks, keeps timers and
//! wakes waiting CREATEs lives with the server; nothing here does I/O.

/// Lease state bits (MS-SMB2 2.2.13.2.8).
pub const READ: u32 = 0x1;
pub const HANDLE: u32 = 0x2;
pub const WRITE: u32 = 0x4;

/// Rights that never conflict with an oplock: an open asking only for these
/// breaks nothing and gets no oplock (Windows' "stat open").
const STAT_RIGHTS: u32 = 0x0010_0000 /* SYNCHRONIZE */ | 0x80 /* READ_ATTRIBUTES */ | 0x100 /* WRITE_ATTRIBUTES */;
/// For a lease holder, reading the security descriptor is a stat open too.
const LEASE_STAT_RIGHTS: u32 = STAT_RIGHTS | 0x0002_0000 /* READ_CONTROL */;

/// An open for attributes only (Windows' "stat open"): it breaks no
/// oplock and is granted none.
pub fn stat_open(access: u32) -> bool {
    only(access, STAT_RIGHTS)
}

fn only(access: u32, rights: u32) -> bool {
    access & rights != 0 && access & !rights == 0
}

/// A lease is named by the client's GUID and the key the client chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId {
    pub client: [u8; 16],
    pub key: [u8; 16],
}

/// Who holds a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// An oplock belongs to exactly one open.
    Oplock(u64),
    Lease(LeaseId),
}

/// Caching rights held on the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub holder: Holder,
    /// What the holder may cache now (until it acknowledges a break, what
    /// it had before the break).
    pub state: u32,
    /// A break awaits acknowledgement: the state the holder was told to go
    /// to (`sent`), and the state it must end at (`required`, lower when a
    /// later open asked for more while the first break was under way).
    pub breaking: Option<Breaking>,
    /// Lease v2: the epoch, raised on every change of state.
    pub epoch: u16,
    /// Lease version (1 or 2); 0 for an oplock.
    pub version: u8,
    pub parent_key: Option<[u8; 16]>,
    /// The opens that share the grant (an oplock: its own open).
    pub opens: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaking {
    pub sent: u32,
    pub required: u32,
}

/// One open of the file as the caching rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenEntry {
    pub open_id: u64,
    /// Opened for attributes only: it does not keep others from caching
    /// writes.
    pub stat: bool,
}

/// The caching state of one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileCaching {
    pub opens: Vec<OpenEntry>,
    pub grants: Vec<Grant>,
}

/// What a CREATE asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Nothing,
    /// MS-SMB2 RequestedOplockLevel II (0x01), EXCLUSIVE (0x08), BATCH (0x09).
    Oplock(u8),
    Lease {
        id: LeaseId,
        state: u32,
        version: u8,
        parent_key: Option<[u8; 16]>,
        /// Lease v2: the epoch the client knows (0 for a new lease).
        epoch: u16,
    },
}

/// A new open of the file, as far as caching is concerned.
#[derive(Clone, Copy, Debug)]
pub struct OpenAsk {
    pub open_id: u64,
    pub access: u32,
    /// SUPERSEDE, OVERWRITE or OVERWRITE_IF of an existing file.
    pub overwrite: bool,
    /// The share modes of existing opens refuse this one: only handle
    /// caching may be broken (so holders close cached handles), and the
    /// open is retried afterwards.
    pub sharing_violation: bool,
    pub is_dir: bool,
    /// The file has byte-range locks: no read or handle caching.
    pub has_byte_range_locks: bool,
    pub want: Want,
}

/// A break to send to a holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakOrder {
    pub holder: Holder,
    pub from: u32,
    pub to: u32,
    /// The holder must acknowledge (it held write or handle caching).
    pub ack_required: bool,
    /// Lease v2: the epoch to send; lease version; 0 for oplocks.
    pub epoch: u16,
    pub version: u8,
}

/// What an open attempt must do about other holders first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contention {
    pub breaks: Vec<BreakOrder>,
    /// Wait until the breaks are acknowledged (or time out), then retry.
    pub wait: bool,
}

/// What a new open was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granted {
    /// RequestedOplockLevel for the response (NONE, II, EXCLUSIVE, BATCH).
    Oplock(u8),
    Lease {
        state: u32,
        epoch: u16,
        /// The lease is being broken (LeaseFlags BREAK_IN_PROGRESS).
        breaking: bool,
        /// The version the lease was created with: the response keeps to
        /// it whatever version later opens ask in.
        version: u8,
    },
}

/// Why a break acknowledgement was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckError {
    /// No break awaits an acknowledgement.
    NotBreaking,
    /// The acknowledged state is more than the break allowed.
    TooMuch,
    /// Write or handle caching without read: no lease state.
    NotALeaseState,
    /// No such grant.
    Unknown,
}

/// What an accepted acknowledgement leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    pub state: u32,
    /// A further break (a later open needed more than the first break
    /// asked), to send now.
    pub follow_up: Option<BreakOrder>,
}

pub const OPLOCK_NONE: u8 = 0x00;
pub const OPLOCK_II: u8 = 0x01;
pub const OPLOCK_EXCLUSIVE: u8 = 0x08;
pub const OPLOCK_BATCH: u8 = 0x09;

/// The lease state an oplock level stands for.
pub fn oplock_state(level: u8) -> u32 {
    match level {
        OPLOCK_II => READ,
        OPLOCK_EXCLUSIVE => READ | WRITE,
        OPLOCK_BATCH => READ | WRITE | HANDLE,
        _ => 0,
    }
}

/// The oplock level a lease state allows (RH is level II: an oplock
/// cannot cache handles without writes).
pub fn oplock_level(state: u32) -> u8 {
    match state {
        s if s == READ | WRITE | HANDLE => OPLOCK_BATCH,
        s if s == READ | WRITE => OPLOCK_EXCLUSIVE,
        s if s & READ != 0 => OPLOCK_II,
        _ => OPLOCK_NONE,
    }
}

impl FileCaching {
    pub fn is_empty(&self) -> bool {
        self.opens.is_empty() && self.grants.is_empty()
    }

    pub fn grant(&self, holder: Holder) -> Option<&Grant> {
        self.grants.iter().find(|g| g.holder == holder)
    }

    fn grant_mut(&mut self, holder: Holder) -> Option<&mut Grant> {
        self.grants.iter_mut().find(|g| g.holder == holder)
    }

    /// Whether any break on the file awaits an acknowledgement.
    pub fn breaking(&self) -> bool {
        self.grants.iter().any(|g| g.breaking.is_some())
    }

    /// The breaks a new open needs before it may go on (MS-FSA 2.1.4.12,
    /// as Windows and Samba apply it): without a sharing violation, others'
    /// write caching goes (and, when the open overwrites, read and handle
    /// caching too); with one, their handle caching goes so that they may
    /// close cached handles, after which the open is tried again. Breaks
    /// that need an acknowledgement are recorded as under way; the others
    /// (from read caching alone) take effect at once.
    pub fn contend(&mut self, ask: &OpenAsk) -> Contention {
        let mut out = Contention::default();
        // An attribute-only open disturbs no one.
        if only(ask.access, STAT_RIGHTS) {
            return out;
        }
        let own_lease = match ask.want {
            Want::Lease { id, .. } => Some(Holder::Lease(id)),
            _ => None,
        };
        let delay_mask = if ask.sharing_violation { HANDLE } else { WRITE };
        for g in &mut self.grants {
            if Some(g.holder) == own_lease {
                continue;
            }
            let is_lease = matches!(g.holder, Holder::Lease(_));
            if is_lease && only(ask.access, LEASE_STAT_RIGHTS) {
                continue;
            }
            let mut to = g.state & !delay_mask;
            if ask.overwrite && delay_mask != HANDLE {
                to &= !(HANDLE | READ);
            }
            // Whether a break is needed at all is judged on the lease
            // states; only then is an oplock's target cut to level II or
            // none (an exclusive oplock survives a sharing violation).
            let needed = g.state & !to != 0;
            if !is_lease {
                to &= READ;
            }
            if let Some(b) = &mut g.breaking {
                // Already told to break. An open that needs more lowers
                // what the holder must end at, and waits only if what it
                // still holds is in the way (an overwrite of a file whose
                // read-handle lease is breaking goes on); one that needs
                // nothing more waits for the break to settle, as Windows
                // and Samba do.
                if needed {
                    b.required &= to;
                    if g.state & delay_mask != 0 {
                        out.wait = true;
                    }
                } else {
                    out.wait = true;
                }
                continue;
            }
            if !needed {
                continue;
            }
            let ack_required = g.state & (WRITE | HANDLE) != 0;
            g.epoch = g.epoch.wrapping_add(1);
            out.breaks.push(BreakOrder {
                holder: g.holder,
                from: g.state,
                to,
                ack_required,
                epoch: g.epoch,
                version: g.version,
            });
            if ack_required {
                g.breaking = Some(Breaking {
                    sent: to,
                    required: to,
                });
                if g.state & delay_mask != 0 {
                    out.wait = true;
                }
            } else {
                g.state = to;
            }
        }
        self.drop_empty_oplocks();
        out
    }

    /// Records the new open and what it is granted (MS-SMB2 3.3.5.9.8 for
    /// leases; oplocks as Windows grants them). Call after `contend` asked
    /// for no wait and the open passed its share-mode check.
    pub fn admit(&mut self, ask: &OpenAsk) -> Granted {
        let stat = only(ask.access, STAT_RIGHTS);
        let own_lease = match ask.want {
            Want::Lease { id, .. } => Some(Holder::Lease(id)),
            _ => None,
        };
        let mut requested = match ask.want {
            Want::Nothing => 0,
            Want::Oplock(_) if stat => 0,
            Want::Oplock(level) => oplock_state(level),
            Want::Lease { state, .. } => state & (READ | WRITE | HANDLE),
        };
        if ask.is_dir {
            // Directories cache names, never data writes; oplocks on them
            // are not granted at all.
            requested &= !WRITE;
            if matches!(ask.want, Want::Oplock(_)) {
                requested = 0;
            }
        }
        if own_lease.is_some() && (requested & (READ | WRITE) == 0 || requested & READ == 0) {
            // H alone, W alone and W+H are not lease states.
            requested = 0;
        }
        if ask.has_byte_range_locks && !ask.overwrite {
            requested &= !(READ | HANDLE);
        }
        // Write caching only for the sole user of the file: any other open
        // (unless attribute-only and without caching) or any other grant,
        // even one broken to nothing, rules it out.
        let others_open = self.opens.iter().any(|o| {
            let holder_same = own_lease
                .is_some_and(|l| self.grant(l).is_some_and(|g| g.opens.contains(&o.open_id)));
            !holder_same && !o.stat
        });
        let others_hold = self.grants.iter().any(|g| Some(g.holder) != own_lease);
        if others_open || others_hold {
            requested &= !WRITE;
        }
        if requested == WRITE || requested == WRITE | HANDLE {
            requested = 0;
        }
        // Another holder still caches writes: only an open that breaks
        // nothing gets here so (a stat open, or a security-descriptor read
        // beside a lease), and it may cache nothing beside those writes.
        // Windows refuses such a request while another key holds an
        // exclusive state (MS-FSA 2.1.5.17, STATUS_OPLOCK_NOT_GRANTED).
        if self
            .grants
            .iter()
            .any(|g| Some(g.holder) != own_lease && g.state & WRITE != 0)
        {
            requested = 0;
        }
        self.opens.push(OpenEntry {
            open_id: ask.open_id,
            stat,
        });
        match ask.want {
            Want::Lease {
                id,
                version,
                parent_key,
                epoch: client_epoch,
                ..
            } => {
                let holder = Holder::Lease(id);
                if self
                    .grants
                    .iter()
                    .any(|g| matches!(g.holder, Holder::Oplock(_)))
                {
                    requested &= !HANDLE;
                }
                let asked = match ask.want {
                    // A directory lease never caches writes: asking RWH
                    // of a directory is asking RH.
                    Want::Lease { state, .. } if ask.is_dir => state & !WRITE,
                    Want::Lease { state, .. } => state,
                    _ => 0,
                };
                if let Some(g) = self.grant_mut(holder) {
                    // A group's entry (`group_leases`) is admitted again
                    // for later members: it is one open of the lease.
                    if !g.opens.contains(&ask.open_id) {
                        g.opens.push(ask.open_id);
                    }
                    let breaking = g.breaking.is_some();
                    // An existing lease is upgraded only to a superset of
                    // what it holds, only when nothing asked for is held
                    // back by others, and not while it is being broken.
                    if !breaking
                        && asked & g.state == g.state
                        && requested != g.state
                        && requested == asked
                    {
                        g.state = requested;
                        g.epoch = g.epoch.wrapping_add(1);
                    }
                    return Granted::Lease {
                        state: g.state,
                        epoch: g.epoch,
                        breaking,
                        version: g.version,
                    };
                }
                // A new lease continues from the epoch the client gave,
                // one higher once it holds anything (MS-SMB2 3.3.5.9.11).
                let epoch = if requested != 0 {
                    client_epoch.wrapping_add(1)
                } else {
                    client_epoch
                };
                self.grants.push(Grant {
                    holder,
                    state: requested,
                    breaking: None,
                    epoch,
                    version,
                    parent_key,
                    opens: vec![ask.open_id],
                });
                Granted::Lease {
                    state: requested,
                    epoch,
                    breaking: false,
                    version,
                }
            }
            Want::Oplock(_) => {
                // A handle-caching lease of another client outranks a new
                // oplock.
                if self
                    .grants
                    .iter()
                    .any(|g| matches!(g.holder, Holder::Lease(_)) && g.state & HANDLE != 0)
                {
                    requested = 0;
                }
                let level = oplock_level(requested);
                if level != OPLOCK_NONE {
                    self.grants.push(Grant {
                        holder: Holder::Oplock(ask.open_id),
                        state: oplock_state(level),
                        breaking: None,
                        epoch: 0,
                        version: 0,
                        parent_key: None,
                        opens: vec![ask.open_id],
                    });
                }
                Granted::Oplock(level)
            }
            Want::Nothing => Granted::Oplock(OPLOCK_NONE),
        }
    }

    /// `remove_open`, also naming the leases that went with the open (it
    /// was the last open of each): whether a break under way went, and
    /// those leases.
    pub fn remove_open_and_leases(&mut self, open_id: u64) -> (bool, Vec<LeaseId>) {
        let shared: Vec<LeaseId> = self
            .grants
            .iter()
            .filter_map(|g| match g.holder {
                Holder::Lease(id) if g.opens.contains(&open_id) => Some(id),
                _ => None,
            })
            .collect();
        let ended = self.remove_open(open_id);
        let gone = shared
            .into_iter()
            .filter(|id| self.grant(Holder::Lease(*id)).is_none())
            .collect();
        (ended, gone)
    }

    /// Forgets an open (closed, or its CREATE failed after `admit`).
    /// Returns whether a break under way went with it (waiters may go on).
    pub fn remove_open(&mut self, open_id: u64) -> bool {
        self.opens.retain(|o| o.open_id != open_id);
        let mut ended_break = false;
        self.grants.retain_mut(|g| {
            g.opens.retain(|&o| o != open_id);
            let keep = !g.opens.is_empty();
            if !keep && g.breaking.is_some() {
                ended_break = true;
            }
            keep
        });
        ended_break
    }

    /// An oplock break acknowledged with `level` (MS-SMB2 3.3.5.22.1).
    pub fn ack_oplock(&mut self, open_id: u64, level: u8) -> Result<Acked, AckError> {
        let g = self
            .grant_mut(Holder::Oplock(open_id))
            .ok_or(AckError::NotBreaking)?;
        let b = g.breaking.ok_or(AckError::NotBreaking)?;
        let state = oplock_state(level);
        if state & !b.sent != 0 {
            return Err(AckError::TooMuch);
        }
        let out = Self::settle(g, state, b);
        self.drop_empty_oplocks();
        Ok(out)
    }

    /// A lease break acknowledged with `state` (MS-SMB2 3.3.5.22.2).
    pub fn ack_lease(&mut self, id: LeaseId, state: u32) -> Result<Acked, AckError> {
        let g = self.grant_mut(Holder::Lease(id)).ok_or(AckError::Unknown)?;
        let b = g.breaking.ok_or(AckError::NotBreaking)?;
        if state & !b.sent != 0 {
            return Err(AckError::TooMuch);
        }
        // Within what was sent, but not a state a lease can be in (found
        // by the state_rules fuzz target: W acknowledged for a break to RW
        // was kept as the lease's state).
        if state != 0 && state & READ == 0 {
            return Err(AckError::NotALeaseState);
        }
        Ok(Self::settle(g, state, b))
    }

    fn settle(g: &mut Grant, state: u32, b: Breaking) -> Acked {
        g.state = state;
        g.breaking = None;
        let mut follow_up = None;
        if state & !b.required != 0 {
            let ack_required = state & (WRITE | HANDLE) != 0;
            // A holder that still caches writes or handles first gives
            // those up and keeps its reads; only once that is acknowledged
            // do its reads go, without an acknowledgement (as Windows and
            // Samba step it: smbtorture smb2.lease.breaking3).
            let to = if ack_required {
                (b.required | READ) & state
            } else {
                b.required
            };
            // The steps of one break share its epoch (smbtorture
            // smb2.lease.v2_breaking3): the client saw the change begin.
            if ack_required {
                g.breaking = Some(Breaking {
                    sent: to,
                    required: b.required,
                });
            } else {
                g.state = to;
            }
            follow_up = Some(BreakOrder {
                holder: g.holder,
                from: state,
                to,
                ack_required,
                epoch: g.epoch,
                version: g.version,
            });
        }
        Acked {
            state: g.state,
            follow_up,
        }
    }

    /// The holder did not acknowledge in time: it loses all caching
    /// (MS-SMB2 3.3.6.1 and 3.3.6.5 set the oplock level and the lease
    /// state to none). Returns whether anything changed.
    pub fn break_timed_out(&mut self, holder: Holder) -> bool {
        let Some(g) = self.grant_mut(holder) else {
            return false;
        };
        if g.breaking.take().is_none() {
            return false;
        }
        g.state = 0;
        self.drop_empty_oplocks();
        true
    }

    /// Another open writes, truncates or locks a range: read caching of
    /// every other holder goes (MS-FSA 2.1.4.12, level II breaks). Returns
    /// the breaks to send; none of them is waited for.
    pub fn contend_readers(&mut self, writer_open: u64) -> Vec<BreakOrder> {
        let mut out = Vec::new();
        for g in &mut self.grants {
            if g.state & READ == 0 || g.breaking.is_some() {
                continue;
            }
            // The writer's own lease, or its own exclusive or batch oplock,
            // caches its writes; its own level II oplock is broken like any
            // other (Windows does so).
            let own = g.opens.contains(&writer_open);
            if own && (matches!(g.holder, Holder::Lease(_)) || g.state & WRITE != 0) {
                continue;
            }
            // Write or handle caching beside another writer cannot be:
            // break it like an open would, to nothing.
            out.push(break_to_none(g));
        }
        self.drop_empty_oplocks();
        out
    }

    /// The file is being deleted or renamed through open `by`: other
    /// holders' handle caching goes, so that they close the handles they
    /// keep open only for caching (MS-FSA 2.1.5.14.3 and 2.1.5.14.11).
    /// `wait` says whether a lease holder still has handle caching until
    /// it acknowledges (a rename waits for that; a delete cannot). Batch
    /// oplocks are broken without making anyone wait, as Samba does.
    pub fn contend_handles(&mut self, by: u64) -> Contention {
        let mut out = Contention::default();
        for g in &mut self.grants {
            if g.opens.contains(&by) || g.state & HANDLE == 0 {
                continue;
            }
            let to = match g.holder {
                Holder::Lease(_) => g.state & !HANDLE,
                // An oplock cannot keep writes without handles: batch goes
                // to level II.
                Holder::Oplock(_) => READ,
            };
            out.wait |= matches!(g.holder, Holder::Lease(_));
            if let Some(b) = &mut g.breaking {
                // Told to break already, perhaps keeping its handles: it
                // must end without them.
                b.required &= to;
                continue;
            }
            g.epoch = g.epoch.wrapping_add(1);
            g.breaking = Some(Breaking {
                sent: to,
                required: to,
            });
            out.breaks.push(BreakOrder {
                holder: g.holder,
                from: g.state,
                to,
                ack_required: true,
                epoch: g.epoch,
                version: g.version,
            });
        }
        out
    }

    /// Something changed inside this directory (a name added, removed or
    /// renamed, a child's size, times or attributes): every directory lease
    /// goes to none, as the listing it caches is stale (MS-FSA 2.1.4.13,
    /// Windows breaks the parent's lease without waiting for the
    /// acknowledgement). The lease `by` names is spared: the client made
    /// the change itself through an open that named it as its parent lease
    /// (ParentLeaseKey, MS-SMB2 2.2.13.2.10), so its cache is current. A
    /// break under way is lowered to end at none.
    pub fn contend_children(&mut self, by: Option<LeaseId>) -> Vec<BreakOrder> {
        let mut out = Vec::new();
        for g in &mut self.grants {
            let Holder::Lease(id) = g.holder else {
                continue;
            };
            if Some(id) == by || g.state == 0 {
                continue;
            }
            if let Some(b) = &mut g.breaking {
                b.required = 0;
                continue;
            }
            out.push(break_to_none(g));
        }
        out
    }

    /// Oplocks at level none are no grant at all (leases at none stay:
    /// their opens still share the lease key).
    fn drop_empty_oplocks(&mut self) {
        self.grants.retain(|g| {
            !(matches!(g.holder, Holder::Oplock(_)) && g.state == 0 && g.breaking.is_none())
        });
    }
}

/// Breaks `g` to none: recorded as under way when the holder must
/// acknowledge (it held write or handle caching), done at once otherwise.
fn break_to_none(g: &mut Grant) -> BreakOrder {
    let ack_required = g.state & (WRITE | HANDLE) != 0;
    g.epoch = g.epoch.wrapping_add(1);
    let order = BreakOrder {
        holder: g.holder,
        from: g.state,
        to: 0,
        ack_required,
        epoch: g.epoch,
        version: g.version,
    };
    if ack_required {
        g.breaking = Some(Breaking {
            sent: 0,
            required: 0,
        });
    } else {
        g.state = 0;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATA: u32 = 0x1 | 0x2; // READ_DATA | WRITE_DATA
    const LEASE_A: LeaseId = LeaseId {
        client: [1; 16],
        key: [0xA; 16],
    };
    const LEASE_B: LeaseId = LeaseId {
        client: [2; 16],
        key: [0xB; 16],
    };

    fn ask(open_id: u64, want: Want) -> OpenAsk {
        OpenAsk {
            open_id,
            access: DATA,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want,
        }
    }

    fn lease(id: LeaseId, state: u32) -> Want {
        Want::Lease {
            id,
            state,
            version: 2,
            parent_key: None,
            epoch: 0,
        }
    }

    #[test]
    fn first_open_gets_the_batch_oplock_it_asks_for() {
        let mut f = FileCaching::default();
        let a = ask(1, Want::Oplock(OPLOCK_BATCH));
        assert_eq!(f.contend(&a), Contention::default());
        assert_eq!(f.admit(&a), Granted::Oplock(OPLOCK_BATCH));
    }

    #[test]
    fn second_open_breaks_batch_to_level_two_and_waits_for_the_ack() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_BATCH)));
        let second = ask(2, Want::Oplock(OPLOCK_BATCH));
        let c = f.contend(&second);
        assert!(c.wait);
        assert_eq!(c.breaks.len(), 1);
        assert_eq!(c.breaks[0].to, READ);
        assert!(c.breaks[0].ack_required);
        // Asked again before the ack: no second break, still waiting.
        let again = f.contend(&second);
        assert!(again.wait && again.breaks.is_empty());
        let acked = f.ack_oplock(1, OPLOCK_II).unwrap();
        assert_eq!(acked.state, READ);
        assert_eq!(acked.follow_up, None);
        let c = f.contend(&second);
        assert!(!c.wait && c.breaks.is_empty());
        // Both at level II now.
        assert_eq!(f.admit(&second), Granted::Oplock(OPLOCK_II));
    }

    #[test]
    fn overwrite_breaks_to_none_and_level_two_needs_no_ack() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_II)));
        let mut over = ask(2, Want::Nothing);
        over.overwrite = true;
        let c = f.contend(&over);
        assert!(!c.wait);
        assert_eq!(c.breaks.len(), 1);
        assert_eq!((c.breaks[0].to, c.breaks[0].ack_required), (0, false));
        assert!(f.grants.is_empty());
    }

    #[test]
    fn exclusive_oplock_survives_a_sharing_violation() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_EXCLUSIVE)));
        let mut refused = ask(2, Want::Oplock(OPLOCK_EXCLUSIVE));
        refused.sharing_violation = true;
        assert_eq!(f.contend(&refused), Contention::default());
        assert_eq!(f.grant(Holder::Oplock(1)).unwrap().state, READ | WRITE);
    }

    #[test]
    fn stat_open_breaks_nothing_and_gets_no_oplock() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_BATCH)));
        let mut stat = ask(2, Want::Oplock(OPLOCK_BATCH));
        stat.access = 0x80;
        assert_eq!(f.contend(&stat), Contention::default());
        assert_eq!(f.admit(&stat), Granted::Oplock(OPLOCK_NONE));
    }

    #[test]
    fn unacknowledged_break_times_out_to_none() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_EXCLUSIVE)));
        let c = f.contend(&ask(2, Want::Nothing));
        assert!(c.wait);
        assert!(f.break_timed_out(Holder::Oplock(1)));
        assert!(
            f.grant(Holder::Oplock(1)).is_none(),
            "an oplock at none is no grant"
        );
        assert!(!f.contend(&ask(2, Want::Nothing)).wait);
    }

    #[test]
    fn ack_without_break_or_above_it_is_refused() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_BATCH)));
        assert_eq!(f.ack_oplock(1, OPLOCK_II), Err(AckError::NotBreaking));
        let mut over = ask(2, Want::Nothing);
        over.overwrite = true;
        f.contend(&over);
        assert_eq!(f.ack_oplock(1, OPLOCK_II), Err(AckError::TooMuch));
        assert_eq!(f.ack_oplock(1, OPLOCK_NONE).unwrap().state, 0);
    }

    #[test]
    fn lease_rwh_breaks_write_then_handle_on_sharing_violation() {
        let mut f = FileCaching::default();
        assert_eq!(
            f.admit(&ask(1, lease(LEASE_A, READ | WRITE | HANDLE))),
            Granted::Lease {
                state: READ | WRITE | HANDLE,
                epoch: 1,
                breaking: false,
                version: 2
            }
        );
        let other = ask(2, lease(LEASE_B, READ | HANDLE));
        let c = f.contend(&other);
        assert!(c.wait);
        assert_eq!(c.breaks[0].to, READ | HANDLE);
        assert_eq!(c.breaks[0].epoch, 2);
        f.ack_lease(LEASE_A, READ | HANDLE).unwrap();
        // Now the share modes refuse the open: handle caching must go.
        let mut violating = other;
        violating.sharing_violation = true;
        let c = f.contend(&violating);
        assert!(c.wait);
        assert_eq!(c.breaks[0].to, READ);
        f.ack_lease(LEASE_A, READ).unwrap();
        assert!(!f.contend(&violating).wait);
    }

    #[test]
    fn same_lease_key_shares_and_upgrades_but_others_block_write() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, lease(LEASE_A, READ)));
        let up = ask(2, lease(LEASE_A, READ | WRITE | HANDLE));
        assert_eq!(f.contend(&up), Contention::default());
        assert_eq!(
            f.admit(&up),
            Granted::Lease {
                state: READ | WRITE | HANDLE,
                epoch: 2,
                breaking: false,
                version: 2
            }
        );
        let mut g = FileCaching::default();
        g.admit(&ask(1, Want::Nothing));
        assert_eq!(
            g.admit(&ask(2, lease(LEASE_B, READ | WRITE | HANDLE))),
            Granted::Lease {
                state: READ | HANDLE,
                epoch: 1,
                breaking: false,
                version: 2
            }
        );
    }

    #[test]
    fn invalid_lease_states_get_nothing() {
        for s in [WRITE, HANDLE, WRITE | HANDLE] {
            let mut f = FileCaching::default();
            match f.admit(&ask(1, lease(LEASE_A, s))) {
                Granted::Lease { state, .. } => assert_eq!(state, 0, "{s:#x}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn later_open_lowers_a_break_under_way_and_the_ack_gets_a_follow_up() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, lease(LEASE_A, READ | WRITE | HANDLE)));
        f.contend(&ask(2, Want::Nothing));
        let mut over = ask(3, Want::Nothing);
        over.overwrite = true;
        assert!(f.contend(&over).wait);
        let acked = f.ack_lease(LEASE_A, READ | HANDLE).unwrap();
        let follow = acked.follow_up.unwrap();
        // Handles first (acknowledged), then reads (not).
        assert_eq!((follow.from, follow.to), (READ | HANDLE, READ));
        assert!(follow.ack_required);
        let last = f.ack_lease(LEASE_A, READ).unwrap().follow_up.unwrap();
        assert_eq!((last.from, last.to, last.ack_required), (READ, 0, false));
        assert!(!f.breaking());
    }

    #[test]
    fn closing_a_breaking_holder_releases_waiters() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_BATCH)));
        assert!(f.contend(&ask(2, Want::Nothing)).wait);
        assert!(f.remove_open(1));
        assert!(!f.contend(&ask(2, Want::Nothing)).wait);
    }

    #[test]
    fn writer_breaks_other_readers_without_waiting() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, Want::Oplock(OPLOCK_II)));
        f.admit(&ask(2, Want::Oplock(OPLOCK_II)));
        let b = f.contend_readers(2);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].holder, Holder::Oplock(1));
        assert!(!b[0].ack_required);
        assert!(f.grant(Holder::Oplock(1)).is_none());
        assert!(
            f.grant(Holder::Oplock(2)).is_none(),
            "its own level II goes too"
        );
    }

    #[test]
    fn directory_lease_is_rh_and_child_changes_break_it_to_none() {
        let mut f = FileCaching::default();
        let mut dir = ask(1, lease(LEASE_A, READ | WRITE | HANDLE));
        dir.is_dir = true;
        assert_eq!(
            f.admit(&dir),
            Granted::Lease {
                state: READ | HANDLE,
                epoch: 1,
                breaking: false,
                version: 2
            }
        );
        // A change made through an open naming this lease as its parent
        // breaks nothing; any other change breaks it to none.
        assert!(f.contend_children(Some(LEASE_A)).is_empty());
        let b = f.contend_children(Some(LEASE_B));
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].from, b[0].to, b[0].epoch), (READ | HANDLE, 0, 2));
        assert!(b[0].ack_required);
        // A second change while the break is under way sends nothing more.
        assert!(f.contend_children(None).is_empty());
        assert_eq!(f.ack_lease(LEASE_A, 0).unwrap().follow_up, None);
        // Asking RWH again upgrades the lease from none to RH.
        dir.open_id = 2;
        assert_eq!(
            f.admit(&dir),
            Granted::Lease {
                state: READ | HANDLE,
                epoch: 3,
                breaking: false,
                version: 2
            }
        );
    }

    #[test]
    fn stat_open_gets_no_lease_beside_another_holders_write_caching() {
        // Found by the state_rules fuzz target: a stat open breaks nothing,
        // and was then granted read caching beside an exclusive oplock (or
        // beside another client's RWH lease, for a security-descriptor
        // read), which would serve reads the writer has not flushed.
        for (holder, want, access) in [
            (Want::Oplock(OPLOCK_EXCLUSIVE), LEASE_B, 0x80),
            (lease(LEASE_A, READ | WRITE | HANDLE), LEASE_B, 0x2_0000),
        ] {
            let mut f = FileCaching::default();
            f.admit(&ask(1, holder));
            let mut stat = ask(2, lease(want, READ | HANDLE));
            stat.access = access;
            assert_eq!(f.contend(&stat), Contention::default());
            match f.admit(&stat) {
                Granted::Lease { state, .. } => assert_eq!(state, 0, "{holder:?}"),
                other => panic!("{other:?}"),
            }
        }
        // The holder's own key is no other holder: it keeps what it has.
        let mut f = FileCaching::default();
        f.admit(&ask(1, lease(LEASE_A, READ | WRITE | HANDLE)));
        let mut own = ask(2, lease(LEASE_A, READ | WRITE | HANDLE));
        own.access = 0x80;
        match f.admit(&own) {
            Granted::Lease { state, .. } => assert_eq!(state, READ | WRITE | HANDLE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn lease_ack_without_read_is_refused() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, lease(LEASE_A, READ | WRITE | HANDLE)));
        let mut violating = ask(2, Want::Nothing);
        violating.sharing_violation = true;
        assert!(f.contend(&violating).wait);
        // Told to go to RW: W alone lies within it but is no lease state,
        // H lies outside it; either way the break stays under way.
        assert_eq!(f.ack_lease(LEASE_A, WRITE), Err(AckError::NotALeaseState));
        assert_eq!(f.ack_lease(LEASE_A, HANDLE), Err(AckError::TooMuch));
        let g = f.grant(Holder::Lease(LEASE_A)).unwrap();
        assert_eq!(g.state, READ | WRITE | HANDLE);
        assert!(g.breaking.is_some());
        assert_eq!(
            f.ack_lease(LEASE_A, READ | WRITE).unwrap().state,
            READ | WRITE
        );
    }

    #[test]
    fn rename_waits_for_other_leases_to_give_up_handle_caching() {
        let mut f = FileCaching::default();
        f.admit(&ask(1, lease(LEASE_A, READ | HANDLE)));
        f.admit(&ask(2, lease(LEASE_B, READ | HANDLE)));
        let c = f.contend_handles(1);
        assert!(c.wait);
        assert_eq!(c.breaks.len(), 1);
        assert_eq!(
            (c.breaks[0].holder, c.breaks[0].to),
            (Holder::Lease(LEASE_B), READ)
        );
        // Until B acknowledges, a retry still waits and sends nothing new.
        let again = f.contend_handles(1);
        assert!(again.wait && again.breaks.is_empty());
        f.ack_lease(LEASE_B, READ).unwrap();
        assert_eq!(f.contend_handles(1), Contention::default());
    }
}
