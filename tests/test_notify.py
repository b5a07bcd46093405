"""Change notify (SMB2 CHANGE_NOTIFY, MS-SMB2 3.3.5.19) with two clients on
two connections: raw messages (tests/rawsmb.py), so that every interim
STATUS_PENDING, final async response and CANCEL is seen as sent, and one
test with smbprotocol's FileSystemWatcher as a real client uses it.

One connection watches a directory; the other creates, renames, deletes,
changes attributes and writes, or the test itself does on the server's
disk (seen through inotify). Every wait is on the server's own answers
(the pending request completing, within the socket's timeout); nothing
sleeps to let a race settle. That a change is *not* reported is shown with
a fence: a later change made on disk, which inotify queues after whatever
should not be there, so that would have come first.

A watch reports only what its watcher could list: nothing beneath a
directory it may not list, and on a share with access-based enumeration
nothing it may not read (two users, alice and mallory, with smbprotocol)."""

from __future__ import annotations

import os
import struct
import threading
import time
import uuid

import pytest
import rawsmb
import test_locks
from conftest import PASSWORD, USER, Security
from smbprotocol.change_notify import SMB2ChangeNotifyRequest
from smbprotocol.open import CreateDisposition, CreateOptions, FileAttributes, ImpersonationLevel, Open
from test_acl import (
    ALLOW,
    DELETE,
    DENY,
    EVERYONE,
    FILE_ALL_ACCESS,
    GENERIC_WRITE,
    LIST_DIRECTORY,
    READ_CONTROL,
    SHARE_ALL,
    SYNCHRONIZE,
    WRITE_DAC,
    acl,
    ace,
    create,
    descriptor,
    set_sd,
    smb_tree,
    user_sids,
)

LOGOFF, TREE_DISCONNECT, CLOSE, WRITE, CANCEL, SET_INFO, CHANGE_NOTIFY = 0x0002, 0x0004, 0x0006, 0x0009, 0x000C, 0x0011, 0x000F
FLAG_ASYNC = 0x2

STATUS_PENDING = 0x00000103
STATUS_NOTIFY_CLEANUP = 0x0000010B
STATUS_NOTIFY_ENUM_DIR = 0x0000010C
STATUS_CANCELLED = 0xC0000120
STATUS_ACCESS_DENIED = 0xC0000022
STATUS_SHARING_VIOLATION = 0xC0000043
STATUS_DELETE_PENDING = 0xC0000056
STATUS_INSUFFICIENT_RESOURCES = 0xC000009A
STATUS_INTERNAL_ERROR = 0xC00000E5

# MS-SMB2 2.2.35 CompletionFilter (MS-FSCC FILE_NOTIFY_CHANGE_*).
FILE_NAME, DIR_NAME, ATTRIBUTES, SIZE, LAST_WRITE = 0x1, 0x2, 0x4, 0x8, 0x10
NAMES = FILE_NAME | DIR_NAME
WATCH_TREE = 0x0001
STREAM_NAME, STREAM_SIZE, STREAM_WRITE = 0x200, 0x400, 0x800
# MS-FSCC 2.4.42 Action.
ADDED, REMOVED, MODIFIED, OLD_NAME, NEW_NAME = 1, 2, 3, 4, 5
ADDED_STREAM, REMOVED_STREAM, MODIFIED_STREAM = 6, 7, 8

# MS-SMB2 2.2.13 CREATE values.
OPEN, CREATE, OPEN_IF = 1, 2, 3
DIRECTORY_FILE, NON_DIRECTORY_FILE, DELETE_ON_CLOSE = 0x1, 0x40, 0x1000
FILE_ALL_ACCESS = 0x001F01FF
LIST_DIRECTORY_ONLY = 0x00100081  # FILE_LIST_DIRECTORY | READ_ATTRIBUTES | SYNCHRONIZE
READ_ATTRIBUTES_ONLY = 0x00000080
DELETE_AND_READ_ATTRIBUTES = 0x00110080  # DELETE | SYNCHRONIZE | READ_ATTRIBUTES


def message_id(resp: bytes) -> int:
    return struct.unpack_from("<Q", resp, 24)[0]


def is_async(resp: bytes) -> bool:
    return bool(struct.unpack_from("<I", resp, 16)[0] & FLAG_ASYNC)


def async_id(resp: bytes) -> int:
    assert is_async(resp), "not an async response"
    return struct.unpack_from("<Q", resp, 32)[0]


def notify_body(file_id: bytes, filter_: int, *, flags: int = 0, length: int = 4096) -> bytes:
    """MS-SMB2 2.2.35 CHANGE_NOTIFY Request."""
    return struct.pack("<HHI16sII", 32, flags, length, file_id, filter_, 0)


def changes(resp: bytes) -> list[tuple[int, str]]:
    """The FILE_NOTIFY_INFORMATION entries (MS-FSCC 2.4.42) of a
    CHANGE_NOTIFY response (MS-SMB2 2.2.36), as (action, name)."""
    body = resp[rawsmb.HEADER_SIZE :]
    structure_size, offset, length = struct.unpack_from("<HHI", body)
    assert structure_size == 9
    if length == 0:
        return []
    buf = resp[offset : offset + length]
    assert len(buf) == length
    out, at = [], 0
    while True:
        assert at % 4 == 0, "entry not 4-byte aligned"
        nxt, action, name_len = struct.unpack_from("<III", buf, at)
        out.append((action, buf[at + 12 : at + 12 + name_len].decode("utf-16-le")))
        if nxt == 0:
            return out
        at += nxt


