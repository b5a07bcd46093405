"""Oplocks and leases (MS-SMB2 3.3.4.6-7, 3.3.5.9, 3.3.5.22) with two clients
on two connections: raw messages (tests/rawsmb.py, test_locks.Client), so
that every interim STATUS_PENDING, break notification, acknowledgement and
final response is seen as sent; smbprotocol for the encrypted holder.

Races are sequenced by the server's own messages: the holder reads its break
notification, the opener its interim response, and "nothing else arrived"
is shown by an ECHO whose response comes first. No test sleeps; the one
timeout test runs with oplock_break_timeout_secs = 1."""

from __future__ import annotations

import struct
import threading
import time
import uuid

import pytest
import rawsmb
import test_locks
from conftest import Security
from test_locks import CANCEL, CLOSE, WRITE, async_id, close_body, message_id, write_body

OPLOCK_BREAK, QUERY_INFO, SET_INFO = 0x0012, 0x0010, 0x0011
FLAG_SERVER_TO_REDIR, FLAG_ASYNC, FLAG_RELATED = 0x1, 0x2, 0x4
BREAK_MESSAGE_ID = 0xFFFFFFFFFFFFFFFF

STATUS_PENDING = 0x00000103
STATUS_UNSUCCESSFUL = 0xC0000001
STATUS_OBJECT_NAME_NOT_FOUND = 0xC0000034
STATUS_SHARING_VIOLATION = 0xC0000043
STATUS_INVALID_OPLOCK_PROTOCOL = 0xC00000E3
STATUS_CANCELLED = 0xC0000120
STATUS_FILE_CLOSED = 0xC0000128

# MS-SMB2 2.2.13 RequestedOplockLevel.
LEVEL_NONE, LEVEL_II, LEVEL_EXCLUSIVE, LEVEL_BATCH, LEVEL_LEASE = 0x00, 0x01, 0x08, 0x09, 0xFF
# MS-SMB2 2.2.13.2.8 LeaseState.
R, H, W = 0x1, 0x2, 0x4
LEASE_BREAK_ACK_REQUIRED = 0x1

READ_WRITE = 0x0012019F  # FILE_GENERIC_READ | FILE_GENERIC_WRITE
DELETE = 0x00010000
LIST_DIRECTORY = 0x00100081  # FILE_LIST_DIRECTORY | FILE_READ_ATTRIBUTES | SYNCHRONIZE
SHARE_ALL, SHARE_NONE = 0x7, 0x0
OPEN_IF, DIRECTORY_FILE, NON_DIRECTORY_FILE = 3, 0x1, 0x40
LEASE_FLAG_PARENT_LEASE_KEY_SET = 0x4
CONTENT = b"oplocked file contents\n"


# --------------------------------------------------------------------------
# messages


def create_body(
    name: str,
    *,
    oplock: int = LEVEL_NONE,
    share: int = SHARE_ALL,
    contexts: bytes = b"",
    access: int = READ_WRITE,
    options: int = NON_DIRECTORY_FILE,
) -> bytes:
    """MS-SMB2 2.2.13 CREATE (OPEN_IF; a file opened for reading and writing
    unless told otherwise), contexts 8-aligned after the name."""
    n = name.encode("utf-16-le")
    ctx_offset = 0
    if contexts:
        ctx_offset = rawsmb.HEADER_SIZE + 56 + len(n) + (-len(n) % 8)
        n += b"\0" * (-len(n) % 8)
    body = struct.pack(
        "<HBBIQQIIIIIHHII", 57, 0, oplock, 2, 0, 0, access, 0x80, share, OPEN_IF, options,
        rawsmb.HEADER_SIZE + 56, len(name.encode("utf-16-le")), ctx_offset, len(contexts),
    )  # fmt: skip
    return body + n + contexts


def lease_context(key: bytes, state: int, epoch: int = 0, parent: bytes | None = None) -> bytes:
    """MS-SMB2 2.2.13.2 create context "RqLs" with 2.2.13.2.10 SMB2_CREATE_REQUEST_LEASE_V2
    (with ParentLeaseKey when `parent` is given)."""
    flags = LEASE_FLAG_PARENT_LEASE_KEY_SET if parent else 0
    data = struct.pack("<16sIIQ16sHH", key, state, flags, 0, parent or b"\0" * 16, epoch, 0)
    return struct.pack("<IHHHHI", 0, 16, 4, 0, 24, len(data)) + b"RqLs" + b"\0" * 4 + data


def oplock_ack_body(file_id: bytes, level: int) -> bytes:
    """MS-SMB2 2.2.24.1 Oplock Break Acknowledgment."""
    return struct.pack("<HBBI16s", 24, level, 0, 0, file_id)


def lease_ack_body(key: bytes, state: int) -> bytes:
    """MS-SMB2 2.2.24.2 Lease Break Acknowledgment."""
    return struct.pack("<HHI16sIQ", 36, 0, 0, key, state, 0)


