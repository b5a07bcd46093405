"""Kill -9 of the etcd leader under load (issue 44, "Leader kill under load").

The cluster of tests/test_partition.py (three nodes, TTL 4, a three-member
TLS etcd, every node configured with all three members; n3 reaches them
through proxies that stay open here) and its workers: nine clients, three
per node, take overlapping exclusive locks of one file, and each, while it
holds a lock, writes a record of its own (its index and a sequence number)
into a region of the file that no other client writes. Once every worker
has been granted a few locks, the test kills the etcd leader with SIGKILL,
waits until every node and every worker is granted a lock again, starts the
killed member again and waits until the cluster is healthy with three
members and every node grants again; then the same to the new leader. From
the client-side records it checks:

1. exclusivity: no two clients' holds of overlapping ranges share a moment
   (each hold timed on the client, from its grant to its unlock, as in
   test_partition), and no unlock of a granted lock finds it gone;
2. every WRITE answered STATUS_SUCCESS is in the file, read from the share
   directory on disk after the run;
3. service resumes: after each kill, every node grants a LOCK sent after the
   kill within RESUME_BOUND of the kill, and every request in flight at the
   kill is answered (a status, or the connection closed or refused) within
   RESUME_BOUND of it; no request of the run goes unanswered; and once
   every worker has been granted again, the nodes go on through the two
   members left without refusing anything for want of an answer from etcd
   (but while etcd elects a leader of its own accord, read from its
   members' logs: on two shared cores a starved leader loses its
   followers, and etcd then has no leader to answer);
4. the killed member rejoins: the cluster is healthy with three members and
   every node grants after that.

5. no lock outlives its open: once every worker has disconnected, a new
   client of each node is granted an exclusive lock of every range the
   workers used. (etcd's copy of the file's locks may still show one: a
   node that took the file into its memory decides it there, and its etcd
   copy is stale until it hands the file back; what clients are granted is
   what counts.)

`-s` shows each run's measured times.
"""

from __future__ import annotations

import json
import random
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest

import rawsmb
from etcd_cluster import ELECTION_MS, START_TIMEOUT, Election, EtcdCluster, etcd_cluster  # noqa: F401  (the fixture)
from test_cluster import members
from test_locks import (
    EXCLUSIVE,
    FAIL_IMMEDIATELY,
    LOCK,
    STATUS_FILE_LOCK_CONFLICT,
    STATUS_INSUFFICIENT_RESOURCES,
    STATUS_LOCK_NOT_GRANTED,
    STATUS_RANGE_NOT_LOCKED,
    UNLOCK,
    WRITE,
    lock_body,
    write_body,
)
from test_partition import (  # noqa: F401  (cluster: the fixture)
    ANSWERED,
    FILE,
    LENGTH,
    OFFSETS,
    SERVER_ANSWERS,
    TIMEOUT,
    TTL,
    WORKERS_PER_NODE,
    Hold,
    Request,
    Session,
    Timeline,
    Worker,
    cluster,
    hold_end,
    overlap_examples,
    overlapping_holds,
    status_name,
)

ELECTION = ELECTION_MS / 1000
# When every node must grant again after the kill, and every request in
# flight at it must have been answered. Etcd's followers usually elect a
# new leader within two election timeouts of the kill (each waits a random
# time in [ELECTION, 2 * ELECTION) without heartbeats before it stands);
# measured, it can take four when the follower whose timer runs out first
# lacks the last entries: the other refuses it its vote, and each of its
# tries pushes the term up and the other's timer back (etcd 3.4 does not
# pre-vote by default). A
# node's lease, renewed every TTL / 3, stays proven for at least
# 2 * TTL / 3 after the kill, which may not be enough then: the bound
# allows for a node that loses it. Its proof lapses at most TTL after the
# kill, it joins again at its next renewal, TTL / 3 later, by when a
# leader has been elected; a second more for that registration and for
# its clients to connect again.
RESUME_BOUND = TTL + TTL / 3 + 2 * ELECTION + 1.0
REQUEST_TIMEOUT = RESUME_BOUND + 2.0  # a worker gives up on an answer after this: a request that hung
KILLS = 2  # the leader, then the new leader once the first is back
WARMUP_GRANTS = 3  # per worker, before a kill
WARMUP_WAIT = 20.0
LEADER_WAIT = 10.0  # until the running members agree on a leader
AFTER_KILL_WAIT = 2 * RESUME_BOUND  # until every worker has been granted a LOCK sent after the kill
DOWN_GRANTS = 3  # per worker, after it was granted again, before the killed member starts again
DOWN_WAIT = 10.0
AFTER_RESTART_WAIT = 10.0  # until every node grants after the restarted member is healthy
POLL = 0.05

