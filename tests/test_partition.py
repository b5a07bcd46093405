"""A real partition of a three-node cluster, while clients of every node
contend for exclusive byte-range locks on one file.

Node n3 reaches the etcd members only through proxies (tests/cut_proxy.py)
that the test cuts and heals; n1 and n2 reach them directly. Nine workers,
three per node, lock overlapping ranges of `contended.bin` and record the
moment each grant arrived and the moment each unlock left, on the one
monotonic clock of this machine. From those records the test checks what
a partition must not break:

1. exclusivity: no two clients hold overlapping ranges at the same time,
   and an unlock of a granted lock never finds it gone;
2. a node cut off from etcd answers every request within its TTL (a
   refusal, or the connection closed) and, once its lease can no longer be
   proven, grants nothing;
3. the nodes still in touch with etcd go on granting;
4. after the heal the cut node serves again, without a restart, under one
   lease that it keeps renewing.

The modes: etcd silent (blackhole), etcd refusing connections (refuse),
short cuts then a long one (flapping), and a cut between n3 and its own
clients while etcd stays reachable (client_side).

NIMBUS_PARTITION_RUNS (default 1) repeats each mode; `-s` shows each
run's summary (statuses seen, answer delays) when it passes.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import threading
import time
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import rawsmb
import test_oplocks as ol
from conftest import _SERVERS, add_user
from cut_proxy import CutProxy, ProxySet
from etcd_cluster import etcd_cluster  # noqa: F401  (the fixture)
from test_cluster import (
    LogOf,
    DELETE,
    READ_ATTRIBUTES,
    SHARE_ALL,
    STATUS_DELETE_PENDING,
    Client,
    FileInformationClass,
    LockClient,
    Node,
    Target,
    members,
    open_body,
    open_status,
    set_info,
    wait_until,
)
from test_locks import (
    CLOSE,
    EXCLUSIVE,
    FAIL_IMMEDIATELY,
    LOCK,
    STATUS_FILE_LOCK_CONFLICT,
    STATUS_INSUFFICIENT_RESOURCES,
    STATUS_LOCK_NOT_GRANTED,
    STATUS_PENDING,
    STATUS_RANGE_NOT_LOCKED,
    UNLOCK,
    WRITE,
    close_body,
    lock_body,
    message_id,
    write_body,
)

TTL = 4  # [cluster] node_ttl_secs: 2 can expire spuriously on a loaded machine
REQUEST_TIMEOUT = TTL + 2  # a worker gives up on an answer after this
ANSWER_BOUND = TTL + 1  # a cut node answers within this (check 2)
SETTLE_AFTER_CUT = 1.0  # requests sent this soon after a cut began are not held to ANSWER_BOUND
HEALTHY = 3.0  # seconds of traffic before the first cut
CUT = TTL + 6  # the long cut: the lease expires well within it
FLAPS = ((1.5, 1.0), (1.5, 1.0))  # (cut, heal) before the long cut in flapping mode, each shorter than TTL
SERVE_AGAIN_WAIT = 30.0  # after the heal, until one of n3's workers is granted a lock
LEASE_STABLE = 3 * TTL  # n3 keeps one lease this long after it serves again
MEMBERSHIP_POLL = 0.5  # between looks at etcd's membership records

FILE = "contended.bin"
FILE_SIZE = 64
OFFSETS = (0, 8, 16, 24)  # each range overlaps its neighbours
LENGTH = 16
HOLD = (0.02, 0.04)  # seconds a worker holds a granted lock
PACE = (0.005, 0.015)  # pause after a refused LOCK, so nine workers do not flood etcd
RECONNECT_PAUSE = 0.2
MAX_CONNECTS = 1000  # per worker, over the whole run
WORKERS_PER_NODE = 3
WORKER_LIFETIME = 120.0
PROBE_EVERY = 0.5  # a new probe client of n3
MAX_PROBES = 16  # probes under way at a time; a probe takes at most six requests
PROBE_LIFETIME = 6 * REQUEST_TIMEOUT
PROBE_OFFSET = 4096  # the probes' lock range: beyond every worker's
PROBE_INDEX = -1  # the probes' `worker` in the records

STATUS_MORE_PROCESSING_REQUIRED = 0xC0000016
NEGOTIATE, SESSION_SETUP, TREE_CONNECT, CREATE = rawsmb.NEGOTIATE, rawsmb.SESSION_SETUP, rawsmb.TREE_CONNECT, rawsmb.CREATE
FLAG_ASYNC = 0x2

# What a node that cannot prove its lease may answer a LOCK or a CREATE
# (both decided on the cluster's records) with, besides closing the
# connection or refusing it. To be narrowed to what the server is meant to
# answer once that is settled; every status seen is printed.
FENCED_REQUESTS = ("lock", "create")
ALLOWED_REFUSALS = {
    STATUS_LOCK_NOT_GRANTED,
    STATUS_FILE_LOCK_CONFLICT,
    STATUS_INSUFFICIENT_RESOURCES,
}

ANSWERED, CLOSED, REFUSED, TIMEOUT, ERROR = "answered", "closed", "refused", "timeout", "error"
# Outcomes that are an answer of the server: a status, or the connection
# closed or refused.
SERVER_ANSWERS = (ANSWERED, CLOSED, REFUSED)

MODES = ("blackhole", "refuse", "flapping", "client_side")
RUNS = int(os.environ.get("NIMBUS_PARTITION_RUNS", "1"))


# ----------------------------------------------------------------- records


@dataclass
class Request:
    worker: int
    node: str
    conn: int  # the worker's connection serial
    what: str  # connect, negotiate, session_setup, tree_connect, create, lock, unlock
    sent: float
    answered: float = 0.0  # when the answer (or the timeout, or the error) came
    outcome: str = ANSWERED
    status: int | None = None

    @property
    def delay(self) -> float:
        return self.answered - self.sent


@dataclass
class Hold:
    worker: int
    node: str
    conn: int
    offset: int
    granted: float  # the grant had arrived
    released: float = 0.0  # the unlock was about to be sent
    unlock: Request | None = None
    end: float = 0.0  # until when the hold is proven (see hold_end)

    def overlaps(self, other: Hold) -> bool:
        return self.offset < other.offset + LENGTH and other.offset < self.offset + LENGTH


@dataclass
class Timeline:
    cuts: list[tuple[float, float]] = field(default_factory=list)  # (cut began, heal began)
    heal_at: float | None = None  # the last heal
    served_again: threading.Event = field(default_factory=threading.Event)  # set when n3 grants after the last heal


# ------------------------------------------------------------------ client


class Session:
    """One connection of a worker or a probe (its `owner`, which has an
    index, a node name, the node's host, the address to connect to and a
    list of requests): an anonymous session on `pub` with contended.bin
    open. Every request is sent and answered in turn and recorded; any
    outcome but an answer leaves the session dead."""

    def __init__(self, owner: Worker | Prober, serial: int):
        self.worker, self.serial = owner, serial
        self.timeout = owner.request_timeout
        self.s: socket.socket | None = None
        self.mid, self.sid, self.tid, self.file_id = 0, 0, 0, b""

    def _record(self, what: str, sent: float, outcome: str, status: int | None = None) -> Request:
        r = Request(self.worker.index, self.worker.node, self.serial, what, sent, time.monotonic(), outcome, status)
        self.worker.requests.append(r)
        return r

    def establish(self) -> bool:
        w = self.worker
        sent = time.monotonic()
        try:
            self.s = socket.create_connection(w.address, timeout=self.timeout)
            self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except ConnectionRefusedError:
            self._record("connect", sent, REFUSED)
            return False
        except TimeoutError:
            self._record("connect", sent, TIMEOUT)
            return False
        except OSError:
            self._record("connect", sent, ERROR)
            return False
        self._record("connect", sent, ANSWERED, 0)
        r, resp = self.request("negotiate", NEGOTIATE, rawsmb.negotiate_body([0x0202, 0x0210]), credits=64)
        if r.status != 0:
            return False
        # MS-NLMP 2.2.1.1 NEGOTIATE_MESSAGE, then an AUTHENTICATE_MESSAGE
        # (2.2.1.3) with empty user and responses: an anonymous logon.
        negotiate = b"NTLMSSP\0" + struct.pack("<II", 1, 0x00088207) + b"\0" * 16
        r, resp = self.request("session_setup", SESSION_SETUP, rawsmb.session_setup_body(negotiate))
        if r.status != STATUS_MORE_PROCESSING_REQUIRED:
            return False
        self.sid = rawsmb.session_id(resp)
        empty = struct.pack("<HHI", 0, 0, 64)
        authenticate = b"NTLMSSP\0" + struct.pack("<I", 3) + empty * 6 + struct.pack("<I", 0x00088A05)
        r, resp = self.request("session_setup", SESSION_SETUP, rawsmb.session_setup_body(authenticate))
        if r.status != 0:
            return False
        r, resp = self.request("tree_connect", TREE_CONNECT, rawsmb.tree_connect_body(rf"\\{w.host}\pub"))
        if r.status != 0:
            return False
        self.tid = struct.unpack_from("<I", resp, 36)[0]
        # Read and write access, every sharing mode, the file exists.
        r, resp = self.request("create", CREATE, open_body(FILE, 0x0012019F, 7))
        if r.status != 0:
            return False
        self.file_id = resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]
        return True

    def request(self, what: str, command: int, body: bytes, credits: int = 8) -> tuple[Request, bytes]:
        """Sends one request and waits for its final answer, at most the
        owner's request_timeout (an interim STATUS_PENDING is skipped)."""
        mid = self.mid
        self.mid += 1
        hdr = rawsmb.header(command, mid, credit_request=credits, session_id=self.sid, tree_id=self.tid)
        sent = time.monotonic()
        deadline = sent + self.timeout
        try:
            self.s.sendall(rawsmb.frame(hdr + body))
            while True:
                self.s.settimeout(max(0.01, deadline - time.monotonic()))
                resp = rawsmb.recv_message(self.s)
                if time.monotonic() > deadline:
                    raise TimeoutError
                if message_id(resp) != mid:
                    continue
                flags = struct.unpack_from("<I", resp, 16)[0]
                if rawsmb.status(resp) == STATUS_PENDING and flags & FLAG_ASYNC:
                    continue
                return self._record(what, sent, ANSWERED, rawsmb.status(resp)), resp
        except TimeoutError:
            outcome = TIMEOUT
        except ConnectionError:  # reset, or closed in order (recv_exact's EOF)
            outcome = CLOSED
        except OSError:
            outcome = ERROR
        self.close()
        return self._record(what, sent, outcome), b""

    @property
    def alive(self) -> bool:
        return self.s is not None

    def close(self) -> None:
        if self.s is not None:
            self.s.close()
            self.s = None