def query_standard_info_body(file_id: bytes) -> bytes:
    """MS-SMB2 2.2.37 QUERY_INFO, FILE / FileStandardInformation (5)."""
    return struct.pack("<HBBIHHIII16s", 41, 1, 5, 4096, 0, 0, 0, 0, 0, file_id) + b"\0"


def flags_of(msg: bytes) -> int:
    return struct.unpack_from("<I", msg, 16)[0]


def command_of(msg: bytes) -> int:
    return struct.unpack_from("<H", msg, 12)[0]


def body_of(msg: bytes) -> bytes:
    return msg[rawsmb.HEADER_SIZE :]


def oplock_level_of(create_resp: bytes) -> int:
    return create_resp[rawsmb.HEADER_SIZE + 2]


def file_id_of(create_resp: bytes) -> bytes:
    return create_resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]


def create_contexts(create_resp: bytes) -> dict[bytes, bytes]:
    """The create contexts of a CREATE response (MS-SMB2 2.2.14), name -> data."""
    offset, length = struct.unpack_from("<II", create_resp, rawsmb.HEADER_SIZE + 80)
    out, at = {}, offset
    while length:
        nxt, name_off, name_len, _, data_off, data_len = struct.unpack_from("<IHHHHI", create_resp, at)
        out[create_resp[at + name_off : at + name_off + name_len]] = create_resp[at + data_off : at + data_off + data_len]
        if nxt == 0:
            break
        at += nxt
    return out


def lease_of(create_resp: bytes) -> tuple[bytes, int, int, int]:
    """(key, state, flags, epoch) of the response's lease v2 context (MS-SMB2 2.2.14.2.11)."""
    assert oplock_level_of(create_resp) == LEVEL_LEASE
    data = create_contexts(create_resp)[b"RqLs"]
    assert len(data) == 52, f"lease v2 response context expected, got {len(data)} bytes"
    key, state, flags, _duration, _parent, epoch = struct.unpack_from("<16sIIQ16sH", data)
    return key, state, flags, epoch


def split(frame: bytes) -> list[bytes]:
    """The responses of one (possibly compound) message."""
    out = []
    while True:
        nxt = struct.unpack_from("<I", frame, 20)[0]
        if nxt == 0:
            out.append(frame)
            return out
        out.append(frame[:nxt])
        frame = frame[nxt:]


def assert_oplock_break(msg: bytes, file_id: bytes, level: int) -> None:
    """An OPLOCK_BREAK notification (MS-SMB2 2.2.23.1, sent as 3.3.4.6 says)."""
    assert command_of(msg) == OPLOCK_BREAK, f"command {command_of(msg):#x}, status {rawsmb.status(msg):#x}"
    assert message_id(msg) == BREAK_MESSAGE_ID
    assert rawsmb.status(msg) == 0
    assert flags_of(msg) & FLAG_SERVER_TO_REDIR and not flags_of(msg) & FLAG_ASYNC
    structure_size, got_level, _, _, got_file_id = struct.unpack_from("<HBBI16s", body_of(msg))
    assert (structure_size, got_level, got_file_id) == (24, level, file_id)


# --------------------------------------------------------------------------
# clients


class Client(test_locks.Client):
    """test_locks' raw client (anonymous session on share "pub", SMB 2.1),
    with CREATEs that ask for oplocks and leases."""

    def create(self, name: str, **kw) -> bytes:
        """CREATE answered at once (no interim response); returns the response."""
        resp = self.call(rawsmb.CREATE, create_body(name, **kw))
        assert not flags_of(resp) & FLAG_ASYNC, f"CREATE went async: {rawsmb.status(resp):#x}"
        return resp

    def open_with(self, name: str, oplock: int, **kw) -> bytes:
        """CREATE that must succeed at once; returns the FileId."""
        resp = self.create(name, oplock=oplock, **kw)
        assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
        return file_id_of(resp)

    def start_create(self, name: str, **kw) -> tuple[int, int]:
        """CREATE that must wait: its interim STATUS_PENDING. Returns (MessageId, AsyncId)."""
        mid = self.send(rawsmb.CREATE, create_body(name, **kw))
        interim = self.recv()
        assert (message_id(interim), rawsmb.status(interim)) == (mid, STATUS_PENDING), hex(rawsmb.status(interim))
        aid = async_id(interim)
        assert aid != 0
        assert rawsmb.credits_granted(interim) >= 1
        return mid, aid

    def final(self, mid: int, aid: int) -> bytes:
        """The next message, which must be the final response of async request `mid`."""
        resp = self.recv()
        assert message_id(resp) == mid, f"got message {message_id(resp):#x} (command {command_of(resp):#x})"
        assert async_id(resp) == aid
        return resp

    def assert_nothing_pending(self) -> None:
        """An ECHO sent now is answered before anything else arrives: no break,
        no final response was queued for this connection."""
        mid = self.send(rawsmb.ECHO, rawsmb.echo_body())
        resp = self.recv()
        assert (command_of(resp), message_id(resp)) == (rawsmb.ECHO, mid), (
            f"expected the ECHO response, got command {command_of(resp):#x} message {message_id(resp):#x}"
        )


