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

import os
import queue
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_smbtorture as ts
from conftest import PASSWORD, USER, add_user, free_port, nimbus_binary, require_tool, toml_str, wait_for_port
from etcd_cluster import EtcdCluster, require_etcd


@dataclass
class NodeTarget:
    """What run_smbtorture needs of a server."""

    host: str
    port: int
    share: str
    user: str
    password: str


def no_apple_share(share: str) -> str:
    return f"{share}-{ts.NO_APPLE_SHARE}"


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory):
    require_etcd()
    base = tmp_path_factory.mktemp("torture-cluster")
    etcd = EtcdCluster(base / "etcd")
    etcd.start()
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
    procs = []
    try:
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
                        "[security]",
                        'signing = "required"',
                        *shares,
                        "[cluster]",
                        *etcd.node_toml_lines(),
                        f"node = \"n{i + 1}\"",
                        f"advertise = {toml_str(f'{host}:{port}')}",
                        "node_ttl_secs = 5",
                    ]
                )
                + "\n"
            )
            log = open(d / "nimbus.log", "ab")
            env = dict(os.environ, NO_COLOR="1")
            proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=log, stderr=subprocess.STDOUT, env=env)
            procs.append(proc)
            wait_for_port(host, port, proc)
        host, port = ports[0]
        yield [NodeTarget(host=host, port=port, share=name, user=USER, password=PASSWORD) for name in share_names]
        # The nodes smbtorture does not talk to were members throughout:
        # still running and registered when the suites are done.
        exited = [f"n{i + 1} (exit {p.returncode})" for i, p in enumerate(procs) if p.poll() is not None]
        keys = etcd.etcdctl("get", "--prefix", "/nimbus/nodes/", "--keys-only").split()
        registered = sorted(k.removeprefix("/nimbus/nodes/") for k in keys)
        assert not exited and registered == ["n1", "n2", "n3"], f"nodes exited: {exited}; registered: {registered}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        etcd.stop()
    panicked = [f"n{i + 1}" for i in range(len(procs)) if "panicked at" in (base / f"n{i + 1}" / "nimbus.log").read_text(errors="replace")]
    assert not panicked, f"cluster nodes that panicked: {panicked}"


@pytest.fixture(scope="module")
def cluster_suite_runs(request, cluster_node, tmp_path_factory, samba_client_conf):
    """Every selected suite against the first node, a share per lane."""
    base = tmp_path_factory.mktemp("smbtorture-cluster")
    free = queue.Queue()
    for target in cluster_node:
        free.put(target)

    def run_one(suite: str) -> ts.SuiteRun:
        workdir = base / suite
        workdir.mkdir()
        target = free.get()
        try:
            options = [
                f"--option=torture:share2={no_apple_share(target.share)}",
                f"--option=torture:user2name={ts.USER2[0]}",
                f"--option=torture:user2password={ts.USER2[1]}",
                ts.ACL_XATTR_OPTION,
            ]
            return ts.run_smbtorture(target, suite, samba_client_conf, workdir / f"{suite}.subunit", ts.SUITE_TIMEOUTS.get(suite, ts.SUITE_TIMEOUT), options)
        finally:
            free.put(target)

    lanes = ts.SuiteLanes(run_one, len(cluster_node))
    lanes.start(ts.selected_suites(request))
    yield lanes
    lanes.close()


@require_tool("smbtorture", "samba-testsuite")  # skipped when missing; fails under CI=true
@pytest.mark.parametrize("suite", ts.SUITES)
def test_smbtorture_suite_against_a_cluster_node(request, cluster_suite_runs, suite):
    known, _ = ts.load_known_failures()
    skips, _ = ts.load_expected_skips()
    listed = ts.list_tests(suite)
    run = cluster_suite_runs.result(suite)
    ts.report(request, suite, run, listed, " on a cluster node")
    problems = ts.judge(suite, listed, run, known, skips)
    assert not problems, f"smbtorture {suite} against a cluster node:\n" + "\n".join(problems)
