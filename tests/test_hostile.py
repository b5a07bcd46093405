"""Hostile input against the real nimbus binary, over raw sockets and
smbprotocol: each attack gets the spec's error or a disconnect, while a
normal smbprotocol client (the bystander) keeps writing and reading its
own file on the same server, unaffected and with its data intact. Then
every configurable limit of `[limits]`, each exercised at a small value."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import rawsmb
from conftest import Security, require_tool
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBConnectionClosed, SMBException, SMBResponseException
from smbprotocol.file_info import FileInformationClass, InfoType
from smbprotocol.header import NtStatus
from smbprotocol.open import CreateDisposition, SMB2QueryInfoRequest
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect
from test_share_browsing import STATUS_PIPE_DISCONNECTED, bind_pdu, open_pipe, pdu, server_info_request
from test_smbprotocol import assert_undercharged_read_refused, ensure_credits, open_directory, open_file, smb_tree

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 30
MIB = 1024 * 1024
STATUS_TOO_MANY_OPENED_FILES = 0xC000011F
STATUS_ACCOUNT_LOCKED_OUT = 0xC0000234
STATUS_INSUFFICIENT_RESOURCES = 0xC000009A

# Short timeouts so that the slow-client tests finish quickly.
HOSTILE_LIMITS = {"unauthenticated_timeout_secs": 4, "frame_timeout_secs": 3}


class Bystander:
    """A normal client writing and reading back its own file in a loop."""

    def __init__(self, server):
        self.server = server
        self.rounds = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        try:
            with smb_tree(self.server) as (_conn, _session, tree):
                name = f"bystander-{uuid.uuid4().hex}.bin"
                while not self.stop.is_set():
                    data = os.urandom(256 * 1024)
                    f = open_file(tree, name)
                    f.write(data, 0)
                    back = f.read(0, len(data))
                    f.close()
                    if back != data:
                        raise AssertionError("bystander read back different bytes")
                    on_disk = (self.server.share_path / name).read_bytes()
                    if hashlib.sha256(on_disk).digest() != hashlib.sha256(data).digest():
                        raise AssertionError("bystander's file on disk differs")
                    self.rounds += 1
        except BaseException as e:  # reported by check()
            self.errors.append(e)

    def check(self, min_rounds: int = 2):
        """The bystander made progress since the last check and failed nothing."""
        start = self.rounds
        deadline = time.monotonic() + TIMEOUT
        while self.rounds < start + min_rounds and not self.errors and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not self.errors, f"the normal client failed: {self.errors[0]!r}"
        assert self.rounds >= start + min_rounds, "the normal client made no progress"


@pytest.fixture
def hostile(server_factory):
    srv = server_factory.start(security=Security(limits=HOSTILE_LIMITS))
    b = Bystander(srv)
    b.thread.start()
    b.check(1)
    yield srv, b
    b.stop.set()
    b.thread.join(TIMEOUT)
    assert srv.alive(), "the server died"
    assert "panicked" not in srv.log_tail(2000)
    b_errors = b.errors
    assert not b_errors, f"the normal client failed: {b_errors[0]!r}"


def raw(srv, **kw):
    return contextlib.closing(rawsmb.connect(srv.host, srv.port, **kw))


def settle():
    """Lets the server notice connections closed just before (the harness's
    own start-up probe counts against the connection limits until then)."""
    time.sleep(0.5)


# --------------------------------------------------------------------------
# malformed frames


def test_garbage_bytes_disconnect(hostile):
    srv, bystander = hostile
    with raw(srv) as s:  # not even a frame header
        s.sendall(b"\x42" + os.urandom(4095))
        assert rawsmb.is_closed(s)
    with raw(srv) as s:  # a frame of random bytes
        s.sendall(rawsmb.frame(os.urandom(2048)))
        assert rawsmb.is_closed(s)
    with raw(srv) as s:  # a valid NEGOTIATE, then a frame of random bytes
        rawsmb.negotiate(s)
        s.sendall(rawsmb.frame(rawsmb.PROTOCOL_ID + os.urandom(200)))
        assert rawsmb.is_closed(s)
    bystander.check()


def test_truncated_headers_disconnect(hostile):
    srv, bystander = hostile
    for message in (rawsmb.PROTOCOL_ID + b"\x40\x00", rawsmb.header(rawsmb.NEGOTIATE, 0)[:63]):
        with raw(srv) as s:
            s.sendall(rawsmb.frame(message))
            assert rawsmb.is_closed(s), f"{len(message)}-byte header accepted"
    with raw(srv) as s:  # a frame header cut short, then nothing
        s.sendall(b"\x00\x00")
        assert rawsmb.is_closed(s, timeout=HOSTILE_LIMITS["frame_timeout_secs"] + 5)
    bystander.check()


def test_4gib_and_oversized_length_prefix_closed_before_the_body(hostile):
    srv, bystander = hostile
    for prefix in (b"\xff\xff\xff\xff", b"\x00\xff\xff\xff", struct.pack(">I", 8 * MIB + 64 * 1024 + 1)):
        with raw(srv) as s:
            started = time.monotonic()
            s.sendall(prefix)
            assert rawsmb.is_closed(s, timeout=5), f"length prefix {prefix.hex()} not refused"
            assert time.monotonic() - started < 3, "the server waited for the body of an oversized frame"
    assert "refused frame" in srv.log_tail()
    bystander.check()


def test_negotiate_with_10000_contexts(hostile):
    srv, bystander = hostile
    contexts = [rawsmb.preauth_context() for _ in range(10_000)]
    message = rawsmb.header(rawsmb.NEGOTIATE, 0) + rawsmb.negotiate_body([0x0311], contexts)
    assert len(message) > 400_000
    with raw(srv) as s:
        s.sendall(rawsmb.frame(message))
        # MS-SMB2 3.3.5.4: more than one PREAUTH_INTEGRITY context is
        # STATUS_INVALID_PARAMETER.
        resp = rawsmb.recv_message(s)
        assert rawsmb.status(resp) == rawsmb.STATUS_INVALID_PARAMETER
    bystander.check()


# --------------------------------------------------------------------------
# credits and message ids


def test_credit_charge_beyond_the_credits_held_disconnects(hostile):
    srv, bystander = hostile
    with raw(srv) as s:
        resp = rawsmb.negotiate(s, credit_request=1)
        assert rawsmb.credits_granted(resp) == 1
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, 1, credit_charge=64) + rawsmb.echo_body()))
        assert rawsmb.is_closed(s)
    assert "outside the credit window" in srv.log_tail()
    bystander.check()


def test_too_small_credit_charge_for_a_read_is_invalid_parameter(hostile):
    srv, bystander = hostile
    assert_undercharged_read_refused(srv, charge=2)
    bystander.check()


def test_message_id_replay_disconnects(hostile):
    srv, bystander = hostile
    with raw(srv) as s:
        rawsmb.negotiate(s, credit_request=8)
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, 1) + rawsmb.echo_body()))
        assert rawsmb.status(rawsmb.recv_message(s)) == rawsmb.STATUS_SUCCESS
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, 1) + rawsmb.echo_body()))
        assert rawsmb.is_closed(s)
    with smb_tree(srv) as (conn, session, _tree):  # and in a signed session
        conn.echo(sid=session.session_id, timeout=TIMEOUT)
        replayed = conn.sequence_window["low"] - 1
        conn.sequence_window["low"] = replayed
        # MS-SMB2 3.3.5.2.3: a message id already used ends the connection;
        # there is no answer to wait for.
        with pytest.raises(SMBConnectionClosed):
            conn.echo(sid=session.session_id, timeout=5)
    assert f"message id {replayed} (charge 1) outside the credit window" in srv.log_tail()
    bystander.check()


# --------------------------------------------------------------------------
# ids that belong to someone else


def test_session_id_of_another_connection_is_refused(hostile):
    srv, bystander = hostile
    with smb_tree(srv) as (_conn, session, tree):
        with raw(srv) as s:
            rawsmb.negotiate(s, credit_request=4)
            path = rf"\\{srv.host}\{srv.share}"
            s.sendall(rawsmb.frame(rawsmb.header(rawsmb.TREE_CONNECT, 1, session_id=session.session_id) + rawsmb.tree_connect_body(path)))
            resp = rawsmb.recv_message(s)
            assert rawsmb.status(resp) == rawsmb.STATUS_USER_SESSION_DELETED
        # The session it tried to use is untouched.
        f = open_file(tree, "still-mine.txt")
        f.write(b"ok", 0)
        f.close()
    bystander.check()


def test_tree_id_of_another_session_is_refused(hostile):
    srv, bystander = hostile
    with smb_tree(srv) as (conn, session, tree):
        other = Session(conn, srv.user, srv.password, require_encryption=False, auth_protocol="ntlm")
        other.connect()
        # smbprotocol only sends on trees it knows for the session.
        other.tree_connect_table[tree.tree_connect_id] = tree
        f, (msg, recv) = open_file(tree, "not-yours.txt", send=False)
        request = conn.send(msg, other.session_id, tree.tree_connect_id)
        with pytest.raises(SMBResponseException) as excinfo:
            recv(request)
        assert excinfo.value.status == NtStatus.STATUS_NETWORK_NAME_DELETED
        assert not (srv.share_path / "not-yours.txt").exists()
    bystander.check()


def test_file_id_named_on_another_session_leaves_its_own_open(hostile):
    """MS-SMB2 3.3.5.12 (READ), 3.3.5.20 (QUERY_INFO): an open is looked up
    in the OpenTable of the request's session only. Another session of the
    same connection naming it is answered FILE_CLOSED, and the open, its
    session and its tree stay as they were: a READ and a CLOSE on its own
    session succeed."""
    srv, bystander = hostile
    with smb_tree(srv) as (conn, session, tree):
        (srv.share_path / "session-a.txt").write_bytes(b"mine")
        f = open_file(tree, "session-a.txt", disposition=CreateDisposition.FILE_OPEN)
        other = Session(conn, srv.user, srv.password, require_encryption=False, auth_protocol="ntlm")
        other.connect()
        other_tree = TreeConnect(other, rf"\\{srv.host}\{srv.share}")
        other_tree.connect()
        # A READ and a QUERY_INFO of session A's FileId, sent on session B.
        read, _ = f.read(0, 4, send=False)
        query = SMB2QueryInfoRequest()
        query["info_type"] = InfoType.SMB2_0_INFO_FILE
        query["file_info_class"] = FileInformationClass.FILE_STANDARD_INFORMATION
        query["output_buffer_length"] = 4096
        query["file_id"] = f.file_id
        for msg in (read, query):
            request = conn.send(msg, other.session_id, other_tree.tree_connect_id)
            with pytest.raises(SMBResponseException) as excinfo:
                conn.receive(request)
            assert excinfo.value.status == NtStatus.STATUS_FILE_CLOSED, hex(excinfo.value.status)
        assert f.read(0, 4) == b"mine"
        f.close()
        other_tree.disconnect()
        other.disconnect()
    bystander.check()


# --------------------------------------------------------------------------
# offsets and lengths


def test_write_past_2_pow_63_is_refused(hostile):
    srv, bystander = hostile
    with smb_tree(srv) as (_conn, _session, tree):
        f = open_file(tree, "far.bin")
        for offset in (2**63, 2**63 - 1, 2**64 - 16):
            with pytest.raises(SMBResponseException) as excinfo:
                f.write(b"0123456789abcdef", offset)
            assert excinfo.value.status in (NtStatus.STATUS_INVALID_PARAMETER, NtStatus.STATUS_DISK_FULL), hex(excinfo.value.status)
        f.close()
    assert (srv.share_path / "far.bin").stat().st_size == 0
    bystander.check()


def test_read_of_8mib_plus_1_is_invalid_parameter(hostile):
    srv, bystander = hostile
    with smb_tree(srv) as (conn, session, tree):
        (srv.share_path / "eight.bin").write_bytes(os.urandom(8 * MIB + 1))
        f = open_file(tree, "eight.bin", CreateDisposition.FILE_OPEN)
        ensure_credits(conn, session, 130)
        msg, recv = f.read(0, 8 * MIB, send=False)
        msg["length"] = 8 * MIB + 1
        request = conn.send(msg, session.session_id, tree.tree_connect_id)
        with pytest.raises(SMBResponseException) as excinfo:
            recv(request)
        assert excinfo.value.status == NtStatus.STATUS_INVALID_PARAMETER
        assert len(f.read(0, 8 * MIB)) == 8 * MIB
        f.close()
    bystander.check()


# --------------------------------------------------------------------------
# slow clients


def test_slow_loris_one_byte_a_second_is_closed(hostile):
    srv, bystander = hostile
    message = rawsmb.frame(rawsmb.header(rawsmb.NEGOTIATE, 0) + rawsmb.negotiate_body([0x0210]))
    with raw(srv) as s:
        started = time.monotonic()
        closed = False
        for b in message:
            try:
                s.sendall(bytes([b]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if rawsmb.is_closed(s, timeout=1):
                closed = True
                break
        assert closed, "a client sending one byte a second kept its connection"
        assert time.monotonic() - started < HOSTILE_LIMITS["frame_timeout_secs"] + 4
    assert "frame not complete within" in srv.log_tail()
    bystander.check()


def test_the_frame_timeout_covers_header_and_body_together(hostile):
    # A header completed just inside the frame timeout gives the body no
    # fresh allowance: the frame as a whole must arrive within it, counted
    # from its first byte (before, the body got a timeout of its own, and a
    # trickling client held the connection twice as long).
    srv, bystander = hostile
    message = rawsmb.frame(rawsmb.header(rawsmb.NEGOTIATE, 0) + rawsmb.negotiate_body([0x0210]))
    limit = HOSTILE_LIMITS["frame_timeout_secs"]
    with raw(srv) as s:
        started = time.monotonic()
        s.sendall(message[:3])
        time.sleep(limit - 0.7)
        s.sendall(message[3:5])  # the header's last byte and one of the body
        assert rawsmb.is_closed(s, timeout=limit + 3), "the body got a frame timeout of its own"
        # The bug closed about limit + 2.3 s after the first byte.
        assert time.monotonic() - started < limit + 1.8
    assert "frame not complete within" in srv.log_tail()
    bystander.check()


def test_client_that_never_logs_on_is_closed(hostile):
    srv, bystander = hostile
    with raw(srv) as s:
        rawsmb.negotiate(s, credit_request=64)
        started = time.monotonic()
        message_id = 1
        closed = False
        while time.monotonic() - started < HOSTILE_LIMITS["unauthenticated_timeout_secs"] + 5:
            try:  # complete requests, but never a logon
                s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, message_id) + rawsmb.echo_body()))
                rawsmb.recv_message(s)
            except (ConnectionError, OSError):
                closed = True
                break
            message_id += 1
            time.sleep(0.5)
        assert closed, "an unauthenticated connection outlived limits.unauthenticated_timeout_secs"
    assert "no session logged on within" in srv.log_tail()
    bystander.check()


# --------------------------------------------------------------------------
# each limit at a small value


def test_max_frame_bytes_sets_io_sizes_and_refuses_longer_frames(server_factory):
    srv = server_factory.start(security=Security(limits={"max_frame_bytes": 256 * 1024, "max_connection_memory_bytes": MIB}))
    conn = Connection(uuid.uuid4(), srv.host, srv.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    assert conn.max_read_size == conn.max_write_size == conn.max_transact_size == 192 * 1024
    conn.disconnect()
    with raw(srv) as s:
        s.sendall(struct.pack(">I", 256 * 1024 + 1))
        assert rawsmb.is_closed(s, timeout=5)
    with smb_tree(srv) as (_conn, _session, tree):  # transfers still work, in smaller pieces
        data = os.urandom(MIB)
        piece = 192 * 1024
        f = open_file(tree, "pieces.bin")
        for off in range(0, MIB, piece):
            f.write(data[off : off + piece], off)
        assert b"".join(f.read(off, min(piece, MIB - off)) for off in range(0, MIB, piece)) == data
        f.close()


def test_max_credits_bounds_the_grant(server_factory):
    srv = server_factory.start(security=Security(limits={"max_credits": 32}))
    with raw(srv) as s:
        resp = rawsmb.negotiate(s, credit_request=1000)
        held = rawsmb.credits_granted(resp)
        for message_id in range(1, 40):
            if held == 0:
                break
            s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, message_id, credit_request=1000) + rawsmb.echo_body()))
            held += rawsmb.credits_granted(rawsmb.recv_message(s)) - 1
            assert held <= 32
        # The window is 32 ids wide: an id beyond it is refused.
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, 40 + 32) + rawsmb.echo_body()))
        assert rawsmb.is_closed(s)


def test_max_outstanding_requests_queues_without_loss(server_factory):
    srv = server_factory.start(security=Security(limits={"max_outstanding_requests": 2}))
    with raw(srv) as s:
        rawsmb.negotiate(s, credit_request=100)
        # 50 requests sent before any response is read: the server reads
        # them two at a time and answers every one.
        s.sendall(b"".join(rawsmb.frame(rawsmb.header(rawsmb.ECHO, i) + rawsmb.echo_body()) for i in range(1, 51)))
        ids = set()
        for _ in range(50):
            resp = rawsmb.recv_message(s)
            assert rawsmb.status(resp) == rawsmb.STATUS_SUCCESS
            ids.add(struct.unpack_from("<Q", resp, 24)[0])
        assert ids == set(range(1, 51))


def test_max_connection_memory_serves_big_reads_one_by_one(server_factory):
    # Room for one 1 MiB frame and its response at a time: pipelined 1 MiB
    # reads and writes all complete, just not at once.
    limits = {"max_frame_bytes": MIB + 64 * 1024, "max_connection_memory_bytes": 2 * MIB + 128 * 1024}
    srv = server_factory.start(security=Security(limits=limits))
    with smb_tree(srv) as (conn, session, tree):
        data = os.urandom(4 * MIB)
        f = open_file(tree, "budget.bin")
        for i in range(4):
            f.write(data[i * MIB : (i + 1) * MIB], i * MIB)
        ensure_credits(conn, session, 64)
        requests = []
        for i in range(4):
            msg, recv = f.read(i * MIB, MIB, send=False)
            requests.append((conn.send(msg, session.session_id, tree.tree_connect_id), recv))
        assert b"".join(recv(r) for r, recv in requests) == data
        f.close()


# The reader stops: requests held until their answers are sent. A raw
# client with a small receive buffer asks for an 8 MiB READ and does not
# read the answer: the server's writer blocks inside it, so every request
# read after it stays held (answers go out in order) until the client reads.

STUCK_READ = 8 * MIB
CLIENT_RCVBUF = 64 * 1024
FILE_CREATE = 2


def create_new_body(name: str) -> bytes:
    """MS-SMB2 2.2.13 SMB2 CREATE Request: FILE_CREATE (a new file or
    failure), read access; otherwise as rawsmb.create_body."""
    n = name.encode("utf-16-le")
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, 0x80000000, 0, 7, FILE_CREATE, 0x40, rawsmb.HEADER_SIZE + 56, len(n), 0, 0) + n


def socket_buffers_hold_less_than(n: int, s: socket.socket) -> None:
    """The premise of these tests: the server's send buffer (at most
    tcp_wmem's maximum; nimbus does not set SO_SNDBUF) and the client's
    receive buffer cannot hold an answer of n bytes."""
    wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    rcvbuf = s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    assert wmem_max + rcvbuf < n, f"socket buffers of {wmem_max} + {rcvbuf} bytes can hold an {n}-byte answer"


class StalledClient:
    """An anonymous raw client on a guest share that pipelines requests and
    reads answers only when told to. (Anonymous sessions stay under the
    30 s logon deadline: enough for these tests.)"""

    def __init__(self, srv, big_file: str):
        self.s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RCVBUF)  # before connect: fixes the window
        self.s.settimeout(TIMEOUT)
        self.s.connect((srv.host, srv.port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socket_buffers_hold_less_than(STUCK_READ, self.s)
        rawsmb.negotiate(self.s, credit_request=1000)
        self.sid, mid = rawsmb.anonymous_logon(self.s, 1)
        self.tid = rawsmb.tree_connect(self.s, mid, self.sid, rf"\\{srv.host}\{srv.share}")
        self.file_id = rawsmb.open_file(self.s, mid + 1, self.sid, self.tid, big_file)
        self.next_id = mid + 2

    def send(self, command: int, body: bytes, charge: int = 1) -> int:
        mid = self.next_id
        self.next_id += charge
        self.s.sendall(rawsmb.frame(rawsmb.header(command, mid, credit_charge=charge, session_id=self.sid, tree_id=self.tid) + body))
        return mid

    def read(self, length: int) -> int:
        """A READ of `length` bytes at offset 0 (charge: one credit per 64 KiB)."""
        return self.send(rawsmb.READ, rawsmb.read_body(self.file_id, 0, length), charge=-(-length // 65536))

    def stuck_read(self) -> int:
        """An 8 MiB READ, once the server has started sending its answer (its
        header has arrived): from then on the writer is inside that answer,
        which the socket buffers cannot hold."""
        mid = self.read(STUCK_READ)
        self.stuck_length = struct.unpack(">I", rawsmb.recv_exact(self.s, 4))[0]
        head = rawsmb.recv_exact(self.s, rawsmb.HEADER_SIZE)
        assert (rawsmb.status(head), struct.unpack_from("<Q", head, 24)[0]) == (rawsmb.STATUS_SUCCESS, mid)
        return mid

    def unstick(self) -> None:
        """Reads the rest of the stuck READ's answer: 16 bytes of READ
        response and the 8 MiB (MS-SMB2 2.2.20)."""
        assert self.stuck_length == rawsmb.HEADER_SIZE + 16 + STUCK_READ
        left = memoryview(bytearray(self.stuck_length - rawsmb.HEADER_SIZE))
        while left:
            n = self.s.recv_into(left)
            assert n, "closed by the server"
            left = left[n:]

    def answers(self, count: int) -> dict[int, int]:
        """The next `count` answers: message id -> status."""
        out = {}
        for _ in range(count):
            resp = rawsmb.recv_message(self.s)
            out[struct.unpack_from("<Q", resp, 24)[0]] = rawsmb.status(resp)
        return out

    def close(self) -> None:
        self.s.close()


def wait_for(predicate, what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {timeout} s"
        time.sleep(0.02)


def stays_false(predicate, seconds: float = 1.0) -> bool:
    """The "not yet" half: absence can only be watched for a while. A bounded
    poll for 1 s, against a server that handles a CREATE in microseconds;
    the test then shows the same request done once the client reads."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return False
        time.sleep(0.02)
    return not predicate()


