#!/usr/bin/env python3
"""Filling one directory with many new files, Nimbus and Samba side by side.

What a copy of a large folder (photos, mail, build output) does: one
connection CREATEs `fill\\fNNNNNN.dat` (a new name each time) and CLOSEs it,
`--files` times. Names compare without case in SMB, so for each new name a
server must learn that no other spelling of it exists; listing the directory
for that makes each CREATE cost more as the directory grows. Reported per
server: files per second over the first `--window` files and over the last,
the whole run's time, and the server's CPU per file.

    sudo python3 bench/fill_dir.py [--files 30000] [--window 2000] \
        [--nimbus target/release/nimbus]

Needs root (Samba's smbd, see bench/samba_server.py).
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import meta_loop  # noqa: E402
import side_by_side as sbs  # noqa: E402
from meta_loop import HEADER_SIZE, close_body, rawsmb  # noqa: E402

DIR = "fill"


def create_new_body(name: str) -> bytes:
    """MS-SMB2 2.2.13 CREATE: a new file (FILE_CREATE), for writing."""
    n = name.encode("utf-16-le")
    # StructureSize, SecurityFlags, OplockLevel, ImpersonationLevel,
    # SmbCreateFlags, Reserved, DesiredAccess (GENERIC_WRITE), FileAttributes
    # (NORMAL), ShareAccess (read|write|delete), CreateDisposition (CREATE),
    # CreateOptions (NON_DIRECTORY_FILE), NameOffset, NameLength,
    # CreateContextsOffset, CreateContextsLength.
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, 0x40000000, 0x80, 7, 2, 0x40, HEADER_SIZE + 56, len(n), 0, 0) + n


def fill(server: sbs.Server, files: int, window: int) -> dict:
    (server.share_dir / DIR).mkdir()
    client = meta_loop.Client("127.0.0.1", server.port)
    client.logon(sbs.USER, sbs.PASSWORD, f"\\\\127.0.0.1\\{sbs.SHARE}")
    cpu0 = server.cpu()
    t0 = time.monotonic()
    marks = []
    for i in range(files):
        if i % window == 0:
            marks.append(time.monotonic())
        resp = client.call(rawsmb.CREATE, create_new_body(f"{DIR}\\f{i:06d}.dat"))
        file_id = resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]
        client.call(meta_loop.CLOSE, close_body(file_id))
    end = time.monotonic()
    cpu = server.cpu() - cpu0
    client.sock.close()
    marks.append(end)
    assert len(list((server.share_dir / DIR).iterdir())) == files
    return {
        "first": window / (marks[1] - marks[0]),
        "last": window / (marks[-1] - marks[-2]) if files % window == 0 else float("nan"),
        "seconds": end - t0,
        "cpu_us": cpu / files * 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=30000)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--nimbus", default=str(sbs.REPO / "target" / "release" / "nimbus"))
    ap.add_argument("--servers", default="Samba,Nimbus", help="which to run, comma-separated")
    args = ap.parse_args()
    if args.files % args.window or args.files < 2 * args.window:
        sys.exit("--files must be a multiple of --window, at least two windows")
    results = {}
    with tempfile.TemporaryDirectory(prefix="nimbus-fill-") as tmp:
        tmp = Path(tmp)
        for name in args.servers.split(","):
            (tmp / name / "share").mkdir(parents=True)
            (tmp / name / "state").mkdir()
            share = tmp / name / "share"
            server = sbs.start_smbd(tmp / name / "state", share) if name == "Samba" else sbs.start_nimbus(args.nimbus, tmp / name / "state", share)
            try:
                server.settle()
                results[name] = fill(server, args.files, args.window)
            finally:
                server.stop()
    print(f"{args.files} new files in one directory, one connection (files/s; CPU µs per file)")
    print("| server | first files/s | last files/s | last / first | whole run s | server CPU µs/file |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['first']:.0f} | {r['last']:.0f} | {r['last'] / r['first']:.2f} | {r['seconds']:.1f} | {r['cpu_us']:.0f} |")
    if {"Nimbus", "Samba"} <= results.keys():
        n, s = results["Nimbus"], results["Samba"]
        print(f"Nimbus / Samba: last-window rate {n['last'] / s['last']:.2f}x, whole run {s['seconds'] / n['seconds']:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