def set_info_body(file_id: bytes, info_class: int, buffer: bytes) -> bytes:
    """MS-SMB2 2.2.39 SET_INFO Request (InfoType FILE)."""
    return struct.pack("<HBBIHHI16s", 33, 1, info_class, len(buffer), rawsmb.HEADER_SIZE + 32, 0, 0, file_id) + buffer


def rename_info(new_name: str) -> bytes:
    """MS-FSCC 2.4.37.2 FILE_RENAME_INFORMATION_TYPE_2 (class 10)."""
    n = new_name.encode("utf-16-le")
    return struct.pack("<B7xQI", 0, 0, len(n)) + n


def basic_info(attributes: int) -> bytes:
    """MS-FSCC 2.4.7 FILE_BASIC_INFORMATION (class 4): only attributes set."""
    return struct.pack("<QQQQII", 0, 0, 0, 0, attributes, 0)


def write_body(file_id: bytes, offset: int, data: bytes) -> bytes:
    """MS-SMB2 2.2.21 WRITE, data right after the 48-byte body."""
    return struct.pack("<HHIQ16sIIHHI", 49, rawsmb.HEADER_SIZE + 48, len(data), offset, file_id, 0, 0, 0, 0, 0) + data


class Client(test_locks.Client):
    """One connection, one anonymous session on the guest share, raw messages
    (send/recv/call as test_locks' client); remembers MaxTransactSize."""

    def __init__(self, srv):
        self.s = rawsmb.connect(srv.host, srv.port)
        neg = rawsmb.negotiate(self.s, dialects=(0x0202, 0x0210), credit_request=64)
        self.max_transact = struct.unpack_from("<I", neg, rawsmb.HEADER_SIZE + 28)[0]
        self.sid, self.mid = rawsmb.anonymous_logon(self.s, 1)
        self.tid = rawsmb.tree_connect(self.s, self.mid, self.sid, rf"\\{srv.host}\pub")
        self.mid += 1

    def create(self, name: str, *, disposition: int = OPEN, options: int = 0, access: int = FILE_ALL_ACCESS) -> bytes:
        """CREATE; returns the FileId (asserting success)."""
        resp = self.call(rawsmb.CREATE, create_body(name, disposition, options, access))
        assert rawsmb.status(resp) == 0, f"CREATE {name}: {rawsmb.status(resp):#x}"
        return resp[rawsmb.HEADER_SIZE + 64 : rawsmb.HEADER_SIZE + 80]

    def close_file(self, file_id: bytes) -> int:
        return rawsmb.status(self.call(CLOSE, struct.pack("<HHI16s", 24, 0, 0, file_id)))

    def watch(self, name: str, access: int = LIST_DIRECTORY_ONLY) -> bytes:
        return self.create(name, options=DIRECTORY_FILE, access=access)

    def mkdir(self, name: str) -> None:
        assert self.close_file(self.create(name, disposition=CREATE, options=DIRECTORY_FILE)) == 0

    def touch(self, name: str) -> None:
        assert self.close_file(self.create(name, disposition=CREATE, options=NON_DIRECTORY_FILE)) == 0

    def delete(self, name: str, options: int = 0) -> None:
        assert self.close_file(self.create(name, options=options | DELETE_ON_CLOSE)) == 0

    def rename(self, old: str, new: str) -> None:
        f = self.create(old)
        assert rawsmb.status(self.call(SET_INFO, set_info_body(f, 10, rename_info(new)))) == 0
        assert self.close_file(f) == 0

    def start_notify(self, file_id: bytes, filter_: int, **kw) -> tuple[int, int]:
        """Sends CHANGE_NOTIFY and expects it to wait: (message id, AsyncId)."""
        mid = self.send(CHANGE_NOTIFY, notify_body(file_id, filter_, **kw))
        interim = self.recv()
        assert (message_id(interim), rawsmb.status(interim)) == (mid, STATUS_PENDING), hex(rawsmb.status(interim))
        assert rawsmb.credits_granted(interim) >= 1
        return mid, async_id(interim)

    def final(self, mid: int) -> bytes:
        """The final response of the async request `mid` (the next message)."""
        resp = self.recv()
        assert message_id(resp) == mid and is_async(resp), f"got message {message_id(resp)}, status {rawsmb.status(resp):#x}"
        return resp

    def cancel(self, aid: int) -> None:
        self.send(CANCEL, struct.pack("<HH", 4, 0), async_id=aid)

    def set_up_watch(self, file_id: bytes, filter_: int, **kw) -> None:
        """A first request, cancelled: from then on changes are buffered."""
        mid, aid = self.start_notify(file_id, filter_, **kw)
        self.cancel(aid)
        assert rawsmb.status(self.final(mid)) == STATUS_CANCELLED

    def close(self):
        self.s.close()


def create_body(name: str, disposition: int, options: int, access: int) -> bytes:
    """MS-SMB2 2.2.13 CREATE Request, all sharing."""
    n = name.encode("utf-16-le")
    body = struct.pack(
        "<HBBIQQIIIIIHHII", 57, 0, 0, 2, 0, 0, access, 0x80, 7, disposition, options, rawsmb.HEADER_SIZE + 56, len(n), 0, 0
    )
    return body + (n or b"\0")


@pytest.fixture
def srv(server_factory):
    srv = server_factory.start([("pub", False)], security=Security(guest_shares={"pub"}))
    (srv.share_path / "d").mkdir()
    return srv


