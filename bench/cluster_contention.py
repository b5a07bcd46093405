#!/usr/bin/env python3
"""Open/close rates of a three-node Nimbus cluster against one Nimbus node
and one Samba smbd, same machine, same client, same run (issue 15).

    bash bench/run.sh --cluster [--seconds 5] [--nprocs 1 4 16 64] [--no-write] [--before NIMBUS]

The seed workload of the Samba team's cluster talk: smbtorture
`smb2.bench.path-contention-shared` (open and close of one path, as fast
as each connection can, for --seconds), at each --nprocs, in two cases,
and one of opens for data:

- **distinct**: nprocs smbtorture processes, each opening its own file
  through one connection; on the cluster, process i goes to node i mod 3.
  Nothing is contended: each file is used from one node alone.
- **shared**: one smbtorture process with nprocs connections opening one
  file; on the cluster its connections are spread over the three nodes
  (`--option=torture:unclist=...`). Every open is contended across nodes,
  but smbtorture opens for attributes only (SEC_FILE_READ_ATTRIBUTE).
- **shared-data**: nprocs processes of bench/data_open_loop.py, each with
  one connection (process i on node i mod 3), opening one file for
  reading and closing it: contended opens that take part in the sharing
  check and are recorded, as a program's users opening its shared files.
- **shared-lease**: shared-data, each process asking for a read and
  handle lease of its own, as Windows does when it opens a file to read:
  every open is granted one and every close lets it go.
- **create**: nprocs processes of bench/data_open_loop.py --create, each
  with one connection (process i on node i mod 3), making new files of
  its own and deleting them at close: two changes per pair that a
  directory watch would hear of, which a cluster node sends to the nodes
  watching (and asks etcd who does).
- **mixed**: the distinct case, measured while MIXED_NOISE more
  processes run the shared-data loop on one file beside (not counted):
  what a file the nodes share costs the other files of the same nodes.

Rows: the cluster (3 nodes on 127.0.0.1-3 on one 3-member etcd cluster,
all on this machine), one Nimbus node (embedded store), one smbd; each
rate is the sum over processes of the median of smbtorture's per-second
open rates (the first second dropped). For the cluster, etcd
transactions per open: etcd's revision advance during the run (every
write transaction advances it by one), less what the idle cluster writes
in the same time, over the opens counted. The ceiling a design with one
etcd transaction per open would hit is this machine's `etcdctl check
perf` write rate, printed beside.

With --before NIMBUS, an earlier build runs as the plain cluster too
(kind cluster-before, on a plain etcd of its own) in the same run, and a second
table sets each of its rows beside this build's: opens/s, etcd requests
and the members' and nodes' CPU per open.

Writes its tables into BENCHMARKS.md between the cluster markers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "tests"))
from etcd_cluster import EtcdCluster, EtcdError  # noqa: E402
from netutil import free_port, wait_listening  # noqa: E402
import data_open_loop  # noqa: E402
from side_by_side import PASSWORD, SHARE, USER, start_nimbus, start_smbd  # noqa: E402

MARK_BEGIN = "<!-- cluster: begin (written by bench/cluster_contention.py) -->"
MARK_END = "<!-- cluster: end -->"
HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
CASES = ["distinct", "shared", "shared-data", "shared-lease", "create", "mixed"]
# Processes opening the shared file beside the measured ones in `mixed`.
MIXED_NOISE = 6
# etcd's count of answered key-value calls (Range, Txn, Put, DeleteRange).
KV_REQUESTS = re.compile(r'^grpc_server_handled_total\{[^}]*grpc_service="etcdserverpb\.KV"[^}]*\} (\S+)$', re.M)


class Target:
    """Where smbtorture goes: one address, or the three nodes."""

    def __init__(self, name: str, hosts: list[str], port: int, share_dir: Path, etcd: EtcdCluster | None = None):
        self.name, self.hosts, self.port, self.share_dir, self.etcd = name, hosts, port, share_dir, etcd
        self.node_pids: list[int] = []  # the cluster's nodes, for their CPU time

    def cpu(self) -> tuple[float, float]:
        """CPU seconds (user and system) used so far by the etcd members and
        by the nodes."""
        members = [m.process.pid for m in self.etcd.members if m.alive()] if self.etcd else []
        return sum(map(cpu_seconds, members)), sum(map(cpu_seconds, self.node_pids))

    def revision(self) -> int:
        out = json.loads(self.etcd.etcdctl("endpoint", "status", "-w", "json"))
        return max(int(m["Status"]["header"]["revision"]) for m in out)

    def requests(self) -> int:
        """Key-value requests (reads and writes) the etcd members have
        answered so far, from their Prometheus counters."""
        total = 0
        for i in range(len(self.etcd.members)):
            text = self.etcd.metrics(i)
            total += sum(int(float(m.group(1))) for m in KV_REQUESTS.finditer(text))
        return total


def pause(etcd: EtcdCluster, paused: bool) -> None:
    """Stops (SIGSTOP) or continues (SIGCONT) every member of `etcd`."""
    for m in etcd.members:
        if m.alive():
            m.process.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (proc(5), fields 14 and 15), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def node_config(
    name: str, host: str, port: int, db: Path, share_dir: Path, etcd: EtcdCluster, ca_share: str | None = None, cluster_extra: tuple[str, ...] = ()
) -> str:
    """A cluster node's configuration file: one share, no inotify watches;
    with `ca_share`, the same directory again under that name as a
    continuously available share (persistent handles, kept in etcd);
    `cluster_extra`: more lines of its `[cluster]` section."""
    ca = ["[[share]]", f"name = {json.dumps(ca_share)}", f"path = {json.dumps(str(share_dir))}", "continuous_availability = true"] if ca_share else []
    lines = [
        f'listen = ["{host}:{port}"]',
        f"user_db = {json.dumps(str(db))}",
        "[security]",
        'signing = "auto"',
        "[[share]]",
        f'name = "{SHARE}"',
        f"path = {json.dumps(str(share_dir))}",
        *ca,
        "[limits]",
        "max_inotify_watches = 0",
        "[cluster]",
        *etcd.node_toml_lines(),
        f'node = "{name}"',
        f'advertise = "{host}:{port}"',
        *cluster_extra,
    ]
    return "\n".join(lines) + "\n"


def start_cluster(
    nimbus: str, state: Path, share_dir: Path, etcd: EtcdCluster, cluster_extra: tuple[str, ...] = (), tagged: bool = True
) -> tuple[Target, list[subprocess.Popen]]:
    """Three nodes, one port on three loopback addresses (smbtorture's
    unclist names hosts; the port is one for all). Without `tagged`, the
    nodes are given no cluster secret (a build from before it existed)."""
    db = state / "users.db"
    subprocess.run([nimbus, "user", "add", USER, "--db", str(db), "--password-stdin"], input=PASSWORD + "\n", text=True, check=True, capture_output=True)
    port = free_port()
    procs = []
    for i, host in enumerate(HOSTS):
        name = f"n{i + 1}"
        conf = state / f"{name}.toml"
        text = node_config(name, host, port, db, share_dir, etcd, cluster_extra=cluster_extra)
        if not tagged:
            text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("secret_file"))
        conf.write_text(text)
        log = open(state / f"{name}.log", "wb")
        procs.append(subprocess.Popen([nimbus, "serve", "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT))
        try:
            wait_listening(port, procs[-1], name, host=host)
        except (RuntimeError, TimeoutError) as e:
            for p in procs:
                p.kill()
            sys.exit(f"{e}:\n{(state / f'{name}.log').read_text(errors='replace')[-2000:]}")
    target = Target("Nimbus, 3-node cluster", HOSTS, port, share_dir, etcd)
    target.node_pids = [p.pid for p in procs]
    return target, procs


def torture(target: Target, host: str, path: str, nprocs: int, seconds: int, unclist: Path | None) -> subprocess.Popen:
    args = [
        "smbtorture", f"//{host}/{SHARE}", "-p", str(target.port), "-U", f"{USER}%{PASSWORD}",
        "smb2.bench.path-contention-shared",
        f"--option=torture:bench_path={path}", f"--option=torture:nprocs={nprocs}",
        f"--option=torture:timelimit={seconds}",
    ]  # fmt: skip
    if unclist:
        args.append(f"--option=torture:unclist={unclist}")
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def rate_of(proc: subprocess.Popen, seconds: int, what: str) -> tuple[float, int]:
    """(median per-second open rate, opens counted) of one smbtorture run."""
    out, _ = proc.communicate(timeout=seconds + 300)
    rates = [int(r) for r in re.findall(r"open\[num/s=(\d+)", out)]
    if proc.returncode != 0 or "success: path-contention-shared" not in out or len(rates) < 2:
        sys.exit(f"smbtorture ({what}) failed:\n{out[-3000:]}")
    return statistics.median(rates[1:]), sum(rates)


def run_case(target: Target, case: str, nprocs: int, seconds: int, work: Path, idle: tuple[float, float]) -> dict:
    noise = None
    if target.etcd:
        # As an operator's etcd does (--auto-compaction-*): without it the
        # history of a few rounds of contended opens fills the harness's
        # 64 MiB quota, and etcd's NOSPACE alarm refuses every write.
        try:
            target.etcd.etcdctl("compact", str(target.revision()))
        except EtcdError as e:
            # Nothing written since the last compaction (a case that makes
            # no write, the status listings unchanged): already compact.
            if "required revision has been compacted" not in e.stderr:
                raise
    before = target.revision() if target.etcd else 0
    requests_before = target.requests() if target.etcd else 0
    cpu_before = target.cpu()
    started = time.monotonic()
    if case in ("shared-data", "shared-lease"):
        (target.share_dir / "shared-data.dat").write_bytes(b"x")
        lease = case == "shared-lease"
        opens, rate = data_open_loop.run(target.hosts, target.port, SHARE, USER, PASSWORD, "shared-data.dat", nprocs, seconds, lease)
        results = [(rate, opens)]
    elif case == "create":
        (target.share_dir / "made").mkdir(exist_ok=True)
        opens, rate = data_open_loop.run(target.hosts, target.port, SHARE, USER, PASSWORD, r"made\new", nprocs, seconds, create=True)
        results = [(rate, opens)]
    elif case in ("distinct", "mixed"):
        if case == "mixed":
            (target.share_dir / "shared-data.dat").write_bytes(b"x")
            hosts, port = target.hosts, target.port
            noise = threading.Thread(
                target=data_open_loop.run,
                args=(hosts, port, SHARE, USER, PASSWORD, "shared-data.dat", MIXED_NOISE, seconds + 4),
            )
            noise.start()
            # Its processes log on and start opening before the measured
            # ones do; it runs until after they end.
            time.sleep(2)
        for i in range(nprocs):
            (target.share_dir / f"own-{i}.dat").write_bytes(b"x")
        procs = [torture(target, target.hosts[i % len(target.hosts)], f"own-{i}.dat", 1, seconds, None) for i in range(nprocs)]
    else:
        (target.share_dir / "shared.dat").write_bytes(b"x")
        unclist = None
        if len(target.hosts) > 1:
            unclist = work / "unclist"
            unclist.write_text("".join(f"//{h}/{SHARE}\n" for h in target.hosts))
        procs = [torture(target, target.hosts[0], "shared.dat", nprocs, seconds, unclist)]
    if case not in ("shared-data", "shared-lease", "create"):
        results = [rate_of(p, seconds, f"{target.name}, {case}, nprocs {nprocs}") for p in procs]
    if case == "mixed" and noise:
        noise.join()
    elapsed = time.monotonic() - started
    if target.etcd and (alarms := target.etcd.etcdctl("alarm", "list").strip()):
        raise RuntimeError(f"{target.name}, {case}, nprocs {nprocs}: etcd raised alarms during the run: {alarms}")
    row = {"rate": sum(r for r, _ in results)}
    if target.etcd:
        opens = sum(n for _, n in results)
        writes = target.revision() - before - idle[0] * elapsed
        requests = target.requests() - requests_before - idle[1] * elapsed
        row["txn_per_open"] = max(writes, 0) / max(opens, 1)
        row["requests_per_open"] = max(requests, 0) / max(opens, 1)
        # Idle CPU not subtracted: small beside a run's (status every 2 s).
        (etcd_after, nodes_after), (etcd_before, nodes_before) = target.cpu(), cpu_before
        row["etcd_cpu_us_per_open"] = (etcd_after - etcd_before) * 1e6 / max(opens, 1)
        row["node_cpu_us_per_open"] = (nodes_after - nodes_before) * 1e6 / max(opens, 1)
    return row


def idle_rates(target: Target, seconds: float = 5.0) -> tuple[float, float]:
    """What the idle cluster writes (transactions) and asks of etcd (key-value
    requests) per second: subtracted from a run's counts."""
    before, requests = target.revision(), target.requests()
    time.sleep(seconds)
    return (target.revision() - before) / seconds, (target.requests() - requests) / seconds


