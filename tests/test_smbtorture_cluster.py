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
"""

from __future__ import annotations

import os
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


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory):
    require_etcd()
    base = tmp_path_factory.mktemp("torture-cluster")
    etcd = EtcdCluster(base / "etcd")
    etcd.start()
    share = base / "shared"
    share.mkdir()
    db = base / "users.db"
    add_user(db)
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
                        "[security]",
                        'signing = "required"',
                        "[[share]]",
                        'name = "data"',
                        f"path = {toml_str(str(share))}",
                        "[cluster]",
                        "etcd = [" + ", ".join(toml_str(e) for e in etcd.endpoints) + "]",
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
        yield NodeTarget(host=host, port=port, share="data", user=USER, password=PASSWORD)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        etcd.stop()


@require_tool("smbtorture", "samba-testsuite")  # skipped when missing; fails under CI=true
@pytest.mark.parametrize("suite", ts.SUITES)
def test_smbtorture_suite_against_a_cluster_node(cluster_node, suite, samba_client_conf, tmp_path):
    known, _ = ts.load_known_failures()
    skips, _ = ts.load_expected_skips()
    listed = ts.list_tests(suite)
    log_path = tmp_path / f"{suite}.subunit"
    run = ts.run_smbtorture(cluster_node, suite, samba_client_conf, log_path, ts.SUITE_TIMEOUTS.get(suite, ts.SUITE_TIMEOUT))
    counts = {k: sum(1 for v in run.outcomes.values() if v == k) for k in (ts.PASS, ts.FAIL, ts.SKIP)}
    print(f"{suite} on a cluster node: {counts[ts.PASS]} passed, {counts[ts.FAIL]} failed, {counts[ts.SKIP]} skipped of {len(listed)} listed")
    for name, outcome in sorted(run.outcomes.items()):
        if outcome != ts.PASS:
            print(f"  {outcome:4}  {name}  ({ts.first_line(run.details[name])})")
    problems = ts.judge(suite, listed, run, known, skips)
    assert not problems, f"smbtorture {suite} against a cluster node:\n" + "\n".join(problems)
