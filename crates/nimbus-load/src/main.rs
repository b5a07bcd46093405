//! nimbus-io-load: random READs, WRITEs, LOCK/UNLOCK pairs or open /
//! read / close cycles on one existing file, from several connections
//! with many requests in flight on each, for bench/small_io.py and
//! bench/many_clients.py to measure Nimbus and Samba with the same client.
//!
//!     nimbus-io-load HOST PORT SHARE USER PASSWORD FILE \
//!         --connections N --depth D --block BYTES --op read|write|lock|cycle \
//!         --seconds S --protection plain|signed|encrypted \
//!         [--rate OPS_PER_SECOND] [--domain D] [--verify] [--hold]
//!
//! Why not the `smb` crate (nimbus-smb-load, which this replaced): it spent
//! 20-50 µs of CPU per 4 KiB request, as much as the servers it measured,
//! so on a two-core machine it decides the IOPS of both. This client
//! builds frames with the server's own codecs (nimbus-wire), signs and
//! seals with nimbus-transport, keeps D requests in flight per connection
//! from one thread with blocking sockets, and sends every request that is
//! ready in one write. It speaks SMB 3.1.1 only, logs on with NTLMv2, and
//! opens the file without caching.
//!
//! Offsets are random multiples of the block within the file (a fixed
//! xorshift seed per slot: runs repeat). A WRITE's block is bytes 0x5a
//! with its own offset (u64, little-endian) in its first and last 8, so
//! a test can tell a block the server put in the wrong place. A lock
//! slot takes an exclusive lock of its own byte (FAIL_IMMEDIATELY: no two
//! slots, of any connection, share one) and releases it, two requests. A
//! cycle opens the file by name, reads a block and closes it: one
//! operation of three requests. With --rate the connections together
//! start that many operations per second, evenly spread; without, each
//! slot starts its next when its last ends. With --verify every READ's
//! data must begin with its offset, as in a file whose blocks were all
//! stamped so (a test's check, not a benchmark's). A READ's or WRITE's
//! answer must count its whole block.
//!
//! Connections log on at most `LOGONS_AT_ONCE` at a time, before the
//! measured window: clients arrive over time, not all in one millisecond.
//!
//! Output, for bench/small_io.py to time the server and this client from
//! /proc around the measured window: `measuring` when every connection is
//! ready, `done` when the window has ended and the operations under way
//! have finished, then one JSON object: operations (`requests`), bytes,
//! seconds, IOPS, MiB/s, latency percentiles in microseconds (from send to
//! answer) and the
//! signing algorithm negotiated. With --hold the connections stay open
//! after that until stdin closes, so that the servers' CPU read at `done`
//! holds every connection's. Any error ends
//! the run with a non-zero status: a refused request, an answer short of
//! its block, one not signed or sealed as the session is, or no answer
//! within five minutes.

mod conn;
mod load;
mod ntlm;

use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use conn::Protection;
use load::{Op, Plan, Tally};

#[derive(Clone)]
struct Args {
    host: String,
    port: u16,
    share: String,
    user: String,
    password: String,
    domain: String,
    file: String,
    connections: usize,
    depth: usize,
    block: usize,
    op: Op,
    seconds: f64,
    protection: Protection,
    /// Operations per second for the whole run, spread over the
    /// connections; None: flat out.
    rate: Option<f64>,
    /// READs check their data begins with its offset (`load::Plan`).
    verify: bool,
    /// After `done`, the connections stay open until stdin closes.
    hold: bool,
}

const USAGE: &str = "usage: nimbus-io-load HOST PORT SHARE USER PASSWORD FILE --connections N \
     --depth D --block BYTES --op read|write|lock|cycle --seconds S \
     --protection plain|signed|encrypted [--rate OPS_PER_SECOND] [--domain DOMAIN] [--verify] [--hold]";