@pytest.fixture
def clients(srv):
    a, b = Client(srv), Client(srv)
    yield a, b
    a.close()
    b.close()


def test_create_rename_delete_by_another_connection_complete_the_wait(clients):
    a, b = clients
    d = a.watch("d")
    mid, _ = a.start_notify(d, NAMES)
    b.touch(r"d\f.txt")
    assert changes(a.final(mid)) == [(ADDED, "f.txt")]
    # A rename within the directory: old and new name in one response.
    mid, _ = a.start_notify(d, NAMES)
    b.rename(r"d\f.txt", r"d\g.txt")
    resp = a.final(mid)
    assert rawsmb.status(resp) == 0
    assert changes(resp) == [(OLD_NAME, "f.txt"), (NEW_NAME, "g.txt")]
    mid, _ = a.start_notify(d, NAMES)
    b.delete(r"d\g.txt")
    assert changes(a.final(mid)) == [(REMOVED, "g.txt")]
    mid, _ = a.start_notify(d, NAMES)
    b.mkdir(r"d\sub")
    assert changes(a.final(mid)) == [(ADDED, "sub")]
    mid, _ = a.start_notify(d, NAMES)
    b.delete(r"d\sub", options=DIRECTORY_FILE)
    assert changes(a.final(mid)) == [(REMOVED, "sub")]


def test_changes_between_requests_are_buffered_and_answered_at_once(clients, srv):
    a, b = clients
    d = a.watch("d")
    a.set_up_watch(d, NAMES)
    for name in ("one", "two", "three"):
        b.touch(rf"d\{name}")
    b.delete(r"d\two")
    # No interim response: the buffered changes answer the request, in order.
    resp = a.call(CHANGE_NOTIFY, notify_body(d, NAMES))
    assert not is_async(resp)
    assert rawsmb.status(resp) == 0
    assert changes(resp) == [(ADDED, "one"), (ADDED, "two"), (ADDED, "three"), (REMOVED, "two")]
    # The buffer is empty again: the next request waits.
    mid, _ = a.start_notify(d, NAMES)
    b.touch(r"d\four")
    assert changes(a.final(mid)) == [(ADDED, "four")]


def test_another_handle_without_a_request_sees_nothing(clients):
    a, b = clients
    d1, d2 = a.watch("d"), a.watch("d")
    a.set_up_watch(d1, NAMES)
    b.touch(r"d\early")  # before d2 had any request: not for d2
    mid, _ = a.start_notify(d2, NAMES)
    b.touch(r"d\late")
    assert changes(a.final(mid)) == [(ADDED, "late")]
    assert changes(a.call(CHANGE_NOTIFY, notify_body(d1, NAMES))) == [(ADDED, "early"), (ADDED, "late")]


def test_too_many_buffered_changes_give_notify_enum_dir(clients):
    a, b = clients
    d = a.watch("d")
    # The first request's length (200 bytes) bounds the buffer for good.
    a.set_up_watch(d, NAMES, length=200)
    for i in range(20):
        b.touch(rf"d\file-{i:04}")
    resp = a.call(CHANGE_NOTIFY, notify_body(d, NAMES, length=65536))
    assert (rawsmb.status(resp), changes(resp)) == (STATUS_NOTIFY_ENUM_DIR, [])
    # The overflow was reported; changes are kept again afterwards.
    b.touch(r"d\after")
    assert changes(a.call(CHANGE_NOTIFY, notify_body(d, NAMES))) == [(ADDED, "after")]


def test_changes_longer_than_the_request_give_notify_enum_dir(clients):
    a, b = clients
    d = a.watch("d")
    mid, _ = a.start_notify(d, NAMES, length=10)
    b.touch(r"d\a-name-longer-than-ten-bytes")
    assert (rawsmb.status(resp := a.final(mid)), changes(resp)) == (STATUS_NOTIFY_ENUM_DIR, [])
    b.touch(r"d\x")
    resp = a.call(CHANGE_NOTIFY, notify_body(d, NAMES, length=0))
    assert (rawsmb.status(resp), changes(resp)) == (STATUS_NOTIFY_ENUM_DIR, [])


def test_cancel_ends_the_wait_and_no_change_is_lost(clients):
    a, b = clients
    d = a.watch("d")
    mid, aid = a.start_notify(d, NAMES)
    a.cancel(aid)
    resp = a.final(mid)
    assert (async_id(resp), rawsmb.status(resp)) == (aid, STATUS_CANCELLED)
    b.touch(r"d\f")
    assert changes(a.call(CHANGE_NOTIFY, notify_body(d, NAMES))) == [(ADDED, "f")]


@pytest.mark.parametrize("how", ["close", "tree_disconnect", "logoff"])
def test_closing_the_handle_ends_the_wait_with_notify_cleanup(clients, how):
    a, _ = clients
    d = a.watch("d")
    mid, _ = a.start_notify(d, NAMES)
    if how == "close":
        close_mid = a.send(CLOSE, struct.pack("<HHI16s", 24, 0, 0, d))
    elif how == "tree_disconnect":
        close_mid = a.send(TREE_DISCONNECT, rawsmb.echo_body())
    else:
        close_mid = a.send(LOGOFF, rawsmb.echo_body())
    final = a.final(mid)
    assert (rawsmb.status(final), changes(final)) == (STATUS_NOTIFY_CLEANUP, [])
    done = a.recv()
    assert (message_id(done), rawsmb.status(done)) == (close_mid, 0)


