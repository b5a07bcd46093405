"""Durable handles (issue 14) with Python's smbprotocol against nimbus.

A client opens a file with a durable v2 handle (DH2Q) and an RH lease,
writes, takes a byte-range lock, and loses its TCP connection without a
LOGOFF or CLOSE. From a new connection and a new session it reclaims the
handle (DH2C): the lock is still its own against a second client, the data
written before the loss is intact, and the file position is kept. Around
that: what a reconnect must not be able to do (another user, a forged
FileId or CreateGuid, a handle whose timeout ran out), and the bounds on
the timeout a client may ask for.

Every wait is on the server's answers: a reconnect is retried until it
gives a final status, never after a sleep alone.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid

import pytest
from conftest import Security
from smbprotocol import Dialects
from smbprotocol.connection import Capabilities, Connection
from smbprotocol.create_contexts import (
    CreateContextName,
    SMB2CreateAppInstanceId,
    SMB2CreateDurableHandleReconnect,
    SMB2CreateDurableHandleRequest,
    SMB2CreateDurableHandleResponse,
    DurableHandleFlags,
    SMB2CreateContextRequest,
    SMB2CreateDurableHandleReconnectV2,
    SMB2CreateDurableHandleRequestV2,
    SMB2CreateDurableHandleResponseV2,
    SMB2CreateRequestLeaseV2,
    SMB2CreateResponseLeaseV2,
)
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.open import (
    CreateAction,
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    LockFlags,
    Open,
    RequestedOplockLevel,
    ShareAccess,
    SMB2LockElement,
    SMB2LockRequest,
    SMB2LockResponse,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

TIMEOUT = 30
# Lease states (MS-SMB2 2.2.13.2.8).
READ, HANDLE = 0x1, 0x2
STATUS_LOCK_NOT_GRANTED = 0xC0000055
STATUS_FILE_LOCK_CONFLICT = 0xC0000054
STATUS_OBJECT_NAME_NOT_FOUND = 0xC0000034
STATUS_ACCESS_DENIED = 0xC0000022
STATUS_SHARING_VIOLATION = 0xC0000043
STATUS_FILE_CLOSED = 0xC0000128
BOB = ("bob", "B0b-Secret-2!")
KATE = ("kate", "K4te-Secret-3!")
ACCESS = (
    FilePipePrinterAccessMask.FILE_READ_DATA
    | FilePipePrinterAccessMask.FILE_WRITE_DATA
    | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES
)
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE


BREAK_MESSAGE_ID = 0xFFFFFFFFFFFFFFFF


class _Reserved:
    def get_value(self) -> int:
        return 0


class _Unsolicited:
    """What smbprotocol's receive loop looks up for a message: a break
    notification (MessageId all ones) answers no request, and smbprotocol
    1.17 has no place for one. The breaks these tests cause need no
    acknowledgement (a read lease going to none)."""

    def __init__(self):
        self.session_id = 0
        self.async_id = None
        self.response = None
        self.response_event = threading.Event()
        self.response_event_lock = threading.Lock()
        self.message = {"reserved": _Reserved()}


class _Requests(dict):
    def __missing__(self, message_id):
        if message_id == BREAK_MESSAGE_ID:
            return _Unsolicited()
        raise KeyError(message_id)


class Client:
    """One connection, one session, one tree connect to the server's share."""

    def __init__(self, server, client_guid: uuid.UUID, user: str | None = None, password: str | None = None, signing: bool = True, persistent_handles: bool = True):
        self.conn = Connection(client_guid, server.host, server.port, require_signing=signing)
        if persistent_handles:
            # Announced as Windows does: persistent handles are granted only
            # on a connection whose client announced them (MS-SMB2 3.3.5.4).
            self.conn.client_capabilities |= Capabilities.SMB2_GLOBAL_CAP_PERSISTENT_HANDLES
        self.conn.outstanding_requests = _Requests(self.conn.outstanding_requests)
        self.conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
        self.session = Session(self.conn, user or server.user, password or server.password, require_encryption=False, auth_protocol="ntlm")
        self.session.connect()
        self.tree = TreeConnect(self.session, rf"\\{server.host}\{server.share}")
        # A guest has no signing key to check the negotiate with.
        self.tree.connect(require_secure_negotiate=signing)

    def drop(self) -> None:
        """Loses the TCP connection: no CLOSE, no LOGOFF."""
        self.conn.disconnect(close=False)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.disconnect(close=True, timeout=TIMEOUT)

    def lock(self, file_id: bytes, offset: int, length: int, flags: int) -> None:
        element = SMB2LockElement()
        element["offset"] = offset
        element["length"] = length
        element["flags"] = flags
        req = SMB2LockRequest()
        req["file_id"] = file_id
        req["locks"] = [element]
        request = self.conn.send(req, self.session.session_id, self.tree.tree_connect_id)
        SMB2LockResponse().unpack(self.conn.receive(request)["data"].get_value())


