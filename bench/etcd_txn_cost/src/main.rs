//! etcd's CPU per write transaction, by the transaction's shape: 2
//! operations (one compare, one put), 6 (a node's take without its
//! failure branch) and 11 (a node's take as Nimbus sends it: 5 compares,
//! 1 put, 5 reads on failure). Run by run.py against a 3-member TLS etcd
//! with auth on and off, to tell whether etcd's access control costs per
//! request or per operation (BENCHMARKS.md). Arguments: endpoint, count,
//! the members' pids (comma-separated), CA, certificate, key.
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
    let mut reads: Vec<TxnOp> = ks.iter().map(|x| TxnOp::get(x.clone(), None)).collect();
    reads.push(TxnOp::get(FENCE, None));
    txn.or_else(reads)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Failed> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 4 && a.len() != 7 {
        return Err("usage: etcd-txn-cost ENDPOINT COUNT PID,PID,... [CA CERT KEY]".into());
    }
    let endpoint = a[1].clone();
    let n: usize = a[2].parse()?;
    let pids = a[3]
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<u32>, _>>()?;
    let mut opts = ConnectOptions::new();
    if a.len() > 4 {
        let ca = std::fs::read(&a[4])?;
        let cert = std::fs::read(&a[5])?;
        let key = std::fs::read(&a[6])?;
        opts = opts.with_tls(
            TlsOptions::new()
                .ca_certificate(Certificate::from_pem(ca))
                .identity(Identity::from_pem(cert, key)),
        );
    }
    let mut c = Client::connect([endpoint], Some(opts)).await?;
    c.put("/nimbus/fence", "x", None).await?;
    for round in 0..2 {
        for shape in ["2ops", "11ops", "6ops"] {
            let t0 = cpu(&pids)?;
            let w = Instant::now();
            for i in 0..n {
                let k = format!("/nimbus/{shape}/{round}/{i}");
                let ks: Vec<String> = ["/own", "/opens", "/locks", "/caching"]
                    .iter()
                    .map(|s| format!("{k}{s}"))
                    .collect();
                let txn = shaped(shape, &ks);
                let r = c.txn(txn).await?;
                if !r.succeeded() {
                    return Err(format!("{shape} transaction {i} failed its compares").into());
                }
            }
            let used = cpu(&pids)? - t0;
            println!(
                "round {round} {shape}: etcd CPU {:.0} us/txn, {:.0} txn/s",
                used / n as f64 * 1e6,
                n as f64 / w.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
