//! What a cluster node reads from etcd, on bytes anyone with etcd access
//! could have written: share-mode, caching, lock and open records, the
//! messages nodes send each other (breaks, requests to let go of an open
//! or to end a session or to close an application's opens, and their
//! answers, change notifications), the published status and listings, and
//! the witness service's registrations.
//! A selector byte picks the decoder (`fuzz_api::etcd_record`).
//! Each must refuse or accept without panicking or allocating past its
//! input, and a record it accepts must survive a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nimbus_server::fuzz_api::etcd_record;

fuzz_target!(|data: &[u8]| {
    let _ = etcd_record(data);
});
