"""Findings of the security review (issue 11), each against the real server.

Every test here failed on the commit the review read (120c1b4): it shows
the hole, then the fix. smbprotocol for message-level control, raw
messages (tests/rawsmb.py) where smbprotocol would not send what an
attacker sends.
"""

from __future__ import annotations

import contextlib
import os
import struct
import uuid

import pytest
import rawsmb
from conftest import READONLY_SHARE, Security, nimbus_binary
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBConnectionClosed, SMBException, SMBResponseException
from smbprotocol.file_info import FileInformationClass, InfoType
from smbprotocol.header import NtStatus
from smbprotocol.ioctl import CtlCode, IOCTLFlags, SMB2IOCTLRequest, SMB2ValidateNegotiateInfoRequest
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    Open,
    ShareAccess,
    SMB2SetInfoRequest,
    SMB2SetInfoResponse,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

TIMEOUT = 30
MAXIMUM_ALLOWED = 0x0200_0000
FILE_DELETE_ON_CLOSE = 0x0000_1000
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE
SECRET = "secret"


@contextlib.contextmanager
def connection(server, dialect=Dialects.SMB_3_1_1):
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(dialect, timeout=TIMEOUT)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


def logon(conn, server, require_encryption=False) -> Session:
    session = Session(conn, server.user, server.password, require_encryption=require_encryption, auth_protocol="ntlm")
    session.connect()
    return session


def tree(session, server, share) -> TreeConnect:
    t = TreeConnect(session, rf"\\{server.host}\{share}")
    t.connect()
    return t


def create(t, name, access, options=CreateOptions.FILE_NON_DIRECTORY_FILE, disposition=CreateDisposition.FILE_OPEN) -> Open:
    f = Open(t, name)
    f.create(ImpersonationLevel.Impersonation, access, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, disposition, options)
    return f


def status_of(call) -> int:
    with pytest.raises(SMBResponseException) as excinfo:
        call()
    return excinfo.value.status


def set_info(f: Open, info_class, buffer: bytes) -> None:
    req = SMB2SetInfoRequest()
    req["info_type"] = InfoType.SMB2_0_INFO_FILE
    req["file_info_class"] = info_class
    req["file_id"] = f.file_id
    req["buffer"] = buffer
    conn, session, t = f.connection, f.tree_connect.session, f.tree_connect
    request = conn.send(req, session.session_id, t.tree_connect_id)
    response = conn.receive(request)
    SMB2SetInfoResponse().unpack(response["data"].get_value())


def rename_buffer(new_name: str, replace: bool = False) -> bytes:
    """MS-FSCC 2.4.37.2 FILE_RENAME_INFORMATION_TYPE_2."""
    name = new_name.encode("utf-16-le")
    return struct.pack("<B7xQI", 1 if replace else 0, 0, len(name)) + name


# --------------------------------------------------------------------------
# 1. delete on read-only shares


def test_delete_on_close_with_maximum_allowed_on_readonly_share_refused(readonly_server):
    target = readonly_server.share_path / "hello.txt"
    with connection(readonly_server) as conn:
        t = tree(logon(conn, readonly_server), readonly_server, READONLY_SHARE)
        status = status_of(
            lambda: create(t, "hello.txt", MAXIMUM_ALLOWED, CreateOptions.FILE_NON_DIRECTORY_FILE | FILE_DELETE_ON_CLOSE)
        )
        assert status == NtStatus.STATUS_ACCESS_DENIED
        # A directory the same way.
        (readonly_server.share_path / "d").mkdir()
        status = status_of(lambda: create(t, "d", MAXIMUM_ALLOWED, CreateOptions.FILE_DIRECTORY_FILE | FILE_DELETE_ON_CLOSE))
        assert status == NtStatus.STATUS_ACCESS_DENIED
    assert target.read_text() == "hello from a read-only share\n"
    assert (readonly_server.share_path / "d").is_dir()


