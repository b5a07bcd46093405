"""Windows permissions: security descriptors stored per file, inherited on
create and enforced at CREATE with the MS-DTYP access check, driven with
Python smbprotocol as two users of one server (alice and bob).

- a DACL that denies bob write access and allows alice: each user's CREATE
  gets what the DACL grants (refused, or a handle with exactly the rights
  granted, MAXIMUM_ALLOWED included), and alice writes where bob cannot;
- inheritance: a directory's inheritable ACEs reach a file and a
  subdirectory made in it as Windows passes them on (CREATOR OWNER becomes
  the creator, inherit-only ACEs split off for directories), and a
  directory that does not grant FILE_ADD_FILE refuses new files;
- the SD_BUFFER create context: the descriptor given is stored as sent,
  and another user as owner is refused (no privileges here);
- DELETE from FILE_DELETE_CHILD on the parent (MS-FSA);
- hostile descriptors (bad offsets, a huge ACE count, a SID with too many
  sub-authorities) are refused with their statuses;
- the descriptor is kept in the file's `user.nimbus.sd` extended
  attribute, so it survives a rename and another server process sees it.

The SIDs come from `nimbus user list --sids`, so these tests are for
Nimbus only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
import time
import uuid

import pytest
from conftest import PASSWORD, USER, Security, run_nimbus
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.file_info import FileInformationClass, InfoType
from smbprotocol.header import NtStatus
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    ImpersonationLevel,
    Open,
    ShareAccess,
    SMB2QueryInfoRequest,
    SMB2QueryInfoResponse,
    SMB2SetInfoRequest,
    SMB2SetInfoResponse,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

TIMEOUT = 30
BOB = ("bob", "B0b-Secret!")
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE

# MS-SMB2 2.2.13.1 access mask bits.
READ_DATA = 0x1
WRITE_DATA = 0x2
APPEND_DATA = 0x4
READ_ATTRIBUTES = 0x80
DELETE_CHILD = 0x40
DELETE = 0x10000
READ_CONTROL = 0x20000
WRITE_DAC = 0x40000
SYNCHRONIZE = 0x100000
MAXIMUM_ALLOWED = 0x02000000
GENERIC_ALL = 0x10000000
GENERIC_WRITE = 0x40000000
GENERIC_READ = 0x80000000
FILE_ALL_ACCESS = 0x1F01FF
FILE_GENERIC_READ = 0x120089
FILE_GENERIC_WRITE = 0x120116
# Directory names of the same bits.
LIST_DIRECTORY = READ_DATA
ADD_FILE = WRITE_DATA
ADD_SUBDIRECTORY = APPEND_DATA
TRAVERSE = 0x20

# MS-DTYP 2.4.4.1 ACE types and flags, 2.4.6 control bits, 2.4.7
# SECURITY_INFORMATION.
ALLOW, DENY = 0, 1
OI, CI, NP, IO, INHERITED = 0x1, 0x2, 0x4, 0x8, 0x10
SELF_RELATIVE, DACL_PRESENT = 0x8000, 0x4
OWNER_INFO, GROUP_INFO, DACL_INFO, SACL_INFO = 0x1, 0x2, 0x4, 0x8

EVERYONE = "S-1-1-0"
CREATOR_OWNER = "S-1-3-0"
SYSTEM = "S-1-5-18"

STATUS_INVALID_OWNER = 0xC000005A
STATUS_INVALID_ACL = 0xC0000077
STATUS_INVALID_SID = 0xC0000078
STATUS_INVALID_SECURITY_DESCR = 0xC0000079


# --------------------------------------------------------------------------
# MS-DTYP encodings


def sid_bytes(sid: str) -> bytes:
    parts = sid.split("-")
    assert parts[0] == "S" and parts[1] == "1"
    authority = int(parts[2])
    subs = [int(p) for p in parts[3:]]
    return struct.pack("<BB", 1, len(subs)) + authority.to_bytes(6, "big") + b"".join(struct.pack("<I", s) for s in subs)


def parse_sid(b: bytes, at: int) -> tuple[str, int]:
    count = b[at + 1]
    authority = int.from_bytes(b[at + 2 : at + 8], "big")
    subs = struct.unpack_from(f"<{count}I", b, at + 8)
    return "-".join(["S-1", str(authority), *map(str, subs)]), 8 + 4 * count


def ace(kind: int, flags: int, mask: int, sid: str) -> bytes:
    s = sid_bytes(sid)
    return struct.pack("<BBHI", kind, flags, 8 + len(s), mask) + s


def acl(*aces: bytes) -> bytes:
    body = b"".join(aces)
    return struct.pack("<BBHHH", 2, 0, 8 + len(body), len(aces), 0) + body


def descriptor(dacl: bytes | None, owner: str | None = None, control: int = SELF_RELATIVE | DACL_PRESENT) -> bytes:
    body = b""
    offsets = [0, 0, 0, 0]  # owner, group, sacl, dacl
    if dacl is not None:
        offsets[3] = 20 + len(body)
        body += dacl
    if owner is not None:
        offsets[0] = 20 + len(body)
        body += sid_bytes(owner)
    return struct.pack("<BBHIIII", 1, 0, control, *offsets) + body


def parse_descriptor(b: bytes) -> dict:
    _rev, _sbz, control, owner_at, group_at, _sacl_at, dacl_at = struct.unpack_from("<BBHIIII", b, 0)
    out = {"control": control, "owner": None, "group": None, "dacl": None}
    if owner_at:
        out["owner"] = parse_sid(b, owner_at)[0]
    if group_at:
        out["group"] = parse_sid(b, group_at)[0]
    if control & DACL_PRESENT and dacl_at:
        count = struct.unpack_from("<H", b, dacl_at + 4)[0]
        at = dacl_at + 8
        aces = []
        for _ in range(count):
            kind, flags, size, mask = struct.unpack_from("<BBHI", b, at)
            aces.append((kind, flags, mask, parse_sid(b, at + 8)[0]))
            at += size
        out["dacl"] = aces
    return out


# --------------------------------------------------------------------------
# SMB helpers


@contextlib.contextmanager
def smb_tree(server, user: str, password: str):
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        session = Session(conn, user, password, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        tree = TreeConnect(session, rf"\\{server.host}\{server.share}")
        tree.connect()
        yield tree
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


def create(tree, name: str, access: int, disposition=CreateDisposition.FILE_OPEN_IF, directory: bool = False, sd: bytes | None = None) -> Open:
    f = Open(tree, name)
    contexts = None
    if sd is not None:
        from smbprotocol.create_contexts import SMB2CreateContextRequest

        ctx = SMB2CreateContextRequest()
        ctx["buffer_name"] = b"SecD"
        ctx["buffer_data"] = sd
        contexts = [ctx]
    options = CreateOptions.FILE_DIRECTORY_FILE if directory else CreateOptions.FILE_NON_DIRECTORY_FILE
    f.create(ImpersonationLevel.Impersonation, access, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, disposition, options, create_contexts=contexts)
    return f


def create_status(tree, name: str, access: int, **kw) -> int:
    try:
        f = create(tree, name, access, **kw)
    except SMBResponseException as e:
        return e.status
    f.close()
    return NtStatus.STATUS_SUCCESS


def granted_access(f: Open) -> int:
    """MS-FSCC 2.4.1 FileAccessInformation of the open."""
    return struct.unpack("<I", query(f, InfoType.SMB2_0_INFO_FILE, FileInformationClass.FILE_ACCESS_INFORMATION))[0]


def query(f: Open, info_type: int, info_class: int, additional: int = 0) -> bytes:
    req = SMB2QueryInfoRequest()
    req["info_type"] = info_type
    req["file_info_class"] = info_class
    req["output_buffer_length"] = 65536
    req["additional_information"] = additional
    req["file_id"] = f.file_id
    conn, tree = f.connection, f.tree_connect
    response = conn.receive(conn.send(req, tree.session.session_id, tree.tree_connect_id))
    resp = SMB2QueryInfoResponse()
    resp.unpack(response["data"].get_value())
    return resp["buffer"].get_value()


def get_sd(f: Open, info: int = OWNER_INFO | GROUP_INFO | DACL_INFO) -> dict:
    return parse_descriptor(query(f, InfoType.SMB2_0_INFO_SECURITY, 0, info))


def set_sd(f: Open, sd: bytes, info: int = DACL_INFO) -> None:
    req = SMB2SetInfoRequest()
    req["info_type"] = InfoType.SMB2_0_INFO_SECURITY
    req["file_info_class"] = 0
    req["additional_information"] = info
    req["file_id"] = f.file_id
    req["buffer"] = sd
    conn, tree = f.connection, f.tree_connect
    response = conn.receive(conn.send(req, tree.session.session_id, tree.tree_connect_id))
    SMB2SetInfoResponse().unpack(response["data"].get_value())


def set_sd_status(f: Open, sd: bytes, info: int = DACL_INFO) -> int:
    try:
        set_sd(f, sd, info)
    except SMBResponseException as e:
        return e.status
    return NtStatus.STATUS_SUCCESS


def user_sids(server) -> dict[str, str]:
    """name -> SID from `nimbus user list --sids` on the server's database."""
    db = server.log_path.parent / "users.db"
    out = run_nimbus("user", "list", "--db", str(db), "--sids").stdout
    return dict(line.split(" ", 1) for line in out.splitlines())


