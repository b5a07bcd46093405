"""Persistent handles (issue 14) across `kill -9` of the server.

On a continuously available share (`continuous_availability = true`, with
`state_dir` set) a client opens a file with a persistent handle (DH2Q with
SMB2_DHANDLE_FLAG_PERSISTENT), writes and locks a range. The server is
killed with SIGKILL and started again on the same state directory. Until
the handle's timeout runs out, another client's conflicting open is refused
with STATUS_FILE_NOT_AVAILABLE; the owner reconnects, authenticates again
and reclaims the handle with its lock and data. Without a reclaim, the
handle goes at the timeout and the file is free.

Waits are on the server's answers (a refused open is retried until it is
not), never on a sleep alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from conftest import add_user, free_port, nimbus_binary, toml_str, wait_for_port
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    ImpersonationLevel,
    LockFlags,
    Open,
    SMB2LockElement,
    SMB2LockRequest,
)
from smbprotocol.connection import Capabilities
from smbprotocol.header import NtStatus
from test_durable import (
    ACCESS,
    HANDLE,
    READ,
    SHARE_ALL,
    STATUS_LOCK_NOT_GRANTED,
    Client,
    dh2c,
    dh2q,
    lease,
    durable_open,
    plain_open,
    reconnect,
    status_of,
)
from smbprotocol.create_contexts import DurableHandleFlags, SMB2CreateDurableHandleResponseV2, SMB2CreateResponseLeaseV2
from smbprotocol.open import RequestedOplockLevel

STATUS_FILE_NOT_AVAILABLE = 0xC0000467
USER, PASSWORD = "alice", "Al1ce-Secret!"
EXCLUSIVE = LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY


@dataclass
class Node:
    host: str
    port: int
    share: str
    user: str
    password: str


class CaServer:
    """nimbus with one continuously available share and a state directory,
    killed and restarted by the test. Both live in `disk` (default: `base`,
    which holds the configuration, the users and the log)."""

    def __init__(self, base: Path, disk: Path | None = None):
        self.base = base
        self.db = base / "users.db"
        add_user(self.db, USER, PASSWORD)
        disk = disk or base
        self.share = disk / "ca"
        self.share.mkdir()
        self.state = disk / "state"
        self.proc = None
        self.port = 0

    def start(self) -> Node:
        self.port = free_port()
        conf = self.base / "nimbus.toml"
        conf.write_text(
            "\n".join(
                [
                    f"listen = [{toml_str(f'127.0.0.1:{self.port}')}]",
                    f"user_db = {toml_str(str(self.db))}",
                    f"state_dir = {toml_str(str(self.state))}",
                    "",
                    "[[share]]",
                    'name = "ca"',
                    f"path = {toml_str(str(self.share))}",
                    "continuous_availability = true",
                ]
            )
            + "\n"
        )
        log = open(self.base / "nimbus.log", "ab")
        self.proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf), "-v"], stdout=log, stderr=subprocess.STDOUT)
        wait_for_port("127.0.0.1", self.port, self.proc)
        return Node("127.0.0.1", self.port, "ca", USER, PASSWORD)

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def log(self) -> str:
        return (self.base / "nimbus.log").read_text(errors="replace")


def persistent_open(client: Client, name: str, create_guid: uuid.UUID, key: bytes, timeout_ms: int) -> Open:
    return durable_open(client, name, create_guid, key, timeout_ms, persistent=True)[0]


def persistent_reconnect(client: Client, name: str, file_id: bytes, create_guid: uuid.UUID, key: bytes) -> Open:
    return reconnect(client, name, file_id, create_guid, key, flags=DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT)


def exclusive_open_status(client: Client, name: str) -> int:
    """An open that shares nothing: it conflicts with any other open."""

    def go():
        f = Open(client.tree, name)
        f.create(
            ImpersonationLevel.Impersonation,
            ACCESS,
            FileAttributes.FILE_ATTRIBUTE_NORMAL,
            0,
            CreateDisposition.FILE_OPEN,
            CreateOptions.FILE_NON_DIRECTORY_FILE,
        )
        f.close()

    return status_of(go)


def test_persistent_handle_survives_kill_9_with_its_lock(tmp_path):
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
        first = Client(node, guid)
        assert first.tree.is_ca_share, "the share does not advertise continuous availability"
        f = persistent_open(first, "ledger.dat", create_guid, key, timeout_ms=30_000)
        payload = b"written before the crash " * 50
        f.write(payload, 0)
        first.lock(f.file_id, 0, 100, EXCLUSIVE)
        file_id = f.file_id
        srv.kill9()

        node = srv.start()
        assert "restored" in srv.log()
        # Another client may not take the file from the reclaiming one.
        other = Client(node, uuid.uuid4())
        try:
            assert exclusive_open_status(other, "ledger.dat") == STATUS_FILE_NOT_AVAILABLE
            # The owner reconnects, logs on again and reclaims it.
            again = Client(node, guid)
            try:
                g = persistent_reconnect(again, "ledger.dat", file_id, create_guid, key)
                assert g.read(0, len(payload)) == payload
                # Its lock came back: a compatible open of another client
                # cannot take the range.
                h = plain_open(other, "ledger.dat")
                assert status_of(lambda: other.lock(h.file_id, 10, 10, EXCLUSIVE)) == STATUS_LOCK_NOT_GRANTED
                h.close()
                g.close()
                # Closed, its record goes. The removal is not waited for
                # (it reaches the disk within milliseconds, or with the next
                # durable write), nor is an open's "answered" mark: a
                # persistent open of another file is such a write, and a
                # second one takes the first one's mark along,
                # deterministically.
                persistent_open(again, "marker.dat", uuid.uuid4(), os.urandom(16), timeout_ms=30_000)
                persistent_open(again, "marker2.dat", uuid.uuid4(), os.urandom(16), timeout_ms=30_000)
                srv.kill9()
            finally:
                again.close()
            node = srv.start()
            log = srv.log()
            assert log.count("of ledger.dat restored") == 1  # the first restart's
            assert "of marker.dat restored" in log
            third = Client(node, uuid.uuid4())
            try:
                assert exclusive_open_status(third, "ledger.dat") == 0  # STATUS_SUCCESS
                assert exclusive_open_status(third, "marker.dat") == STATUS_FILE_NOT_AVAILABLE
            finally:
                third.close()
        finally:
            other.close()
    finally:
        srv.stop()


def test_unreclaimed_persistent_handle_frees_the_file_at_its_timeout(tmp_path):
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        first = Client(node, uuid.uuid4())
        # 5 s: the restored handle's timer runs from before the server
        # listens, and the restart, a logon and the first open fit in it.
        f = persistent_open(first, "left.dat", uuid.uuid4(), os.urandom(16), timeout_ms=5_000)
        first.lock(f.file_id, 0, 10, EXCLUSIVE)
        srv.kill9()

        node = srv.start()
        restarted = time.monotonic()
        other = Client(node, uuid.uuid4())
        try:
            assert exclusive_open_status(other, "left.dat") == STATUS_FILE_NOT_AVAILABLE
            deadline = restarted + 30
            while (status := exclusive_open_status(other, "left.dat")) == STATUS_FILE_NOT_AVAILABLE:
                assert time.monotonic() < deadline, "the persistent handle outlived its timeout"
                time.sleep(0.05)
            assert status == 0
            assert time.monotonic() - restarted >= 1.0
        finally:
            other.close()
    finally:
        srv.stop()


def test_a_client_that_does_not_announce_persistent_handles_gets_a_durable_handle_only(tmp_path):
    """MS-SMB2 3.3.5.4 and 3.3.5.9.10: SMB2_GLOBAL_CAP_PERSISTENT_HANDLES is
    answered only to a client that announced it, and a DH2Q asking for
    persistence is granted it only on such a connection; the same open with
    its RH lease is durable, not persistent. A client that announced it, on
    the same server, gets the persistent handle."""
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        quiet = Client(node, uuid.uuid4(), persistent_handles=False)
        announcing = Client(node, uuid.uuid4())
        try:
            assert not quiet.conn.server_capabilities.has_flag(Capabilities.SMB2_GLOBAL_CAP_PERSISTENT_HANDLES)
            assert announcing.conn.server_capabilities.has_flag(Capabilities.SMB2_GLOBAL_CAP_PERSISTENT_HANDLES)
            f = Open(quiet.tree, "durable-only.dat")
            contexts = f.create(
                ImpersonationLevel.Impersonation,
                ACCESS,
                FileAttributes.FILE_ATTRIBUTE_NORMAL,
                SHARE_ALL,
                CreateDisposition.FILE_OPEN_IF,
                CreateOptions.FILE_NON_DIRECTORY_FILE,
                create_contexts=[dh2q(uuid.uuid4(), 30_000, DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT), lease(os.urandom(16), READ | HANDLE)],
                oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
            )
            granted = [c for c in contexts or [] if isinstance(c, SMB2CreateDurableHandleResponseV2)]
            assert granted, f"no durable handle granted: {contexts}"
            assert not granted[0]["flags"].has_flag(DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT), "persistent without the capability"
            f.close()
            persistent_open(announcing, "persistent.dat", uuid.uuid4(), os.urandom(16), timeout_ms=30_000).close()
        finally:
            quiet.close()
            announcing.close()
    finally:
        srv.stop()


def test_continuous_availability_needs_a_state_dir(tmp_path):
    db = tmp_path / "users.db"
    add_user(db, USER, PASSWORD)
    share = tmp_path / "ca"
    share.mkdir()
    conf = tmp_path / "nimbus.toml"
    conf.write_text(f'[[share]]\nname = "ca"\npath = {toml_str(str(share))}\ncontinuous_availability = true\n')
    r = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "share[0].continuous_availability" in r.stdout + r.stderr
    assert "state_dir" in r.stdout + r.stderr


def test_smbtorture_persistent_tests_on_a_ca_share(tmp_path, samba_client_conf):
    """smbtorture's persistent-handle tests pick their expectations from
    the share: on a continuously available one, every open asking for a
    persistent handle gets one (durable-v2-open.persistent-open-*), and a
    replay from a new connection gets its persistent open back
    (replay.replay5, which skips on other shares)."""
    import shutil

    import pytest
    from test_smbtorture import run_smbtorture

    if not shutil.which("smbtorture"):
        pytest.skip("smbtorture (samba-testsuite) not installed")
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        for test in (
            "smb2.durable-v2-open.persistent-open-oplock",
            "smb2.durable-v2-open.persistent-open-lease",
            "smb2.replay.replay5",
        ):
            run = run_smbtorture(node, test, samba_client_conf, tmp_path / f"{test}.log", timeout=120)
            assert run.outcomes.get(test) == "pass", f"{test}: {run.outcomes} {run.details.get(test, '')}"
    finally:
        srv.stop()


def persistent_open_uncached(client: Client, name: str, create_guid: uuid.UUID) -> Open:
    """A persistent handle with no lease or oplock: nothing of it is ever
    broken (the python client leaves breaks unacknowledged)."""
    f = Open(client.tree, name)
    contexts = f.create(
        ImpersonationLevel.Impersonation,
        ACCESS,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        SHARE_ALL,
        CreateDisposition.FILE_OPEN_IF,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
        create_contexts=[dh2q(create_guid, 30_000, DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT)],
    )
    granted = [c for c in contexts or [] if isinstance(c, SMB2CreateDurableHandleResponseV2)]
    assert granted and granted[0]["flags"].has_flag(DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT)
    return f


def reconnect_uncached(client: Client, name: str, file_id: bytes, create_guid: uuid.UUID) -> Open:
    f = Open(client.tree, name)
    f.create(0, 0, 0, 0, 0, 0, create_contexts=[dh2c(file_id, create_guid, DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT)])
    return f


def test_blocking_lock_granted_later_survives_kill_9(tmp_path):
    """A blocking LOCK on a persistent handle that waits for another
    client's unlock is written to the handle's record before it is
    answered, like one granted at once: after `kill -9` the reclaimed
    handle has it."""
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        guid, create_guid = uuid.uuid4(), uuid.uuid4()
        owner = Client(node, guid)
        holder = Client(node, uuid.uuid4())
        f = persistent_open_uncached(owner, "ledger.dat", create_guid)
        file_id = f.file_id
        h = plain_open(holder, "ledger.dat")
        holder.lock(h.file_id, 0, 100, EXCLUSIVE)
        element = SMB2LockElement()
        element["offset"], element["length"] = 0, 100
        element["flags"] = LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK  # blocking
        req = SMB2LockRequest()
        req["file_id"] = file_id
        req["locks"] = [element]
        request = owner.conn.send(req, owner.session.session_id, owner.tree.tree_connect_id)
        # Waits for the server's interim answer (STATUS_PENDING, with an
        # AsyncId): the lock is queued behind the holder's.
        deadline = time.monotonic() + 10
        while request.async_id is None:
            assert time.monotonic() < deadline, "no interim response to the blocking LOCK"
            time.sleep(0.01)
        assert request.response["status"].get_value() == NtStatus.STATUS_PENDING
        unlock = SMB2LockElement()
        unlock["offset"], unlock["length"] = 0, 100
        unlock["flags"] = LockFlags.SMB2_LOCKFLAG_UNLOCK
        ureq = SMB2LockRequest()
        ureq["file_id"] = h.file_id
        ureq["locks"] = [unlock]
        holder.conn.receive(holder.conn.send(ureq, holder.session.session_id, holder.tree.tree_connect_id))
        final = owner.conn.receive(request)
        assert final["status"].get_value() == NtStatus.STATUS_SUCCESS
        srv.kill9()
        holder.close()

        node = srv.start()
        again = Client(node, guid)
        other = Client(node, uuid.uuid4())
        try:
            reconnect_uncached(again, "ledger.dat", file_id, create_guid)
            o = plain_open(other, "ledger.dat")
            assert status_of(lambda: other.lock(o.file_id, 10, 10, EXCLUSIVE)) == STATUS_LOCK_NOT_GRANTED
        finally:
            other.close()
            again.close()
    finally:
        srv.stop()


def wait_for_closed_connections(srv: CaServer, count: int, timeout: float = 20.0) -> None:
    """Waits until the server has logged `count` torn-down connections (its
    opens released or kept by then)."""
    deadline = time.monotonic() + timeout
    while srv.log().count(" closed") < count:
        assert time.monotonic() < deadline, "the server did not notice the lost connection"
        time.sleep(0.02)


def test_lease_broken_while_disconnected_is_not_restored_after_kill_9(tmp_path):
    """The record follows the lease's breaks. A persistent handle with an RH
    lease loses its connection; another client writes the file, which
    breaks the lease to none (the server acknowledges for the absent
    holder). After `kill -9` and a restart the reclaimed handle holds no
    lease state: caching it gave up does not come back."""
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
        owner = Client(node, guid)
        f = persistent_open(owner, "shared.dat", create_guid, key, timeout_ms=30_000)
        f.write(b"owner's data", 0)
        file_id = f.file_id
        closed_before = srv.log().count(" closed")
        owner.drop()
        wait_for_closed_connections(srv, closed_before + 1)
        writer = Client(node, uuid.uuid4())
        try:
            h = plain_open(writer, "shared.dat")
            h.write(b"WRITER", 0)
            h.close()
            # Later durable writes carry the lowered record to the disk
            # (it is not waited for on its own), deterministically.
            persistent_open(writer, "marker.dat", uuid.uuid4(), os.urandom(16), timeout_ms=30_000)
            persistent_open(writer, "marker2.dat", uuid.uuid4(), os.urandom(16), timeout_ms=30_000)
        finally:
            writer.close()
        srv.kill9()

        node = srv.start()
        assert "of shared.dat restored" in srv.log()
        again = Client(node, guid)
        try:
            g = Open(again.tree, "shared.dat")
            contexts = g.create(
                0, 0, 0, 0, 0, 0,
                create_contexts=[dh2c(file_id, create_guid, DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT), lease(key, 0)],
                oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
            )
            leases = [c for c in contexts or [] if isinstance(c, SMB2CreateResponseLeaseV2)]
            state = leases[0]["lease_state"].get_value() if leases else 0
            assert state & (READ | HANDLE) == 0, f"the reclaimed handle got back lease state {state:#x}"
            assert g.read(0, 6) == b"WRITER"
            g.close()
        finally:
            again.close()
    finally:
        srv.stop()


def test_a_persistent_handle_whose_connection_drops_during_a_break_stays_for_its_client(tmp_path):
    """A persistent handle with an RH lease is being broken (another
    client's open that shares nothing waits for it to give up handle
    caching) when its connection is lost. It can no longer acknowledge:
    the break is taken as acknowledged, the waiting open is answered at
    once (the handle's share modes still refuse it), and the handle stays
    for its client, which reclaims it with its data. (A durable,
    non-persistent handle is closed instead, as a break that reaches a
    disconnected durable open closes it.)"""
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
        owner = Client(node, guid)
        f = persistent_open(owner, "broken.dat", create_guid, key, timeout_ms=30_000)
        f.write(b"owner's data", 0)
        file_id = f.file_id
        other = Client(node, uuid.uuid4())
        answered: list[int] = []
        t = threading.Thread(target=lambda: answered.append(exclusive_open_status(other, "broken.dat")), daemon=True)
        try:
            t.start()
            # The break went out (the other CREATE waits for it)...
            deadline = time.monotonic() + 20
            while ": break Lease" not in srv.log():
                assert time.monotonic() < deadline, "no break was sent"
                time.sleep(0.02)
            # ...and the owner's connection is lost before it answers.
            owner.drop()
            t.join(timeout=10)
            assert answered == [STATUS_FILE_NOT_AVAILABLE], [hex(s) for s in answered]
            again = Client(node, guid)
            try:
                g = persistent_reconnect(again, "broken.dat", file_id, create_guid, key)
                assert g.read(0, 12) == b"owner's data"
                g.close()
            finally:
                again.close()
        finally:
            other.close()
    finally:
        srv.stop()


def test_a_persistent_handle_is_not_restored_onto_a_new_file_that_reused_its_inode(tmp_path):
    """While the server is down, the handle's file is deleted and another
    file made under its name on the same inode number (ext4 hands a freed
    inode to the next file): the record's device and inode match the new
    file, its generation does not. The start drops the record, the
    client's reclaim is refused, and the new file is untouched."""
    srv = CaServer(tmp_path)
    try:
        node = srv.start()
        guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
        first = Client(node, guid)
        f = persistent_open(first, "ledger.dat", create_guid, key, timeout_ms=30_000)
        f.write(b"the old file", 0)
        file_id = f.file_id
        old_ino = os.stat(srv.share / "ledger.dat").st_ino
        srv.kill9()

        # ext4 gives a new file the lowest free inode of its directory's
        # group: files are made until one lands on the freed inode (others
        # freed earlier in the group are filled first), then renamed.
        path = srv.share / "ledger.dat"
        path.unlink()
        fillers = []
        for i in range(50_000):
            filler = srv.share / f"filler-{i}"
            filler.write_bytes(b"someone else's new file %d" % i)
            if os.stat(filler).st_ino == old_ino:
                filler.rename(path)
                break
            fillers.append(filler)
        assert path.exists(), "the share's file system (ext4 in CI) did not reuse the inode"
        for filler in fillers:
            filler.unlink()
        new_content = path.read_bytes()

        node = srv.start()
        assert "persistent open" in srv.log() and "of ledger.dat not restored" in srv.log()
        again = Client(node, guid)
        try:
            assert status_of(lambda: persistent_reconnect(again, "ledger.dat", file_id, create_guid, key)) == NtStatus.STATUS_OBJECT_NAME_NOT_FOUND
        finally:
            again.close()
        assert path.read_bytes() == new_content
        other = Client(node, uuid.uuid4())
        try:
            assert exclusive_open_status(other, "ledger.dat") == 0  # nothing holds it
        finally:
            other.close()
    finally:
        srv.stop()