def test_maximum_allowed_open_on_readonly_share_changes_nothing(readonly_server):
    """SET_INFO through a MAXIMUM_ALLOWED open: disposition, rename, size, times and attributes."""
    target = readonly_server.share_path / "hello.txt"
    before = target.stat()
    with connection(readonly_server) as conn:
        t = tree(logon(conn, readonly_server), readonly_server, READONLY_SHARE)
        f = create(t, "hello.txt", MAXIMUM_ALLOWED)
        attempts = {
            "disposition": (FileInformationClass.FILE_DISPOSITION_INFORMATION, b"\x01"),
            "rename": (FileInformationClass.FILE_RENAME_INFORMATION, rename_buffer("moved.txt")),
            "end of file": (FileInformationClass.FILE_END_OF_FILE_INFORMATION, struct.pack("<Q", 0)),
            "allocation": (FileInformationClass.FILE_ALLOCATION_INFORMATION, struct.pack("<Q", 0)),
            # creation, access, write, change time; READONLY|HIDDEN attributes
            "basic": (FileInformationClass.FILE_BASIC_INFORMATION, struct.pack("<QQQQI4x", 1 << 56, 1 << 56, 1 << 56, 1 << 56, 0x3)),
        }
        for what, (cls, buf) in attempts.items():
            assert status_of(lambda: set_info(f, cls, buf)) == NtStatus.STATUS_ACCESS_DENIED, what
        # Writes and truncating opens too.
        assert status_of(lambda: f.write(b"x", 0)) == NtStatus.STATUS_ACCESS_DENIED
        status = status_of(lambda: create(t, "hello.txt", MAXIMUM_ALLOWED, disposition=CreateDisposition.FILE_OVERWRITE))
        assert status == NtStatus.STATUS_ACCESS_DENIED
        f.close()
    after = target.stat()
    assert target.read_text() == "hello from a read-only share\n"
    assert (after.st_mtime_ns, after.st_mode) == (before.st_mtime_ns, before.st_mode)
    assert not (readonly_server.share_path / "moved.txt").exists()


def test_delete_on_close_with_maximum_allowed_still_deletes_on_writable_share(server):
    """The fix must not take delete-on-close away where DELETE is granted."""
    (server.share_path / "doomed.txt").write_text("bye")
    with connection(server) as conn:
        t = tree(logon(conn, server), server, server.share)
        f = create(t, "doomed.txt", MAXIMUM_ALLOWED, CreateOptions.FILE_NON_DIRECTORY_FILE | FILE_DELETE_ON_CLOSE)
        f.close()
    assert not (server.share_path / "doomed.txt").exists()


# --------------------------------------------------------------------------
# 2. related compounds across trees


@pytest.fixture
def mixed_server(server_factory):
    """Share "data" in clear, share "secret" with encryption = "required"."""
    return server_factory.start([("data", False), (SECRET, False)], security=Security(share_encryption={SECRET: "required"}))


def test_related_compound_cannot_reach_an_open_of_an_encrypted_share(mixed_server):
    secret_file = mixed_server.extra_shares[SECRET] / "secret.txt"
    secret_file.write_bytes(b"TOP-SECRET-PAYLOAD")
    with connection(mixed_server) as conn:
        session = logon(conn, mixed_server)
        clear = tree(session, mixed_server, "data")
        sealed = tree(session, mixed_server, SECRET)
        assert sealed.encrypt_data and not clear.encrypt_data and not session.encrypt_data
        # Opened properly, over encryption.
        f = create(sealed, "secret.txt", FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE)
        assert f.read(0, 18) == b"TOP-SECRET-PAYLOAD"

        # Now a clear compound that starts on the clear share and names the
        # secret open in its related requests.
        opener = Open(clear, "decoy.txt")
        create_msg, create_recv = opener.create(
            ImpersonationLevel.Impersonation,
            FilePipePrinterAccessMask.GENERIC_READ,
            FileAttributes.FILE_ATTRIBUTE_NORMAL,
            SHARE_ALL,
            CreateDisposition.FILE_OPEN_IF,
            CreateOptions.FILE_NON_DIRECTORY_FILE,
            send=False,
        )
        read_msg, read_recv = f.read(0, 18, send=False)
        write_msg, write_recv = f.write(b"OVERWRITTEN-IN-CLR", 0, send=False)
        requests = conn.send_compound([create_msg, read_msg, write_msg], session.session_id, clear.tree_connect_id, related=True)
        create_recv(requests[0])
        assert status_of(lambda: read_recv(requests[1])) == NtStatus.STATUS_FILE_CLOSED
        assert status_of(lambda: write_recv(requests[2])) == NtStatus.STATUS_FILE_CLOSED
        opener.close()
        # The open itself is untouched and still works over encryption.
        assert f.read(0, 18) == b"TOP-SECRET-PAYLOAD"
        f.close()
    assert secret_file.read_bytes() == b"TOP-SECRET-PAYLOAD"


