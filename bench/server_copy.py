#!/usr/bin/env python3
"""Server-side copy against a client-side copy, Nimbus and Samba side by side.

Copies one file within a share in two ways, on Nimbus and on Samba in the
same run, with the same client (Debian's smbclient, SMB3_11, signed):

- server-side: `scopy big.bin copy.bin` (FSCTL_SRV_REQUEST_RESUME_KEY, then
  FSCTL_SRV_COPYCHUNK_WRITE 16 MiB at a time: the data never crosses the
  wire);
- client-side: `get big.bin` to a local file, then `put` it back as a new
  file (what a client without server-side copy does).

Each copy is checked byte for byte against the original on the share's disk.
Prints wall-clock medians and the ratios (client-side / server-side on each
server; Nimbus / Samba for each way), as a Markdown section for
BENCHMARKS.md.

    sudo python3 bench/server_copy.py [--size-mib 1024] [--rounds 3] [--nimbus target/release/nimbus]

The shares live beneath --dir (default: a temporary directory in /var/tmp,
on disk, as a user's share would be). Needs root (smbd serves files as the
logged-on user) and Debian's samba and smbclient packages.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netutil import free_port, wait_listening  # noqa: E402
from samba_server import SambaShare, start_samba  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
USER, PASSWORD = "bench", "Bench-Passw0rd"
SHARE = "data"


@dataclass
class Target:
    name: str
    port: int
    share_dir: Path


def smbclient(t: Target, command: str, timeout: float = 900) -> str:
    proc = subprocess.run(
        ["smbclient", f"//127.0.0.1/{SHARE}", "-p", str(t.port), "-U", f"{USER}%{PASSWORD}", "-m", "SMB3_11", "--client-protection=sign", "-c", command],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 or "NT_STATUS" in out:
        sys.exit(f"smbclient against {t.name} ({command!r}) failed:\n{out}")
    return out


def drop_copies(t: Target) -> None:
    for name in ("copy.bin", "up.bin"):
        (t.share_dir / name).unlink(missing_ok=True)


def server_side(t: Target) -> float:
    drop_copies(t)
    start = time.monotonic()
    smbclient(t, "scopy big.bin copy.bin")
    took = time.monotonic() - start
    if not filecmp.cmp(t.share_dir / "big.bin", t.share_dir / "copy.bin", shallow=False):
        sys.exit(f"{t.name}: the server-side copy differs from the original")
    return took


def client_side(t: Target, local: Path) -> float:
    drop_copies(t)
    local.unlink(missing_ok=True)
    start = time.monotonic()
    smbclient(t, f"get big.bin {local}; put {local} up.bin")
    took = time.monotonic() - start
    if not filecmp.cmp(t.share_dir / "big.bin", t.share_dir / "up.bin", shallow=False):
        sys.exit(f"{t.name}: the client-side copy differs from the original")
    return took


def fill(path: Path, size_mib: int) -> None:
    with open(path, "wb") as f:
        for _ in range(size_mib):
            f.write(os.urandom(1 << 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nimbus", default=str(REPO / "target" / "release" / "nimbus"))
    ap.add_argument("--dir", default="/var/tmp", help="where the shares' temporary directory goes")
    args = ap.parse_args()
    for tool in ("smbclient",):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (apt-get install smbclient)")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="nimbus-copy-bench-") as tmp:
        tmp = Path(tmp)
        nimbus_share, samba_share = tmp / "nimbus-share", tmp / "samba-share"
        nimbus_share.mkdir()
        samba_share.mkdir()
        fill(nimbus_share / "big.bin", args.size_mib)
        shutil.copyfile(nimbus_share / "big.bin", samba_share / "big.bin")
        db = tmp / "users.db"
        subprocess.run([args.nimbus, "user", "add", USER, "--db", str(db), "--password-stdin"], input=PASSWORD + "\n", text=True, check=True, capture_output=True)
        nport = free_port()
        nimbus = subprocess.Popen(
            [args.nimbus, "serve", "--listen", f"127.0.0.1:{nport}", "--user-db", str(db), "--share", f"{SHARE}={nimbus_share}", "--state-dir", str(tmp / "nimbus-state")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        samba = None
        try:
            wait_listening(nport, nimbus, "nimbus")
            sport = free_port()
            samba = start_samba(tmp / "samba-state", sport, [SambaShare(SHARE, samba_share)], USER, PASSWORD, signing="auto")
            targets = [Target("nimbus", nport, nimbus_share), Target("samba", sport, samba_share)]
            local = tmp / "local.bin"
            times: dict[tuple[str, str], list[float]] = {}
            for r in range(args.rounds):
                # Alternate the order, so neither server always runs on a
                # warmer page cache.
                for t in targets if r % 2 == 0 else targets[::-1]:
                    times.setdefault((t.name, "server"), []).append(server_side(t))
                    times.setdefault((t.name, "client"), []).append(client_side(t, local))
                    print(f"round {r + 1}: {t.name} server-side {times[(t.name, 'server')][-1]:.2f} s, client-side {times[(t.name, 'client')][-1]:.2f} s", file=sys.stderr)
        finally:
            nimbus.terminate()
            nimbus.wait(timeout=30)
            if samba is not None:
                samba.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"## Server-side copy: `bench/server_copy.py` ({time.strftime('%Y-%m-%d')}, nimbus {rev or '(no git)'})")
    print()
    print(f"A {args.size_mib} MiB file copied within a share on disk, smbclient SMB3_11 signed; median of {args.rounds} rounds, every copy compared byte for byte with the original.")
    print()
    print("| | server-side (`scopy`) | client-side (`get` + `put`) | client-side / server-side |")
    print("|---|---|---|---|")
    for name in ("nimbus", "samba"):
        s, c = med[(name, "server")], med[(name, "client")]
        print(f"| {name} | {s:.2f} s | {c:.2f} s | {c / s:.1f}x |")
    print(f"| nimbus / samba | {med[('nimbus', 'server')] / med[('samba', 'server')]:.2f} | {med[('nimbus', 'client')] / med[('samba', 'client')]:.2f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
