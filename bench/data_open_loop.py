#!/usr/bin/env python3
"""A contended open loop for data: many connections open and close one file
for reading, as a program's many users open its shared files (a binary,
a template, a configuration) at once.

Worker k logs on over its own connection to host k mod len(hosts) (SMB
3.0.2, NTLMv2 in SPNEGO, unsigned) and loops: CREATE of the one file
(GENERIC_READ, sharing read, write and delete, no oplock), CLOSE. Unlike
smbtorture's `smb2.bench.path-contention-shared`, which opens for
attributes only, every open here takes part in the sharing check and is
recorded among the file's opens. With `--lease`, each worker asks for a
read and handle lease of its own (RH, as Windows asks when it opens a
file for reading): every open is then granted one, and every close lets
it go. Messages are built by hand (tests/rawsmb.py) so that the client
spends as little CPU per open as Python allows.

    python3 bench/data_open_loop.py --hosts 127.0.0.1 127.0.0.2 --port 4450 \
        --share data --user U --password P --name shared.dat \
        [--workers 4] [--seconds 5] [--lease]

The file must exist. Prints opens per second.

With `--create`, worker k makes files of its own instead: CREATE of a
new file `<name>-<k>-<i>` (FILE_CREATE, delete on close), CLOSE, which
deletes it. Each pair is two changes a directory watch would hear of (a
name added, a name removed), as a build or an unpacked archive makes;
nothing is contended. The directory of `<name>` must exist.
"""

from __future__ import annotations

import struct
import sys
import time

from meta_loop import CLOSE, Client, client_parser, close_body, run_workers, totals
from rawsmb import HEADER_SIZE, create_body  # meta_loop put tests/ on the path
import rawsmb

GENERIC_READ = 0x80000000


def new_file_body(name: str) -> bytes:
    """MS-SMB2 2.2.13 SMB2 CREATE Request: make a new file, deleted when
    closed (DesiredAccess GENERIC_WRITE | DELETE, ShareAccess none,
    CreateDisposition FILE_CREATE, CreateOptions NON_DIRECTORY_FILE |
    DELETE_ON_CLOSE)."""
    n = name.encode("utf-16-le")
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, 0x40010000, 0x80, 0, 2, 0x1040, HEADER_SIZE + 56, len(n), 0, 0) + n


def _worker(k: int, args: dict, start, results) -> None:
    host = args["hosts"][k % len(args["hosts"])]
    client = Client(host, args["port"])
    client.logon(args["user"], args["password"], f"\\\\{host}\\{args['share']}")
    body = create_body(args["name"])
    if args.get("lease"):
        import test_oplocks as ops  # tests/ is on the path (meta_loop)

        key = k.to_bytes(8, "little") + b"data-open-loop"[:8]
        body = ops.create_body(
            args["name"], oplock=ops.LEVEL_LEASE, access=GENERIC_READ, contexts=ops.lease_context(key, ops.R | ops.H)
        )
    start.wait()
    t0 = time.monotonic()
    deadline = t0 + args["seconds"]
    done = 0
    while time.monotonic() < deadline:
        if args.get("create"):
            body = new_file_body(f"{args['name']}-{k}-{done}")
        resp = client.call(rawsmb.CREATE, body)
        # An open that failed is no open: a rate that counted refusals
        # (or a server's "too much contention") would flatter the server.
        if rawsmb.status(resp) != 0:
            raise RuntimeError(f"worker {k}: open {done} failed: {rawsmb.status(resp):#010x}")
        # OplockLevel (MS-SMB2 2.2.14): a lease asked for must be granted,
        # or the loop measures something else.
        if args.get("lease") and resp[HEADER_SIZE + 2] != 0xFF:
            raise RuntimeError(f"worker {k}: open {done} was granted no lease")
        closed = client.call(CLOSE, close_body(resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]))
        if rawsmb.status(closed) != 0:
            raise RuntimeError(f"worker {k}: close {done} failed: {rawsmb.status(closed):#010x}")
        done += 1
    results.put((done, time.monotonic() - t0))
    client.sock.close()


def run(
    hosts: list[str],
    port: int,
    share: str,
    user: str,
    password: str,
    name: str,
    workers: int,
    seconds: float,
    lease: bool = False,
    create: bool = False,
) -> tuple[int, float]:
    """Runs the loop; returns (opens done, opens per second) over all workers."""
    args = dict(hosts=hosts, port=port, share=share, user=user, password=password, name=name, seconds=seconds, lease=lease, create=create)
    return totals(run_workers(_worker, args, workers, seconds))


def main() -> int:
    ap = client_parser(__doc__)
    ap.add_argument("--hosts", nargs="+", help="hosts the workers spread over (default: --host)")
    ap.add_argument("--name", required=True, help="the file, relative to the share")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--lease", action="store_true", help="each worker asks for an RH lease of its own")
    ap.add_argument("--create", action="store_true", help="each worker makes and deletes files of its own")
    args = ap.parse_args()
    hosts = args.hosts or [args.host]
    _, rate = run(hosts, args.port, args.share, args.user, args.password, args.name, args.workers, args.seconds, args.lease, args.create)
    print(f"{rate:.0f} opens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