RECORD = 16  # bytes of one write: "w<worker>s<seq>" padded with newlines
WRITE_BASE = 1 << 16  # the writes' regions start here, far beyond the lock ranges
MAX_WRITES = 4096  # per worker; its region is MAX_WRITES * RECORD bytes


# ----------------------------------------------------------------- records


@dataclass
class Write:
    worker: int
    seq: int
    offset: int
    data: bytes
    request: Request
    count: int = 0  # bytes the server said it wrote

    @property
    def acknowledged(self) -> bool:
        return self.request.outcome == ANSWERED and self.request.status == 0


@dataclass
class Kill:
    member: int  # the index of the leader killed
    at: float  # just before SIGKILL was sent
    new_leader: int | None = None  # once every worker was granted again
    resumed: dict[str, float] = field(default_factory=dict)  # node -> first grant of a LOCK sent after the kill
    workers_at: float | None = None  # every worker granted a LOCK sent after the kill
    down_until: float = 0.0  # every worker granted DOWN_GRANTS more with the member still down
    restarted: float = 0.0  # the killed member listens again
    healthy: float | None = None  # every member answers healthy
    members: int = 0  # `member list` after that
    served: dict[str, float] = field(default_factory=dict)  # node -> first grant of a LOCK sent after `healthy`


def record(worker: int, seq: int) -> bytes:
    return f"w{worker}s{seq}".encode().ljust(RECORD, b"\n")


def record_offset(worker: int, seq: int, max_writes: int = MAX_WRITES) -> int:
    return WRITE_BASE + (worker * max_writes + seq) * RECORD


class Latecomer:
    """A client of one node after the run (the `owner` a Session needs)."""

    request_timeout = REQUEST_TIMEOUT
    index = -1

    def __init__(self, node: str, host: str, address: tuple[str, int]):
        self.node, self.host, self.address = node, host, address
        self.requests: list[Request] = []

    def lock_everything(self) -> str | None:
        """Locks, then unlocks, every range the workers used: None, or what
        went wrong."""
        session = Session(self, 1)
        whole = (0, max(OFFSETS) + LENGTH)
        try:
            if not session.establish():
                return f"no session: {[(r.what, r.outcome, status_name(r.status)) for r in self.requests]}"
            r, _ = session.request("lock", LOCK, lock_body(session.file_id, (*whole, EXCLUSIVE | FAIL_IMMEDIATELY)))
            if r.outcome != ANSWERED or r.status != 0:
                return f"lock of [{whole[0]},+{whole[1]}): {r.outcome} {status_name(r.status)}"
            session.request("unlock", LOCK, lock_body(session.file_id, (*whole, UNLOCK)))
            return None
        finally:
            session.close()


class Writer(Worker):
    """A worker of test_partition that, while it holds a lock, writes its
    next record into its own region of the file."""

    request_timeout = REQUEST_TIMEOUT
    max_writes = MAX_WRITES  # records of its own; its region is max_writes * RECORD bytes

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.writes: list[Write] = []

    def while_held(self, session: Session, hold: Hold, rng: random.Random) -> None:
        seq = len(self.writes)
        if seq < self.max_writes:
            data, offset = record(self.index, seq), record_offset(self.index, seq, self.max_writes)
            r, resp = session.request("write", WRITE, write_body(session.file_id, offset, data))
            w = Write(self.index, seq, offset, data, r)
            if w.acknowledged:  # MS-SMB2 2.2.22: Count after StructureSize and Reserved
                w.count = struct.unpack_from("<I", resp, rawsmb.HEADER_SIZE + 4)[0]
            self.writes.append(w)
        super().while_held(session, hold, rng)


# ------------------------------------------------------------------ checks


