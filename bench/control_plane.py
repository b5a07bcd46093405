#!/usr/bin/env python3
"""What a Nimbus cluster's control plane asks of etcd, at 3, 16 and 64
nodes (issue 49).

    bash bench/run.sh --control-plane [--nodes 3 16 64] [--seconds 60] [--rate 1]

For each cluster size N: one 3-member etcd cluster (plain http://, data on
tmpfs) and N nodes on 127.0.0.1..N, one port, one share (and its
directory again as a continuously available share, for 6). Once every node
listens and has registered, the cluster is left alone for --settle
seconds, then measured six ways:

1. **idle**, for --seconds, no client;
2. **light load, own files**, for --seconds: one client per node (its own
   session, all in this process) opening and closing, --rate times a
   second each, a file of its own (GENERIC_READ, all sharing allowed, no
   oplock): the control plane's cost of a light load spread over all
   nodes;
3. **light load, mixed**: the same with new clients, each opening
   alternately its own file and one file every client shares: the shared
   file's records live in etcd, and each change of them reaches every
   node's watch. At 64 nodes some opens of the shared file are refused
   with STATUS_INSUFFICIENT_RESOURCES (a share-mode record contended from
   every node, the limit docs/SCALING.md describes): 2 measures the load
   without that file;
4. **join and leave**, once the loads have settled (12 s or --settle):
   node N+1 starts (counted from its launch to 3 s after it listens),
   then gets SIGTERM (counted until it exits and 1 s more);
5. **reclaim**: a client of node N holds a file open with no sharing;
   node N gets SIGKILL; a client of node 1, logged on before, tries an
   exclusive open every 100 ms: the time from the kill to the first open
   granted (the file's ownership goes with node N's lease, after
   `node_ttl_secs`, 10 s by default);
6. **persistent reclaim** (3 nodes or more): a client of node N-1 opens a
   file on the continuously available share (the same directory, SMB
   3.1.1, a DH2Q create context with SMB2_DHANDLE_FLAG_PERSISTENT, MS-SMB2
   2.2.13.2.11; the run stops unless the answer's DH2Q grants it
   persistent); node N-1 gets SIGKILL; the same client (same ClientGuid
   and user, a new connection and session to node 1, logged on before)
   sends a CREATE with a DH2C reconnect context (2.2.13.2.12, flag
   PERSISTENT) every 100 ms after each refusal: the time from the kill to
   the reclaim granted, checked to be the same open (its FileId's
   persistent part). While node N-1's membership lives, node 1 asks it to
   let go of the open and waits up to 5 s (LET_GO_WAIT) for an answer
   that does not come (STATUS_PENDING meanwhile), then refuses the
   reconnect (STATUS_OBJECT_NAME_NOT_FOUND); a reconnect waiting when the
   lease ends is run again at once and takes the open over
   (`crates/nimbus-node/src/failover.rs`).

In 1 to 3:

- etcd write transactions per second: the revision's advance (every write
  transaction advances it by one);
- key-value calls per second by method (Range, Txn, Put, DeleteRange), and
  lease keep-alive messages, from the members' Prometheus counters summed
  over the members;
- watch events sent and watchers open (etcd_debugging_mvcc_*);
- CPU seconds per second of the nodes together and of etcd's members.

Each figure is also given per node. Prints Markdown tables; a background
cost that does not grow with N shows as a per-node rate that falls as N
grows.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "tests"))
from etcd_cluster import EtcdCluster  # noqa: E402
from netutil import free_port, wait_listening  # noqa: E402
from side_by_side import PASSWORD, SHARE, USER  # noqa: E402
from cluster_contention import cpu_seconds, node_config  # noqa: E402
from meta_loop import CLOSE, Client, close_body  # noqa: E402
import rawsmb  # noqa: E402  (meta_loop put tests/ on the path)
import test_durable  # noqa: E402
import test_persistent  # noqa: E402
from smbprotocol.exceptions import SMBResponseException  # noqa: E402

HANDLED = re.compile(r'^grpc_server_handled_total\{([^}]*)\} (\S+)$', re.M)
RECEIVED = re.compile(r'^grpc_server_msg_received_total\{([^}]*)\} (\S+)$', re.M)
METHOD = re.compile(r'grpc_method="([^"]+)"')
EVENTS = re.compile(r"^etcd_debugging_mvcc_events_total (\S+)$", re.M)
WATCHERS = re.compile(r"^etcd_debugging_mvcc_watcher_total (\S+)$", re.M)
KV_METHODS = ("Range", "Txn", "Put", "DeleteRange")
# The continuously available share of every node: SHARE's directory again.
CA_SHARE = "ca"
# The light loads, in the order run: key, what the table calls it, the
# file every client opens besides its own (None: its own file alone).
LOADS = (("own", "own files", None), ("mixed", "own and shared file", "shared.dat"))
# What a persistent reconnect may be answered before its open is taken
# over: no such open here (yet), or the file held by an open another
# node decides (MS-SMB2 3.3.5.9: STATUS_FILE_NOT_AVAILABLE).
NOT_YET = (test_durable.STATUS_OBJECT_NAME_NOT_FOUND, test_persistent.STATUS_FILE_NOT_AVAILABLE)


def counters(etcd: EtcdCluster) -> dict[str, float]:
    """Every member's counters summed: calls per key-value method, lease
    keep-alive messages, watch events sent, watchers open."""
    out: dict[str, float] = {}
    for i in range(len(etcd.members)):
        text = etcd.metrics(i)
        for labels, value in HANDLED.findall(text):
            m = METHOD.search(labels)
            if m and m.group(1) in KV_METHODS:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(value)
        for labels, value in RECEIVED.findall(text):
            m = METHOD.search(labels)
            if m and m.group(1) == "LeaseKeepAlive":
                out["keepalive"] = out.get("keepalive", 0.0) + float(value)
        for pattern, key in ((EVENTS, "events"), (WATCHERS, "watchers")):
            m = pattern.search(text)
            if m:
                out[key] = out.get(key, 0.0) + float(m.group(1))
    return out


def revision(etcd: EtcdCluster) -> int:
    out = json.loads(etcd.etcdctl("endpoint", "status", "-w", "json"))
    return max(int(m["Status"]["header"]["revision"]) for m in out)


def start_nodes(nimbus: str, work: Path, etcd: EtcdCluster, n: int, port: int, first: int = 0) -> list[subprocess.Popen]:
    """Nodes first+1 .. first+n on 127.0.0.<i>:port; returns once all
    listen."""
    db = work / "users.db"
    if not db.exists():
        subprocess.run([nimbus, "user", "add", USER, "--db", str(db), "--password-stdin"], input=PASSWORD + "\n", text=True, check=True, capture_output=True)
    share = work / "share"
    share.mkdir(exist_ok=True)
    procs: list[subprocess.Popen] = []
    for i in range(first, first + n):
        name, host = f"n{i + 1}", f"127.0.0.{i + 1}"
        conf = work / f"{name}.toml"
        conf.write_text(node_config(name, host, port, db, share, etcd, ca_share=CA_SHARE))
        log = open(work / f"{name}.log", "wb")
        procs.append(subprocess.Popen([nimbus, "serve", "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT))
    for i, p in enumerate(procs, start=first):
        try:
            wait_listening(port, p, f"n{i + 1}", timeout=120, host=f"127.0.0.{i + 1}")
        except (RuntimeError, TimeoutError) as e:
            stop(procs)
            sys.exit(f"{e}:\n{(work / f'n{i + 1}.log').read_text(errors='replace')[-2000:]}")
    return procs


def exclusive_create_body(name: str) -> bytes:
    """MS-SMB2 2.2.13 SMB2 CREATE Request: open or make `name` for reading
    and writing, sharing nothing (DesiredAccess GENERIC_READ |
    GENERIC_WRITE, ShareAccess 0, CreateDisposition FILE_OPEN_IF,
    CreateOptions NON_DIRECTORY_FILE)."""
    n = name.encode("utf-16-le")
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, 0xC0000000, 0x80, 0, 3, 0x40, rawsmb.HEADER_SIZE + 56, len(n), 0, 0) + n


def logged_on(host: str, port: int) -> Client:
    c = Client(host, port)
    c.sock.settimeout(120)
    c.logon(USER, PASSWORD, f"\\\\{host}\\{SHARE}")
    return c


def pair(c: Client, body: bytes) -> None:
    resp = c.call(rawsmb.CREATE, body)
    c.call(CLOSE, close_body(resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]))


def light_load(clients: list[Client], rate: float, shared: str | None, stop: threading.Event, done: list[int], failures: list[str]) -> list[threading.Thread]:
    """One thread per client: a pair every 1/rate s, of its own file, or
    its own file and `shared` in turn; counts pairs in done[k], and a
    client's failure (which ends its thread) in `failures`."""

    def run(k: int, c: Client) -> None:
        bodies = [rawsmb.create_body(f"own-{k}.dat")] + ([rawsmb.create_body(shared)] if shared else [])
        next_at = time.monotonic() + (k / len(clients)) / rate
        while not stop.is_set():
            time.sleep(max(0.0, next_at - time.monotonic()))
            try:
                pair(c, bodies[done[k] % len(bodies)])
            except (OSError, RuntimeError) as e:
                failures.append(f"client {k}: {e}")
                return
            done[k] += 1
            next_at += 1 / rate

    threads = [threading.Thread(target=run, args=(k, c), daemon=True) for k, c in enumerate(clients)]
    for t in threads:
        t.start()
    return threads


