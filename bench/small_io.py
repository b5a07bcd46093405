#!/usr/bin/env python3
"""Small I/O at queue depth, Nimbus against Samba (issue 48, item 2).

    bash bench/run.sh --small-io [--seconds 5] [--depths 1 8 32 128] ...

Random READs and WRITEs of 4 KiB and 64 KiB on one file (1 GiB by
default) on tmpfs, and LOCK/UNLOCK pairs of one byte, through
nimbus-io-load (crates/nimbus-load: a pipelining SMB 3.1.1 client on
nimbus-wire's codecs, the same for both servers), plain, signed and
encrypted (AES-128-GCM). Each row: --connections connections, each with
--depth requests in flight.

On a machine of two or more CPUs each server is started on one CPU and
pinned there, and the client on another (--no-pin: all share every CPU;
with two, a server's runtime sizes itself to the one it is given, as it
would on a one-CPU machine), so the server measured
never competes with the client for a core: a row's IOPS are the server's
unless the client's CPU per request says the client was the limit. (The
rows of 2026-11-29 and 2026-11-30 below were measured unpinned with the
earlier client, the Rust `smb` crate, which spent 20-50 µs per request.)

Per row and server: IOPS and MiB/s, the client's p50/p99/p99.9 latency,
the server's CPU per request (user+sys of its processes from /proc, smbd's
children included, across the measured window) and the client's CPU per
request beside it. Servers alternate which goes first. Prints a table with
Nimbus/Samba ratios and writes it into BENCHMARKS.md between the small-io
markers (--no-write: print only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from load_servers import add_common_options, check_tools, pin, pinned_cpus, report, servers_with_file  # noqa: E402
from side_by_side import PASSWORD, SHARE, USER, Server, _stat_fields  # noqa: E402

FILE = "small-io.bin"
MARK_BEGIN = "<!-- small-io: begin (written by bench/small_io.py) -->"
MARK_END = "<!-- small-io: end -->"


def cpu_seconds(pid: int) -> float:
    fields = _stat_fields(pid)
    return sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK") if fields else 0.0


@dataclass
class Row:
    iops: float
    mib_s: float
    p50_us: int
    p99_us: int
    p999_us: int
    server_us: float
    client_us: float


def run_load(load: str, server: Server, op: str, block: int, depth: int, connections: int, protection: str, seconds: float, client_cpus: set[int] | None) -> Row:
    """One run of the generator; server and client CPU are read at the
    generator's `measuring` and `done` lines."""
    cmd = [load, "127.0.0.1", str(server.port), SHARE, USER, PASSWORD, FILE,
           "--connections", str(connections), "--depth", str(depth), "--block", str(block or 4096),
           "--op", op, "--seconds", str(seconds), "--protection", protection, "--hold"]  # fmt: skip
    pin_client = (lambda: os.sched_setaffinity(0, client_cpus)) if client_cpus else None
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin_client)
    assert proc.stdout is not None and proc.stdin is not None
    marks: dict[str, tuple[float, float]] = {}
    lines = []
    for line in proc.stdout:
        line = line.strip()
        if line in ("measuring", "done"):
            marks[line] = (server.cpu(), cpu_seconds(proc.pid))
            if line == "done":
                proc.stdin.close()  # --hold: read; the connections may end
        else:
            lines.append(line)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait(timeout=60 + seconds) != 0 or len(marks) != 2 or not lines:
        sys.exit(f"{Path(load).name} against {server.name} ({op} {block} depth {depth} {protection}) failed: {err.strip()}")
    r = json.loads(lines[-1])
    requests = max(r["requests"], 1)
    server_s = marks["done"][0] - marks["measuring"][0]
    client_s = marks["done"][1] - marks["measuring"][1]
    if server_s <= 0:
        sys.exit(f"{server.name}'s CPU did not grow over a run of {r['requests']} operations: a process was missed")
    return Row(r["iops"], r["mib_s"], r["p50_us"], r["p99_us"], r["p999_us"], server_s / requests * 1e6, client_s / requests * 1e6)


