"""What bench/small_io.py and bench/many_clients.py share: their common
options, the two servers started on one file each in tmpfs, and the
description of the machine for BENCHMARKS.md."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from side_by_side import Server, machine, process_tree, start_nimbus, start_smbd  # noqa: E402

MIB = 1 << 20


IO_LOAD = REPO / "target" / "release" / "nimbus-io-load"


def add_common_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--servers", nargs="+", default=["Nimbus", "Samba"], choices=["Nimbus", "Samba"])
    ap.add_argument("--nimbus", default=str(REPO / "target" / "release" / "nimbus"))
    ap.add_argument("--load", default=str(IO_LOAD), help="the load generator, nimbus-io-load (crates/nimbus-load)")
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")


def check_tools(args, run_flag: str) -> None:
    for tool in (args.nimbus, args.load):
        if not Path(tool).exists():
            sys.exit(f"{tool} not found: bash bench/run.sh {run_flag} builds it")
    if "Samba" in args.servers and os.geteuid() != 0:
        sys.exit(f"run as root (smbd must serve files as the logged-on user): sudo bash bench/run.sh {run_flag}")


@contextmanager
def servers_with_file(args, prefix: str, file: str, mib: int, connections: int = 0) -> Iterator[list[Server]]:
    """The servers of --servers, each sharing a tmpfs directory that holds
    `file` of `mib` MiB of random bytes, and taking `connections` from one
    address (Nimbus refuses more than 256 by default, a guard against one
    client taking every slot); stopped at the end."""
    limits = {"max_connections_per_address": connections} if connections > 256 else None
    tmp_root = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix=prefix, dir=tmp_root) as tmp:
        tmp = Path(tmp)
        servers: list[Server] = []
        try:
            for name in args.servers:
                share = tmp / name / "share"
                share.mkdir(parents=True)
                with open(share / file, "wb") as f:
                    for _ in range(mib):
                        f.write(os.urandom(MIB))
                state = tmp / name / "state"
                state.mkdir()
                servers.append(start_nimbus(args.nimbus, tmp / name, share, limits) if name == "Nimbus" else start_smbd(state, share))
            for s in servers:
                s.settle(timeout=0)
                s.idle_tree = set(process_tree(s.pid))
            yield servers
        finally:
            for s in servers:
                s.stop()


def about() -> list[str]:
    return [line.replace("client smbclient/smbtorture of the same Samba", "client nimbus-io-load") for line in machine()]


def pinned_cpus() -> tuple[set[int], set[int]]:
    """The CPUs a pinned run gives the server and the client: the first two
    this process may use."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        sys.exit(f"--pin needs two CPUs; this process may use {mine}")
    return {mine[0]}, {mine[1]}


def pin(pid: int, cpus: set[int]) -> None:
    """Pins every thread of `pid` and of its children to `cpus`, and checks
    that it holds; threads and processes they start later inherit it
    (smbd's per-connection children, Nimbus's blocking pool). Only a thread
    that ended meanwhile is passed over."""
    for p in process_tree(pid):
        try:
            tasks = [int(t.name) for t in Path(f"/proc/{p}/task").iterdir()]
        except FileNotFoundError:
            continue
        for tid in tasks:
            try:
                os.sched_setaffinity(tid, cpus)
                pinned = os.sched_getaffinity(tid)
            except ProcessLookupError:
                continue
            if pinned != cpus:
                sys.exit(f"thread {tid} of {pid} is not pinned to {cpus}")


def report(args, title: str, table: list[str], begin: str, end: str) -> None:
    """Prints the section, and writes it into BENCHMARKS.md between `begin`
    and `end` when both servers ran and --no-write was not given."""
    from side_by_side import write_benchmarks_md

    lines = [title, "", *about(), "", *table]
    print("\n".join(lines))
    if not args.no_write and len(args.servers) == 2:
        write_benchmarks_md(Path(args.output), lines, begin, end)
        print(f"written to {args.output}")