def guest_server_with(server_factory, limits):
    srv = server_factory.start(security=Security(guest_shares={"data"}, limits=limits))
    with open(srv.share_path / "big.bin", "wb") as f:
        f.truncate(STUCK_READ)
    return srv


def test_max_outstanding_requests_stops_the_reader(server_factory):
    """limits.max_outstanding_requests = 4: with the stuck READ, two ECHOs
    and a CREATE outstanding, the next CREATE is not read until an answer
    has been sent."""
    srv = guest_server_with(server_factory, {"max_outstanding_requests": 4})
    fourth, fifth = srv.share_path / "fourth", srv.share_path / "fifth"
    c = StalledClient(srv, "big.bin")
    try:
        c.stuck_read()
        ids = [c.send(rawsmb.ECHO, rawsmb.echo_body()) for _ in range(2)]
        ids += [c.send(rawsmb.CREATE, create_new_body("fourth")), c.send(rawsmb.CREATE, create_new_body("fifth"))]
        wait_for(fourth.exists, "the 4th outstanding request")
        assert stays_false(fifth.exists), "a 5th request was read while 4 were outstanding"
        c.unstick()
        assert c.answers(4) == dict.fromkeys(ids, rawsmb.STATUS_SUCCESS)
        assert fifth.exists()
    finally:
        c.close()