# MS-SMB2 2.2.3 Capabilities
CAP_LEASING, CAP_LARGE_MTU, CAP_DIRECTORY_LEASING = 0x02, 0x04, 0x20


class Smb311Client(Client):
    """The same over SMB 3.1.1 with a chosen ClientGuid and the capabilities
    leases need: LEASING, and DIRECTORY_LEASING, without which the server
    leases no directory (MS-SMB2 3.3.5.4)."""

    def __init__(self, srv, client_guid: bytes, capabilities: int = CAP_LEASING | CAP_LARGE_MTU | CAP_DIRECTORY_LEASING):
        self.s = rawsmb.connect(srv.host, srv.port)
        body = bytearray(rawsmb.negotiate_body([0x0311], [rawsmb.preauth_context()]))
        struct.pack_into("<I16s", body, 8, capabilities, client_guid)  # Capabilities, ClientGuid
        self.s.sendall(rawsmb.frame(rawsmb.header(rawsmb.NEGOTIATE, 0, credit_request=64) + bytes(body)))
        resp = rawsmb.recv_message(self.s)
        assert rawsmb.status(resp) == 0
        assert struct.unpack_from("<H", resp, rawsmb.HEADER_SIZE + 4)[0] == 0x0311
        # MS-SMB2 2.2.4: the response's Capabilities, after SecurityMode,
        # DialectRevision, NegotiateContextCount and ServerGuid.
        self.server_capabilities = struct.unpack_from("<I", resp, rawsmb.HEADER_SIZE + 24)[0]
        self.sid, self.mid = rawsmb.anonymous_logon(self.s, 1)
        self.tid = rawsmb.tree_connect(self.s, self.mid, self.sid, rf"\\{srv.host}\pub")
        self.mid += 1


def start_guest_server(server_factory, **limits):
    srv = server_factory.start([("pub", False)], security=Security(guest_shares={"pub"}, limits=limits))
    (srv.share_path / "f.txt").write_bytes(CONTENT)
    return srv


@pytest.fixture
def srv(server_factory):
    return start_guest_server(server_factory)


@pytest.fixture
def clients(srv):
    a, b = Client(srv), Client(srv)
    yield a, b
    a.close()
    b.close()


def batch_held_and_second_create_waiting(a: Client, b: Client) -> tuple[bytes, int, int]:
    """A holds a batch oplock on f.txt; B's CREATE waits while A is told to
    break to level II. Returns (A's FileId, B's MessageId, B's AsyncId)."""
    resp = a.create("f.txt", oplock=LEVEL_BATCH)
    assert rawsmb.status(resp) == 0
    assert oplock_level_of(resp) == LEVEL_BATCH
    fa = file_id_of(resp)
    mid, aid = b.start_create("f.txt", oplock=LEVEL_BATCH)
    assert_oplock_break(a.recv(), fa, LEVEL_II)
    return fa, mid, aid


# --------------------------------------------------------------------------
# oplocks


def test_batch_oplock_break_to_level_two_lets_the_waiting_create_go_on(clients):
    a, b = clients
    fa, mid, aid = batch_held_and_second_create_waiting(a, b)
    # Until A acknowledges, B's CREATE stays pending (B's connection is served meanwhile).
    b.assert_nothing_pending()
    ack = a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_II))
    assert rawsmb.status(ack) == 0
    assert struct.unpack_from("<HB", body_of(ack)) == (24, LEVEL_II)
    assert body_of(ack)[8:24] == fa
    final = b.final(mid, aid)
    assert rawsmb.status(final) == 0
    assert oplock_level_of(final) == LEVEL_II
    assert rawsmb.credits_granted(final) == 0  # the credits came with the interim response
    assert file_id_of(final) != fa
    # Both work with the file; no further breaks went to A.
    assert rawsmb.status(b.call(rawsmb.READ, rawsmb.read_body(file_id_of(final), 0, len(CONTENT)))) == 0
    a.assert_nothing_pending()


def test_holder_closing_instead_of_acknowledging_completes_the_waiting_create(clients):
    a, b = clients
    fa, mid, aid = batch_held_and_second_create_waiting(a, b)
    assert rawsmb.status(a.call(CLOSE, close_body(fa))) == 0
    final = b.final(mid, aid)
    assert rawsmb.status(final) == 0
    assert oplock_level_of(final) == LEVEL_BATCH  # the file is B's alone now
    # Acknowledging a break for a closed handle is refused.
    assert rawsmb.status(a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_II))) == STATUS_FILE_CLOSED


