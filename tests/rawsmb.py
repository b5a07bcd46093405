"""Hand-built SMB2 messages for tests that must send what no real client
would: a raw socket, an NBSS frame and the bytes of MS-SMB2 2.2.x, nothing
else. Layouts are from MS-SMB2; only what the hostile-input tests need."""

from __future__ import annotations

import os
import socket
import struct
import time

PROTOCOL_ID = b"\xfeSMB"
HEADER_SIZE = 64

NEGOTIATE, SESSION_SETUP, TREE_CONNECT, ECHO = 0x0000, 0x0001, 0x0003, 0x000D

STATUS_SUCCESS = 0
STATUS_INVALID_PARAMETER = 0xC000000D
STATUS_USER_SESSION_DELETED = 0xC0000203


def header(command: int, message_id: int, *, credit_charge: int = 1, credit_request: int = 1, flags: int = 0, next_command: int = 0, tree_id: int = 0, session_id: int = 0) -> bytes:
    """MS-SMB2 2.2.1.2 SMB2 Packet Header - SYNC."""
    return struct.pack(
        "<4sHHIHHIIQIIQ16s",
        PROTOCOL_ID, HEADER_SIZE, credit_charge, 0, command, credit_request, flags, next_command,
        message_id, 0, tree_id, session_id, b"\0" * 16,
    )


def preauth_context() -> bytes:
    """MS-SMB2 2.2.3.1.1 SMB2_PREAUTH_INTEGRITY_CAPABILITIES (SHA-512)."""
    data = struct.pack("<HHH", 1, 32, 0x0001) + os.urandom(32)
    return struct.pack("<HHI", 0x0001, len(data), 0) + data


def negotiate_body(dialects: list[int], contexts: list[bytes] = ()) -> bytes:
    """MS-SMB2 2.2.3 SMB2 NEGOTIATE Request; contexts follow, 8-byte aligned."""
    fixed = 36
    dialect_bytes = b"".join(struct.pack("<H", d) for d in dialects)
    ctx_offset = 0
    ctx_blob = b""
    if contexts:
        start = HEADER_SIZE + fixed + len(dialect_bytes)
        pad = (-start) % 8
        ctx_offset = start + pad
        parts = []
        for i, c in enumerate(contexts):
            if i < len(contexts) - 1:
                c = c + b"\0" * ((-len(c)) % 8)
            parts.append(c)
        ctx_blob = b"\0" * pad + b"".join(parts)
    body = struct.pack("<HHHHI16sIHH", fixed, len(dialects), 1, 0, 0, os.urandom(16), ctx_offset, len(contexts), 0)
    return body + dialect_bytes + ctx_blob


def echo_body() -> bytes:
    """MS-SMB2 2.2.28 SMB2 ECHO Request."""
    return struct.pack("<HH", 4, 0)


def tree_connect_body(path: str) -> bytes:
    """MS-SMB2 2.2.9 SMB2 TREE_CONNECT Request."""
    p = path.encode("utf-16-le")
    return struct.pack("<HHHH", 9, 0, HEADER_SIZE + 8, len(p)) + p


def frame(message: bytes) -> bytes:
    """MS-SMB2 2.1 Direct TCP transport: a zero byte and a 24-bit length."""
    return struct.pack(">I", len(message)) + message


def connect(host: str, port: int, source: str | None = None, timeout: float = 10) -> socket.socket:
    s = socket.create_connection((host, port), timeout=timeout, source_address=(source, 0) if source else None)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the server")
        buf += chunk
    return buf


def recv_message(s: socket.socket) -> bytes:
    length = struct.unpack(">I", recv_exact(s, 4))[0]
    return recv_exact(s, length)


def status(message: bytes) -> int:
    return struct.unpack_from("<I", message, 8)[0]


def credits_granted(message: bytes) -> int:
    return struct.unpack_from("<H", message, 14)[0]


def session_id(message: bytes) -> int:
    return struct.unpack_from("<Q", message, 40)[0]


