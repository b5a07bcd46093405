//! The measured loop of one connection: keep up to `depth` operations in
//! flight (flat out, or started at a fixed rate) until the window ends,
//! then wait for the last answers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nimbus_wire::close::CloseRequest;
use nimbus_wire::file_id::FileId;
use nimbus_wire::lock::{LockElement, LockRequest};
use nimbus_wire::read::ReadRequest;
use nimbus_wire::status::NtStatus;
use nimbus_wire::write::WriteRequest;
use nimbus_wire::Command;

use crate::conn::{self, Answer, Conn};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A READ of a block at a random offset.
    Read,
    /// A WRITE of a block at a random offset.
    Write,
    /// An exclusive lock of the slot's own byte, then its unlock: each
    /// request is one operation.
    Lock,
    /// CREATE (open the file for reading), READ of a block, CLOSE: what a
    /// client that opens a small document does; one operation.
    Cycle,
}

pub struct Plan {
    pub op: Op,
    /// The file, opened once: the target of READ, WRITE and LOCK, and
    /// what a cycle opens again by name.
    pub file: FileId,
    pub name: String,
    /// Whole blocks in the file: offsets are drawn below this.
    pub blocks: u64,
    pub block: usize,
    pub depth: usize,
    pub until: Instant,
    pub seed: u64,
    /// The first byte this connection's lock slots take, one byte each:
    /// connections lock apart, so no LOCK is refused for a conflict.
    pub lock_base: u64,
    /// Time between this connection's operation starts; None: each slot
    /// starts its next operation when its last ends.
    pub every: Option<Duration>,
    /// Every READ's data must begin with its offset (u64, little-endian):
    /// the file was stamped so, as WRITEs stamp their blocks.
    pub verify: bool,
    /// With `every`: when the first starts, so that connections take turns.
    pub start_in: Duration,
}

#[derive(Default)]
pub struct Tally {
    pub latencies_us: Vec<u32>,
    pub bytes: u64,
}

/// MS-SMB2 2.2.26.1 LOCK_ELEMENT flags.
const LOCK_EXCLUSIVE: u32 = 0x02;
const LOCK_UNLOCK: u32 = 0x04;
const LOCK_FAIL_IMMEDIATELY: u32 = 0x10;
/// FILE_READ_DATA | FILE_READ_ATTRIBUTES | SYNCHRONIZE: a cycle's open.
const READ_ACCESS: u32 = 0x0010_0081;

/// The most credits one connection keeps in flight (depth times each
/// request's charge): the largest window Samba grants (8,192), which is
/// also more than Nimbus's.
pub const MAX_CREDITS_IN_FLIGHT: usize = 8192;

/// The request a slot sends next.
#[derive(Clone, Copy)]
enum Step {
    Start,
    Read(FileId),
    Close(FileId),
}

struct Sent {
    slot: usize,
    /// The offset of a READ or WRITE.
    offset: u64,
    /// When the slot's operation began (a cycle's first request).
    began: Instant,
    /// The handle a cycle's CREATE answer names is read, then closed.
    step: Step,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

struct Slots<'a> {
    plan: &'a Plan,
    /// Requests awaiting their answer, by MessageId.
    waiting: HashMap<u64, Sent>,
    rng: Vec<u64>,
    locked: Vec<bool>,
    data: Vec<u8>,
    in_flight: usize,
}

