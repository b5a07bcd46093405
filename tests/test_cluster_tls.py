"""Nimbus nodes on an etcd set up as in production (tests/etcd_cluster.py):
TLS only between clients and members and between peers, a certificate the
cluster's CA signed asked of every client, and etcd's authentication on,
a node being the user its certificate's CN names, whose role grants
readwrite on `/nimbus/` and nothing else.

What the cluster lets through is checked with etcdctl (nothing without a
certificate; the node's identity only under its prefix, leases and watches
included); then that a node refuses to start, at once and saying why, with a
certificate from another CA, without one, with http:// endpoints, with an
expired one, as a user without a role or with a wrong password; that a node
authenticated by a password instead of its CN joins and serves; and that a
node still joins a plain http:// cluster.

Each refusal is also looked up in the members' logs (etcd writes why it
rejected a connection), so that a refusal for another reason (a file the
node could not read, say) does not pass for the one meant.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import smbclient

from conftest import _SERVERS, PASSWORD, USER, add_user
from etcd_cluster import (  # noqa: F401  (the fixtures)
    EXPIRED,
    NODE,
    NOROLE,
    OTHER_CA,
    PASSWORD_USER,
    EtcdCluster,
    EtcdError,
    etcd_cluster,
    etcd_toml_line,
    plain_etcd_cluster,
    require_etcd,
)
from test_cluster import Node, members

REFUSAL_BOUND = 30.0  # a node that cannot use etcd exits within this
WATCH_WAIT = 10.0  # until a watch delivers an event etcd already holds


@pytest.fixture
def site(tmp_path) -> SimpleNamespace:
    """What every node of a test shares: the served directory and the users."""
    share = tmp_path / "shared"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    return SimpleNamespace(base=tmp_path, share=share, db=db)


@pytest.fixture
def make_node(site):
    made: list[Node] = []

    def make(name: str, etcd: list[str]) -> Node:
        n = Node(site.base, name, "127.0.0.1", etcd, site.share, site.db)
        made.append(n)
        return n

    yield make
    for n in made:
        n.stop()


def member_logs(cluster: EtcdCluster) -> str:
    return "\n".join(m.log_path.read_text(errors="replace") for m in cluster.members)


def refused(cluster: EtcdCluster, node: Node, logged: str) -> str:
    """Run `node`, which must exit nonzero within REFUSAL_BOUND, and a
    member must have logged `logged` (why etcd turned it away) meanwhile.
    Returns the node's error line (`nimbus: ...`)."""
    before = member_logs(cluster).count(logged)
    began = time.monotonic()
    proc = node.run(timeout=REFUSAL_BOUND)
    took = time.monotonic() - began
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the node started (exit {proc.returncode}):\n{out}"
    assert took < REFUSAL_BOUND
    errors = [line for line in out.splitlines() if line.startswith("nimbus: ")]
    assert errors, f"no error line:\n{out}"
    if logged:
        assert member_logs(cluster).count(logged) > before, f"no member logged {logged!r}; the node said:\n{out}"
    return errors[-1]


def serves(node: Node) -> None:
    """An SMB client writes a file through `node`; it lands in the share."""
    name, payload = f"{uuid.uuid4().hex}.bin", uuid.uuid4().bytes * 64
    smbclient.register_session(node.host, username=USER, password=PASSWORD, port=node.port)
    try:
        with smbclient.open_file(rf"\\{node.host}\data\{name}", mode="wb", port=node.port) as f:
            f.write(payload)
        assert name in smbclient.listdir(rf"\\{node.host}\data", port=node.port)
    finally:
        smbclient.reset_connection_cache()
    assert (node.share / name).read_bytes() == payload


def watch_events(cluster: EtcdCluster, identity: str, key: str, rev: int, want: bytes) -> bytes:
    """`etcdctl watch --prefix key --rev rev` as `identity`: what it printed
    until `want` appeared, it exited, or WATCH_WAIT passed. From a past
    revision, the watch replays what is already there: no race with a
    write."""
    cmd, env = cluster.etcdctl_command("watch", "--prefix", key, f"--rev={rev}", identity=identity)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    out = b""
    deadline = time.monotonic() + WATCH_WAIT
    try:
        while want not in out:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready, _, _ = select.select([proc.stdout], [], [], remaining)
            if not ready:
                break
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
    return out


