"""Reload without dropping clients (SIGHUP, `nimbus reload --config FILE`).

A share is added and one removed while a client's transfer on a third
runs: the transfer completes byte-identical, the removed share's client
is told NETWORK_NAME_DELETED, the added share serves at once. Settings
change in place for connected clients (read-only), and the log level
follows the file. A bad file, and one that changes what needs a restart,
are refused and the server serves as before. On a cluster, a node's
reload closes the handles of a share it takes away in the cluster's
state too, so another node's client may open what they held.

Each step waits for the server's own answer (its log's reload line),
never for time alone.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import PASSWORD, USER, add_user, free_port, nimbus_binary, require_tool, toml_str, wait_for_port
from etcd_cluster import etcd_cluster  # noqa: F401  (the fixture)
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.open import CreateDisposition, CreateOptions, FileAttributes, FilePipePrinterAccessMask, ImpersonationLevel, Open, ShareAccess
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect
from test_cluster import nodes, wait_until  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.nimbus_only, require_tool("smbclient", "smbclient")]

TIMEOUT = 30
WAIT = 20.0
CHUNK = 1 << 20


def config_text(port: int, db: Path, shares: dict[str, dict], extra: str = "") -> str:
    lines = [f"listen = [{toml_str(f'127.0.0.1:{port}')}]", f"user_db = {toml_str(str(db))}", extra]
    for name, opts in shares.items():
        lines += ["[[share]]", f"name = {toml_str(name)}"]
        for key, value in opts.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, Path):
                lines.append(f"{key} = {toml_str(str(value))}")
            else:
                lines.append(f"{key} = {toml_str(value)}")
    return "\n".join(lines) + "\n"


class Served:
    """A `nimbus serve --config` process and its file."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.db = tmp / "users.db"
        add_user(self.db)
        self.port = free_port()
        self.conf = tmp / "nimbus.toml"
        self.log_path = tmp / "nimbus.log"
        self.dirs = {}
        for name in ("data", "gone", "fresh"):
            self.dirs[name] = tmp / name
            self.dirs[name].mkdir()
        self.proc = None

    def write(self, shares: dict[str, dict], extra: str = "") -> None:
        self.conf.write_text(config_text(self.port, self.db, shares, extra))

    def start(self) -> None:
        out = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [str(nimbus_binary()), "serve", "--config", str(self.conf)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            env={k: v for k, v in dict(os.environ, NO_COLOR="1").items() if k != "NIMBUS_LOG"},
        )
        wait_for_port("127.0.0.1", self.port, self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def reloads(self) -> int:
        """Reload outcomes logged so far (taken or refused)."""
        text = self.log()
        return text.count("reload of ") + text.count("reload refused")

    def reload(self, via_command: bool = False) -> str:
        """Makes the server read its file; returns its outcome line."""
        before = self.reloads()
        if via_command:
            r = subprocess.run([str(nimbus_binary()), "reload", "--config", str(self.conf)], capture_output=True, text=True, timeout=TIMEOUT)
            assert r.returncode == 0, r.stdout + r.stderr
            assert f"pid {self.proc.pid}" in r.stdout, r.stdout
        else:
            self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + WAIT
        while self.reloads() == before:
            assert self.proc.poll() is None, "the server exited at the reload:\n" + self.log()[-3000:]
            assert time.monotonic() < deadline, "no reload outcome in the log:\n" + self.log()[-3000:]
            time.sleep(0.05)
        return [line for line in self.log().splitlines() if "reload of " in line or "reload refused" in line][-1]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)


@pytest.fixture
def served(tmp_path):
    s = Served(tmp_path)
    try:
        yield s
    finally:
        s.stop()
    assert "panicked at" not in s.log()


def tree(host: str, port: int, share: str):
    conn = Connection(uuid.uuid4(), host, port, require_signing=True)
    conn.connect(timeout=TIMEOUT)
    session = Session(conn, USER, PASSWORD, require_encryption=False, auth_protocol="ntlm")
    session.connect()
    t = TreeConnect(session, rf"\\{host}\{share}")
    t.connect()
    return conn, t