def context(name: bytes, data) -> SMB2CreateContextRequest:
    c = SMB2CreateContextRequest()
    c["buffer_name"] = name
    c["buffer_data"] = data
    return c


def dh2q(create_guid: uuid.UUID, timeout_ms: int = 0, flags: int = 0) -> SMB2CreateContextRequest:
    d = SMB2CreateDurableHandleRequestV2()
    d["timeout"] = timeout_ms
    d["flags"] = flags
    d["create_guid"] = create_guid
    return context(CreateContextName.SMB2_CREATE_DURABLE_HANDLE_REQUEST_V2, d)


def dh2c(file_id: bytes, create_guid: uuid.UUID, flags: int = 0) -> SMB2CreateContextRequest:
    d = SMB2CreateDurableHandleReconnectV2()
    d["file_id"] = file_id
    d["create_guid"] = create_guid
    d["flags"] = flags
    return context(CreateContextName.SMB2_CREATE_DURABLE_HANDLE_RECONNECT_V2, d)


def lease(key: bytes, state: int) -> SMB2CreateContextRequest:
    d = SMB2CreateRequestLeaseV2()
    d["lease_key"] = key
    d["lease_state"] = state
    d["parent_lease_key"] = b"\0" * 16
    d["epoch"] = b"\0\0"
    return context(CreateContextName.SMB2_CREATE_REQUEST_LEASE_V2, d)


def of_type(contexts, kind):
    return [c for c in contexts or [] if isinstance(c, kind)]


def durable_open(client: Client, name: str, create_guid: uuid.UUID, lease_key: bytes, timeout_ms: int = 0, persistent: bool = False):
    """Opens `name` with an RH lease and a durable v2 handle (persistent,
    when asked, and then checked to be); returns the Open and the granted
    timeout in milliseconds."""
    flags = DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT if persistent else 0
    asked = [dh2q(create_guid, timeout_ms, flags), lease(lease_key, READ | HANDLE)]
    f, contexts = create_with(client, name, contexts=asked, oplock=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE)
    granted = of_type(contexts, SMB2CreateDurableHandleResponseV2)
    assert granted, f"no durable handle granted: {contexts}"
    if persistent:
        assert granted[0]["flags"].has_flag(DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT), "not persistent"
    leases = of_type(contexts, SMB2CreateResponseLeaseV2)
    assert leases and leases[0]["lease_state"].get_value() == READ | HANDLE
    return f, granted[0]["timeout"].get_value()


def reconnect(client: Client, name: str, file_id: bytes, create_guid: uuid.UUID, lease_key: bytes, flags: int = 0) -> Open:
    """Reclaims a durable handle (`flags`: DH2C flags, e.g. persistent);
    the request's fixed fields are zero, as clients send them (MS-SMB2
    3.2.4.4 sets them from the open)."""
    f = Open(client.tree, name)
    f.create(
        0,
        0,
        0,
        0,
        0,
        0,
        create_contexts=[dh2c(file_id, create_guid, flags), lease(lease_key, 0)],
        oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
    )
    return f


def reconnect_status(client: Client, name: str, file_id: bytes, create_guid: uuid.UUID, lease_key: bytes) -> int:
    try:
        reconnect(client, name, file_id, create_guid, lease_key).close()
        return NtStatus.STATUS_SUCCESS
    except SMBResponseException as e:
        return e.status


def plain_open(client: Client, name: str) -> Open:
    f = Open(client.tree, name)
    f.create(
        ImpersonationLevel.Impersonation,
        ACCESS,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        SHARE_ALL,
        CreateDisposition.FILE_OPEN,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
    )
    return f