class Worker(threading.Thread):
    """Locks one of OFFSETS at a time on one node, holds it briefly and
    unlocks it, until told to stop; reconnects whenever its connection is
    lost or an unlock is not confirmed (so that the server lets go of the
    lock with the connection). A subclass may act while it holds a lock
    (`while_held`), wait longer for answers (`request_timeout`), run longer
    (`lifetime`, `max_connects`), pick where each connection goes
    (`before_connect`) or drop a connection after a hold (`reconnect_after`)."""

    request_timeout: float = REQUEST_TIMEOUT
    lifetime: float = WORKER_LIFETIME
    max_connects: int = MAX_CONNECTS  # connection attempts over the worker's lifetime

    def __init__(self, index: int, node: str, host: str, address: tuple[str, int], stop: threading.Event, timeline: Timeline):
        super().__init__(daemon=True, name=f"worker-{index}-{node}")
        self.index, self.node, self.host, self.address = index, node, host, address
        self.stop, self.timeline = stop, timeline
        self.requests: list[Request] = []
        self.holds: list[Hold] = []
        self.failure: str | None = None  # an exception of the worker itself, or its bound reached

    def run(self) -> None:
        session = None
        try:
            rng = random.Random(self.index)
            deadline = time.monotonic() + self.lifetime
            connects = 0
            while not self.stop.is_set() and time.monotonic() < deadline:
                if session is None or not session.alive:
                    if connects >= self.max_connects:
                        self.failure = f"{self.max_connects} connection attempts made"
                        return
                    connects += 1
                    self.before_connect(connects, rng)
                    session = Session(self, connects)
                    if not session.establish():
                        session.close()
                        self.stop.wait(RECONNECT_PAUSE)
                    continue
                offset = rng.choice(OFFSETS)
                r, _ = session.request("lock", LOCK, lock_body(session.file_id, (offset, LENGTH, EXCLUSIVE | FAIL_IMMEDIATELY)))
                if r.outcome != ANSWERED:
                    continue
                if r.status != 0:
                    self.stop.wait(rng.uniform(*PACE))
                    continue
                hold = Hold(self.index, self.node, session.serial, offset, r.answered)
                self.while_held(session, hold, rng)
                hold.released = time.monotonic()
                if session.alive:  # else the connection went during the hold, and the lock with it: no unlock
                    hold.unlock, _ = session.request("unlock", LOCK, lock_body(session.file_id, (offset, LENGTH, UNLOCK)))
                self.holds.append(hold)
                heal = self.timeline.heal_at
                if self.node == "n3" and heal is not None and hold.granted > heal:
                    self.timeline.served_again.set()
                if hold.unlock is None or hold.unlock.status != 0 or self.reconnect_after(hold, rng):
                    session.close()
        except Exception:
            self.failure = traceback.format_exc()
        finally:
            if session is not None:
                session.close()

    def before_connect(self, serial: int, rng: random.Random) -> None:
        """Before the worker's connection number `serial` (from 1) is made:
        a subclass may point it at another node (`node`, `host`, `address`)."""

    def reconnect_after(self, hold: Hold, rng: random.Random) -> bool:
        """Whether to drop the connection after a hold whose unlock was
        confirmed, and connect again."""
        return False

    def while_held(self, session: Session, hold: Hold, rng: random.Random) -> None:
        """What the worker does between a grant and its unlock."""
        time.sleep(rng.uniform(*HOLD))


