#!/usr/bin/env python3
"""Open/close with durable v2 handles: what asking for a durable handle
costs on the open path, against the same loop without one.

Each worker process logs on as bench/meta_loop.py does (SMB 3.0.2, NTLMv2
in SPNEGO, unsigned) and loops over its own files `w<k>/f<i>`: CREATE with
a batch oplock and, in `durable` mode, a DH2Q context (MS-SMB2 2.2.13.2.11:
a fresh CreateGuid per open, timeout 0: the server's default), then CLOSE.
In `durable` mode every response must carry the DH2Q answer, or the run
stops: a server that grants no durability would be measured doing less.
In `persistent` mode the DH2Q asks for a persistent handle (the share must
be continuously available), and the answer must say it is one. In `plain`
mode the same CREATE goes without the context. No two workers
touch the same file.

    python3 bench/durable_loop.py --port 4450 --share data --user U --password P \
        [--mode durable|persistent|plain] [--workers 4] [--files 200] [--seconds 10]

The files must exist (`meta_loop.prepare`). Prints open+close pairs per
second.
"""

from __future__ import annotations

import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import meta_loop  # noqa: E402  (puts tests/ on sys.path)
from meta_loop import CLOSE, HEADER_SIZE, close_body, rawsmb  # noqa: E402

BATCH = 0x09
CREATE_FIXED = 56  # MS-SMB2 2.2.13: the CREATE request before its Buffer


class BenchError(RuntimeError):
    """The server did not behave as the measurement needs."""


def create_body(name: str, durable: bool, persistent: bool = False) -> bytes:
    """MS-SMB2 2.2.13 CREATE: open an existing file for reading with a batch
    oplock; with `durable`, one DH2Q create context (2.2.13.2, 2.2.13.2.11),
    asking for a persistent handle with `persistent`."""
    n = name.encode("utf-16-le")
    contexts = b""
    ctx_offset = 0
    if durable:
        # Next, NameOffset, NameLength, Reserved, DataOffset, DataLength,
        # "DH2Q" and 4 bytes of padding, then Timeout, Flags, Reserved,
        # CreateGuid.
        data = struct.pack("<IIQ16s", 0, 2 if persistent else 0, 0, uuid.uuid4().bytes_le)
        contexts = struct.pack("<IHHHHI", 0, 16, 4, 0, 24, len(data)) + b"DH2Q" + b"\0" * 4 + data
        ctx_offset = HEADER_SIZE + CREATE_FIXED + len(n)
        ctx_offset += -ctx_offset % 8
    fixed = struct.pack(
        "<HBBIQQIIIIIHHII",
        57, 0, BATCH, 2, 0, 0,
        0x80000000,  # GENERIC_READ
        0, 7, 1, 0x40,  # attributes, share all, OPEN, NON_DIRECTORY_FILE
        HEADER_SIZE + CREATE_FIXED, len(n), ctx_offset, len(contexts),
    )
    body = fixed + n
    if durable:
        body += b"\0" * (ctx_offset - HEADER_SIZE - len(body)) + contexts
    return body


def granted_durable(resp: bytes, persistent: bool = False) -> bool:
    """Whether a CREATE response (MS-SMB2 2.2.14) carries a DH2Q answer
    (with the persistent flag, when asked)."""
    off, length = struct.unpack_from("<II", resp, HEADER_SIZE + 80)
    contexts = resp[off : off + length]
    at = contexts.find(b"DH2Q")
    if length == 0 or at < 0:
        return False
    # The name is followed by 4 bytes of padding, then Timeout and Flags.
    flags = struct.unpack_from("<I", contexts, at + 8 + 4)[0]
    return not persistent or flags & 2 != 0


def _worker(k: int, args: dict, start, results) -> None:
    client = meta_loop.Client(args["host"], args["port"])
    client.logon(args["user"], args["password"], f"\\\\{args['host']}\\{args['share']}")
    names = [f"w{k}\\f{i}" for i in range(args["files"])]
    durable = args["mode"] in ("durable", "persistent")
    persistent = args["mode"] == "persistent"
    start.wait()
    t0 = time.monotonic()
    deadline = t0 + args["seconds"]
    done = 0
    while time.monotonic() < deadline:
        for name in names:
            resp = client.call(rawsmb.CREATE, create_body(name, durable, persistent))
            if durable and not granted_durable(resp, persistent):
                raise BenchError(f"the server granted no {args['mode']} handle with a batch oplock")
            client.call(CLOSE, close_body(resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]))
        done += len(names)
    results.put((done, time.monotonic() - t0))
    client.sock.close()


def run(host: str, port: int, share: str, user: str, password: str, mode: str, workers: int = 4, files: int = 200, seconds: float = 10.0) -> tuple[int, float]:
    """Runs the loop; returns (pairs done, open+close pairs per second)."""
    args = dict(host=host, port=port, share=share, user=user, password=password, files=files, seconds=seconds, mode=mode)
    done = meta_loop.run_workers(_worker, args, workers, seconds)
    return meta_loop.totals(done)


def main() -> int:
    ap = meta_loop.client_parser(__doc__)
    ap.add_argument("--mode", choices=["durable", "persistent", "plain"], default="durable")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    _, rate = run(args.host, args.port, args.share, args.user, args.password, args.mode, args.workers, args.files, args.seconds)
    print(f"{rate:.0f} open+close pairs/s ({args.mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