def test_watch_tree_sees_the_whole_subtree_with_backslashes(clients):
    a, b = clients
    b.mkdir(r"d\sub")
    b.mkdir(r"d\sub\deeper")
    tree, flat = a.watch("d"), a.watch("d")
    mid_flat, _ = a.start_notify(flat, NAMES)
    mid_tree, _ = a.start_notify(tree, NAMES, flags=WATCH_TREE)
    b.touch(r"d\sub\deeper\f")
    assert changes(a.final(mid_tree)) == [(ADDED, r"sub\deeper\f")]
    # The watch of the directory alone saw nothing of that.
    b.touch(r"d\top")
    assert changes(a.final(mid_flat)) == [(ADDED, "top")]
    assert changes(a.call(CHANGE_NOTIFY, notify_body(tree, NAMES))) == [(ADDED, "top")]


def test_the_first_requests_filter_and_flags_hold_for_the_handle(clients):
    a, b = clients
    b.mkdir(r"d\sub")
    d = a.watch("d")
    a.set_up_watch(d, FILE_NAME, flags=WATCH_TREE)
    b.mkdir(r"d\ignored-dir")  # DIR_NAME: not in the first filter
    b.touch(r"d\sub\f")
    # Asked now without WATCH_TREE and for directories only: still files,
    # still the whole tree (Windows keeps the first request's).
    resp = a.call(CHANGE_NOTIFY, notify_body(d, DIR_NAME))
    assert changes(resp) == [(ADDED, r"sub\f")]


def test_rename_across_directories_is_removed_and_added(clients):
    a, b = clients
    b.mkdir(r"d\from")
    b.mkdir(r"d\to")
    b.touch(r"d\from\f")
    src, dst = a.watch(r"d\from"), a.watch(r"d\to")
    mid_src, _ = a.start_notify(src, NAMES)
    mid_dst, _ = a.start_notify(dst, NAMES)
    b.rename(r"d\from\f", r"d\to\g")
    assert changes(a.final(mid_src)) == [(REMOVED, "f")]
    assert changes(a.final(mid_dst)) == [(ADDED, "g")]


def test_a_watch_follows_its_renamed_directory(clients):
    a, b = clients
    b.mkdir(r"d\old")
    sub = a.watch(r"d\old")
    mid, _ = a.start_notify(sub, NAMES)
    b.rename(r"d\old", r"d\new")
    b.touch(r"d\new\f")
    assert changes(a.final(mid)) == [(ADDED, "f")]


def test_attribute_changes_and_writes_are_modified(clients):
    a, b = clients
    b.touch(r"d\f")
    d = a.watch("d")
    # (The first request's filter holds for the handle: it asks for all.)
    mid, _ = a.start_notify(d, ATTRIBUTES | SIZE | LAST_WRITE)
    f = b.create(r"d\f")
    assert rawsmb.status(b.call(SET_INFO, set_info_body(f, 4, basic_info(0x2)))) == 0  # HIDDEN
    assert changes(a.final(mid)) == [(MODIFIED, "f")]
    # A write is reported once, when its handle closes (as NTFS does).
    mid, _ = a.start_notify(d, SIZE | LAST_WRITE)
    b.touch(r"d\unseen")  # a name change: not in the filter
    for i in range(5):
        assert rawsmb.status(b.call(WRITE, write_body(f, i * 10, b"x" * 10))) == 0
    close_mid = b.send(CLOSE, struct.pack("<HHI16s", 24, 0, 0, f))
    assert rawsmb.status(b.recv()) == 0 and close_mid
    assert changes(a.final(mid)) == [(MODIFIED, "f")]


def test_named_streams_are_added_modified_and_removed_under_the_stream_filters(clients):
    a, b = clients
    b.touch(r"d\f")
    d = a.watch("d")
    mid, _ = a.start_notify(d, STREAM_NAME | STREAM_SIZE | STREAM_WRITE)
    s = b.create(r"d\f:Zone.Identifier", disposition=CREATE)
    assert changes(a.final(mid)) == [(ADDED_STREAM, "f:Zone.Identifier")]
    # Data written to a stream is the stream's, reported at its close.
    mid, _ = a.start_notify(d, STREAM_NAME | STREAM_SIZE | STREAM_WRITE)
    assert rawsmb.status(b.call(WRITE, write_body(s, 0, b"ZoneId=3"))) == 0
    assert b.close_file(s) == 0
    assert changes(a.final(mid)) == [(MODIFIED_STREAM, "f:Zone.Identifier")]
    mid, _ = a.start_notify(d, STREAM_NAME | STREAM_SIZE | STREAM_WRITE)
    b.delete(r"d\f:Zone.Identifier")
    assert changes(a.final(mid)) == [(REMOVED_STREAM, "f:Zone.Identifier")]
    # A watch of names alone (another handle: a handle's first filter
    # holds) hears nothing of streams.
    mid, _ = a.start_notify(a.watch("d"), NAMES)
    assert b.close_file(b.create(r"d\f:other", disposition=CREATE)) == 0
    b.touch(r"d\g")
    assert changes(a.final(mid)) == [(ADDED, "g")]