def negotiate(s: socket.socket, dialects=(0x0202, 0x0210), credit_request: int = 1) -> bytes:
    """Negotiates an SMB 2.x dialect (no contexts needed); returns the response."""
    s.sendall(frame(header(NEGOTIATE, 0, credit_request=credit_request) + negotiate_body(list(dialects))))
    resp = recv_message(s)
    assert status(resp) == STATUS_SUCCESS, hex(status(resp))
    return resp


def is_closed(s: socket.socket, timeout: float = 10) -> bool:
    """True if the server closes the connection within `timeout` (any data it
    sends first is read and dropped)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if not s.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


CREATE, READ = 0x0005, 0x0008


def session_setup_body(token: bytes) -> bytes:
    """MS-SMB2 2.2.5 SMB2 SESSION_SETUP Request."""
    return struct.pack("<HBBIIHHQ", 25, 0, 1, 0, 0, HEADER_SIZE + 24, len(token), 0) + token


def anonymous_logon(s: socket.socket, message_id: int) -> tuple[int, int]:
    """An anonymous NTLMSSP logon (MS-NLMP 2.2.1.1 NEGOTIATE, then an
    AUTHENTICATE with empty user and responses); returns (session id, next
    message id). The server must allow guests."""
    negotiate = b"NTLMSSP\0" + struct.pack("<II", 1, 0x00088207) + b"\0" * 16
    s.sendall(frame(header(SESSION_SETUP, message_id, credit_request=8) + session_setup_body(negotiate)))
    resp = recv_message(s)
    sid = session_id(resp)
    empty = struct.pack("<HHI", 0, 0, 64)
    authenticate = b"NTLMSSP\0" + struct.pack("<I", 3) + empty * 6 + struct.pack("<I", 0x00088A05)
    s.sendall(frame(header(SESSION_SETUP, message_id + 1, session_id=sid, credit_request=8) + session_setup_body(authenticate)))
    resp = recv_message(s)
    assert status(resp) == STATUS_SUCCESS, hex(status(resp))
    return sid, message_id + 2


def tree_connect(s: socket.socket, message_id: int, sid: int, path: str) -> int:
    s.sendall(frame(header(TREE_CONNECT, message_id, session_id=sid, credit_request=8) + tree_connect_body(path)))
    resp = recv_message(s)
    assert status(resp) == STATUS_SUCCESS, hex(status(resp))
    return struct.unpack_from("<I", resp, 36)[0]


def create_body(name: str) -> bytes:
    """MS-SMB2 2.2.13 SMB2 CREATE Request: open an existing file for reading."""
    n = name.encode("utf-16-le")
    # StructureSize, SecurityFlags, OplockLevel, ImpersonationLevel,
    # SmbCreateFlags, Reserved, DesiredAccess (GENERIC_READ), FileAttributes,
    # ShareAccess (read|write|delete), CreateDisposition (OPEN),
    # CreateOptions (NON_DIRECTORY_FILE), NameOffset, NameLength,
    # CreateContextsOffset, CreateContextsLength.
    return struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, 0x80000000, 0, 7, 1, 0x40, HEADER_SIZE + 56, len(n), 0, 0) + n


def open_file(s: socket.socket, message_id: int, sid: int, tid: int, name: str) -> bytes:
    """Returns the 16-byte FileId."""
    s.sendall(frame(header(CREATE, message_id, session_id=sid, tree_id=tid, credit_request=8) + create_body(name)))
    resp = recv_message(s)
    assert status(resp) == STATUS_SUCCESS, hex(status(resp))
    return resp[HEADER_SIZE + 64 : HEADER_SIZE + 80]


def read_body(file_id: bytes, offset: int, length: int) -> bytes:
    """MS-SMB2 2.2.19 SMB2 READ Request."""
    return struct.pack("<HBBIQ16sIIIHH", 49, 0x50, 0, length, offset, file_id, 0, 0, 0, 0, 0) + b"\0"
