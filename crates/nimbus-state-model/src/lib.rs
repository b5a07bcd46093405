//! nimbus-state-model: the harness of the `state_rules` fuzz target
//! (fuzz/fuzz_targets/state_rules.rs), a crate of its own so that the
//! fuzzer and the replay of its inputs in `cargo test`
//! (crates/nimbus-server/tests/fuzz_inputs.rs) run the same code, and so
//! that no build of the server carries it. It knows nimbus-state's public
//! rules and nothing above them. Start reading at `state_rules`, then
//! `world`.
//!
//! The input is a bounded sequence of requests by a few clients against a
//! few files and the directory holding them (`input`). A model of the
//! server's state services (`oplock_service` and `lock_service`, which
//! follow nimbus-server's oplocks.rs and locks.rs) applies them through
//! the pure rules of this crate the way the handlers do (`world`): a
//! CREATE or rename that must wait for breaks is parked and run again when
//! they end (acknowledged, timed out, or their holder closed); a blocking
//! lock is queued and retried on every unlock and close; CANCEL and a
//! dropped connection take waiters out. Every call into the rules is
//! checked against the state before it (`calls`), and after every step
//! the whole state is (`check`): no conflicting grants, no lease state
//! that does not exist, no break that lowers nothing or that nothing will
//! end, no waiter that nothing will wake, no lost request. At the end
//! (`drain`) every break is acknowledged or timed out and every handle
//! closed; then every request must have been answered and no state left.

mod calls;
mod check;
mod drain;
pub mod input;
mod lock_service;
mod oplock_service;
mod states;
mod world;

/// How far one input got, so that tests can see a seed still reaches the
/// paths it was written for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub ops: usize,
    /// Handles opened.
    pub opened: usize,
    /// Times a CREATE or rename was parked (again) for breaks.
    pub parked: usize,
    /// Parked requests run again.
    pub retried: usize,
    /// Pending requests answered (granted, refused or cancelled).
    pub completed: usize,
    pub lock_waits: usize,
    pub breaks_sent: usize,
    /// Acknowledgements answered with a further break.
    pub follow_ups: usize,
    /// Breaks ended by their timer.
    pub timeouts: usize,
    /// Files deleted at the close of their last handle.
    pub deleted: usize,
}

/// Runs one input: the first byte chooses how the end is reached (bit 0:
/// acknowledge breaks rather than let them time out), the rest are
/// requests. Panics when an invariant fails.
pub fn state_rules(data: &[u8]) -> Report {
    let mut bytes = input::Bytes::new(data);
    let ack_at_end = bytes.byte() & 1 != 0;
    let mut w = world::World::new();
    while !bytes.is_empty() && w.report.ops < input::MAX_OPS {
        let op = bytes.op();
        w.apply(op);
        w.report.ops += 1;
        check::world(&w);
    }
    w.drain(ack_at_end);
    let mut report = w.report.clone();
    report.breaks_sent = w.oplocks.breaks_sent;
    report.follow_ups = w.oplocks.follow_ups;
    report
}

/// The requests an input stands for, to read a finding by.
pub fn decode(data: &[u8]) -> (bool, Vec<input::Op>) {
    let mut bytes = input::Bytes::new(data);
    let ack_at_end = bytes.byte() & 1 != 0;
    let mut ops = Vec::new();
    while !bytes.is_empty() && ops.len() < input::MAX_OPS {
        ops.push(bytes.op());
    }
    (ack_at_end, ops)
}
