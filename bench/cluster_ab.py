#!/usr/bin/env python3
"""Two or more Nimbus builds as the same three-node cluster, alternated
round by round on one etcd, with each client's rate beside the total.

    target/test-venv/bin/python3 bench/cluster_ab.py --binaries OLD NEW \\
        [--tls] [--case shared-data] [--nprocs 4 16] [--rounds 3] [--seconds 6]

bench/cluster_contention.py gives every build an etcd of its own and
prints totals; this one is for a change whose effect hides in the total
or in the spread between rounds:

- the builds run on one etcd cluster, one after the other, in the order
  reversed on every other round, so that a drift of the machine falls on
  both;
- each run prints the opens/s of each client (process i on node i mod 3)
  besides the total: a node that keeps a file to itself serves its own
  clients at local speed while another node's client waits, and the total
  counts that as a gain.

Cases are bench/data_open_loop.py's: shared-data (opens of one file for
reading), shared-lease (the same, each client asking for a lease of its
own) and create (new files of each client's own). etcd's and the nodes'
CPU per open come from bench/cluster_contention.py's Target.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import cluster_contention as cc  # noqa: E402
import data_open_loop  # noqa: E402
from etcd_cluster import EtcdCluster  # noqa: E402
from meta_loop import run_workers  # noqa: E402

CASES = ("shared-data", "shared-lease", "create")


def one_run(target: cc.Target, case: str, nprocs: int, seconds: float) -> list[tuple[int, float]]:
    """Each client's (opens, seconds) of one run of `case`."""
    args = dict(
        hosts=target.hosts,
        port=target.port,
        share=cc.SHARE,
        user=cc.USER,
        password=cc.PASSWORD,
        name=r"made\new" if case == "create" else "shared-data.dat",
        seconds=seconds,
        lease=case == "shared-lease",
        create=case == "create",
    )
    return run_workers(data_open_loop._worker, args, nprocs, seconds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binaries", nargs="+", required=True, help="the nimbus builds to compare")
    ap.add_argument("--tls", action="store_true", help="etcd with TLS, client certificates and auth")
    ap.add_argument("--case", choices=CASES, default="shared-data")
    ap.add_argument("--nprocs", nargs="+", type=int, default=[4, 16])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nimbus-ab-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    etcd = EtcdCluster(work / "etcd", tls=args.tls)
    etcd.start()
    run = 0
    try:
        for r in range(args.rounds):
            for binary in args.binaries if r % 2 == 0 else args.binaries[::-1]:
                run += 1
                state, share = work / f"state{run}", work / f"share{run}"
                state.mkdir()
                (share / "made").mkdir(parents=True)
                (share / "shared-data.dat").write_bytes(b"x")
                target, procs = cc.start_cluster(binary, state, share, etcd)
                try:
                    time.sleep(2)  # the nodes' first looks at etcd
                    for n in args.nprocs:
                        try:
                            etcd.etcdctl("compact", str(target.revision()))
                        except Exception:  # compacted already: nothing to do
                            pass
                        before, started = target.cpu(), time.monotonic()
                        done = one_run(target, args.case, n, args.seconds)
                        after = target.cpu()
                        opens = max(1, sum(k for k, _ in done))
                        rate = sum(k / t for k, t in done)
                        each = " ".join(f"{k / t:.0f}" for k, t in done)
                        print(
                            f"{Path(binary).name:24} {args.case} n={n:<3} round {r}: {rate:7.0f} opens/s"
                            f"  etcd {(after[0] - before[0]) * 1e6 / opens:5.0f} us/open"
                            f"  nodes {(after[1] - before[1]) * 1e6 / opens:5.0f} us/open"
                            f"  ({time.monotonic() - started:.0f} s; each client: {each})",
                            flush=True,
                        )
                finally:
                    for p in procs:
                        p.terminate()
                        p.wait(timeout=20)
    finally:
        etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