def loaded(etcd: EtcdCluster, procs: list[subprocess.Popen], clients: list[Client], rate: float, shared: str | None, seconds: float) -> dict[str, float]:
    """`measure` while the clients run `light_load` (begun 2 s before),
    with the pairs per second they managed and the number of clients a
    refused open ended (the rate is what the rest managed)."""
    stop_load, done, failures = threading.Event(), [0] * len(clients), []
    threads = light_load(clients, rate, shared, stop_load, done, failures)
    time.sleep(2)
    before, t0 = sum(done), time.monotonic()
    row = measure(etcd, procs, seconds)
    row["pairs"] = (sum(done) - before) / (time.monotonic() - t0)
    stop_load.set()
    for t in threads:
        t.join(timeout=30)
    row["refused"] = len(failures)
    if failures:
        print(f"light load ({'own files and ' + shared if shared else 'own files'}), refused: " + "; ".join(failures[:5]), file=sys.stderr)
    return row


def counted(etcd: EtcdCluster, action) -> dict[str, float]:
    """etcd writes and key-value calls while `action` runs."""
    c0, r0 = counters(etcd), revision(etcd)
    action()
    c1, r1 = counters(etcd), revision(etcd)
    return {"writes": r1 - r0, "requests": sum(c1.get(k, 0.0) - c0.get(k, 0.0) for k in KV_METHODS), "events": c1.get("events", 0.0) - c0.get("events", 0.0)}


