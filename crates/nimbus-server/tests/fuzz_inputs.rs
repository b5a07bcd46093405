//! Inputs from the fuzzers, replayed on every `cargo test`: the recorded
//! client traffic the `connection` target starts from must still get deep
//! into the server (a logon, a tree connect, files written), and every
//! input that once crashed or hung a target (fuzz/regressions/<target>/)
//! must now be handled.

use std::path::{Path, PathBuf};

use nimbus_server::fuzz_api::{security_layer, server, Harness};
use nimbus_wire::header::chain_offsets;

fn fuzz_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(sub)
}

fn inputs(sub: &str) -> Vec<(String, Vec<u8>)> {
    let Ok(dir) = std::fs::read_dir(fuzz_dir(sub)) else {
        return Vec::new();
    };
    let mut v: Vec<_> = dir
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .map(|e| {
            let p = e.path();
            (
                p.display().to_string(),
                std::fs::read(&p).expect("readable input"),
            )
        })
        .collect();
    v.sort();
    v
}

/// (command, status) of each response in a response frame's chain.
fn responses(frame: &[u8]) -> Vec<(u16, u32)> {
    let msg = &frame[4.min(frame.len())..];
    chain_offsets(msg, 64)
        .map(|off| {
            let cmd = u16::from_le_bytes([msg[off + 12], msg[off + 13]]);
            let status = u32::from_le_bytes(msg[off + 8..off + 12].try_into().expect("4 bytes"));
            (cmd, status)
        })
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nimbus-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn recorded_client_traffic_replays_through_logon_and_writes() {
    let dir = temp_dir("seeds");
    let srv = server(&dir).expect("server");
    let seeds = inputs("seeds/connection");
    assert!(
        seeds.len() >= 5,
        "seed corpus missing: run python3 fuzz/seeds.py"
    );
    for (name, stream) in seeds {
        let mut h = Harness::new(&srv).expect("admitted");
        let statuses: Vec<(u16, u32)> = h
            .feed_stream(&stream)
            .iter()
            .flat_map(|r| responses(r))
            .collect();
        // SESSION_SETUP, TREE_CONNECT, CREATE, WRITE, QUERY_DIRECTORY succeeded.
        for cmd in [0x1, 0x3, 0x5, 0x9, 0xE] {
            assert!(
                statuses.contains(&(cmd, 0)),
                "{name}: no successful command {cmd:#x} in {statuses:x?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn connection_regressions() {
    let dir = temp_dir("regress");
    let srv = server(&dir).expect("server");
    for (_name, stream) in inputs("regressions/connection") {
        let mut h = Harness::new(&srv).expect("admitted");
        let _ = h.feed_stream(&stream);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn security_layer_regressions() {
    for (_name, input) in inputs("regressions/security_layer") {
        security_layer(&input);
    }
}
