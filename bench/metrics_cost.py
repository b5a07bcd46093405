#!/usr/bin/env python3
"""What the Prometheus endpoint costs: the same Nimbus binary with
`[metrics] listen` set and without, alternating, in the same run, on the
side-by-side benchmark's open/close and get rows (bench/side_by_side.py's
measurements, reused): server CPU per open+close pair and per GiB sent.
With metrics on, the endpoint is scraped once a second meanwhile, as a
Prometheus server would (more often than its default 15 s).

    python3 bench/metrics_cost.py [--rounds 3] [--seconds 5] [--size-mib 512]

Prints a Markdown table (medians of the rounds) for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import side_by_side as sbs  # noqa: E402
from netutil import free_port, wait_listening  # noqa: E402

PASSWORD = sbs.PASSWORD
USER = sbs.USER


def start(nimbus: str, state: Path, share_dir: Path, metrics_port: int | None) -> sbs.Server:
    db = state / "users.db"
    if not db.exists():
        subprocess.run([nimbus, "user", "add", USER, "--db", str(db), "--password-stdin"], input=PASSWORD + "\n", text=True, check=True, capture_output=True)
    port = free_port()
    conf = state / "nimbus.toml"
    lines = [f'listen = ["127.0.0.1:{port}"]', f'user_db = "{db}"', "[security]", 'signing = "auto"', "[[share]]", f'name = "{sbs.SHARE}"', f'path = "{share_dir}"']
    if metrics_port is not None:
        lines += ["[metrics]", f'listen = "127.0.0.1:{metrics_port}"']
    conf.write_text("\n".join(lines) + "\n")
    log = open(state / "nimbus.log", "ab")
    proc = subprocess.Popen([nimbus, "serve", "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, NO_COLOR="1"))
    wait_listening(port, proc, "nimbus")

    def stop() -> None:
        proc.terminate()
        proc.wait(timeout=15)
        log.close()

    return sbs.Server("Nimbus", proc.pid, port, share_dir, stop)


class Scraper:
    """Scrapes the endpoint once a second until stopped."""

    def __init__(self, port: int):
        self.port, self.scrapes = port, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
                r.read()
            self.scrapes += 1

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--nimbus", default=str(BENCH.parent / "target" / "release" / "nimbus"))
    args = ap.parse_args()
    results: dict[tuple[str, bool], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="nimbus-metrics-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        tmp = Path(tmp)
        share = tmp / "share"
        share.mkdir()
        size = args.size_mib * sbs.MIB
        with open(share / "big.bin", "wb") as f:
            f.write(os.urandom(size))
        durable_files = 200
        sbs.meta_loop.prepare(share, 4, durable_files)
        for r in range(args.rounds):
            for on in (False, True) if r % 2 == 0 else (True, False):
                state = tmp / f"state-{r}-{on}"
                state.mkdir()
                metrics_port = free_port() if on else None
                server = start(args.nimbus, state, share, metrics_port)
                try:
                    scraper = Scraper(metrics_port) if on else None
                    if scraper:
                        scraper.__enter__()
                    try:
                        _, us = sbs.open_close_loop(server, "plain", 4, durable_files, args.seconds)
                        results.setdefault(("open+close, CPU µs per pair", on), []).append(us)
                        _, s_gib = sbs.transfer(server, "off", "get", share / "big.bin", size)
                        results.setdefault(("get, CPU s per GiB", on), []).append(s_gib)
                    finally:
                        if scraper:
                            scraper.__exit__(None, None, None)
                            if scraper.scrapes == 0:
                                sys.exit("the metrics endpoint was never scraped")
                finally:
                    server.stop()
    print("| row | metrics off | metrics on | on / off |")
    print("|---|---:|---:|---:|")
    for row in ("open+close, CPU µs per pair", "get, CPU s per GiB"):
        off, on = statistics.median(results[(row, False)]), statistics.median(results[(row, True)])
        print(f"| {row} | {off:.3f} | {on:.3f} | {on / off:.3f} |")
    print(f"\n{args.rounds} rounds, alternating; medians. Rounds: {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