def missing_writes(writes: list[Write], disk: bytes) -> list[Write]:
    """The acknowledged writes whose record is not whole in `disk`, the
    file's content (a write acknowledged with fewer bytes than sent counts
    as missing too)."""
    return [w for w in writes if w.acknowledged and (w.count != len(w.data) or disk[w.offset : w.offset + len(w.data)] != w.data)]


def first_grants(workers: list[Writer], since: float) -> dict[str, float]:
    """Node -> when the first LOCK sent at or after `since` was granted."""
    first: dict[str, float] = {}
    for w in workers:
        for r in list(w.requests):
            if r.what == "lock" and r.outcome == ANSWERED and r.status == 0 and r.sent >= since:
                first[r.node] = min(first.get(r.node, r.answered), r.answered)
    return first


def granted_since(w: Writer, since: float) -> bool:
    return any(r.what == "lock" and r.outcome == ANSWERED and r.status == 0 and r.sent >= since for r in list(w.requests))


def refused_as_unavailable(r: Request) -> bool:
    """Whether a node answered `r` as it answers when etcd does not answer
    it: INSUFFICIENT_RESOURCES, or FILE_LOCK_CONFLICT for one of the
    writers' writes (into a region of its own, which no lock covers)."""
    return r.outcome == ANSWERED and (
        r.status == STATUS_INSUFFICIENT_RESOURCES or (r.what == "write" and r.status == STATUS_FILE_LOCK_CONFLICT)
    )


def run_failures(cluster, workers: list[Writer], rel: Callable[[float], str]) -> tuple[dict[str, str], bytes]:
    """What a run of Writers that ended broke, whatever the test did to
    etcd meanwhile (keyed as the tests' checks are): the harness itself
    (workers stuck or failed, proxy errors), 1. exclusivity (each hold's
    end set first, `hold_end`), 2. acknowledged writes on disk, 3c. no
    request hangs, 5. no lock left behind (a new client of each node is
    granted every range the workers used). Also the file's content, read
    from the share's directory."""
    failures: dict[str, str] = {}
    # Every worker has disconnected: its opens closed, and their locks went.
    latecomers = {n.name: Latecomer(n.name, n.host, (n.host, n.port)) for n in cluster.nodes}
    not_granted = {name: why for name, c in latecomers.items() if (why := c.lock_everything())}
    disk = (cluster.nodes[0].share / FILE).read_bytes()
    requests = [r for w in workers for r in w.requests]
    holds = [h for w in workers for h in w.holds]
    writes = [x for w in workers for x in w.writes]
    for h in holds:
        h.end = hold_end(h, client_cuts=[])
    stuck = [w.name for w in workers if w.is_alive()]
    broken = {w.name: w.failure for w in workers if w.failure}
    proxy = cluster.etcd_proxies.errors + cluster.client_proxy.errors
    if stuck or broken or proxy:
        failures["0. harness"] = f"workers still running: {stuck}; worker failures: {broken}; proxy errors: {proxy}"
    overlaps = overlapping_holds(holds)
    lost = [h for h in holds if h.unlock is not None and h.unlock.outcome == ANSWERED and h.unlock.status == STATUS_RANGE_NOT_LOCKED]
    if overlaps or lost:
        examples = overlap_examples(overlaps, rel)
        failures["1. exclusivity"] = (
            f"{len(overlaps)} overlapping exclusive holds by different clients: {examples}; "
            f"{len(lost)} unlocks of granted locks answered RANGE_NOT_LOCKED ({[(h.node, rel(h.released)) for h in lost[:4]]})"
        )
    acknowledged = [x for x in writes if x.acknowledged]
    missing = missing_writes(writes, disk)
    if missing or not acknowledged:
        failures["2. acknowledged writes"] = (
            f"{len(missing)} of {len(acknowledged)} writes answered STATUS_SUCCESS are not in {FILE} on disk: "
            + "; ".join(
                f"w{x.worker} #{x.seq} {x.data!r} at {x.offset} (count {x.count}), answered {rel(x.request.answered)}, "
                f"on disk {disk[x.offset : x.offset + len(x.data)]!r}"
                for x in missing[:4]
            )
        )
    hung = [r for r in requests if r.outcome == TIMEOUT]
    if hung:
        failures["3c. no request hangs"] = f"{len(hung)} requests unanswered after {REQUEST_TIMEOUT:.2f} s: " + "; ".join(
            f"w{r.worker} {r.what} on {r.node} sent {rel(r.sent)}" for r in hung[:6]
        )
    if not_granted:
        failures["5. no lock left behind"] = f"after every worker disconnected, new clients were refused: {not_granted}"
    return failures, disk


