//! A small-I/O load generator: random READs or WRITEs of one block size on
//! one existing file, or open / read / close cycles of it, from several
//! connections with many requests in flight on each, through the Rust
//! `smb` crate (smb-rs), the same client for every server measured.
//!
//!     nimbus-smb-load HOST PORT SHARE USER PASSWORD FILE \
//!         --connections N --depth D --block BYTES --op read|write|cycle \
//!         --seconds S --protection signed|encrypted [--rate OPS_PER_SECOND]
//!
//! Each connection is its own logged-on session with the file open once;
//! D tasks per connection each keep one operation in flight, so the server
//! sees N×D at a time. Offsets are random multiples of the block within
//! the file's length (a fixed xorshift seed per task: runs repeat). A
//! WRITE's block is bytes 0x5a with its own offset (u64, little-endian)
//! in its first and last 8 (blocks of 16 bytes or more), so that a test
//! can tell a block the server put in the wrong place. With
//! --rate, the tasks together start that many operations per second,
//! evenly spread; without, each starts its next when its last ends.
//!
//! Output, for bench/small_io.py to time the server and this client from
//! /proc around the measured window: a line `measuring` when every
//! connection is ready and the window begins, `done` when it ends, then
//! one JSON object: requests, bytes, seconds, IOPS, MiB/s, latency
//! percentiles in microseconds (from send to answer, as this client sees
//! them), and errors. Any error ends the run with a non-zero status.
//!
//! Why smb-rs: it pipelines (requests of one connection go out without
//! waiting for earlier answers, within the credits granted), signs and
//! encrypts, and is a maintained client that none of the servers measured
//! ships. A client on nimbus-wire's codecs would share the server's own
//! parsing with it.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use smb::connection::EncryptionMode;
use smb::{
    Client, ClientConfig, ConnectionConfig, Dialect, File, FileAccessMask, FileCreateArgs, GetLen,
    ReadAt, UncPath, WriteAt,
};

#[derive(Clone)]
struct Args {
    host: String,
    port: u16,
    share: String,
    user: String,
    password: String,
    file: String,
    connections: usize,
    depth: usize,
    block: usize,
    op: Op,
    seconds: f64,
    encrypted: bool,
    /// Operations per second for the whole run, spread over the tasks;
    /// None: flat out.
    rate: Option<f64>,
}

/// What each task repeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// READ of a block at a random offset of the open file.
    Read,
    /// WRITE of a block at a random offset of the open file.
    Write,
    /// CREATE (open the file for reading), READ of a block, CLOSE: what
    /// a client that opens a small document does; one operation.
    Cycle,
}

const USAGE: &str = "usage: nimbus-smb-load HOST PORT SHARE USER PASSWORD FILE --connections N \
     --depth D --block BYTES --op read|write|cycle --seconds S --protection signed|encrypted \
     [--rate OPS_PER_SECOND]";

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
        file: file.clone(),
        connections: 1,
        depth: 1,
        block: 4096,
        op: Op::Read,
        seconds: 5.0,
        encrypted: false,
        rate: None,
    };
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |what: &str| -> Result<usize, String> {
            value
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{what}: a positive whole number, not {value}"))
        };
        match flag.as_str() {
            "--connections" => a.connections = number("--connections")?,
            "--depth" => a.depth = number("--depth")?,
            "--block" => a.block = number("--block")?,
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
                    "cycle" => Op::Cycle,
                    _ => return Err(format!("--op: read, write or cycle, not {value}")),
                }
            }
            "--rate" => {
                a.rate = Some(
                    value
                        .parse::<f64>()
                        .ok()
                        .filter(|r| *r > 0.0 && r.is_finite())
                        .ok_or_else(|| format!("--rate: operations per second, not {value}"))?,
                )
            }
            "--protection" => {
                a.encrypted = match value.as_str() {
                    "signed" => false,
                    "encrypted" => true,
                    _ => return Err(format!("--protection: signed or encrypted, not {value}")),
                }
            }
            _ => return Err(format!("unknown flag {flag}\n{USAGE}")),
        }
    }
    Ok(a)
}

/// Connections being made at once.
const CONNECTING_AT_ONCE: usize = 64;

/// One logged-on connection, with the file open (for a cycle, the open
/// that tells its length).
struct Conn {
    client: Arc<Client>,
    file: Arc<File>,
    path: UncPath,
}

