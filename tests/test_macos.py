"""What a Mac expects (issue 17, item 8): Apple's SMB extensions, driven
through smbprotocol with the create contexts and requests macOS sends.
smbtorture's vfs.fruit suite (tests/test_smbtorture.py) checks the rules
case by case; these tests check what a Mac user would see.

- The AAPL create context: the server answers with its capabilities (Unix
  based, READ_DIR_ATTR, OSX copyfile, NFS ACEs), no volume capabilities and
  its model string (`apple_model`, "Xserve" by default); a malformed query
  is refused.
- Finder information (AFP_AfpInfo) is kept as one 60-byte record: it exists
  once written, reads back whole, and goes when written empty.
- A Mac's listing (FileIdBothDirectoryInformation after READ_DIR_ATTR)
  carries each file's resource fork size, Finder type/creator and Unix
  mode; another client's listing of the same directory keeps 8.3 names.
- A Finder copy (a copy-chunk request without chunks) copies the file with
  its Finder information and resource fork; deleting a resource fork that
  holds data is ignored, as on a Mac; the Unix mode a Mac sets through an
  S-1-5-88-3 ACE is the file's mode on the server's disk.
- A Mac may rename a folder while a file in it is open; Windows may not.
- Files copied with AppleDouble companions (`._name`) show their streams to
  a Mac, converted only for a session that may write them into the file:
  a companion another user drops beside a file he may not write changes
  nothing of it, whatever he opens or lists.
"""

from __future__ import annotations

import os
import stat
import struct

import pytest
from smbprotocol.create_contexts import SMB2CreateContextRequest
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.open import CreateDisposition, CreateOptions, FileAttributes, ImpersonationLevel, Open, SMB2QueryDirectoryRequest, SMB2QueryInfoRequest, SMB2SetInfoRequest
from conftest import PASSWORD, USER, Security
from test_acl import ALLOW, FILE_ALL_ACCESS, GENERIC_READ, GENERIC_WRITE, acl, ace, create, descriptor, set_sd, smb_tree, user_sids
from test_eas import ALL_ACCESS, SHARE_ALL, SUCCESS, call, query
from test_eas import tree as connect
from test_server_side_copy import FSCTL_SRV_COPYCHUNK_WRITE, copy, resume_key
from test_streams import streams_of

pytestmark = pytest.mark.nimbus_only

STREAM_INFO, ID_BOTH_DIR = 22, 37
OBJECT_NAME_NOT_FOUND = 0xC0000034
INVALID_PARAMETER = 0xC000000D
ACCESS_DENIED = 0xC0000022
ALLOTTED_SPACE_EXCEEDED = 0xC0000099
READ_CONTROL, WRITE_DAC, DELETE = 0x20000, 0x40000, 0x10000

# The AAPL server query macOS sends: command 1, reserved, request bitmap
# (server caps, volume caps, model), client caps (READ_DIR_ATTR, UNIX_BASED,
# NFS_ACE).
AAPL_QUERY = struct.pack("<IIQQ", 1, 0, 7, 0x0D)


def aapl(data: bytes = AAPL_QUERY) -> SMB2CreateContextRequest:
    c = SMB2CreateContextRequest()
    c["buffer_name"] = b"AAPL"
    c["buffer_data"] = data
    return c


def open_path(t, name: str, access=ALL_ACCESS, disposition=CreateDisposition.FILE_OPEN_IF, directory=False, contexts=None):
    """(Open, its response contexts)."""
    f = Open(t, name)
    options = CreateOptions.FILE_DIRECTORY_FILE if directory else CreateOptions.FILE_NON_DIRECTORY_FILE
    attrs = FileAttributes.FILE_ATTRIBUTE_DIRECTORY if directory else FileAttributes.FILE_ATTRIBUTE_NORMAL
    answered = f.create(ImpersonationLevel.Impersonation, access, attrs, SHARE_ALL, disposition, options, contexts)
    return f, answered or []


def become_a_mac(t) -> bytes:
    """The AAPL exchange of a Mac's first CREATE (on the share root); the
    reply's context data."""
    root, answered = open_path(t, "", access=0x100081, disposition=CreateDisposition.FILE_OPEN, directory=True, contexts=[aapl()])
    root.close()
    replies = [a for a in answered if isinstance(a, bytes)]
    assert len(replies) == 1
    return replies[0]