def run_summary(workers: list[Writer], nodes: list[str], disk: bytes) -> str:
    """One line on a run: holds per node, writes, overlaps, contention,
    timeouts."""
    holds = [h for w in workers for h in w.holds]
    writes = [x for w in workers for x in w.writes]
    requests = [r for w in workers for r in w.requests]
    return (
        f"holds {len(holds)} ({', '.join(f'{n} {sum(h.node == n for h in holds)}' for n in nodes)}); "
        f"writes {len(writes)}, acknowledged {sum(x.acknowledged for x in writes)}, missing on disk {len(missing_writes(writes, disk))}; "
        f"overlaps {len(overlapping_holds(holds))}; "
        f"LOCK_NOT_GRANTED {sum(1 for r in requests if r.what == 'lock' and r.status == STATUS_LOCK_NOT_GRANTED)}; "
        f"timeouts {sum(r.outcome == TIMEOUT for r in requests)}"
    )


# A request in flight while etcd had no leader may be refused for want of
# an answer, and rightly so. Its leader had been silent for up to two
# election timeouts before a follower stood (each follower's timer runs out
# between ELECTION and 2 * ELECTION after the last heartbeat), and a node's
# request sent to the old leader is answered "leader changed" just after
# the new one wins.
# A refusal must come within a node's etcd call timeout of the election's
# end (crates/nimbus-cluster/src/cluster.rs CALL_TIMEOUT): one that comes
# later was the node's doing.
SILENT_BEFORE_ELECTION = 2 * ELECTION
AFTER_ELECTION = 0.5
NODE_CALL_TIMEOUT = 3.0


def during_an_election(r: Request, elections: list[Election], wall: float, since: float | None = None) -> bool:
    """Whether request `r` (its times from time.monotonic(), `wall` the
    offset to time.time()) was in flight while etcd was electing a leader,
    and answered within NODE_CALL_TIMEOUT of its end. `since` (monotonic):
    only elections that began after it count (not those a kill caused)."""
    sent, answered = r.sent + wall, r.answered + wall
    for e in elections:
        if since is not None and e.began < since + wall:
            continue
        ended = float("inf") if e.ended is None else e.ended
        if (
            sent <= ended + AFTER_ELECTION
            and answered >= e.began - SILENT_BEFORE_ELECTION
            and answered <= ended + AFTER_ELECTION + NODE_CALL_TIMEOUT
        ):
            return True
    return False


