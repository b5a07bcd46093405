#!/usr/bin/env python3
"""Lease break round trip: how long an open waits while the server breaks
another client's lease and that client acknowledges at once.

Two connections, each logged on as bench/meta_loop.py does (SMB 3.0.2,
NTLMv2 in SPNEGO, unsigned), both announcing the LEASING capability, each
with its own ClientGuid. Each iteration:

  1. A opens `lease.bin` asking for an RWH lease (a lease v2 "RqLs" context
     with a fresh lease key); the response must grant R|W|H, or the run
     stops: a server that grants less breaks nothing and the figure would
     mean nothing.
  2. B opens the same file for read and write, sharing read and write, with
     no lease: A's write caching must go (RWH to RH, acknowledgement
     required), so B's CREATE waits for the break.
  3. A reads the LEASE_BREAK notification and acknowledges it at once.
  4. B's final CREATE response arrives (Nimbus answers STATUS_PENDING
     first; whatever comes between is skipped).
  5. Both close.

Measured: B's CREATE from the moment it is sent to its final response, so
the server's break, the client's reading and acknowledging it and the
server's resuming the open are all inside. The first --warmup iterations are
dropped; median and p99 of the rest, in microseconds.

    python3 bench/lease_break.py --port 4450 --share data --user U --password P \
        [--iterations 300] [--warmup 20]

Message layouts for leases are tests/test_oplocks.py's (it tests them).
"""

from __future__ import annotations

import statistics
import struct
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import meta_loop  # noqa: E402  (puts tests/ on sys.path)
import test_oplocks as ops  # noqa: E402
from meta_loop import HEADER_SIZE, close_body, rawsmb  # noqa: E402

FILE = "lease.bin"
LEASING, LARGE_MTU = 0x2, 0x4  # MS-SMB2 2.2.3 Capabilities
RWH = ops.R | ops.W | ops.H
SHARE_READ_WRITE = 0x3
# Iterations dropped at the start: the first opens of the file and the first
# breaks of each connection are slower on both servers (caches, allocations).
WARMUP = 20


class BenchError(RuntimeError):
    """The server did not behave as the measurement needs."""


def prepare(share_dir: Path) -> None:
    (Path(share_dir) / FILE).write_bytes(bytes(4096))


def _connect(host: str, port: int, share: str, user: str, password: str) -> meta_loop.Client:
    client = meta_loop.Client(host, port)
    # negotiate_body gives each connection a random ClientGuid: A and B are
    # different clients, so B's open is not covered by A's lease.
    client.logon(user, password, f"\\\\{host}\\{share}", capabilities=LEASING | LARGE_MTU)
    return client


def _recv_lease_break(client: meta_loop.Client, key: bytes) -> int:
    """Reads A's next message, which must be a LEASE_BREAK notification
    (MS-SMB2 2.2.23.2) of `key` asking for an acknowledgement; returns the
    new lease state."""
    msg = rawsmb.recv_message(client.sock)
    if ops.command_of(msg) != ops.OPLOCK_BREAK or ops.message_id(msg) != ops.BREAK_MESSAGE_ID:
        raise BenchError(f"expected a lease break, got command {ops.command_of(msg):#x} status {rawsmb.status(msg):#x}")
    size, _epoch, flags, got_key, current, new = struct.unpack_from("<HHI16sII", msg, HEADER_SIZE)
    if (size, got_key, current) != (44, key, RWH) or not flags & ops.LEASE_BREAK_ACK_REQUIRED:
        raise BenchError(f"unexpected lease break: size {size}, flags {flags:#x}, state {current:#x} -> {new:#x}")
    return new


def _final(client: meta_loop.Client, mid: int) -> bytes:
    """The final response of request `mid` (interim STATUS_PENDING skipped)."""
    while True:
        resp = rawsmb.recv_message(client.sock)
        if ops.message_id(resp) != mid:
            raise BenchError(f"unexpected message {ops.message_id(resp):#x} on B's connection")
        if rawsmb.status(resp) == meta_loop.STATUS_PENDING and ops.flags_of(resp) & ops.FLAG_ASYNC:
            continue
        return resp


def run(host: str, port: int, share: str, user: str, password: str, iterations: int = 300, warmup: int = WARMUP) -> tuple[float, float]:
    """Runs the loop; returns (median, p99) of B's CREATE latency in µs."""
    a = _connect(host, port, share, user, password)
    b = _connect(host, port, share, user, password)
    opener = ops.create_body(FILE, share=SHARE_READ_WRITE)
    samples = []
    try:
        for i in range(iterations):
            key = uuid.uuid4().bytes
            resp = a.call(rawsmb.CREATE, ops.create_body(FILE, oplock=ops.LEVEL_LEASE, contexts=ops.lease_context(key, RWH)))
            if ops.oplock_level_of(resp) != ops.LEVEL_LEASE:
                raise BenchError(f"A asked for a lease and got oplock level {ops.oplock_level_of(resp):#x}")
            _, state, _, _ = ops.lease_of(resp)
            if state != RWH:
                raise BenchError(f"A asked for an RWH lease and got {state:#x} (iteration {i})")
            fa = ops.file_id_of(resp)

            t0 = time.perf_counter_ns()
            mid = b.send(rawsmb.CREATE, opener)
            new_state = _recv_lease_break(a, key)
            a_ack = a.send(ops.OPLOCK_BREAK, ops.lease_ack_body(key, new_state))
            final = _final(b, mid)
            t1 = time.perf_counter_ns()

            if rawsmb.status(final) != 0:
                raise BenchError(f"B's CREATE ended with status {rawsmb.status(final):#x}")
            ack = rawsmb.recv_message(a.sock)
            if ops.message_id(ack) != a_ack or rawsmb.status(ack) != 0:
                raise BenchError(f"the acknowledgement got status {rawsmb.status(ack):#x}")
            b.call(meta_loop.CLOSE, close_body(ops.file_id_of(final)))
            a.call(meta_loop.CLOSE, close_body(fa))
            if i >= warmup:
                samples.append((t1 - t0) / 1000)
    finally:
        a.sock.close()
        b.sock.close()
    if len(samples) < 2:
        raise BenchError(f"{iterations} iterations with {warmup} of warm-up leave no samples")
    p99 = statistics.quantiles(samples, n=100, method="inclusive")[98]
    return statistics.median(samples), p99


def main() -> int:
    ap = meta_loop.client_parser(__doc__)
    ap.add_argument("--iterations", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=WARMUP)
    a = ap.parse_args()
    median, p99 = run(a.host, a.port, a.share, a.user, a.password, a.iterations, a.warmup)
    print(f"lease break round trip: median {median:.0f} µs, p99 {p99:.0f} µs ({a.iterations - a.warmup} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