class Prober(threading.Thread):
    """Every PROBE_EVERY, a new client of one node: it connects, logs on,
    opens the file, locks and unlocks a range no worker uses, and
    disconnects. A worker whose request hangs sends nothing more until it
    gives up; the probes go on arriving, so that requests are sent all
    through a cut, each held to ANSWER_BOUND."""

    request_timeout: float = REQUEST_TIMEOUT

    def __init__(self, node: str, host: str, address: tuple[str, int], stop: threading.Event):
        super().__init__(daemon=True, name=f"prober-{node}")
        self.node, self.host, self.address, self.stop = node, host, address, stop
        self.requests: list[Request] = []  # every probe's, appended from their threads
        self.started = self.skipped = 0
        self.failures: list[str] = []
        self._probes: list[threading.Thread] = []

    def run(self) -> None:
        deadline = time.monotonic() + WORKER_LIFETIME
        while not self.stop.is_set() and time.monotonic() < deadline:
            self._probes = [t for t in self._probes if t.is_alive()]
            if len(self._probes) < MAX_PROBES:
                self.started += 1
                t = threading.Thread(target=self._probe, args=(self.started,), daemon=True)
                self._probes.append(t)
                t.start()
            else:
                self.skipped += 1
            self.stop.wait(PROBE_EVERY)
        for t in self._probes:
            t.join(timeout=PROBE_LIFETIME)

    @property
    def index(self) -> int:
        return PROBE_INDEX

    def _probe(self, serial: int) -> None:
        session = Session(self, serial)
        try:
            if session.establish():
                r, _ = session.request("lock", LOCK, lock_body(session.file_id, (PROBE_OFFSET, 1, EXCLUSIVE | FAIL_IMMEDIATELY)))
                if r.outcome == ANSWERED and r.status == 0:
                    session.request("unlock", LOCK, lock_body(session.file_id, (PROBE_OFFSET, 1, UNLOCK)))
        except Exception:
            self.failures.append(traceback.format_exc())
        finally:
            session.close()


# ------------------------------------------------------------------ checks


def hold_end(h: Hold, client_cuts: list[float]) -> float:
    """Until when the client holds the lock: until its unlock left, if the
    unlock was answered SUCCESS, or RANGE_NOT_LOCKED (the server dropped
    the lock without telling the client, which went on holding it).
    Otherwise nothing proves the lock lasted past its grant (a node that
    lost its lease may rightly refuse the unlock; a connection lost takes
    its locks along), unless the test itself reset the connection through
    the client proxy: the server held the lock until then at least."""
    if h.unlock is not None and h.unlock.outcome == ANSWERED and h.unlock.status in (0, STATUS_RANGE_NOT_LOCKED):
        return h.released
    lost = h.unlock.answered if h.unlock is not None else h.released
    cut = next((c for c in client_cuts if h.granted < c <= lost), None)
    return min(h.released, cut) if cut is not None else h.granted


