//! CREATE names on attacker-chosen input (as UTF-8, lossily): the path and
//! stream syntax of MS-FSCC 2.1.5 (`dir\file:stream:$DATA`) and the 8.3
//! names made for each component. The server's checks must never panic,
//! and what they accept must keep to the rules `fuzz_api::create_name`
//! asserts (no component that escapes or names the store of streams, no
//! separator in a stream name, a real 8.3 name for every component).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nimbus_server::fuzz_api::create_name;

fuzz_target!(|data: &[u8]| {
    let _ = create_name(&String::from_utf8_lossy(data));
});
