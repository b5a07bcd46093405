"""The documented policy claims (docs/SECURITY.md, docs/FEATURES.md), end to end against the real binary: FileId
isolation, the logon policy (anonymous, guest, NTLMv1) and downgrade
protection of the NEGOTIATE.

Clients: Python smbprotocol; raw messages (tests/rawsmb.py) for the logons
no library sends (anonymous, NTLMv1, guest without signing); for the
downgrade tests smbprotocol talks through a small loopback proxy that
rewrites its NEGOTIATE request on the way to the server, as a machine in
the middle would.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import struct
import threading
import uuid

import pytest
import rawsmb
import spnego
from conftest import Security
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBException, SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    Open,
    ShareAccess,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

# MS-NLMP 3.3.1 DESL() and NTOWFv1, from pyspnego's NTLM implementation
# (no NTLM library builds an NTLMv1 response any more; the message is built
# here).
from spnego._ntlm_raw.crypto import desl, ntowfv1

TIMEOUT = 30
CLOSE_WAIT = 10  # seconds for the server to close a connection it must close
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE
CONTENT = b"the file's own content\n"

STATUS_MORE_PROCESSING_REQUIRED = 0xC0000016
STATUS_LOGON_FAILURE = 0xC000006D
STATUS_ACCESS_DENIED = 0xC0000022
STATUS_NOT_SUPPORTED = 0xC00000BB
SESSION_FLAG_IS_GUEST = 0x0001
SESSION_FLAG_IS_NULL = 0x0002

GUEST_SHARE = "pub"


# --------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def connection(server, dialect=Dialects.SMB_3_1_1, port=None, logoff=True):
    """An smbprotocol connection; at the end it logs its sessions off
    (unless not `logoff`: a session whose signing key is wrong would wait
    out the timeout for an answer to its LOGOFF) and closes."""
    conn = Connection(uuid.uuid4(), server.host, port or server.port, require_signing=True)
    conn.connect(dialect, timeout=TIMEOUT)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=logoff, timeout=TIMEOUT)


def logon(conn, server) -> Session:
    session = Session(conn, server.user, server.password, require_encryption=False, auth_protocol="ntlm")
    session.connect()
    return session


def tree(session, server, share=None) -> TreeConnect:
    t = TreeConnect(session, rf"\\{server.host}\{share or server.share}")
    t.connect()
    return t


def open_file(t, name) -> Open:
    f = Open(t, name)
    f.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        SHARE_ALL,
        CreateDisposition.FILE_OPEN,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
    )
    return f


def status_of(call) -> int:
    with pytest.raises(SMBResponseException) as excinfo:
        call()
    return excinfo.value.status


def status_name(status: int) -> str:
    for name, value in vars(NtStatus).items():
        if name.startswith("STATUS_") and value == status:
            return name
    return hex(status)


# --------------------------------------------------------------------------
# FileId isolation: an open belongs to its connection, session and tree.
# MS-SMB2 3.3.5.10 (CLOSE) and 3.3.5.12 (READ) look the FileId up in
# Session.OpenTable: another session's or connection's open is not found,
# STATUS_FILE_CLOSED. The spec's table is per session; nimbus, like smbd
# (pytest --target=samba), also refuses an open of another tree of the same
# session with STATUS_FILE_CLOSED.


def use_file_id_elsewhere(f: Open, conn, session, t) -> tuple[int, int]:
    """READ and CLOSE `f`'s FileId sent on (conn, session, t); returns their statuses."""
    statuses = []
    for message, _ in (f.read(0, len(CONTENT), send=False), f.close(send=False)):
        request = conn.send(message, session.session_id, t.tree_connect_id)
        statuses.append(status_of(lambda request=request: conn.receive(request, timeout=TIMEOUT)))
    return statuses[0], statuses[1]


def assert_still_open(f: Open) -> None:
    """The refused CLOSE closed nothing: the owner still reads through its open."""
    assert f.read(0, len(CONTENT)) == CONTENT
    f.close()


def test_file_id_of_another_session_on_the_same_connection(server):
    (server.share_path / "f.txt").write_bytes(CONTENT)
    with connection(server) as conn:
        session_a = logon(conn, server)
        f = open_file(tree(session_a, server), "f.txt")
        session_b = logon(conn, server)  # the same user, another session
        tree_b = tree(session_b, server)
        assert use_file_id_elsewhere(f, conn, session_b, tree_b) == (NtStatus.STATUS_FILE_CLOSED, NtStatus.STATUS_FILE_CLOSED)
        assert_still_open(f)