@pytest.mark.parametrize("budget", [16 * MIB + 64 * 1024, None])
def test_max_connection_memory_bytes_stops_the_reader(server_factory, budget):
    """The budget counts each READ's answer (its credit charge in 64 KiB
    units) from when the request is read until the answer is sent. With the
    least budget the default frame size allows (8 MiB + 64 KiB frame, 8 MiB
    answer), the stuck READ and nine 1 MiB READs need at least 17 MiB: the
    reader must stop before the CREATE that follows them, while a CREATE
    after the first 9 MiB is done. None: the default 32 MiB budget, the
    control, where the same CREATE is done without the client reading."""
    srv = guest_server_with(server_factory, {} if budget is None else {"max_connection_memory_bytes": budget})
    first, last = srv.share_path / "first", srv.share_path / "last"
    c = StalledClient(srv, "big.bin")
    try:
        c.stuck_read()
        ids = [c.read(MIB), c.send(rawsmb.CREATE, create_new_body("first"))]
        ids += [c.read(MIB) for _ in range(8)]
        ids.append(c.send(rawsmb.CREATE, create_new_body("last")))
        wait_for(first.exists, "a CREATE within the budget")
        if budget is None:
            wait_for(last.exists, "the CREATE after 17 MiB with the default budget")
        else:
            assert stays_false(last.exists), "requests beyond the memory budget were read"
        c.unstick()
        assert c.answers(len(ids)) == dict.fromkeys(ids, rawsmb.STATUS_SUCCESS)
        assert last.exists()
    finally:
        c.close()


