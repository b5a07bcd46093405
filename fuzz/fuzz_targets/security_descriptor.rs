//! Security descriptors on attacker-chosen bytes (MS-DTYP 2.4.6, as
//! SET_INFO and the SD_BUFFER create context carry them): every offset,
//! size and count is hostile. Parsing must refuse or accept without
//! panicking or allocating past the input, and what it accepts must
//! round-trip and go through the access check and inheritance
//! (`fuzz_api::security_descriptor`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use nimbus_server::fuzz_api::security_descriptor;

fuzz_target!(|data: &[u8]| {
    let _ = security_descriptor(data);
});