def status_of(fn) -> int:
    try:
        fn()
        return SUCCESS
    except SMBResponseException as e:
        return e.status


def afp_info(finder_info: bytes) -> bytes:
    """A 60-byte AfpInfo: "AFP\\0", version 1, backup time never, Finder info."""
    return b"AFP\0" + bytes([0, 0, 1, 0]) + b"\0" * 4 + bytes([0x80, 0, 0, 0]) + finder_info.ljust(32, b"\0") + b"\0" * 12


def write_stream(t, name: str, data: bytes, offset: int = 0) -> None:
    f, _ = open_path(t, name)
    f.write(data, offset)
    f.close()


def read_stream(t, name: str, length: int = 4096, offset: int = 0) -> bytes:
    f, _ = open_path(t, name, disposition=CreateDisposition.FILE_OPEN)
    try:
        return f.read(offset, length)
    finally:
        f.close()


def listing(t, directory: str, pattern: str) -> dict[str, bytes]:
    """FileIdBothDirectoryInformation entries of `directory` matching
    `pattern`: name -> the entry's raw bytes."""
    d, _ = open_path(t, directory, access=0x100081, disposition=CreateDisposition.FILE_OPEN, directory=True)
    try:
        req = SMB2QueryDirectoryRequest()
        req["file_information_class"] = ID_BOTH_DIR
        req["flags"] = 0x01
        req["file_id"] = d.file_id
        req["output_buffer_length"] = 65536
        req["buffer"] = pattern.encode("utf-16-le")
        status, body = call(d, req)
        assert status == SUCCESS
        offset, length = struct.unpack_from("<HI", body, 2)
        buf = body[offset - 64 : offset - 64 + length]
    finally:
        d.close()
    out, at = {}, 0
    while True:
        nxt = struct.unpack_from("<I", buf, at)[0]
        name_len = struct.unpack_from("<I", buf, at + 60)[0]
        out[buf[at + 104 : at + 104 + name_len].decode("utf-16-le")] = buf[at : at + 104]
        if nxt == 0:
            return out
        at += nxt


def test_the_aapl_reply_names_the_capabilities_served_and_the_model(server):
    with connect(server) as t:
        reply = become_a_mac(t)
        command, _, bitmap, server_caps, volume_caps, _, model_len = struct.unpack_from("<IIQQQII", reply)
        assert (command, bitmap) == (1, 7)
        # UNIX_BASED, READ_DIR_ATTR, OSX_COPYFILE, NFS_ACE; names compare
        # without case, so no CASE_SENSITIVE volume.
        assert (server_caps, volume_caps) == (0x0F, 0)
        assert reply[40 : 40 + model_len].decode("utf-16-le") == "Xserve"
        # Asked again on the same connection, answered again.
        assert become_a_mac(t) == reply
        # A query of another length is refused before anything is made.
        assert status_of(lambda: open_path(t, "made", contexts=[aapl(AAPL_QUERY[:20])])) == INVALID_PARAMETER
        assert not (server.share_path / "made").exists()


def test_finder_information_is_one_record_that_exists_once_written_and_goes_when_emptied(server):
    with connect(server) as t:
        f, _ = open_path(t, "doc.txt")
        # Created but not written: its own handle reads an empty record...
        info, _ = open_path(t, "doc.txt:AFP_AfpInfo")
        assert info.read(0, 60) == afp_info(b"")
        # ...nobody else finds it, and the file does not list it.
        assert status_of(lambda: open_path(t, "doc.txt:AFP_AfpInfo", disposition=CreateDisposition.FILE_OPEN)) == OBJECT_NAME_NOT_FOUND
        assert streams_of(f) == {"::$DATA": 0}
        # Only a record is written; then it is there for everyone.
        with pytest.raises(SMBResponseException) as e:
            info.write(b"\0" * 60, 0)
        assert e.value.status == INVALID_PARAMETER
        info.write(afp_info(b"TEXTttxt"), 0)
        assert streams_of(f) == {"::$DATA": 0, ":AFP_AfpInfo:$DATA": 60}
        # Its size is fixed.
        assert set_eof(info, 61) == ALLOTTED_SPACE_EXCEEDED
        assert set_eof(info, 0) == SUCCESS
        info.close()
        assert read_stream(t, "doc.txt:AFP_AfpInfo")[16:24] == b"TEXTttxt"
        # Read whole, whatever the offset within it.
        assert read_stream(t, "doc.txt:AFP_AfpInfo", 4, offset=16) == b"AFP\0"
        # Written with empty Finder information, it is gone.
        info, _ = open_path(t, "doc.txt:AFP_AfpInfo")
        info.write(afp_info(b""), 0)
        assert streams_of(f) == {"::$DATA": 0}
        info.close()
        f.close()
        assert status_of(lambda: read_stream(t, "doc.txt:AFP_AfpInfo")) == OBJECT_NAME_NOT_FOUND


