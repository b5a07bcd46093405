"""The `etcd_cluster` fixture itself (tests/etcd_cluster.py), with etcdctl.

Tests of cluster state lean on two things the fixture promises: the three
members form one cluster (what is written through one member is read
through another), and stopping members behaves like a partition (one of
three gone keeps a quorum; two gone stop writes, within the command
timeout, not forever; started again, they rejoin on their data and writes
work again). If either broke, those tests would fail for the wrong reason.

Every etcdctl call has a command timeout; the waits poll the cluster's
health, never a sleep alone.
"""

from __future__ import annotations

import time

import pytest

from etcd_cluster import DIAL_TIMEOUT, PROCESS_SLACK, EtcdCluster, EtcdError, etcd_cluster  # noqa: F401 (fixture)

NO_QUORUM_TIMEOUT = 2.0  # a write that cannot commit fails after this


def get(cluster: EtcdCluster, key: str, endpoint: str) -> str:
    """The key's value read through one member (a linearizable read, so it
    needs that member to reach the leader)."""
    return cluster.etcdctl("get", key, "--print-value-only", endpoints=[endpoint]).strip()


def test_write_through_one_member_reads_through_the_others(etcd_cluster: EtcdCluster):  # noqa: F811
    eps = etcd_cluster.endpoints
    assert len(eps) == 3 and len(set(eps)) == 3
    # TLS to clients and between peers (tests/test_cluster_tls.py checks
    # what it refuses).
    assert all(ep.startswith("https://127.0.0.1:") for ep in eps)

    assert etcd_cluster.etcdctl("put", "/nimbus/test/k", "v1", endpoints=[eps[0]]).strip() == "OK"
    assert get(etcd_cluster, "/nimbus/test/k", eps[1]) == "v1"
    assert get(etcd_cluster, "/nimbus/test/k", eps[2]) == "v1"

    members = [line.split(", ") for line in etcd_cluster.etcdctl("member", "list", endpoints=[eps[2]]).splitlines()]
    assert sorted(m[2] for m in members) == ["m0", "m1", "m2"]
    assert all(m[3].startswith("https://127.0.0.1:") and m[4].startswith("https://127.0.0.1:") for m in members), members


def test_quorum_two_of_three(etcd_cluster: EtcdCluster):  # noqa: F811
    eps = etcd_cluster.endpoints

    # One member gone: two of three are a quorum, writes commit.
    etcd_cluster.stop_member(2)
    etcd_cluster.etcdctl("put", "/nimbus/test/a", "1", endpoints=[eps[0]])
    assert get(etcd_cluster, "/nimbus/test/a", eps[1]) == "1"

    # Two gone: the last member cannot commit; the write fails, and within
    # its command timeout rather than hanging.
    etcd_cluster.stop_member(1)
    began = time.monotonic()
    with pytest.raises(EtcdError):
        etcd_cluster.etcdctl("put", "/nimbus/test/b", "2", endpoints=[eps[0]], timeout=NO_QUORUM_TIMEOUT)
    assert time.monotonic() - began < NO_QUORUM_TIMEOUT + DIAL_TIMEOUT + PROCESS_SLACK

    # Back again on their data directories: the cluster heals, writes work,
    # and the member that missed the first write has caught up.
    etcd_cluster.start_member(1)
    etcd_cluster.start_member(2)
    etcd_cluster.wait_healthy(timeout=30)
    etcd_cluster.etcdctl("put", "/nimbus/test/c", "3", endpoints=[eps[2]])
    assert get(etcd_cluster, "/nimbus/test/c", eps[0]) == "3"
    assert get(etcd_cluster, "/nimbus/test/a", eps[2]) == "1"
