"""The Prometheus endpoint (`[metrics] listen`): a scrape after a known
workload counts exactly that workload, and passes `promtool check metrics`.

The workload runs through smbprotocol on one session, so that every
request it sends is known: N CREATEs, M bytes written, K bytes read, N
CLOSEs, one failed logon.
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request

import pytest
from conftest import PASSWORD, USER, Server, add_user, free_port, nimbus_binary, require_tool, wait_for_port, write_config
from smbprotocol.exceptions import SMBException
from smbprotocol.open import CreateDisposition
from smbprotocol.session import Session
from test_smbprotocol import open_file, smb_connection, smb_tree

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
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    port, metrics_port = free_port(), free_port()
    conf = write_config(tmp_path / "nimbus.toml", port, db, [("data", share, False)])
    conf.write_text(conf.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
    log = tmp_path / "nimbus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(os.environ, NO_COLOR="1"))
    try:
        wait_for_port("127.0.0.1", port, proc)
        wait_for_port("127.0.0.1", metrics_port, proc)
        yield Server("nimbus", "127.0.0.1", port, "data", share, USER, PASSWORD, log, proc), metrics_port
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "panicked at" not in log.read_text(errors="replace")


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