def overlap_examples(overlaps: list[tuple[Hold, Hold]], rel) -> str:
    """The first few overlapping pairs, each hold's node, worker, range and
    times (`rel` turns a time into text)."""
    return "; ".join(
        f"{a.node}/w{a.worker} [{a.offset},+{LENGTH}) {rel(a.granted)}..{rel(a.end)} vs "
        f"{b.node}/w{b.worker} [{b.offset},+{LENGTH}) {rel(b.granted)}..{rel(b.end)}"
        for a, b in overlaps[:4]
    )


def held_together(a: Hold, b: Hold) -> bool:
    """Whether two holds share a moment. A hold proven only at its grant
    shares it with a hold it lies strictly within."""
    if a.granted == a.end:
        return b.granted < a.granted < b.end
    if b.granted == b.end:
        return a.granted < b.granted < a.end
    return max(a.granted, b.granted) < min(a.end, b.end)


def overlapping_holds(holds: list[Hold]) -> list[tuple[Hold, Hold]]:
    """Pairs of holds by different workers on overlapping ranges whose
    [granted, end] intervals intersect."""
    found = []
    active: list[Hold] = []
    for h in sorted(holds, key=lambda h: h.granted):
        active = [a for a in active if a.end > h.granted]
        for a in active:
            if a.worker != h.worker and a.overlaps(h) and held_together(a, h):
                found.append((a, h))
        active.append(h)
    return found


def status_name(s: int | None) -> str:
    return "-" if s is None else f"{s:#010x}"


# ---------------------------------------------------------------- fixtures


def three_nodes(request, tmp_path, etcd_cluster, proxied: tuple[str, ...] = ("n3",)) -> Iterator[SimpleNamespace]:  # noqa: F811
    """Three nodes with TTL 4 sharing one directory; those named in
    `proxied` reach etcd only through a ProxySet (the others through the
    members' own URLs), and a proxy n3's own clients may go through.
    Yields (nodes, etcd_proxies, client_proxy, etcd); stops them after."""
    share = tmp_path / "shared"
    share.mkdir()
    (share / FILE).write_bytes(bytes(FILE_SIZE))
    db = tmp_path / "users.db"
    add_user(db)
    etcd_proxies = ProxySet([("127.0.0.1", m.client_port) for m in etcd_cluster.members])
    made: list[Node] = []
    client_proxy = None
    try:
        etcd_proxies.__enter__()
        for i in range(3):
            name = f"n{i + 1}"
            # TLS passes through the proxies untouched: n3 checks the members'
            # certificate against 127.0.0.1, where the proxies listen too.
            through = [f"{etcd_cluster.scheme}://127.0.0.1:{p.port}" for p in etcd_proxies.proxies] if name in proxied else None
            made.append(Node(tmp_path, name, f"127.0.0.{i + 1}", etcd_cluster.node_toml_lines(endpoints=through), share, db, ttl=TTL))
        request.node.stash.setdefault(_SERVERS, []).extend(LogOf(n) for n in made)
        for n in made:
            n.start()
        wait_until("all three nodes are registered", lambda: {"n1", "n2", "n3"} <= set(members(etcd_cluster)))
        client_proxy = CutProxy(made[2].host, made[2].port).__enter__()
        yield SimpleNamespace(nodes=made, etcd_proxies=etcd_proxies, client_proxy=client_proxy, etcd=etcd_cluster)
    finally:
        for n in made:
            n.stop()
        if client_proxy is not None:
            client_proxy.close()
        etcd_proxies.close()


@pytest.fixture
def cluster(request, tmp_path, etcd_cluster):  # noqa: F811  (pytest's fixture injection)
    """Three nodes with TTL 4, n3 reaching etcd only through a ProxySet,
    and a proxy n3's own clients may go through."""
    yield from three_nodes(request, tmp_path, etcd_cluster)


# -------------------------------------------------------------------- test