def test_file_ids_are_not_guessable(server):
    with connection(server) as conn:
        t = tree(logon(conn, server), server, server.share)
        opens = [
            create(t, f"f{i}.txt", FilePipePrinterAccessMask.GENERIC_READ, disposition=CreateDisposition.FILE_OVERWRITE_IF)
            for i in range(8)
        ]
        volatile = [struct.unpack("<QQ", f.file_id)[1] for f in opens]
        persistent = [struct.unpack("<QQ", f.file_id)[0] for f in opens]
        for f in opens:
            f.close()
    assert len(set(volatile)) == len(volatile)
    assert not set(volatile) & set(persistent)
    # Not a sequence: consecutive opens differ in more than the low bits.
    assert all(abs(a - b) > 1 << 32 for a, b in zip(volatile, volatile[1:])), [hex(v) for v in volatile]


# --------------------------------------------------------------------------
# 9. acting on the open file, not on whatever its name now reaches


def test_rename_acts_on_the_open_file_not_on_its_old_name(server):
    root = server.share_path
    (root / "a.txt").write_text("the open file")
    with connection(server) as conn:
        t = tree(logon(conn, server), server, server.share)
        f = create(t, "a.txt", FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.DELETE)
        # Outside SMB, the name is moved away and another file takes it.
        os.rename(root / "a.txt", root / "elsewhere.txt")
        (root / "a.txt").write_text("an innocent bystander")
        status = status_of(lambda: set_info(f, FileInformationClass.FILE_RENAME_INFORMATION, rename_buffer("b.txt")))
        assert status == NtStatus.STATUS_OBJECT_NAME_NOT_FOUND
        f.close()
    assert (root / "a.txt").read_text() == "an innocent bystander"
    assert not (root / "b.txt").exists()


def test_delete_on_close_spares_a_file_that_took_the_name(server):
    root = server.share_path
    (root / "gone.txt").write_text("to be deleted")
    with connection(server) as conn:
        t = tree(logon(conn, server), server, server.share)
        f = create(t, "gone.txt", FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.DELETE, CreateOptions.FILE_NON_DIRECTORY_FILE | FILE_DELETE_ON_CLOSE)
        os.rename(root / "gone.txt", root / "kept.txt")
        (root / "gone.txt").write_text("an innocent bystander")
        f.close()
    assert (root / "gone.txt").read_text() == "an innocent bystander"


# --------------------------------------------------------------------------
# 11. protocol details


def test_validate_negotiate_on_smb311_ends_the_connection(server):
    with connection(server, Dialects.SMB_3_1_1) as conn:
        session = logon(conn, server)
        t = tree(session, server, server.share)
        # smbprotocol itself skips this exchange at 3.1.1, so build it.
        ioctl = SMB2IOCTLRequest()
        ioctl["ctl_code"] = CtlCode.FSCTL_VALIDATE_NEGOTIATE_INFO
        ioctl["file_id"] = b"\xff" * 16
        info = SMB2ValidateNegotiateInfoRequest()
        info["capabilities"] = conn.client_capabilities
        info["guid"] = conn.client_guid
        info["security_mode"] = conn.client_security_mode
        info["dialects"] = conn.negotiated_dialects
        ioctl["buffer"] = info
        ioctl["max_output_response"] = 24
        ioctl["flags"] = IOCTLFlags.SMB2_0_IOCTL_IS_FSCTL
        request = conn.send(ioctl, sid=session.session_id, tid=t.tree_connect_id)
        with pytest.raises(SMBException) as excinfo:
            conn.receive(request, timeout=10)
        # Whichever the client saw first: the close, or the error before it.
        if isinstance(excinfo.value, SMBResponseException):
            assert excinfo.value.status == NtStatus.STATUS_ACCESS_DENIED
        else:
            assert isinstance(excinfo.value, SMBConnectionClosed)
        with pytest.raises(SMBException):
            conn.echo(sid=session.session_id, timeout=5)
    assert "VALIDATE_NEGOTIATE_INFO on an SMB 3.1.1 connection; closing connection" in server.log_tail()


def test_append_only_open_cannot_overwrite(server):
    target = server.share_path / "log.txt"
    target.write_bytes(b"0123456789")
    with connection(server) as conn:
        t = tree(logon(conn, server), server, server.share)
        f = create(t, "log.txt", FilePipePrinterAccessMask.FILE_APPEND_DATA | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES | FilePipePrinterAccessMask.SYNCHRONIZE)
        f.write(b"XY", 0)
        f.write(b"Z", 4)
        f.close()
    assert target.read_bytes() == b"0123456789XYZ"