# ------------------------------------------------------------- the cluster


def test_without_a_certificate_or_tls_etcd_serves_nothing(etcd_cluster):  # noqa: F811
    key = f"/nimbus/anon-{uuid.uuid4().hex}"
    logs = member_logs(etcd_cluster)
    no_cert = logs.count("client didn't provide a certificate")
    not_tls = logs.count("first record does not look like a TLS handshake")
    # The members' CA trusted, but no certificate shown.
    for args in (("get", "/nimbus/", "--prefix"), ("put", key, "v")):
        with pytest.raises(EtcdError):
            etcd_cluster.etcdctl(*args, identity=None, timeout=1)
    # Plain text to a TLS port.
    for args in (("get", "/nimbus/", "--prefix"), ("put", key, "v")):
        with pytest.raises(EtcdError):
            etcd_cluster.etcdctl(*args, tls=False, timeout=1)
    logs = member_logs(etcd_cluster)
    assert logs.count("client didn't provide a certificate") > no_cert
    assert logs.count("first record does not look like a TLS handshake") > not_tls
    assert etcd_cluster.etcdctl("get", key) == ""


def test_the_node_identity_reads_and_writes_under_nimbus_only(etcd_cluster):  # noqa: F811
    tag = uuid.uuid4().hex
    inside, outside = f"/nimbus/x-{tag}", f"/other-{tag}"
    assert etcd_cluster.etcdctl("put", inside, "v1", identity=NODE).strip() == "OK"
    assert etcd_cluster.etcdctl("get", inside, "--print-value-only", identity=NODE).strip() == "v1"
    etcd_cluster.etcdctl("put", outside, "root's", identity="root")
    # "/nimbus" as a prefix reaches past "/nimbus/" (to "/nimbus0..."): refused too.
    for args in (("put", outside, "v"), ("get", outside), ("del", outside), ("get", "/nimbus", "--prefix")):
        with pytest.raises(EtcdError, match="permission denied"):
            etcd_cluster.etcdctl(*args, identity=NODE)
    assert etcd_cluster.etcdctl("get", outside, "--print-value-only").strip() == "root's"

    # What a node does with its membership: a lease, a key under it, the
    # lease renewed, and a watch of the prefix.
    lease = etcd_cluster.etcdctl("lease", "grant", "30", identity=NODE).split()[1]
    put = etcd_cluster.etcdctl("put", "--lease", lease, f"/nimbus/nodes/{tag}", "here", "-w", "json", identity=NODE)
    rev = int(json.loads(put)["header"]["revision"])
    assert "keepalived" in etcd_cluster.etcdctl("lease", "keep-alive", "--once", lease, identity=NODE)
    out = watch_events(etcd_cluster, NODE, "/nimbus/nodes/", rev, b"here")
    assert f"/nimbus/nodes/{tag}\nhere".encode() in out, out
    # A watch outside the prefix is cancelled by etcd, and delivers nothing.
    out = watch_events(etcd_cluster, NODE, outside, 1, b"canceled")
    assert b"permission denied" in out and b"root's" not in out, out
    # Revoking a lease needs write permission on its keys: the node's own.
    etcd_cluster.etcdctl("lease", "revoke", lease, identity=NODE)
    assert etcd_cluster.etcdctl("get", f"/nimbus/nodes/{tag}") == ""


# ------------------------------------------------------------- refusals


def test_a_node_whose_certificate_another_ca_signed_is_refused(etcd_cluster, make_node):  # noqa: F811
    error = refused(etcd_cluster, make_node("n1", etcd_cluster.node_toml_lines(OTHER_CA)), "certificate signed by unknown authority")
    assert "does not accept this node's certificate" in error and "cert_file" in error, error