@pytest.mark.parametrize("run", range(RUNS))
@pytest.mark.parametrize("mode", MODES)
def test_locks_stay_exclusive_while_a_node_is_partitioned(cluster, mode, run):
    n3 = cluster.nodes[2]
    n3_pid = n3.proc.pid
    etcd_side = mode != "client_side"
    cut, heal = {
        "blackhole": (cluster.etcd_proxies.blackhole, cluster.etcd_proxies.heal),
        "refuse": (cluster.etcd_proxies.refuse, cluster.etcd_proxies.heal),
        "flapping": (cluster.etcd_proxies.blackhole, cluster.etcd_proxies.heal),
        "client_side": (cluster.client_proxy.blackhole, cluster.client_proxy.heal),
    }[mode]
    phases = [*(FLAPS if mode == "flapping" else ()), (CUT, 0.0)]

    timeline = Timeline()
    stop = threading.Event()
    workers = []
    for node in cluster.nodes:
        address = (node.host, node.port)
        if node is n3 and not etcd_side:
            address = ("127.0.0.1", cluster.client_proxy.port)
        for _ in range(WORKERS_PER_NODE):
            workers.append(Worker(len(workers), node.name, node.host, address, stop, timeline))

    prober = Prober(n3.name, n3.host, (n3.host, n3.port), stop)

    # n3's membership record as etcd holds it: (when looked, lease or None).
    n3_records: list[tuple[float, int | None]] = []

    def watch_membership(until: float) -> None:
        while True:
            looked = time.monotonic()
            n3_records.append((looked, members(cluster.etcd).get("n3", {}).get("lease")))
            left = until - time.monotonic()
            if left <= 0:
                return
            stop.wait(min(MEMBERSHIP_POLL, left))

    start = time.monotonic()
    for w in [*workers, prober]:
        w.start()
    served_at = None
    stable_lease = None
    try:
        watch_membership(start + HEALTHY)
        for length, after in phases:
            began = time.monotonic()
            cut()
            watch_membership(began + length)
            healed = time.monotonic()
            heal()
            timeline.cuts.append((began, healed))
            if after:
                watch_membership(healed + after)
        timeline.heal_at = timeline.cuts[-1][1]
        if timeline.served_again.wait(SERVE_AGAIN_WAIT):
            served_at = time.monotonic()
            watch_membership(served_at + LEASE_STABLE)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=REQUEST_TIMEOUT + 5)
        prober.join(timeout=PROBE_LIFETIME + 5)
    ended = time.monotonic()

    final_cut, heal_at = timeline.cuts[-1]
    client_cuts = [] if etcd_side else [c for c, _ in timeline.cuts]
    requests = [r for w in workers for r in w.requests] + prober.requests
    holds = [h for w in workers for h in w.holds]
    for h in holds:
        h.end = hold_end(h, client_cuts)
    rel = lambda t: f"{t - final_cut:+.2f} s"  # noqa: E731  (times relative to the long cut)
    failures: dict[str, str] = {}

    # The harness itself: workers ran to the end, the proxies worked.
    stuck = [w.name for w in [*workers, prober] if w.is_alive()]
    broken = {w.name: w.failure for w in workers if w.failure}
    if prober.failures:
        broken[prober.name] = prober.failures[:2]
    proxy_errors = cluster.etcd_proxies.errors + cluster.client_proxy.errors
    overflows = cluster.etcd_proxies.overflows + cluster.client_proxy.overflows
    if stuck or broken or proxy_errors or overflows:
        failures["0. harness"] = (
            f"workers still running: {stuck}; worker failures: {broken}; proxy errors: {proxy_errors}; proxy overflows: {overflows}"
        )

    # The run saw what it is about: every node granted before the cut, and
    # the workers met each other's locks.
    before = [h for h in holds if h.granted < timeline.cuts[0][0]]
    contention = sum(1 for r in requests if r.what == "lock" and r.status == STATUS_LOCK_NOT_GRANTED)
    idle = [n.name for n in cluster.nodes if not any(h.node == n.name for h in before)]
    if idle or not contention:
        failures["0. setup"] = f"nodes with no grant before the cut: {idle}; LOCK_NOT_GRANTED answers: {contention}"

    # 1. Exclusivity.
    overlaps = overlapping_holds(holds)
    lost = [h for h in holds if h.unlock.outcome == ANSWERED and h.unlock.status == STATUS_RANGE_NOT_LOCKED]
    if overlaps or lost:
        worst = max((min(a.end, b.end) - max(a.granted, b.granted) for a, b in overlaps), default=0.0)
        examples = overlap_examples(overlaps, rel)
        failures["1. exclusivity"] = (
            f"{len(overlaps)} overlapping exclusive holds by different clients (longest overlap {worst * 1000:.0f} ms; "
            f"nodes involved: {sorted({x.node for p in overlaps for x in p})}): {examples}; "
            f"{len(lost)} unlocks of granted locks answered RANGE_NOT_LOCKED on a live connection "
            f"({[(h.node, rel(h.released)) for h in lost[:4]]})"
        )

    # 2. The cut node refuses within its TTL.
    n3_requests = [r for r in requests if r.node == "n3"]
    held_to_bound = [r for r in n3_requests if any(c + SETTLE_AFTER_CUT <= r.sent < h for c, h in timeline.cuts)]
    late = [r for r in held_to_bound if r.outcome not in SERVER_ANSWERS or r.delay > ANSWER_BOUND]
    if etcd_side:
        if late:
            worst = max(r.delay for r in late)
            examples = "; ".join(
                f"{'probe' if r.worker == PROBE_INDEX else f'w{r.worker}'} {r.what} sent {rel(r.sent)}: {r.outcome} after {r.delay:.2f} s"
                for r in late[:6]
            )
            failures["2a. answers within TTL"] = (
                f"{len(late)} of {len(held_to_bound)} requests sent to n3 during the cut got no answer within "
                f"{ANSWER_BOUND} s (longest wait {worst:.2f} s; {sum(r.outcome == TIMEOUT for r in late)} timed out "
                f"after {REQUEST_TIMEOUT} s): {examples}"
            )
        fenced = [r for r in n3_requests if r.what in FENCED_REQUESTS and r.outcome == ANSWERED and final_cut + TTL <= r.answered < heal_at]
        wrong = sorted({(r.what, status_name(r.status)) for r in fenced if r.status not in ALLOWED_REFUSALS})
        # Sent at least a second before the heal: not a request the healed
        # node may rightly grant once it has proven a lease again.
        late_grants = [
            r for r in n3_requests if r.what == "lock" and r.status == 0 and r.sent < heal_at - 1.0 and r.answered > final_cut + TTL
        ]
        if wrong or late_grants:
            failures["2b. no grant without a lease"] = (
                f"n3 answered {'/'.join(FENCED_REQUESTS)} after its TTL with statuses outside the allowed refusals: {wrong}; "
                f"{len(late_grants)} LOCKs sent to n3 before the heal were granted later than {TTL} s after the cut "
                f"({[(rel(r.sent), rel(r.answered)) for r in late_grants[:6]]})"
            )

    # 3. The others serve meanwhile.
    half = final_cut + CUT / 2
    served = {n: sum(1 for h in holds if h.node == n and half <= h.granted < heal_at) for n in ("n1", "n2")}
    if not all(served.values()):
        failures["3. others serve"] = f"LOCK grants in the second half of the cut ({rel(half)}..{rel(heal_at)}): {served}"

    # 4. n3 serves again, not restarted, under one lease it renews.
    after = [h for h in holds if h.node == "n3" and h.granted > heal_at]
    if served_at is None:
        failures["4. serves again"] = f"no LOCK granted by n3 within {SERVE_AGAIN_WAIT:.0f} s of the heal"
    else:
        stable = [(t, lease) for t, lease in n3_records if t >= served_at]
        leases = [lease for _, lease in stable]
        if not leases or None in leases or len(set(leases)) != 1:
            changes = [(rel(t), lease) for i, (t, lease) in enumerate(stable) if i == 0 or lease != stable[i - 1][1]]
            unregistered = sum(lease is None for lease in leases)
            failures["4. one lease"] = (
                f"n3 granted again by {rel(served_at)}, yet in the {LEASE_STABLE} s after it etcd showed it unregistered "
                f"{unregistered} of {len(stable)} looks and under {len(set(leases) - {None})} leases; "
                f"each change as (time, lease or None): {changes}"
            )
        else:
            stable_lease = leases[0]
    if n3.proc.poll() is not None or n3.proc.pid != n3_pid:
        failures["4. no restart"] = f"n3's process exited with {n3.proc.returncode}"

    # The partition was real: an etcd-side cut cost n3 its record; a cut
    # between n3 and its clients cost it nothing.
    during = [lease for t, lease in n3_records if final_cut <= t < heal_at]
    if etcd_side and None not in during:
        failures["0. partition"] = f"n3's record never left etcd during the cut: {len(during)} looks saw leases {set(during)}"
    if not etcd_side:
        leases = {lease for _, lease in n3_records}
        if len(leases) != 1 or None in leases:
            failures["5. n3 keeps its lease"] = f"n3's leases seen over the run: {leases}"
        cut_off = [r for r in n3_requests if final_cut <= r.answered < heal_at and r.outcome != ANSWERED]
        if not cut_off:
            failures["0. partition"] = "n3's clients lost nothing during the cut"

    # What a reader of a passing run wants to see too.
    during_cut = [r for r in n3_requests if final_cut + TTL <= r.answered < heal_at]
    seen: dict[str, dict[str, int]] = {}
    for r in during_cut:
        key = status_name(r.status) if r.outcome == ANSWERED else r.outcome
        seen.setdefault(r.what, {}).setdefault(key, 0)
        seen[r.what][key] += 1
    first_after = min((h.granted for h in after), default=None)
    print(
        f"\n[{mode} run {run}] {ended - start:.1f} s; holds {len(holds)} "
        f"({', '.join(f'{n.name} {sum(h.node == n.name for h in holds)}' for n in cluster.nodes)}); "
        f"n3 requests {len(n3_requests)} ({len(prober.requests)} from {prober.started} probes, {prober.skipped} skipped); "
        f"sent to n3 from {SETTLE_AFTER_CUT:g} s into a cut to its heal: {len(held_to_bound)}, longest wait "
        f"{max((r.delay for r in held_to_bound), default=0):.2f} s, {len(late)} past {ANSWER_BOUND} s "
        f"({sum(r.outcome == TIMEOUT for r in held_to_bound)} timeouts); overlaps {len(overlaps)}, "
        f"unlocks finding no lock {len(lost)}; heal at {rel(heal_at)}, n3's first grant after it "
        f"{'none' if first_after is None else rel(first_after)}, grants after the heal {len(after)}, lease {stable_lease}"
        f"\n  n3's answers from {TTL} s into the long cut to its heal: {seen}"
    )
    if failures:
        pytest.fail("\n".join(f"{k}: {v}" for k, v in sorted(failures.items())), pytrace=False)


