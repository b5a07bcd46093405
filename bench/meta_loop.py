#!/usr/bin/env python3
"""A non-contended metadata loop: open, stat and close many files, as fast as
one synchronous request at a time allows, from several connections at once.

Each worker process logs on over its own connection (SMB 3.0.2, NTLMv2 in
SPNEGO, unsigned) and loops over its own directory `w<k>/` of files
`f<i>`: CREATE (open the existing file), QUERY_INFO FileAllInformation,
CLOSE. No two workers touch the same file, so the server's share-mode and
lease bookkeeping is never contended; what is measured is its cost per
request. Messages are built by hand (tests/rawsmb.py) so that the client
spends as little CPU per request as Python allows.

    python3 bench/meta_loop.py --port 4450 --share data --user U --password P \
        [--workers 4] [--files 200] [--seconds 10]

The files must exist: `prepare(share_dir, workers, files)` creates them
directly on the server's disk (bench/side_by_side.py does). Prints requests
per second.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import rawsmb  # noqa: E402
from rawsmb import HEADER_SIZE, frame, header, recv_message, status  # noqa: E402

import spnego  # noqa: E402  (pyspnego, a dependency of smbprotocol)

QUERY_INFO, CLOSE = 0x0010, 0x0006
SMB2_FLAGS_ASYNC = 0x2
STATUS_PENDING = 0x00000103
STATUS_MORE_PROCESSING_REQUIRED = 0xC0000016
# Up to 3.0.2: at 3.1.1 Samba refuses an unsigned TREE_CONNECT, and signing
# it would take the whole key derivation here. What follows the tree connect
# (unsigned CREATE, QUERY_INFO, CLOSE) is the same at every 3.x dialect.
DIALECTS = [0x0202, 0x0210, 0x0300, 0x0302]


def prepare(share_dir: Path, workers: int, files: int) -> None:
    """Create `files` small files in w0..w<workers-1> beneath the share."""
    for k in range(workers):
        d = Path(share_dir) / f"w{k}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(files):
            (d / f"f{i}").write_bytes(b"x" * 100)


def query_info_body(file_id: bytes) -> bytes:
    """MS-SMB2 2.2.37 SMB2 QUERY_INFO Request: FileAllInformation (MS-FSCC 2.4.2)."""
    return struct.pack("<HBBIHHIII16s", 41, 1, 18, 4096, 0, 0, 0, 0, 0, file_id) + b"\0"


def close_body(file_id: bytes) -> bytes:
    """MS-SMB2 2.2.15 SMB2 CLOSE Request."""
    return struct.pack("<HHI16s", 24, 0, 0, file_id)


class Client:
    """One connection with one session and one tree, one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = rawsmb.connect(host, port)
        self.host = host
        self.message_id = 0
        self.session_id = 0
        self.tree_id = 0

    def send(self, command: int, body: bytes) -> int:
        """Sends one request without waiting; returns its MessageId."""
        mid = self.message_id
        self.message_id += 1
        self.sock.sendall(frame(header(command, mid, tree_id=self.tree_id, session_id=self.session_id) + body))
        return mid

    def call(self, command: int, body: bytes, expect=(0,)) -> bytes:
        self.send(command, body)
        while True:
            resp = recv_message(self.sock)
            flags = struct.unpack_from("<I", resp, 16)[0]
            if status(resp) == STATUS_PENDING and flags & SMB2_FLAGS_ASYNC:
                continue  # an interim response; the final one follows
            if status(resp) not in expect:
                raise RuntimeError(f"command {command:#x} failed: status {status(resp):#010x}")
            return resp

    def logon(self, user: str, password: str, share_unc: str, capabilities: int = 0) -> None:
        """NEGOTIATE (with `capabilities`, MS-SMB2 2.2.3), an NTLMv2 SESSION_SETUP, TREE_CONNECT."""
        body = bytearray(rawsmb.negotiate_body(DIALECTS))
        struct.pack_into("<I", body, 8, capabilities)
        self.call(rawsmb.NEGOTIATE, bytes(body))
        # The target name must be this server (cifs/ADDRESS): Nimbus refuses an NTLM
        # logon addressed to another host as a possible relay.
        ctx = spnego.client(user, password, hostname=self.host, service="cifs", protocol="negotiate", options=spnego.NegotiateOptions.use_ntlm)
        token = ctx.step()
        while True:
            resp = self.call(rawsmb.SESSION_SETUP, rawsmb.session_setup_body(token), expect=(0, STATUS_MORE_PROCESSING_REQUIRED))
            self.session_id = rawsmb.session_id(resp)
            offset, length = struct.unpack_from("<HH", resp, HEADER_SIZE + 4)
            if status(resp) == 0:
                break
            token = ctx.step(resp[offset : offset + length])
        resp = self.call(rawsmb.TREE_CONNECT, rawsmb.tree_connect_body(share_unc))
        self.tree_id = struct.unpack_from("<I", resp, 36)[0]

    def stat_file(self, name: str) -> None:
        resp = self.call(rawsmb.CREATE, rawsmb.create_body(name))
        file_id = resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]
        self.call(QUERY_INFO, query_info_body(file_id))
        self.call(CLOSE, close_body(file_id))