def status_of(fn) -> int:
    try:
        fn()
        return NtStatus.STATUS_SUCCESS
    except SMBResponseException as e:
        return e.status


def test_durable_v2_handle_survives_a_lost_connection_with_its_lock_and_data(server):
    guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
    first = Client(server, guid)
    f, timeout_ms = durable_open(first, "ledger.dat", create_guid, key)
    assert timeout_ms == 60_000  # [limits] durable_handle_timeout_secs, asked for 0
    payload = b"acknowledged before the drop " * 100
    f.write(payload, 0)
    first.lock(f.file_id, 0, 100, LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
    old_file_id = f.file_id
    first.drop()

    # A new connection of the same client (its ClientGuid names the lease)
    # and a new session reclaim the handle.
    second = Client(server, guid)
    try:
        g = reconnect(second, "ledger.dat", old_file_id, create_guid, key)
        assert g.create_action == CreateAction.FILE_OPENED
        assert g.end_of_file == len(payload)
        assert g.read(0, len(payload)) == payload

        # The lock came back with the handle: another client cannot take
        # the range nor write into it; outside it, it may.
        other = Client(server, uuid.uuid4())
        try:
            h = plain_open(other, "ledger.dat")
            flags = LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY
            assert status_of(lambda: other.lock(h.file_id, 50, 10, flags)) == STATUS_LOCK_NOT_GRANTED
            assert status_of(lambda: h.write(b"x", 10)) == STATUS_FILE_LOCK_CONFLICT
            assert h.read(100, 20) == payload[100:120]
            # Released by its owner, the range is free.
            second.lock(g.file_id, 0, 100, LockFlags.SMB2_LOCKFLAG_UNLOCK)
            other.lock(h.file_id, 50, 10, flags)
            h.close()
        finally:
            other.close()
        g.close()
    finally:
        second.close()


def test_reconnect_needs_the_owner_and_the_right_ids(server_factory):
    srv = server_factory.start(security=Security(extra_users=[BOB]))
    guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
    first = Client(srv, guid)
    f, _ = durable_open(first, "owned.txt", create_guid, key)
    file_id = f.file_id
    first.drop()

    # Another user, from the same client, is refused (MS-SMB2 3.3.5.9.12),
    # exactly as for a handle that does not exist: the answer tells nobody
    # whether a FileId names another user's disconnected handle.
    bob = Client(srv, guid, *BOB)
    try:
        assert reconnect_status(bob, "owned.txt", file_id, create_guid, key) == STATUS_OBJECT_NAME_NOT_FOUND
    finally:
        bob.close()

    alice = Client(srv, guid)
    try:
        forged_id = (int.from_bytes(file_id[:8], "little") + 1).to_bytes(8, "little") + file_id[8:]
        assert reconnect_status(alice, "owned.txt", forged_id, create_guid, key) == STATUS_OBJECT_NAME_NOT_FOUND
        assert reconnect_status(alice, "owned.txt", file_id, uuid.uuid4(), key) == STATUS_OBJECT_NAME_NOT_FOUND
        assert reconnect_status(alice, "owned.txt", file_id, create_guid, os.urandom(16)) == STATUS_OBJECT_NAME_NOT_FOUND
        # None of the refusals cost the owner its handle.
        reconnect(alice, "owned.txt", file_id, create_guid, key).close()
        # Closed, it is gone for good.
        assert reconnect_status(alice, "owned.txt", file_id, create_guid, key) == STATUS_OBJECT_NAME_NOT_FOUND
    finally:
        alice.close()


def test_asked_timeout_is_bounded_and_an_expired_handle_is_closed(server_factory):
    srv = server_factory.start(security=Security(limits={"max_durable_handle_timeout_secs": 2}, extra_users=[BOB]))
    guid, key = uuid.uuid4(), os.urandom(16)
    first = Client(srv, guid)
    try:
        # 2^32-1 ms (49 days) is cut to the configured maximum.
        f, timeout_ms = durable_open(first, "short.txt", uuid.uuid4(), key, timeout_ms=0xFFFFFFFF)
        assert timeout_ms == 2000
        f.close()
        create_guid = uuid.uuid4()
        f, timeout_ms = durable_open(first, "short.txt", create_guid, key, timeout_ms=1500)
        assert timeout_ms == 1500
        first.lock(f.file_id, 0, 10, LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        file_id = f.file_id
    finally:
        first.drop()
    dropped = time.monotonic()

    # Probed without disturbing it: another user's reconnect is refused as
    # if there were no such handle, and leaves the handle be. It is kept
    # until its timeout, then closed by the scavenger (which says so), its
    # lock going with it.
    bob = Client(srv, guid, *BOB)
    try:
        assert reconnect_status(bob, "short.txt", file_id, create_guid, key) == STATUS_OBJECT_NAME_NOT_FOUND
    finally:
        bob.close()
    deadline = dropped + 20
    while "of short.txt expired" not in srv.log_tail(50):
        assert time.monotonic() < deadline, "the durable handle outlived its timeout"
        time.sleep(0.05)
    assert time.monotonic() - dropped >= 1.0
    other = Client(srv, uuid.uuid4())
    try:
        h = plain_open(other, "short.txt")
        other.lock(h.file_id, 0, 10, LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        h.close()
    finally:
        other.close()
    again = Client(srv, guid)
    try:
        assert reconnect_status(again, "short.txt", file_id, create_guid, key) == STATUS_OBJECT_NAME_NOT_FOUND
    finally:
        again.close()


def test_disconnected_handle_gives_way_to_a_conflicting_open(server):
    """A disconnected holder cannot answer a break: another client's open
    that needs one closes the durable handle instead of waiting 35 s."""
    guid, create_guid, key = uuid.uuid4(), uuid.uuid4(), os.urandom(16)
    first = Client(server, guid)
    f = Open(first.tree, "contended.txt")
    f.create(
        ImpersonationLevel.Impersonation,
        ACCESS,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        0,  # no sharing: the next open is a sharing violation unless the handle goes
        CreateDisposition.FILE_OPEN_IF,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
        create_contexts=[dh2q(create_guid), lease(key, READ | HANDLE)],
        oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
    )
    file_id = f.file_id
    first.drop()
    other = Client(server, uuid.uuid4())
    try:
        started = time.monotonic()
        h = plain_open(other, "contended.txt")
        assert time.monotonic() - started < 10
        h.close()
    finally:
        other.close()
    again = Client(server, guid)
    try:
        assert reconnect_status(again, "contended.txt", file_id, create_guid, key) == STATUS_OBJECT_NAME_NOT_FOUND
    finally:
        again.close()


@pytest.mark.parametrize("value", [0, 86401])
def test_bad_durable_limits_are_refused_naming_the_key(tmp_path, value):
    from conftest import run_nimbus

    conf = tmp_path / "nimbus.toml"
    conf.write_text(f"[limits]\ndurable_handle_timeout_secs = {value}\n")
    r = run_nimbus("config", "check", str(conf), check=False)
    assert r.returncode != 0
    assert "limits.durable_handle_timeout_secs" in r.stdout + r.stderr


def test_damaged_or_misplaced_state_store_stops_the_start_naming_the_path(tmp_path):
    """A store that cannot be opened is a reason not to start: never a
    panic, never a silently empty store in its place."""
    import subprocess

    from conftest import add_user, nimbus_binary

    db = tmp_path / "users.db"
    add_user(db)
    share = tmp_path / "share"
    share.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o700)  # private, as a state directory must be
    damaged = state / "state.redb"
    damaged.write_bytes(b"this is not a redb file" * 10)
    not_a_dir = tmp_path / "plain-file"
    not_a_dir.write_text("x")
    for state_dir, expect in ((state, str(damaged)), (not_a_dir, str(not_a_dir))):
        r = subprocess.run(
            [str(nimbus_binary()), "serve", "--listen", "127.0.0.1:0", "--user-db", str(db), "--share", f"data={share}", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        out = r.stdout + r.stderr
        assert r.returncode != 0, out
        assert expect in out, out
        assert "panicked" not in out, out
    assert damaged.read_bytes() == b"this is not a redb file" * 10


def test_state_dir_is_created_private_and_reused(tmp_path):
    import subprocess

    from conftest import add_user, free_port, nimbus_binary, wait_for_port

    db = tmp_path / "users.db"
    add_user(db)
    share = tmp_path / "share"
    share.mkdir()
    state = tmp_path / "demo" / "state"
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen(
            [str(nimbus_binary()), "serve", "--listen", f"127.0.0.1:{port}", "--user-db", str(db), "--share", f"data={share}", "--state-dir", str(state)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port("127.0.0.1", port, proc)
        finally:
            proc.kill()
            proc.wait(timeout=10)
        assert (state / "state.redb").is_file()
        assert state.stat().st_mode & 0o777 == 0o700


def test_kept_handles_are_bounded_per_user(server_factory):
    """[limits] max_durable_handles_per_user: a durable handle beyond it is
    closed when its connection is lost (its lock freed), the others kept."""
    srv = server_factory.start(security=Security(limits={"max_durable_handles_per_user": 1}))
    guid = uuid.uuid4()
    first = Client(srv, guid)
    handles = []
    for name in ("kept-a.txt", "kept-b.txt"):
        create_guid, key = uuid.uuid4(), os.urandom(16)
        f, _ = durable_open(first, name, create_guid, key)
        first.lock(f.file_id, 0, 1, LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        handles.append((name, f.file_id, create_guid, key))
    first.drop()
    again = Client(srv, guid)
    try:
        results = [reconnect_status(again, name, fid, cg, key) for name, fid, cg, key in handles]
        # One of the two was kept (whichever the teardown reached first).
        assert sorted(results) == sorted([NtStatus.STATUS_SUCCESS, STATUS_OBJECT_NAME_NOT_FOUND]), results
    finally:
        again.close()
    assert "max_durable_handles_per_user" in srv.log_tail(200)


def create_with(client: Client, name: str, *, contexts=(), oplock=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_NONE, share=SHARE_ALL, disposition=CreateDisposition.FILE_OPEN_IF):
    """Opens `name` for ACCESS with the given create contexts; returns the
    Open and the response's contexts."""
    f = Open(client.tree, name)
    answered = f.create(
        ImpersonationLevel.Impersonation,
        ACCESS,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        share,
        disposition,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
        create_contexts=list(contexts),
        oplock_level=oplock,
    )
    return f, answered


def durable_v1_open(client: Client, name: str):
    """Opens `name` asking for a batch oplock and a v1 durable handle
    (DHnQ); returns the Open and whether durability was granted."""
    dhnq = context(CreateContextName.SMB2_CREATE_DURABLE_HANDLE_REQUEST, SMB2CreateDurableHandleRequest())
    f, answered = create_with(client, name, contexts=[dhnq], oplock=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_BATCH)
    return f, bool(of_type(answered, SMB2CreateDurableHandleResponse))


def reconnect_v1_status(client: Client, name: str, file_id: bytes) -> int:
    """A v1 reconnect (DHnC) of a batch-oplock handle: it names the FileId
    alone, no CreateGuid and no lease."""
    d = SMB2CreateDurableHandleReconnect()
    d["data"] = file_id
    dhnc = context(CreateContextName.SMB2_CREATE_DURABLE_HANDLE_RECONNECT, d)
    try:
        f, _ = create_with(client, name, contexts=[dhnc], oplock=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_BATCH, disposition=CreateDisposition.FILE_OPEN)
    except SMBResponseException as e:
        return e.status
    f.close()
    return NtStatus.STATUS_SUCCESS


def test_a_guest_cannot_reclaim_a_users_handle_with_a_look_alike_name(server_factory):
    """A guest logs on as "\u212aate" (KELVIN SIGN), a name the user
    database does not know and whose lower case is "kate". It must not
    reclaim kate's disconnected durable handle, nor be granted one."""
    srv = server_factory.start(security=Security(signing="auto", guest_shares={"data"}, extra_users=[KATE]))
    kate = Client(srv, uuid.uuid4(), *KATE)
    f, durable = durable_v1_open(kate, "kates-notes.txt")
    assert durable
    f.write(b"for kate only", 0)
    file_id = f.file_id
    kate.drop()

    guest = Client(srv, uuid.uuid4(), "\u212aate", "any password", signing=False)
    try:
        assert guest.session.signing_key is None, "not logged on as a guest"
        assert reconnect_v1_status(guest, "kates-notes.txt", file_id) == STATUS_OBJECT_NAME_NOT_FOUND
        # A guest's own open is never durable: nothing proves a later
        # guest is the same client.
        g, durable = durable_v1_open(guest, "guest-notes.txt")
        assert not durable
        g.close()
    finally:
        guest.close()
    # The refusal cost kate nothing.
    again = Client(srv, uuid.uuid4(), *KATE)
    try:
        assert reconnect_v1_status(again, "kates-notes.txt", file_id) == NtStatus.STATUS_SUCCESS
    finally:
        again.close()


def test_persistent_file_id_halves_are_not_a_counter(server):
    client = Client(server, uuid.uuid4())
    try:
        ids = []
        for n in range(8):
            f, _ = create_with(client, f"id-{n}.txt")
            ids.append(int.from_bytes(f.file_id[:8], "little"))
            f.close()
        assert len(set(ids)) == len(ids)
        steps = {b - a for a, b in zip(ids, ids[1:])}
        assert not steps & {1, 2}, f"persistent FileIds step by a counter: {[hex(i) for i in ids]}"
        # Spread over the id space, not clustered near zero.
        assert max(ids) > 1 << 32, [hex(i) for i in ids]
    finally:
        client.close()


def app_instance_open(client: Client, name: str, app_id: bytes, share: int) -> Open:
    """A durable v2 open under AppInstanceId `app_id` (MS-SMB2 2.2.13.2.13)."""
    a = SMB2CreateAppInstanceId()
    a["app_instance_id"] = app_id
    contexts = [dh2q(uuid.uuid4()), context(CreateContextName.SMB2_CREATE_APP_INSTANCE_ID, a)]
    # No oplock: a break nobody acknowledges would hold the next open up.
    f, _ = create_with(client, name, contexts=contexts, share=share)
    return f


def test_an_app_instance_id_closes_only_its_own_users_opens_from_another_client(server_factory):
    """MS-SMB2 3.3.5.9.13: the AppInstanceId closes the same user's opens
    of the same share made by another client, never another user's."""
    srv = server_factory.start(security=Security(extra_users=[BOB]))
    app_id = os.urandom(16)
    alice = Client(srv, uuid.uuid4())
    bob = Client(srv, uuid.uuid4(), *BOB)
    alice_again = Client(srv, uuid.uuid4())
    try:
        f = app_instance_open(alice, "contract.docx", app_id, ShareAccess.FILE_SHARE_READ)
        f.write(b"signed by alice", 0)
        # Bob names alice's AppInstanceId: his open meets her share mode
        # as any other would, and her handle stays hers.
        assert status_of(lambda: app_instance_open(bob, "contract.docx", app_id, SHARE_ALL)) == STATUS_SHARING_VIOLATION
        assert f.read(0, 15) == b"signed by alice"
        # Alice's application, moved to another client, takes the file over.
        g = app_instance_open(alice_again, "contract.docx", app_id, ShareAccess.FILE_SHARE_READ)
        assert status_of(lambda: f.read(0, 15)) == STATUS_FILE_CLOSED
        g.close()
    finally:
        for c in (alice, bob, alice_again):
            c.close()


def test_kept_handles_per_user_count_the_user_whatever_domain_it_names(server_factory):
    """max_durable_handles_per_user counts a user once, whatever NTLM
    domain its logons name (a client chooses that name freely)."""
    srv = server_factory.start(security=Security(limits={"max_durable_handles_per_user": 1}))
    handles = []
    clients = []
    for domain in ("ONE", "TWO", "THREE"):
        guid = uuid.uuid4()
        c = Client(srv, guid, f"{domain}\\{srv.user}", srv.password)
        clients.append(c)
        create_guid, key = uuid.uuid4(), os.urandom(16)
        f, _ = durable_open(c, f"{domain}.txt", create_guid, key)
        handles.append((guid, domain, f.file_id, create_guid, key))
    for c in clients:
        c.drop()
    results = []
    for guid, domain, fid, cg, key in handles:
        again = Client(srv, guid, f"{domain}\\{srv.user}", srv.password)
        try:
            results.append(reconnect_status(again, f"{domain}.txt", fid, cg, key))
        finally:
            again.close()
    assert results.count(NtStatus.STATUS_SUCCESS) == 1, results