GROUPED = "grouped.bin"


@pytest.mark.parametrize("cut", [False, True], ids=["in_touch", "cut_off"])
def test_no_open_joins_without_a_read_once_another_node_set_the_file_delete_pending(cluster, cut):
    """A node's alike opens of a file share one entry, and once that entry
    is written its opens join it without reading etcd
    (nimbus_state::grouped_opens). Delete-pending set on another node must
    still refuse every open asked after the setter was answered: the setter
    first has the node revoke its group, and a node cut off from etcd
    (`cut`) neither answers nor, once its lease is no longer proven, joins
    without a read; the setter waits until its lease has run out.

    n3's client opens and closes the file in a loop, recording when each
    CREATE was sent and what it was answered; n1's client sets the file
    delete-pending. No CREATE sent after n1's SET_INFO was answered may
    succeed."""
    n1, _, n3 = cluster.nodes
    (n1.share / GROUPED).write_bytes(b"x" * 100)
    # Open on two nodes, so the file is decided in etcd, and n3's entry for
    # its readers is written (the keeper's open).
    holder, keeper, c = LockClient(n1), LockClient(n3), LockClient(n3)
    for cl in (holder, keeper):
        assert rawsmb.status(cl.call(rawsmb.CREATE, rawsmb.create_body(GROUPED))) == 0
    c.s.settimeout(REQUEST_TIMEOUT)
    answers: list[tuple[float, int | None]] = []  # (sent, status; None: no answer)
    stop = threading.Event()

    def join_and_leave() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                resp = c.call(rawsmb.CREATE, rawsmb.create_body(GROUPED))
                status = rawsmb.status(resp)
                answers.append((sent, status))
                if status == 0:
                    assert rawsmb.status(c.call(CLOSE, close_body(resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]))) == 0
            except (OSError, ConnectionError, AssertionError, struct.error):
                answers.append((sent, None))
                return

    joiner = threading.Thread(target=join_and_leave, daemon=True)
    joiner.start()
    other = None
    try:
        wait_until("n3 joins its group", lambda: sum(1 for _, st in answers if st == 0) >= 20)
        if cut:
            cut_at = time.monotonic()
            cluster.etcd_proxies.blackhole()
            # n3 still answers joins from memory while its lease is proven.
            wait_until("n3 joins while cut off", lambda: any(t > cut_at and st == 0 for t, st in answers))
        other = Client(Target(n1), uuid.uuid4())
        status, deleter = open_status(other, GROUPED, SHARE_ALL, DELETE | READ_ATTRIBUTES)
        assert status == 0, hex(status)
        asked = time.monotonic()
        set_info(deleter, FileInformationClass.FILE_DISPOSITION_INFORMATION, struct.pack("<B", 1))
        set_at = time.monotonic()
        # Joins asked after it, for a while: each must be refused (or, on a
        # node that lost its lease, its connection dropped).
        wait_until("n3 answers after the deletion", lambda: not joiner.is_alive() or any(t > set_at for t, _ in answers))
        time.sleep(0.5)
        stop.set()
        joiner.join(REQUEST_TIMEOUT + 1)
        late = [(round(t - set_at, 3), st) for t, st in answers if t > set_at and st == 0]
        refused = sorted({hex(st) if st is not None else "no answer" for t, st in answers if t > set_at})
        print(f"SET_INFO took {set_at - asked:.2f} s; after it: {refused}; {len(answers)} CREATEs in all")
        assert late == [], f"{len(late)} opens on n3 joined after the file was set delete-pending on n1: {late[:5]}"
        if not cut:
            assert refused == [hex(STATUS_DELETE_PENDING)], refused
        deleter.close()
    finally:
        stop.set()
        if cut:
            cluster.etcd_proxies.heal()
        if other is not None:
            other.close()
        for cl in (holder, keeper, c):
            cl.close()