def test_connection_limits_total_and_per_address(server_factory):
    limits = {"max_connections": 3, "max_connections_per_address": 3}
    srv = server_factory.start(security=Security(limits=limits))
    settle()
    with contextlib.ExitStack() as stack:
        for _ in range(3):
            stack.enter_context(smb_tree(srv))
        # A fourth from the same address is refused by the limit per
        # address; one from another address by the total, since every
        # connection has logged on and none can be closed to make room.
        with raw(srv, source="127.0.0.1") as s:
            assert rawsmb.is_closed(s, timeout=5), "a 4th connection from one address was accepted"
        with raw(srv, source="127.0.0.2") as s:
            assert rawsmb.is_closed(s, timeout=5), "a 4th connection was accepted"
    # Closed connections give their places back.
    settle()
    with raw(srv, source="127.0.0.1") as s:
        rawsmb.negotiate(s)
    log = srv.log_tail()
    assert "limits.max_connections_per_address" in log and "all logged on (limits.max_connections)" in log


def test_the_total_limit_closes_a_connection_not_logged_on_never_a_logged_on_one(server_factory):
    srv = server_factory.start(security=Security(limits={"max_connections": 3, "max_connections_per_address": 3}))
    settle()
    with contextlib.ExitStack() as stack:
        trees = [stack.enter_context(smb_tree(srv)) for _ in range(2)]
        waiting = stack.enter_context(raw(srv, source="127.0.1.1"))
        rawsmb.negotiate(waiting)
        # Full. A newcomer takes the place of the one not logged on.
        newcomer = stack.enter_context(raw(srv, source="127.0.2.1"))
        rawsmb.negotiate(newcomer)
        assert rawsmb.is_closed(waiting, timeout=5), "nothing was closed to make room"
        # All logged on but the newcomer, which is now the only one that
        # can go: a third newcomer pushes it out, and the sessions stay.
        third = stack.enter_context(raw(srv, source="127.0.3.1"))
        rawsmb.negotiate(third)
        assert rawsmb.is_closed(newcomer, timeout=5)
        for _conn, _session, tree in trees:
            open_directory(tree, "").close()
    assert "closed 1 connection(s) that had not logged on" in srv.log_tail()


