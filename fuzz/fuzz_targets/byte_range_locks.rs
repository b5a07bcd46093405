//! Byte-range lock rules (MS-FSA 2.1.5.7, 2.1.5.8) on random sequences of
//! lock requests (up to 40 elements), unlocks, closes, retried waiters and
//! locks no rule would grant (as a damaged record from etcd holds), under
//! random caps. The server's indexed rules (`nimbus_state::byte_range`)
//! must give the same answer and leave the same list, in order, as the
//! plain scan of every lock per element (`byte_range::model`); `run`
//! panics at the first difference.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nimbus_state::byte_range::model::run(data);
});