LEASED = "leased.bin"
GENERIC_READ = 0x8000_0000
# How long after n3 was cut off n1's exclusive CREATE may take: n3's lease
# runs out (at most 2 x TTL after its last renewal) and the survivors take
# its opens as gone. A break timeout (35 s) is far beyond it.
CUT_OFF_GROUP_BOUND = 2 * TTL + 6


def answers_echo(c: ol.Smb311Client) -> bool:
    """Whether `c`'s connection still answers an ECHO (a frame of another
    message answers too: the connection is up)."""
    try:
        return rawsmb.status(c.call(rawsmb.ECHO, rawsmb.echo_body())) == 0
    except AssertionError:
        return True
    except (OSError, ConnectionError, struct.error):
        return False


def test_a_group_cut_off_from_etcd_holds_up_no_other_node_and_grants_past_nothing(cluster):
    """n3's two clients read `leased.bin` with read-handle leases, granted
    through n3's group (`[cluster] group_leases`, the default): one grant
    in the file's record, the clients' own leases in n3's memory. n3 is
    cut off from etcd, and n1's client opens the file sharing nothing, so
    the group's handle caching must be broken, and the break cannot reach
    n3. What must hold:

    - n1's CREATE is answered once n3's lease has run out (n3's opens are
      gone then), not after a break that can never end;
    - by then n3 has dropped its clients: none goes on believing it holds
      a lease n1's open was granted over;
    - healed, n3 grants through the record again: two new members' read
      caching is taken, each with its own break, by a write on n1."""
    n1, _, n3 = cluster.nodes
    (n1.share / LEASED).write_bytes(b"read by n3, then taken by n1\n")
    # A reader on n1: the file is decided in etcd.
    keeper = ol.Smb311Client(n1, uuid.uuid4().bytes)
    a, b = ol.Smb311Client(n3, uuid.uuid4().bytes), ol.Smb311Client(n3, uuid.uuid4().bytes)
    excl = ol.Smb311Client(n1, uuid.uuid4().bytes)
    clients = [keeper, a, b, excl]
    healed = False
    try:
        for c in clients:
            c.s.settimeout(CUT_OFF_GROUP_BOUND + REQUEST_TIMEOUT)
        assert rawsmb.status(keeper.create(LEASED, access=GENERIC_READ)) == 0
        for c in (a, b):
            key = uuid.uuid4().bytes
            resp = c.create(LEASED, oplock=ol.LEVEL_LEASE, access=GENERIC_READ, contexts=ol.lease_context(key, ol.R | ol.H))
            assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
            assert ol.lease_of(resp) == (key, ol.R | ol.H, 0, 1)
        cut_at = time.monotonic()
        cluster.etcd_proxies.blackhole()
        # Sharing nothing: n3's opens (and the keeper's) conflict, and n3's
        # group's handle caching must go first.
        mid = excl.send(CREATE, ol.create_body(LEASED, share=ol.SHARE_NONE, access=GENERIC_READ))
        while True:
            resp = excl.recv()
            if message_id(resp) == mid and rawsmb.status(resp) != STATUS_PENDING:
                break
        answered = time.monotonic() - cut_at
        # The keeper still shares the file: a sharing violation, once the
        # break ended without n3's answer (its opens gone with its lease).
        print(f"n1's CREATE answered {rawsmb.status(resp):#x} {answered:.1f} s after n3 was cut off")
        assert answered <= CUT_OFF_GROUP_BOUND, f"n1's CREATE took {answered:.1f} s"
        assert rawsmb.status(resp) == ol.STATUS_SHARING_VIOLATION, hex(rawsmb.status(resp))
        # n3 saw its lease run out as n1 did, and drops its clients
        # (crate::lease_loss): each member's connection is closed.
        for c in (a, b):
            wait_until("n3 drops a member's connection", lambda c=c: not answers_echo(c))
        cluster.etcd_proxies.heal()
        healed = True

        def serves() -> bool:
            """n3 opens a file again: it has joined the cluster anew."""
            try:
                probe = ol.Smb311Client(n3, uuid.uuid4().bytes)
                try:
                    return rawsmb.status(probe.create(FILE, access=GENERIC_READ)) == 0
                finally:
                    probe.close()
            except (OSError, ConnectionError, AssertionError, struct.error):
                return False

        wait_until("n3 serves again", serves)
        resp = excl.create(LEASED, access=ol.READ_WRITE)
        assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
        writer = ol.file_id_of(resp)
        c, d = ol.Smb311Client(n3, uuid.uuid4().bytes), ol.Smb311Client(n3, uuid.uuid4().bytes)
        clients += [c, d]
        keys = {}
        for m in (c, d):
            m.s.settimeout(REQUEST_TIMEOUT)
            keys[m] = uuid.uuid4().bytes
            resp = m.create(LEASED, oplock=ol.LEVEL_LEASE, access=GENERIC_READ, contexts=ol.lease_context(keys[m], ol.R))
            assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
            assert ol.lease_of(resp) == (keys[m], ol.R, 0, 1)
        assert rawsmb.status(excl.call(WRITE, write_body(writer, 0, b"W"))) == 0
        # Read caching alone needs no answer (MS-SMB2 3.3.4.7).
        for m in (c, d):
            assert ol.lease_break_of(m.recv()) == (2, 0, keys[m], ol.R, 0)
    finally:
        if not healed:
            cluster.etcd_proxies.heal()
        for c in clients:
            c.close()