def test_file_id_of_another_tree_of_the_same_session(server):
    (server.share_path / "f.txt").write_bytes(CONTENT)
    with connection(server) as conn:
        session = logon(conn, server)
        f = open_file(tree(session, server), "f.txt")
        other_tree = tree(session, server)  # the same share, connected again
        assert use_file_id_elsewhere(f, conn, session, other_tree) == (NtStatus.STATUS_FILE_CLOSED, NtStatus.STATUS_FILE_CLOSED)
        assert_still_open(f)


def test_file_id_of_another_connection(server):
    (server.share_path / "f.txt").write_bytes(CONTENT)
    with connection(server) as conn_a, connection(server) as conn_b:
        f = open_file(tree(logon(conn_a, server), server), "f.txt")
        session_b = logon(conn_b, server)
        tree_b = tree(session_b, server)
        assert use_file_id_elsewhere(f, conn_b, session_b, tree_b) == (NtStatus.STATUS_FILE_CLOSED, NtStatus.STATUS_FILE_CLOSED)
        assert_still_open(f)


# --------------------------------------------------------------------------
# logon policy: anonymous, guest, NTLMv1 (raw SESSION_SETUP over SMB 2.1,
# NTLMSSP tokens without SPNEGO around them)


def session_setup(s, message_id: int, session_id: int, token: bytes) -> tuple[int, int, int, bytes]:
    """One SESSION_SETUP; returns (status, session id, session flags, security buffer)."""
    s.sendall(rawsmb.frame(rawsmb.header(rawsmb.SESSION_SETUP, message_id, session_id=session_id, credit_request=8) + rawsmb.session_setup_body(token)))
    resp = rawsmb.recv_message(s)
    # MS-SMB2 2.2.6: StructureSize, SessionFlags, SecurityBufferOffset, SecurityBufferLength.
    flags, offset, length = struct.unpack_from("<HHH", resp, rawsmb.HEADER_SIZE + 2)
    return rawsmb.status(resp), rawsmb.session_id(resp), flags, resp[offset : offset + length]


def tree_connect_status(s, message_id: int, session_id: int, path: str) -> int:
    s.sendall(rawsmb.frame(rawsmb.header(rawsmb.TREE_CONNECT, message_id, session_id=session_id, credit_request=8) + rawsmb.tree_connect_body(path)))
    return rawsmb.status(rawsmb.recv_message(s))


# MS-NLMP 2.2.2.5 NEGOTIATE flags
NTLMSSP_NEGOTIATE_UNICODE = 0x00000001
NTLMSSP_REQUEST_TARGET = 0x00000004
NTLMSSP_NEGOTIATE_NTLM = 0x00000200
NTLMSSP_NEGOTIATE_ALWAYS_SIGN = 0x00008000
NTLMSSP_NEGOTIATE_EXTENDED_SESSIONSECURITY = 0x00080000


def ntlm_negotiate(flags: int) -> bytes:
    """MS-NLMP 2.2.1.1 NEGOTIATE_MESSAGE, no domain or workstation."""
    return b"NTLMSSP\0" + struct.pack("<II", 1, flags) + b"\0" * 16


def ntlm_authenticate(flags: int, lm: bytes, nt: bytes, user: str, domain: str = "", workstation: str = "CLIENT") -> bytes:
    """MS-NLMP 2.2.1.3 AUTHENTICATE_MESSAGE without Version and MIC: six
    (length, max length, offset) fields, the flags, then the payload."""
    payload = [lm, nt, domain.encode("utf-16-le"), user.encode("utf-16-le"), workstation.encode("utf-16-le"), b""]
    fields, offset = b"", 8 + 4 + 6 * 8 + 4
    for item in payload:
        fields += struct.pack("<HHI", len(item), len(item), offset)
        offset += len(item)
    return b"NTLMSSP\0" + struct.pack("<I", 3) + fields + struct.pack("<I", flags) + b"".join(payload)


def server_challenge(challenge_message: bytes) -> bytes:
    """MS-NLMP 2.2.1.2 CHALLENGE_MESSAGE: ServerChallenge at offset 24."""
    assert challenge_message[:12] == b"NTLMSSP\0\x02\0\0\0", challenge_message[:12]
    return challenge_message[24:32]


def raw_logon(srv, first: bytes, answer) -> tuple[int, int, int, socket.socket]:
    """NEGOTIATE SMB 2.1, then SESSION_SETUP with `first`, then with
    answer(CHALLENGE). Returns (status, session id, session flags, socket);
    the caller closes the socket."""
    s = rawsmb.connect(srv.host, srv.port)
    rawsmb.negotiate(s, credit_request=64)
    status, sid, _, challenge = session_setup(s, 1, 0, first)
    assert status == STATUS_MORE_PROCESSING_REQUIRED, hex(status)
    status, sid, flags, _ = session_setup(s, 2, sid, answer(challenge))
    return status, sid, flags, s