def test_a_node_without_a_certificate_is_refused(etcd_cluster, make_node):  # noqa: F811
    error = refused(etcd_cluster, make_node("n1", etcd_cluster.node_toml_lines(None)), "client didn't provide a certificate")
    assert "wants a client certificate" in error and "cert_file and key_file" in error, error


def test_a_node_given_http_endpoints_of_tls_members_is_refused(etcd_cluster, make_node):  # noqa: F811
    plain = [e.replace("https://", "http://", 1) for e in etcd_cluster.endpoints]
    error = refused(etcd_cluster, make_node("n1", [etcd_toml_line(plain)]), "first record does not look like a TLS handshake")
    # What it should say (the binary of c387550 does not): the members
    # speak TLS, so use https:// endpoints and a ca_file.
    assert "https://" in error and "ca_file" in error, error


def test_a_node_whose_certificate_expired_is_refused(etcd_cluster, make_node):  # noqa: F811
    # The node reads the dates of its own certificate as it checks its
    # configuration, and names the cause before it asks etcd anything.
    error = refused(etcd_cluster, make_node("n1", etcd_cluster.node_toml_lines(EXPIRED)), "")
    assert "cluster.cert_file" in error and "expired" in error, error


def test_a_node_whose_etcd_user_has_no_role_is_refused(etcd_cluster, make_node):  # noqa: F811
    error = refused(etcd_cluster, make_node("n1", etcd_cluster.node_toml_lines(NOROLE)), "")
    # Refused before it serves, naming what it lacks and the role to grant.
    assert "/nimbus/" in error and "permission" in error and "grant-permission" in error, error
    assert members(etcd_cluster) == {}


def test_a_node_with_a_wrong_password_is_refused(etcd_cluster, make_node):  # noqa: F811
    n = make_node("n1", etcd_cluster.node_toml_lines(NOROLE, user=PASSWORD_USER))
    Path(etcd_cluster.password_file(PASSWORD_USER)).write_text("not-the-password\n")
    error = refused(etcd_cluster, n, "")
    assert "authentication failed" in error and "password" in error, error


def test_a_node_whose_members_refuse_its_batches_of_takes_is_refused(request, tmp_path, make_node):
    # A node sends the takes of files opened together in one request of
    # nested transactions (MAX_TXNS_PER_REQUEST of them, each of four
    # operations), which members started with a --max-txn-ops below 68
    # refuse: found at start, not at the first busy minute.
    require_etcd()
    cluster = EtcdCluster(tmp_path / "small-txns", members=1, tls=False, extra_args=("--max-txn-ops=32",))
    cluster.report = request.node.stash.setdefault(_SERVERS, [])
    cluster.report.extend(cluster.members)
    try:
        cluster.start()
        error = refused(cluster, make_node("n1", cluster.node_toml_lines()), "")
        assert "too many operations" in error, error  # etcd's own refusal
        assert "--max-txn-ops" in error and "68" in error, error
        assert members(cluster) == {}
    finally:
        cluster.stop()


# --------------------------------------------------------------- serving


def test_a_node_authenticated_by_password_joins_and_serves(etcd_cluster, make_node):  # noqa: F811
    # Its certificate names nimbus-norole, which may do nothing (see the
    # test above): the user and password are what let it in.
    n = make_node("n1", etcd_cluster.node_toml_lines(NOROLE, user=PASSWORD_USER)).start()
    assert members(etcd_cluster)["n1"]["advertise"] == f"{n.host}:{n.port}"
    serves(n)
    assert etcd_cluster.passwords[PASSWORD_USER] not in n.log()
    # The start log says which etcd the cluster runs on.
    assert re.search(r"cluster: etcd \d+\.\d+\.\d+ answered", n.log()), n.log()


def test_a_node_joins_and_serves_on_plain_http(plain_etcd_cluster, make_node):  # noqa: F811
    assert all(e.startswith("http://") for e in plain_etcd_cluster.endpoints)
    n = make_node("n1", plain_etcd_cluster.node_toml_lines()).start()
    assert members(plain_etcd_cluster)["n1"]["advertise"] == f"{n.host}:{n.port}"
    serves(n)
    assert "plain http://, without TLS or credentials" in n.log()
