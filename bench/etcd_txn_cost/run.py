"""Starts a 3-member etcd (tests/etcd_cluster.py) with TLS and auth on,
TLS and auth off, and plain, twice each in turn, and runs the probe
(src/main.rs, built first with `cargo build --release` here), as the
harness's Nimbus node user where it has TLS. Usage: run.py COUNT
[CONNECTIONSxINFLIGHT]: 1x1 (the default) sends one transaction at a
time; 3x5 sends from three connections, as three nodes, five at a time
on each."""
import shutil, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import etcd_cluster as ec
N = sys.argv[1]
SENDERS = sys.argv[2] if len(sys.argv) > 2 else "1x1"
KINDS = {"tls-auth": dict(tls=True, auth=True), "tls-noauth": dict(tls=True, auth=False), "plain": dict(tls=False, auth=False)}
for kind in [*KINDS, *reversed(KINDS)]:
    base = Path(tempfile.mkdtemp(prefix="authprobe-", dir="/dev/shm"))
    c = ec.EtcdCluster(base, data_root=base, **KINDS[kind])
    c.start()
    try:
        pids = ",".join(str(m.process.pid) for m in c.members)
        args = [str(Path(__file__).resolve().parent / "target/release/etcd-txn-cost"), c.members[0].client_url, N, pids, SENDERS]
        if c.pki:
            cert, key = c.pki.cert(ec.NODE)
            args += [str(c.pki.ca), str(cert), str(key)]
        out = subprocess.run(args, capture_output=True, text=True, timeout=600)
        print(kind, out.stdout, out.stderr[-500:], flush=True)
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)
