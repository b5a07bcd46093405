//! The connection security layer: TRANSFORM parsing and decryption of
//! attacker-chosen bytes, signature verification with every signing
//! algorithm, and the properties that what is signed verifies and what is
//! sealed carries a header that parses.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nimbus_server::fuzz_api::security_layer(data);
});