def set_info(f: Open, info_type: int, info_class: int, buf: bytes, additional: int = 0) -> int:
    req = SMB2SetInfoRequest()
    req["info_type"] = info_type
    req["file_info_class"] = info_class
    req["additional_information"] = additional
    req["file_id"] = f.file_id
    req["buffer"] = buf
    return call(f, req)[0]


def set_eof(f: Open, size: int) -> int:
    return set_info(f, 1, 20, struct.pack("<Q", size))


def test_a_macs_listing_carries_finder_information_and_the_resource_fork_size(server):
    with connect(server) as mac, connect(server) as windows:
        become_a_mac(mac)
        d, _ = open_path(mac, "folder", directory=True)
        d.close()
        write_stream(mac, r"folder\Long file name.txt", b"x" * 10)
        write_stream(mac, r"folder\Long file name.txt:AFP_AfpInfo", afp_info(b"TEXTttxt"))
        write_stream(mac, r"folder\Long file name.txt:AFP_Resource", b"r" * 300)
        os.chmod(server.share_path / "folder" / "Long file name.txt", 0o640)
        entry = listing(mac, "folder", "Long*")["Long file name.txt"]
        max_access, short_len = struct.unpack_from("<IB", entry, 64)
        assert max_access & 0x1F01FF == 0x1F01FF
        assert short_len == 24
        assert struct.unpack_from("<Q", entry, 70)[0] == 300
        assert entry[78:86] == b"TEXTttxt"
        assert struct.unpack_from("<H", entry, 94)[0] == stat.S_IFREG | 0o640
        # Windows, on the same server, sees the 8.3 name.
        entry = listing(windows, "folder", "Long*")["Long file name.txt"]
        short_len = entry[68]
        short = entry[70 : 70 + short_len].decode("utf-16-le")
        assert "~" in short and short.endswith(".TXT")


def test_a_finder_copy_takes_the_streams_along(server):
    with connect(server) as t:
        become_a_mac(t)
        data = os.urandom(200_000)
        write_stream(t, "orig.bin", data)
        write_stream(t, "orig.bin:AFP_AfpInfo", afp_info(b"BINAmacs"))
        write_stream(t, "orig.bin:AFP_Resource", b"resource fork")
        write_stream(t, "orig.bin:com.apple.metadata\uf022_kMDItemWhereFroms", b"bplist00")
        src, _ = open_path(t, "orig.bin", disposition=CreateDisposition.FILE_OPEN)
        dst, _ = open_path(t, "copy.bin", disposition=CreateDisposition.FILE_CREATE)
        status, counts = copy(dst, resume_key(src), [], code=FSCTL_SRV_COPYCHUNK_WRITE)
        assert status == SUCCESS and counts == (0, 0, len(data))
        assert streams_of(dst) == streams_of(src)
        src.close()
        dst.close()
        assert (server.share_path / "copy.bin").read_bytes() == data
        assert read_stream(t, "copy.bin:AFP_Resource") == b"resource fork"
        assert read_stream(t, "copy.bin:AFP_AfpInfo", 60)[16:24] == b"BINAmacs"


def test_a_chunkless_copy_from_a_windows_client_copies_nothing(server):
    with connect(server) as t:
        write_stream(t, "src.bin", b"data")
        src, _ = open_path(t, "src.bin", disposition=CreateDisposition.FILE_OPEN)
        dst, _ = open_path(t, "dst.bin", disposition=CreateDisposition.FILE_CREATE)
        status, counts = copy(dst, resume_key(src), [], code=FSCTL_SRV_COPYCHUNK_WRITE)
        assert status == SUCCESS and counts == (0, 0, 0)
        src.close()
        dst.close()
        assert (server.share_path / "dst.bin").read_bytes() == b""