def test_unauthenticated_connections_limit(server_factory):
    srv = server_factory.start(security=Security(limits={"max_unauthenticated_connections": 2}))
    settle()
    with raw(srv) as a, raw(srv) as b:
        rawsmb.negotiate(a)
        rawsmb.negotiate(b)
        # A third takes the place of the oldest.
        with raw(srv) as c:
            rawsmb.negotiate(c)
            assert rawsmb.is_closed(a, timeout=5)
            assert not rawsmb.is_closed(b, timeout=0.5)
    settle()
    # Logged-on connections do not count.
    with smb_tree(srv) as (_conn, _session, _tree), raw(srv) as a, raw(srv) as b:
        rawsmb.negotiate(a)
        rawsmb.negotiate(b)
        assert not rawsmb.is_closed(a, timeout=0.5)
    assert "limits.max_unauthenticated_connections" in srv.log_tail()


def test_an_idle_flood_from_other_networks_does_not_lock_a_client_out(server_factory):
    """Idle connections from ten addresses, each in its own /24, fill the
    limit of connections not logged on and are renewed as they are closed.
    A client from 127.0.0.1 still logs on, and keeps its session while the
    flood goes on; the flood's turnover is logged in a line or two, not
    one per connection."""
    limit = 20
    srv = server_factory.start(security=Security(limits={"max_unauthenticated_connections": limit}))
    settle()
    sources = [f"127.0.{n}.1" for n in range(1, 11)]
    with contextlib.ExitStack() as stack:

        def flood(count: int) -> list[socket.socket]:
            made = []
            for i in range(count):
                s = stack.enter_context(raw(srv, source=sources[i % len(sources)]))
                rawsmb.negotiate(s)  # answered: admitted
                made.append(s)
            return made

        first = flood(limit)
        # Full of the flood: a client from another network still gets in
        # and logs on; the flood's oldest connection made room.
        conn, _session, tree = stack.enter_context(smb_tree(srv))
        assert rawsmb.is_closed(first[0], timeout=5)
        # The flood renews itself three times over; each of its newcomers
        # pushes out one of its own, never the logged-on client.
        flood(3 * limit)
        open_directory(tree, "").close()
        closed = sum(rawsmb.is_closed(s, timeout=0.2) for s in first)
        assert closed == limit, f"{closed} of the flood's first {limit} connections were closed"
    log = srv.log_tail(200_000)
    lines = [line for line in log.splitlines() if "that had not logged on, to admit new ones" in line]
    assert 1 <= len(lines) <= 2, lines