def wait_for(condition: Callable[[], bool], timeout: float, every: float = POLL) -> float | None:
    """Polls `condition` every `every` seconds until it holds (the time it
    did) or `timeout` passes (None)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() >= deadline:
            return None
        time.sleep(every)


def wait_for_leader(etcd, timeout: float) -> int | None:
    found: list[int] = []

    def agreed() -> bool:
        leader = etcd.leader()
        if leader is not None:
            found.append(leader)
        return leader is not None

    return found[-1] if wait_for(agreed, timeout) is not None else None


# -------------------------------------------------------------------- test


def test_locks_and_writes_survive_killing_the_etcd_leader(cluster):
    etcd = cluster.etcd
    nodes = [n.name for n in cluster.nodes]
    stop = threading.Event()
    timeline = Timeline()  # no cuts here
    workers = [
        Writer(i * WORKERS_PER_NODE + j, node.name, node.host, (node.host, node.port), stop, timeline)
        for i, node in enumerate(cluster.nodes)
        for j in range(WORKERS_PER_NODE)
    ]
    kills: list[Kill] = []
    failures: dict[str, str] = {}
    leases_before: dict[str, int] = {}  # the nodes' leases in etcd before the first kill
    leases_after: dict[str, int] = {}  # and after the last restart

    start = time.monotonic()
    wall = time.time() - start
    for w in workers:
        w.start()
    try:
        warm = wait_for(lambda: all(len(w.holds) >= WARMUP_GRANTS for w in workers), WARMUP_WAIT)
        leases_before = {n: m["lease"] for n, m in members(etcd).items()}
        for _ in range(KILLS if warm is not None else 0):
            leader = wait_for_leader(etcd, LEADER_WAIT)
            if leader is None:
                failures["0. leader"] = f"the running members agreed on no leader within {LEADER_WAIT:g} s"
                break
            kill = Kill(leader, time.monotonic())
            etcd.kill_member(leader)
            kills.append(kill)
            wait_for(lambda: len(first_grants(workers, kill.at)) == len(nodes), RESUME_BOUND + 1.0)
            kill.resumed = first_grants(workers, kill.at)
            # Each worker sends one request at a time: once each has been
            # granted a LOCK sent after the kill, whatever it had in
            # flight at the kill has been answered or given up on.
            kill.workers_at = wait_for(lambda: all(granted_since(w, kill.at) for w in workers), AFTER_KILL_WAIT)
            kill.new_leader = wait_for_leader(etcd, LEADER_WAIT)
            # A while on two members: the nodes must go on through them.
            if kill.workers_at is not None:
                after = {w.name: len(w.holds) + DOWN_GRANTS for w in workers}
                wait_for(lambda: all(len(w.holds) >= after[w.name] for w in workers), DOWN_WAIT)
            kill.down_until = time.monotonic()
            etcd.start_member(leader)
            kill.restarted = time.monotonic()
            try:
                etcd.wait_healthy(timeout=START_TIMEOUT)
                kill.healthy = time.monotonic()
            except (RuntimeError, TimeoutError) as e:
                failures["4. rejoins"] = f"after the restart of {etcd.members[leader].name}: {e}"
                break
            kill.members = len(json.loads(etcd.etcdctl("member", "list", "-w", "json")).get("members", []))
            wait_for(lambda: len(first_grants(workers, kill.healthy)) == len(nodes), AFTER_RESTART_WAIT)
            kill.served = first_grants(workers, kill.healthy)
            if kill.workers_at is None or set(kill.served) != set(nodes):
                break  # not recovered: what failed is reported below, another kill would only add to it
        leases_after = {n: m["lease"] for n, m in members(etcd).items()}
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=REQUEST_TIMEOUT + 5)
    ended = time.monotonic()
    requests = [r for w in workers for r in w.requests]
    rel = lambda t: f"{t - start:.2f} s"  # noqa: E731  (times from the start of the workers)
    found, disk = run_failures(cluster, workers, rel)
    failures.update(found)
    contention = sum(1 for r in requests if r.what == "lock" and r.status == STATUS_LOCK_NOT_GRANTED)
    recovered = all(k.workers_at is not None and set(k.served) == set(nodes) for k in kills)
    if warm is None or not contention or (recovered and len(kills) != KILLS):
        failures["0. setup"] = (
            f"every worker granted {WARMUP_GRANTS} locks: {warm is not None} "
            f"({ {w.name: len(w.holds) for w in workers} }); LOCK_NOT_GRANTED answers: {contention}; kills: {len(kills)} of {KILLS}"
        )

    # 3. Service resumes after each kill, and nothing hangs.
    for k, kill in enumerate(kills, 1):
        late = {n: (f"{kill.resumed[n] - kill.at:.2f} s" if n in kill.resumed else "never") for n in nodes}
        if any(n not in kill.resumed or kill.resumed[n] - kill.at > RESUME_BOUND for n in nodes) or kill.workers_at is None:
            failures[f"3a. kill {k}: nodes grant again"] = (
                f"first grant of a LOCK sent after the kill of {etcd.members[kill.member].name}, per node: {late} "
                f"(bound {RESUME_BOUND:.2f} s); every worker granted such a LOCK within {AFTER_KILL_WAIT:.2f} s: "
                f"{kill.workers_at is not None}"
            )
        in_flight = [r for r in requests if r.sent < kill.at < r.answered]
        unanswered = [r for r in in_flight if r.outcome not in SERVER_ANSWERS or r.answered - kill.at > RESUME_BOUND]
        if unanswered:
            failures[f"3b. kill {k}: requests in flight answered"] = (
                f"{len(unanswered)} of {len(in_flight)} requests in flight at the kill not answered within {RESUME_BOUND:.2f} s: "
                + "; ".join(
                    f"w{r.worker} {r.what} on {r.node}: {r.outcome} {r.answered - kill.at:.2f} s after the kill" for r in unanswered[:6]
                )
            )
    # 3d. With a leader again, the nodes go on through the two members left:
    # no request refused because etcd did not answer (a write into the
    # writer's own region meets no lock of anybody's), unless it was in
    # flight while etcd held an election of its own (a leader starved of
    # the shared cores loses its followers: etcd had no leader to answer).
    elections = etcd.elections()
    excused: dict[int, int] = {}
    for k, kill in enumerate(kills, 1):
        down = [r for r in requests if kill.workers_at is not None and kill.workers_at <= r.sent and r.answered < kill.down_until]
        # Only elections after every worker was granted again: the kill's
        # own were over by then.
        def etcds(r: Request, kill: Kill = kill) -> bool:
            return refused_as_unavailable(r) and during_an_election(r, elections, wall, since=kill.workers_at)

        excused[k] = sum(map(etcds, down))
        refused = {n: [r for r in down if r.node == n and refused_as_unavailable(r) and not etcds(r)] for n in nodes}
        if any(refused.values()):
            failures[f"3d. kill {k}: nodes go on through the other members"] = (
                f"in the {kill.down_until - (kill.workers_at or 0):.2f} s on two members after every worker was granted again, "
                f"requests refused as etcd unavailable, per node: "
                + "; ".join(
                    f"{n} {len(rs)} of {sum(r.node == n for r in down)} ({sorted({r.what for r in rs})})" for n, rs in refused.items()
                )
            )

    # 4. The killed member is back, and the nodes serve with it.
    for k, kill in enumerate(kills, 1):
        if kill.healthy is not None and (kill.members != 3 or set(kill.served) != set(nodes)):
            failures[f"4. kill {k}: rejoins"] = (
                f"after {etcd.members[kill.member].name} restarted: {kill.members} members; "
                f"nodes granting after it was healthy: {sorted(kill.served)}"
            )

    statuses: dict[str, dict[str, int]] = {}
    for kill in kills:
        for r in requests:
            if kill.at <= r.answered <= kill.at + RESUME_BOUND:
                key = status_name(r.status) if r.outcome == ANSWERED else r.outcome
                statuses.setdefault(r.what, {}).setdefault(key, 0)
                statuses[r.what][key] += 1
    print(f"\n{ended - start:.1f} s; {run_summary(workers, nodes, disk)}; resume bound {RESUME_BOUND:.2f} s")
    for k, kill in enumerate(kills, 1):
        in_flight = [r for r in requests if r.sent < kill.at < r.answered]
        print(
            f"  kill {k} of {etcd.members[kill.member].name} at {rel(kill.at)}: first grant after it "
            f"{ {n: round(t - kill.at, 2) for n, t in sorted(kill.resumed.items())} } s; every worker granted by "
            f"{'never' if kill.workers_at is None else f'{kill.workers_at - kill.at:.2f} s'}; in flight {len(in_flight)}, "
            f"answered by {max((r.answered - kill.at for r in in_flight), default=0):.2f} s; longest wait of a request "
            f"sent after it {max((r.delay for r in requests if kill.at <= r.sent <= kill.at + RESUME_BOUND), default=0):.2f} s; "
            f"new leader {None if kill.new_leader is None else etcd.members[kill.new_leader].name}; restarted and healthy in "
            f"{'never' if kill.healthy is None else f'{kill.healthy - kill.restarted:.2f} s'}, {kill.members} members, "
            f"every node granting "
            f"{'never' if set(kill.served) != set(nodes) else f'{max(kill.served.values()) - kill.healthy:.2f} s'} later"
        )
    print(f"  answers within {RESUME_BOUND:.2f} s of a kill: {statuses}")
    for k, kill in enumerate(kills, 1):
        down = [r for r in requests if kill.workers_at is not None and kill.workers_at <= r.sent and r.answered < kill.down_until]
        print(
            f"  kill {k}: {kill.down_until - (kill.workers_at or kill.down_until):.2f} s on two members after every worker was "
            f"granted again: requests per node {[sum(r.node == n for r in down) for n in nodes]}, refused as etcd unavailable "
            f"{[sum(r.node == n and refused_as_unavailable(r) for r in down) for n in nodes]}, of which in flight during an "
            f"election etcd held on its own {excused.get(k, 0)}"
        )
    print(f"  etcd's elections (term: began, won, from the start): {[(e.term, rel(e.began - wall), e.ended and rel(e.ended - wall)) for e in elections]}")
    print(f"  nodes' leases before the first kill {leases_before}, at the end {leases_after}")
    if failures:
        pytest.fail("\n".join(f"{k}: {v}" for k, v in sorted(failures.items())), pytrace=False)


def test_write_checker():
    """The acknowledged-writes check itself, on made-up records."""

    def write(worker: int, seq: int, outcome: str = ANSWERED, status: int | None = 0, count: int = RECORD) -> Write:
        r = Request(worker, "n1", 1, "write", 1.0, 1.001, outcome, status)
        return Write(worker, seq, record_offset(worker, seq), record(worker, seq), r, count if status == 0 else 0)

    a, b = write(0, 0), write(8, 1)
    disk = bytearray(record_offset(8, 2))
    for w in (a, b):
        disk[w.offset : w.offset + RECORD] = w.data
    assert missing_writes([a, b], bytes(disk)) == []
    assert missing_writes([a, b, write(3, 0)], bytes(disk)) != []  # acknowledged, never written
    assert missing_writes([a, write(3, 0, TIMEOUT, None)], bytes(disk)) == []  # not acknowledged: may be missing
    assert missing_writes([a, write(3, 0, ANSWERED, 0xC0000022)], bytes(disk)) == []  # refused
    assert missing_writes([write(0, 0, count=8)], bytes(disk)) != []  # acknowledged short
    assert missing_writes([a], bytes(disk[: a.offset + 8])) != []  # the file ends inside the record
    other = bytearray(disk)
    other[b.offset : b.offset + RECORD] = record(8, 9)
    assert missing_writes([b], bytes(other)) != []  # another record in its place


def test_election_check(tmp_path):
    """The election spans read from etcd's logs, and which requests they
    excuse, on a log made up as etcd 3.4 writes it: term 4 stood for and
    not won, folded into term 5, won at 25.178."""
    log = tmp_path / "m0.log"
    log.write_text(
        "### /usr/bin/etcd --name=m0\n"
        + "\n".join(
            json.dumps({"level": "info", "ts": f"2026-12-02T08:06:{ts}Z", "msg": f"46a0d4e1c844dbad {msg}"})
            for ts, msg in [
                ("17.301", "became candidate at term 2"),
                ("17.302", "became leader at term 2"),
                ("24.565", "became candidate at term 4"),
                ("24.577", "became follower at term 4"),
                ("25.177", "became candidate at term 5"),
                ("25.178", "became leader at term 5"),
            ]
        )
        + "\nnot json\n"
    )
    etcd = EtcdCluster(tmp_path)
    for m in etcd.members:
        m.log_path = log
    elections = etcd.elections()
    assert [e.term for e in elections] == [2, 5]
    t0 = datetime(2026, 12, 2, 8, 6, tzinfo=timezone.utc).timestamp()
    assert elections[1].began == pytest.approx(t0 + 24.565) and elections[1].ended == pytest.approx(t0 + 25.178)

    def refused(sent: float, answered: float) -> Request:
        return Request(0, "n3", 1, "lock", sent, answered, ANSWERED, STATUS_INSUFFICIENT_RESOURCES)

    assert during_an_election(refused(23.68, 25.179), elections, t0)  # the CI run's refused lock
    assert during_an_election(refused(23.0, 23.6), elections, t0)  # while the leader was silent
    assert not during_an_election(refused(22.0, 23.5), elections, t0)  # before it fell silent
    assert not during_an_election(refused(25.7, 25.8), elections, t0)  # after the new leader settled
    assert not during_an_election(refused(25.0, 29.0), elections, t0)  # answered long after: the node's
    # An election that began before `since` (a kill's own) excuses nothing.
    assert not during_an_election(refused(23.68, 25.179), elections, t0, since=24.6)