async fn connect(a: &Args) -> Result<Conn, Box<dyn std::error::Error>> {
    let mut connection = ConnectionConfig {
        min_dialect: Some(Dialect::Smb0311),
        max_dialect: Some(Dialect::Smb0311),
        encryption_mode: if a.encrypted {
            EncryptionMode::Required
        } else {
            EncryptionMode::Disabled
        },
        port: Some(a.port),
        timeout: Some(Duration::from_secs(30)),
        // Enough for every task's request at once, and some.
        credits_backlog: Some((a.depth * 2 + 16).min(8192) as u16),
        ..Default::default()
    };
    connection.auth_methods.kerberos = false;
    connection.auth_methods.ntlm = true;
    let client = Client::new(ClientConfig {
        connection,
        ..Default::default()
    });
    let share = UncPath::new(&a.host)?.with_share(&a.share)?;
    client
        .share_connect(&share, &a.user, a.password.clone())
        .await?;
    let path = share.clone().with_path(&a.file);
    let file = open(&client, &path, a.op == Op::Write).await?;
    Ok(Conn {
        client: Arc::new(client),
        file: Arc::new(file),
        path,
    })
}

async fn open(client: &Client, path: &UncPath, write: bool) -> smb::Result<File> {
    let access = FileAccessMask::new()
        .with_generic_read(true)
        .with_generic_write(write);
    Ok(client
        .create_file(path, &FileCreateArgs::make_open_existing(access))
        .await?
        .unwrap_file())
}

/// What one task measured.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    bytes: u64,
}

/// What every task of a run shares.
#[derive(Clone, Copy)]
struct Plan {
    op: Op,
    blocks: u64,
    block: usize,
    until: Instant,
    /// Time between two operations of one task, when the rate is fixed.
    every: Option<Duration>,
}