def check_perf(etcd: EtcdCluster) -> str:
    """The write rate etcd sustains here. `check perf`'s workloads are
    rate-limited (small: 150 writes/s from 50 clients, large: 8000 from
    500), so the small one only says that 150 are reached; the large one's
    throughput is what the cluster manages, up to 8000 (it passes when it
    reaches the limit, fails with the rate it got otherwise)."""
    # Run here rather than through EtcdCluster.etcdctl: a FAIL verdict is a
    # non-zero exit with the rate on stdout.
    proc = subprocess.run(
        ["etcdctl", f"--endpoints={','.join(etcd.endpoints)}", "--command-timeout=240s", "check", "perf", "--load=l"],
        env={**os.environ, "ETCDCTL_API": "3"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    m = re.search(r"Throughput is (\d+) writes/s", out) or re.search(r"Throughput too low: (\d+) writes/s", out)
    if not m:
        return "not measured (" + (out.strip().splitlines() or ["no output"])[-1] + ")"
    limit = " (the workload's limit: at least that)" if "PASS: Throughput is" in out else ""
    return f"{m.group(1)} writes/s{limit}"


# cluster-tls: the same three nodes on a second etcd cluster, reached as a
# production one is (client and peer TLS, client certificates, a role on
# the prefix, the records tagged): what that costs against plain http://.
# cluster-tls-plain-peers and cluster-tls-no-auth take one part off it
# (TLS between the members; etcd's users and roles), each on an etcd of
# its own, to tell what each part costs.
TLS_KINDS = {
    "cluster-tls": dict(tls=True),
    "cluster-tls-plain-peers": dict(tls=True, peer_tls=False),
    "cluster-tls-no-auth": dict(tls=True, auth=False),
}
# Every cluster kind runs the nodes' default configuration, which grants
# leases through the node's groups of alike opens (`[cluster]
# group_leases`, docs/SCALING.md). cluster-per-lease is the plain cluster
# with that key off: each lease a grant of its own in the record.
EXTRA_KINDS = {"cluster-per-lease": ("group_leases = false",)}
# cluster-before: the plain cluster run by the binary of --before (an
# earlier build), on a plain etcd of its own made alike, in the same run:
# a change's before and after, each row beside the other.
BEFORE = "cluster-before"
KINDS = ["cluster", BEFORE, *TLS_KINDS, *EXTRA_KINDS, "single", "samba"]


def accepts_secret_file(nimbus: str, work: Path) -> bool:
    """Whether `nimbus` knows `[cluster] secret_file` (builds before the
    records were tagged refuse it as an unknown key)."""
    secret = work / "probe.secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    conf = work / "probe.toml"
    conf.write_text(
        f'listen = ["127.0.0.1:1"]\n[cluster]\netcd = ["http://127.0.0.1:1"]\nnode = "probe"\n'
        f'advertise = "127.0.0.1:1"\nsecret_file = {json.dumps(str(secret))}\n'
    )
    out = subprocess.run([nimbus, "config", "check", str(conf)], capture_output=True, text=True)
    return "unknown field `secret_file`" not in out.stdout + out.stderr


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=5, help="length of each smbtorture run")
    ap.add_argument("--nprocs", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--nimbus", default=str(REPO / "target" / "release" / "nimbus"))
    ap.add_argument(
        "--before",
        metavar="NIMBUS",
        help="an earlier build of nimbus, run as the plain cluster (kind cluster-before) in the same run "
        "on a plain etcd of its own: each cluster row before and after, with etcd's requests and CPU per open",
    )
    ap.add_argument("--output", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    ap.add_argument("--no-check-perf", action="store_true", help="skip etcdctl check perf --load=l (60 s)")
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs) under /dev/shm")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every kind this many times, the order of --kinds reversed on every other round "
        "(the kind run first tends to be the faster); rows are each key's median round, and the "
        "TLS / plain ratio of every round is printed",
    )
    ap.add_argument(
        "--kinds",
        nargs="+",
        choices=KINDS,
        help="which servers to measure (the cluster alone, say, to compare two builds of it); "
        f"default: all, {BEFORE} only with --before",
    )
    args = ap.parse_args()
    if args.kinds is None:
        args.kinds = [k for k in KINDS if k != BEFORE or args.before]
    if (BEFORE in args.kinds) != bool(args.before):
        sys.exit(f"--before and the kind {BEFORE} go together")
    for tool in ("smbtorture", "etcd", "etcdctl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: run through bash bench/run.sh --cluster, which installs it")

    runs: dict[tuple[str, str, int], list[dict]] = {}
    # Made only when kept: an unused one would be left behind by every run.
    work_dir = (
        contextlib.nullcontext(tempfile.mkdtemp(prefix="nimbus-cluster-bench-", dir="/dev/shm"))
        if args.keep
        else tempfile.TemporaryDirectory(prefix="nimbus-cluster-bench-", dir="/dev/shm")
    )
    with work_dir as tmp:
        work = Path(tmp)
        # "cluster" on plain http://: comparable with the runs measured
        # before the tests' etcd went TLS; "cluster-tls" on its own etcd.
        etcd = EtcdCluster(work / "etcd", tls=False)
        own_etcds: dict[str, EtcdCluster] = {}
        every_etcd = [etcd]
        cluster_procs: list[subprocess.Popen] = []
        before_tags = bool(args.before) and accepts_secret_file(args.before, work)
        try:
            etcd.start()
            # Every etcd the kinds use is made at the start, and only the
            # one a kind uses runs while it is measured: the others are
            # paused (SIGSTOP), so no kind pays for another's idle members
            # (a member heartbeats 20 times a second), and all kinds run
            # alike.
            for kind in args.kinds:
                # The build of --before gets a plain etcd of its own: what
                # one build keeps there another may not read.
                if kind in TLS_KINDS or kind == BEFORE:
                    own_etcds[kind] = EtcdCluster(work / f"etcd-{kind}", **TLS_KINDS.get(kind, dict(tls=False)))
                    every_etcd.append(own_etcds[kind])
                    own_etcds[kind].start()
            names = {
                "cluster": "Nimbus, 3-node cluster",
                BEFORE: "Nimbus, cluster, --before",
                "cluster-tls": "Nimbus, cluster, TLS etcd",
                "cluster-tls-plain-peers": "Nimbus, TLS, plain peers",
                "cluster-tls-no-auth": "Nimbus, TLS, no etcd auth",
                "cluster-per-lease": "Nimbus, cluster, a grant per lease",
                "single": "Nimbus, one node",
                "samba": "Samba, one node",
            }
            for kind, r in [(k, r) for r in range(args.rounds) for k in (args.kinds if r % 2 == 0 else args.kinds[::-1])]:
                state = work / f"{kind}-{r}"
                share = work / f"{kind}-{r}-share"
                state.mkdir()
                share.mkdir()
                server = None
                used = own_etcds.get(kind, etcd) if kind.startswith("cluster") else None
                for e in every_etcd:
                    pause(e, e is not used)
                if used is not None:
                    used.wait_healthy()
                if kind == BEFORE:
                    target, cluster_procs = start_cluster(args.before, state, share, own_etcds[kind], tagged=before_tags)
                    idle = idle_rates(target)
                elif kind.startswith("cluster"):
                    target, cluster_procs = start_cluster(args.nimbus, state, share, own_etcds.get(kind, etcd), EXTRA_KINDS.get(kind, ()))
                    idle = idle_rates(target)
                else:
                    server = start_nimbus(args.nimbus, state, share) if kind == "single" else start_smbd(state, share)
                    target = Target(names[kind], ["127.0.0.1"], server.port, share)
                    idle = (0.0, 0.0)
                try:
                    for case in args.cases:
                        for n in args.nprocs:
                            row = run_case(target, case, n, args.seconds, work, idle)
                            runs.setdefault((kind, case, n), []).append(row)
                            extra = (
                                f", {row['txn_per_open']:.3f} etcd txn/open, {row['requests_per_open']:.3f} etcd requests/open, "
                                f"CPU per open: etcd {row['etcd_cpu_us_per_open']:.0f} µs, nodes {row['node_cpu_us_per_open']:.0f} µs"
                                if "txn_per_open" in row
                                else ""
                            )
                            print(f"{names[kind]:24} {case:8} nprocs {n:3} round {r + 1}: {row['rate']:8.0f} opens/s{extra}", flush=True)
                finally:
                    if server:
                        server.stop()
                    for p in cluster_procs:
                        p.terminate()
                        p.wait(timeout=20)
                    cluster_procs = []
            for e in every_etcd:
                pause(e, e is not etcd)
            etcd.wait_healthy()
            perf = "not measured" if args.no_check_perf else check_perf(etcd)
        finally:
            # All continued first: a stop that fails leaves none paused.
            for e in every_etcd:
                pause(e, False)
            for e in every_etcd:
                try:
                    e.stop()
                except Exception as err:  # the next ones are stopped all the same
                    print(f"stopping etcd in {e.base_dir}: {err}", file=sys.stderr)

    # Each key's median round (by rate).
    results = {key: sorted(rows, key=lambda row: row["rate"])[(len(rows) - 1) // 2] for key, rows in runs.items()}
    table = render(results, args.nprocs, perf, args.seconds)
    print(table)
    if args.rounds > 1 and "cluster" in args.kinds:
        for kind in TLS_KINDS:
            if kind in args.kinds:
                print(f"{kind}:\n{tls_rounds(runs, args.cases, args.nprocs, kind)}")
    if BEFORE in args.kinds:
        table += "\n" + before_table(runs, args.cases, args.nprocs, args.before, before_tags)
        print(table[table.index("\n" + BEFORE_HEADING) :])
    if not args.no_write:
        write(Path(args.output), table)
    return 0


def render(results: dict, nprocs: list[int], perf: str, seconds: int) -> str:
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"## A three-node cluster against one node and Samba ({date.today().isoformat()}, nimbus {rev or '(no git)'})",
        "",
        "`bash bench/run.sh --cluster` (bench/cluster_contention.py): smbtorture",
        f"`smb2.bench.path-contention-shared`, {seconds} s per run, opens per second (sum over",
        "processes of each one's median second). *distinct*: one file per process, process i on",
        "node i mod 3. *shared*: one file, the connections spread over the three nodes",
        "(`torture:unclist`); its opens are for attributes only. *shared-data*: one file opened for",
        "reading (GENERIC_READ, sharing everything, no oplock) and closed by nprocs raw-SMB client",
        "processes (bench/data_open_loop.py), process i on node i mod 3; every open is recorded",
        "among the file's opens. *shared-lease*: shared-data, each process asking for a read and",
        "handle lease of its own (as Windows does opening a file to read). *create*: nprocs",
        "processes making new files of their own, deleted at close (bench/data_open_loop.py",
        "--create; two changes a directory watch hears of per pair). *mixed*: the distinct",
        f"case's rate while {MIXED_NOISE} more processes run the shared-data loop beside it (their opens",
        "not counted in the rate; etcd txn/open is all writes, theirs included, over the measured",
        "opens): what a file the nodes share costs the other files of the same nodes.",
        "All three nodes, the three etcd members, Samba and the clients share",
        f"this machine's 2 cores. etcd ceiling (`etcdctl check perf --load=l`, same cluster): {perf}.",
        "*etcd txn/open*: write transactions (etcd's revision advance) per open; *etcd",
        "requests/open*: every key-value call, reads included (the members' Prometheus counters);",
        "both less what the idle cluster does in the same time.",
        "",
        "*cluster, TLS etcd*: the same nodes on a second etcd reached as a production one is",
        "(client and peer TLS, client certificates, a role on the prefix only, records tagged with",
        "the cluster secret); *TLS / plain* its rate over the cluster's.",
        "",
        "| case | nprocs | 3-node cluster | etcd txn/open | etcd requests/open | cluster, TLS etcd | TLS / plain | one Nimbus node | Samba | cluster / one node | cluster / Samba |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in CASES:
        for n in nprocs:
            if ("cluster", case, n) not in results:  # the cluster not run: nothing to compare
                continue
            c, s, b = results[("cluster", case, n)], results.get(("single", case, n)), results.get(("samba", case, n))
            t = results.get(("cluster-tls", case, n))
            tls_ratio = f"{t['rate'] / max(c['rate'], 1):.2f}" if t else "-"

            def rate(r):
                return f"{r['rate']:.0f}" if r else "not run"

            def ratio(r):
                return f"{c['rate'] / max(r['rate'], 1):.2f}" if r else "-"

            lines.append(
                f"| {case} | {n} | {c['rate']:.0f} | {c['txn_per_open']:.3f} | {c['requests_per_open']:.3f} | {rate(t)} | "
                f"{tls_ratio} | {rate(s)} | {rate(b)} | {ratio(s)} | {ratio(b)} |"
            )
    return "\n".join(lines) + "\n"


BEFORE_HEADING = "Before and after (`--before`"


def before_table(runs: dict[tuple[str, str, int], list[dict]], cases: list[str], nprocs: list[int], before: str, tagged: bool) -> str:
    """The plain cluster of --before against this build's, each the median
    round: opens/s, and what etcd and the nodes spent per open."""
    lines = [
        f"{BEFORE_HEADING} {before}, plain etcd{'' if tagged else ', records untagged: it has no cluster secret'}):",
        "",
        "| case | nprocs | before, opens/s | after, opens/s | after / before | etcd requests/open, before / after | "
        "etcd CPU µs/open, before / after | nodes' CPU µs/open, before / after |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def median(kind: str, case: str, n: int) -> dict | None:
        rows = sorted(runs.get((kind, case, n), []), key=lambda row: row["rate"])
        return rows[(len(rows) - 1) // 2] if rows else None

    for case in cases:
        for n in nprocs:
            b, a = median(BEFORE, case, n), median("cluster", case, n)
            if not (a and b):
                continue
            per_open = " | ".join(
                f"{b[key]:.{digits}f} / {a[key]:.{digits}f}"
                for key, digits in (("requests_per_open", 3), ("etcd_cpu_us_per_open", 0), ("node_cpu_us_per_open", 0))
            )
            lines.append(f"| {case} | {n} | {b['rate']:.0f} | {a['rate']:.0f} | {a['rate'] / max(b['rate'], 1):.2f} | {per_open} |")
    return "\n".join(lines) + "\n"


def tls_rounds(runs: dict[tuple[str, str, int], list[dict]], cases: list[str], nprocs: list[int], kind: str = "cluster-tls") -> str:
    """`kind` (a TLS etcd) over plain in each round (the kinds of one round
    ran next to each other, in the round's order), and their geometric
    mean."""
    lines = [
        "| case | nprocs | TLS / plain, each round | geometric mean | etcd requests/open, plain / TLS | "
        "etcd CPU µs/open, plain / TLS | nodes' CPU µs/open, plain / TLS |",
        "|---|---|---|---|---|---|---|",
    ]

    def median(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    for case in cases:
        for n in nprocs:
            plain, tls = runs.get(("cluster", case, n), []), runs.get((kind, case, n), [])
            ratios = [t["rate"] / max(p["rate"], 1) for p, t in zip(plain, tls)]
            if ratios:
                mean = statistics.geometric_mean(ratios) if all(x > 0 for x in ratios) else 0.0
                both = " | ".join(
                    f"{median(plain, key):.{digits}f} / {median(tls, key):.{digits}f}"
                    for key, digits in (("requests_per_open", 3), ("etcd_cpu_us_per_open", 0), ("node_cpu_us_per_open", 0))
                )
                lines.append(f"| {case} | {n} | {' '.join(f'{x:.2f}' for x in ratios)} | {mean:.2f} | {both} |")
    return "\n".join(lines) + "\n"


def write(path: Path, table: str) -> None:
    text = path.read_text() if path.exists() else ""
    block = f"{MARK_BEGIN}\n{table}{MARK_END}\n"
    if MARK_BEGIN in text and MARK_END in text:
        head, rest = text.split(MARK_BEGIN, 1)
        tail = rest.split(MARK_END, 1)[1].lstrip("\n")
        text = head + block + "\n" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.write_text(text)
    print(f"written to {path}")


if __name__ == "__main__":
    sys.exit(main())
