//! The NBSS framer: any 4-byte header is accepted (with a length within the
//! limit), ignored (keep-alive) or refused; accepted lengths re-encode to
//! the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nimbus_wire::nbss::{frame_header, frame_length};

fuzz_target!(|data: &[u8]| {
    let Some(head) = data.get(..4) else {
        return;
    };
    let head = [head[0], head[1], head[2], head[3]];
    let max = data.get(4..8).map_or(8 << 20, |m| {
        u32::from_le_bytes([m[0], m[1], m[2], m[3]]) as usize & 0xFF_FFFF
    });
    if let Ok(Some(len)) = frame_length(head, max) {
        assert!(len > 0 && len <= max);
        assert_eq!(frame_header(len), head);
    }
});