def test_unacknowledged_break_times_out_and_a_late_ack_is_refused(server_factory):
    srv = start_guest_server(server_factory, oplock_break_timeout_secs=1)
    a, b = Client(srv), Client(srv)
    try:
        started = time.monotonic()
        fa, mid, aid = batch_held_and_second_create_waiting(a, b)
        # A never answers: the CREATE completes by itself once the timeout passes.
        final = b.final(mid, aid)
        waited = time.monotonic() - started
        assert rawsmb.status(final) == 0
        assert oplock_level_of(final) == LEVEL_II  # A's open is still there: no write caching
        assert 0.9 <= waited < 8, f"the CREATE waited {waited:.2f} s with a 1 s break timeout"
        # The break is over: A's oplock went to none; acknowledging it now is a protocol error.
        assert rawsmb.status(a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_II))) == STATUS_INVALID_OPLOCK_PROTOCOL
        assert rawsmb.status(a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_NONE))) == STATUS_INVALID_OPLOCK_PROTOCOL
    finally:
        a.close()
        b.close()
    assert "not acknowledged" in srv.log_tail()


def test_write_by_another_open_breaks_level_two_to_none_without_waiting(clients, srv):
    a, b = clients
    resp = a.create("f.txt", oplock=LEVEL_II)
    assert (rawsmb.status(resp), oplock_level_of(resp)) == (0, LEVEL_II)
    fa = file_id_of(resp)
    resp = b.create("f.txt")  # no oplock asked; opening alone breaks nothing
    assert (rawsmb.status(resp), oplock_level_of(resp)) == (0, LEVEL_NONE)
    fb = file_id_of(resp)
    a.assert_nothing_pending()
    # B's write is answered at once (not async), and A is told: level II to none.
    resp = b.call(WRITE, write_body(fb, 0, b"WRITTEN"))
    assert rawsmb.status(resp) == 0 and not flags_of(resp) & FLAG_ASYNC
    assert_oplock_break(a.recv(), fa, LEVEL_NONE)
    assert (srv.share_path / "f.txt").read_bytes().startswith(b"WRITTEN")
    # A break from level II needs no acknowledgement: one is a protocol error.
    assert rawsmb.status(a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_NONE))) == STATUS_INVALID_OPLOCK_PROTOCOL
    # A second write breaks nothing more.
    assert rawsmb.status(b.call(WRITE, write_body(fb, 0, b"AGAIN"))) == 0
    a.assert_nothing_pending()


def test_open_refused_by_share_modes_sends_no_break_to_an_exclusive_holder(clients):
    a, b = clients
    resp = a.create("f.txt", oplock=LEVEL_EXCLUSIVE, share=SHARE_NONE)
    assert (rawsmb.status(resp), oplock_level_of(resp)) == (0, LEVEL_EXCLUSIVE)
    fa = file_id_of(resp)
    resp = b.create("f.txt", oplock=LEVEL_BATCH)  # answered at once, not pending
    assert rawsmb.status(resp) == STATUS_SHARING_VIOLATION
    # No break reached A, and none is under way.
    a.assert_nothing_pending()
    assert rawsmb.status(a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_II))) == STATUS_INVALID_OPLOCK_PROTOCOL


def test_cancel_of_a_create_waiting_for_a_break(clients):
    a, b = clients
    fa, mid, aid = batch_held_and_second_create_waiting(a, b)
    b.send(CANCEL, struct.pack("<HH", 4, 0), async_id=aid)
    final = b.final(mid, aid)
    assert rawsmb.status(final) == STATUS_CANCELLED
    # The break itself is still A's to acknowledge; it wakes nobody.
    ack = a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_II))
    assert (rawsmb.status(ack), body_of(ack)[2]) == (0, LEVEL_II)
    b.assert_nothing_pending()