def test_cut_proxy_switches():
    """The proxy the partition test relies on: a cut resets what was
    forwarded; a blackhole takes new connections and answers nothing, a
    refusal refuses them; a heal forwards again."""
    target = socket.create_server(("127.0.0.1", 0))
    target.settimeout(5)

    def echo(c: socket.socket) -> None:
        with c:
            try:
                while data := c.recv(100):
                    c.sendall(data)
            except OSError:  # reset by the proxy's cut
                pass

    def serve() -> None:
        for _ in range(3):  # the connections the proxy forwards below
            try:
                c, _ = target.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()

    def connect(p: CutProxy) -> socket.socket:
        return socket.create_connection(("127.0.0.1", p.port), timeout=1)

    with target, CutProxy("127.0.0.1", target.getsockname()[1]) as p:
        a = connect(p)
        a.sendall(b"one")
        assert a.recv(10) == b"one"
        p.blackhole()
        with pytest.raises(ConnectionResetError):
            a.recv(10)
        b = connect(p)  # accepted, but silent
        b.sendall(b"lost")
        with pytest.raises(TimeoutError):
            b.recv(10)
        p.heal()
        with pytest.raises(ConnectionResetError):  # what went into the dead link is not delivered late
            b.recv(10)
        c = connect(p)
        c.sendall(b"two")
        assert c.recv(10) == b"two"
        p.refuse()
        with pytest.raises(ConnectionResetError):
            c.recv(10)
        with pytest.raises(ConnectionRefusedError):
            connect(p)
        p.heal()
        d = connect(p)
        d.sendall(b"three")
        assert d.recv(10) == b"three"
        assert (p.errors, p.overflows) == ([], 0)
        for s in (a, b, c, d):
            s.close()


def test_overlap_checker():
    """The exclusivity check itself, on made-up records: which holds count
    as overlapping, and for how long a hold counts."""

    def hold(worker: int, offset: int, granted: float, released: float, unlock_status: int | None, outcome: str = ANSWERED) -> Hold:
        h = Hold(worker, f"n{worker % 3 + 1}", 1, offset, granted, released)
        h.unlock = Request(worker, h.node, 1, "unlock", released, released + 0.001, outcome, unlock_status)
        h.end = hold_end(h, client_cuts=[5.0])
        return h

    a = hold(0, 0, 1.0, 1.1, 0)
    assert overlapping_holds([a, hold(1, 8, 1.05, 1.2, 0)]) != []  # ranges and times overlap
    assert overlapping_holds([a, hold(1, 16, 1.05, 1.2, 0)]) == []  # [0,16) and [16,32) do not
    assert overlapping_holds([a, hold(1, 0, 1.1, 1.2, 0)]) == []  # one after the other
    assert overlapping_holds([a, hold(3, 0, 1.05, 1.2, 0)]) != []  # the same node's other client
    # An unlock finding no lock: the client held it until it unlocked.
    assert overlapping_holds([hold(1, 0, 0.9, 1.05, STATUS_RANGE_NOT_LOCKED), a]) != []
    # An unlock refused, or lost with the connection: only the grant is proven...
    assert overlapping_holds([hold(1, 0, 0.9, 1.05, STATUS_INSUFFICIENT_RESOURCES), a]) == []
    assert overlapping_holds([hold(1, 0, 0.9, 1.05, None, TIMEOUT), a]) == []
    assert overlapping_holds([hold(1, 0, 1.05, 1.06, None, CLOSED), a]) != []
    # ...unless the test reset the connection (at 5.0): held until then.
    late = hold(1, 0, 4.9, 5.2, None, CLOSED)
    assert late.end == 5.0
    assert overlapping_holds([late, hold(2, 0, 4.95, 5.1, 0)]) != []
    assert overlapping_holds([late, hold(2, 0, 5.01, 5.1, 0)]) == []