def test_a_deleted_watched_directory_ends_the_wait_with_delete_pending(clients):
    a, b = clients
    b.mkdir(r"d\gone")
    w = a.watch(r"d\gone")
    mid, _ = a.start_notify(w, NAMES)
    b.delete(r"d\gone", options=DIRECTORY_FILE)  # pending while A holds it open
    assert rawsmb.status(a.final(mid)) == STATUS_DELETE_PENDING
    assert rawsmb.status(a.call(CHANGE_NOTIFY, notify_body(w, NAMES))) == STATUS_DELETE_PENDING


def test_bad_requests_get_their_status(clients):
    a, b = clients
    b.touch(r"d\file")
    f = a.create(r"d\file")
    assert rawsmb.status(a.call(CHANGE_NOTIFY, notify_body(f, NAMES))) == rawsmb.STATUS_INVALID_PARAMETER
    no_list = a.watch("d", access=READ_ATTRIBUTES_ONLY)
    assert rawsmb.status(a.call(CHANGE_NOTIFY, notify_body(no_list, NAMES))) == STATUS_ACCESS_DENIED
    d = a.watch("d")
    too_long = notify_body(d, NAMES, length=a.max_transact + 1)
    assert rawsmb.status(a.call(CHANGE_NOTIFY, too_long)) == rawsmb.STATUS_INVALID_PARAMETER
    assert rawsmb.status(a.call(CHANGE_NOTIFY, notify_body(d, NAMES)[:20])) == rawsmb.STATUS_INVALID_PARAMETER
    # The connection goes on.
    assert rawsmb.status(a.call(rawsmb.ECHO, rawsmb.echo_body())) == 0


def test_a_notify_that_would_wait_before_the_end_of_a_compound_fails(clients):
    """Only a compound's last request may go async; a CHANGE_NOTIFY before
    it gets STATUS_INTERNAL_ERROR, as from Windows (smb2.compound.interim2),
    and the rest of the chain is served."""
    a, _ = clients
    d = a.watch("d")
    first = rawsmb.header(CHANGE_NOTIFY, a.mid, credit_request=8, session_id=a.sid, tree_id=a.tid) + notify_body(d, NAMES)
    first += b"\0" * (-len(first) % 8)
    first = first[:20] + struct.pack("<I", len(first)) + first[24:]  # NextCommand
    second = rawsmb.header(rawsmb.ECHO, a.mid + 1, credit_request=8, session_id=a.sid, tree_id=a.tid) + rawsmb.echo_body()
    a.mid += 2
    a.s.sendall(rawsmb.frame(first + second))
    resp = a.recv()
    nxt = struct.unpack_from("<I", resp, 20)[0]
    assert nxt, "one compound response expected"
    assert rawsmb.status(resp[:nxt]) == STATUS_INTERNAL_ERROR
    assert rawsmb.status(resp[nxt:]) == 0


def test_pending_notifies_per_connection_are_bounded(server_factory):
    srv = server_factory.start([("pub", False)], security=Security(guest_shares={"pub"}, limits={"max_pending_requests": 2}))
    (srv.share_path / "d").mkdir()
    a = Client(srv)
    try:
        handles = [a.watch("d") for _ in range(3)]
        for h in handles[:2]:
            a.start_notify(h, NAMES)
        assert rawsmb.status(a.call(CHANGE_NOTIFY, notify_body(handles[2], NAMES))) == STATUS_INSUFFICIENT_RESOURCES
    finally:
        a.close()
    assert "limits.max_pending_requests" in srv.log_tail()


def test_a_watcher_that_disconnects_leaves_the_server_serving(clients, srv):
    a, b = clients
    d = a.watch("d")
    a.start_notify(d, NAMES)
    a.close()
    # B's changes find the watch gone (or going) and complete nothing.
    for i in range(3):
        b.touch(rf"d\f{i}")
    c = Client(srv)
    try:
        d = c.watch("d")
        mid, _ = c.start_notify(d, NAMES)
        b.touch(r"d\seen")
        assert changes(c.final(mid)) == [(ADDED, "seen")]
    finally:
        c.close()


