"""A client that closes a connection and at once opens the same file on
another (smbtorture does between its tests; so does a program that
reconnects) is not refused by the handles it left open on the first: the
server may not have read the first connection's end yet, or may still be
releasing its opens. A CREATE refused by such opens (sharing violation,
delete pending) waits for them to go and looks again
(crates/nimbus-node/src/teardowns.rs).

Deterministic: a client's close of its socket on loopback puts the end of
stream in the server's socket before `close` returns, and the server looks
for it there; nothing here sleeps."""

from __future__ import annotations

import struct

import rawsmb
from test_locks import CLOSE, Client, close_body, srv  # noqa: F401 (srv: the fixture)

GENERIC_READ, GENERIC_WRITE, DELETE = 0x80000000, 0x40000000, 0x00010000
SHARE_ALL = 7
OPEN, OPEN_IF = 1, 3
NON_DIRECTORY_FILE, DELETE_ON_CLOSE = 0x40, 0x1000
STATUS_SHARING_VIOLATION = 0xC0000043


def create(c: Client, name: str, access: int, share: int, disposition: int = OPEN, options: int = NON_DIRECTORY_FILE) -> tuple[int, bytes]:
    """MS-SMB2 2.2.13 CREATE, no oplock: (status, FileId)."""
    n = name.encode("utf-16-le")
    body = struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, access, 0x80, share, disposition, options, rawsmb.HEADER_SIZE + 56, len(n), 0, 0) + n
    resp = c.call(rawsmb.CREATE, body)
    return rawsmb.status(resp), resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]


def test_an_open_left_on_a_closed_connection_refuses_no_open_after_it(srv):  # noqa: F811
    a, b = Client(srv), Client(srv)
    try:
        st, _ = create(a, "f.bin", GENERIC_READ | GENERIC_WRITE, 0)
        assert st == 0, hex(st)
        # While a's connection lives, its open (sharing nothing) refuses b's.
        assert create(b, "f.bin", GENERIC_READ, SHARE_ALL)[0] == STATUS_SHARING_VIOLATION
        # a's client goes away without closing it: b's next open is not
        # refused by it.
        a.close()
        st, fid = create(b, "f.bin", GENERIC_READ, SHARE_ALL)
        assert st == 0, hex(st)
        assert rawsmb.status(b.call(CLOSE, close_body(fid))) == 0
    finally:
        b.close()


def test_a_file_deleted_under_a_closed_connections_open_is_made_again_at_once(srv):  # noqa: F811
    """smbtorture's smb2.ioctl tests leave their handle open; the next test
    deletes the file (delete on close: pending while that handle lives) and
    makes it again on a new connection right away."""
    a, b = Client(srv), Client(srv)
    try:
        st, _ = create(a, "f.bin", GENERIC_READ | GENERIC_WRITE, SHARE_ALL)
        assert st == 0, hex(st)
        a.close()
        st, fid = create(b, "f.bin", DELETE, SHARE_ALL, OPEN, NON_DIRECTORY_FILE | DELETE_ON_CLOSE)
        assert st == 0, hex(st)
        assert rawsmb.status(b.call(CLOSE, close_body(fid))) == 0
        # Not refused (DELETE_PENDING) by the gone client's handle, and a
        # new file: the old one's last handle unlinks it before it leaves
        # the file's record, so this open never gets the file about to go.
        st, fid = create(b, "f.bin", GENERIC_READ | GENERIC_WRITE, SHARE_ALL, OPEN_IF)
        assert st == 0, hex(st)
        assert rawsmb.status(b.call(CLOSE, close_body(fid))) == 0
        assert (srv.share_path / "f.bin").stat().st_size == 0, "the file made again went with the old one"
    finally:
        b.close()
