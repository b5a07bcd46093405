#!/usr/bin/env python3
"""The floor under a file server's get: a sender that reads a file with
pread(2) in 8 MiB pieces (the largest READ smbclient asks for) and sends
each with send(2) over loopback TCP, with no protocol at all. Its CPU per
GiB is what any server pays for the two copies a get cannot avoid (page
cache to buffer, buffer to socket); bench/side_by_side.py puts it beside
plain get (issue 48: plain get at most 1.2 times this, measured in the
same run).

    python3 bench/bare_sender.py FILE

The sender runs in a process of its own and counts only its transfer
loop's CPU (getrusage around the loop, so the interpreter's start is not
charged); the receiver, in the calling process, reads into one buffer and
drops it, as smbclient's `get FILE /dev/null` does.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

CHUNK = 8 << 20
GIB = 1 << 30


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def send(path: str, port: int) -> None:
    """The sender: the whole file to 127.0.0.1:port; prints the loop's CPU
    seconds."""
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    buf = memoryview(bytearray(CHUNK))
    with socket.create_connection(("127.0.0.1", port)) as s:
        before = cpu_seconds()
        at = 0
        while at < size:
            n = os.preadv(fd, [buf], at)
            if n <= 0:
                break
            s.sendall(buf[:n])
            at += n
        spent = cpu_seconds() - before
    os.close(fd)
    print(f"{at} {spent:.6f}", flush=True)


def run(path: Path) -> tuple[float, float]:
    """One transfer of `path`; returns (MiB/s, sender CPU seconds per GiB)."""
    size = path.stat().st_size
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        sender = subprocess.Popen([sys.executable, __file__, "--send", str(path), str(port)], stdout=subprocess.PIPE, text=True)
        listener.settimeout(30)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            sender.kill()
            raise RuntimeError("the bare sender did not connect within 30 s") from None
        buf = memoryview(bytearray(CHUNK))
        got = 0
        start = time.monotonic()
        with conn:
            conn.settimeout(60)
            while got < size:
                n = conn.recv_into(buf)
                if n == 0:
                    break
                got += n
        elapsed = time.monotonic() - start
    out, _ = sender.communicate(timeout=60)
    if sender.returncode != 0 or got != size:
        raise RuntimeError(f"bare sender: exit {sender.returncode}, {got} of {size} bytes received, said {out!r}")
    sent, cpu = out.split()
    if int(sent) != size:
        raise RuntimeError(f"bare sender sent {sent} of {size} bytes")
    return size / (1 << 20) / elapsed, float(cpu) * GIB / size


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--send":
        send(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 2:
        mib_s, s_per_gib = run(Path(sys.argv[1]))
        print(f"{mib_s:.0f} MiB/s, sender {s_per_gib:.3f} s/GiB")
    else:
        sys.exit(__doc__)
