#!/usr/bin/env python3
"""A contended open loop for data: many connections open and close one file
for reading, as a program's many users open its shared files (a binary,
a template, a configuration) at once.

Worker k logs on over its own connection to host k mod len(hosts) (SMB
3.0.2, NTLMv2 in SPNEGO, unsigned) and loops: CREATE of the one file
(GENERIC_READ, sharing read, write and delete, no oplock), CLOSE. Unlike
smbtorture's `smb2.bench.path-contention-shared`, which opens for
attributes only, every open here takes part in the sharing check and is
recorded among the file's opens. Messages are built by hand
(tests/rawsmb.py) so that the client spends as little CPU per open as
Python allows.

    python3 bench/data_open_loop.py --hosts 127.0.0.1 127.0.0.2 --port 4450 \
        --share data --user U --password P --name shared.dat \
        [--workers 4] [--seconds 5]

The file must exist. Prints opens per second.
"""

from __future__ import annotations

import sys
import time

from meta_loop import CLOSE, Client, client_parser, close_body, run_workers, totals
from rawsmb import HEADER_SIZE, create_body  # meta_loop put tests/ on the path
import rawsmb


def _worker(k: int, args: dict, start, results) -> None:
    host = args["hosts"][k % len(args["hosts"])]
    client = Client(host, args["port"])
    client.logon(args["user"], args["password"], f"\\\\{host}\\{args['share']}")
    body = create_body(args["name"])
    start.wait()
    t0 = time.monotonic()
    deadline = t0 + args["seconds"]
    done = 0
    while time.monotonic() < deadline:
        resp = client.call(rawsmb.CREATE, body)
        # An open that failed is no open: a rate that counted refusals
        # (or a server's "too much contention") would flatter the server.
        if rawsmb.status(resp) != 0:
            raise RuntimeError(f"worker {k}: open {done} failed: {rawsmb.status(resp):#010x}")
        closed = client.call(CLOSE, close_body(resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]))
        if rawsmb.status(closed) != 0:
            raise RuntimeError(f"worker {k}: close {done} failed: {rawsmb.status(closed):#010x}")
        done += 1
    results.put((done, time.monotonic() - t0))
    client.sock.close()


def run(hosts: list[str], port: int, share: str, user: str, password: str, name: str, workers: int, seconds: float) -> tuple[int, float]:
    """Runs the loop; returns (opens done, opens per second) over all workers."""
    args = dict(hosts=hosts, port=port, share=share, user=user, password=password, name=name, seconds=seconds)
    return totals(run_workers(_worker, args, workers, seconds))


def main() -> int:
    ap = client_parser(__doc__)
    ap.add_argument("--hosts", nargs="+", help="hosts the workers spread over (default: --host)")
    ap.add_argument("--name", required=True, help="the file, relative to the share")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args()
    _, rate = run(args.hosts or [args.host], args.port, args.share, args.user, args.password, args.name, args.workers, args.seconds)
    print(f"{rate:.0f} opens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
