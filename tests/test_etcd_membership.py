"""Every etcd member replaced while the nodes serve (issue 44, "A member is
replaced (removed, a new one added): the nodes follow the membership
without a restart").

Three nodes, each configured with the three members' own client URLs (no
proxy: a node follows the member list only when what it was given is the
members' own URLs), on the TLS etcd of the other cluster tests. Nine
workers of tests/test_etcd_failover.py, three per node, take overlapping
exclusive locks of one file and write records of their own while they hold
them. Once every worker has been granted a few locks, the test replaces
the members one at a time, as an operator does (`EtcdCluster.replace_member`:
`member add` of a new member on new ports, its start, a wait until every
member is healthy, `member remove` of the old one and its stop). After each
replacement it waits until every node has logged that its calls go to the
new member list (the server's own account, read from its log) and every
worker has been granted again. After the third, no URL in any node's
configuration belongs to a member. It then lets the workers run for
STEADY, two TTLs, so that every node renews its lease through the new
members only, and checks:

1. exclusivity, 2. every acknowledged write on disk, 3c. no request hangs,
   5. no lock outlives its open (as tests/test_etcd_failover.py);
3. every replacement is followed: each node logs the new member list
   within FOLLOW_BOUND of the replacement, and every worker is granted a
   LOCK sent after it;
4. the nodes run on through the new members alone: in the STEADY period
   every worker is granted, and no request is refused as etcd unavailable;
6. no restart: the same node processes as at the start, each still
   registered in etcd under the lease it had before the first replacement
   (a node that lost touch with etcd for its TTL would have lost that lease
   and registered again under another).

`-s` shows the run's times.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from etcd_cluster import START_TIMEOUT, etcd_cluster  # noqa: F401  (the fixture)
from test_cluster import members
from test_etcd_failover import (
    Writer,
    during_an_election,
    granted_since,
    refused_as_unavailable,
    run_failures,
    run_summary,
    wait_for,
)
from test_partition import TTL, WORKERS_PER_NODE, Timeline, three_nodes

FOLLOW_EVERY = 5.0  # crates/nimbus-state/src/etcd_rpc.rs FOLLOW_EVERY: how often a node reads the member list
FOLLOW_BOUND = 2 * FOLLOW_EVERY + 2.0  # a look may fail while the removed member was the one asked
WARMUP_GRANTS = 3  # per worker, before the first replacement
WARMUP_WAIT = 20.0
GRANTED_AGAIN_WAIT = 15.0  # after a replacement is followed, until every worker is granted again
STEADY = 2 * TTL  # on the new members alone, at least one lease renewal per node
FOLLOWED = "etcd: the cluster's members changed: calls go to "


@dataclass
class Replacement:
    old: str  # the old member's client URL
    new: str  # the new member's
    started: float  # just before `member add`
    done: float = 0.0  # the old member removed and stopped
    followed: dict[str, float] = field(default_factory=dict)  # node -> when its log named the new URL
    granted_at: float | None = None  # every worker granted a LOCK sent after `done`


@pytest.fixture
def direct_cluster(request, tmp_path, etcd_cluster):  # noqa: F811  (pytest's fixture injection)
    """test_partition's three nodes, every one reaching the members directly."""
    yield from three_nodes(request, tmp_path, etcd_cluster, proxied=())


def follow_lines(node) -> list[str]:
    """The lists of etcd endpoints `node` logged it moved its calls to
    ("calls go to <list> (were <list>)": the first list only)."""
    try:
        text = node.log_path.read_text(errors="replace")
    except OSError:
        return []
    return [line.split(FOLLOWED, 1)[1].split(" (were ", 1)[0] for line in text.splitlines() if FOLLOWED in line]