@pytest.mark.parametrize("change", ["by_client", "on_disk"])
def test_smbprotocol_file_system_watcher(server, change):
    """smbprotocol's FileSystemWatcher, as a real client uses it: signed,
    the change made by another client; encrypted (so its requests run on
    the blocking pool), the change made on the server's disk."""
    from smbprotocol.change_notify import ChangeNotifyFlags, CompletionFilter, FileAction, FileSystemWatcher
    from smbprotocol.connection import Connection
    from smbprotocol.open import (
        CreateDisposition,
        CreateOptions,
        DirectoryAccessMask,
        FilePipePrinterAccessMask,
        ImpersonationLevel,
        Open,
        ShareAccess,
    )
    from smbprotocol.session import Session
    from smbprotocol.tree import TreeConnect

    (server.share_path / "watched" / "sub").mkdir(parents=True)

    def connect():
        conn = Connection(uuid.uuid4(), server.host, server.port)
        conn.connect()
        session = Session(conn, server.user, server.password, require_encryption=change == "on_disk")
        session.connect()
        tree = TreeConnect(session, rf"\\{server.host}\{server.share}")
        tree.connect()
        return conn, tree

    conn1, tree1 = connect()
    conn2, tree2 = connect()
    try:
        dir_open = Open(tree1, "watched")
        dir_open.create(
            ImpersonationLevel.Impersonation,
            DirectoryAccessMask.FILE_LIST_DIRECTORY | DirectoryAccessMask.SYNCHRONIZE,
            0,
            ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
            CreateDisposition.FILE_OPEN,
            CreateOptions.FILE_DIRECTORY_FILE,
        )
        watcher = FileSystemWatcher(dir_open)
        watcher.start(
            CompletionFilter.FILE_NOTIFY_CHANGE_FILE_NAME | CompletionFilter.FILE_NOTIFY_CHANGE_DIR_NAME,
            flags=ChangeNotifyFlags.SMB2_WATCH_TREE,
        )
        done = threading.Event()
        threading.Thread(target=lambda: (watcher.wait(), done.set()), daemon=True).start()
        # The server's interim response (its AsyncId) says the watch is set
        # up; smbprotocol records it on the request without telling.
        deadline = time.monotonic() + 10
        while watcher._request.async_id is None and not done.is_set():
            assert time.monotonic() < deadline, "no interim response to the CHANGE_NOTIFY"
            time.sleep(0.005)

        if change == "on_disk":
            (server.share_path / "watched" / "sub" / "new.txt").write_bytes(b"made on the server")
        else:
            f = Open(tree2, r"watched\sub\new.txt")
            f.create(
                ImpersonationLevel.Impersonation,
                FilePipePrinterAccessMask.GENERIC_WRITE,
                0,
                ShareAccess.FILE_SHARE_READ,
                CreateDisposition.FILE_CREATE,
                CreateOptions.FILE_NON_DIRECTORY_FILE,
            )
            f.close()
        assert done.wait(30), "the watcher's request did not complete"
        result = watcher.result
        assert [(r["action"].get_value(), r["file_name"].get_value()) for r in result] == [
            (FileAction.FILE_ACTION_ADDED, "sub\\new.txt")
        ]
        dir_open.close()
    finally:
        conn2.disconnect()
        conn1.disconnect()


# --- Changes made directly on the server's disk (inotify) ---------------


def collect_until(client: Client, file_id: bytes, filter_: int, last: tuple[int, str], **kw) -> list[tuple[int, str]]:
    """CHANGE_NOTIFY requests on a handle whose watch is set up, each
    answered from the buffer or waited for, until `last` is reported; all
    the entries, in order."""
    seen: list[tuple[int, str]] = []
    while last not in seen:
        mid = client.send(CHANGE_NOTIFY, notify_body(file_id, filter_, **kw))
        resp = client.recv()
        if rawsmb.status(resp) == STATUS_PENDING:
            resp = client.final(mid)
        assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
        seen += changes(resp)
    return seen


def test_a_file_created_by_another_client_and_one_created_on_disk_are_reported(clients, srv):
    a, b = clients
    d = a.watch("d")
    mid, _ = a.start_notify(d, NAMES)
    b.touch(r"d\by-client")
    assert changes(a.final(mid)) == [(ADDED, "by-client")]
    mid, _ = a.start_notify(d, NAMES)
    (srv.share_path / "d" / "on-disk.txt").write_bytes(b"made on the server")
    assert changes(a.final(mid)) == [(ADDED, "on-disk.txt")]


def test_files_renamed_moved_and_deleted_on_disk_are_reported(clients, srv):
    a, _ = clients
    here = srv.share_path / "d"
    (here / "old").write_bytes(b"x")
    (here / "sub").mkdir()
    d = a.watch("d")
    # A rename within the directory: old and new name in one response.
    mid, _ = a.start_notify(d, NAMES)
    os.rename(here / "old", here / "new")
    assert changes(a.final(mid)) == [(OLD_NAME, "old"), (NEW_NAME, "new")]
    mid, _ = a.start_notify(d, NAMES)
    (here / "new").unlink()
    assert changes(a.final(mid)) == [(REMOVED, "new")]
    # Moved to a directory nobody watches: gone from here.
    (here / "leaving").touch()
    assert collect_until(a, d, NAMES, (ADDED, "leaving")) == [(ADDED, "leaving")]
    mid, _ = a.start_notify(d, NAMES)
    os.rename(here / "leaving", srv.share_path / "left")
    assert changes(a.final(mid)) == [(REMOVED, "leaving")]
    mid, _ = a.start_notify(d, NAMES)
    (here / "sub").rmdir()
    assert changes(a.final(mid)) == [(REMOVED, "sub")]


def test_data_and_attributes_changed_on_disk_are_modified(clients, srv):
    a, _ = clients
    f = srv.share_path / "d" / "f"
    f.write_bytes(b"")
    sizes, attrs = a.watch("d"), a.watch("d")
    # (A handle's first request sets its filter for good: one handle each.)
    mid, _ = a.start_notify(sizes, SIZE)
    with open(f, "ab") as out:
        out.write(b"appended on the server")
    assert changes(a.final(mid)) == [(MODIFIED, "f")]
    mid, _ = a.start_notify(attrs, ATTRIBUTES)
    os.chmod(f, 0o444)
    assert changes(a.final(mid)) == [(MODIFIED, "f")]
    # Neither is a name change.
    names = a.watch("d")
    a.set_up_watch(names, NAMES)
    os.chmod(f, 0o644)
    (srv.share_path / "d" / "fence").touch()
    assert collect_until(a, names, NAMES, (ADDED, "fence")) == [(ADDED, "fence")]