class IdleFlood:
    """Keeps `size` idle TCP connections open to a server from `sources`
    (round robin), opening a new one whenever one is closed, until
    stopped. Bounded: it stops by itself after `lifetime` seconds."""

    def __init__(self, host: str, port: int, sources: list[str], size: int, lifetime: float = 120):
        self.target, self.sources, self.size = (host, port), sources, size
        self.deadline = time.monotonic() + lifetime
        self.opened = self.closed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> IdleFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def wait_for(self, opened: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.opened < opened and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
        assert self.opened >= opened, f"the flood opened {self.opened} connections, not {opened}: {self.errors[:3]}"

    def _run(self) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        live: set[socket.socket] = set()
        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                while len(live) < self.size:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.setblocking(False)
                    try:
                        s.bind((self.sources[self.opened % len(self.sources)], 0))
                        s.connect_ex(self.target)
                    except OSError as e:
                        self.errors.append(repr(e))
                        s.close()
                        break
                    sel.register(s, selectors.EVENT_READ)
                    live.add(s)
                    self.opened += 1
                for key, _ in sel.select(timeout=0.1):
                    s = key.fileobj
                    try:
                        gone = not s.recv(4096)
                    except BlockingIOError:
                        gone = False
                    except OSError:
                        gone = True
                    if gone:
                        sel.unregister(s)
                        s.close()
                        live.discard(s)
                        self.closed += 1
        finally:
            for s in live:
                s.close()
            sel.close()


@pytest.mark.nimbus_only
@require_tool("smbclient", "smbclient")
def test_two_thousand_idle_connections_renewed_as_evicted_do_not_lock_out_smbclient(server_factory, samba_client_conf, tmp_path):
    """2,000 idle connections from ten addresses other than the client's
    (each in its own /24), renewed as fast as the server closes them, fill
    the limit of connections not logged on (512) four times over. smbclient
    from 127.0.0.1 logs on and lists the share in each of five tries, and
    the server's log holds a few lines about it all, not one per
    connection."""
    srv = server_factory.start()
    settle()
    before = len(srv.log_tail(1_000_000).splitlines())
    sources = [f"127.0.{n}.1" for n in range(1, 11)]
    with IdleFlood(srv.host, srv.port, sources, 2000) as flood:
        flood.wait_for(2000)
        for attempt in range(5):
            started = time.monotonic()
            proc = subprocess.run(
                ["smbclient", f"//{srv.host}/{srv.share}", "-p", str(srv.port), "-U", f"{srv.user}%{srv.password}",
                 "-m", "SMB3_11", "--use-kerberos=off", "-s", str(samba_client_conf), "-c", "ls"],
                capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=tmp_path,
            )  # fmt: skip
            took = time.monotonic() - started
            assert proc.returncode == 0, f"try {attempt + 1}: smbclient failed after {took:.1f} s: {proc.stdout}{proc.stderr}"
            print(f"try {attempt + 1}: logged on and listed in {took:.2f} s; the flood had opened {flood.opened}, the server closed {flood.closed}")
        assert flood.closed > 0, "the flood never filled the limit"
        assert not flood.errors, flood.errors[:3]
    log = srv.log_tail(1_000_000).splitlines()[before:]
    assert len(log) < 50, f"{len(log)} log lines for the flood:\n" + "\n".join(log[:60])


def logon(srv, user, password):
    conn = Connection(uuid.uuid4(), srv.host, srv.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        Session(conn, user, password, require_encryption=False, auth_protocol="ntlm").connect()
        return NtStatus.STATUS_SUCCESS
    except SMBResponseException as e:
        return e.status
    except SMBException as e:  # smbprotocol wraps logon failures
        return getattr(e, "status", None) or str(e)
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()


def test_failed_logons_back_off_per_user(server_factory):
    limits = {"max_failed_logons_per_user": 3, "max_failed_logons_per_address": 100, "logon_backoff_secs": 2, "max_logon_backoff_secs": 2}
    srv = server_factory.start(security=Security(limits=limits))
    for _ in range(3):  # the third failure starts the back-off; it is answered before
        assert logon(srv, srv.user, "wrong") == NtStatus.STATUS_LOGON_FAILURE
    # The right password is refused too while the user is backed off.
    result = logon(srv, srv.user, srv.password)
    assert result == STATUS_ACCOUNT_LOCKED_OUT, result
    assert "too many failed logons for this user" in srv.log_tail()
    time.sleep(2.5)
    assert logon(srv, srv.user, srv.password) == NtStatus.STATUS_SUCCESS


def test_failed_logons_back_off_per_address(server_factory):
    limits = {"max_failed_logons_per_user": 100, "max_failed_logons_per_address": 4, "logon_backoff_secs": 2, "max_logon_backoff_secs": 2}
    srv = server_factory.start(security=Security(limits=limits))
    for i in range(4):
        assert logon(srv, f"guess{i}", "wrong") == NtStatus.STATUS_LOGON_FAILURE
    # A backed-off address gets the answer of a wrong password (unlike a
    # locked user name, nothing about the account is told), even with the
    # right one; the log says why.
    assert logon(srv, srv.user, srv.password) == NtStatus.STATUS_LOGON_FAILURE
    assert "too many failed logons for this address" in srv.log_tail()
    time.sleep(2.5)
    assert logon(srv, srv.user, srv.password) == NtStatus.STATUS_SUCCESS


def test_a_thousand_failed_logons_cost_the_log_a_few_lines(server_factory):
    """Password guessing from one address: 1,000 logons with a wrong
    password or an unknown name. The first refusal is logged at once, the
    rest are counted into at most one line per reason and 10 s; the
    address's back-off (which refuses without looking at the password) is
    aggregated the same way. Twice: with the default back-off, and with
    none (every attempt's password checked and refused)."""
    for limits in (None, {"max_failed_logons_per_user": 1_000_000, "max_failed_logons_per_address": 1_000_000}):
        srv = server_factory.start(security=Security(limits=limits) if limits else None)
        thousand_failed_logons_cost_a_few_lines(srv)


def thousand_failed_logons_cost_a_few_lines(srv) -> None:
    before = len(srv.log_tail(1_000_000).splitlines())
    statuses = set()
    started = time.monotonic()
    for i in range(1000):
        user = srv.user if i % 2 else f"guess{i}"
        statuses.add(logon(srv, user, f"wrong-{i}"))
    # A line per reason (at most five: unknown user, wrong password, the
    # user's and the address's back-off, the lock-out) and 10 s: a slow
    # machine that takes longer over the thousand earns those lines, not
    # the thousand a server without the aggregation writes.
    allowed = 12 + 5 * int((time.monotonic() - started) // 10)
    assert statuses <= {NtStatus.STATUS_LOGON_FAILURE, STATUS_ACCOUNT_LOCKED_OUT}, statuses
    lines = srv.log_tail(1_000_000).splitlines()[before:]
    refusals = [line for line in lines if "refused" in line]
    assert refusals, "no refusal was logged"
    assert "logon failure for user" in refusals[0]
    assert len(lines) <= allowed, f"{len(lines)} log lines for 1,000 failed logons:\n" + "\n".join(lines[:40])


def timed_logon(srv, user, password):
    """(status, when the request was sent, when the answer came): the
    server decided in between, on the same monotonic clock."""
    sent = time.monotonic()
    status = logon(srv, user, password)
    return status, sent, time.monotonic()


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def test_failed_logon_back_off_doubles(server_factory):
    """logon_guard.rs: the limit-th failure blocks the user for
    logon_backoff_secs; each failure after that doubles the wait (up to
    max_logon_backoff_secs). A back-off's end is only seen with a logon, and
    each one either counts as a failure or (right password) clears them, so
    the test waits out times taken from the server's answers, then checks
    the next answer. The waits are 2 s and 4 s so that a check meant to
    land inside one has over a second to spare on a loaded machine."""
    base = 2
    limits = {"max_failed_logons_per_user": 2, "max_failed_logons_per_address": 100, "logon_backoff_secs": base, "max_logon_backoff_secs": 4 * base}
    srv = server_factory.start(security=Security(limits=limits))
    assert logon(srv, srv.user, "wrong") == NtStatus.STATUS_LOGON_FAILURE
    status, _, answered = timed_logon(srv, srv.user, "wrong")
    assert status == NtStatus.STATUS_LOGON_FAILURE  # the 2nd failure: blocked for `base` s from now
    assert logon(srv, srv.user, srv.password) == STATUS_ACCOUNT_LOCKED_OUT  # right password, refused
    sleep_until(answered + base + 0.1)
    # The first back-off is over (a wrong password is answered as such, not
    # LOCKED_OUT), and this 3rd failure doubles the wait.
    status, sent, answered = timed_logon(srv, srv.user, "wrong")
    assert status == NtStatus.STATUS_LOGON_FAILURE
    sleep_until(answered + base + 0.4)
    assert logon(srv, srv.user, srv.password) == STATUS_ACCOUNT_LOCKED_OUT, f"the wait did not double: allowed after {base} s"
    # Bounded poll with the right password (a refusal is not counted): it
    # is let in twice `base` after the 3rd failure, before the maximum.
    deadline = answered + 2 * base + 1.5
    while (result := timed_logon(srv, srv.user, srv.password))[0] == STATUS_ACCOUNT_LOCKED_OUT and time.monotonic() < deadline:
        time.sleep(0.1)
    status, _, allowed = result
    assert status == NtStatus.STATUS_SUCCESS, f"still refused {allowed - sent:.1f} s after the 3rd failure"
    assert allowed - sent >= 2 * base
    assert "too many failed logons for this user (limits.max_failed_logons_per_user)" in srv.log_tail()


def test_failed_logons_older_than_the_window_are_forgotten(server_factory):
    limits = {"max_failed_logons_per_user": 2, "max_failed_logons_per_address": 100, "logon_backoff_secs": 30, "failed_logon_window_secs": 2}
    srv = server_factory.start(security=Security(limits=limits))
    # Control: two failures within the window lock a name (here an unknown
    # one, which is answered LOCKED_OUT as well while backed off).
    for _ in range(2):
        assert logon(srv, "mallory", "wrong") == NtStatus.STATUS_LOGON_FAILURE
    assert logon(srv, "mallory", "wrong") == STATUS_ACCOUNT_LOCKED_OUT
    # Two failures further apart than the window: the first is forgotten,
    # so the right password is let in. Letting the window pass is the input
    # here, so this is a sleep, measured from the server's first answer.
    status, _, answered = timed_logon(srv, srv.user, "wrong")
    assert status == NtStatus.STATUS_LOGON_FAILURE
    sleep_until(answered + limits["failed_logon_window_secs"] + 0.3)
    assert logon(srv, srv.user, "wrong") == NtStatus.STATUS_LOGON_FAILURE
    assert logon(srv, srv.user, srv.password) == NtStatus.STATUS_SUCCESS


def test_max_open_files_per_session(server_factory):
    srv = server_factory.start(security=Security(limits={"max_open_files_per_session": 5}))
    with smb_tree(srv) as (_conn, _session, tree):
        opens = [open_file(tree, f"f{i}.txt") for i in range(5)]
        with pytest.raises(SMBResponseException) as excinfo:
            open_file(tree, "f5.txt")
        assert excinfo.value.status == STATUS_TOO_MANY_OPENED_FILES
        opens.pop().close()
        opens.append(open_file(tree, "f5.txt"))
        for f in opens:
            f.close()


def vm_rss(pid: int) -> int:
    """The process's resident memory, in bytes (/proc/<pid>/status VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def share_enum_requests(first_call_id: int, size: int) -> bytes:
    """As many NetrShareEnum (MS-SRVS 3.1.4.8, opnum 15) requests as fit in
    `size` bytes, at level 1 with no server name, no resume handle and no
    preferred length: each ~56-byte request is answered with every share."""
    stub = struct.pack("<IIIIIIII", 0, 1, 1, 0x20000, 0, 0, 0xFFFFFFFF, 0)
    one = len(pdu(0, 3, 0, struct.pack("<IHH", len(stub), 0, 15) + stub))
    return b"".join(pdu(0, 3, first_call_id + i, struct.pack("<IHH", len(stub), 0, 15) + stub) for i in range(size // one))


PIPE_BUDGET_LIMITS = {"max_frame_bytes": MIB + 64 * 1024, "max_connection_memory_bytes": 4 * MIB}


def test_pipes_that_are_never_read_are_bounded_per_session_and_connection(server_factory):
    """A client opens every srvsvc pipe its session may have and writes
    share enumerations to each without reading an answer. What the pipes
    hold counts against the connection's memory budget (4 MiB here): writes
    beyond it fail with STATUS_INSUFFICIENT_RESOURCES, and the server's
    resident memory grows less than 16 MiB (without the budget each of the
    64 pipes holds up to 1 MiB, and it grows by more than 64 MiB).
    Meanwhile another session is served. The 65th pipe is refused
    (max_pipes_per_session, 64 by default); closing the pipes gives their
    share of the budget back."""
    srv = server_factory.start(security=Security(limits=PIPE_BUDGET_LIMITS))
    chunk = share_enum_requests(2, 64 * 1024 - 64)
    with smb_tree(srv) as (conn, session, _tree):
        ipc = TreeConnect(session, rf"\\{srv.host}\IPC$")
        ipc.connect()
        before = vm_rss(srv.process.pid)
        pipes = [open_pipe(ipc) for _ in range(64)]
        ended = []
        for pipe in pipes:
            status = None
            try:
                pipe.write(bind_pdu())
                for _ in range(64):  # 4 MiB of requests: far more than one pipe may queue answers for
                    pipe.write(chunk)
            except SMBResponseException as e:
                status = e.status
            ended.append(status)
        grown = vm_rss(srv.process.pid) - before
        # Per pipe, at most 1 MiB of answers (the pipe closes on its
        # client); across them, the connection's budget.
        assert grown < 16 * MIB, f"resident memory grew by {grown / MIB:.1f} MiB"
        assert set(ended) <= {STATUS_PIPE_DISCONNECTED, STATUS_INSUFFICIENT_RESOURCES}, [hex(s or 0) for s in ended]
        assert ended.count(STATUS_INSUFFICIENT_RESOURCES) >= 56, [hex(s or 0) for s in ended]
        assert "limits.max_connection_memory_bytes" in srv.log_tail()

        # Another client is served meanwhile, pipes and files.
        with smb_tree(srv) as (_c2, other, tree2):
            ipc2 = TreeConnect(other, rf"\\{srv.host}\IPC$")
            ipc2.connect()
            p = open_pipe(ipc2)
            p.write(bind_pdu())
            assert p.read(0, 4280)[2] == 12  # BIND_ACK
            p.write(server_info_request(2))
            assert p.read(0, 4280)[2] == 2  # RESPONSE
            f = open_file(tree2, "served.txt")
            f.write(b"still served", 0)
            assert f.read(0, 12) == b"still served"
            f.close()

        # The session's 65th pipe is refused.
        with pytest.raises(SMBResponseException) as excinfo:
            open_pipe(ipc)
        assert excinfo.value.status == STATUS_INSUFFICIENT_RESOURCES
        assert "limits.max_pipes_per_session" in srv.log_tail()

        # Closed pipes give back what they held: a new pipe is filled to its
        # own 1 MiB again (where the pipe closes on its client), not refused
        # for the budget the others held.
        for pipe in pipes:
            pipe.close()
        again = open_pipe(ipc)
        again.write(bind_pdu())
        assert again.read(0, 4280)[2] == 12  # BIND_ACK
        with pytest.raises(SMBResponseException) as excinfo:
            for _ in range(64):
                again.write(chunk)
        assert excinfo.value.status == STATUS_PIPE_DISCONNECTED
        assert again.read(0, 4280)[2] == 2  # its answers are still there to read


def test_max_compound_requests(server_factory):
    srv = server_factory.start(security=Security(limits={"max_compound_requests": 4}))
    with raw(srv) as s:
        rawsmb.negotiate(s, credit_request=32)

        def chain(n, first_id):
            parts = []
            for i in range(n):
                body = rawsmb.echo_body() + b"\0" * 4  # 8-byte aligned
                nxt = 0 if i == n - 1 else rawsmb.HEADER_SIZE + len(body)
                parts.append(rawsmb.header(rawsmb.ECHO, first_id + i, next_command=nxt) + body)
            return rawsmb.frame(b"".join(parts))

        s.sendall(chain(4, 1))
        assert rawsmb.status(rawsmb.recv_message(s)) == rawsmb.STATUS_SUCCESS
        s.sendall(chain(5, 5))
        assert rawsmb.is_closed(s)
    assert "limits.max_compound_requests" in srv.log_tail()


def test_directory_response_bytes_and_entry_limit(server_factory):
    limits = {"max_directory_response_bytes": 64 * 1024, "max_directory_entries": 1000}
    srv = server_factory.start(security=Security(limits=limits))
    small = srv.share_path / "small"
    small.mkdir()
    names = {f"entry-with-a-long-name-{i:05d}.txt" for i in range(900)}
    for n in names:
        (small / n).touch()
    big = srv.share_path / "big"
    big.mkdir()
    for i in range(1001):
        (big / f"{i}").touch()
    with smb_tree(srv) as (conn, session, tree):
        ensure_credits(conn, session, 32)
        d = open_directory(tree, "small")
        seen = set()
        while True:
            try:
                entries = d.query_directory("*", FileInformationClass.FILE_NAMES_INFORMATION, max_output=MIB)
            except SMBResponseException as e:
                assert e.status == NtStatus.STATUS_NO_MORE_FILES
                break
            batch = {e["file_name"].get_value().decode("utf-16-le") for e in entries}
            # Each entry takes 80 bytes (12 fixed, 64 of name, aligned to 8).
            assert len(batch - {".", ".."}) <= 65536 // 80, "a 1 MiB request got more than the 64 KiB limit allows"
            seen |= batch
        assert seen - {".", ".."} == names
        d.close()
        d = open_directory(tree, "big")
        with pytest.raises(SMBResponseException) as excinfo:
            d.query_directory("*", FileInformationClass.FILE_NAMES_INFORMATION)
        assert excinfo.value.status == STATUS_INSUFFICIENT_RESOURCES
        d.close()
    assert "limits.max_directory_entries" in srv.log_tail()


def test_bad_limits_name_the_key(tmp_path):
    from conftest import run_nimbus

    conf = tmp_path / "bad.toml"
    conf.write_text('[limits]\nmax_frame_bytes = 12\nmax_connections = 2\nmax_connections_per_address = 3\nfrobnicate = 1\n')
    r = run_nimbus("config", "check", str(conf), check=False)
    assert r.returncode != 0
    assert "frobnicate" in r.stderr + r.stdout
    conf.write_text('[limits]\nmax_frame_bytes = 12\nmax_connections = 2\nmax_connections_per_address = 3\n')
    r = run_nimbus("config", "check", str(conf), check=False)
    out = r.stderr + r.stdout
    assert r.returncode != 0
    assert "limits.max_frame_bytes" in out and "131072" in out
    assert "limits.max_connections_per_address" in out