def create(t, name: str, access: int, share_access: int, disposition=CreateDisposition.FILE_OVERWRITE_IF) -> Open:
    f = Open(t, name)
    f.create(ImpersonationLevel.Impersonation, access, FileAttributes.FILE_ATTRIBUTE_NORMAL, share_access, disposition, CreateOptions.FILE_NON_DIRECTORY_FILE)
    return f


RW = FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE
READ = FilePipePrinterAccessMask.GENERIC_READ
ALL_SHARING = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE


def smbclient(port: int, share: str, conf: Path, command: str = "ls", host: str = "127.0.0.1") -> tuple[int, str]:
    r = subprocess.run(
        ["smbclient", f"//{host}/{share}", "-p", str(port), "-U", f"{USER}%{PASSWORD}", "-m", "SMB3_11", "--use-kerberos=off", "-s", str(conf), "-c", command],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    return r.returncode, r.stdout + r.stderr


def status_of(excinfo) -> int:
    return excinfo.value.status


def test_a_share_is_added_and_one_removed_while_a_transfer_on_a_third_completes(served, samba_client_conf):
    s = served
    s.write({"data": {"path": s.dirs["data"]}, "gone": {"path": s.dirs["gone"]}})
    s.start()
    payload = os.urandom(16 * CHUNK)
    conn_a, data = tree("127.0.0.1", s.port, "data")
    conn_b, gone = tree("127.0.0.1", s.port, "gone")
    try:
        held = create(gone, "held.bin", RW, 0)  # no sharing: its share mode is held
        held.write(b"x" * 100, 0)
        f = create(data, "big.bin", RW, 0)
        half = len(payload) // 2
        for off in range(0, half, CHUNK):
            assert f.write(payload[off : off + CHUNK], off) == CHUNK

        # Mid-transfer: "gone" removed, "fresh" added, "data" untouched.
        s.write({"data": {"path": s.dirs["data"]}, "fresh": {"path": s.dirs["fresh"], "comment": "added by reload"}})
        outcome = s.reload()
        assert "done" in outcome and "added: fresh" in outcome and "removed: gone" in outcome, outcome
        assert "1 tree connect(s) and 1 open handle(s) closed" in outcome, outcome

        # The transfer goes on, on the same connection and handle.
        for off in range(half, len(payload), CHUNK):
            assert f.write(payload[off : off + CHUNK], off) == CHUNK
        got = b"".join(f.read(off, CHUNK) for off in range(0, len(payload), CHUNK))
        f.close()
        assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
        assert hashlib.sha256((s.dirs["data"] / "big.bin").read_bytes()).digest() == hashlib.sha256(payload).digest()

        # The removed share's client: its next request is refused.
        with pytest.raises(SMBResponseException) as e:
            held.write(b"y", 0)
        assert status_of(e) == NtStatus.STATUS_NETWORK_NAME_DELETED
        with pytest.raises(SMBResponseException) as e:
            create(gone, "other.bin", RW, ALL_SHARING)
        assert status_of(e) == NtStatus.STATUS_NETWORK_NAME_DELETED
    finally:
        for c in (conn_a, conn_b):
            try:
                c.disconnect(True)
            except Exception:  # noqa: BLE001  (a connection the test left broken)
                pass
    # Its handle was closed, not leaked: the file's share mode is free.
    assert (s.dirs["gone"] / "held.bin").read_bytes() == b"x" * 100
    rc, out = smbclient(s.port, "fresh", samba_client_conf, "ls")
    assert rc == 0, out
    rc, out = smbclient(s.port, "gone", samba_client_conf, "ls")
    assert rc != 0 and "NT_STATUS_BAD_NETWORK_NAME" in out, out
    rc, out = smbclient(s.port, "data", samba_client_conf, "ls")
    assert rc == 0 and "big.bin" in out, out
    r = subprocess.run(["smbclient", "-L", f"//127.0.0.1", "-p", str(s.port), "-U", f"{USER}%{PASSWORD}", "-m", "SMB3_11", "--use-kerberos=off", "-s", str(samba_client_conf)], capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert "added by reload" in r.stdout and "gone" not in r.stdout, r.stdout + r.stderr


def test_settings_change_in_place_for_connected_clients_through_nimbus_reload(served):
    s = served
    s.write({"data": {"path": s.dirs["data"]}})
    s.start()
    (s.dirs["data"] / "kept.txt").write_bytes(b"kept")
    conn, data = tree("127.0.0.1", s.port, "data")
    try:
        w = create(data, "w.txt", RW, ALL_SHARING)
        w.write(b"before", 0)
        assert "DEBUG" not in s.log()
        s.write({"data": {"path": s.dirs["data"], "read_only": True}}, extra='log_level = "debug"')
        outcome = s.reload(via_command=True)
        assert "done" in outcome and "changed: data" in outcome, outcome
        # The same tree connect: no new open for writing, reading goes on.
        with pytest.raises(SMBResponseException) as e:
            create(data, "new.txt", RW, ALL_SHARING)
        assert status_of(e) == NtStatus.STATUS_ACCESS_DENIED
        with pytest.raises(SMBResponseException) as e:
            create(data, "kept.txt", RW, ALL_SHARING, CreateDisposition.FILE_OPEN)
        assert status_of(e) == NtStatus.STATUS_ACCESS_DENIED
        r = create(data, "kept.txt", READ, ALL_SHARING, CreateDisposition.FILE_OPEN)
        assert r.read(0, 4) == b"kept"
        r.close()
        # A handle opened for writing before keeps its access.
        w.write(b"after!", 0)
        w.close()
    finally:
        conn.disconnect(True)
    assert (s.dirs["data"] / "w.txt").read_bytes() == b"after!"
    assert not (s.dirs["data"] / "new.txt").exists()
    assert " DEBUG " in s.log(), "log_level = debug did not take effect"


def test_a_bad_file_and_a_restart_only_change_are_refused_and_the_old_configuration_serves(served, samba_client_conf):
    s = served
    good = {"data": {"path": s.dirs["data"]}}
    s.write(good)
    s.start()
    # Not TOML: `nimbus reload` checks first and sends nothing.
    s.conf.write_text(s.conf.read_text() + "\n[[share]\nname = \n")
    r = subprocess.run([str(nimbus_binary()), "reload", "--config", str(s.conf)], capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode != 0 and "not reloaded" in r.stderr, r.stdout + r.stderr
    # SIGHUP reads it anyway: refused.
    outcome = s.reload()
    assert "refused" in outcome and str(s.conf) in outcome, outcome
    # A share whose path does not exist: refused whole (no share added).
    s.write({**good, "fresh": {"path": s.dirs["fresh"]}, "missing": {"path": s.tmp / "no-such-dir"}})
    outcome = s.reload()
    assert "refused" in outcome and "share[2].path" in outcome and "no-such-dir" in outcome, outcome
    # A new listen address needs a restart.
    other = free_port()
    s.conf.write_text(config_text(other, s.db, good))
    outcome = s.reload()
    assert "refused" in outcome and "listen cannot change without a restart" in outcome, outcome
    rc, out = smbclient(s.port, "data", samba_client_conf)
    assert rc == 0, out
    rc, out = smbclient(s.port, "fresh", samba_client_conf)
    assert "NT_STATUS_BAD_NETWORK_NAME" in out, out
    assert s.proc.poll() is None


def test_a_cluster_nodes_reload_frees_what_a_removed_shares_handles_held_for_other_nodes(nodes):  # noqa: F811
    n1, n2 = nodes[0].start(), nodes[1].start()
    wait_until("n2 joined", lambda: "joined as node" in n2.log())
    conn2, ca = tree(n2.host, n2.port, "ca")
    conn1, data = tree(n1.host, n1.port, "data")
    try:
        held = create(ca, "locked.bin", RW, 0)
        held.write(b"held", 0)
        # n1's client is refused while n2's handle holds the file.
        with pytest.raises(SMBResponseException) as e:
            create(data, "locked.bin", RW, 0, CreateDisposition.FILE_OPEN)
        assert status_of(e) == NtStatus.STATUS_SHARING_VIOLATION
        # n2 drops "ca" and serves "extra" over the same directory.
        text = n2.conf.read_text()
        start = text.index('[[share]]\nname = "ca"')
        end = text.index("[limits]")
        n2.conf.write_text(text[:start] + f'[[share]]\nname = "extra"\npath = {toml_str(str(n2.share))}\n' + text[end:])
        before = n2.log().count("reload of ")
        n2.proc.send_signal(signal.SIGHUP)
        wait_until("n2's reload outcome", lambda: n2.log().count("reload of ") > before)
        outcome = [line for line in n2.log().splitlines() if "reload of " in line][-1]
        assert "done" in outcome and "removed: ca" in outcome and "added: extra" in outcome, outcome
        with pytest.raises(SMBResponseException) as e:
            held.read(0, 4)
        assert status_of(e) == NtStatus.STATUS_NETWORK_NAME_DELETED
        # Through etcd: n1's client may now open the file alone.
        f = create(data, "locked.bin", RW, 0, CreateDisposition.FILE_OPEN)
        assert f.read(0, 4) == b"held"
        f.close()
    finally:
        for c in (conn1, conn2):
            try:
                c.disconnect(True)
            except Exception:  # noqa: BLE001
                pass
    conn3, extra = tree(n2.host, n2.port, "extra")
    try:
        g = create(extra, "locked.bin", READ, ALL_SHARING, CreateDisposition.FILE_OPEN)
        assert g.read(0, 4) == b"held"
        g.close()
    finally:
        conn3.disconnect(True)
    assert n1.proc.poll() is None and n2.proc.poll() is None


def test_a_create_waiting_for_a_break_on_a_share_taken_away_is_refused_and_holds_nothing(served):
    """A's batch oplock holds up B's CREATE (answered STATUS_PENDING) on
    share "gone"; the reload takes "gone" away and closes A's handle, which
    lets B's CREATE go on: it must not leave an open behind on a share
    that no longer exists (its client could never close it)."""
    import struct

    import rawsmb
    from test_locks import Client

    s = served
    both = s.dirs["data"]
    (both / "f.bin").write_bytes(b"f")
    s.write({"pub": {"path": both, "guest_ok": True}, "gone": {"path": both, "guest_ok": True}})
    s.start()

    def client(share: str) -> Client:
        c = Client.__new__(Client)
        c.s = rawsmb.connect("127.0.0.1", s.port)
        rawsmb.negotiate(c.s, dialects=(0x0202, 0x0210), credit_request=64)
        c.sid, c.mid = rawsmb.anonymous_logon(c.s, 1)
        c.tid = rawsmb.tree_connect(c.s, c.mid, c.sid, rf"\\127.0.0.1\{share}")
        c.mid += 1
        return c

    def create(oplock: int, share_access: int) -> bytes:
        n = "f.bin".encode("utf-16-le")
        return struct.pack("<HBBIQQIIIIIHHII", 57, 0, oplock, 2, 0, 0, 0x0012019F, 0x80, share_access, 1, 0x40, rawsmb.HEADER_SIZE + 56, len(n), 0, 0) + n

    a, b, c = client("gone"), client("gone"), client("pub")
    try:
        resp = a.call(rawsmb.CREATE, create(0x09, 7))
        assert rawsmb.status(resp) == 0 and resp[rawsmb.HEADER_SIZE + 2] == 0x09, "no batch oplock"
        b.send(rawsmb.CREATE, create(0, 7))
        assert rawsmb.status(b.recv()) == 0x00000103  # STATUS_PENDING: waits for A's break
        s.write({"pub": {"path": both, "guest_ok": True}})
        outcome = s.reload()
        assert "done" in outcome and "removed: gone" in outcome, outcome
        assert rawsmb.status(b.recv()) == NtStatus.STATUS_NETWORK_NAME_DELETED
        # Nothing of A's or B's holds the file: an open sharing nothing goes.
        assert rawsmb.status(c.call(rawsmb.CREATE, create(0, 0))) == 0
    finally:
        for x in (a, b, c):
            x.close()