def test_a_change_made_through_smb_is_reported_once(clients, srv):
    """The SMB handlers report what clients change; inotify sees the same
    changes on disk (and their side effects: the DOS attributes stored in an
    extended attribute, every write). None of that may come twice."""
    a, b = clients
    d = a.watch("d")
    every_class = 0x0FFF
    a.set_up_watch(d, every_class)
    b.touch(r"d\f")
    f = b.create(r"d\f")
    assert rawsmb.status(b.call(WRITE, write_body(f, 0, b"data" * 100))) == 0
    assert rawsmb.status(b.call(SET_INFO, set_info_body(f, 4, basic_info(0x2)))) == 0  # HIDDEN
    assert b.close_file(f) == 0
    b.rename(r"d\f", r"d\g")
    b.mkdir(r"d\sub")
    b.delete(r"d\g")
    (srv.share_path / "d" / "fence").touch()
    assert collect_until(a, d, every_class, (ADDED, "fence")) == [
        (ADDED, "f"),
        (MODIFIED, "f"),  # attributes set, then the write reported at close
        (OLD_NAME, "f"),
        (NEW_NAME, "g"),
        (MODIFIED, "g"),  # a renamed file's attributes change (ARCHIVE), told at close
        (ADDED, "sub"),
        (REMOVED, "g"),
        (ADDED, "fence"),
    ]


def test_watch_tree_sees_changes_on_disk_in_subdirectories(clients, srv):
    a, b = clients
    here = srv.share_path / "d"
    (here / "sub" / "deeper").mkdir(parents=True)
    tree = a.watch("d")
    mid, _ = a.start_notify(tree, NAMES, flags=WATCH_TREE)
    (here / "sub" / "deeper" / "f").touch()
    assert changes(a.final(mid)) == [(ADDED, r"sub\deeper\f")]
    # A directory made on disk later is watched before it is reported, so
    # what is made in it next is seen.
    mid, _ = a.start_notify(tree, NAMES, flags=WATCH_TREE)
    (here / "new").mkdir()
    assert changes(a.final(mid)) == [(ADDED, "new")]
    mid, _ = a.start_notify(tree, NAMES, flags=WATCH_TREE)
    (here / "new" / "g").touch()
    assert changes(a.final(mid)) == [(ADDED, r"new\g")]
    # So is one made through SMB.
    mid, _ = a.start_notify(tree, NAMES, flags=WATCH_TREE)
    b.mkdir(r"d\by-smb")
    assert changes(a.final(mid)) == [(ADDED, "by-smb")]
    mid, _ = a.start_notify(tree, NAMES, flags=WATCH_TREE)
    (here / "by-smb" / "h").touch()
    assert changes(a.final(mid)) == [(ADDED, r"by-smb\h")]


def test_directories_past_the_disk_watch_bound_report_smb_changes_only(server_factory):
    srv = server_factory.start(
        [("pub", False)], security=Security(guest_shares={"pub"}, limits={"max_inotify_watches": 1})
    )
    (srv.share_path / "d" / "sub").mkdir(parents=True)
    a, b = Client(srv), Client(srv)
    try:
        tree = a.watch("d")
        a.set_up_watch(tree, NAMES, flags=WATCH_TREE)
        (srv.share_path / "d" / "sub" / "unseen").touch()  # d/sub has no kernel watch
        b.touch(r"d\sub\by-smb")
        (srv.share_path / "d" / "fence").touch()  # d has
        assert collect_until(a, tree, NAMES, (ADDED, "fence"), flags=WATCH_TREE) == [
            (ADDED, r"sub\by-smb"),
            (ADDED, "fence"),
        ]
    finally:
        a.close()
        b.close()
    assert "max_inotify_watches" in srv.log_tail()


def test_with_disk_watching_off_smb_changes_are_still_reported(server_factory):
    srv = server_factory.start(
        [("pub", False)], security=Security(guest_shares={"pub"}, limits={"max_inotify_watches": 0})
    )
    (srv.share_path / "d").mkdir()
    a, b = Client(srv), Client(srv)
    try:
        d = a.watch("d")
        mid, _ = a.start_notify(d, NAMES)
        (srv.share_path / "d" / "on-disk").touch()
        b.touch(r"d\by-smb")
        assert changes(a.final(mid)) == [(ADDED, "by-smb")]
    finally:
        a.close()
        b.close()


# --- What a watcher may hear of (two users) -----------------------------

MALLORY = ("mallory", "M4llory-Secret!")


class Watcher:
    """A CHANGE_NOTIFY request of an smbprotocol session on `directory`,
    pending (its interim response received) until `entries` is called."""

    def __init__(self, tree, directory: str, filter_: int, flags: int = 0):
        self.open = create(tree, directory, LIST_DIRECTORY_ONLY | SYNCHRONIZE, CreateDisposition.FILE_OPEN, directory=True)
        self.conn, self.tree, self.filter, self.flags = tree.session.connection, tree, filter_, flags
        self.request = None

    def start(self) -> None:
        req = SMB2ChangeNotifyRequest()
        req["flags"] = self.flags
        req["output_buffer_length"] = 4096
        req["file_id"] = self.open.file_id
        req["completion_filter"] = self.filter
        self.request = self.conn.send(req, self.tree.session.session_id, self.tree.tree_connect_id)
        # smbprotocol keeps the interim response's AsyncId on the request
        # without telling: wait for it, so that the watch is set up.
        deadline = time.monotonic() + 10
        while self.request.async_id is None:
            assert self.request.response is None, "the CHANGE_NOTIFY was answered at once"
            assert time.monotonic() < deadline, "no interim response to the CHANGE_NOTIFY"
            time.sleep(0.005)

    def entries(self) -> list[tuple[int, str]]:
        """The final response's entries (the request waits for it)."""
        resp = self.conn.receive(self.request, timeout=30)
        self.request = None
        return changes(resp.pack())


