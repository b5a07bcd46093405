#!/usr/bin/env python3
"""Many clients, Nimbus against Samba.

    bash bench/run.sh --many-clients [--connections 16 256 1000] ...

Each connection is its own logged-on session (NTLM, signed) of
nimbus-io-load (crates/nimbus-load), and repeats one cycle: open a file,
read 4 KiB at a random offset, close. Each --connections count is run
twice:
- flat out: every connection starts its next cycle when its last ends;
- at a fixed total rate (--rate cycles per second, spread evenly over the
  connections), which both servers can sustain, to compare latency at the
  same load.

Per row and server:
- cycles per second;
- the client's p50 and p99 latency of a cycle;
- the server's CPU per cycle (user+sys of its processes from /proc);
- the server's memory while every connection is logged on, as the sum of
  the proportional set size (PSS, /proc/PID/smaps_rollup) of its processes.
  Nimbus is one process. Samba is its parent and one smbd per connection,
  so PSS counts their shared pages once.

Prints a table with Nimbus/Samba ratios, and writes it into BENCHMARKS.md
between the many-clients markers (--no-write: print only).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from load_servers import add_common_options, check_tools, report, servers_with_file  # noqa: E402
from side_by_side import PASSWORD, SHARE, USER, Server, process_tree  # noqa: E402

FILE = "many-clients.bin"
FILE_BYTES = 64 << 20
MARK_BEGIN = "<!-- many-clients: begin (written by bench/many_clients.py) -->"
MARK_END = "<!-- many-clients: end -->"


def pss_kib(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def tree_pss_mib(root: int) -> float:
    return sum(pss_kib(p) for p in process_tree(root)) / 1024


@dataclass
class Row:
    ops: float
    p50_us: int
    p99_us: int
    server_us: float
    memory_mib: float


def run_load(load: str, server: Server, connections: int, rate: float | None, seconds: float) -> Row:
    cmd = [load, "127.0.0.1", str(server.port), SHARE, USER, PASSWORD, FILE,
           "--connections", str(connections), "--depth", "1", "--block", "4096",
           "--op", "cycle", "--seconds", str(seconds), "--protection", "signed", "--hold"]  # fmt: skip
    if rate:
        cmd += ["--rate", str(rate)]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    cpu: dict[str, float] = {}
    memory = 0.0
    lines = []
    for line in proc.stdout:
        line = line.strip()
        if line == "measuring":
            cpu[line] = server.cpu()
            # Every connection is logged on and holds the file open.
            memory = tree_pss_mib(server.pid)
        elif line == "done":
            cpu[line] = server.cpu()
            proc.stdin.close()  # --hold: read; the connections may end
        else:
            lines.append(line)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.wait(timeout=120 + seconds) != 0 or len(cpu) != 2 or not lines:
        sys.exit(f"nimbus-io-load against {server.name} ({connections} connections, rate {rate}) failed: {err.strip()}")
    r = json.loads(lines[-1])
    return Row(r["iops"], r["p50_us"], r["p99_us"], (cpu["done"] - cpu["measuring"]) / max(r["requests"], 1) * 1e6, memory)


def ratio(n: float, s: float) -> str:
    return f"{n / s:.2f}×" if s else "n/a"


def table(results: dict, args) -> list[str]:
    lines = [
        f"Many clients: each connection its own NTLM session (signed, SMB 3.1.1), repeating open / read 4 KiB / close of one "
        f"{FILE_BYTES >> 20} MiB file on tmpfs, {args.seconds:g} s per run; flat out, and at {args.rate:g} cycles/s in all. "
        "Client nimbus-io-load; server memory is the PSS of all its processes with every connection logged on.",
        "",
        "| connections | load | Nimbus cycles/s | Samba cycles/s | ratio | Nimbus p50 / p99 µs | Samba p50 / p99 µs | Nimbus server CPU µs/cycle | Samba server CPU µs/cycle | CPU ratio | Nimbus memory MiB | Samba memory MiB | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for conns in args.connections:
        for load in ("flat out", "fixed rate"):
            n, s = results.get((conns, load, "Nimbus")), results.get((conns, load, "Samba"))
            if not n or not s:
                continue
            lines.append(
                f"| {conns} | {load} | {n.ops:,.0f} | {s.ops:,.0f} | {ratio(n.ops, s.ops)} | {n.p50_us:,} / {n.p99_us:,} | {s.p50_us:,} / {s.p99_us:,} "
                f"| {n.server_us:.0f} | {s.server_us:.0f} | {ratio(n.server_us, s.server_us)} | {n.memory_mib:.0f} | {s.memory_mib:.0f} | {ratio(n.memory_mib, s.memory_mib)} |"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--connections", type=int, nargs="+", default=[16, 256, 1000])
    ap.add_argument("--rate", type=float, default=1000, help="total cycles per second of the fixed-rate runs")
    add_common_options(ap)
    args = ap.parse_args()
    check_tools(args, "--many-clients")

    results: dict[tuple, Row] = {}
    with servers_with_file(args, "nimbus-many-clients-", FILE, FILE_BYTES >> 20, max(args.connections) + 16) as servers:
        turn = 0
        for conns in args.connections:
            for load, rate in (("flat out", None), ("fixed rate", args.rate)):
                order = servers if turn % 2 == 0 else servers[::-1]
                turn += 1
                for s in order:
                    row = run_load(args.load, s, conns, rate, args.seconds)
                    results[(conns, load, s.name)] = row
                    print(
                        f"  {conns:>5} connections {load:<10} {s.name:<6} {row.ops:8,.0f} cycles/s  p50 {row.p50_us:6,} µs  p99 {row.p99_us:7,} µs  "
                        f"server {row.server_us:6.0f} µs/cycle  memory {row.memory_mib:7.1f} MiB",
                        flush=True,
                    )
                    s.settle(timeout=60)
    report(args, "## Many clients (Nimbus against Samba)", table(results, args), MARK_BEGIN, MARK_END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
