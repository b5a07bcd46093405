"""smbtorture against one node of a three-node cluster (issue 15): the same
suites as tests/test_smbtorture.py, judged against the same known-failures
and expected-skips lists, so that a cluster node is shown to serve a client
as a single node does.

One real three-member etcd cluster and three Nimbus nodes (127.0.0.1-3,
one shared directory) serve the whole module; smbtorture talks to the
first. The other two nodes are members throughout: every file smbtorture
opens is decided through the cluster store (ownership, hand-over when
idle ownerships are swept), every break and change notify path runs the
cluster code.

Suites run ts.LANES at a time as in tests/test_smbtorture.py; each lane has
a share of its own (one directory each on the shared file system), so that
suites running at once cannot meet in each other's file names.
"""

from __future__ import annotations

import fnmatch
import os
import queue
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_smbtorture as ts
from cut_proxy import RotatingProxy
from conftest import PASSWORD, USER, add_user, free_port, nimbus_binary, require_tool, toml_str, wait_for_port
from etcd_cluster import EtcdCluster, require_etcd


# The tests whose connections all go to n1 (patterns of names, fnmatch),
# and why. Two kinds:
# - a client that binds a second channel to its session: a session lives on
#   the node that made it, and a client binds channels to the interfaces
#   that node lists (FSCTL_QUERY_NETWORK_INTERFACE_INFO), not through a
#   load balancer. On a cluster these tests need one node by their nature.
# - "cluster gap": what a client sees differ when its connections reach
#   different nodes. Each is work to do; the list only shrinks.
CHANNELS = "binds a second channel to its session, which lives on one node"
ONE_NODE: dict[str, str] = {
    "smb2.session.bind*": CHANNELS,
    "smb2.multichannel.*": CHANNELS,
    "smb2.replay.dhv2-pending[23]*": CHANNELS,
    "smb2.replay.replay[34]": CHANNELS,
    # The three nodes share one local directory in this test, so a change
    # made through another node reaches a watcher here twice: relayed
    # through etcd, and from the local file system's own events (inotify),
    # which on a shared file system (NFS, CephFS) report only this host's
    # changes. They are not turned off here (`max_inotify_watches = 0`, as
    # in tests/test_cluster.py), because they also cover a gap of change
    # notify across nodes that smbtorture's tests run into: a change made
    # on another node within milliseconds of a watch's start, before that
    # node's copy of the registrations names the watch, is not relayed
    # (docs/CLUSTER.md).
    "smb2.notify.dir": "the nodes share one local directory here: another node's change is reported twice",
    "smb2.notify.mask": "the nodes share one local directory here: another node's change is reported twice",
    "smb2.notify.rec": "the nodes share one local directory here: another node's change is reported twice",
    "smb2.notify.double": "the nodes share one local directory here: another node's change is reported twice",
}


@dataclass
class NodeTarget:
    """What run_smbtorture needs of a server."""

    host: str
    port: int
    share: str
    user: str
    password: str


@dataclass
class Lane:
    """What one lane's suites talk to: the proxy that spreads their
    connections over the nodes, and n1 for the tests pinned to one node."""

    spread: NodeTarget
    direct: NodeTarget
    proxy: RotatingProxy


def no_apple_share(share: str) -> str:
    return f"{share}-{ts.NO_APPLE_SHARE}"