def _worker(k: int, args: dict, start, results) -> None:
    client = Client(args["host"], args["port"])
    client.logon(args["user"], args["password"], f"\\\\{args['host']}\\{args['share']}")
    names = [f"w{k}\\f{i}" for i in range(args["files"])]
    start.wait()
    t0 = time.monotonic()
    deadline = t0 + args["seconds"]
    done = 0
    while time.monotonic() < deadline:
        for name in names:
            client.stat_file(name)
        done += len(names)
    results.put((3 * done, time.monotonic() - t0))
    client.sock.close()


def run_workers(worker, args: dict, workers: int, seconds: float) -> list[tuple[int, float]]:
    """Starts `workers` processes of `worker(k, args, start, results)`, lets
    them go together once all have logged on (the barrier `start`), and
    returns what each put in `results`: (operations done, seconds taken)."""
    start = multiprocessing.Barrier(workers + 1)
    results = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=worker, args=(k, args, start, results)) for k in range(workers)]
    for p in procs:
        p.start()
    try:
        start.wait(timeout=60)
    except Exception:
        for p in procs:
            p.kill()
        raise RuntimeError("a worker failed to log on (see its traceback above)")
    done = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError("a worker failed (see its traceback above)")
    return done


def client_parser(doc: str) -> argparse.ArgumentParser:
    """The command line every loop of bench/ shares: where the server is
    and whom to log on as (the password also from BENCH_PASSWORD)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--share", required=True)
    ap.add_argument("--user", required=True)
    ap.add_argument("--password", default=os.environ.get("BENCH_PASSWORD", ""))
    return ap


def totals(done: list[tuple[int, float]]) -> tuple[int, float]:
    """Workers' (operations, seconds) as (operations, operations per second)."""
    return sum(n for n, _ in done), sum(n / t for n, t in done)


def run(host: str, port: int, share: str, user: str, password: str, workers: int = 4, files: int = 200, seconds: float = 10.0) -> tuple[int, float]:
    """Runs the loop; returns (requests done, requests per second) over all
    workers. CREATE, QUERY_INFO and CLOSE each count one."""
    args = dict(host=host, port=port, share=share, user=user, password=password, files=files, seconds=seconds)
    done = run_workers(_worker, args, workers, seconds)
    return totals(done)


def main() -> int:
    ap = client_parser(__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    _, rate = run(args.host, args.port, args.share, args.user, args.password, args.workers, args.files, args.seconds)
    print(f"{rate:.0f} requests/s ({rate / 3:.0f} files opened, queried and closed per second)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