def ntlmv2_logon(srv, user: str, password: str):
    """A logon by pyspnego's NTLM client (NTLMv2)."""
    ctx = spnego.client(user, password, hostname="127.0.0.1", service="cifs", protocol="ntlm")
    return raw_logon(srv, ctx.step(), ctx.step)


def ntlmv1_logon(srv, user: str, password: str, extended_session_security: bool):
    """A logon with an NTLMv1 response (24-byte NtChallengeResponse, MS-NLMP
    3.3.1), computed from the right password: plain NTLMv1, or NTLMv1 with
    extended session security ("NTLM2 session response")."""
    flags = NTLMSSP_NEGOTIATE_UNICODE | NTLMSSP_REQUEST_TARGET | NTLMSSP_NEGOTIATE_NTLM | NTLMSSP_NEGOTIATE_ALWAYS_SIGN
    if extended_session_security:
        flags |= NTLMSSP_NEGOTIATE_EXTENDED_SESSIONSECURITY

    def answer(challenge: bytes) -> bytes:
        nonce = server_challenge(challenge)
        if extended_session_security:
            client_challenge = os.urandom(8)
            nt = desl(ntowfv1(password), hashlib.md5(nonce + client_challenge).digest()[:8])
            lm = client_challenge + b"\0" * 16
        else:
            nt = lm = desl(ntowfv1(password), nonce)
        assert len(nt) == 24
        return ntlm_authenticate(flags, lm, nt, user)

    return raw_logon(srv, ntlm_negotiate(flags), answer)


def anonymous_logon(srv):
    """An anonymous NTLMSSP logon (MS-NLMP 3.2.5.1.2: NTLMSSP_NEGOTIATE_ANONYMOUS,
    empty user name and responses), as rawsmb.anonymous_logon sends it."""
    flags = 0x00088A05  # UNICODE, REQUEST_TARGET, NTLM, ANONYMOUS, ALWAYS_SIGN, EXTENDED_SESSIONSECURITY
    return raw_logon(srv, ntlm_negotiate(0x00088207), lambda _challenge: ntlm_authenticate(flags, b"", b"", "", workstation=""))


@pytest.fixture
def guest_server(server_factory):
    """"data" for alice only, GUEST_SHARE with guest_ok."""
    return server_factory.start([("data", False), (GUEST_SHARE, False)], security=Security(guest_shares={GUEST_SHARE}))


@pytest.mark.nimbus_only  # smbd allows null sessions by default
def test_anonymous_logon_refused_without_a_guest_share(server):
    status, _, _, s = anonymous_logon(server)
    s.close()
    assert status == STATUS_LOGON_FAILURE, status_name(status)
    assert "anonymous logon refused (guest access is off)" in server.log_tail()


def test_anonymous_logon_reaches_only_guest_shares(guest_server):
    srv = guest_server
    status, sid, flags, s = anonymous_logon(srv)
    with contextlib.closing(s):
        assert status == rawsmb.STATUS_SUCCESS, status_name(status)
        assert flags == SESSION_FLAG_IS_NULL
        assert tree_connect_status(s, 3, sid, rf"\\{srv.host}\data") == STATUS_ACCESS_DENIED
        assert tree_connect_status(s, 4, sid, rf"\\{srv.host}\{GUEST_SHARE}") == rawsmb.STATUS_SUCCESS
    assert 'guest refused on share "data"' in srv.log_tail()


def test_unknown_user_refused_without_a_guest_share(server):
    status, _, _, s = ntlmv2_logon(server, "mallory", "any password")
    s.close()
    assert status == STATUS_LOGON_FAILURE, status_name(status)


def test_unknown_user_is_a_guest_that_reaches_only_guest_shares(guest_server):
    srv = guest_server
    status, sid, flags, s = ntlmv2_logon(srv, "mallory", "any password")
    with contextlib.closing(s):
        assert status == rawsmb.STATUS_SUCCESS, status_name(status)
        assert flags == SESSION_FLAG_IS_GUEST
        # A guest cannot sign (no session key): its requests go unsigned.
        assert tree_connect_status(s, 3, sid, rf"\\{srv.host}\data") == STATUS_ACCESS_DENIED
        assert tree_connect_status(s, 4, sid, rf"\\{srv.host}\{GUEST_SHARE}") == rawsmb.STATUS_SUCCESS
    assert 'guest refused on share "data"' in srv.log_tail()
    # The user alice is no guest: a wrong password is still a failure, not a guest logon.
    status, _, _, s = ntlmv2_logon(srv, srv.user, "not-the-password")
    s.close()
    assert status == STATUS_LOGON_FAILURE, status_name(status)