def ratio(n: float, s: float) -> str:
    return f"{n / s:.2f}×" if s else "n/a"


def table(results: dict, args) -> list[str]:
    where = ("each server pinned to one CPU, started there, and the client to another" if args.pin else "server and client sharing every CPU")
    lines = [
        f"Small I/O: random reads and writes on one {args.file_mib} MiB file on tmpfs, and lock/unlock pairs of one byte, "
        f"{args.connections} connection(s) × depth requests in flight, {args.seconds:g} s per run, "
        f"client {Path(args.load).name}, SMB 3.1.1, {where}. "
        "CPU is µs per request (server: its processes; client: the generator); a lock row's request is a LOCK or an UNLOCK.",
        "",
        "| op | block | depth | protection | Nimbus IOPS | Samba IOPS | IOPS ratio | Nimbus p99 µs | Samba p99 µs | Nimbus server CPU | Samba server CPU | CPU ratio | client CPU (N / S) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted({k[:4] for k in results}, key=lambda k: (k[0], k[1], k[2], k[3])):
        n, s = results.get((*key, "Nimbus")), results.get((*key, "Samba"))
        if not n or not s:
            continue
        op, block, depth, prot = key
        lines.append(
            f"| {op} | {f'{block // 1024} KiB' if block else '1 byte'} | {depth} | {prot} | {n.iops:,.0f} | {s.iops:,.0f} | {ratio(n.iops, s.iops)} "
            f"| {n.p99_us:,} | {s.p99_us:,} | {n.server_us:.1f} | {s.server_us:.1f} | {ratio(n.server_us, s.server_us)} "
            f"| {n.client_us:.1f} / {s.client_us:.1f} |"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--file-mib", type=int, default=1024)
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--blocks", type=int, nargs="+", default=[4096, 65536])
    ap.add_argument("--ops", nargs="+", default=["read", "write", "lock"], choices=["read", "write", "lock"])
    ap.add_argument("--protections", nargs="+", default=["plain", "signed", "encrypted"], choices=["plain", "signed", "encrypted"])
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=(os.cpu_count() or 1) >= 2,
                    help="the server on one CPU, the client on another (default on a machine of two or more CPUs)")
    add_common_options(ap)
    args = ap.parse_args()
    check_tools(args, "--small-io")

    results: dict[tuple, Row] = {}
    server_cpus, client_cpus = pinned_cpus() if args.pin else (None, None)
    everywhere = os.sched_getaffinity(0)
    if server_cpus:
        # The servers start on their CPU, so each sizes itself to it (Nimbus's
        # runtime takes one worker thread per CPU it may use).
        os.sched_setaffinity(0, server_cpus)
    with servers_with_file(args, "nimbus-small-io-", FILE, args.file_mib) as servers:
        os.sched_setaffinity(0, everywhere)
        for s in servers if server_cpus else []:
            pin(s.pid, server_cpus)
        turn = 0
        for prot in args.protections:
            for op in args.ops:
                for block in args.blocks if op != "lock" else [0]:
                    for depth in args.depths:
                        order = servers if turn % 2 == 0 else servers[::-1]
                        turn += 1
                        for s in order:
                            row = run_load(args.load, s, op, block, depth, args.connections, prot, args.seconds, client_cpus)
                            results[(op, block, depth, prot, s.name)] = row
                            print(
                                f"  {op:<5} {f'{block // 1024:>2} KiB' if block else '1 byte'} depth {depth:<3} {prot:<9} {s.name:<6} "
                                f"{row.iops:9,.0f} IOPS  p99 {row.p99_us:7,} µs  server {row.server_us:6.1f} µs/req  client {row.client_us:6.1f} µs/req",
                                flush=True,
                            )
                            s.settle()
    report(args, "## Small I/O at queue depth (Nimbus against Samba)", table(results, args), MARK_BEGIN, MARK_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
