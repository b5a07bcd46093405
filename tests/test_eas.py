"""Extended attributes (issue 17, item 4): FileFullEaInformation set and
queried, the EA_BUFFER create context, FileEaInformation's EaSize, with
Python smbclient (setxattr/listxattr/getxattr/removexattr) and raw
SET_INFO/QUERY_INFO through smbprotocol.

- EAs set are listed in capitals (EA names compare without case, as on
  NTFS), read back, replaced and removed (an empty value); they live in
  `user.nimbus.ea.*` extended attributes of the file.
- A query walks the EAs from the open's place in them: whole entries only,
  BUFFER_OVERFLOW when more remain, BUFFER_TOO_SMALL when none fits,
  NO_MORE_EAS at the end, SL_RESTART_SCAN / SL_INDEX_SPECIFIED /
  SL_RETURN_SINGLE_ENTRY; a list of names asks for those.
- Names of the server's own extended attributes (`user.nimbus.*`, where
  a file's security descriptor lives) are ACCESS_DENIED, and a stored
  descriptor is never listed as an EA.
- Bad names (INVALID_EA_NAME), malformed lists (EA_LIST_INCONSISTENT),
  more than the file system holds (EA_TOO_LARGE, nothing changed) and the
  READ_EA / WRITE_EA access rules.
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid

import pytest
import smbclient
from smbprotocol.connection import Connection, Dialects
from smbprotocol.create_contexts import CreateContextName, SMB2CreateContextRequest, SMB2CreateEABuffer
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.open import CreateDisposition, CreateOptions, FileAttributes, ImpersonationLevel, Open, ShareAccess, SMB2QueryInfoRequest, SMB2SetInfoRequest
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 60
FULL_EA, EA_INFO, ALL_INFO = 15, 7, 18
SL_RESTART_SCAN, SL_RETURN_SINGLE_ENTRY, SL_INDEX_SPECIFIED = 0x1, 0x2, 0x4
SUCCESS = 0
BUFFER_OVERFLOW = 0x80000005
NO_MORE_EAS = 0x80000012
INVALID_EA_NAME = 0x80000013
EA_LIST_INCONSISTENT = 0x80000014
ACCESS_DENIED = 0xC0000022
BUFFER_TOO_SMALL = 0xC0000023
EA_TOO_LARGE = 0xC0000050
NO_EAS_ON_FILE = 0xC0000052
READ_EA, WRITE_EA, READ_ATTRIBUTES, SYNCHRONIZE = 0x8, 0x10, 0x80, 0x100000
ALL_ACCESS = 0x1F01FF
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE


@contextlib.contextmanager
def tree(server):
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        s = Session(conn, server.user, server.password, auth_protocol="ntlm")
        s.connect()
        t = TreeConnect(s, rf"\\{server.host}\{server.share}")
        t.connect()
        yield t
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


def open_file(t, name, access=ALL_ACCESS, disposition=CreateDisposition.FILE_OPEN_IF, contexts=None) -> Open:
    f = Open(t, name)
    f.create(ImpersonationLevel.Impersonation, access | SYNCHRONIZE, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, disposition, CreateOptions.FILE_NON_DIRECTORY_FILE, contexts)
    return f


def full_ea_list(*entries: tuple[bytes, bytes, int]) -> bytes:
    """MS-FSCC 2.4.15 FILE_FULL_EA_INFORMATION entries (name, value, flags)."""
    out = b""
    for i, (name, value, flags) in enumerate(entries):
        entry = struct.pack("<IBBH", 0, flags, len(name), len(value)) + name + b"\0" + value
        if i < len(entries) - 1:
            entry += b"\0" * (-len(entry) % 4)
            entry = struct.pack("<I", len(entry)) + entry[4:]
        out += entry
    return out


def parse_full_ea_list(buf: bytes) -> list[tuple[bytes, bytes, int]]:
    out, at = [], 0
    while True:
        nxt, flags, nlen, vlen = struct.unpack_from("<IBBH", buf, at)
        name = buf[at + 8 : at + 8 + nlen]
        value = buf[at + 9 + nlen : at + 9 + nlen + vlen]
        out.append((name, value, flags))
        if nxt == 0:
            return out
        at += nxt


def call(f: Open, req) -> tuple[int, bytes]:
    t = f.tree_connect
    conn = t.session.connection
    try:
        header = conn.receive(conn.send(req, sid=t.session.session_id, tid=t.tree_connect_id))
        return SUCCESS, header["data"].get_value()
    except SMBResponseException as e:
        return e.status, e.header["data"].get_value()


def set_eas(f: Open, buf: bytes) -> int:
    req = SMB2SetInfoRequest()
    req["info_type"] = 1
    req["file_info_class"] = FULL_EA
    req["file_id"] = f.file_id
    req["buffer"] = buf
    return call(f, req)[0]


def query(f: Open, info_class: int, length: int = 4096, flags: int = 0, index: int = 0, names: bytes = b"") -> tuple[int, bytes]:
    req = SMB2QueryInfoRequest()
    req["info_type"] = 1
    req["file_info_class"] = info_class
    req["output_buffer_length"] = length
    req["additional_information"] = index
    req["flags"] = flags
    req["file_id"] = f.file_id
    req["buffer"] = names
    status, body = call(f, req)
    if len(body) >= 8 and struct.unpack_from("<H", body)[0] == 9:
        offset, count = struct.unpack_from("<HI", body, 2)
        return status, body[offset - 64 : offset - 64 + count]
    return status, b""


def ea_size(f: Open) -> int:
    status, out = query(f, EA_INFO)
    assert status == SUCCESS
    return struct.unpack("<I", out)[0]


def test_python_smbclient_sets_lists_reads_and_removes_eas(server):
    (server.share_path / "f.txt").write_bytes(b"data")
    path = rf"\\{server.host}\{server.share}\f.txt"
    smbclient.register_session(server.host, username=server.user, password=server.password, port=server.port, auth_protocol="ntlm")
    try:
        smbclient.setxattr(path, b"user.Colour", b"blue", port=server.port)
        smbclient.setxattr(path, b"Tags", b"\x00\x01binary\xff", port=server.port)
        assert sorted(smbclient.listxattr(path, port=server.port)) == [b"TAGS", b"USER.COLOUR"]
        # Python smbclient compares names as they come back: in capitals, as
        # from Windows.
        assert smbclient.getxattr(path, b"USER.COLOUR", port=server.port) == b"blue"
        smbclient.setxattr(path, b"user.COLOUR", b"green", port=server.port)  # replaces, whatever the case
        assert smbclient.getxattr(path, b"USER.COLOUR", port=server.port) == b"green"
        assert smbclient.getxattr(path, b"TAGS", port=server.port) == b"\x00\x01binary\xff"
        smbclient.removexattr(path, b"TAGS", port=server.port)
        assert smbclient.listxattr(path, port=server.port) == [b"USER.COLOUR"]
    finally:
        smbclient.reset_connection_cache()
    # Kept with the file, in extended attributes of its own name space.
    assert os.getxattr(server.share_path / "f.txt", "user.nimbus.ea.USER.COLOUR") == b"\0green"
    assert (server.share_path / "f.txt").read_bytes() == b"data"


def test_queries_walk_the_eas_in_whole_entries(server):
    with tree(server) as t:
        f = open_file(t, "walk.txt")
        assert query(f, FULL_EA) == (NO_EAS_ON_FILE, b"")
        assert ea_size(f) == 0
        eas = [(b"A%d" % i, bytes([i]) * (i + 1), 0x80 if i == 2 else 0) for i in range(5)]
        assert set_eas(f, full_ea_list(*eas)) == SUCCESS
        # EaSize: the whole list, encoded; FileAllInformation says the same.
        status, everything = query(f, FULL_EA, flags=SL_RESTART_SCAN)
        assert status == SUCCESS
        assert sorted(parse_full_ea_list(everything)) == sorted(eas)
        assert ea_size(f) == len(everything)
        status, all_info = query(f, ALL_INFO)
        assert status == SUCCESS and struct.unpack_from("<I", all_info, 72)[0] == len(everything)
        order = parse_full_ea_list(everything)
        # One at a time from the start, then the end.
        assert query(f, FULL_EA, flags=SL_RESTART_SCAN | SL_RETURN_SINGLE_ENTRY)[1] == full_ea_list(order[0])
        assert query(f, FULL_EA, flags=SL_RETURN_SINGLE_ENTRY)[1] == full_ea_list(order[1])
        # Room for two whole entries: BUFFER_OVERFLOW with those two.
        two = len(full_ea_list(order[2], order[3]))
        assert query(f, FULL_EA, length=two) == (BUFFER_OVERFLOW, full_ea_list(order[2], order[3]))
        assert query(f, FULL_EA) == (SUCCESS, full_ea_list(order[4]))
        assert query(f, FULL_EA) == (NO_MORE_EAS, b"")
        # From a 1-based index; a buffer too small for one entry.
        assert query(f, FULL_EA, flags=SL_INDEX_SPECIFIED, index=4) == (SUCCESS, full_ea_list(order[3], order[4]))
        assert query(f, FULL_EA, length=8, flags=SL_RESTART_SCAN) == (BUFFER_TOO_SMALL, b"")
        # By name (FILE_GET_EA_INFORMATION): found or not, in the order asked.
        names = struct.pack("<IB", 8, 2) + b"a3\0" + struct.pack("<IB", 0, 4) + b"NONE\0"
        assert query(f, FULL_EA, names=names) == (SUCCESS, full_ea_list(order_of(order, b"A3"), (b"NONE", b"", 0)))
        f.close()


def order_of(order, name):
    return next(e for e in order if e[0] == name)


def ea_buffer_context(name: bytes, value: bytes) -> SMB2CreateContextRequest:
    """An EA_BUFFER create context (MS-SMB2 2.2.13.2.1) holding one EA."""
    ea = SMB2CreateEABuffer()
    ea["ea_name"] = name + b"\x00"
    ea["ea_value"] = value
    ctx = SMB2CreateContextRequest()
    ctx["buffer_name"] = CreateContextName.SMB2_CREATE_EA_BUFFER
    ctx["buffer_data"] = SMB2CreateEABuffer.pack_multiple([ea])
    return ctx


def test_the_ea_buffer_of_a_create_sets_eas(server):
    ctx = ea_buffer_context(b"Created.By", b"nimbus")
    with tree(server) as t:
        f = open_file(t, "made.txt", disposition=CreateDisposition.FILE_CREATE, contexts=[ctx])
        assert parse_full_ea_list(query(f, FULL_EA)[1]) == [(b"CREATED.BY", b"nimbus", 0)]
        f.close()
        # A bad name in the buffer: nothing is created.
        ctx = ea_buffer_context(b"bad:name", b"x")
        with pytest.raises(SMBResponseException) as e:
            open_file(t, "not-made.txt", disposition=CreateDisposition.FILE_CREATE, contexts=[ctx])
        assert e.value.status == INVALID_EA_NAME
    assert not (server.share_path / "not-made.txt").exists()


def test_bad_names_lists_sizes_and_access_are_refused(server):
    with tree(server) as t:
        f = open_file(t, "bad.txt")
        assert set_eas(f, full_ea_list((b"KEEP", b"1", 0))) == SUCCESS
        for name in (b"a:b", b"a\\b", b"", b"a*b", b"tab\there"):
            assert set_eas(f, full_ea_list((b"OK", b"1", 0), (name, b"v", 0))) == INVALID_EA_NAME, name
        good = full_ea_list((b"ONE", b"1", 0), (b"TWO", b"2", 0))
        assert set_eas(f, good[:-3]) == EA_LIST_INCONSISTENT  # cut inside the second entry
        assert set_eas(f, struct.pack("<I", 5) + good[4:]) == EA_LIST_INCONSISTENT  # offset inside the first
        # More than the file system holds for one file: refused, nothing changed.
        big = [(b"BIG%d" % i, b"x" * 60000, 0) for i in range(2)]
        assert set_eas(f, full_ea_list(*big)) == EA_TOO_LARGE
        assert parse_full_ea_list(query(f, FULL_EA, flags=SL_RESTART_SCAN)[1]) == [(b"KEEP", b"1", 0)]
        f.close()
        no_write = open_file(t, "bad.txt", access=READ_EA | READ_ATTRIBUTES)
        assert set_eas(no_write, full_ea_list((b"X", b"1", 0))) == ACCESS_DENIED
        no_read = open_file(t, "bad.txt", access=WRITE_EA | READ_ATTRIBUTES)
        assert query(no_read, FULL_EA)[0] == ACCESS_DENIED
        assert ea_size(no_read) > 0  # EaSize needs no READ_EA


def test_names_of_the_servers_own_attributes_are_refused_and_never_listed(server):
    with tree(server) as t:
        f = open_file(t, "own.txt")
        assert set_eas(f, full_ea_list((b"VOID", b"testme", 0))) == SUCCESS
        # A descriptor stored with the file (user.nimbus.sd) is not an EA.
        assert set_security(f, everyone_full_control()) == SUCCESS
        assert os.getxattr(server.share_path / "own.txt", "user.nimbus.sd")
        names = [n for n, _, _ in parse_full_ea_list(query(f, FULL_EA, flags=SL_RESTART_SCAN)[1])]
        assert names == [b"VOID"]
        for name in (b"user.nimbus.sd", b"USER.NIMBUS.DOSINFO", b"User.Nimbus.anything"):
            assert set_eas(f, full_ea_list((name, b"testme", 0))) == ACCESS_DENIED, name
        f.close()
        # Nor through a CREATE's EA buffer: nothing is created.
        ctx = ea_buffer_context(b"user.nimbus.sd", b"x")
        with pytest.raises(SMBResponseException) as e:
            open_file(t, "not-made.txt", disposition=CreateDisposition.FILE_CREATE, contexts=[ctx])
        assert e.value.status == ACCESS_DENIED
    assert not (server.share_path / "not-made.txt").exists()


def everyone_full_control() -> bytes:
    """A self-relative descriptor (MS-DTYP 2.4.6) whose DACL allows
    Everyone (S-1-1-0) everything."""
    everyone = struct.pack("<BB", 1, 1) + (1).to_bytes(6, "big") + struct.pack("<I", 0)
    allow = struct.pack("<BBHI", 0, 0, 8 + len(everyone), 0x1F01FF) + everyone
    dacl = struct.pack("<BBHHH", 2, 0, 8 + len(allow), 1, 0) + allow
    return struct.pack("<BBHIIII", 1, 0, 0x8004, 0, 0, 0, 20) + dacl


def set_security(f: Open, sd: bytes) -> int:
    req = SMB2SetInfoRequest()
    req["info_type"] = 3
    req["file_info_class"] = 0
    req["additional_information"] = 0x4  # DACL_SECURITY_INFORMATION
    req["file_id"] = f.file_id
    req["buffer"] = sd
    return call(f, req)[0]
