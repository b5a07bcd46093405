//! The whole connection state machine fed a byte stream, as the reader
//! task feeds it: NBSS framing, SMB1 upgrade, NEGOTIATE, SESSION_SETUP,
//! TREE_CONNECT and every command after, compound chains, credits,
//! signing and encryption checks. Seeds are recorded client traffic (see
//! fuzz/seeds.py); session ids 1..=8 in the input stand for the sessions
//! the server created, so recorded guest sessions replay.
#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use nimbus_server::fuzz_api::{server, Harness};
use nimbus_server::Server;

fn shared_server() -> &'static Arc<Server> {
    static SERVER: OnceLock<Arc<Server>> = OnceLock::new();
    SERVER.get_or_init(|| {
        let dir = std::env::var_os("NIMBUS_FUZZ_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::temp_dir().join(format!("nimbus-fuzz-{}", std::process::id()))
            });
        server(&dir).expect("fuzz server")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(mut harness) = Harness::new(shared_server()) else {
        return;
    };
    let _ = harness.feed_stream(data);
});