@pytest.mark.nimbus_only
def test_fuzz_api_is_not_in_the_release_binary():
    binary = nimbus_binary().read_bytes()
    # Symbols of the server crate are there (debug info), so their absence means something.
    assert b"logon_guard" in binary
    assert b"fuzz_api" not in binary


# --------------------------------------------------------------------------
# 4. sessions, logons, trees and descriptors


def guest_server(server_factory, **limits):
    return server_factory.start([("pub", False)], security=Security(guest_shares={"pub"}, limits=limits))


def raw_session(srv):
    s = rawsmb.connect(srv.host, srv.port)
    rawsmb.negotiate(s, credit_request=64)
    return s


NTLM_NEGOTIATE = b"NTLMSSP\0" + struct.pack("<II", 1, 0x00088207) + b"\0" * 16
STATUS_REQUEST_NOT_ACCEPTED = 0xC00000D0
STATUS_MORE_PROCESSING_REQUIRED = 0xC0000016
STATUS_TOO_MANY_OPENED_FILES = 0xC000011F


def test_sessions_per_connection_are_bounded(server_factory):
    srv = guest_server(server_factory)  # default limits.max_sessions_per_connection = 64
    s = raw_session(srv)
    try:
        mid, ok, refused = 1, 0, 0
        for _ in range(2000):
            s.sendall(rawsmb.frame(rawsmb.header(rawsmb.SESSION_SETUP, mid, credit_request=8) + rawsmb.session_setup_body(NTLM_NEGOTIATE)))
            resp = rawsmb.recv_message(s)
            mid += 1
            if rawsmb.status(resp) == STATUS_REQUEST_NOT_ACCEPTED:
                refused += 1
                continue
            assert rawsmb.status(resp) == STATUS_MORE_PROCESSING_REQUIRED, hex(rawsmb.status(resp))
            sid = rawsmb.session_id(resp)
            empty = struct.pack("<HHI", 0, 0, 64)
            authenticate = b"NTLMSSP\0" + struct.pack("<I", 3) + empty * 6 + struct.pack("<I", 0x00088A05)
            s.sendall(rawsmb.frame(rawsmb.header(rawsmb.SESSION_SETUP, mid, session_id=sid, credit_request=8) + rawsmb.session_setup_body(authenticate)))
            assert rawsmb.status(rawsmb.recv_message(s)) == rawsmb.STATUS_SUCCESS
            mid += 1
            ok += 1
        assert (ok, refused) == (64, 2000 - 64)
        # The connection itself is still served.
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.ECHO, mid) + rawsmb.echo_body()))
        assert rawsmb.status(rawsmb.recv_message(s)) == rawsmb.STATUS_SUCCESS
    finally:
        s.close()
    assert "limits.max_sessions_per_connection" in srv.log_tail()


def test_logons_in_progress_are_bounded(server_factory):
    srv = guest_server(server_factory)  # default limits.max_logons_in_progress = 8
    s = raw_session(srv)
    try:
        statuses = []
        for mid in range(1, 41):
            s.sendall(rawsmb.frame(rawsmb.header(rawsmb.SESSION_SETUP, mid, credit_request=8) + rawsmb.session_setup_body(NTLM_NEGOTIATE)))
            statuses.append(rawsmb.status(rawsmb.recv_message(s)))
        assert statuses == [STATUS_MORE_PROCESSING_REQUIRED] * 8 + [STATUS_REQUEST_NOT_ACCEPTED] * 32
    finally:
        s.close()
    assert "limits.max_logons_in_progress" in srv.log_tail()


def test_trees_per_session_are_bounded(server_factory):
    srv = server_factory.start(security=Security(limits={"max_trees_per_session": 3}))
    with connection(srv) as conn:
        session = logon(conn, srv)
        for _ in range(3):
            tree(session, srv, srv.share)
        assert status_of(lambda: tree(session, srv, srv.share)) == NtStatus.STATUS_INSUFFICIENT_RESOURCES
    assert "limits.max_trees_per_session" in srv.log_tail()


def test_anonymous_logon_does_not_lift_the_logon_deadline(server_factory):
    srv = guest_server(server_factory, unauthenticated_timeout_secs=2)
    s = raw_session(srv)
    try:
        sid, mid = rawsmb.anonymous_logon(s, 1)
        rawsmb.tree_connect(s, mid, sid, rf"\\{srv.host}\pub")
        assert rawsmb.is_closed(s, timeout=15)
    finally:
        s.close()
    assert "no session logged on within" in srv.log_tail()


