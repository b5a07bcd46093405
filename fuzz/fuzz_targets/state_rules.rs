//! The protocol-state rules of nimbus-state (oplocks and leases, byte-range
//! locks, share modes) under random request sequences from several
//! clients: CREATEs that wait for breaks, acknowledgements right and
//! wrong, timeouts, writes, renames, deletes, changes inside a leased
//! directory, blocking locks, CANCEL, dropped connections. The harness
//! (`nimbus_state_model`, shared with the replay in `cargo test`)
//! checks after every step that no two grants conflict and every break is
//! one the rules may send, and at the end that every waiting request was
//! answered and no state was left behind.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nimbus_state_model::state_rules(data);
});