def reclaim_time(procs: list[subprocess.Popen], port: int, n: int) -> float:
    """Seconds from SIGKILL of node n (1-based) until node 1's client is
    granted the exclusive open that node n's client held."""
    holder, other = logged_on(f"127.0.0.{n}", port), logged_on("127.0.0.1", port)
    body = exclusive_create_body("held.dat")
    holder.call(rawsmb.CREATE, body)
    other.call(rawsmb.CREATE, body, expect=(0xC0000043,))  # STATUS_SHARING_VIOLATION while held
    killed = time.monotonic()
    procs[n - 1].send_signal(signal.SIGKILL)
    procs[n - 1].wait()
    deadline = killed + 120
    while time.monotonic() < deadline:
        resp = other.call(rawsmb.CREATE, body, expect=(0, 0xC0000043))
        if rawsmb.status(resp) == 0:
            took = time.monotonic() - killed
            other.call(CLOSE, close_body(resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]))
            return took
        time.sleep(0.1)
    raise TimeoutError(f"held.dat was not granted within 120 s of node {n}'s kill")


def persistent_reclaim_time(procs: list[subprocess.Popen], port: int, n: int) -> tuple[float, dict[str, int]]:
    """Seconds from SIGKILL of node n (1-based) until its client, on node 1,
    is granted the reconnect of the persistent handle it had on node n;
    and the refusals met before, by status."""
    client_guid, create_guid = uuid.uuid4(), uuid.uuid4()
    holder = test_durable.Client(test_persistent.Node(f"127.0.0.{n}", port, CA_SHARE, USER, PASSWORD), client_guid)
    again = None
    try:
        again = test_durable.Client(test_persistent.Node("127.0.0.1", port, CA_SHARE, USER, PASSWORD), client_guid)
        file_id = test_persistent.persistent_open_uncached(holder, "persistent.dat", create_guid).file_id
        killed = time.monotonic()
        procs[n - 1].send_signal(signal.SIGKILL)
        procs[n - 1].wait()
        holder.drop()
        refused: dict[str, int] = {}
        deadline = killed + 120
        while time.monotonic() < deadline:
            try:
                f = test_persistent.reconnect_uncached(again, "persistent.dat", file_id, create_guid)
            except SMBResponseException as e:
                if e.status not in NOT_YET:
                    raise
                refused[f"{e.status:#010x}"] = refused.get(f"{e.status:#010x}", 0) + 1
                time.sleep(0.1)
                continue
            took = time.monotonic() - killed
            if f.file_id[:8] != file_id[:8]:
                raise RuntimeError(f"the reconnect was answered with another open: FileId {f.file_id.hex()}, not {file_id.hex()}")
            f.close()
            return took, refused
        raise TimeoutError(f"the persistent handle was not reclaimed within 120 s of node {n}'s kill (refused: {refused})")
    finally:
        holder.close()
        if again:
            again.close()


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def measure(etcd: EtcdCluster, procs: list[subprocess.Popen], seconds: float) -> dict[str, float]:
    members = [m.process.pid for m in etcd.members]
    c0, r0 = counters(etcd), revision(etcd)
    n0, e0 = sum(cpu_seconds(p.pid) for p in procs), sum(map(cpu_seconds, members))
    t0 = time.monotonic()
    time.sleep(seconds)
    c1, r1 = counters(etcd), revision(etcd)
    n1, e1 = sum(cpu_seconds(p.pid) for p in procs), sum(map(cpu_seconds, members))
    dt = time.monotonic() - t0
    row = {k: (c1.get(k, 0.0) - c0.get(k, 0.0)) / dt for k in (*KV_METHODS, "keepalive", "events")}
    row["writes"] = (r1 - r0) / dt
    row["watchers"] = c1.get("watchers", 0.0)
    row["node_cpu"] = (n1 - n0) / dt
    row["etcd_cpu"] = (e1 - e0) / dt
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[3, 16, 64])
    ap.add_argument("--seconds", type=float, default=60.0, help="length of the idle and the loaded measurement")
    ap.add_argument("--settle", type=float, default=15.0, help="idle time before measuring")
    ap.add_argument("--rate", type=float, default=1.0, help="open/close pairs per second of each node's client under light load")
    ap.add_argument("--nimbus", default=str(REPO / "target" / "release" / "nimbus"))
    args = ap.parse_args()
    for tool in ("etcd", "etcdctl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: run through bash bench/run.sh, which installs it")
    if max(args.nodes) > 253:
        sys.exit("--nodes: at most 253 (one loopback address each, and one for the joining node)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nimbus-control-plane-", dir="/dev/shm") as tmp:
        for n in args.nodes:
            work = Path(tmp) / f"n{n}"
            work.mkdir()
            etcd = EtcdCluster(work / "etcd", tls=False)
            etcd.start()
            procs: list[subprocess.Popen] = []
            clients: list[Client] = []
            try:
                port = free_port()
                procs = start_nodes(args.nimbus, work, etcd, n, port)
                (work / "share" / "shared.dat").write_bytes(b"shared\n")
                time.sleep(args.settle)
                row: dict = {"nodes": n, "idle": measure(etcd, procs, args.seconds)}
                print(json.dumps(row), flush=True)

                for k in range(n):
                    (work / "share" / f"own-{k}.dat").write_bytes(b"own\n")
                for state, _, shared in LOADS:
                    clients = [logged_on(f"127.0.0.{i + 1}", port) for i in range(n)]
                    row[state] = loaded(etcd, procs, clients, args.rate, shared, args.seconds)
                    for c in clients:
                        c.sock.close()
                    clients = []
                    print(json.dumps(row), flush=True)

                # The loads' aftermath first: each node publishes its
                # changed figures (sessions and opens gone) within 10 s
                # (status.rs CLUSTER_CHANGED_EVERY), N writes that would
                # otherwise be counted as the join's.
                time.sleep(max(args.settle, 12))
                joined: list[subprocess.Popen] = []

                def join() -> None:
                    joined.extend(start_nodes(args.nimbus, work, etcd, 1, port, first=n))
                    procs.append(joined[0])  # stopped with the rest, whatever happens
                    time.sleep(3)

                row["join"] = counted(etcd, join)

                def leave() -> None:
                    joined[0].send_signal(signal.SIGTERM)
                    joined[0].wait(timeout=60)
                    time.sleep(1)

                row["leave"] = counted(etcd, leave)
                row["reclaim"] = reclaim_time(procs, port, n)
                # On node n-1: node n is dead already, and node 1 reclaims.
                row["persistent_reclaim"], row["persistent_refused"] = persistent_reclaim_time(procs, port, n - 1) if n >= 3 else (None, {})
                print(json.dumps(row), flush=True)
                rows.append(row)
            finally:
                for c in clients:
                    c.sock.close()
                stop(procs)
                etcd.stop()
    print()
    print("| nodes | state | etcd writes/s (per node) | key-value calls/s (per node) | Range/s | Txn/s | watch events/s (per write) | watchers | node CPU (s/s) | etcd CPU (s/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["nodes"]
        for state, label in (("idle", "idle"), *((key, label) for key, label, _ in LOADS)):
            m = r[state]
            calls = sum(m[k] for k in KV_METHODS)
            what = label if state == "idle" else f"{label}, {m['pairs']:.0f} pairs/s" + (f", {m['refused']} clients refused" if m["refused"] else "")
            per_write = f"{m['events'] / m['writes']:.1f}" if m["writes"] else "-"
            print(
                f"| {n} | {what} | {m['writes']:.2f} ({m['writes'] / n:.3f}) | {calls:.2f} ({calls / n:.3f}) | {m['Range']:.2f} | {m['Txn']:.2f} "
                f"| {m['events']:.1f} ({per_write}) | {m['watchers']:.0f} | {m['node_cpu']:.3f} | {m['etcd_cpu']:.3f} |"
            )
    print()
    print("| nodes | join: writes / calls | leave: writes / calls | reclaim after kill (s) | persistent reclaim after kill (s) | persistent reconnects refused before |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        j, lv = r["join"], r["leave"]
        persistent = "-" if r["persistent_reclaim"] is None else f"{r['persistent_reclaim']:.1f}"
        refused = ", ".join(f"{n} × {status}" for status, n in sorted(r["persistent_refused"].items())) or "-"
        print(f"| {r['nodes']} | {j['writes']:.0f} / {j['requests']:.0f} | {lv['writes']:.0f} / {lv['requests']:.0f} | {r['reclaim']:.1f} | {persistent} | {refused} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
