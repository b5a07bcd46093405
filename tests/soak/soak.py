#!/usr/bin/env python3
"""A long soak of a three-node cluster (issue 45 item 5). Not a pytest test
(no test_ prefix, so not collected, and not run in CI): run it by hand,

    NIMBUS_BIN=target/release/nimbus \\
        target/test-venv/bin/python3 tests/soak/soak.py --minutes 30 --out RESULT.json

It starts a three-member TLS etcd (tests/etcd_cluster.py) and three nodes
serving one share directory, each node reaching etcd only through its own
ProxySet (tests/cut_proxy.py). The workers of tests/test_etcd_failover.py
(Writer, a test_partition Worker) run against all nodes for the whole time:
each opens contended.bin, takes exclusive locks of overlapping ranges of
it, writes a record of its own while it holds one, and sometimes opens and
closes a file of its own, drops its connection (after an unlock, or while
holding a lock) and connects again to a node picked at random; a worker
whose node is down goes to another. Every `--every` seconds one node is
alternately killed with SIGKILL and restarted `--down` seconds later, or
cut off from etcd (blackhole) for `--cut` seconds and healed; after each,
the harness waits until the node is registered and grants again.

At the end it checks, from the clients' records:

- exclusivity: no two clients' holds of overlapping ranges share a moment
  (`overlapping_holds` of test_partition), and no unlock of a granted lock
  found it gone (STATUS_RANGE_NOT_LOCKED);
- every WRITE answered STATUS_SUCCESS is in the file on disk
  (`missing_writes` of test_etcd_failover);
- no lock outlives its open: once the workers are gone, a new client of
  each node is granted every range (`Latecomer`);
- no node log says "panicked at", no node exited by itself, and after each
  kill or partition the node was registered and granted again.

It samples each node's RSS (VmRSS of /proc/PID/status) and its heap in
use (the allocator's own count: the `nimbus_heap_in_use_bytes` gauge of
its metrics endpoint) every `--sample-every` seconds; a leak grows both,
while an allocator keeping freed pages grows only the RSS; the "start" figure is the first sample after
`--warmup`, the "end" one is taken under load just before the workers stop.
Kills go to `--kill-nodes` (default n2 and n3), so that n1 runs as one
process all through and its figures are one process's; partitions go to
every node. etcd is compacted at each sample to the revision of the sample
before, as an operator's etcd would be (`--auto-compaction-retention`), so
that its history does not fill the test cluster's small quota.

The summary (JSON) goes to stdout and to `--out`; the exit status is 1 when
a check failed (or the harness broke, so that a check could not be made)
and 0 otherwise. To see the checks fail, `--inject` plants a violation:
`overlap` a copy of a real hold under another client, `lost-write` one
acknowledged record zeroed on disk (both after the run), `unclustered` a
fourth server of the share outside the cluster, which the workers use too
(its locks are its own: real overlapping grants).
Everything is bounded: each wait has a deadline, and every process started
is killed at the end, on error too. Logs stay in `--dir` (default a new
temporary directory), named in the summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

import rawsmb  # noqa: E402
from conftest import add_user, free_port  # noqa: E402
from cut_proxy import ProxySet  # noqa: E402
from etcd_cluster import ETCD, ETCDCTL, OPENSSL, EtcdCluster, EtcdError  # noqa: E402
from test_cluster import Node, members, open_body  # noqa: E402
from test_etcd_failover import RECORD, REQUEST_TIMEOUT, Latecomer, Write, Writer, missing_writes, wait_for  # noqa: E402
from test_locks import CLOSE, STATUS_LOCK_NOT_GRANTED, STATUS_RANGE_NOT_LOCKED, close_body  # noqa: E402
from test_partition import (  # noqa: E402
    ANSWERED,
    FILE,
    FILE_SIZE,
    TIMEOUT,
    TTL,
    Hold,
    Request,
    Session,
    Timeline,
    hold_end,
    overlap_examples,
    overlapping_holds,
    status_name,
)

NODES = ("n1", "n2", "n3")
MAX_WRITES = 1 << 16  # records per worker: a worker writes a few per second, so 30 minutes stay well within
MAX_CONNECTS = 100_000  # per worker; its lifetime bounds it first
REGISTER_WAIT = 30.0  # after a restart or a heal, until etcd holds the node's record again
SERVE_WAIT = 60.0  # after that, until a worker is granted a lock by the node
RESTART_ATTEMPTS = 3  # a restarted node may find its port still held for a moment
ETCD_POLL = 0.5  # between looks at etcd (each one an etcdctl process)
GRANT_POLL = 0.25  # between looks at the workers' grants
JOIN_SLACK = 5.0  # beyond REQUEST_TIMEOUT, for a worker to stop
EVENT_SLACK = 40.0  # an event is started only if it can end this long before the run does
PANIC = "panicked at"
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the nodes' log colours
DIGITS = re.compile(r"\d+")
EXAMPLES = 5
FOLD_AT = 2000  # requests a worker keeps before it counts them and lets go (SoakWorker.fold)


# ------------------------------------------------------------------ client


class Target:
    """A node as the workers see it: its name and address, which a restart
    keeps (only the Node's process changes)."""

    def __init__(self, node: Node):
        self.name, self.host, self.port = node.name, node.host, node.port


class SoakWorker(Writer):
    """A Writer that also opens and closes a file of its own while it holds
    a lock, sometimes drops its connection (after an unlock, or while
    holding a lock: the server must let go of the lock with it), and
    connects again to a node picked at random."""

    max_writes = MAX_WRITES
    max_connects = MAX_CONNECTS

    def __init__(self, index: int, targets: list[Target], stop: threading.Event, lifetime: float, args: argparse.Namespace):
        first = targets[index % len(targets)]
        super().__init__(index, first.name, first.host, (first.host, first.port), stop, Timeline())
        self.targets, self.lifetime = targets, lifetime
        self.reconnect_p = 1 / args.reconnect_every if args.reconnect_every else 0.0
        self.drop_holding_p = 1 / args.drop_holding_every if args.drop_holding_every else 0.0
        self.open_p = 1 / args.open_every if args.open_every else 0.0
        self.own_file = own_file(index)
        self.connections = 0
        self.reconnects = 0  # connections dropped on purpose after an unlock
        self.drops_holding = 0  # connections dropped on purpose while holding a lock
        self.counts: Counter[tuple[str, str]] = Counter()  # (request, status or outcome) of the requests folded
        self.timeouts: list[Request] = []  # the first few requests that got no answer in time

    def before_connect(self, serial: int, rng: random.Random) -> None:
        self.connections = serial
        if serial > 1:
            t = rng.choice(self.targets)
            self.node, self.host, self.address = t.name, t.host, (t.host, t.port)

    def reconnect_after(self, hold: Hold, rng: random.Random) -> bool:
        if rng.random() < self.reconnect_p:
            self.reconnects += 1
            return True
        return False

    def fold(self) -> None:
        """Counts the requests recorded so far and lets go of them: a long
        run makes hundreds of thousands, and only the holds and the writes
        (which keep their own) are checked one by one. Called from the
        worker's thread, or once it has stopped."""
        for r in self.requests:
            self.counts[(r.what, status_name(r.status) if r.outcome == ANSWERED else r.outcome)] += 1
            if r.outcome == TIMEOUT and len(self.timeouts) < EXAMPLES:
                self.timeouts.append(r)
        self.requests.clear()

    def while_held(self, session: Session, hold: Hold, rng: random.Random) -> None:
        if len(self.requests) >= FOLD_AT:
            self.fold()
        super().while_held(session, hold, rng)  # the write, then the pause
        if session.alive and rng.random() < self.open_p:
            r, resp = session.request("open", rawsmb.CREATE, open_body(self.own_file, 0x0012019F, 7))
            if r.outcome == ANSWERED and r.status == 0:
                session.request("close", CLOSE, close_body(resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]))
        if session.alive and rng.random() < self.drop_holding_p:
            self.drops_holding += 1
            session.close()  # no unlock: the hold is proven only at its grant (hold_end)


