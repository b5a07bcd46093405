//! MS-SMB2 3.3.5.14 Receiving an SMB2 LOCK Request: byte-range locks and
//! unlocks on an open file. A single lock without FAIL_IMMEDIATELY that
//! conflicts waits (interim STATUS_PENDING) until the range comes free, is
//! cancelled, or its handle closes.

use std::sync::Arc;

use nimbus_state::LockRange;
use nimbus_wire::lock::{encode_lock_response, lock_flags as lf, LockElement, LockRequest};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::locks::{OnGrant, Outcome};
use crate::session::{Open, NO_LOCK_SEQUENCE};
use crate::sync::lock;

/// What the elements of one request ask for, once validated.
enum Asked {
    /// Elements are checked one by one as they are unlocked: an element
    /// that is no plain UNLOCK fails the request there, after the ones
    /// before it took effect (MS-SMB2 3.3.5.14.1).
    Unlock(Vec<LockElement>),
    Lock {
        ranges: Vec<LockRange>,
        /// One element without FAIL_IMMEDIATELY: wait for a conflict to
        /// clear instead of failing.
        blocking: bool,
    },
}

/// MS-SMB2 3.3.5.14: an array is either all unlocks (flags exactly
/// UNLOCK) or all locks (SHARED or EXCLUSIVE, optionally FAIL_IMMEDIATELY);
/// several locks in one request must all fail immediately.
fn validate(locks: &[LockElement]) -> Result<Asked, NtStatus> {
    let first = locks.first().ok_or(NtStatus::INVALID_PARAMETER)?;
    if first.flags & lf::UNLOCK != 0 {
        return Ok(Asked::Unlock(locks.to_vec()));
    }
    let mut ranges = Vec::with_capacity(locks.len());
    for l in locks {
        let exclusive = match l.flags & !lf::FAIL_IMMEDIATELY {
            lf::SHARED_LOCK => false,
            lf::EXCLUSIVE_LOCK => true,
            _ => return Err(NtStatus::INVALID_PARAMETER),
        };
        if locks.len() > 1 && l.flags & lf::FAIL_IMMEDIATELY == 0 {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        ranges.push(LockRange {
            offset: l.offset,
            length: l.length,
            exclusive,
        });
    }
    let blocking = locks.len() == 1 && first.flags & lf::FAIL_IMMEDIATELY == 0;
    Ok(Asked::Lock { ranges, blocking })
}

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = LockRequest::parse(body).map_err(malformed)?;
    let open = ctx.open(req.file_id)?;
    let multichannel = ctx.conn.negotiated().is_some_and(|n| {
        n.dialect.is_smb3()
            && n.server_capabilities & nimbus_wire::negotiate::capabilities::MULTI_CHANNEL != 0
    });
    let bucket = lock_sequence_bucket(&open, req.lock_sequence, multichannel);
    if let Some((i, seq)) = bucket {
        let mut buckets = lock(&open.lock_sequences);
        if buckets[i] == seq {
            // The client sent this LOCK before: it took effect, and is not
            // done twice.
            drop(buckets);
            encode_lock_response(out);
            return Ok(NtStatus::SUCCESS);
        }
        // Until this one succeeds, a replay of it is no replay.
        buckets[i] = NO_LOCK_SEQUENCE;
    }
    let result = run(ctx, &open, bucket, &req, out);
    if let (Some((i, seq)), Ok(NtStatus::SUCCESS)) = (bucket, &result) {
        lock(&open.lock_sequences)[i] = seq;
    }
    if let Ok(NtStatus::SUCCESS) = result {
        crate::persist::changed(ctx.server, &open);
    }
    result
}

/// MS-SMB2 3.3.5.14: the LockSequence of a LOCK on a durable open, or on
/// any open of a 3.x connection to a multichannel server (a LOCK replayed
/// on another channel after the first was lost), names a bucket (index 1
/// to 64, the bits above the low four) and a sequence number (the low four
/// bits); other indexes, and other opens, are not checked. Returns the
/// bucket's place and the number.
fn lock_sequence_bucket(
    open: &Open,
    lock_sequence: u32,
    multichannel: bool,
) -> Option<(usize, u8)> {
    let index = (lock_sequence >> 4) as usize;
    if !(1..=64).contains(&index) || !(open.is_durable() || multichannel) {
        return None;
    }
    Some((index - 1, (lock_sequence & 0xF) as u8))
}

fn run(
    ctx: &mut Ctx<'_>,
    open: &Arc<Open>,
    bucket: Option<(usize, u8)>,
    req: &LockRequest,
    out: &mut Vec<u8>,
) -> HandlerResult {
    let asked = validate(&req.locks)?;
    let server = ctx.server.clone();
    let file = open.file_key;
    let owner = open.open_id;
    match asked {
        Asked::Unlock(elements) => {
            server.locks.unlock(file, owner, &elements)?;
        }
        Asked::Lock { ranges, blocking } => {
            if ranges
                .iter()
                .any(|r| !nimbus_state::byte_range::valid_range(r.offset, r.length))
            {
                return Err(NtStatus::INVALID_LOCK_RANGE);
            }
            let mut wait = || {
                let server = server.clone();
                let request = ctx.go_async(move |request: &Arc<_>| {
                    let request = Arc::downgrade(request);
                    Box::new(move |status| {
                        if let Some(request) = request.upgrade() {
                            // Out of the queue first, so that a grant cannot
                            // race the answer below.
                            server.locks.withdraw(file, request.async_id());
                            request.complete(status, |_| {});
                        }
                    })
                })?;
                // Granted later: what `handle` does for a lock granted at
                // once, before the client hears of it.
                let (server, open) = (ctx.server.clone(), open.clone());
                let on_grant: OnGrant = Box::new(move || {
                    if let Some((i, seq)) = bucket {
                        lock(&open.lock_sequences)[i] = seq;
                    }
                    crate::persist::changed(&server, &open);
                });
                Some((request, on_grant))
            };
            let outcome = server.locks.lock(
                file,
                owner,
                ranges,
                if blocking { Some(&mut wait) } else { None },
            );
            // A byte-range lock request ends others' read caching (MS-FSA
            // 2.1.5.7), whatever becomes of it; the client hears of its
            // lock after the breaks went. After the lock is written, not
            // before: an open admitted in between would be granted read
            // caching on the record without the lock, and never broken.
            // One admitted after it sees the lock (oplocks/together.rs).
            server.oplocks.contend_readers(file, owner);
            match outcome {
                Outcome::Granted => {}
                Outcome::Refused(status) => return Err(status),
                Outcome::Waiting => return Ok(NtStatus::PENDING),
            }
        }
    }
    encode_lock_response(out);
    Ok(NtStatus::SUCCESS)
}
