#!/usr/bin/env python3
"""Logons per second: connect, NEGOTIATE, an NTLMv2 SESSION_SETUP (SPNEGO),
LOGOFF, disconnect, over and over, from several processes at once.

What a server spends on a logon (the NTLM response checked against the
user database, the session and its keys set up and torn down) is what this
measures; the client's Python spends more per logon than either server, so
the server CPU per logon (bench/side_by_side.py reads it from /proc) is the
figure to compare, more than the rate.

    python3 bench/logon_loop.py --port 4450 --share data --user U --password P \
        [--workers 4] [--seconds 10]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from meta_loop import Client, client_parser, run_workers, totals  # noqa: E402

LOGOFF = 0x0002


def logoff_body() -> bytes:
    """MS-SMB2 2.2.7 SMB2 LOGOFF Request."""
    return b"\x04\x00\x00\x00"


def one_logon(host: str, port: int, user: str, password: str, share: str) -> None:
    client = Client(host, port)
    try:
        client.logon(user, password, f"\\\\{host}\\{share}")
        client.call(LOGOFF, logoff_body())
    finally:
        client.sock.close()


def _worker(k: int, args: dict, start, results) -> None:
    # One logon first, so that a wrong password fails before the barrier.
    one_logon(args["host"], args["port"], args["user"], args["password"], args["share"])
    start.wait()
    t0 = time.monotonic()
    deadline = t0 + args["seconds"]
    done = 0
    while time.monotonic() < deadline:
        one_logon(args["host"], args["port"], args["user"], args["password"], args["share"])
        done += 1
    results.put((done, time.monotonic() - t0))


def run(host: str, port: int, share: str, user: str, password: str, workers: int = 4, seconds: float = 10.0) -> tuple[int, float]:
    """Runs the loop; returns (logons done, logons per second) over all workers."""
    args = dict(host=host, port=port, share=share, user=user, password=password, seconds=seconds)
    return totals(run_workers(_worker, args, workers, seconds))


def main() -> int:
    ap = client_parser(__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    _, rate = run(args.host, args.port, args.share, args.user, args.password, args.workers, args.seconds)
    print(f"{rate:.0f} logons/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