@pytest.mark.parametrize("extended_session_security", [False, True], ids=["ntlmv1", "ntlmv1-ess"])
def test_ntlmv1_refused(server, extended_session_security):
    # The harness logs on with NTLMv2 first, so the refusal below is NTLMv1's.
    status, _, _, s = ntlmv2_logon(server, server.user, server.password)
    s.close()
    assert status == rawsmb.STATUS_SUCCESS, status_name(status)

    status, _, _, s = ntlmv1_logon(server, server.user, server.password, extended_session_security)
    s.close()
    # As Samba's smbd ("ntlm auth = ntlmv2-only", its default) answers.
    assert status == STATUS_LOGON_FAILURE, status_name(status)
    if server.kind == "nimbus":
        assert "NTLMv1 response (only NTLMv2 is accepted)" in server.log_tail()


# --------------------------------------------------------------------------
# downgrade protection: a NEGOTIATE rewritten on its way to the server


class TamperingProxy:
    """A loopback TCP proxy for one client connection: passes every byte
    through, except that the client's first message (its NEGOTIATE) goes
    through `tamper` first. Records which side closed first."""

    def __init__(self, server, tamper):
        self.server = server
        self.tamper = tamper
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.tampered = threading.Event()
        self.closed = threading.Event()
        self.closed_by: str | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _closed(self, side: str) -> None:
        with self._lock:
            if self.closed_by is None:
                self.closed_by = side
        self.closed.set()

    def _run(self) -> None:
        self.listener.settimeout(TIMEOUT)
        client, _ = self.listener.accept()
        upstream = socket.create_connection((self.server.host, self.server.port), timeout=TIMEOUT)
        self._sockets += [client, upstream]
        client.settimeout(None)
        upstream.settimeout(None)
        try:
            negotiate = rawsmb.recv_message(client)
            upstream.sendall(rawsmb.frame(self.tamper(negotiate)))
            self.tampered.set()
        except (OSError, ConnectionError):
            self._closed("client")
            return
        threading.Thread(target=self._pump, args=(upstream, client, "server"), daemon=True).start()
        self._pump(client, upstream, "client")

    def _pump(self, src: socket.socket, dst: socket.socket, side: str) -> None:
        """Copy src to dst until src ends (`side` closed) or fails."""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._closed(side)
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            with contextlib.suppress(OSError):
                dst.sendall(data)

    def close(self) -> None:
        for s in [self.listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()
        self._thread.join(timeout=TIMEOUT)


@contextlib.contextmanager
def proxy(server, tamper):
    p = TamperingProxy(server, tamper)
    try:
        yield p
    finally:
        p.close()


# MS-SMB2 2.2.3 SMB2 NEGOTIATE Request, offsets in the message (after the
# 64-byte header).
NEGOTIATE_SECURITY_MODE = rawsmb.HEADER_SIZE + 4
NEGOTIATE_CAPABILITIES = rawsmb.HEADER_SIZE + 8
NEGOTIATE_DIALECT_COUNT = rawsmb.HEADER_SIZE + 2
NEGOTIATE_DIALECTS = rawsmb.HEADER_SIZE + 36
SIGNING_ENABLED, SIGNING_REQUIRED = 0x0001, 0x0002
CAP_ENCRYPTION = 0x0000_0040


def untouched(message: bytes) -> bytes:
    return message


def signing_required_removed(message: bytes) -> bytes:
    """The classic downgrade: the client's SIGNING_REQUIRED becomes ENABLED."""
    assert struct.unpack_from("<H", message, NEGOTIATE_SECURITY_MODE)[0] == SIGNING_REQUIRED
    out = bytearray(message)
    struct.pack_into("<H", out, NEGOTIATE_SECURITY_MODE, SIGNING_ENABLED)
    return bytes(out)


def encryption_capability_removed(message: bytes) -> bytes:
    caps = struct.unpack_from("<I", message, NEGOTIATE_CAPABILITIES)[0]
    assert caps & CAP_ENCRYPTION, hex(caps)
    out = bytearray(message)
    struct.pack_into("<I", out, NEGOTIATE_CAPABILITIES, caps & ~CAP_ENCRYPTION)
    return bytes(out)


def smb311_replaced_by_302(message: bytes) -> bytes:
    """The client's dialect 3.1.1 becomes 3.0.2 (the list keeps its length)."""
    count = struct.unpack_from("<H", message, NEGOTIATE_DIALECT_COUNT)[0]
    dialects = list(struct.unpack_from(f"<{count}H", message, NEGOTIATE_DIALECTS))
    assert Dialects.SMB_3_1_1 in dialects and Dialects.SMB_3_0_2 in dialects, dialects
    out = bytearray(message)
    struct.pack_into(f"<{count}H", out, NEGOTIATE_DIALECTS, *[Dialects.SMB_3_0_2 if d == Dialects.SMB_3_1_1 else d for d in dialects])
    return bytes(out)


def test_untampered_proxy_is_transparent(server):
    # The harness itself: through the proxy, unchanged, all works.
    (server.share_path / "f.txt").write_bytes(CONTENT)
    for dialect in (Dialects.SMB_3_0_2, Dialects.SMB_3_1_1):
        with proxy(server, untouched) as p, connection(server, dialect, port=p.port) as conn:
            f = open_file(tree(logon(conn, server), server), "f.txt")  # 3.0.2: VALIDATE_NEGOTIATE too
            assert f.read(0, len(CONTENT)) == CONTENT
            f.close()
            assert p.tampered.is_set() and not p.closed.is_set()


@pytest.mark.parametrize("tamper", [signing_required_removed, encryption_capability_removed], ids=["security-mode", "capabilities"])
def test_tampered_negotiate_fails_smb311_logon(server, tamper):
    # SMB 3.1.1: the preauth integrity hash covers the NEGOTIATE as each side
    # saw it, so client and server derive different signing keys. The client
    # finds the signature of the final SESSION_SETUP response wrong, and the
    # server finds the client's signatures wrong: no request gets through.
    with proxy(server, tamper) as p, connection(server, Dialects.SMB_3_1_1, port=p.port, logoff=False) as conn:
        assert p.tampered.is_set()
        session = Session(conn, server.user, server.password, require_encryption=False, auth_protocol="ntlm")
        with pytest.raises(SMBException, match="signature could not be verified"):
            session.connect()
        # Carry on regardless, signing with the key the client derived: the
        # server refuses the TREE_CONNECT. (smbd signs its refusal with its
        # own key, which the client cannot verify: an SMBException too.)
        with pytest.raises(SMBException) as excinfo:
            TreeConnect(session, rf"\\{server.host}\{server.share}").connect()
    if server.kind == "nimbus":
        assert isinstance(excinfo.value, SMBResponseException), excinfo.value
        assert excinfo.value.status == NtStatus.STATUS_ACCESS_DENIED, status_name(excinfo.value.status)
        assert "bad signature on command 0x3" in server.log_tail()


@pytest.mark.parametrize(
    ("dialect", "tamper"),
    [
        pytest.param(Dialects.SMB_3_0_0, signing_required_removed, id="3.0-security-mode"),
        pytest.param(Dialects.SMB_3_0_0, encryption_capability_removed, id="3.0-capabilities"),
        pytest.param(Dialects.SMB_3_0_2, signing_required_removed, id="3.0.2-security-mode"),
        pytest.param(Dialects.SMB_3_0_2, encryption_capability_removed, id="3.0.2-capabilities"),
        pytest.param(None, smb311_replaced_by_302, id="3.1.1-downgraded-to-3.0.2"),
    ],
)
def test_tampered_negotiate_fails_validate_negotiate(server, dialect, tamper):
    # SMB 3.0 and 3.0.2: the logon succeeds (nothing in it covers the
    # NEGOTIATE); the client's FSCTL_VALIDATE_NEGOTIATE_INFO, signed, sends
    # what it really offered, the server finds it differs from what it
    # received and ends the connection (MS-SMB2 3.3.5.15.12).
    with proxy(server, tamper) as p, connection(server, dialect, port=p.port) as conn:
        assert p.tampered.is_set()
        if dialect is None:
            assert conn.dialect == Dialects.SMB_3_0_2, "the server picked another dialect than the tampered list leaves"
        session = logon(conn, server)
        with pytest.raises(SMBException) as excinfo:
            tree(session, server)  # smbprotocol sends VALIDATE_NEGOTIATE_INFO after TREE_CONNECT
        if isinstance(excinfo.value, SMBResponseException):  # the error, when it came before the close
            assert excinfo.value.status == NtStatus.STATUS_ACCESS_DENIED, status_name(excinfo.value.status)
        assert p.closed.wait(CLOSE_WAIT), "the connection stayed open"
        assert p.closed_by == "server"
    if server.kind == "nimbus":
        assert "VALIDATE_NEGOTIATE_INFO mismatch; closing connection" in server.log_tail()