@pytest.fixture
def two_users(server_factory):
    if server_factory.target != "nimbus":
        pytest.skip("the users' SIDs come from nimbus user list")
    srv = server_factory.start(security=Security(extra_users=[BOB]))
    return srv, user_sids(srv)


# --------------------------------------------------------------------------
# tests


def test_a_dacl_decides_what_each_user_may_open(two_users):
    srv, sids = two_users
    alice, bob = sids[USER], sids[BOB[0]]
    assert alice.startswith("S-1-5-21-") and bob.startswith("S-1-5-21-") and alice != bob
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *BOB) as tb:
        f = create(ta, "doc.txt", READ_CONTROL | WRITE_DAC | WRITE_DATA, CreateDisposition.FILE_CREATE)
        f.write(b"draft", 0)
        # Before it has a DACL of its own, the file shows the asking user
        # as its owner.
        assert get_sd(f)["owner"] == alice
        dacl = acl(
            ace(DENY, 0, WRITE_DATA | APPEND_DATA, bob),
            ace(ALLOW, 0, FILE_ALL_ACCESS, alice),
            ace(ALLOW, 0, FILE_GENERIC_READ | FILE_GENERIC_WRITE, EVERYONE),
        )
        set_sd(f, descriptor(dacl))
        f.close()
        stored = get_sd(g := create(ta, "doc.txt", READ_CONTROL, CreateDisposition.FILE_OPEN))
        g.close()
        assert stored["owner"] == alice
        assert stored["dacl"] == [(DENY, 0, WRITE_DATA | APPEND_DATA, bob), (ALLOW, 0, FILE_ALL_ACCESS, alice), (ALLOW, 0, FILE_GENERIC_READ | FILE_GENERIC_WRITE, EVERYONE)]

        # bob: no write, but read; MAXIMUM_ALLOWED gets what is left.
        assert create_status(tb, "doc.txt", GENERIC_WRITE, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
        assert create_status(tb, "doc.txt", WRITE_DATA, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
        assert create_status(tb, "doc.txt", GENERIC_ALL, disposition=CreateDisposition.FILE_OVERWRITE_IF) == NtStatus.STATUS_ACCESS_DENIED
        r = create(tb, "doc.txt", GENERIC_READ, CreateDisposition.FILE_OPEN)
        assert granted_access(r) == FILE_GENERIC_READ
        assert r.read(0, 5) == b"draft"
        r.close()
        m = create(tb, "doc.txt", MAXIMUM_ALLOWED, CreateDisposition.FILE_OPEN)
        got = granted_access(m)
        m.close()
        assert got & (WRITE_DATA | APPEND_DATA) == 0
        assert got & READ_DATA and got & READ_CONTROL
        assert got & WRITE_DAC == 0  # bob is not the owner
        # Nor add a named stream to it, whatever access he asks for.
        assert create_status(tb, "doc.txt:notes", READ_ATTRIBUTES, disposition=CreateDisposition.FILE_CREATE) == NtStatus.STATUS_ACCESS_DENIED
        assert create_status(ta, "doc.txt:notes", READ_ATTRIBUTES, disposition=CreateDisposition.FILE_CREATE) == NtStatus.STATUS_SUCCESS
        # bob may not change the DACL either.
        assert create_status(tb, "doc.txt", WRITE_DAC, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED

        # alice: everything, and her write lands.
        w = create(ta, "doc.txt", GENERIC_WRITE | GENERIC_READ, CreateDisposition.FILE_OPEN)
        w.write(b"final", 0)
        w.close()
        m = create(ta, "doc.txt", MAXIMUM_ALLOWED, CreateDisposition.FILE_OPEN)
        assert granted_access(m) == FILE_ALL_ACCESS
        m.close()
    assert (srv.share_path / "doc.txt").read_bytes() == b"final"


def test_children_inherit_a_directorys_inheritable_aces(two_users):
    srv, sids = two_users
    alice, bob = sids[USER], sids[BOB[0]]
    dir_rights = LIST_DIRECTORY | ADD_FILE | ADD_SUBDIRECTORY | TRAVERSE | READ_ATTRIBUTES | READ_CONTROL | SYNCHRONIZE
    parent = acl(
        ace(ALLOW, CI, dir_rights, EVERYONE),  # this folder and subfolders
        ace(ALLOW, OI | IO, GENERIC_READ, EVERYONE),  # files: read
        ace(ALLOW, OI | CI | IO, GENERIC_ALL, CREATOR_OWNER),  # the creator: all
        ace(ALLOW, 0, FILE_ALL_ACCESS, alice),  # this folder only
    )
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *BOB) as tb:
        d = create(ta, "proj", READ_CONTROL | WRITE_DAC, directory=True)
        set_sd(d, descriptor(parent))
        d.close()

        # A file bob makes: Everyone may read it, bob (its creator) all.
        f = create(tb, r"proj\b.txt", GENERIC_READ | GENERIC_WRITE, CreateDisposition.FILE_CREATE)
        f.write(b"bob's", 0)
        sd = get_sd(f)
        f.close()
        assert sd["owner"] == bob
        assert sd["dacl"] == [(ALLOW, 0, FILE_GENERIC_READ, EVERYONE), (ALLOW, 0, FILE_ALL_ACCESS, bob)]
        assert create_status(ta, r"proj\b.txt", WRITE_DATA, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
        r = create(ta, r"proj\b.txt", GENERIC_READ, CreateDisposition.FILE_OPEN)
        assert r.read(0, 5) == b"bob's"
        r.close()

        # A directory bob makes: the ACEs it passes on as well as its own.
        s = create(tb, r"proj\sub", READ_CONTROL, CreateDisposition.FILE_CREATE, directory=True)
        sd = get_sd(s)
        s.close()
        assert sd["dacl"] == [
            (ALLOW, CI, dir_rights, EVERYONE),
            (ALLOW, OI | IO, GENERIC_READ, EVERYONE),
            (ALLOW, 0, FILE_ALL_ACCESS, bob),
            (ALLOW, OI | CI | IO, GENERIC_ALL, CREATOR_OWNER),
        ]
        # Two levels down, alice's file gets the same rules.
        g = create(ta, r"proj\sub\a.txt", GENERIC_WRITE, CreateDisposition.FILE_CREATE)
        assert get_sd(g, DACL_INFO)["dacl"] == [(ALLOW, 0, FILE_GENERIC_READ, EVERYONE), (ALLOW, 0, FILE_ALL_ACCESS, alice)]
        g.close()

        # A directory that grants bob no FILE_ADD_FILE refuses his files.
        p = create(ta, "private", READ_CONTROL | WRITE_DAC, directory=True)
        set_sd(p, descriptor(acl(ace(ALLOW, OI | CI, FILE_ALL_ACCESS, alice), ace(ALLOW, 0, LIST_DIRECTORY | TRAVERSE | READ_ATTRIBUTES | SYNCHRONIZE, EVERYONE))))
        p.close()
        assert create_status(tb, r"private\x.txt", GENERIC_WRITE, disposition=CreateDisposition.FILE_CREATE) == NtStatus.STATUS_ACCESS_DENIED
        assert create_status(ta, r"private\x.txt", GENERIC_WRITE, disposition=CreateDisposition.FILE_CREATE) == NtStatus.STATUS_SUCCESS
    assert not (srv.share_path / "private" / "x.txt").exists() or (srv.share_path / "private" / "x.txt").stat().st_size == 0
    # Kept with the file, in the extended attribute, version 1.
    value = os.getxattr(srv.share_path / "proj" / "b.txt", "user.nimbus.sd")
    assert value[0] == 1 and parse_descriptor(value[1:])["owner"] == bob


def test_create_context_descriptor_and_owner(two_users):
    srv, sids = two_users
    alice, bob = sids[USER], sids[BOB[0]]
    wanted = acl(ace(ALLOW, 0, FILE_GENERIC_READ, EVERYONE), ace(ALLOW, 0, FILE_ALL_ACCESS, alice))
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *BOB) as tb:
        # Given at create: stored as sent, the creator gets what it asked for.
        f = create(ta, "given.txt", GENERIC_ALL, CreateDisposition.FILE_CREATE, sd=descriptor(wanted, owner=alice))
        assert granted_access(f) == FILE_ALL_ACCESS
        sd = get_sd(f)
        f.close()
        assert sd["owner"] == alice and sd["dacl"] == [(ALLOW, 0, FILE_GENERIC_READ, EVERYONE), (ALLOW, 0, FILE_ALL_ACCESS, alice)]
        assert create_status(tb, "given.txt", GENERIC_WRITE, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
        # Nothing inherited and no DACL given: the creator and SYSTEM.
        f = create(tb, "empty.txt", GENERIC_ALL, CreateDisposition.FILE_CREATE, sd=descriptor(None, control=SELF_RELATIVE))
        sd = get_sd(f)
        f.close()
        assert sd["owner"] == bob and sd["dacl"] == [(ALLOW, 0, FILE_ALL_ACCESS, bob), (ALLOW, 0, FILE_ALL_ACCESS, SYSTEM)]
        # Someone else as owner needs a privilege nobody has here.
        assert create_status(tb, "theirs.txt", GENERIC_ALL, disposition=CreateDisposition.FILE_CREATE, sd=descriptor(wanted, owner=alice)) == STATUS_INVALID_OWNER
        g = create(ta, "given.txt", READ_CONTROL | WRITE_DAC | 0x80000, CreateDisposition.FILE_OPEN)
        assert set_sd_status(g, descriptor(None, owner=bob), OWNER_INFO) == STATUS_INVALID_OWNER
        # Writing back the owner it has is no change.
        assert set_sd_status(g, descriptor(None, owner=alice), OWNER_INFO) == NtStatus.STATUS_SUCCESS
        g.close()
    assert not (srv.share_path / "theirs.txt").exists()


def test_delete_through_the_parent(two_users):
    srv, sids = two_users
    alice = sids[USER]
    no_delete = FILE_ALL_ACCESS & ~DELETE & ~DELETE_CHILD
    with smb_tree(srv, USER, PASSWORD) as ta:
        d = create(ta, "box", READ_CONTROL | WRITE_DAC, directory=True)
        set_sd(d, descriptor(acl(ace(ALLOW, OI, no_delete, alice), ace(ALLOW, 0, no_delete, alice))))
        d.close()
        create(ta, r"box\f.txt", GENERIC_WRITE, CreateDisposition.FILE_CREATE).close()
        # Neither the file nor its directory grants DELETE.
        assert create_status(ta, r"box\f.txt", DELETE, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
        # FILE_DELETE_CHILD on the directory does.
        d = create(ta, "box", READ_CONTROL | WRITE_DAC, CreateDisposition.FILE_OPEN, directory=True)
        set_sd(d, descriptor(acl(ace(ALLOW, 0, FILE_ALL_ACCESS, alice))))
        d.close()
        f = Open(ta, r"box\f.txt")
        f.create(ImpersonationLevel.Impersonation, DELETE, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, CreateDisposition.FILE_OPEN, CreateOptions.FILE_NON_DIRECTORY_FILE | CreateOptions.FILE_DELETE_ON_CLOSE)
        f.close()
    assert not (srv.share_path / "box" / "f.txt").exists()


def test_hostile_descriptors_are_refused(two_users):
    srv, sids = two_users
    alice = sids[USER]
    good = descriptor(acl(ace(ALLOW, 0, FILE_ALL_ACCESS, alice)))
    with smb_tree(srv, USER, PASSWORD) as ta:
        f = create(ta, "target.txt", READ_CONTROL | WRITE_DAC, CreateDisposition.FILE_CREATE)
        past_end = bytearray(good)
        struct.pack_into("<I", past_end, 16, len(good) + 4)
        assert set_sd_status(f, bytes(past_end)) == STATUS_INVALID_SECURITY_DESCR
        into_header = bytearray(good)
        struct.pack_into("<I", into_header, 16, 8)
        assert set_sd_status(f, bytes(into_header)) == STATUS_INVALID_SECURITY_DESCR
        huge_count = bytearray(good)
        struct.pack_into("<H", huge_count, 20 + 4, 0xFFFF)
        assert set_sd_status(f, bytes(huge_count)) == STATUS_INVALID_ACL
        huge_size = bytearray(good)
        struct.pack_into("<H", huge_size, 20 + 2, 0xFFFF)
        assert set_sd_status(f, bytes(huge_size)) == STATUS_INVALID_ACL
        bad_sid = bytearray(good)
        bad_sid[20 + 8 + 8 + 1] = 16  # the ACE's SID: 16 sub-authorities
        assert set_sd_status(f, bytes(bad_sid)) in (STATUS_INVALID_ACL, STATUS_INVALID_SID)
        assert set_sd_status(f, good[:10]) == STATUS_INVALID_SECURITY_DESCR
        assert create_status(ta, "ctx.txt", GENERIC_ALL, disposition=CreateDisposition.FILE_CREATE, sd=bytes(huge_count)) == STATUS_INVALID_ACL
        # Nothing was stored by the refusals.
        assert get_sd(f)["owner"] == alice
        f.close()
    assert not (srv.share_path / "ctx.txt").exists()
    assert srv.alive()


def test_descriptor_follows_rename_and_another_server_process(two_users, server_factory):
    srv, sids = two_users
    alice, bob = sids[USER], sids[BOB[0]]
    with smb_tree(srv, USER, PASSWORD) as ta:
        f = create(ta, "keep.txt", READ_CONTROL | WRITE_DAC | DELETE, CreateDisposition.FILE_CREATE)
        set_sd(f, descriptor(acl(ace(ALLOW, 0, FILE_ALL_ACCESS, alice), ace(DENY, 0, READ_DATA, bob))))
        f.close()
    os.rename(srv.share_path / "keep.txt", srv.share_path / "moved.txt")
    # A second server process on the same directory: what it shows was read
    # from the disk, not from the first one's memory.
    again = server_factory.start(security=Security(extra_users=[BOB]), paths={"data": srv.share_path})
    # The same accounts: the first server's user database (machine SID and
    # RIDs), which the new server loads when it sees the file change.
    shutil.copy2(srv.log_path.parent / "users.db", again.log_path.parent / "users.db")
    assert user_sids(again) == sids
    with smb_tree(again, USER, PASSWORD) as ta, smb_tree(again, *BOB) as tb:
        g = create(ta, "moved.txt", READ_CONTROL | READ_DATA, CreateDisposition.FILE_OPEN)
        sd = get_sd(g)
        g.close()
        assert create_status(tb, "moved.txt", READ_DATA, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
    assert sd["owner"] == alice
    assert sd["dacl"] == [(ALLOW, 0, FILE_ALL_ACCESS, alice), (DENY, 0, READ_DATA, bob)]


def test_a_group_of_the_server_is_granted_as_a_whole(two_users):
    """`nimbus group set` makes a group of the user database; an ACE for
    it applies to its members from their next logon, to nobody else."""
    srv, sids = two_users
    db = srv.log_path.parent / "users.db"
    run_nimbus("group", "set", "editors", "--db", str(db), "--members", USER)
    listed = run_nimbus("group", "list", "--db", str(db)).stdout.split()
    assert listed[0] == "editors" and listed[2] == USER, listed
    editors = listed[1]
    assert editors.rsplit("-", 1)[0] == sids[USER].rsplit("-", 1)[0]
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *BOB) as tb:
        f = create(ta, "shared.txt", READ_CONTROL | WRITE_DAC, CreateDisposition.FILE_CREATE)
        set_sd(f, descriptor(acl(ace(ALLOW, 0, FILE_GENERIC_READ | FILE_GENERIC_WRITE, editors), ace(ALLOW, 0, FILE_GENERIC_READ, EVERYONE))))
        f.close()
        w = create(ta, "shared.txt", GENERIC_WRITE, CreateDisposition.FILE_OPEN)
        w.write(b"edited", 0)
        w.close()
        assert create_status(tb, "shared.txt", GENERIC_WRITE, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_ACCESS_DENIED
        assert create_status(tb, "shared.txt", GENERIC_READ, disposition=CreateDisposition.FILE_OPEN) == NtStatus.STATUS_SUCCESS
    # bob joins: his next logon carries the group, once the server has
    # reloaded the database (it looks at most once a second, at a logon).
    run_nimbus("group", "set", "editors", "--db", str(db), "--members", f"{USER},{BOB[0]}")
    reloads = srv.log_path.read_text().count("changed: reloaded")
    deadline = time.monotonic() + 10
    while srv.log_path.read_text().count("changed: reloaded") == reloads:
        assert time.monotonic() < deadline, "the server did not reload its user database"
        time.sleep(0.2)
        with smb_tree(srv, *BOB):
            pass
    with smb_tree(srv, *BOB) as tb:
        w = create(tb, "shared.txt", GENERIC_WRITE, CreateDisposition.FILE_OPEN)
        w.write(b"by bob", 0)
        w.close()
    assert (srv.share_path / "shared.txt").read_bytes() == b"by bob"
    bad = run_nimbus("group", "set", "x", "--db", str(db), "--members", "nobody", check=False)
    assert bad.returncode != 0 and "nobody" in bad.stderr


def test_access_based_enumeration_lists_only_what_the_user_may_read(server_factory):
    """A share with `access_based_enumeration = true` leaves out of
    listings what the user may not read (its TREE_CONNECT flag is checked by
    smbtorture's smb2.acls.ACCESSBASED)."""
    if server_factory.target != "nimbus":
        pytest.skip("the users' SIDs come from nimbus user list")
    srv = server_factory.start(security=Security(extra_users=[BOB], abe_shares={"data"}))
    sids = user_sids(srv)
    alice = sids[USER]
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *BOB) as tb:
        for name in ("open.txt", "mine.txt"):
            create(ta, name, GENERIC_WRITE, CreateDisposition.FILE_CREATE).close()
        f = create(ta, "mine.txt", READ_CONTROL | WRITE_DAC, CreateDisposition.FILE_OPEN)
        set_sd(f, descriptor(acl(ace(ALLOW, 0, FILE_ALL_ACCESS, alice))))
        f.close()

        def names(tree) -> set[str]:
            d = create(tree, "", LIST_DIRECTORY | READ_ATTRIBUTES | SYNCHRONIZE, CreateDisposition.FILE_OPEN, directory=True)
            try:
                entries = d.query_directory("*", FileInformationClass.FILE_NAMES_INFORMATION)
            finally:
                d.close()
            return {e["file_name"].get_value().decode("utf-16-le") for e in entries} - {".", ".."}

        assert names(ta) == {"open.txt", "mine.txt"}
        assert names(tb) == {"open.txt"}


def test_a_rename_may_not_replace_what_the_user_may_not_delete(two_users):
    srv, sids = two_users
    alice, bob = sids[USER], sids[BOB[0]]
    dir_rights = LIST_DIRECTORY | ADD_FILE | TRAVERSE | READ_ATTRIBUTES | READ_CONTROL | SYNCHRONIZE
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *BOB) as tb:
        d = create(ta, "box2", READ_CONTROL | WRITE_DAC, directory=True)
        # Everyone may add files here, nobody but alice may delete them.
        set_sd(d, descriptor(acl(ace(ALLOW, 0, dir_rights, EVERYONE), ace(ALLOW, OI, FILE_ALL_ACCESS, CREATOR_OWNER), ace(ALLOW, 0, FILE_ALL_ACCESS, alice))))
        d.close()
        t = create(ta, r"box2\target.txt", GENERIC_WRITE, CreateDisposition.FILE_CREATE)
        t.write(b"alice's", 0)
        t.close()
        s = create(tb, r"box2\src.txt", GENERIC_WRITE | DELETE, CreateDisposition.FILE_CREATE)
        s.write(b"bob's", 0)
        req = SMB2SetInfoRequest()
        req["info_type"] = InfoType.SMB2_0_INFO_FILE
        req["file_info_class"] = FileInformationClass.FILE_RENAME_INFORMATION
        req["file_id"] = s.file_id
        name = r"box2\target.txt".encode("utf-16-le")
        req["buffer"] = struct.pack("<B7xQI", 1, 0, len(name)) + name
        conn = s.connection
        with pytest.raises(SMBResponseException) as refused:
            conn.receive(conn.send(req, tb.session.session_id, tb.tree_connect_id))
        assert refused.value.status == NtStatus.STATUS_ACCESS_DENIED
        s.close()
    assert (srv.share_path / "box2" / "target.txt").read_bytes() == b"alice's"
    assert (srv.share_path / "box2" / "src.txt").read_bytes() == b"bob's"


def test_an_empty_descriptor_query_needs_no_access(server):
    """QUERY_INFO of a security descriptor with AdditionalInformation 0
    asks for no part: Windows and Samba answer the empty self-relative
    descriptor (revision 1, SE_SELF_RELATIVE only, no owner, group or ACL:
    20 bytes) through any open. Each part still needs its right: the owner,
    group and DACL READ_CONTROL, the SACL ACCESS_SYSTEM_SECURITY."""
    with smb_tree(server, USER, PASSWORD) as tree:
        f = create(tree, "plain.txt", READ_ATTRIBUTES, CreateDisposition.FILE_CREATE)
        empty = query(f, InfoType.SMB2_0_INFO_SECURITY, 0, 0)
        assert empty == struct.pack("<BBHIIII", 1, 0, SELF_RELATIVE, 0, 0, 0, 0), empty.hex()
        for part in (OWNER_INFO, GROUP_INFO, DACL_INFO, SACL_INFO):
            with pytest.raises(SMBResponseException) as refused:
                query(f, InfoType.SMB2_0_INFO_SECURITY, 0, part)
            assert refused.value.status == NtStatus.STATUS_ACCESS_DENIED, hex(part)
        f.close()
        g = create(tree, "plain.txt", READ_CONTROL)
        assert query(g, InfoType.SMB2_0_INFO_SECURITY, 0, 0) == empty
        assert get_sd(g)["owner"] is not None
        with pytest.raises(SMBResponseException) as refused:
            query(g, InfoType.SMB2_0_INFO_SECURITY, 0, SACL_INFO)
        assert refused.value.status == NtStatus.STATUS_ACCESS_DENIED
        g.close()
