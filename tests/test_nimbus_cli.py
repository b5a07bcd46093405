"""The nimbus command line itself: user database, config check, serve's refusals.

These check the interface the README and scripts rely on (issue 2,
"Interface"), with loose wording checks: what a message must name, not how it
is phrased.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import time

import pytest

from conftest import PASSWORD, USER, add_user, free_port, nimbus_binary, run_nimbus, wait_for_port, write_config

pytestmark = pytest.mark.nimbus_only


def test_user_add_list_del(tmp_path):
    db = tmp_path / "users.db"
    add_user(db, USER, PASSWORD)
    add_user(db, "bob", "b0b-Password")
    listed = run_nimbus("user", "list", "--db", str(db)).stdout.split()
    assert USER in listed and "bob" in listed

    run_nimbus("user", "del", "bob", "--db", str(db))
    listed = run_nimbus("user", "list", "--db", str(db)).stdout.split()
    assert USER in listed and "bob" not in listed


def test_user_db_is_private_and_holds_no_password(tmp_path):
    db = tmp_path / "users.db"
    add_user(db, USER, PASSWORD)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    content = db.read_bytes()
    assert PASSWORD.encode() not in content
    assert PASSWORD.encode("utf-16-le") not in content


def test_config_check_accepts_a_good_config(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    conf = write_config(tmp_path / "good.toml", 4450, db, [("data", share, False), ("ro", share, True)])
    run_nimbus("config", "check", str(conf))


def test_config_check_reports_encryption_keys(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    conf = tmp_path / "enc.toml"
    conf.write_text(
        f'[security]\nencryption = "sometimes"\nciphers = ["AES-128-GCM", "DES"]\n'
        f'[[share]]\nname = "data"\npath = "{share}"\nencryption = "yes"\n'
    )
    proc = run_nimbus("config", "check", str(conf), check=False)
    assert proc.returncode != 0
    for key in ("security.encryption", "security.ciphers[1]", "share[0].encryption"):
        assert f"{conf}: {key}:" in proc.stderr, proc.stderr
    assert "fix:" in proc.stderr


def test_fips_without_fips_build_is_a_clear_config_error(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    conf = tmp_path / "fips.toml"
    conf.write_text(f'[security]\nfips = true\n[[share]]\nname = "data"\npath = "{share}"\n')
    proc = run_nimbus("config", "check", str(conf), check=False)
    assert proc.returncode != 0
    assert "security.fips: this nimbus binary was built without the FIPS provider" in proc.stderr, proc.stderr
    assert "--features fips" in proc.stderr


def test_bench_crypto_prints_every_provider_and_primitive():
    proc = run_nimbus("bench", "crypto", "--millis", "2", timeout=120)
    out = proc.stdout
    header = next(line for line in out.splitlines() if line.startswith("| primitive"))
    for provider in ("default", "ring", "rustcrypto", "aws-lc"):
        assert provider in header, out
    # The CPU's features and the library the default took for AES-GCM, why.
    assert re.search(r"^This CPU: .+\.$", out, re.M), out
    assert re.search(r"^The default's AES-GCM: (aws-lc(-fips)?|ring) \(.+\)\.$", out, re.M), out
    for primitive in ("AES-128-GCM", "AES-256-GCM", "AES-128-CCM", "AES-256-CCM", "AES-128-GMAC", "AES-128-CMAC", "HMAC-SHA256", "SHA-512"):
        rows = [line for line in out.splitlines() if line.startswith("|") and line.split("|")[1].strip() == primitive]
        assert len(rows) == 3, (primitive, out)  # 4 KiB, 64 KiB, 1 MiB
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")][2:]
            # Every provider's rate, then the default's library and its
            # share of the fastest library's rate.
            assert all(float(c) > 0 for c in cells[:-1]), row
            assert re.fullmatch(r"(aws-lc(-fips)?|ring|rustcrypto) \d+%( \(\S+ [0-9.]+\))?", cells[-1]), row


def _config(share, db, *, listen='["127.0.0.1:4450"]', signing='"required"', path=True) -> str:
    share_path = f'path = "{share}"\n' if path else ""
    return (
        f"listen = {listen}\n"
        f'user_db = "{db}"\n'
        "[security]\n"
        f"signing = {signing}\n"
        "[[share]]\n"
        'name = "data"\n'
        f"{share_path}"
        "read_only = false\n"
    )


@pytest.mark.parametrize(
    ("key", "change"),
    [
        ("signing", {"signing": '"sometimes"'}),
        ("path", {"path": False}),
        ("listen", {"listen": '["not-an-address"]'}),
        # Two listeners on one port (0.0.0.0 covers 127.0.0.1): the second
        # bind would fail only once the first serves.
        ("listen[1]", {"listen": '["127.0.0.1:4450", "0.0.0.0:4450"]'}),
    ],
)
def test_config_check_names_file_and_key(tmp_path, key, change):
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    conf = tmp_path / "broken-config.toml"
    conf.write_text(_config(share, db, **change))
    proc = run_nimbus("config", "check", str(conf), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"config check accepted:\n{conf.read_text()}"
    assert "broken-config.toml" in out, out
    assert key in out, out


def _serve_should_refuse(args, timeout=15):
    proc = subprocess.Popen([str(nimbus_binary()), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"nimbus {' '.join(args)} kept running; it should refuse to start")
    assert proc.returncode != 0
    return out + err


def test_serve_refuses_missing_share_path(tmp_path):
    db = tmp_path / "users.db"
    add_user(db)
    missing = tmp_path / "no-such-dir"
    out = _serve_should_refuse(["serve", "--listen", f"127.0.0.1:{free_port()}", "--share", f"data={missing}", "--user-db", str(db)])
    assert "no-such-dir" in out, out


def test_serve_refuses_port_in_use(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = _serve_should_refuse(["serve", "--listen", f"127.0.0.1:{port}", "--share", f"data={share}", "--user-db", str(db)])
    assert str(port) in out, out


def test_serve_refuses_a_state_dir_group_or_others_may_enter(tmp_path):
    """The state directory holds the owners, CreateGuids and paths of kept
    handles and the status files' sessions and open files: an existing one
    that group or others may read, enter or write stops the start, and the
    message names the key, the path, the mode and the fix."""
    db = tmp_path / "users.db"
    add_user(db)
    share = tmp_path / "share"
    share.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    for mode in (0o755, 0o710, 0o701):
        state.chmod(mode)
        out = _serve_should_refuse(["serve", "--listen", f"127.0.0.1:{free_port()}", "--share", f"data={share}", "--user-db", str(db), "--state-dir", str(state)])
        assert "state_dir" in out, out
        assert f"mode {mode:04o}" in out, out
        assert f"chmod 700 {state}" in out, out
        assert "panicked" not in out, out
    assert list(state.iterdir()) == [], "nothing is written to a refused directory"
    # Made private, the same directory is taken.
    state.chmod(0o700)
    port = free_port()
    proc = subprocess.Popen([str(nimbus_binary()), "serve", "--listen", f"127.0.0.1:{port}", "--share", f"data={share}", "--user-db", str(db), "--state-dir", str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, proc)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _wait_for_files(paths, proc, old_inodes=None, timeout=20):
    """Waits until every file of `paths` exists, and is not the file of
    `old_inodes` (path -> inode) any more: written anew."""
    old_inodes = old_inodes or {}

    def written(p):
        return p.exists() and p.stat().st_ino != old_inodes.get(p)

    deadline = time.monotonic() + timeout
    while not all(written(p) for p in paths):
        assert proc.poll() is None, "the server exited"
        assert time.monotonic() < deadline, f"not written within {timeout} s: {[str(p) for p in paths if not written(p)]}"
        time.sleep(0.05)


def test_state_dir_and_the_files_in_it_are_private_whatever_the_umask(tmp_path):
    """A state directory the server creates is 0700, and the store, its
    journal and the status files are 0600, under a umask of 0 too; files
    found wider when the server starts again are narrowed."""
    db = tmp_path / "users.db"
    add_user(db)
    share = tmp_path / "share"
    share.mkdir()
    state = tmp_path / "state"
    port = free_port()
    conf = write_config(tmp_path / "nimbus.toml", port, db, [("data", share, False)])
    conf.write_text(conf.read_text().replace("[security]", f'state_dir = "{state}"\n\n[security]', 1))
    files = [state / n for n in ("state.redb", "state.journal", "status.json", "status-listing.json")]

    def modes():
        return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [state, *files]}

    old_inodes = {}
    for _round in range(2):
        proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.umask(0))
        try:
            wait_for_port("127.0.0.1", port, proc)
            # The status files are rewritten (through a new file) once the
            # server runs; the store's files are opened at start.
            _wait_for_files(files, proc, old_inodes)
            assert modes() == {"state": 0o700, **{p.name: 0o600 for p in files}}
        finally:
            proc.kill()
            proc.wait(timeout=10)
        # Widened by someone meanwhile: narrowed, or replaced by private
        # files, at the next start.
        for p in files:
            p.chmod(0o644)
        old_inodes = {p: p.stat().st_ino for p in files[2:]}


def test_status_of_a_single_node_with_a_state_dir(tmp_path):
    import json
    import time

    from conftest import wait_for_port

    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db, USER, PASSWORD)
    port = free_port()
    conf = write_config(tmp_path / "nimbus.toml", port, db, [("data", share, False)])
    # Without a state directory there is nowhere to read from: the message says so.
    refused = run_nimbus("status", "--config", str(conf), check=False)
    assert refused.returncode != 0 and "state_dir" in refused.stderr
    conf.write_text(conf.read_text().replace("[security]", f'state_dir = "{tmp_path / "state"}"\n\n[security]', 1))
    proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port("127.0.0.1", port, proc)
        deadline = time.monotonic() + 20
        while True:  # the first figures are written as the server starts
            out = run_nimbus("status", "--config", str(conf), "--json", check=False)
            if out.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert out.returncode == 0, out.stderr
        (report,) = json.loads(out.stdout)
        assert report["health"] == "up" and report["listen"] == [f"127.0.0.1:{port}"]
        assert report["open_files"] == 0 and report["sessions"] == 0
        table = run_nimbus("status", "--config", str(conf)).stdout.splitlines()
        assert table[0].split()[:2] == ["NODE", "HEALTH"] and table[1].split()[:2] == ["(single)", "up"]
        _lists_sessions_and_open_files(conf, port)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _lists_sessions_and_open_files(conf, port):
    """`nimbus status --sessions --files`: a signed 3.1.1 session with a
    durable, leased open holding a byte-range lock, then the same open
    waiting for its client once the connection is lost."""
    import json
    import time
    import types
    import uuid

    from test_durable import Client, durable_open

    def listing():
        out = run_nimbus("status", "--config", str(conf), "--sessions", "--files", "--json")
        (report,) = json.loads(out.stdout)
        return report.get("listing") or {"sessions": [], "opens": []}

    def wait_for(what, check):
        deadline = time.monotonic() + 20
        while not (found := check(listing())):
            assert time.monotonic() < deadline, f"not listed within 20 s: {what}"
            time.sleep(0.2)
        return found

    srv = types.SimpleNamespace(host="127.0.0.1", port=port, user=USER, password=PASSWORD, share="data")
    client = Client(srv, uuid.uuid4())
    try:
        f, _ = durable_open(client, r"dir held.txt", uuid.uuid4(), uuid.uuid4().bytes)
        client.lock(f.file_id, 0, 10, 0x2 | 0x10)  # exclusive, fail immediately
        held = wait_for("the open with its lock", lambda l: [o for o in l["opens"] if o["locks"] == 1])
        (session,) = wait_for("the session", lambda l: l["sessions"])
        assert session["user"] == USER and session["dialect"] == "3.1.1"
        assert session["protection"].startswith("signed") and session["shares"] == ["data"] and session["opens"] == 1
        host, port_here = client.conn.transport._sock.getsockname()[:2]
        assert session["clients"] == [f"{host}:{port_here}"], session
        (o,) = held
        assert (o["share"], o["path"], o["directory"]) == ("data", "dir held.txt", False)
        assert o["session"] == session["id"] and o["user"] == session["user"]
        assert (o["caching"], o["handle"], o["sharing"], o["disconnected"]) == ("lease RH", "durable", "RWD", False)
        tables = run_nimbus("status", "--config", str(conf), "--sessions", "--files").stdout.split("\n\n")
        assert len(tables) == 3 and tables[1].startswith("NODE") and session["id"] in tables[1]
        (line,) = [t for t in tables[2].splitlines() if t.endswith("dir held.txt")]
        assert "lease RH" in line and "durable" in line
        # The connection is lost: the open waits for its client, the session is gone.
        client.drop()
        (o,) = wait_for("the open waiting for its client", lambda l: [o for o in l["opens"] if o["disconnected"]])
        assert o["session"] == "" and o["user"] == USER and o["handle"] == "durable"
        assert listing()["sessions"] == []
        files = run_nimbus("status", "--config", str(conf), "--files").stdout
        assert any("(waiting)" in t and t.endswith("dir held.txt") for t in files.splitlines()), files
    finally:
        client.close()


def _serve_and_log(tmp_path, log_format: str | None) -> bytes:
    """Serves with `log_format` (None: the key left out), standard error to
    a file and NO_COLOR unset; a refused frame makes a warning, and a
    logged-on session's tree connect to a share that does not exist a line
    of its own; returns what was written."""
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    port = free_port()
    conf = tmp_path / "nimbus.toml"
    head = f'log_format = "{log_format}"\n' if log_format else ""
    conf.write_text(head + _config(share, db, listen=f'["127.0.0.1:{port}"]'))
    log = tmp_path / "stderr.log"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
    try:
        wait_for_port("127.0.0.1", port, proc)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"\x00\x00\x00\x08garbage!")  # not SMB: the server logs a refusal
            s.settimeout(5)
            assert s.recv(100) == b""
        deadline = time.monotonic() + 10
        while b"closing connection" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        _tree_connect_to_nowhere(port)
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    return log.read_bytes()


def _tree_connect_to_nowhere(port: int) -> None:
    import uuid

    from smbprotocol.connection import Connection
    from smbprotocol.exceptions import BadNetworkName
    from smbprotocol.session import Session
    from smbprotocol.tree import TreeConnect

    conn = Connection(uuid.uuid4(), "127.0.0.1", port, require_signing=True)
    conn.connect(timeout=10)
    try:
        session = Session(conn, USER, PASSWORD, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        with pytest.raises(BadNetworkName):
            TreeConnect(session, r"\\127.0.0.1\nosuch").connect()
    finally:
        conn.disconnect(True)


def test_text_logs_written_to_a_file_carry_no_colour_codes_and_name_the_client(tmp_path):
    text = _serve_and_log(tmp_path, None)
    assert b"closing connection" in text, text
    assert b"\x1b[" not in text, "ANSI escape sequences in a log written to a file"
    refused = [line for line in text.decode().splitlines() if "closing connection" in line]
    assert refused and all("client{addr=127.0.0.1:" in line for line in refused), refused
    nowhere = [line for line in text.decode().splitlines() if "nosuch" in line]
    assert nowhere, text
    assert all("client{addr=127.0.0.1:" in line and "session{id=0x" in line and f"user={USER}" in line for line in nowhere), nowhere


def test_json_logs_are_one_object_per_line_with_an_rfc3339_timestamp(tmp_path):
    import json
    from datetime import datetime

    text = _serve_and_log(tmp_path, "json").decode()
    lines = text.splitlines()
    assert len(lines) >= 3, text
    messages = []
    for line in lines:
        event = json.loads(line)  # each line alone is one JSON object
        assert event["level"] in ("INFO", "WARN", "ERROR", "DEBUG", "TRACE"), event
        stamp = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00"))
        assert stamp.tzinfo is not None, event["timestamp"]
        messages.append(event["fields"]["message"])
    assert any("closing connection" in m for m in messages), messages
    # Lines of a client's requests carry its address, and once it is
    # logged on, its session id and user.
    events = [json.loads(line) for line in lines]
    refused = [e for e in events if "closing connection" in e["fields"]["message"]]
    assert all(e["spans"][0]["addr"].startswith("127.0.0.1:") for e in refused), refused
    nowhere = [e for e in events if "nosuch" in e["fields"]["message"]]
    assert nowhere, lines
    for e in nowhere:
        client, session = e["spans"]
        assert client["addr"].startswith("127.0.0.1:") and session["user"] == USER and session["id"].startswith("0x"), e


def test_an_unknown_log_format_names_the_key_and_the_fix(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    conf = tmp_path / "bad.toml"
    conf.write_text('log_format = "xml"\n' + _config(share, tmp_path / "users.db"))
    r = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "log_format" in r.stderr and '"json"' in r.stderr and str(conf) in r.stderr, r.stderr
