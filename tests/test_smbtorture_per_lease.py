"""smbtorture's lease, oplock and lock suites against one node of a
three-node cluster whose nodes give every lease a grant of its own in the
file's caching record (`[cluster] group_leases = false`; the default,
leases granted through the node's groups of alike opens, is what
tests/test_smbtorture_cluster.py runs), judged against the same
known-failures list as one node and the default cluster: a client sees the
same answers whether a file's leases are grants of their own or held
through the node.
"""

from __future__ import annotations

import pytest
from conftest import require_tool
from test_smbtorture_cluster import cluster_node, cluster_suite_runs, judge_on_cluster  # noqa: F401  (the fixtures)

# The nodes' `[cluster]` lines beyond the default cluster's (read by
# test_smbtorture_cluster.cluster_node).
CLUSTER_EXTRA = ["group_leases = false"]

# The suites whose files are opened with leases and oplocks, and locked.
PER_LEASE_SUITES = ["smb2.lease", "smb2.oplock", "smb2.lock"]


@require_tool("smbtorture", "samba-testsuite")  # skipped when missing; fails under CI=true
@pytest.mark.parametrize("suite", PER_LEASE_SUITES)
def test_smbtorture_suite_against_a_node_granting_each_lease_its_own_grant(request, cluster_suite_runs, suite):  # noqa: F811
    judge_on_cluster(request, cluster_suite_runs, suite, "a cluster node granting each lease its own grant")
