//! DCE/RPC on an IPC$ pipe (PDUs, fragments, NDR stubs of srvsvc, wkssvc
//! and lsarpc) on attacker-chosen writes: see `fuzz_api::rpc_pipe`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nimbus_server::fuzz_api::rpc_pipe(data);
});