def test_compound_create_query_close_waits_for_the_break_then_runs_the_rest(clients):
    a, b = clients
    resp = a.create("f.txt", oplock=LEVEL_BATCH)
    assert oplock_level_of(resp) == LEVEL_BATCH
    fa = file_id_of(resp)
    # Related CREATE + QUERY_INFO + CLOSE (MS-SMB2 3.2.4.1.4): FileId all ones after the CREATE.
    chained = b"\xff" * 16
    parts = [
        (rawsmb.CREATE, create_body("f.txt", oplock=LEVEL_BATCH), 0),
        (QUERY_INFO, query_standard_info_body(chained), FLAG_RELATED),
        (CLOSE, close_body(chained), FLAG_RELATED),
    ]
    first_mid = b.mid
    mids = [first_mid + i for i in range(len(parts))]
    b.mid += len(parts)
    message = b""
    for i, (command, body, flags) in enumerate(parts):
        msg = rawsmb.header(command, mids[i], credit_request=8, session_id=b.sid, tree_id=b.tid, flags=flags) + body
        if i < len(parts) - 1:
            msg += b"\0" * (-len(msg) % 8)
            msg = msg[:20] + struct.pack("<I", len(msg)) + msg[24:]  # NextCommand
        message += msg
    b.s.sendall(rawsmb.frame(message))
    # The CREATE waits (interim response); the rest of the chain waits behind it.
    interim = split(b.recv())
    assert [(message_id(r), rawsmb.status(r)) for r in interim] == [(mids[0], STATUS_PENDING)]
    aid = async_id(interim[0])
    assert_oplock_break(a.recv(), fa, LEVEL_II)
    b.assert_nothing_pending()
    assert rawsmb.status(a.call(OPLOCK_BREAK, oplock_ack_body(fa, LEVEL_II))) == 0
    # Now all three complete, with success.
    answers: dict[int, bytes] = {}
    while len(answers) < 3:
        for r in split(b.recv()):
            assert message_id(r) in mids and message_id(r) not in answers, f"unexpected message {message_id(r):#x}"
            answers[message_id(r)] = r
    create, query, close = (answers[m] for m in mids)
    assert (async_id(create), rawsmb.status(create), oplock_level_of(create)) == (aid, 0, LEVEL_II)
    assert rawsmb.status(query) == 0
    # The QUERY_INFO ran on the handle the CREATE opened: its FileStandardInformation.
    out_offset, out_length = struct.unpack_from("<HI", body_of(query), 2)
    assert out_length == 24
    _allocation, end_of_file, _links, delete_pending, is_dir = struct.unpack_from("<QQIBB", query, out_offset)
    assert (end_of_file, delete_pending, is_dir) == (len(CONTENT), 0, 0)
    assert rawsmb.status(close) == 0
    # The CLOSE of the chain closed the handle its CREATE opened.
    assert rawsmb.status(b.call(rawsmb.READ, rawsmb.read_body(file_id_of(create), 0, 1))) == STATUS_FILE_CLOSED


# --------------------------------------------------------------------------
# leases


def test_lease_rwh_break_to_rh_and_acknowledgement_errors(srv):
    key_a, key_b = uuid.uuid4().bytes, uuid.uuid4().bytes
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        resp = a.create("f.txt", oplock=LEVEL_LEASE, contexts=lease_context(key_a, R | W | H))
        assert rawsmb.status(resp) == 0
        assert lease_of(resp) == (key_a, R | W | H, 0, 1)  # a new lease: epoch 0 + 1
        # Another client, its own lease key: A is told to give up write caching.
        mid, aid = b.start_create("f.txt", oplock=LEVEL_LEASE, contexts=lease_context(key_b, R | W | H))
        brk = a.recv()
        assert command_of(brk) == OPLOCK_BREAK and message_id(brk) == BREAK_MESSAGE_ID and rawsmb.status(brk) == 0
        size, epoch, flags, key, current, new = struct.unpack_from("<HHI16sII", body_of(brk))
        assert (size, flags, key, current, new) == (44, LEASE_BREAK_ACK_REQUIRED, key_a, R | W | H, R | H)
        assert epoch == 2
        b.assert_nothing_pending()  # B's CREATE still waits for the acknowledgement
        ack = a.call(OPLOCK_BREAK, lease_ack_body(key_a, R | H))
        assert rawsmb.status(ack) == 0
        size, _, _, key, state = struct.unpack_from("<HHI16sI", body_of(ack))
        assert (size, key, state) == (36, key_a, R | H)
        final = b.final(mid, aid)
        assert rawsmb.status(final) == 0
        assert lease_of(final) == (key_b, R | H, 0, 1)  # RH, no break in progress, a new lease's epoch
        # Nothing is breaking now; and a key this client never used is unknown.
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(key_a, R | H))) == STATUS_UNSUCCESSFUL
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(uuid.uuid4().bytes, R))) == STATUS_OBJECT_NAME_NOT_FOUND
        # B's key belongs to B's client GUID, not A's.
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(key_b, R))) == STATUS_OBJECT_NAME_NOT_FOUND
        a.assert_nothing_pending()
    finally:
        a.close()
        b.close()


def rename_body(file_id: bytes, new_name: str) -> bytes:
    """MS-SMB2 2.2.39 SET_INFO, FILE / FileRenameInformation (10) with
    MS-FSCC 2.4.37 FILE_RENAME_INFORMATION_TYPE_2 (no replace, no root)."""
    name = new_name.encode("utf-16-le")
    info = struct.pack("<B7xQI", 0, 0, len(name)) + name
    return struct.pack("<HBBIHHI16s", 33, 1, 10, len(info), rawsmb.HEADER_SIZE + 32, 0, 0, file_id) + info


