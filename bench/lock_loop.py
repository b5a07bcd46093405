#!/usr/bin/env python3
"""Byte-range lock and unlock pairs on one shared file, from several
connections at once (issue 13's bench row).

Each worker process logs on over its own connection (as bench/meta_loop.py
does: SMB 3.0.2, NTLMv2 in SPNEGO, unsigned), opens the same file `locks.bin`
and loops: LOCK an exclusive 8-byte range of its own (offset 16 k,
FAIL_IMMEDIATELY), then UNLOCK it. The ranges do not overlap, so no request
waits: what is measured is the server's cost of keeping one file's lock list
that every connection changes.

    python3 bench/lock_loop.py --port 4450 --share data --user U --password P \
        [--workers 4] [--seconds 10]

The file must exist (`prepare(share_dir)`). Prints lock+unlock pairs per second.
"""

from __future__ import annotations

import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import meta_loop  # noqa: E402
from meta_loop import HEADER_SIZE, rawsmb  # noqa: E402

LOCK = 0x000A
EXCLUSIVE, UNLOCK, FAIL_IMMEDIATELY = 0x2, 0x4, 0x10
FILE = "locks.bin"


def prepare(share_dir: Path) -> None:
    (Path(share_dir) / FILE).write_bytes(bytes(4096))


def lock_body(file_id: bytes, offset: int, flags: int) -> bytes:
    """MS-SMB2 2.2.26 LOCK with one 2.2.26.1 element of 8 bytes."""
    return struct.pack("<HHI16sQQII", 48, 1, 0, file_id, offset, 8, flags, 0)


def _worker(k: int, args: dict, start, results) -> None:
    client = meta_loop.Client(args["host"], args["port"])
    client.logon(args["user"], args["password"], f"\\\\{args['host']}\\{args['share']}")
    resp = client.call(rawsmb.CREATE, rawsmb.create_body(FILE))
    file_id = resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]
    lock = lock_body(file_id, 16 * k, EXCLUSIVE | FAIL_IMMEDIATELY)
    unlock = lock_body(file_id, 16 * k, UNLOCK)
    start.wait()
    t0 = time.monotonic()
    deadline = t0 + args["seconds"]
    done = 0
    while time.monotonic() < deadline:
        for _ in range(100):
            client.call(LOCK, lock)
            client.call(LOCK, unlock)
        done += 100
    results.put((done, time.monotonic() - t0))
    client.sock.close()


def run(host: str, port: int, share: str, user: str, password: str, workers: int = 4, seconds: float = 10.0) -> tuple[int, float]:
    """Runs the loop; returns (pairs done, pairs per second) over all workers."""
    args = dict(host=host, port=port, share=share, user=user, password=password, seconds=seconds)
    done = meta_loop.run_workers(_worker, args, workers, seconds)
    return meta_loop.totals(done)


def main() -> int:
    ap = meta_loop.client_parser(__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    done, rate = run(a.host, a.port, a.share, a.user, a.password, a.workers, a.seconds)
    print(f"{done} lock/unlock pairs, {rate:.0f} pairs/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
