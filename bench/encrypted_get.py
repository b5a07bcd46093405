#!/usr/bin/env python3
"""Server CPU per GiB of a 1 GiB smbclient `get`, clear and encrypted.

Checks the data-path target of SMB3 encryption: the server's CPU seconds per
GiB for an encrypted (AES-128-GCM) get should be at most
1.3 x (the provider's raw AES-128-GCM seconds per GiB + nimbus's own
unencrypted get seconds per GiB), i.e. encryption adds little beyond the
cipher itself (no extra copies, no per-request allocation).

    python3 bench/encrypted_get.py [--rounds 3] [--size-mib 1024] [--nimbus target/release/nimbus]

Runs nimbus on 127.0.0.1 with a share on /dev/shm (tmpfs, so the disk does
not matter), alternates clear and encrypted rounds, and prints medians.
Server CPU is user+sys of the nimbus process from /proc, before and after
each transfer. The raw cipher cost comes from `nimbus bench crypto`
(AES-128-GCM of the default provider at 1 MiB).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from netutil import free_port, wait_listening

REPO = Path(__file__).resolve().parent.parent
GIB = 1 << 30
USER, PASSWORD = "bench", "Bench-Passw0rd"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def raw_gcm_seconds_per_gib(nimbus: str) -> float:
    out = subprocess.run([nimbus, "bench", "crypto", "--millis", "500"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 2 and cells[0] == "AES-128-GCM" and cells[1] == "1 MiB":
            gb_per_s = float(cells[2])  # the default provider's column
            return GIB / (gb_per_s * 1e9)
    sys.exit("no AES-128-GCM row in `nimbus bench crypto`")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--nimbus", default=str(REPO / "target" / "release" / "nimbus"))
    args = ap.parse_args()
    if not shutil.which("smbclient"):
        sys.exit("smbclient is needed (apt-get install smbclient)")
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=shm) as tmp:
        tmp = Path(tmp)
        share = tmp / "share"
        share.mkdir()
        size = args.size_mib << 20
        with open(share / "big.bin", "wb") as f:
            chunk = os.urandom(1 << 20)
            for _ in range(args.size_mib):
                f.write(chunk)
        db = tmp / "users.db"
        subprocess.run([args.nimbus, "user", "add", USER, "--db", str(db), "--password-stdin"], input=PASSWORD + "\n", text=True, check=True, capture_output=True)
        port = free_port()
        server = subprocess.Popen(
            [args.nimbus, "serve", "--listen", f"127.0.0.1:{port}", "--user-db", str(db), "--share", f"data={share}", "--signing", "auto"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_listening(port, server, "nimbus")
            modes = {
                "clear": ["--client-protection=off"],
                "AES-128-GCM": ["--client-protection=encrypt", "--option=client smb3 encryption algorithms=AES-128-GCM"],
            }
            results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
            for _ in range(args.rounds):
                for mode, opts in modes.items():
                    before = cpu_seconds(server.pid)
                    t0 = time.monotonic()
                    proc = subprocess.run(
                        ["smbclient", "//127.0.0.1/data", "-p", str(port), "-U", f"{USER}%{PASSWORD}", "-m", "SMB3_11", *opts, "-c", "get big.bin /dev/null"],
                        capture_output=True, text=True, timeout=600,
                    )  # fmt: skip
                    elapsed = time.monotonic() - t0
                    if proc.returncode != 0 or "NT_STATUS" in proc.stdout + proc.stderr:
                        sys.exit(f"smbclient failed ({mode}):\n{proc.stdout}{proc.stderr}")
                    cpu = cpu_seconds(server.pid) - before
                    results[mode].append((cpu * GIB / size, size / elapsed / (1 << 20)))
        finally:
            server.terminate()
            server.wait(timeout=10)
    raw = raw_gcm_seconds_per_gib(args.nimbus)
    med = {m: (statistics.median(c for c, _ in r), statistics.median(t for _, t in r)) for m, r in results.items()}
    clear_cpu, enc_cpu = med["clear"][0], med["AES-128-GCM"][0]
    bound = 1.3 * (raw + clear_cpu)
    print(f"smbclient get of {args.size_mib} MiB, SMB 3.1.1, median of {args.rounds} rounds")
    print(f"| mode        | server CPU s/GiB | MiB/s  |")
    print(f"|-------------|------------------|--------|")
    for m, (cpu, mibs) in med.items():
        print(f"| {m:<11} | {cpu:16.3f} | {mibs:6.0f} |")
    print(f"raw AES-128-GCM (default provider, 1 MiB): {raw:.3f} s/GiB")
    print(f"target: encrypted <= 1.3 x (raw + clear) = {bound:.3f} s/GiB; measured {enc_cpu:.3f} "
          f"({enc_cpu / (raw + clear_cpu):.2f} x (raw + clear)): {'met' if enc_cpu <= bound else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