def test_a_resource_fork_with_data_survives_a_delete_and_an_empty_one_is_not_shown(server):
    with connect(server) as t:
        write_stream(t, "app:AFP_Resource", b"fork")
        # Delete-on-close on a resource fork with data: ignored.
        g = Open(t, "app:AFP_Resource")
        g.create(ImpersonationLevel.Impersonation, DELETE | 0x80, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, CreateDisposition.FILE_OPEN, CreateOptions.FILE_DELETE_ON_CLOSE)
        g.close()
        assert read_stream(t, "app:AFP_Resource") == b"fork"
        # Emptied, it is no longer listed.
        h, _ = open_path(t, "app:AFP_Resource")
        assert set_eof(h, 0) == SUCCESS
        h.close()
        base, _ = open_path(t, "app", disposition=CreateDisposition.FILE_OPEN)
        assert streams_of(base) == {"::$DATA": 0}
        base.close()


def nfs_aces(sd: bytes) -> dict[int, int]:
    """The S-1-5-88-<kind>-<value> ACEs of a self-relative descriptor's DACL."""
    dacl_at = struct.unpack_from("<I", sd, 16)[0]
    count = struct.unpack_from("<H", sd, dacl_at + 4)[0]
    out, at = {}, dacl_at + 8
    for _ in range(count):
        size = struct.unpack_from("<H", sd, at + 2)[0]
        sid = sd[at + 8 : at + size]
        subs = sid[1]
        auth = int.from_bytes(sid[2:8], "big")
        values = struct.unpack_from(f"<{subs}I", sid, 8)
        if auth == 5 and subs == 3 and values[0] == 88:
            out[values[1]] = values[2]
        at += size
    return out


def query_sd(f: Open, parts: int = 0x7) -> bytes:
    """The self-relative descriptor QUERY_INFO gives: owner, group and DACL
    by default."""
    req = SMB2QueryInfoRequest()
    req["info_type"] = 3
    req["file_info_class"] = 0
    req["output_buffer_length"] = 4096
    req["additional_information"] = parts
    req["file_id"] = f.file_id
    status, body = call(f, req)
    assert status == SUCCESS
    offset, length = struct.unpack_from("<HI", body, 2)
    return body[offset - 64 : offset - 64 + length]


def with_mode_ace(sd: bytes, mode: int) -> bytes:
    """The DACL of `sd` (a descriptor with only a DACL) with its mode ACE
    replaced, as a Mac's chmod sends it."""
    dacl_at = struct.unpack_from("<I", sd, 16)[0]
    rev, _, size, count, _ = struct.unpack_from("<BBHHH", sd, dacl_at)
    mode_sid = bytes([1, 3]) + (5).to_bytes(6, "big") + struct.pack("<II", 88, 3)
    aces, at = [], dacl_at + 8
    for _ in range(count):
        ace_size = struct.unpack_from("<H", sd, at + 2)[0]
        if not sd[at + 8 : at + ace_size].startswith(mode_sid):
            aces.append(sd[at : at + ace_size])
        at += ace_size
    sid = mode_sid + struct.pack("<I", mode)
    aces.append(struct.pack("<BBHI", 1, 0, 8 + len(sid), 0) + sid)
    body = b"".join(aces)
    dacl = struct.pack("<BBHHH", rev, 0, 8 + len(body), len(aces), 0) + body
    # Self-relative, DACL present, DACL only.
    return struct.pack("<BBHIIII", 1, 0, 0x8004, 0, 0, 0, 20) + dacl


def test_a_mac_reads_and_sets_the_unix_mode_through_nfs_aces(server):
    with connect(server) as t:
        become_a_mac(t)
        write_stream(t, "script.sh", b"#!/bin/sh\n")
        path = server.share_path / "script.sh"
        os.chmod(path, 0o644)
        f, _ = open_path(t, "script.sh", access=READ_CONTROL | WRITE_DAC | 0x80, disposition=CreateDisposition.FILE_OPEN)
        sd = query_sd(f)
        aces = nfs_aces(sd)
        assert aces[3] == stat.S_IFREG | 0o644
        assert aces[1] == os.getuid() and aces[2] == os.getgid()
        # chmod 755 on the Mac's mount.
        assert set_info(f, 3, 0, with_mode_ace(query_sd(f, 0x4), 0o755), additional=0x4) == SUCCESS
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
        # The mode ACEs are shown, never stored twice.
        assert nfs_aces(query_sd(f))[3] == stat.S_IFREG | 0o755
        f.close()