impl Slots<'_> {
    /// Queues `slot`'s next request into `out`.
    fn send(
        &mut self,
        conn: &mut Conn,
        out: &mut Vec<u8>,
        slot: usize,
        step: Step,
        began: Instant,
    ) -> Result<(), String> {
        let plan = self.plan;
        let offset = (xorshift(&mut self.rng[slot]) % plan.blocks.max(1)) * plan.block as u64;
        let id = match (plan.op, step) {
            (Op::Cycle, Step::Start) => conn.queue(out, Command::Create, 0, |b| {
                conn::encode_open(b, &plan.name, READ_ACCESS)
            })?,
            (Op::Read, _) | (Op::Cycle, Step::Read(_)) => {
                let file_id = if let Step::Read(f) = step {
                    f
                } else {
                    plan.file
                };
                conn.queue(out, Command::Read, plan.block, |b| {
                    ReadRequest {
                        flags: 0,
                        length: plan.block as u32,
                        offset,
                        file_id,
                        minimum_count: 0,
                    }
                    .encode(b)
                })?
            }
            (Op::Cycle, Step::Close(file_id)) => conn.queue(out, Command::Close, 0, |b| {
                CloseRequest { flags: 0, file_id }.encode(b)
            })?,
            (Op::Write, _) => {
                let data = &mut self.data;
                if data.len() >= 16 {
                    let n = data.len();
                    data[..8].copy_from_slice(&offset.to_le_bytes());
                    data[n - 8..].copy_from_slice(&offset.to_le_bytes());
                }
                conn.queue(out, Command::Write, plan.block, |b| {
                    WriteRequest {
                        offset,
                        file_id: plan.file,
                        flags: 0,
                        data,
                    }
                    .encode(b)
                })?
            }
            (Op::Lock, _) => {
                let flags = if self.locked[slot] {
                    LOCK_UNLOCK
                } else {
                    LOCK_EXCLUSIVE | LOCK_FAIL_IMMEDIATELY
                };
                conn.queue(out, Command::Lock, 0, |b| {
                    LockRequest {
                        lock_sequence: 0,
                        file_id: plan.file,
                        locks: vec![LockElement {
                            offset: plan.lock_base + slot as u64,
                            length: 1,
                            flags,
                        }],
                    }
                    .encode(b)
                })?
            }
        };
        let sent = Sent {
            slot,
            offset,
            began,
            step,
        };
        if self.waiting.insert(id, sent).is_some() {
            return Err(format!("MessageId {id} used twice"));
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Takes an answer: the slot's next step if its operation goes on, or
    /// the slot, free again, if it ended (and was counted).
    fn answered(&mut self, a: Answer<'_>, tally: &mut Tally) -> Result<Next, String> {
        let plan = self.plan;
        let sent = self
            .waiting
            .remove(&a.message_id)
            .ok_or_else(|| format!("an answer to {}, which is not in flight", a.message_id))?;
        self.in_flight -= 1;
        if a.status != NtStatus::SUCCESS {
            return Err(format!("{:?} answered {:?}", plan.op, a.status));
        }
        let next = match (plan.op, sent.step) {
            (Op::Cycle, Step::Start) => {
                let (file, _) = conn::opened(a.body).ok_or("CREATE answer cut short")?;
                Some(Step::Read(file))
            }
            (Op::Cycle, Step::Read(file)) => Some(Step::Close(file)),
            _ => None,
        };
        // MS-SMB2 2.2.20 DataLength and 2.2.22 Count sit at the same place.
        let count = a
            .body
            .get(4..8)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let reads = matches!(sent.step, Step::Read(_)) || plan.op == Op::Read;
        if (reads || plan.op == Op::Write) && count != Some(plan.block as u32) {
            return Err(format!(
                "a {:?} answered {count:?} bytes of {}",
                plan.op, plan.block
            ));
        }
        if reads && plan.verify {
            // 2.2.20: DataOffset, from the header's start, in the body's
            // third byte.
            let data = a
                .body
                .get(2)
                .and_then(|&off| a.body.get((off as usize).checked_sub(64)?..)?.get(..8));
            if data != Some(&sent.offset.to_le_bytes()[..]) {
                return Err(format!(
                    "the READ at {} answered data that does not begin with its offset",
                    sent.offset
                ));
            }
        }
        if let Some(step) = next {
            return Ok(Next::Continue(sent.slot, step, sent.began));
        }
        match plan.op {
            Op::Lock => self.locked[sent.slot] = !self.locked[sent.slot],
            _ => tally.bytes += plan.block as u64,
        }
        let us = sent.began.elapsed().as_micros().min(u32::MAX as u128) as u32;
        tally.latencies_us.push(us);
        Ok(Next::Ended(sent.slot))
    }
}

enum Next {
    Continue(usize, Step, Instant),
    Ended(usize),
}

/// Runs `plan` on `conn`; any refused request or short answer ends it.
pub fn run(conn: &mut Conn, plan: &Plan) -> Result<Tally, String> {
    if plan.op != Op::Lock && plan.blocks == 0 {
        return Err("the file holds less than one block".into());
    }
    let mut tally = Tally::default();
    let mut slots = Slots {
        plan,
        waiting: HashMap::with_capacity(plan.depth),
        rng: (0..plan.depth as u64)
            .map(|d| plan.seed ^ (d * 0x1000_0001 + 1))
            .collect(),
        locked: vec![false; plan.depth],
        data: vec![0x5au8; plan.block],
        in_flight: 0,
    };
    let mut free: Vec<usize> = (0..plan.depth).rev().collect();
    let mut next_steps: Vec<(usize, Step, Instant)> = Vec::new();
    let mut out = Vec::with_capacity((plan.depth * (plan.block + 200)).min(4 << 20));
    let charge = u64::from(conn::charge(if plan.op == Op::Lock {
        0
    } else {
        plan.block
    }));
    let mut next_start = Instant::now() + plan.start_in;
    loop {
        let now = Instant::now();
        // Operations under way go on whatever the time, as credits allow
        // (a cycle's READ may cost more than one).
        while let Some(&(slot, step, began)) = next_steps.last() {
            let cost = if matches!(step, Step::Read(_)) {
                charge
            } else {
                1
            };
            if conn.credits() < cost {
                break;
            }
            next_steps.pop();
            slots.send(conn, &mut out, slot, step, began)?;
        }
        while now < plan.until
            && conn.credits() >= charge
            && plan.every.is_none_or(|_| now >= next_start)
        {
            let Some(slot) = free.pop() else { break };
            // Timed from when it is sent, not from when it was due: a
            // thread's wake-up for its next start is late by the timer's
            // slack (milliseconds), which would count against every server
            // alike and hide their differences.
            slots.send(conn, &mut out, slot, Step::Start, now)?;
            if let Some(every) = plan.every {
                next_start += every;
            }
        }
        if !out.is_empty() {
            conn.send(&out)?;
            out.clear();
        }
        if slots.in_flight == 0 {
            if now >= plan.until && next_steps.is_empty() {
                return Ok(tally);
            }
            if conn.credits() < charge {
                return Err("no credit to send with and nothing in flight".into());
            }
        }
        // At a fixed rate, wait no longer than the next start, if a slot
        // and credits are free to make it; otherwise (and after the window)
        // until an answer comes.
        let may_start = now < plan.until && !free.is_empty() && conn.credits() >= charge;
        let wake = plan
            .every
            .filter(|_| may_start)
            .map(|_| next_start.min(plan.until));
        conn.receive(wake, &mut |a: Answer<'_>| {
            match slots.answered(a, &mut tally)? {
                Next::Continue(slot, step, began) => next_steps.push((slot, step, began)),
                Next::Ended(slot) => free.push(slot),
            }
            Ok(())
        })?;
    }
}
