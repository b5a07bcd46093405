"""Starts a 3-member etcd with TLS (tests/etcd_cluster.py), auth on and
off in turn, and runs the probe (src/main.rs, built first with
`cargo build --release` here) as the harness's Nimbus node user.
Usage: run.py COUNT"""
import shutil, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import etcd_cluster as ec
N = sys.argv[1]
for auth in (True, False, True, False):
    base = Path(tempfile.mkdtemp(prefix="authprobe-", dir="/dev/shm"))
    c = ec.EtcdCluster(base, auth=auth, data_root=base)
    c.start()
    try:
        cert, key = c.pki.cert(ec.NODE)
        pids = ",".join(str(m.process.pid) for m in c.members)
        out = subprocess.run([str(Path(__file__).resolve().parent / "target/release/etcd-txn-cost"), c.members[0].client_url, N, pids, str(c.pki.ca), str(cert), str(key)], capture_output=True, text=True, timeout=600)
        print("auth" if auth else "noauth", out.stdout, out.stderr[-500:], flush=True)
    finally:
        c.stop()
        shutil.rmtree(base, ignore_errors=True)