@pytest.fixture(scope="module")
def cluster_node(request, tmp_path_factory):
    require_etcd()
    # More lines of the nodes' `[cluster]` sections, from the module whose
    # suites run (tests/test_smbtorture_per_lease.py turns a key off).
    cluster_extra = getattr(request.module, "CLUSTER_EXTRA", [])
    base = tmp_path_factory.mktemp("torture-cluster")
    share_names = ["data"] + [f"data{n}" for n in range(2, ts.LANES + 1)]
    shares = []
    for name in share_names:
        hide = "hide_files = [" + ", ".join(toml_str(p) for p in ts.HIDE_FILES) + "]"
        shares += ["[[share]]", f"name = {toml_str(name)}", f"path = {toml_str(str(base / 'shared' / name))}", hide]
        (base / "shared" / name).mkdir(parents=True)
    # smb2.acls.ACCESSBASED's second share, as in tests/test_smbtorture.py.
    shares += ["[[share]]", f"name = {toml_str(ts.ABE_SHARE)}", f"path = {toml_str(str(base / 'shared' / ts.ABE_SHARE))}", "access_based_enumeration = true"]
    (base / "shared" / ts.ABE_SHARE).mkdir(parents=True)
    # vfs.fruit's torture:share2, as in tests/test_smbtorture.py: each
    # lane's share's directory once more, without Apple's extensions.
    for name in share_names:
        shares += ["[[share]]", f"name = {toml_str(no_apple_share(name))}", f"path = {toml_str(str(base / 'shared' / name))}", "apple_extensions = false"]
    db = base / "users.db"
    add_user(db)
    add_user(db, *ts.USER2)  # smb2.session.bind_different_user
    # The members' data in memory: the suites judge the nodes' answers,
    # and on the test machine's one disk etcd's fsyncs waited behind
    # smbtorture's writes until the leader missed its heartbeats and a
    # CREATE's record write ran out of time (STATUS_INSUFFICIENT_RESOURCES).
    # etcd's durability has tests of its own (test_etcd_failover.py).
    etcd_data = Path(tempfile.mkdtemp(prefix="nimbus-torture-etcd-", dir="/dev/shm"))
    etcd = EtcdCluster(base / "etcd", data_root=etcd_data)
    procs, proxies, lanes = [], [], []
    try:
        etcd.start()
        ports = []
        for i in range(3):
            host, port = f"127.0.0.{i + 1}", free_port()
            ports.append((host, port))
            d = base / f"n{i + 1}"
            d.mkdir()
            conf = d / "nimbus.toml"
            conf.write_text(
                "\n".join(
                    [
                        f"listen = [{toml_str(f'{host}:{port}')}]",
                        f"user_db = {toml_str(str(db))}",
                        f"apple_model = {toml_str(ts.APPLE_MODEL)}",
                        # The proxy's address, which smbtorture names as
                        # the NTLM target, as a load balancer's would be.
                        'server_aliases = ["127.0.0.1"]',
                        "[security]",
                        'signing = "required"',
                        *shares,
                        "[cluster]",
                        *etcd.node_toml_lines(),
                        f"node = \"n{i + 1}\"",
                        f"advertise = {toml_str(f'{host}:{port}')}",
                        "node_ttl_secs = 5",
                        *cluster_extra,
                    ]
                )
                + "\n"
            )
            log = open(d / "nimbus.log", "ab")
            env = dict(os.environ, NO_COLOR="1")
            proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT, env=env)
            procs.append(proc)
            wait_for_port(host, port, proc)
        # One rotating proxy per lane, rewound before each suite: which node
        # a test's connections reach depends only on the suite.
        for name in share_names:
            proxy = RotatingProxy(ports, max_connections=256, lifetime=ts.SUITE_TIMEOUT * 40)
            proxies.append(proxy.__enter__())
            direct = NodeTarget(host=ports[0][0], port=ports[0][1], share=name, user=USER, password=PASSWORD)
            lanes.append(Lane(NodeTarget(host="127.0.0.1", port=proxy.port, share=name, user=USER, password=PASSWORD), direct, proxy))
        yield lanes
        # Every node served smbtorture's connections, none was refused by
        # a node, and the proxies themselves saw nothing go wrong.
        per_node = [sum(p.forwarded[i] for p in proxies) for i in range(3)]
        errors = [e for p in proxies for e in p.errors]
        assert min(per_node) > 0 and not errors, f"connections per node: {per_node}; proxy errors: {errors}"
        # The nodes smbtorture does not talk to were members throughout:
        # still running and registered when the suites are done.
        exited = [f"n{i + 1} (exit {p.returncode})" for i, p in enumerate(procs) if p.poll() is not None]
        keys = etcd.etcdctl("get", "--prefix", "/nimbus/nodes/", "--keys-only").split()
        registered = sorted(k.removeprefix("/nimbus/nodes/") for k in keys)
        assert not exited and registered == ["n1", "n2", "n3"], f"nodes exited: {exited}; registered: {registered}"
    finally:
        for proxy in proxies:
            proxy.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        try:
            etcd.stop()
        finally:
            shutil.rmtree(etcd_data, ignore_errors=True)
    panicked = [f"n{i + 1}" for i in range(len(procs)) if "panicked at" in (base / f"n{i + 1}" / "nimbus.log").read_text(errors="replace")]
    assert not panicked, f"cluster nodes that panicked: {panicked}"


@pytest.fixture(scope="module")
def cluster_suite_runs(request, cluster_node, tmp_path_factory, samba_client_conf):
    """Every selected suite against the first node, a share per lane."""
    base = tmp_path_factory.mktemp("smbtorture-cluster")
    free = queue.Queue()
    for lane in cluster_node:
        free.put(lane)

    def run_one(suite: str) -> ts.SuiteRun:
        workdir = base / suite
        workdir.mkdir()
        lane = free.get()
        lane.proxy.rewind()
        target = lane.spread
        try:
            options = [
                f"--option=torture:share2={no_apple_share(target.share)}",
                f"--option=torture:user2name={ts.USER2[0]}",
                f"--option=torture:user2password={ts.USER2[1]}",
                ts.ACL_XATTR_OPTION,
            ]
            timeout = ts.SUITE_TIMEOUTS.get(suite, ts.SUITE_TIMEOUT)
            return ts.run_smbtorture(target, suite, samba_client_conf, workdir / f"{suite}.subunit", timeout, options, (lane.direct, ONE_NODE))
        finally:
            free.put(lane)

    lanes = ts.SuiteLanes(run_one, len(cluster_node))
    lanes.start(ts.selected_suites(request))
    yield lanes
    lanes.close()


@require_tool("smbtorture", "samba-testsuite")  # skipped when missing; fails under CI=true
@pytest.mark.parametrize("suite", ts.SUITES)
def test_smbtorture_suite_against_a_cluster_node(request, cluster_suite_runs, suite):
    judge_on_cluster(request, cluster_suite_runs, suite, "a cluster node")


def judge_on_cluster(request, runs, suite: str, node: str) -> None:
    """`suite`'s run against `node` (its description), judged against the
    one-node known failures and expected skips."""
    known, _ = ts.load_known_failures()
    skips, _ = ts.load_expected_skips()
    listed = ts.list_tests(suite)
    run = runs.result(suite)
    ts.report(request, suite, run, listed, f" on {node}")
    problems = ts.judge(suite, listed, run, known, skips)
    assert not problems, f"smbtorture {suite} against {node}:\n" + "\n".join(problems)


@require_tool("smbtorture", "samba-testsuite")
def test_every_one_node_pattern_names_tests():
    """A pattern left behind when its tests moved or were renamed would
    pin nothing and hide nothing: each names at least one test."""
    listed = [t for suite in ts.SUITES for t in ts.list_tests(suite)]
    stale = [p for p in ONE_NODE if not any(fnmatch.fnmatchcase(t, p) for t in listed)]
    assert not stale, f"ONE_NODE patterns that name no test: {stale}"