def test_rename_waits_until_other_leases_give_up_handle_caching(srv):
    key_a = uuid.uuid4().bytes
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        resp = a.create("f.txt", oplock=LEVEL_LEASE, contexts=lease_context(key_a, R | H))
        assert lease_of(resp) == (key_a, R | H, 0, 1)
        fb = b.open_with("f.txt", LEVEL_NONE, access=READ_WRITE | DELETE)
        a.assert_nothing_pending()
        # B's rename waits (interim STATUS_PENDING) while A is asked to close cached handles.
        mid = b.send(SET_INFO, rename_body(fb, "g.txt"))
        interim = b.recv()
        assert (message_id(interim), rawsmb.status(interim)) == (mid, STATUS_PENDING)
        aid = async_id(interim)
        assert lease_break_of(a.recv()) == (2, LEASE_BREAK_ACK_REQUIRED, key_a, R | H, R)
        b.assert_nothing_pending()
        assert (srv.share_path / "f.txt").exists()
        # A keeps its open but gives up handle caching: the rename goes on.
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(key_a, R))) == 0
        assert rawsmb.status(b.final(mid, aid)) == 0
        assert (srv.share_path / "g.txt").read_bytes() == CONTENT
        assert not (srv.share_path / "f.txt").exists()
    finally:
        a.close()
        b.close()


DELETE_ON_CLOSE = 0x00001000  # MS-SMB2 2.2.13 CreateOptions
READ_ATTRIBUTES = 0x00000080


def delete_on_close_waiting(a: Smb311Client, b: Smb311Client) -> tuple[bytes, bytes, bytes, int, int]:
    """A holds an RH lease on f.txt; B opens it delete-on-close (answered at
    once: A is told to give up handle caching) and closes it: B's CLOSE
    waits (interim STATUS_PENDING). Returns (A's lease key, A's FileId,
    B's FileId, the CLOSE's MessageId and AsyncId)."""
    key_a = uuid.uuid4().bytes
    resp = a.create("f.txt", oplock=LEVEL_LEASE, contexts=lease_context(key_a, R | H))
    assert lease_of(resp) == (key_a, R | H, 0, 1)
    fa = file_id_of(resp)
    fb = b.open_with("f.txt", LEVEL_NONE, access=DELETE | READ_ATTRIBUTES, options=NON_DIRECTORY_FILE | DELETE_ON_CLOSE)
    assert lease_break_of(a.recv()) == (2, LEASE_BREAK_ACK_REQUIRED, key_a, R | H, R)
    mid = b.send(CLOSE, close_body(fb))
    interim = b.recv()
    assert (message_id(interim), rawsmb.status(interim)) == (mid, STATUS_PENDING), hex(rawsmb.status(interim))
    return key_a, fa, fb, mid, async_id(interim)


def close_waits_for_handle_caching(a: Smb311Client, b: Smb311Client, share_path) -> None:
    """B's CLOSE of its delete-on-close handle is answered once A gives up
    handle caching; the file goes with A's own handle afterwards."""
    key_a, fa, _, mid, aid = delete_on_close_waiting(a, b)
    b.assert_nothing_pending()
    # A gives up handle caching and keeps its open: B's close is answered.
    assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(key_a, R))) == 0
    assert rawsmb.status(b.final(mid, aid)) == 0
    assert (share_path / "f.txt").exists()
    assert rawsmb.status(a.call(CLOSE, close_body(fa))) == 0
    assert not (share_path / "f.txt").exists()


def test_close_that_deletes_waits_until_other_leases_give_up_handle_caching(srv):
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        close_waits_for_handle_caching(a, b, srv.share_path)
    finally:
        a.close()
        b.close()


def test_a_cancelled_close_that_deletes_is_answered_as_done_with_its_handle_closed(srv):
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        key_a, fa, fb, mid, aid = delete_on_close_waiting(a, b)
        b.send(CANCEL, struct.pack("<HH", 4, 0), async_id=aid)
        assert rawsmb.status(b.final(mid, aid)) == 0
        # The handle was closed before the wait: nothing of it is left.
        assert rawsmb.status(b.call(QUERY_INFO, query_standard_info_body(fb))) == STATUS_FILE_CLOSED
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(key_a, R))) == 0
        assert rawsmb.status(a.call(CLOSE, close_body(fa))) == 0
        assert not (srv.share_path / "f.txt").exists()
    finally:
        a.close()
        b.close()


def test_a_close_that_deletes_is_answered_after_the_break_timeout_when_nobody_acknowledges(server_factory):
    srv = start_guest_server(server_factory, oplock_break_timeout_secs=1)
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        started = time.monotonic()
        _, fa, _, mid, aid = delete_on_close_waiting(a, b)
        assert rawsmb.status(b.final(mid, aid)) == 0
        waited = time.monotonic() - started
        assert 0.9 <= waited < 8, f"the CLOSE waited {waited:.2f} s with a 1 s break timeout"
        assert rawsmb.status(a.call(CLOSE, close_body(fa))) == 0
        assert not (srv.share_path / "f.txt").exists()
    finally:
        a.close()
        b.close()


def lease_break_of(msg: bytes) -> tuple[int, int, bytes, int, int]:
    """(epoch, flags, key, current, new) of a LEASE_BREAK notification (MS-SMB2 2.2.23.2)."""
    assert command_of(msg) == OPLOCK_BREAK and message_id(msg) == BREAK_MESSAGE_ID, hex(command_of(msg))
    size, epoch, flags, key, current, new = struct.unpack_from("<HHI16sII", body_of(msg))
    assert size == 44
    return epoch, flags, key, current, new