def alice_and_mallory(server_factory, **security):
    if server_factory.target != "nimbus":
        pytest.skip("the users' SIDs come from nimbus user list")
    srv = server_factory.start(security=Security(extra_users=[MALLORY], **security))
    return srv, user_sids(srv)


def test_a_tree_watch_hears_nothing_beneath_a_directory_its_watcher_may_not_list(server_factory):
    srv, sids = alice_and_mallory(server_factory)
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *MALLORY) as tm:
        hr = create(ta, "hr-private", READ_CONTROL | WRITE_DAC, directory=True)
        set_sd(hr, descriptor(acl(ace(DENY, 0, LIST_DIRECTORY, sids[MALLORY[0]]), ace(ALLOW, 0, FILE_ALL_ACCESS, EVERYONE))))
        hr.close()
        mallory, alice = Watcher(tm, "", NAMES, WATCH_TREE), Watcher(ta, "", NAMES, WATCH_TREE)
        mallory.start()
        alice.start()
        create(ta, r"hr-private\layoffs-2026-bob-carol-dave.xlsx", GENERIC_WRITE, CreateDisposition.FILE_CREATE).close()
        # The fence: a change mallory may hear of, made after.
        create(ta, "public.txt", GENERIC_WRITE, CreateDisposition.FILE_CREATE).close()
        assert mallory.entries() == [(ADDED, "public.txt")]
        # Alice may list hr-private: her watch saw the file first.
        assert alice.entries() == [(ADDED, r"hr-private\layoffs-2026-bob-carol-dave.xlsx")]


def test_with_access_based_enumeration_a_watch_hears_only_of_what_its_watcher_may_read(server_factory):
    srv, sids = alice_and_mallory(server_factory, abe_shares={"data"})
    only_alice = descriptor(acl(ace(ALLOW, 0, FILE_ALL_ACCESS, sids[USER])))

    def delete(tree, name: str) -> None:
        f = Open(tree, name)
        f.create(ImpersonationLevel.Impersonation, DELETE, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, CreateDisposition.FILE_OPEN, CreateOptions.FILE_DELETE_ON_CLOSE)
        f.close()

    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *MALLORY) as tm:
        mallory = Watcher(tm, "", NAMES)
        mallory.start()
        create(ta, "salaries.xlsx", GENERIC_WRITE, CreateDisposition.FILE_CREATE, sd=only_alice).close()
        create(ta, "public.txt", GENERIC_WRITE, CreateDisposition.FILE_CREATE).close()
        assert mallory.entries() == [(ADDED, "public.txt")]
        # Nor is its deletion reported; a file mallory may read is, deleted
        # as well.
        mallory.start()
        delete(ta, "salaries.xlsx")
        delete(ta, "public.txt")
        assert mallory.entries() == [(REMOVED, "public.txt")]


def rename_status(client: Client, old: str, new: str) -> int:
    """Renames the directory `old` to `new`; the SET_INFO's status."""
    f = client.create(old, options=DIRECTORY_FILE, access=DELETE_AND_READ_ATTRIBUTES)
    status = rawsmb.status(client.call(SET_INFO, set_info_body(f, 10, rename_info(new))))
    assert client.close_file(f) == 0
    return status


@pytest.mark.parametrize(
    ("watched", "access", "old", "new", "reported"),
    [
        pytest.param("", LIST_DIRECTORY_ONLY, "sub", "sub2", ("sub", "sub2"), id="parent"),
        # A watch on an ancestor is not an open of the target's directory:
        # even one holding DELETE does not stand in the way.
        pytest.param("", FILE_ALL_ACCESS, r"d\sub", r"d\sub2", (r"d\sub", r"d\sub2"), id="ancestor-with-delete"),
    ],
)
def test_renaming_a_directory_beneath_a_tree_watch_is_allowed_and_reported(clients, watched, access, old, new, reported):
    """The watch's open is on the parent or an ancestor, not beneath the
    renamed directory: MS-FSA 2.1.5.14.11 refuses a directory rename only
    for an open below it. The watcher sees the old and the new name."""
    a, b = clients
    b.mkdir(old)
    b.touch(old + r"\f")
    root = a.watch(watched, access=access)
    mid, _ = a.start_notify(root, DIR_NAME, flags=WATCH_TREE)
    assert rename_status(b, old, new) == 0
    resp = a.final(mid)
    assert rawsmb.status(resp) == 0
    assert changes(resp) == [(OLD_NAME, reported[0]), (NEW_NAME, reported[1])]


def test_a_watch_holding_delete_on_the_target_directory_refuses_the_rename(clients):
    """A rename opens the new name's directory to add an entry, sharing read
    and write only (smbtorture smb2.rename.share_delete_and_delete_access,
    as Windows answers): a watcher whose open of that directory holds DELETE
    keeps the rename out with SHARING_VIOLATION, pending notify or not. Its
    wait goes on: the next change is the first it reports."""
    a, b = clients
    b.mkdir("sub")
    root = a.watch("", access=FILE_ALL_ACCESS)
    mid, _ = a.start_notify(root, DIR_NAME, flags=WATCH_TREE)
    assert rename_status(b, "sub", "sub2") == STATUS_SHARING_VIOLATION
    b.mkdir("after")
    assert changes(a.final(mid)) == [(ADDED, "after")]
