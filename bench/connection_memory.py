#!/usr/bin/env python3
"""Server memory under many connections (issue 5): the resident set of the
nimbus process, from /proc, with

  1. 1,000 idle connections, each negotiated, logged on (anonymously, to a
     guest share) and tree-connected, as mapped drives sit all day;
  2. 100 connections, each holding as many outstanding 8 MiB READs as its
     credits allow, with the client reading no response: the worst a client
     can do to the server's memory without breaking a rule. What is held is
     bounded by limits.max_connection_memory_bytes per connection.

Runs the release binary with the default [limits] (raised connection
counts for phase 1 only). Prints a table and, with --write, appends it to
BENCHMARKS.md.

    python3 bench/connection_memory.py [--write]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from netutil import free_port

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import rawsmb  # noqa: E402

MIB = 1024 * 1024


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


@contextlib.contextmanager
def nimbus(tmp: Path, limits: dict[str, int]):
    binary = ROOT / "target" / "release" / "nimbus"
    if not binary.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "nimbus"], cwd=ROOT, check=True)
    share = tmp / "share"
    share.mkdir(exist_ok=True)
    (share / "big.bin").write_bytes(os.urandom(8 * MIB))
    subprocess.run([str(binary), "user", "add", "bench", "--db", str(tmp / "users.db"), "--password-stdin"], input="bench-password\n", text=True, check=True, stdout=subprocess.DEVNULL)
    port = free_port()
    conf = tmp / "nimbus.toml"
    lines = [f'listen = ["127.0.0.1:{port}"]', f'user_db = "{tmp}/users.db"', "[security]", 'signing = "auto"', "[limits]"]
    lines += [f"{k} = {v}" for k, v in limits.items()]
    lines += ["[[share]]", 'name = "data"', f'path = "{share}"', "guest_ok = true"]
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([str(binary), "serve", "--config", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            time.sleep(0.1)
        time.sleep(0.3)
        yield proc, port
    finally:
        proc.terminate()
        proc.wait()


def logged_on(port: int, source: str):
    """A connection negotiated, logged on and tree-connected; returns
    (socket, session id, tree id, next message id)."""
    s = rawsmb.connect("127.0.0.1", port, source=source)
    rawsmb.negotiate(s, credit_request=64)
    sid, mid = rawsmb.anonymous_logon(s, 1)
    tid = rawsmb.tree_connect(s, mid, sid, r"\\127.0.0.1\data")
    return s, sid, tid, mid + 1


def idle_connections(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, nimbus(Path(tmp), {"max_connections": 2 * n, "max_connections_per_address": 2 * n}) as (proc, port):
        base, _ = rss_kib(proc.pid)
        socks = []
        try:
            for i in range(n):
                socks.append(logged_on(port, "127.0.0.1")[0])
            time.sleep(7)  # idle long enough for spare buffers to be trimmed
            rss, hwm = rss_kib(proc.pid)
        finally:
            for s in socks:
                s.close()
        return {"connections": n, "base_kib": base, "rss_kib": rss, "hwm_kib": hwm}


def outstanding_reads(n: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp, nimbus(Path(tmp), {}) as (proc, port):
        base, _ = rss_kib(proc.pid)
        socks = []
        sent = 0
        try:
            for _ in range(n):
                s, sid, tid, mid = logged_on(port, "127.0.0.1")
                file_id = rawsmb.open_file(s, mid, sid, tid, "big.bin")
                mid += 1
                # Gather credits: each ECHO asks for as many as the window
                # holds. Counted from the ECHOs alone (plus the one credit
                # surely left), which never overestimates.
                held = 1
                for _ in range(8):
                    s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, mid, credit_request=8192) + rawsmb.echo_body()))
                    mid += 1
                    held += rawsmb.credits_granted(rawsmb.recv_message(s)) - 1
                    if held >= 1024:
                        break
                # Every credit on 8 MiB reads (128 credits each); no response is read.
                s.setblocking(False)
                reads = 0
                while held >= 128:
                    msg = rawsmb.header(rawsmb.READ, mid, credit_charge=128, session_id=sid, tree_id=tid) + rawsmb.read_body(file_id, 0, 8 * MIB)
                    with contextlib.suppress(BlockingIOError):
                        s.sendall(rawsmb.frame(msg))
                    mid += 128
                    held -= 128
                    reads += 1
                sent += reads
                socks.append(s)
            time.sleep(5)
            rss, hwm = rss_kib(proc.pid)
        finally:
            for s in socks:
                s.close()
        return {"connections": n, "reads_sent": sent, "base_kib": base, "rss_kib": rss, "hwm_kib": hwm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="append the results to BENCHMARKS.md")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--busy", type=int, default=100)
    args = ap.parse_args()
    idle = idle_connections(args.idle)
    busy = outstanding_reads(args.busy)
    rows = [
        f"| {idle['connections']} idle connections (logged on, tree connected) | {idle['base_kib'] / 1024:.1f} MiB | {idle['rss_kib'] / 1024:.1f} MiB | {(idle['rss_kib'] - idle['base_kib']) / idle['connections']:.1f} KiB |",
        f"| {busy['connections']} connections with every credit on 8 MiB READs, responses unread ({busy['reads_sent']} reads sent) | {busy['base_kib'] / 1024:.1f} MiB | {busy['rss_kib'] / 1024:.1f} MiB (peak {busy['hwm_kib'] / 1024:.1f}) | {(busy['rss_kib'] - busy['base_kib']) / busy['connections'] / 1024:.1f} MiB |",
    ]
    table = "\n".join(["| load | server RSS before | server RSS under load | per connection |", "|---|---|---|---|", *rows])
    print(table)
    if args.write:
        text = (ROOT / "BENCHMARKS.md").read_text()
        section = (
            "\n## Server memory under many connections\n\n"
            "`python3 bench/connection_memory.py` (release build, default `[limits]`: "
            "max_connection_memory_bytes = 32 MiB per connection).\n\n" + table + "\n"
        )
        marker = "\n## Server memory under many connections\n"
        if marker in text:
            head, _, rest = text.partition(marker)
            tail = rest.split("\n## ", 1)
            text = head + section + ("\n## " + tail[1] if len(tail) > 1 else "")
        else:
            text += section
        (ROOT / "BENCHMARKS.md").write_text(text)


if __name__ == "__main__":
    main()