def own_file(index: int) -> str:
    return f"soak-w{index}.bin"


# ------------------------------------------------------------------- probes


def rss_kb(pid: int | None) -> int | None:
    """VmRSS of a process in KiB, or None if it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def heap_kb(node: Node) -> int | None:
    """The node's heap in use (its `nimbus_heap_in_use_bytes` gauge) in KiB,
    or None if it is gone or does not answer."""
    port = getattr(node, "metrics_port", None)
    if port is None or node_pid(node) is None:
        return None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("nimbus_heap_in_use_bytes "):
                    return int(float(line.split()[1]) // 1024)
    except (OSError, ValueError):
        return None
    return None


def node_pid(node: Node) -> int | None:
    return node.proc.pid if node.proc is not None and node.proc.poll() is None else None


def registered(etcd: EtcdCluster) -> set[str]:
    try:
        return set(members(etcd))
    except (EtcdError, ValueError, AssertionError):
        return set()


def granted_by(workers: list[SoakWorker], node: str, since: float) -> bool:
    """Whether a worker was granted a lock by `node` at or after `since`
    (the last holds of each worker are enough: holds are appended in order)."""
    return any(h.node == node and h.granted >= since for w in workers for h in w.holds[-64:])


class Sampler(threading.Thread):
    """Every `every` seconds: each node's pid and RSS, the harness's own
    RSS, and etcd's revision and database size; compacts etcd to the
    revision of the sample before."""

    def __init__(self, nodes: list[Node], etcd: EtcdCluster, start: float, every: float, stop: threading.Event, deadline: float):
        super().__init__(daemon=True, name="sampler")
        self.nodes, self.etcd, self.start_t, self.every, self.stop, self.deadline = nodes, etcd, start, every, stop, deadline
        self.samples: list[dict] = []
        self.compactions = 0
        self.errors: list[str] = []
        self._last_revision: int | None = None

    def sample(self, label: str = "") -> dict:
        s: dict = {"t": round(time.monotonic() - self.start_t, 1)}
        if label:
            s["label"] = label
        s["nodes"] = {n.name: {"pid": node_pid(n), "rss_kb": rss_kb(node_pid(n)), "heap_kb": heap_kb(n)} for n in self.nodes}
        s["harness_rss_kb"] = rss_kb(os.getpid())
        try:
            running = [m.client_url for m in self.etcd.members if m.alive()]
            statuses = json.loads(self.etcd.etcdctl("endpoint", "status", "-w", "json", endpoints=running))
            s["etcd_revision"] = max(st["Status"]["header"]["revision"] for st in statuses)
            s["etcd_db_bytes"] = max(st["Status"]["dbSize"] for st in statuses)
        except (EtcdError, ValueError, KeyError) as e:
            self.errors.append(f"etcd status at {s['t']} s: {str(e)[:200]}")
        self.samples.append(s)
        return s

    def compact(self, revision: int | None) -> None:
        if self._last_revision is not None:
            try:
                self.etcd.etcdctl("compact", str(self._last_revision))
                self.compactions += 1
            except EtcdError as e:
                if "compacted" not in e.stderr:  # compacted already: nothing to do
                    self.errors.append(f"compact {self._last_revision}: {e.stderr.strip()[:200]}")
        self._last_revision = revision

    def run(self) -> None:
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                s = self.sample()
                self.compact(s.get("etcd_revision"))
                self.stop.wait(self.every)
        except Exception:
            self.errors.append(traceback.format_exc())


# ------------------------------------------------------------------ chaos


class Chaos:
    """The node kills and partitions, and what was seen of each."""

    def __init__(
        self, nodes: list[Node], proxies: dict[str, ProxySet], etcd: EtcdCluster, workers: list[SoakWorker], start: float, args
    ):
        self.nodes = {n.name: n for n in nodes}
        self.proxies, self.etcd, self.workers, self.start = proxies, etcd, workers, start
        self.args = args
        self.events: list[dict] = []

    def rel(self, t: float | None) -> float | None:
        return None if t is None else round(t - self.start, 2)

    def kill(self, name: str) -> dict:
        node = self.nodes[name]
        ev = {"kind": "kill", "node": name, "at": self.rel(time.monotonic()), "pid": node_pid(node)}
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=10)
        # The record goes when the lease expires (nobody renews it).
        gone = wait_for(lambda: name not in registered(self.etcd), self.args.down, ETCD_POLL)
        ev["record_gone_after"] = None if gone is None else round(gone - self.start - ev["at"], 2)
        left = self.start + ev["at"] + self.args.down - time.monotonic()
        if left > 0:
            time.sleep(left)  # the node stays down for --down seconds: a timer, not an ordering
        restarted = None
        for attempt in range(RESTART_ATTEMPTS):
            try:
                node.start()
                restarted = time.monotonic()
                break
            except (RuntimeError, TimeoutError) as e:
                ev.setdefault("restart_errors", []).append(str(e)[:300])
                node.stop()
                time.sleep(1.0)
        ev["restarted_at"] = self.rel(restarted)
        ev["new_pid"] = node_pid(node)
        if restarted is not None:
            self._recovered(ev, name, restarted)
        return ev

    def partition(self, name: str) -> dict:
        ev = {"kind": "partition", "node": name, "at": self.rel(time.monotonic()), "pid": node_pid(self.nodes[name])}
        began = time.monotonic()
        self.proxies[name].blackhole()
        gone = wait_for(lambda: name not in registered(self.etcd), self.args.cut, ETCD_POLL)
        ev["record_gone_after"] = None if gone is None else round(gone - began, 2)
        left = began + self.args.cut - time.monotonic()
        if left > 0:
            time.sleep(left)  # the cut lasts --cut seconds: a timer, not an ordering
        healed = time.monotonic()
        self.proxies[name].heal()
        ev["healed_at"] = self.rel(healed)
        ev["same_pid_after"] = node_pid(self.nodes[name]) == ev["pid"]
        self._recovered(ev, name, healed)
        return ev

    def _recovered(self, ev: dict, name: str, since: float) -> None:
        """Waits until the node is registered again and grants a lock."""
        back = wait_for(lambda: name in registered(self.etcd), REGISTER_WAIT, ETCD_POLL)
        ev["registered_after"] = None if back is None else round(back - since, 2)
        served = wait_for(lambda: granted_by(self.workers, name, since), SERVE_WAIT, GRANT_POLL) if back is not None else None
        ev["grants_again_after"] = None if served is None else round(served - since, 2)

    def run_one(self, k: int) -> dict:
        if k % 2 == 0:
            targets = self.args.kill_nodes
            ev = self.kill(targets[(k // 2) % len(targets)])
        else:
            targets = self.args.partition_nodes
            ev = self.partition(targets[(k // 2) % len(targets)])
        self.events.append(ev)
        return ev

    def length(self, k: int) -> float:
        """How long event `k` keeps its node away, at least."""
        return self.args.down if k % 2 == 0 else self.args.cut


# ------------------------------------------------------------------- report


def scan_logs(nodes: list[Node]) -> tuple[dict[str, list[str]], dict[str, dict]]:
    """Panics per node, and per node the count of ERROR and WARN lines with
    the most common messages of each (numbers masked, so that one message
    about many files or ports counts as one)."""
    panics: dict[str, list[str]] = {}
    levels: dict[str, dict] = {}
    for n in nodes:
        try:
            lines = [ANSI.sub("", line) for line in n.log_path.read_text(errors="replace").splitlines()]
        except OSError as e:
            levels[n.name] = {"error": str(e)}
            continue
        found = [line[:300] for line in lines if PANIC in line]
        if found:
            panics[n.name] = found[:EXAMPLES]
        levels[n.name] = {"lines": len(lines)}
        for level in ("ERROR", "WARN"):
            marked = [line.split(f" {level} ", 1)[1] for line in lines if f" {level} " in line]
            common = Counter(DIGITS.sub("N", m)[:200] for m in marked).most_common(EXAMPLES)
            levels[n.name][level] = {"lines": len(marked), "most_common": common}
    return panics, levels


def rss_figures(samples: list[dict], warmup: float, field: str = "rss_kb") -> dict[str, dict]:
    """Per node, of `field` (the RSS, or the heap in use: "heap_kb"): the
    first sample after the warm-up, the one labelled "end" (the last one,
    if there is none), the largest, and how many processes the samples
    saw."""
    out: dict[str, dict] = {}
    for name in NODES:
        # (time, pid, figure, the end sample) of each sample that found the node running
        seen = [(s["t"], s["nodes"][name]["pid"], s["nodes"][name].get(field), s.get("label") == "end") for s in samples]
        seen = [x for x in seen if x[2] is not None]
        after = [x for x in seen if x[0] >= warmup] or seen
        if not after:
            out[name] = {}
            continue
        start, end = after[0], next((x for x in seen if x[3]), seen[-1])
        out[name] = {
            "start_kb": start[2],
            "start_t": start[0],
            "end_kb": end[2],
            "end_t": end[0],
            "max_kb": max(x[2] for x in after),
            "processes": len({x[1] for x in seen}),
            "same_process": start[1] == end[1],
            "growth_pct": round(100 * (end[2] - start[2]) / start[2], 1) if start[1] == end[1] else None,
        }
    return out


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


# --------------------------------------------------------------------- run


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="how long the clients run")
    p.add_argument("--out", type=Path, default=Path("soak-result.json"), help="where the JSON summary goes")
    p.add_argument("--dir", type=Path, default=None, help="working directory (default: a new temporary one, kept)")
    p.add_argument("--every", type=float, default=180.0, help="seconds between a kill or a partition (alternately)")
    p.add_argument("--down", type=float, default=10.0, help="seconds a killed node stays down")
    p.add_argument("--cut", type=float, default=15.0, help="seconds a partition lasts (more than the TTL, so the lease is lost)")
    p.add_argument("--warmup", type=float, default=None, help="seconds before the start RSS figure (default: min(60, every / 2))")
    p.add_argument("--sample-every", type=float, default=60.0, help="seconds between RSS samples")
    p.add_argument("--workers-per-node", type=int, default=3)
    p.add_argument("--reconnect-every", type=int, default=40, help="a worker drops its connection after 1 in N unlocks (0: never)")
    p.add_argument("--drop-holding-every", type=int, default=200, help="... and while holding 1 in N locks (0: never)")
    p.add_argument("--open-every", type=int, default=8, help="... and opens and closes a file of its own in 1 in N holds (0: never)")
    p.add_argument("--kill-nodes", default="n2,n3", help="nodes the kills go to, in turn")
    p.add_argument("--partition-nodes", default="n1,n2,n3", help="nodes the partitions go to, in turn")
    p.add_argument(
        "--no-metrics",
        action="store_true",
        help="run the nodes without their metrics endpoint (no heap figure then: the RSS alone), to tell the exporter's memory from the server's",
    )
    p.add_argument(
        "--inject", action="append", default=[], choices=["overlap", "lost-write", "unclustered"], help="plant a violation (to see a check fail)"
    )
    args = p.parse_args()
    args.kill_nodes = [n for n in args.kill_nodes.split(",") if n]
    args.partition_nodes = [n for n in args.partition_nodes.split(",") if n]
    if args.warmup is None:
        args.warmup = min(60.0, args.every / 2)
    for n in args.kill_nodes + args.partition_nodes:
        if n not in NODES:
            p.error(f"no node {n!r}; the nodes are {', '.join(NODES)}")
    return args


def main() -> int:
    args = parse_args()
    binary = Path(os.environ.get("NIMBUS_BIN") or REPO / "target" / "release" / "nimbus")
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        print(f"no nimbus binary at {binary} (build it, or set NIMBUS_BIN)", file=sys.stderr)
        return 2
    os.environ["NIMBUS_BIN"] = str(binary.resolve())  # what Node.start runs (conftest.nimbus_binary)
    missing = [p for p in (ETCD, ETCDCTL, OPENSSL) if shutil.which(p) is None]
    if missing:
        print(f"not installed: {missing} (etcd-server, etcd-client, openssl)", file=sys.stderr)
        return 2
    base = args.dir or Path(tempfile.mkdtemp(prefix="nimbus-soak-"))
    base.mkdir(parents=True, exist_ok=True)

    # SIGTERM (a `kill` of the soak, a timeout) ends it as Ctrl-C does: through
    # the `finally` that kills every process started.
    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)

    duration = args.minutes * 60
    summary: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "binary": str(binary),
        "dir": str(base),
        "planned_s": duration,
        "nodes": list(NODES),
        "ttl_s": TTL,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    harness_errors: list[str] = []
    etcd = EtcdCluster(base / "etcd")
    proxies: dict[str, ProxySet] = {}
    nodes: list[Node] = []
    extras: list[Node] = []  # --inject unclustered
    injected: list[str] = []
    workers: list[SoakWorker] = []
    stop = threading.Event()
    sampler = None
    chaos = None
    try:
        etcd.start()
        share = base / "shared"
        share.mkdir(exist_ok=True)
        (share / FILE).write_bytes(bytes(FILE_SIZE))
        db = base / "users.db"
        if not db.exists():
            add_user(db)
        lifetime = duration + 600  # bounds each proxy's and each worker's threads; the run stops them first
        for i, name in enumerate(NODES):
            proxies[name] = ProxySet([("127.0.0.1", m.client_port) for m in etcd.members], lifetime=lifetime).__enter__()
            through = [f"{etcd.scheme}://127.0.0.1:{p.port}" for p in proxies[name].proxies]
            node = Node(base, name, f"127.0.0.{i + 1}", etcd.node_toml_lines(endpoints=through), share, db, ttl=TTL)
            if not args.no_metrics:
                # The metrics endpoint, for the heap figure (sections after [cluster] end it).
                node.metrics_port = free_port()
                node.conf.write_text(node.conf.read_text() + f'[metrics]\nlisten = "127.0.0.1:{node.metrics_port}"\n')
            nodes.append(node)
        for n in nodes:
            n.start()
        if wait_for(lambda: set(NODES) <= registered(etcd), REGISTER_WAIT, ETCD_POLL) is None:
            raise RuntimeError(f"the nodes did not all register within {REGISTER_WAIT:g} s: {registered(etcd)}")
        if "unclustered" in args.inject:
            # A fourth server of the same directory outside the cluster: its
            # locks are its own, so its clients and the cluster's can hold
            # the same range at once, which the checker must see.
            extra = Node(base, "n4", "127.0.0.4", [], share, db, ttl=TTL)
            # (Persistent handles need etcd or a state directory: its "ca" share is a plain one.)
            standalone = extra.conf.read_text().split("[cluster]")[0].replace("continuous_availability = true\n", "")
            extra.conf.write_text(standalone)
            extras.append(extra.start())
            injected.append("unclustered: n4 serves the share without [cluster]; workers connect to it too")
        targets = [Target(n) for n in nodes + extras]
        n_workers = args.workers_per_node * len(nodes)
        for i in range(n_workers):
            (share / own_file(i)).write_bytes(b"")
        workers = [SoakWorker(i, targets, stop, lifetime, args) for i in range(n_workers)]

        start = time.monotonic()
        end = start + duration
        summary["started_monotonic"] = start
        for w in workers:
            w.start()
        sampler = Sampler(nodes, etcd, start, args.sample_every, stop, end + 60)
        sampler.start()
        chaos = Chaos(nodes, proxies, etcd, workers, start, args)
        print(f"soak: {len(workers)} workers on {', '.join(NODES)} for {args.minutes:g} min; logs in {base}", flush=True)

        k = 0
        next_event = start + args.every
        next_report = start + 60
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_event:
                if now + chaos.length(k) + EVENT_SLACK <= end:
                    ev = chaos.run_one(k)
                    print(f"  event {k + 1}: {json.dumps(ev)}", flush=True)
                    k += 1
                next_event += args.every
                continue
            if now >= next_report:
                holds = sum(len(w.holds) for w in workers)
                last = sampler.samples[-1] if sampler.samples else {}
                rss = {n: v["rss_kb"] for n, v in last.get("nodes", {}).items()}
                heaps = {n: v.get("heap_kb") for n, v in last.get("nodes", {}).items()}
                harness = last.get("harness_rss_kb")
                print(f"  {(now - start) / 60:.1f} min: {holds} grants; rss KiB {rss}; heap KiB {heaps}; harness {harness} KiB", flush=True)
                next_report += 60
            time.sleep(min(1.0, max(0.0, min(next_event, next_report, end) - time.monotonic())))

        # The end figure, under load as the start one was.
        sampler.sample("end")
        exited = {n.name: n.proc.returncode for n in nodes if n.proc.poll() is not None}  # none was killed just now
        stop.set()
        join_deadline = time.monotonic() + REQUEST_TIMEOUT + JOIN_SLACK
        for w in workers:
            w.join(timeout=max(0.0, join_deadline - time.monotonic()))
        sampler.join(timeout=30)
        ended = time.monotonic()

        # The checks, on what the clients saw.
        all_registered = wait_for(lambda: set(NODES) <= registered(etcd), REGISTER_WAIT, ETCD_POLL) is not None
        latecomers = {n.name: Latecomer(n.name, n.host, (n.host, n.port)) for n in nodes}
        left_behind = {name: why for name, c in latecomers.items() if (why := c.lock_everything())}

        holds = [h for w in workers for h in w.holds]
        writes = [x for w in workers for x in w.writes]
        for h in holds:
            h.end = hold_end(h, client_cuts=[])
        if "overlap" in args.inject:
            real = next((h for h in holds if h.end > h.granted), None)
            if real is not None:
                # A client that does not exist holding what a real one held.
                holds.append(replace(real, worker=-2, node="injected"))
                injected.append(f"overlap: a copy of w{real.worker}'s hold at {real.granted - start:.2f} s under client -2")
        acknowledged = [x for x in writes if x.acknowledged]
        if "lost-write" in args.inject and acknowledged:
            x = acknowledged[len(acknowledged) // 2]
            fd = os.open(share / FILE, os.O_WRONLY)
            try:
                os.pwrite(fd, bytes(len(x.data)), x.offset)
            finally:
                os.close(fd)
            injected.append(f"lost-write: w{x.worker} #{x.seq} ({len(x.data)} bytes at {x.offset}) zeroed on disk")
        disk = (share / FILE).read_bytes()

        rel = lambda t: f"{t - start:.2f} s"  # noqa: E731
        overlaps = overlapping_holds(holds)
        lost_unlocks = [
            h for h in holds if h.unlock is not None and h.unlock.outcome == ANSWERED and h.unlock.status == STATUS_RANGE_NOT_LOCKED
        ]
        missing: list[Write] = missing_writes(writes, disk)
        panics, log_levels = scan_logs(nodes + extras)
        ops: Counter[str] = Counter()
        statuses: dict[str, Counter] = {}
        for w in workers:
            w.fold()
            for (what, status), count in w.counts.items():
                ops[what] += count
                statuses.setdefault(what, Counter())[status] += count
        timeouts = sum(c.get(TIMEOUT, 0) for c in statuses.values())
        timeout_examples = [r for w in workers for r in w.timeouts]

        stuck = [w.name for w in workers if w.is_alive()]
        broken = {w.name: w.failure for w in workers if w.failure}
        proxy_errors = [e for p in proxies.values() for e in p.errors]
        if stuck or broken or proxy_errors:
            harness_errors.append(f"workers still running: {stuck}; worker failures: {broken}; proxy errors: {proxy_errors}")
        harness_errors += sampler.errors[:EXAMPLES]
        contention = statuses.get("lock", Counter()).get(status_name(STATUS_LOCK_NOT_GRANTED), 0)
        idle = [n for n in NODES if not any(h.node == n for h in holds)]
        if idle or not contention or not acknowledged:
            harness_errors.append(
                f"nodes that granted nothing: {idle}; LOCK_NOT_GRANTED answers: {contention}; acknowledged writes: {len(acknowledged)}"
            )
        not_recovered = [ev for ev in chaos.events if ev.get("grants_again_after") is None]
        capped = [w.name for w in workers if len(w.writes) >= w.max_writes]

        rss = rss_figures(sampler.samples, args.warmup)
        heap = rss_figures(sampler.samples, args.warmup, "heap_kb")
        failures = []
        if overlaps or lost_unlocks:
            failures.append(f"exclusivity: {len(overlaps)} overlapping holds, {len(lost_unlocks)} unlocks answered RANGE_NOT_LOCKED")
        if missing:
            failures.append(f"acknowledged writes not on disk: {len(missing)} ({sum(len(x.data) for x in missing)} bytes)")
        if left_behind:
            failures.append(f"locks left behind: {left_behind}")
        if panics:
            failures.append(f"panics in the logs of {sorted(panics)}")
        if not_recovered:
            failures.append(f"nodes not granting again after an event: {[(e['kind'], e['node'], e['at']) for e in not_recovered]}")
        if exited:
            failures.append(f"nodes that exited by themselves: {exited}")
        if not all_registered:
            failures.append("not every node registered at the end")
        if harness_errors:
            failures.append("harness: " + "; ".join(harness_errors)[:2000])

        summary.update(
            {
                "duration_s": round(ended - start, 1),
                "workers": len(workers),
                "ops": dict(sorted(ops.items())),
                "statuses": {k: dict(v) for k, v in sorted(statuses.items())},
                "connections": sum(w.connections for w in workers),
                "reconnects_on_purpose": sum(w.reconnects for w in workers),
                "drops_while_holding": sum(w.drops_holding for w in workers),
                "lock_grants": len([h for h in holds if h.worker >= 0]),
                "lock_grants_per_node": dict(Counter(h.node for h in holds if h.worker >= 0)),
                "lock_not_granted": contention,
                "exclusivity_violations": len(overlaps) + len(lost_unlocks),
                "overlapping_holds": len(overlaps),
                "unlocks_range_not_locked": len(lost_unlocks),
                "violation_nodes": sorted({x.node for pair in overlaps for x in pair}),
                "violation_examples": overlap_examples(overlaps[:EXAMPLES], rel) if overlaps else "",
                "writes_sent": len(writes),
                "acknowledged_writes": len(acknowledged),
                "acknowledged_bytes": len(acknowledged) * RECORD,
                "missing_writes": len(missing),
                "missing_bytes": sum(len(x.data) for x in missing),
                "missing_examples": [
                    f"w{x.worker} #{x.seq} {x.data!r} at {x.offset}, answered {rel(x.request.answered)} on {x.request.node}, "
                    f"on disk {disk[x.offset : x.offset + len(x.data)]!r}"
                    for x in missing[:EXAMPLES]
                ],
                "workers_at_write_cap": capped,
                "locks_left_behind": left_behind,
                "request_timeouts": timeouts,
                "timeout_examples": [f"w{r.worker} {r.what} on {r.node} sent {rel(r.sent)}" for r in timeout_examples[:EXAMPLES]],
                "node_kills": sum(e["kind"] == "kill" for e in chaos.events),
                "partitions": sum(e["kind"] == "partition" for e in chaos.events),
                "events": chaos.events,
                "nodes_exited": exited,
                "rss": rss,
                "heap": heap,
                "etcd_compactions": sampler.compactions,
                "panics": panics,
                "node_logs": log_levels,
                "injected": injected,
                "harness_errors": harness_errors,
                "failures": failures,
                "ok": not failures,
                "samples": sampler.samples,
            }
        )
    except BaseException as e:  # setup failed, or interrupted: still report, still clean up
        summary["failures"] = summary.get("failures", []) + [f"harness: {type(e).__name__}: {e}"]
        summary["ok"] = False
        summary["traceback"] = traceback.format_exc()
        if chaos is not None:
            summary.setdefault("events", chaos.events)
        if sampler is not None:
            summary.setdefault("samples", sampler.samples)
    finally:
        stop.set()
        for n in nodes + extras:
            try:
                n.stop()
            except Exception as e:  # noqa: BLE001  (go on killing the others)
                summary.setdefault("cleanup_errors", []).append(f"{n.name}: {e}")
        for p in proxies.values():
            p.close()
        etcd.stop()

    summary.pop("started_monotonic", None)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    shown = {k: v for k, v in summary.items() if k != "samples"}
    print(json.dumps(shown, indent=2))
    print(f"soak: {'OK' if summary.get('ok') else 'FAILED'}; summary in {args.out}, logs in {base}")
    return 0 if summary.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