def rename(f: Open, new_name: str) -> int:
    name = new_name.encode("utf-16-le")
    return set_info(f, 1, 10, struct.pack("<B7xQI", 0, 0, len(name)) + name)


def test_a_mac_renames_a_folder_with_an_open_file_and_windows_cannot(server):
    with connect(server) as windows, connect(server) as mac:
        become_a_mac(mac)
        d, _ = open_path(windows, "Projects", directory=True)
        d.close()
        inside, _ = open_path(windows, r"Projects\notes.txt")
        d, _ = open_path(windows, "Projects", access=ALL_ACCESS, disposition=CreateDisposition.FILE_OPEN, directory=True)
        assert rename(d, "Projects 2024") == ACCESS_DENIED
        d.close()
        d, _ = open_path(mac, "Projects", access=ALL_ACCESS, disposition=CreateDisposition.FILE_OPEN, directory=True)
        assert rename(d, "Projects 2024") == SUCCESS
        d.close()
        # The open file went along.
        inside.write(b"still here", 0)
        inside.close()
        assert (server.share_path / "Projects 2024" / "notes.txt").read_bytes() == b"still here"


def apple_double(finder_info: bytes, xattrs: list[tuple[str, bytes]], resource_fork: bytes) -> bytes:
    """An AppleDouble file as macOS writes it (RFC 1740 version 2, big-endian):
    the Finder information entry carries the extended attributes in an
    "ATTR" block; the resource fork follows."""
    finder_at = 26 + 2 * 12
    names = [n.encode() + b"\0" for n, _ in xattrs]
    entries_len = sum((11 + len(n) + 3) // 4 * 4 for n in names)
    attr_at = finder_at + 34
    value_at = attr_at + 36 + entries_len
    entries = b""
    for name, (_, value) in zip(names, xattrs):
        entry = struct.pack(">IIHB", value_at, len(value), 0, len(name)) + name
        entries += entry + b"\0" * (-len(entry) % 4)
        value_at += len(value)
    attr = b"ATTR" + b"\0" * 30 + struct.pack(">H", len(xattrs)) + entries + b"".join(v for _, v in xattrs)
    finder = finder_info.ljust(32, b"\0") + b"\0\0" + attr
    rsrc_at = finder_at + len(finder)
    header = struct.pack(">II16sH", 0x00051607, 0x00020000, b"Mac OS X        ", 2)
    header += struct.pack(">III", 9, finder_at, len(finder)) + struct.pack(">III", 2, rsrc_at, len(resource_fork))
    return header + finder + resource_fork


def test_files_copied_with_appledouble_companions_show_their_streams(server):
    fork = os.urandom(5000)
    blob = apple_double(b"APPLaplt", [("com.apple.quarantine", b"0081;5f0e"), ("org.example:tag", b"red")], fork)
    # As a USB disk or a tar archive leaves them, on the server's disk.
    (server.share_path / "Classic.app").write_bytes(b"data fork")
    (server.share_path / "._Classic.app").write_bytes(blob)
    (server.share_path / "Listed.app").write_bytes(b"")
    (server.share_path / "._Listed.app").write_bytes(blob)
    (server.share_path / "._Orphan").write_bytes(blob)
    with connect(server) as windows:
        # Nothing happens for a client that is no Mac.
        assert set(listing(windows, "", "*")) >= {"._Classic.app", "._Listed.app"}
    with connect(server) as mac:
        # Opening a Mac stream converts the companion...
        assert read_stream(mac, "Classic.app:AFP_Resource", 8192) == fork
        assert not (server.share_path / "._Classic.app").exists()
        assert read_stream(mac, "Classic.app:AFP_AfpInfo", 60)[16:24] == b"APPLaplt"
        base, _ = open_path(mac, "Classic.app", disposition=CreateDisposition.FILE_OPEN)
        assert streams_of(base) == {
            "::$DATA": 9,
            ":AFP_AfpInfo:$DATA": 60,
            ":AFP_Resource:$DATA": 5000,
            ":com.apple.quarantine:$DATA": 9,
            ":org.example\uf022tag:$DATA": 3,
        }
        base.close()
        # ...and so does a Mac's listing, which then leaves it out.
        become_a_mac(mac)
        names = set(listing(mac, "", "*"))
        assert "Listed.app" in names and "._Listed.app" not in names
        assert struct.unpack_from("<Q", listing(mac, "", "Listed.app")["Listed.app"], 70)[0] == 5000
        # A companion without its file stays what it is.
        assert "._Orphan" in names


MALLORY = ("mallory", "M4llory-Secret!")


def test_an_appledouble_companion_converts_only_for_a_session_that_may_write_the_file(server_factory):
    """A companion is anybody's file in the directory. Mallory, who may not
    open alice's contract, drops companions beside it and beside another of
    her files, opens the contract's Mac streams and lists the folder as a
    Mac: neither file gets a stream, and the companions stay. Alice's own
    companion of her own file converts as before."""
    if server_factory.target != "nimbus":
        pytest.skip("the users' SIDs come from nimbus user list")
    srv = server_factory.start(security=Security(extra_users=[MALLORY]))
    alice = user_sids(srv)[USER]
    forged = apple_double(
        b"TEXTMSWD",
        [("approval", b"approved-by: MALLORY"), ("Zone.Identifier", b"[ZoneTransfer]\r\nZoneId=3\r\n")],
        b"mallory's resource fork",
    )
    mine = apple_double(b"W8BNMSWD", [("approval", b"approved-by: alice")], b"alice's resource fork")
    with smb_tree(srv, USER, PASSWORD) as ta, smb_tree(srv, *MALLORY) as tm:
        # Alice's files, hers alone; the contract carries her approval.
        for name in ("contract.docx", "deal.docx", "report.docx"):
            f = create(ta, name, GENERIC_WRITE | READ_CONTROL | WRITE_DAC, CreateDisposition.FILE_CREATE)
            f.write(b"terms", 0)
            set_sd(f, descriptor(acl(ace(ALLOW, 0, FILE_ALL_ACCESS, alice))))
            f.close()
        write_stream(ta, "contract.docx:approval", b"approved-by: alice")
        assert status_of(lambda: create(tm, "contract.docx", GENERIC_READ, CreateDisposition.FILE_OPEN)) == ACCESS_DENIED

        # Mallory's companions, then his Mac opening the contract's streams
        # (refused) and listing the folder.
        for name in ("._contract.docx", "._deal.docx"):
            c = create(tm, name, GENERIC_WRITE, CreateDisposition.FILE_CREATE)
            c.write(forged, 0)
            c.close()
        become_a_mac(tm)
        for stream in ("AFP_AfpInfo", "AFP_Resource"):
            for disposition in (CreateDisposition.FILE_OPEN, CreateDisposition.FILE_OPEN_IF):
                assert status_of(lambda: open_path(tm, f"contract.docx:{stream}", disposition=disposition)[0].close()) != SUCCESS
        names = set(listing(tm, "", "*"))

        for name, streams in (("contract.docx", {"::$DATA": 5, ":approval:$DATA": 18}), ("deal.docx", {"::$DATA": 5})):
            base = create(ta, name, GENERIC_READ, CreateDisposition.FILE_OPEN)
            try:
                assert streams_of(base) == streams, name
            finally:
                base.close()
        assert read_stream(ta, "contract.docx:approval") == b"approved-by: alice"
        assert {"._contract.docx", "._deal.docx"} <= names
        assert (srv.share_path / "._contract.docx").read_bytes() == forged
        assert (srv.share_path / "._deal.docx").read_bytes() == forged

        # Alice's own companion of her own file: her Mac sees its streams.
        c = create(ta, "._report.docx", GENERIC_WRITE, CreateDisposition.FILE_CREATE)
        c.write(mine, 0)
        c.close()
        become_a_mac(ta)
        assert read_stream(ta, "report.docx:AFP_AfpInfo", 60)[16:24] == b"W8BNMSWD"
        assert read_stream(ta, "report.docx:AFP_Resource") == b"alice's resource fork"
        assert read_stream(ta, "report.docx:approval") == b"approved-by: alice"
        assert not (srv.share_path / "._report.docx").exists()
