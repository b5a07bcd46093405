//! DCE/RPC over TCP (the witness service's association and the endpoint
//! mapper: PDUs, authentication legs, the witness and ept_map NDR
//! decoders) on attacker-chosen bytes: see `fuzz_api::rpc_ip_tcp`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nimbus_server::fuzz_api::rpc_ip_tcp(data);
});