def directory_leased(srv, a: Smb311Client, name: str) -> bytes:
    """A opens directory `name` asking RWH; it is granted RH (no write caching
    on a directory). Returns the lease key."""
    key = uuid.uuid4().bytes
    resp = a.create(
        name, oplock=LEVEL_LEASE, contexts=lease_context(key, R | W | H), access=LIST_DIRECTORY, options=DIRECTORY_FILE
    )
    assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
    assert lease_of(resp) == (key, R | H, 0, 1)
    return key


def test_directory_lease_breaks_when_another_client_creates_a_file_in_it(srv):
    (srv.share_path / "d").mkdir()
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        dir_key = directory_leased(srv, a, "d")
        # A's own new file names the directory's lease as its parent: A's
        # cached listing stays right, so nothing is broken.
        resp = a.create(r"d\mine.txt", oplock=LEVEL_LEASE, contexts=lease_context(uuid.uuid4().bytes, R | W | H, parent=dir_key))
        assert rawsmb.status(resp) == 0
        assert lease_of(resp)[1:3] == (R | W | H, LEASE_FLAG_PARENT_LEASE_KEY_SET)
        a.assert_nothing_pending()
        # B creates a file there: its CREATE does not wait, and A's lease goes to none.
        resp = b.create(r"d\new.txt")
        assert rawsmb.status(resp) == 0
        assert lease_break_of(a.recv()) == (2, LEASE_BREAK_ACK_REQUIRED, dir_key, R | H, 0)
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(dir_key, 0))) == 0
        # A second change while the lease holds nothing sends nothing.
        assert rawsmb.status(b.call(CLOSE, close_body(file_id_of(resp)))) == 0
        assert rawsmb.status(b.create(r"d\other.txt")) == 0
        a.assert_nothing_pending()
    finally:
        a.close()
        b.close()


def test_directory_lease_breaks_when_a_write_in_it_is_closed(srv):
    (srv.share_path / "d").mkdir()
    (srv.share_path / "d" / "f.txt").write_bytes(CONTENT)
    a, b = Smb311Client(srv, uuid.uuid4().bytes), Smb311Client(srv, uuid.uuid4().bytes)
    try:
        dir_key = directory_leased(srv, a, "d")
        fb = b.open_with(r"d\f.txt", LEVEL_NONE)
        a.assert_nothing_pending()  # opening an existing file changes no listing
        # The write shows in the listing (size, time) when its handle closes, as on Windows.
        assert rawsmb.status(b.call(WRITE, write_body(fb, 0, b"more data than before\n" * 4))) == 0
        a.assert_nothing_pending()
        assert rawsmb.status(b.call(CLOSE, close_body(fb))) == 0
        assert lease_break_of(a.recv()) == (2, LEASE_BREAK_ACK_REQUIRED, dir_key, R | H, 0)
        assert rawsmb.status(a.call(OPLOCK_BREAK, lease_ack_body(dir_key, 0))) == 0
        # The lease comes back when A asks again: RH, one epoch further.
        resp = a.create(
            "d", oplock=LEVEL_LEASE, contexts=lease_context(dir_key, R | W | H), access=LIST_DIRECTORY, options=DIRECTORY_FILE
        )
        assert rawsmb.status(resp) == 0
        assert lease_of(resp) == (dir_key, R | H, 0, 3)
    finally:
        a.close()
        b.close()


def test_leases_on_directories_are_not_granted_over_smb21(srv):
    """SMB 2.1 offers no DIRECTORY_LEASING: a lease asked on a directory gets nothing."""
    (srv.share_path / "d").mkdir()
    a = Client(srv)
    try:
        v1 = struct.pack("<16sIIQ", uuid.uuid4().bytes, R | H, 0, 0)  # MS-SMB2 2.2.13.2.8
        ctx = struct.pack("<IHHHHI", 0, 16, 4, 0, 24, len(v1)) + b"RqLs" + b"\0" * 4 + v1
        resp = a.create("d", oplock=LEVEL_LEASE, contexts=ctx, access=LIST_DIRECTORY, options=DIRECTORY_FILE)
        assert rawsmb.status(resp) == 0
        assert oplock_level_of(resp) == LEVEL_NONE
        assert b"RqLs" not in create_contexts(resp)
    finally:
        a.close()


