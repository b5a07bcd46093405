//! The measured loop of one connection: keep `depth` requests in flight
//! until the window ends, then wait for the last answers.

use std::time::Instant;

use nimbus_wire::file_id::FileId;
use nimbus_wire::lock::{LockElement, LockRequest};
use nimbus_wire::read::ReadRequest;
use nimbus_wire::status::NtStatus;
use nimbus_wire::write::WriteRequest;
use nimbus_wire::Command;

use crate::conn::{Answer, Conn};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Lock,
}

pub struct Plan {
    pub op: Op,
    pub file: FileId,
    /// Whole blocks in the file: offsets are drawn below this.
    pub blocks: u64,
    pub block: usize,
    pub depth: usize,
    pub until: Instant,
    pub seed: u64,
    /// The first byte this connection's lock slots take, one byte each:
    /// connections lock apart, so no LOCK is refused for a conflict.
    pub lock_base: u64,
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

/// Slots of answers awaited, indexed by MessageId; a power of two larger
/// than any depth, so an id's slot is free again long before it is reused.
const RING: usize = 4096;

struct Sent {
    id: u64,
    slot: usize,
    at: Instant,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Runs `plan` on `conn`; any refused request or short answer ends it.
pub fn run(conn: &mut Conn, plan: &Plan) -> Result<Tally, String> {
    if plan.op != Op::Lock && plan.blocks == 0 {
        return Err("the file holds less than one block".into());
    }
    let mut tally = Tally::default();
    let mut ring: Vec<Option<Sent>> = (0..RING).map(|_| None).collect();
    let mut free: Vec<usize> = (0..plan.depth).rev().collect();
    let mut rng: Vec<u64> = (0..plan.depth as u64)
        .map(|d| plan.seed ^ (d * 0x1000_0001 + 1))
        .collect();
    let mut locked = vec![false; plan.depth];
    let mut data = vec![0x5au8; plan.block];
    let mut out = Vec::with_capacity(plan.depth * (plan.block + 200));
    let mut in_flight = 0usize;
    let charge = crate::conn::charge(if plan.op == Op::Lock { 0 } else { plan.block });
    loop {
        let now = Instant::now();
        if now < plan.until {
            while conn.credits() >= u64::from(charge) {
                let Some(slot) = free.pop() else { break };
                let offset = (xorshift(&mut rng[slot]) % plan.blocks.max(1)) * plan.block as u64;
                let id = match plan.op {
                    Op::Read => conn.queue(&mut out, Command::Read, plan.block, |b| {
                        ReadRequest {
                            flags: 0,
                            length: plan.block as u32,
                            offset,
                            file_id: plan.file,
                            minimum_count: 0,
                        }
                        .encode(b)
                    })?,
                    Op::Write => {
                        if data.len() >= 16 {
                            let n = data.len();
                            data[..8].copy_from_slice(&offset.to_le_bytes());
                            data[n - 8..].copy_from_slice(&offset.to_le_bytes());
                        }
                        conn.queue(&mut out, Command::Write, plan.block, |b| {
                            WriteRequest {
                                offset,
                                file_id: plan.file,
                                flags: 0,
                                data: &data,
                            }
                            .encode(b)
                        })?
                    }
                    Op::Lock => {
                        let flags = if locked[slot] {
                            LOCK_UNLOCK
                        } else {
                            LOCK_EXCLUSIVE | LOCK_FAIL_IMMEDIATELY
                        };
                        conn.queue(&mut out, Command::Lock, 0, |b| {
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
                let at = &mut ring[id as usize % RING];
                if at.is_some() {
                    return Err(format!(
                        "request {id} sent while an earlier one in its slot is unanswered"
                    ));
                }
                *at = Some(Sent { id, slot, at: now });
                in_flight += 1;
            }
        }
        if !out.is_empty() {
            conn.send(&out)?;
            out.clear();
        }
        if in_flight == 0 {
            if now >= plan.until {
                return Ok(tally);
            }
            return Err("no credit to send with and nothing in flight".into());
        }
        conn.receive(&mut |a: Answer<'_>| {
            let sent = ring[a.message_id as usize % RING]
                .take()
                .filter(|s| s.id == a.message_id)
                .ok_or_else(|| format!("an answer to {}, which is not in flight", a.message_id))?;
            if a.status != NtStatus::SUCCESS {
                return Err(format!("{:?} answered {:?}", plan.op, a.status));
            }
            if plan.op == Op::Read {
                let got = a
                    .body
                    .get(4..8)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                if got != Some(plan.block as u32) {
                    return Err(format!("a READ answered {got:?} bytes of {}", plan.block));
                }
            }
            if plan.op != Op::Lock {
                tally.bytes += plan.block as u64;
            } else {
                locked[sent.slot] = !locked[sent.slot];
            }
            let us = sent.at.elapsed().as_micros().min(u32::MAX as u128) as u32;
            tally.latencies_us.push(us);
            free.push(sent.slot);
            in_flight -= 1;
            Ok(())
        })?;
    }
}