def test_locks_and_writes_survive_replacing_every_etcd_member(direct_cluster):
    cluster = direct_cluster
    etcd = cluster.etcd
    nodes = [n.name for n in cluster.nodes]
    configured = set(etcd.endpoints)
    pids = {n.name: n.proc.pid for n in cluster.nodes}
    stop = threading.Event()
    workers = [
        Writer(i * WORKERS_PER_NODE + j, node.name, node.host, (node.host, node.port), stop, Timeline())
        for i, node in enumerate(cluster.nodes)
        for j in range(WORKERS_PER_NODE)
    ]
    replacements: list[Replacement] = []
    failures: dict[str, str] = {}
    leases_before: dict[str, int] = {}
    leases_after: dict[str, int] = {}
    steady_from = steady_until = 0.0

    start = time.monotonic()
    wall = time.time() - start
    for w in workers:
        w.start()
    try:
        warm = wait_for(lambda: all(len(w.holds) >= WARMUP_GRANTS for w in workers), WARMUP_WAIT)
        leases_before = {n: m["lease"] for n, m in members(etcd).items()}
        for i in range(len(etcd.members) if warm is not None else 0):
            old = etcd.members[i].client_url
            rep = Replacement(old, "", time.monotonic())
            try:
                rep.new = etcd.replace_member(i).client_url
            except (RuntimeError, TimeoutError) as e:
                failures[f"0. replacement {i + 1}"] = f"the harness could not replace {old}: {e}"
                break
            rep.done = time.monotonic()
            replacements.append(rep)

            def followed(rep: Replacement = rep) -> bool:
                for n in cluster.nodes:
                    if n.name not in rep.followed and any(rep.new in line and rep.old not in line for line in follow_lines(n)):
                        rep.followed[n.name] = time.monotonic()
                return len(rep.followed) == len(nodes)

            # On, even when a node did not follow: what its clients see once
            # none of its configured members is left is what counts most.
            wait_for(followed, FOLLOW_BOUND)
            rep.granted_at = wait_for(lambda rep=rep: all(granted_since(w, rep.done) for w in workers), GRANTED_AGAIN_WAIT)
        if len(replacements) == len(configured):
            steady_from = time.monotonic()
            stop.wait(STEADY)
            steady_until = time.monotonic()
        leases_after = {n: m["lease"] for n, m in members(etcd).items()}
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=Writer.request_timeout + 5)
    ended = time.monotonic()
    requests = [r for w in workers for r in w.requests]
    rel = lambda t: f"{t - start:.2f} s"  # noqa: E731  (times from the start of the workers)
    found, disk = run_failures(cluster, workers, rel)
    failures.update(found)
    if warm is None:
        failures["0. setup"] = f"not every worker was granted {WARMUP_GRANTS} locks: { {w.name: len(w.holds) for w in workers} }"

    # 3. Every replacement is followed.
    for k, rep in enumerate(replacements, 1):
        late = {n: (f"{rep.followed[n] - rep.done:.2f} s" if n in rep.followed else "never") for n in nodes}
        if len(rep.followed) != len(nodes) or rep.granted_at is None:
            failures[f"3. replacement {k}: followed"] = (
                f"{rep.old} replaced by {rep.new}: nodes logging the new member list, after the removal: {late} "
                f"(bound {FOLLOW_BOUND:g} s); every worker granted a LOCK sent after it within {GRANTED_AGAIN_WAIT:g} s: "
                f"{rep.granted_at is not None}"
            )
    members_now = set(etcd.endpoints)
    if replacements and not (members_now.isdisjoint(configured) and len(members_now) == len(configured)):
        failures["0. replaced"] = f"members at the end {sorted(members_now)}, configured {sorted(configured)}"

    # 4. On the new members alone.
    steady = [r for r in requests if steady_from <= r.sent and r.answered <= steady_until]
    # Refusals while etcd elected a leader of its own accord are etcd's
    # (test_etcd_failover's 3d).
    elections = etcd.elections()
    refused = [r for r in steady if refused_as_unavailable(r) and not during_an_election(r, elections, wall, since=steady_from)]
    not_served = [w.name for w in workers if not granted_since(w, steady_from)] if steady_until else nodes
    if not steady_until or refused or not_served:
        failures["4. on the new members alone"] = (
            f"steady period run: {bool(steady_until)}; in it, workers never granted: {not_served}; "
            f"{len(refused)} of {len(steady)} requests refused as etcd unavailable "
            f"({[(r.node, r.what, rel(r.sent)) for r in refused[:6]]})"
        )

    # 6. No restart, no lost registration.
    exited = {n.name: n.proc.returncode for n in cluster.nodes if n.proc.poll() is not None}
    same = {n.name: n.proc.pid == pids[n.name] for n in cluster.nodes}
    if exited or not all(same.values()) or leases_after != leases_before or set(leases_before) != set(nodes):
        failures["6. no restart"] = (
            f"exited: {exited}; same process: {same}; leases before the first replacement {leases_before}, at the end {leases_after}"
        )

    print(f"\n{ended - start:.1f} s; {run_summary(workers, nodes, disk)}")
    for k, rep in enumerate(replacements, 1):
        during = [r for r in requests if rep.started <= r.sent <= (rep.granted_at or rep.done)]
        print(
            f"  replacement {k}: {rep.old} -> {rep.new} in {rep.done - rep.started:.2f} s; followed after "
            f"{ {n: round(t - rep.done, 2) for n, t in sorted(rep.followed.items())} } s; every worker granted again "
            f"{'never' if rep.granted_at is None else f'{rep.granted_at - rep.done:.2f} s'} after; requests meanwhile "
            f"{len(during)}, refused as etcd unavailable {sum(refused_as_unavailable(r) for r in during)}"
        )
    print(f"  steady on the new members: {steady_until - steady_from:.2f} s, {len(steady)} requests; leases {leases_after}")
    if failures:
        pytest.fail("\n".join(f"{k}: {v}" for k, v in sorted(failures.items())), pytrace=False)