fn parse(args: &[String]) -> Result<Args, String> {
    let (fixed, flags) = args.split_at(args.len().min(6));
    let [host, port, share, user, password, file] = fixed else {
        return Err(USAGE.into());
    };
    let mut a = Args {
        host: host.clone(),
        port: port.parse().map_err(|e| format!("PORT: {e}"))?,
        share: share.clone(),
        user: user.clone(),
        password: password.clone(),
        domain: String::new(),
        file: file.clone(),
        connections: 1,
        depth: 1,
        block: 4096,
        op: Op::Read,
        seconds: 5.0,
        protection: Protection::Signed,
        rate: None,
        verify: false,
        hold: false,
    };
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        if flag == "--verify" || flag == "--hold" {
            a.verify |= flag == "--verify";
            a.hold |= flag == "--hold";
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |what: &str, max: usize| -> Result<usize, String> {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| format!("{what}: a whole number from 1 to {max}, not {value}"))
        };
        match flag.as_str() {
            "--connections" => a.connections = number("--connections", 4096)?,
            "--depth" => a.depth = number("--depth", 1024)?,
            "--block" => a.block = number("--block", 1 << 20)?,
            "--seconds" => {
                a.seconds = value
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s > 0.0 && *s <= 3600.0)
                    .ok_or_else(|| format!("--seconds: from 0 to 3600, not {value}"))?
            }
            "--op" => {
                a.op = match value.as_str() {
                    "read" => Op::Read,
                    "write" => Op::Write,
                    "lock" => Op::Lock,
                    "cycle" => Op::Cycle,
                    _ => return Err(format!("--op: read, write, lock or cycle, not {value}")),
                }
            }
            "--protection" => {
                a.protection = match value.as_str() {
                    "plain" => Protection::Plain,
                    "signed" => Protection::Signed,
                    "encrypted" => Protection::Encrypted,
                    _ => {
                        return Err(format!(
                            "--protection: plain, signed or encrypted, not {value}"
                        ))
                    }
                }
            }
            "--domain" => a.domain = value.clone(),
            "--rate" => {
                a.rate = Some(
                    value
                        .parse::<f64>()
                        .ok()
                        .filter(|r| r.is_finite() && (0.001..=1e7).contains(r))
                        .ok_or_else(|| format!("--rate: operations per second, not {value}"))?,
                )
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    let ids = a.depth * usize::from(conn::charge(a.block));
    if ids > load::MAX_CREDITS_IN_FLIGHT {
        return Err(format!(
            "--depth {} of {}-byte blocks keeps {ids} credits in flight; at most {} (the largest \
             credit window a server grants)",
            a.depth,
            a.block,
            load::MAX_CREDITS_IN_FLIGHT
        ));
    }
    Ok(a)
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// How many connections may be logging on at once. Samba listens with a
/// backlog of 50 (SMBD_LISTEN_BACKLOG) and forks an smbd per connection:
/// 1,000 connecting at once overflowed its queue, and it reset a third of
/// them, in two runs of two. A connection set up counts nowhere in the
/// measurement, so a bound costs the result nothing.
const LOGONS_AT_ONCE: usize = 32;

/// A counting gate: at most `LOGONS_AT_ONCE` holders (std has no
/// semaphore; the `run` threads are plain threads).
struct Gate {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Gate {
    fn pass<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        drop(free);
        let out = f();
        *self.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.freed.notify_one();
        out
    }
}

fn run(a: Args) -> Result<(), String> {
    let gate = Arc::new(Gate {
        free: Mutex::new(LOGONS_AT_ONCE),
        freed: Condvar::new(),
    });
    let ready = Arc::new(Barrier::new(a.connections + 1));
    let go = Arc::new(Barrier::new(a.connections + 1));
    let mut threads = Vec::new();
    for c in 0..a.connections {
        let (a, ready, go, gate) = (a.clone(), ready.clone(), go.clone(), gate.clone());
        threads.push(std::thread::spawn(
            move || -> Result<(Tally, conn::Conn), String> {
                let opened = gate.pass(|| {
                    let addr = format!("{}:{}", a.host, a.port);
                    let unc = format!("\\\\{}\\{}", a.host, a.share);
                    let mut conn = conn::Conn::open(
                        &addr,
                        &unc,
                        &a.user,
                        &a.domain,
                        &a.password,
                        a.protection,
                    )?;
                    let (file, len) = conn.open_file(&a.file)?;
                    Ok::<_, String>((conn, file, len))
                });
                // Every thread reaches both barriers, so a failed one cannot
                // leave the others waiting.
                ready.wait();
                go.wait();
                let (mut conn, file, len) = opened?;
                let plan = Plan {
                    op: a.op,
                    file,
                    blocks: len / a.block as u64,
                    block: a.block,
                    depth: a.depth,
                    until: Instant::now() + Duration::from_secs_f64(a.seconds),
                    seed: 0x9E37_79B9_7F4A_7C15u64 ^ (c as u64 + 1),
                    lock_base: (c * a.depth) as u64,
                    name: a.file.clone(),
                    every: a
                        .rate
                        .map(|r| Duration::from_secs_f64(a.connections as f64 / r)),
                    start_in: a
                        .rate
                        .map_or(Duration::ZERO, |r| Duration::from_secs_f64(c as f64 / r)),
                    verify: a.verify,
                };
                let tally = load::run(&mut conn, &plan)?;
                Ok((tally, conn))
            },
        ));
    }
    ready.wait();
    println!("measuring");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    go.wait();
    let start = Instant::now();
    let mut latencies = Vec::new();
    let mut bytes = 0u64;
    let mut errors = Vec::new();
    let mut signing = String::new();
    // The connections stay open until `done` is printed: a server's CPU is
    // read then, and an smbd that had already exited and not yet been
    // reaped would count for nothing.
    let mut open = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok((tally, conn))) => {
                latencies.extend(tally.latencies_us);
                bytes += tally.bytes;
                signing = format!("{:?}", conn.signing_algorithm);
                open.push(conn);
            }
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a connection's thread panicked".into()),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    println!("done");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let report = (|| {
        if let Some(e) = errors.first() {
            return Err(format!(
                "{} of {} connections failed; the first: {e}",
                errors.len(),
                a.connections
            ));
        }
        latencies.sort_unstable();
        let requests = latencies.len();
        let signing = if a.protection == Protection::Signed {
            signing
        } else {
            String::new()
        };
        println!(
            "{{\"requests\": {requests}, \"bytes\": {bytes}, \"seconds\": {seconds:.3}, \
             \"iops\": {:.0}, \"mib_s\": {:.1}, \"p50_us\": {}, \"p99_us\": {}, \
             \"p999_us\": {}, \"signing\": \"{signing}\"}}",
            requests as f64 / seconds,
            bytes as f64 / seconds / (1024.0 * 1024.0),
            percentile(&latencies, 0.50),
            percentile(&latencies, 0.99),
            percentile(&latencies, 0.999),
        );
        Ok(())
    })();
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    // With --hold the connections stay open until whoever reads `done`
    // has read the servers' CPU and closes our stdin: an smbd that exited
    // and was reaped while its parent's figures were read would be counted
    // nowhere.
    if a.hold {
        let mut rest = Vec::new();
        let _ = std::io::stdin().read_to_end(&mut rest);
    }
    drop(open);
    report
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nimbus-io-load: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(extra: &[&str]) -> Result<Args, String> {
        let mut v: Vec<String> = ["h", "445", "s", "u", "p", "f"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        parse(&v)
    }

    #[test]
    fn options_parse_and_bad_ones_are_refused() {
        let a = with(&["--depth", "32", "--op", "lock", "--protection", "plain"]).unwrap();
        assert_eq!(
            (a.depth, a.op, a.protection),
            (32, Op::Lock, Protection::Plain)
        );
        assert!(with(&["--depth", "0"]).is_err());
        assert!(with(&["--depth", "5000"]).is_err());
        // 1,024 in flight of 1 MiB: 16,384 credits, beyond any window.
        assert!(with(&["--depth", "1024", "--block", "1048576"]).is_err());
        assert!(with(&["--depth", "128", "--block", "1048576"]).is_ok());
        assert!(with(&["--verify"]).unwrap().verify);
        assert!(with(&["--op", "delete"]).is_err());
        assert!(with(&["--protection", "sealed"]).is_err());
        assert!(with(&["--seconds", "inf"]).is_err());
        assert!(with(&["--depth"]).is_err());
        assert!(with(&["--speed", "1"]).is_err());
        let a = with(&["--op", "cycle", "--rate", "500"]).unwrap();
        assert_eq!((a.op, a.rate), (Op::Cycle, Some(500.0)));
        assert!(with(&["--rate", "0"]).is_err());
        assert!(with(&["--rate", "inf"]).is_err());
        assert!(parse(&["h".to_string()]).is_err());
    }

    #[test]
    fn percentiles_of_a_sorted_list() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 51);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