def test_open_files_stay_below_the_descriptor_limit(server_factory):
    """~2,000 opens across sessions under a 1,024-descriptor limit: CREATE is
    refused, accept() and logons keep working."""
    srv = server_factory.start(security=Security(limits={"max_connections": 64, "max_connections_per_address": 64}), nofile=1024)
    for i in range(2000):
        (srv.share_path / f"f{i}").write_bytes(b"x")
    conns, opens, refused = [], [], 0
    try:
        for c in range(4):
            conn = Connection(uuid.uuid4(), srv.host, srv.port, require_signing=True)
            conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
            conns.append(conn)
            t = tree(logon(conn, srv), srv, srv.share)
            for i in range(c * 500, (c + 1) * 500):
                try:
                    opens.append(create(t, f"f{i}", FilePipePrinterAccessMask.GENERIC_READ))
                except SMBResponseException as e:
                    assert e.status == STATUS_TOO_MANY_OPENED_FILES, hex(e.status)
                    refused += 1
        cap = 1024 - 64 - 512
        assert (len(opens), refused) == (cap, 2000 - cap)
        # A new client still connects, logs on and is told why it cannot open.
        with connection(srv) as conn:
            t = tree(logon(conn, srv), srv, srv.share)
            assert status_of(lambda: create(t, "f0", FilePipePrinterAccessMask.GENERIC_READ)) == STATUS_TOO_MANY_OPENED_FILES
            opens.pop().close()
            create(t, "f0", FilePipePrinterAccessMask.GENERIC_READ).close()
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.disconnect(close=True, timeout=TIMEOUT)
    assert "limits.max_open_files" in srv.log_tail(200)


# --------------------------------------------------------------------------
# 8. CREATE responses stay within their room


