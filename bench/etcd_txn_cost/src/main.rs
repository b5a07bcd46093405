//! etcd's CPU per write transaction, by the transaction's shape: 2
//! operations (one compare, one put), 6 (a node's take without its
//! failure branch) and 11 (a node's take as Nimbus sends it: 5 compares,
//! 1 put, 5 reads on failure); and per read of a new file's ownership
//! (`read1`: one key, a linearizable read in a transaction of reads alone,
//! as `EtcdStore::get_many` sends it; `read2`: the ownership and its
//! directory's claim), what docs/SCALING.md's directory claim would ask
//! instead of a take. Run by run.py against a 3-member etcd, TLS with
//! auth on and off and plain, to tell whether etcd's access control costs
//! per request or per operation, and what TLS costs a read against a
//! write (BENCHMARKS.md). Arguments: endpoint, count, the members' pids
//! (comma-separated), and for TLS the CA, certificate, key.
use etcd_client::*;
use std::time::Instant;

type Failed = Box<dyn std::error::Error>;

/// The members' CPU time so far, in seconds (/proc/PID/stat utime+stime).
fn cpu(pids: &[u32]) -> Result<f64, Failed> {
    let mut t = 0u64;
    for p in pids {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat"))?;
        let (_, after_name) = s.rsplit_once(')').ok_or("no ')' in /proc/PID/stat")?;
        let f: Vec<&str> = after_name.split_whitespace().collect();
        let tick = |i: usize| {
            f.get(i)
                .ok_or("short /proc/PID/stat")
                .map(|v| v.parse::<u64>())
        };
        t += tick(11)?? + tick(12)??;
    }
    Ok(t as f64 / 100.0)
}

/// The transaction of `shape` on the keys `ks` (ownership first).
fn shaped(shape: &str, ks: &[String]) -> Txn {
    const FENCE: &str = "/nimbus/fence";
    let absent = |x: &String| Compare::create_revision(x.clone(), CompareOp::Equal, 0);
    let put = vec![TxnOp::put(ks[0].clone(), "n1", None)];
    if shape == "2ops" {
        return Txn::new().when(vec![absent(&ks[0])]).and_then(put);
    }
    let mut when: Vec<Compare> = ks.iter().map(absent).collect();
    when.push(Compare::create_revision(FENCE, CompareOp::Greater, 0));
    let txn = Txn::new().when(when).and_then(put);
    if shape == "6ops" {
        return txn;
    }
    if let Some(n) = shape.strip_prefix("read") {
        let n = n.parse().unwrap_or(1);
        return Txn::new().and_then(
            ks.iter()
                .take(n)
                .map(|x| TxnOp::get(x.clone(), None))
                .collect::<Vec<_>>(),
        );
    }
    let mut reads: Vec<TxnOp> = ks.iter().map(|x| TxnOp::get(x.clone(), None)).collect();
    reads.push(TxnOp::get(FENCE, None));
    txn.or_else(reads)
}

/// Sends `n` transactions of `shape`, numbered from `first`, one after
/// another on `c`.
async fn send(
    mut c: Client,
    shape: &'static str,
    round: usize,
    first: usize,
    n: usize,
) -> Result<(), String> {
    for i in first..first + n {
        let k = format!("/nimbus/{shape}/{round}/{i}");
        let ks: Vec<String> = ["/own", "/opens", "/locks", "/caching"]
            .iter()
            .map(|s| format!("{k}{s}"))
            .collect();
        let r = c.txn(shaped(shape, &ks)).await.map_err(|e| e.to_string())?;
        if !r.succeeded() {
            return Err(format!("{shape} transaction {i} failed its compares"));
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failed> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 5 && a.len() != 8 {
        return Err(
            "usage: etcd-txn-cost ENDPOINT COUNT PID,PID,... CONNECTIONSxINFLIGHT [CA CERT KEY]"
                .into(),
        );
    }
    let endpoint = a[1].clone();
    let n: usize = a[2].parse()?;
    let pids = a[3]
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<u32>, _>>()?;
    // As nodes do: CONNECTIONS clients (a node each), each with INFLIGHT
    // transactions out at once.
    let (conns, inflight) = a[4].split_once('x').ok_or("CONNECTIONSxINFLIGHT, as 3x5")?;
    let (conns, inflight): (usize, usize) = (conns.parse()?, inflight.parse()?);
    let senders = (conns * inflight).max(1);
    if n < senders {
        return Err(
            format!("COUNT {n} is below the {senders} senders: each sends COUNT/senders").into(),
        );
    }
    let mut opts = ConnectOptions::new();
    if a.len() > 5 {
        let ca = std::fs::read(&a[5])?;
        let cert = std::fs::read(&a[6])?;
        let key = std::fs::read(&a[7])?;
        opts = opts.with_tls(
            TlsOptions::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(Identity::from_pem(cert, key)),
        );
    }
    let mut clients = Vec::new();
    for _ in 0..conns.max(1) {
        clients.push(Client::connect([endpoint.clone()], Some(opts.clone())).await?);
    }
    clients[0].put("/nimbus/fence", "x", None).await?;
    for round in 0..2 {
        for shape in ["2ops", "read1", "11ops", "read2", "6ops"] {
            let t0 = cpu(&pids)?;
            let w = Instant::now();
            let each = n / senders;
            let tasks: Vec<_> = (0..senders)
                .map(|s| {
                    tokio::spawn(send(
                        clients[s % clients.len()].clone(),
                        shape,
                        round,
                        s * each,
                        each,
                    ))
                })
                .collect();
            for t in tasks {
                t.await??;
            }
            let used = cpu(&pids)? - t0;
            let done = each * senders;
            // Throughput; with one sender (1x1), each transaction waited
            // for, one over the latency.
            println!(
                "round {round} {shape}: etcd CPU {:.0} us/txn, {:.0} txn/s",
                used / done as f64 * 1e6,
                done as f64 / w.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