/// `phase`: where in the period of a fixed rate this task's turns fall,
/// from 0 to 1.
async fn task(
    conn: (Arc<Client>, Arc<File>, UncPath),
    plan: Plan,
    mut seed: u64,
    phase: f64,
) -> Result<Tally, String> {
    let (client, file, path) = conn;
    let block = plan.block;
    let mut buf = vec![0x5au8; block];
    let mut tally = Tally::default();
    // With a fixed rate, the tasks' turns are spread evenly over the
    // period instead of falling together.
    let mut next = Instant::now() + plan.every.map_or(Duration::ZERO, |e| e.mul_f64(phase));
    while Instant::now() < plan.until {
        if let Some(every) = plan.every {
            // A fixed rate: each operation at its time, late ones at once
            // (latency is then measured from when the operation began).
            tokio::time::sleep_until(next.into()).await;
            next += every;
            if Instant::now() >= plan.until {
                break;
            }
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let at = (seed % plan.blocks) * block as u64;
        let start = Instant::now();
        let n = match plan.op {
            Op::Read => file.read_at(&mut buf, at).await,
            Op::Write => {
                stamp(&mut buf, at);
                file.write_at(&buf, at).await
            }
            Op::Cycle => cycle(&client, &path, &mut buf, at).await,
        }
        .map_err(|e| format!("{:?} at {at}: {e}", plan.op))?;
        if n != block {
            return Err(format!("a {block}-byte request at {at} moved {n} bytes"));
        }
        let us = start.elapsed().as_micros().min(u32::MAX as u128) as u32;
        tally.latencies_us.push(us);
        tally.bytes += n as u64;
    }
    Ok(tally)
}

/// Marks a WRITE's block with its offset, at both ends (see the module
/// comment); two stores, so the client's cost per request stays flat.
fn stamp(buf: &mut [u8], at: u64) {
    let n = buf.len();
    if n >= 16 {
        buf[..8].copy_from_slice(&at.to_le_bytes());
        buf[n - 8..].copy_from_slice(&at.to_le_bytes());
    }
}

/// Opens the file, reads a block, closes it.
async fn cycle(client: &Client, path: &UncPath, buf: &mut [u8], at: u64) -> smb::Result<usize> {
    let file = open(client, path, false).await?;
    let n = file.read_at(buf, at).await?;
    file.close().await?;
    Ok(n)
}

/// Raises this process's open-file limit to its hard limit: a thousand
/// connections need more descriptors than the usual soft limit of 1024.
fn raise_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer, then the same struct back in.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Sets TCP_NODELAY on every TCP socket of this process (the connections
/// just made), and says on how many. smb-rs leaves Nagle's algorithm on and
/// has no option for it: a small request written while an earlier one is
/// unacknowledged then waits for the server's delayed ACK (40 ms on
/// Linux), and the benchmark would measure that timer. Every SMB client
/// worth measuring against (Windows, the Linux kernel's, Samba's) sets it.
fn no_delay_on_sockets() -> usize {
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut set = 0;
    for entry in fds.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        let on: libc::c_int = 1;
        // SAFETY: a descriptor of this process, an int option by pointer
        // and length; a descriptor that is not a TCP socket (a Unix
        // socket, an eventfd) only makes the call fail.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            set += 1;
        }
    }
    set
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    raise_file_limit();
    // Connections are made CONNECTING_AT_ONCE at a time: each logon takes
    // several round trips, some waiting on delayed ACKs before TCP_NODELAY
    // is set (the crate makes the socket inside its logon), so a thousand
    // made one by one would take minutes.
    let mut conns = Vec::with_capacity(a.connections);
    while conns.len() < a.connections {
        let batch = (a.connections - conns.len()).min(CONNECTING_AT_ONCE);
        let made: Vec<_> = (0..batch)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { connect(&a).await.map_err(|e| e.to_string()) })
            })
            .collect();
        for m in made {
            conns.push(m.await.map_err(|e| e.to_string())??);
        }
    }
    let sockets = no_delay_on_sockets();
    if sockets < a.connections {
        return Err(format!(
            "TCP_NODELAY set on {sockets} sockets, fewer than the {} connections",
            a.connections
        )
        .into());
    }
    let len = conns[0].file.get_len().await?;
    let blocks = len / a.block as u64;
    if blocks == 0 {
        return Err(format!("{} holds {len} bytes, less than one block", a.file).into());
    }
    let tasks_n = a.connections * a.depth;
    println!("measuring");
    std::io::stdout().flush()?;
    let start = Instant::now();
    let plan = Plan {
        op: a.op,
        blocks,
        block: a.block,
        until: start + Duration::from_secs_f64(a.seconds),
        every: a.rate.map(|r| Duration::from_secs_f64(tasks_n as f64 / r)),
    };
    let mut tasks = Vec::new();
    for (c, conn) in conns.iter().enumerate() {
        for d in 0..a.depth {
            let seed = 0x9E37_79B9_7F4A_7C15u64 ^ ((c * 1_000_003 + d) as u64 + 1);
            let shared = (conn.client.clone(), conn.file.clone(), conn.path.clone());
            let phase = tasks.len() as f64 / tasks_n as f64;
            tasks.push(tokio::spawn(task(shared, plan, seed, phase)));
        }
    }
    let mut latencies = Vec::new();
    let mut bytes = 0u64;
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(tally)) => {
                latencies.extend(tally.latencies_us);
                bytes += tally.bytes;
            }
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("task: {e}")),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    println!("done");
    std::io::stdout().flush()?;
    if let Some(e) = errors.first() {
        return Err(format!("{} of the tasks failed; the first: {e}", errors.len()).into());
    }
    latencies.sort_unstable();
    let requests = latencies.len();
    println!(
        "{{\"requests\": {requests}, \"bytes\": {bytes}, \"seconds\": {seconds:.3}, \
         \"iops\": {:.0}, \"mib_s\": {:.1}, \"p50_us\": {}, \"p99_us\": {}, \
         \"p999_us\": {}, \"errors\": 0}}",
        requests as f64 / seconds,
        bytes as f64 / seconds / (1024.0 * 1024.0),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 0.999),
    );
    for conn in conns {
        drop(conn.file);
        conn.client.close().await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(a).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smb-rs load: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_block_names_its_offset_at_both_ends() {
        let mut buf = vec![0x5au8; 4096];
        stamp(&mut buf, 0x1234_5000);
        assert_eq!(buf[..8], 0x1234_5000u64.to_le_bytes());
        assert_eq!(buf[4088..], 0x1234_5000u64.to_le_bytes());
        assert!(buf[8..4088].iter().all(|&b| b == 0x5a));
        let mut small = vec![0x5au8; 8];
        stamp(&mut small, 7);
        assert_eq!(small, [0x5a; 8]);
    }

    #[test]
    fn percentiles_take_the_nearest_rank() {
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.99), 990);
        assert_eq!(percentile(&v, 0.999), 999);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn flags_are_checked() {
        let base: Vec<String> = ["h", "445", "s", "u", "p", "f"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let with = |extra: &[&str]| {
            let mut v = base.clone();
            v.extend(extra.iter().map(|s| s.to_string()));
            parse(&v)
        };
        let a = with(&[
            "--depth",
            "32",
            "--op",
            "write",
            "--protection",
            "encrypted",
        ])
        .unwrap();
        assert_eq!((a.depth, a.op, a.encrypted), (32, Op::Write, true));
        let a = with(&["--op", "cycle", "--rate", "500"]).unwrap();
        assert_eq!((a.op, a.rate), (Op::Cycle, Some(500.0)));
        assert!(with(&["--rate", "0"]).is_err());
        assert!(with(&["--rate", "inf"]).is_err());
        assert!(with(&["--depth", "0"]).is_err());
        assert!(with(&["--op", "delete"]).is_err());
        assert!(with(&["--depth"]).is_err());
        assert!(with(&["--speed", "1"]).is_err());
        assert!(parse(&base[..3]).is_err());
    }
}