def create_with_contexts(name: str, contexts: list[tuple[bytes, bytes]]) -> bytes:
    """MS-SMB2 2.2.13 CREATE (FILE_OPEN_IF, read) with MS-SMB2 2.2.13.2 contexts."""
    n = name.encode("utf-16-le")
    name_off = rawsmb.HEADER_SIZE + 56
    ctx_off = name_off + len(n) + (-(name_off + len(n)) % 8)
    blobs = []
    for i, (cname, data) in enumerate(contexts):
        data_off = 16 + len(cname) + (-(16 + len(cname)) % 8) if data else 0
        blob = struct.pack("<IHHHHI", 0, 16, len(cname), 0, data_off, len(data)) + cname
        if data:
            blob += b"\0" * (data_off - len(blob)) + data
        if i < len(contexts) - 1:
            blob += b"\0" * (-len(blob) % 8)
            blob = struct.pack("<I", len(blob)) + blob[4:]
        blobs.append(blob)
    ctx = b"".join(blobs)
    body = struct.pack("<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, 0x80000000, 0, 7, 3, 0x40, name_off, len(n), ctx_off, len(ctx))
    return body + n + b"\0" * (ctx_off - name_off - len(n)) + ctx


def test_create_contexts_are_answered_once_and_bounded(server_factory):
    srv = guest_server(server_factory)
    s = raw_session(srv)
    try:
        sid, mid = rawsmb.anonymous_logon(s, 1)
        tid = rawsmb.tree_connect(s, mid, sid, rf"\\{srv.host}\pub")
        mid += 1
        for count, expected in ((3, rawsmb.STATUS_SUCCESS), (5000, rawsmb.STATUS_INVALID_PARAMETER)):
            msg = rawsmb.header(rawsmb.CREATE, mid, session_id=sid, tree_id=tid, credit_request=8) + create_with_contexts(
                "ctx.txt", [(b"MxAc", b"")] * count
            )
            s.sendall(rawsmb.frame(msg))
            resp = rawsmb.recv_message(s)
            mid += 1
            assert rawsmb.status(resp) == expected, (count, hex(rawsmb.status(resp)))
            if expected == rawsmb.STATUS_SUCCESS:
                ctx_len = struct.unpack_from("<I", resp, rawsmb.HEADER_SIZE + 84)[0]
                assert resp.count(b"MxAc") == 1 and ctx_len < 64, (ctx_len, resp.count(b"MxAc"))
                assert len(resp) < 512
    finally:
        s.close()


# --------------------------------------------------------------------------
# 6. bounded directory work on the request path


def test_directory_with_any_entry_is_not_empty_for_delete(server):
    """Emptiness is read from the first entry, whatever its name: a directory
    holding only a name that is not UTF-8 cannot be marked for deletion."""
    d = server.share_path / "d"
    d.mkdir()
    with open(os.path.join(os.fsencode(d), b"\xff\xfe-not-utf8"), "wb"):
        pass
    with connection(server) as conn:
        t = tree(logon(conn, server), server, server.share)
        f = create(t, "d", FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.DELETE, CreateOptions.FILE_DIRECTORY_FILE)
        status = status_of(lambda: set_info(f, FileInformationClass.FILE_DISPOSITION_INFORMATION, b"\x01"))
        assert status == NtStatus.STATUS_DIRECTORY_NOT_EMPTY
        f.close()
    assert d.is_dir()


# --------------------------------------------------------------------------
# 5. directory listings share one budget per connection


def list_all(d: Open) -> set[str]:
    seen = set()
    while True:
        try:
            entries = d.query_directory("*", FileInformationClass.FILE_NAMES_INFORMATION, max_output=65536)
        except SMBResponseException as e:
            assert e.status == NtStatus.STATUS_NO_MORE_FILES
            return seen - {".", ".."}
        seen |= {e["file_name"].get_value().decode("utf-16-le") for e in entries}


def test_directory_listings_of_one_connection_share_the_entry_limit(server_factory):
    srv = server_factory.start(security=Security(limits={"max_directory_entries": 1000}))
    for name in ("d1", "d2"):
        (srv.share_path / name).mkdir()
        for i in range(600):
            (srv.share_path / name / f"{i}").touch()
    with connection(srv) as conn:
        t = tree(logon(conn, srv), srv, srv.share)
        access = FilePipePrinterAccessMask.GENERIC_READ
        d1 = create(t, "d1", access, CreateOptions.FILE_DIRECTORY_FILE)
        d2 = create(t, "d2", access, CreateOptions.FILE_DIRECTORY_FILE)
        # d1's listing is held (its enumeration is not finished) ...
        d1.query_directory("*", FileInformationClass.FILE_NAMES_INFORMATION, max_output=4096)
        # ... so d2's would take the connection past 1,000 entries.
        status = status_of(lambda: d2.query_directory("*", FileInformationClass.FILE_NAMES_INFORMATION))
        assert status == NtStatus.STATUS_INSUFFICIENT_RESOURCES
        # Once d1 is closed, d2 lists in full.
        d1.close()
        assert len(list_all(d2)) == 600
        d2.close()
    assert "limits.max_directory_entries" in srv.log_tail()


# --------------------------------------------------------------------------
# a rename is seen by every open of the file (issue 13, "also fix")


def test_rename_is_seen_by_every_open_of_the_file(server):
    root = server.share_path
    (root / "d").mkdir()
    (root / "d" / "a.txt").write_text("renamed under another client")
    (root / "d" / "inner.txt").write_text("beneath a renamed directory")
    access = FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.DELETE
    with connection(server) as c1, connection(server) as c2:
        t1, t2 = tree(logon(c1, server), server, server.share), tree(logon(c2, server), server, server.share)
        mine = create(t1, "d\\a.txt", access)
        theirs = create(t2, "d\\a.txt", access)
        inner = create(t2, "d\\inner.txt", access)
        set_info(mine, FileInformationClass.FILE_RENAME_INFORMATION, rename_buffer("d\\b.txt"))
        # The other client's open now goes by the new name: its
        # delete-on-close deletes the file, wherever it is now.
        set_info(theirs, FileInformationClass.FILE_DISPOSITION_INFORMATION, b"\x01")
        mine.close()
        theirs.close()
        assert not (root / "d" / "b.txt").exists() and not (root / "d" / "a.txt").exists()
        # A directory with an open beneath it keeps its name (as on Windows;
        # smbtorture smb2.rename.rename_dir_openfile): no open's path goes
        # stale that way. Once the open beneath is gone, it may be renamed.
        d = create(t1, "d", access, CreateOptions.FILE_DIRECTORY_FILE)
        with pytest.raises(SMBResponseException) as refused:
            set_info(d, FileInformationClass.FILE_RENAME_INFORMATION, rename_buffer("e"))
        assert refused.value.status == NtStatus.STATUS_ACCESS_DENIED
        set_info(inner, FileInformationClass.FILE_DISPOSITION_INFORMATION, b"\x01")
        inner.close()
        set_info(d, FileInformationClass.FILE_RENAME_INFORMATION, rename_buffer("e"))
        d.close()
    assert (root / "e").is_dir() and not (root / "e" / "inner.txt").exists()
