"""The Prometheus endpoint (`[metrics] listen`): a scrape after a known
workload counts exactly that workload, and passes `promtool check metrics`.

The workload runs through smbprotocol on one session, so that every
request it sends is known: N CREATEs, M bytes written, K bytes read, N
CLOSEs, one failed logon.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import time
import urllib.request

import pytest
import rawsmb
from conftest import PASSWORD, USER, Security, Server, add_user, free_port, nimbus_binary, require_tool, wait_for_port, write_config
from smbprotocol.exceptions import SMBException
from smbprotocol.open import CreateDisposition
from smbprotocol.session import Session
from test_smbprotocol import open_file, smb_connection, smb_tree
from etcd_cluster import etcd_cluster  # noqa: F401  (the fixture)
from test_cluster import nodes  # noqa: F401  (the fixture)

pytestmark = pytest.mark.nimbus_only

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a scrape: (name, labels) -> value."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m["labels"] or ""))
        out[(m["name"], labels)] = float(m["value"])
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def metered(tmp_path):
    """A server with the metrics endpoint on; yields (server, metrics port)."""
    yield from _metered(tmp_path, "data", None)


@pytest.fixture
def metered_guest(tmp_path):
    """The same, its share "pub" open to anonymous raw clients."""
    yield from _metered(tmp_path, "pub", Security(guest_shares={"pub"}))


def _metered(tmp_path, name: str, security: Security | None):
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    port, metrics_port = free_port(), free_port()
    conf = write_config(tmp_path / "nimbus.toml", port, db, [(name, share, False)], security)
    conf.write_text(conf.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
    log = tmp_path / "nimbus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(os.environ, NO_COLOR="1"))
    try:
        wait_for_port("127.0.0.1", port, proc)
        wait_for_port("127.0.0.1", metrics_port, proc)
        yield Server("nimbus", "127.0.0.1", port, name, share, USER, PASSWORD, log, proc), metrics_port
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "panicked at" not in log.read_text(errors="replace")


def test_small_encrypted_requests_are_read_on_while_large_answers_fill_the_budget(metered):
    """A small sealed frame is opened before the room for its answers is
    taken from the connection's memory budget (32 MiB by default). Taken
    before, a sealed 4 KiB READ reserved room for the largest READ there
    is (8 MiB), so at 32 in flight the reader stopped, again and again,
    until answers went out: nimbus_connection_reader_waits_total counts
    each stop. Signed 1 MiB READs at the same depth do need more than the
    budget (32 × 1 MiB), and are the control that the count counts."""
    from test_load_generator import run_load

    srv, metrics_port = metered
    (srv.share_path / "big.bin").write_bytes(os.urandom(64 << 20))

    def waits() -> float:
        return value(scrape(metrics_port), "nimbus_connection_reader_waits_total", limit="max_connection_memory_bytes")

    start = waits()
    r = run_load(srv, "big.bin", "--depth", "32", "--op", "read", "--block", "4096", "--seconds", "1", "--protection", "encrypted")
    assert r["requests"] > 64, r
    assert waits() == start, "the reader stopped for memory while only 4 KiB answers were in flight"
    r = run_load(srv, "big.bin", "--depth", "32", "--op", "read", "--block", str(1 << 20), "--seconds", "1", "--protection", "signed")
    assert r["requests"] > 32, r
    assert waits() > start, "32 READs of 1 MiB in flight never made the reader wait for memory"


@require_tool("promtool", "prometheus")
def test_a_scrape_counts_exactly_the_workload_and_passes_promtool(metered, tmp_path):
    srv, metrics_port = metered
    creates, chunks = 5, [b"a" * 1000, b"b" * 2345]
    with smb_tree(srv) as (_conn, _session, tree):
        before = scrape(metrics_port)
        for i in range(creates):
            f = open_file(tree, f"m{i}.bin", CreateDisposition.FILE_OVERWRITE_IF)
            offset = 0
            for chunk in chunks:
                assert f.write(chunk, offset) == len(chunk)
                offset += len(chunk)
            assert f.read(0, 777) == chunks[0][:777]
            f.close()
        after = scrape(metrics_port)
    # A wrong password: one failed logon.
    with smb_connection(srv) as conn, pytest.raises(SMBException):
        Session(conn, USER, "not-the-password", require_encryption=False, auth_protocol="ntlm").connect()
    last = scrape(metrics_port)

    def grew(name: str, text: str = after, base: str = before, **labels: str) -> float:
        return value(text, name, **labels) - value(base, name, **labels)

    assert grew("nimbus_smb_requests_total", command="create", status="SUCCESS") == creates
    assert grew("nimbus_smb_requests_total", command="write", status="SUCCESS") == creates * len(chunks)
    assert grew("nimbus_smb_requests_total", command="read", status="SUCCESS") == creates
    assert grew("nimbus_smb_requests_total", command="close", status="SUCCESS") == creates
    assert grew("nimbus_smb_written_bytes_total", share="data") == creates * sum(map(len, chunks))
    assert grew("nimbus_smb_read_bytes_total", share="data") == creates * 777
    # Every CREATE's latency was observed once.
    assert grew("nimbus_smb_request_duration_seconds_count", command="create") == creates
    assert value(after, "nimbus_connections", state="logged_on") >= 1
    assert value(after, "nimbus_logons_total", method="ntlm", result="success") >= 1
    assert grew("nimbus_logons_total", last, after, method="unknown", result="failure") == 1
    # The format, names and units follow Prometheus's rules.
    path = tmp_path / "scrape.txt"
    path.write_text(last)
    check = subprocess.run(["promtool", "check", "metrics"], input=last, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, f"promtool check metrics:\n{check.stdout}{check.stderr}"


def test_a_bad_metrics_address_is_refused_naming_the_key(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    conf = write_config(tmp_path / "bad.toml", free_port(), tmp_path / "users.db", [("data", share, False)])
    conf.write_text(conf.read_text() + '\n[metrics]\nlisten = "everywhere"\n')
    r = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "metrics.listen" in r.stderr and "127.0.0.1:9445" in r.stderr, r.stderr


def wait_for_sample(port: int, name: str, want: float, **labels: str) -> str:
    """Scrapes until the gauge `name{labels}` reads `want` (gauges of what
    the server holds are refreshed every 2 s); returns that scrape."""
    deadline = time.monotonic() + 15
    while True:
        text = scrape(port)
        if value(text, name, **labels) == want:
            return text
        assert time.monotonic() < deadline, f"{name}{labels} != {want}:\n" + "\n".join(line for line in text.splitlines() if name in line)
        time.sleep(0.2)


def test_breaks_lock_waits_and_sessions_by_protection_are_counted(metered_guest):
    from test_locks import EXCLUSIVE, LOCK, STATUS_PENDING, UNLOCK, WRITE, Client, lock_body, message_id, write_body

    srv, metrics_port = metered_guest
    (srv.share_path / "f.bin").write_bytes(bytes(100))
    a, b = Client(srv), Client(srv)
    try:
        # Two anonymous 2.1 sessions: no signing, no encryption.
        wait_for_sample(metrics_port, "nimbus_sessions", 2, dialect="2.1", signing="none", encryption="none")
        before = scrape(metrics_port)
        # A level II oplock, broken to none (no acknowledgement) when B
        # writes to the file.
        n = "f.bin".encode("utf-16-le")
        body = struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0x01, 2, 0, 0, 0x80000000, 0x80, 7, 1, 0x40, rawsmb.HEADER_SIZE + 56, len(n), 0, 0) + n
        resp = a.call(rawsmb.CREATE, body)
        assert rawsmb.status(resp) == 0 and resp[rawsmb.HEADER_SIZE + 2] == 0x01, "no level II oplock granted"
        fb = b.open("f.bin")
        assert rawsmb.status(b.call(WRITE, write_body(fb, 0, b"x"))) == 0
        brk = a.recv()  # the break, unsolicited: MessageId all ones
        assert struct.unpack_from("<H", brk, 12)[0] == 0x12 and message_id(brk) == 0xFFFFFFFFFFFFFFFF
        # A waiting LOCK: B's exclusive lock held, A's (second open) waits.
        fa = a.open("f.bin")
        assert rawsmb.status(b.call(LOCK, lock_body(fb, (0, 10, EXCLUSIVE)))) == 0
        a.send(LOCK, lock_body(fa, (0, 10, EXCLUSIVE)))
        assert rawsmb.status(a.recv()) == STATUS_PENDING
        assert rawsmb.status(b.call(LOCK, lock_body(fb, (0, 10, UNLOCK)))) == 0
        assert rawsmb.status(a.recv()) == 0
        after = scrape(metrics_port)
    finally:
        a.close()
        b.close()
    assert value(after, "nimbus_breaks_sent_total", kind="oplock") - value(before, "nimbus_breaks_sent_total", kind="oplock") == 1
    assert value(after, "nimbus_byte_range_lock_waits_total") - value(before, "nimbus_byte_range_lock_waits_total") == 1
    assert value(after, "nimbus_break_timeouts_total") == 0
    # Both gone: the group reads 0, not its last count.
    wait_for_sample(metrics_port, "nimbus_sessions", 0, dialect="2.1", signing="none", encryption="none")


def proc_status_kb(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_memory_gauges_agree_with_what_the_kernel_counts(metered):
    """nimbus_resident_memory_bytes is the kernel's resident set (VmRSS,
    read at the same moment within the 2 s refresh), and
    nimbus_heap_in_use_bytes a part of the address space (VmSize): a leak
    shows in the heap figure, an allocator keeping freed pages only in the
    resident one (RELIABILITY.md's soak samples both)."""
    srv, metrics_port = metered
    with smb_tree(srv) as (_conn, _session, tree):
        f = open_file(tree, "m.bin", CreateDisposition.FILE_OVERWRITE_IF)
        f.write(b"x" * 65536, 0)
        f.close()
    deadline = time.monotonic() + 15
    while True:
        # The gauges are refreshed every 2 s: compare with the kernel's
        # figure around the scrape, and try again while they are apart.
        rss_before = proc_status_kb(srv.process.pid, "VmRSS") * 1024
        text = scrape(metrics_port)
        rss_after = proc_status_kb(srv.process.pid, "VmRSS") * 1024
        resident, heap = value(text, "nimbus_resident_memory_bytes"), value(text, "nimbus_heap_in_use_bytes")
        low, high = min(rss_before, rss_after) * 0.8, max(rss_before, rss_after) * 1.2
        if low <= resident <= high:
            break
        assert time.monotonic() < deadline, f"resident gauge {resident} against VmRSS {rss_before}..{rss_after}"
        time.sleep(0.5)
    size = proc_status_kb(srv.process.pid, "VmSize") * 1024
    assert 64 * 1024 < heap < size, f"heap in use {heap} bytes, address space {size}"


KV_HANDLED = re.compile(r'^grpc_server_handled_total\{[^}]*grpc_service="etcdserverpb\.KV"[^}]*\} (\S+)$', re.M)


def test_a_cluster_nodes_etcd_counters_match_the_members_own(nodes, etcd_cluster):  # noqa: F811
    """Every key-value call the three nodes count (Range, Txn) is one the
    etcd members count as handled, within 5% over an open/close workload
    on a file two nodes share; each node's lease is proven and renewed."""
    from test_cluster import LockClient, close_body
    from test_locks import CLOSE

    ports = []
    for n in nodes:
        port = free_port()
        ports.append(port)
        n.conf.write_text(n.conf.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
        n.start()
        wait_for_port("127.0.0.1", port, n.proc)

    def counts() -> dict[str, tuple[float, float]]:
        """Per RPC (Range, Txn): what the nodes counted, what etcd handled."""
        ours = {"Range": 0.0, "Txn": 0.0}
        for port in ports:
            for (name, labels), v in samples(scrape(port)).items():
                kind = dict(labels).get("kind")
                if name == "nimbus_etcd_requests_total" and kind in ours:
                    ours[kind] += v
        theirs = {"Range": 0.0, "Txn": 0.0}
        for i in range(len(etcd_cluster.members)):
            for m in KV_HANDLED.finditer(etcd_cluster.metrics(i)):
                kind = re.search(r'grpc_method="(\w+)"', m.group(0)).group(1)
                if kind in theirs:
                    theirs[kind] += float(m.group(1))
        return {k: (ours[k], theirs[k]) for k in ours}

    (nodes[0].share / "counted.bin").write_bytes(b"x" * 100)
    holder = LockClient(nodes[1])
    fh = holder.open("counted.bin")
    c = LockClient(nodes[0])
    before = counts()
    # At least 150 pairs and 4 s, so that the nodes' background reads
    # (orphan sweeps, every 2 s each) add up to some Range calls too.
    started, pairs = time.monotonic(), 0
    while pairs < 150 or time.monotonic() - started < 4:
        f = c.open("counted.bin")
        assert rawsmb.status(c.call(CLOSE, close_body(f))) == 0
        pairs += 1
    after = counts()
    holder.call(CLOSE, close_body(fh))
    c.close()
    holder.close()
    for kind in ("Range", "Txn"):
        ours = after[kind][0] - before[kind][0]
        theirs = after[kind][1] - before[kind][1]
        # The scrapes of nodes and members are a few milliseconds apart:
        # a background call or two may fall between them.
        assert abs(ours - theirs) <= max(0.05 * theirs, 2), f"{kind}: nodes counted {ours} calls, etcd handled {theirs}"
    assert after["Txn"][1] - before["Txn"][1] >= 150  # the file stayed shared in etcd: calls were made
    assert after["Range"][1] - before["Range"][1] >= 6
    for port in ports:
        deadline = time.monotonic() + 15
        while value(scrape(port), "nimbus_cluster_lease_renewals_total", result="ok") < 1:
            assert time.monotonic() < deadline, "no lease renewal counted"
            time.sleep(0.2)
    for port in ports:
        text = scrape(port)
        assert value(text, "nimbus_cluster_lease_proven") == 1
        assert value(text, "nimbus_etcd_requests_total", kind="LeaseGrant", result="ok") >= 1
        assert value(text, "nimbus_etcd_request_duration_seconds_count", kind="Txn") >= 1
    check = subprocess.run(["promtool", "check", "metrics"], input=scrape(ports[0]), capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
