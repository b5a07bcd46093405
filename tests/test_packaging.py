"""packaging/: the systemd unit and the example configuration.

The unit is checked by systemd's own `systemd-analyze verify` (its
ExecStart pointed at the binary built here, as install would put it), the
readiness it relies on (Type=notify) by receiving the server's READY=1 on
a notification socket made by the test, and the example configuration by
`nimbus config check` with its paths moved under the test's directory.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest
from conftest import add_user, free_port, nimbus_binary, require_tool, wait_for_port

pytestmark = pytest.mark.nimbus_only

PACKAGING = Path(__file__).resolve().parent.parent / "packaging"


@require_tool("systemd-analyze", "systemd")
def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    unit = (PACKAGING / "nimbus.service").read_text()
    assert "Type=notify" in unit and "NoNewPrivileges=yes" in unit and "CAP_NET_BIND_SERVICE" in unit
    unit_path = tmp_path / "nimbus.service"
    unit_path.write_text(unit.replace("/usr/local/bin/nimbus", str(nimbus_binary())))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit_path)], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # Unknown or misspelt directives are only warnings to systemd.
    problems = [line for line in out.splitlines() if "nimbus.service" in line]
    assert not problems, out


def test_the_server_tells_the_service_manager_it_is_ready_once_listening(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    port = free_port()
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(path))
        notify.settimeout(30)
        env = dict(os.environ, NOTIFY_SOCKET=str(path), NO_COLOR="1")
        args = ["serve", "--listen", f"127.0.0.1:{port}", "--user-db", str(db), "--share", f"data={share}"]
        proc = subprocess.Popen([str(nimbus_binary()), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            message = notify.recv(4096)
            assert b"READY=1" in message.split(b"\n"), message
            # Ready means listening: a connection is accepted at once.
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        finally:
            proc.terminate()
            proc.wait(timeout=15)


def test_the_example_configuration_passes_config_check(tmp_path):
    text = (PACKAGING / "nimbus.toml").read_text()
    assert 'listen = ["0.0.0.0:445"]' in text
    for d in ("etc", "state", "srv"):
        (tmp_path / d).mkdir(mode=0o700)
    (tmp_path / "srv" / "data").mkdir()
    add_user(tmp_path / "etc" / "users.db")
    port = free_port()
    moved = (
        text.replace("0.0.0.0:445", f"127.0.0.1:{port}")
        .replace("/etc/nimbus/users.db", str(tmp_path / "etc" / "users.db"))
        .replace("/var/lib/nimbus", str(tmp_path / "state"))
        .replace("/srv/data", str(tmp_path / "srv" / "data"))
    )
    conf = tmp_path / "nimbus.toml"
    conf.write_text(moved)
    r = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    # And it serves.
    proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