def test_leases_on_directories_are_not_granted_to_a_client_that_did_not_announce_directory_leasing(srv):
    """MS-SMB2 3.3.5.4: DIRECTORY_LEASING is answered only to a client that
    announced it; on a connection without it a lease asked on a directory
    is ignored (OplockLevel NONE, no lease context), as over 2.1, while a
    file's lease is granted as ever."""
    (srv.share_path / "d").mkdir()
    a = Smb311Client(srv, uuid.uuid4().bytes, capabilities=CAP_LEASING | CAP_LARGE_MTU)
    b = Smb311Client(srv, uuid.uuid4().bytes)
    try:
        assert a.server_capabilities & CAP_DIRECTORY_LEASING == 0, hex(a.server_capabilities)
        assert b.server_capabilities & CAP_DIRECTORY_LEASING, hex(b.server_capabilities)
        resp = a.create(
            "d", oplock=LEVEL_LEASE, contexts=lease_context(uuid.uuid4().bytes, R | H), access=LIST_DIRECTORY, options=DIRECTORY_FILE
        )
        assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
        assert oplock_level_of(resp) == LEVEL_NONE
        assert b"RqLs" not in create_contexts(resp)
        key = uuid.uuid4().bytes
        resp = a.create(r"d\f.txt", oplock=LEVEL_LEASE, contexts=lease_context(key, R | W | H))
        assert rawsmb.status(resp) == 0
        assert lease_of(resp)[:2] == (key, R | W | H)
        # The client that announced it gets its directory lease.
        directory_leased(srv, b, "d")
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------------
# encryption


class BreakTap:
    """Takes oplock breaks out of an smbprotocol connection's receive path
    (smbprotocol has no handler for them), noting whether each came sealed."""

    def __init__(self, conn):
        from smbprotocol.connection import SMB2TransformHeader

        self.conn = conn
        self.breaks: list[tuple[bool, int, bytes]] = []  # (encrypted, transform session id, message)
        self.arrived = threading.Event()
        recv = conn.transport.recv

        def tapped(timeout):
            while True:
                msg = recv(timeout)
                if not msg:
                    return msg
                encrypted = msg[:4] == b"\xfdSMB"
                plain, session = msg, 0
                if encrypted:
                    th = SMB2TransformHeader()
                    th.unpack(msg)
                    plain, session = conn._decrypt(th), th["session_id"].get_value()
                if message_id(plain) != BREAK_MESSAGE_ID:
                    return msg
                self.breaks.append((encrypted, session, plain))
                self.arrived.set()

        # The worker looks the method up on each message: from the next
        # message on, breaks go through here.
        conn.transport.recv = tapped


class OplockBreakAck:
    """An OPLOCK_BREAK acknowledgement smbprotocol can send (it has none)."""

    COMMAND = OPLOCK_BREAK

    def __init__(self, file_id: bytes, level: int):
        self.body = oplock_ack_body(file_id, level)

    def pack(self) -> bytes:
        return self.body


def test_break_to_an_encrypting_session_is_sealed(server_factory):
    from smbprotocol import Dialects
    from smbprotocol.connection import Connection
    from smbprotocol.open import (
        CreateDisposition,
        CreateOptions,
        FilePipePrinterAccessMask,
        ImpersonationLevel,
        Open,
        RequestedOplockLevel,
        ShareAccess,
    )
    from smbprotocol.session import Session
    from smbprotocol.tree import TreeConnect

    # Share "pub": encrypted for SMB 3 sessions that can (the holder, alice),
    # in clear for the anonymous SMB 2.1 opener.
    srv = server_factory.start(
        [("pub", False)], security=Security(guest_shares={"pub"}, share_encryption={"pub": "desired"})
    )
    (srv.share_path / "f.txt").write_bytes(CONTENT)
    conn = Connection(uuid.uuid4(), srv.host, srv.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=30)
    b = None
    try:
        session = Session(conn, srv.user, srv.password, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        tree = TreeConnect(session, rf"\\{srv.host}\pub")
        tree.connect()
        assert tree.encrypt_data
        tap = BreakTap(conn)
        holder = Open(tree, "f.txt")
        holder.create(
            ImpersonationLevel.Impersonation,
            FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
            0,
            ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
            CreateDisposition.FILE_OPEN,
            CreateOptions.FILE_NON_DIRECTORY_FILE,
            oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_BATCH,
        )
        assert holder.oplock_level == LEVEL_BATCH
        b = Client(srv)
        mid, aid = b.start_create("f.txt", oplock=LEVEL_BATCH)
        assert tap.arrived.wait(10), "no break reached the holder"
        [(encrypted, transform_session, plain)] = tap.breaks
        assert encrypted, "the break to an encrypting session went in clear"
        assert transform_session == session.session_id
        assert_oplock_break(plain, holder.file_id, LEVEL_II)
        # The acknowledgement (sealed by smbprotocol) is answered, and B goes on.
        request = conn.send(OplockBreakAck(holder.file_id, LEVEL_II), sid=session.session_id, tid=tree.tree_connect_id)
        resp = conn.receive(request, timeout=30)
        assert resp["status"].get_value() == 0
        assert resp["data"].get_value()[2] == LEVEL_II
        final = b.final(mid, aid)
        assert (rawsmb.status(final), oplock_level_of(final)) == (0, LEVEL_II)
        holder.close()
    finally:
        if b is not None:
            b.close()
        conn.disconnect(close=True)
