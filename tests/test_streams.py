"""Named streams (issue 17, item 3): `file:stream:$DATA`, with Debian's
smbclient and raw CREATE/QUERY_INFO through smbprotocol. smbtorture's
smb2.streams suite (tests/test_smbtorture.py) checks the protocol rules
case by case; these tests check what a user and an administrator see.

- A stream holds more than an extended attribute can (a megabyte here),
  reads back byte-identical, and is listed by FileStreamInformation beside
  `::$DATA`, with its size.
- Streams live in `.nimbus-streams` at the share root, which no client
  sees in a listing or can open; a file's streams follow it through a
  rename, go with an overwrite, and go with the file when it is deleted.
- A copy made on the server's disk with its extended attributes (`cp -a`)
  does not share the original's streams.
- A stream renamed to `::$DATA` becomes the file's data (the file id, EAs
  and other streams stay), and its handle then reads and writes that data;
  the rename is refused while the file has data or is open for it.
- `smbclient allinfo` shows a file's 8.3 name and streams, the 8.3 name
  opens the file, and FileIdBothDirectoryInformation carries it with the
  file's EaSize.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

import pytest
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.file_info import FileInformationClass
from smbprotocol.open import CreateDisposition, CreateOptions, FileAttributes, ImpersonationLevel, Open, SMB2SetInfoRequest
from test_eas import ALL_ACCESS, SUCCESS, call, ea_size, full_ea_list, open_file, parse_full_ea_list, query, set_eas, tree

pytestmark = pytest.mark.nimbus_only

STREAM_INFO = 22
OBJECT_NAME_INVALID = 0xC0000033
OBJECT_NAME_NOT_FOUND = 0xC0000034
OBJECT_NAME_COLLISION = 0xC0000035
SHARING_VIOLATION = 0xC0000043
INVALID_PARAMETER = 0xC000000D
RENAME_INFO = 10
INTERNAL_INFO = 6
FULL_EA_INFO = 15


def streams_of(f) -> dict[str, int]:
    """FileStreamInformation (MS-FSCC 2.4.44): stream name -> size."""
    status, buf = query(f, STREAM_INFO)
    assert status == SUCCESS
    out, at = {}, 0
    while buf:
        nxt, name_len, size = struct.unpack_from("<IIQ", buf, at)
        out[buf[at + 24 : at + 24 + name_len].decode("utf-16-le")] = size
        if nxt == 0:
            return out
        at += nxt
    return out


def create_status(t, name: str, disposition=CreateDisposition.FILE_OPEN) -> int:
    try:
        open_file(t, name, ALL_ACCESS, disposition).close()
        return SUCCESS
    except SMBResponseException as e:
        return e.status


def store_dirs(share_path) -> list:
    store = share_path / ".nimbus-streams"
    return [d for bucket in store.iterdir() for d in bucket.iterdir()] if store.exists() else []


def smbclient(server, commands: str) -> str:
    proc = subprocess.run(
        ["smbclient", f"//{server.host}/{server.share}", "-p", str(server.port), "-U", f"{server.user}%{server.password}", "-c", commands],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_smbclient_puts_and_gets_a_stream_larger_than_an_xattr(server, tmp_path):
    payload = os.urandom(1024 * 1024 + 123)
    (tmp_path / "fork").write_bytes(payload)
    (tmp_path / "data").write_bytes(b"file data")
    smbclient(server, f"put {tmp_path / 'data'} doc.txt; put {tmp_path / 'fork'} doc.txt:Resource; get doc.txt:Resource {tmp_path / 'back'}; get doc.txt {tmp_path / 'data.back'}")
    assert (tmp_path / "back").read_bytes() == payload
    assert (tmp_path / "data.back").read_bytes() == b"file data"
    # The file itself holds its own data only.
    assert (server.share_path / "doc.txt").read_bytes() == b"file data"
    with tree(server) as t:
        f = open_file(t, "doc.txt")
        assert streams_of(f) == {"::$DATA": 9, ":Resource:$DATA": len(payload)}
        f.close()
        # The same list through a handle of the stream, named in any case.
        s = open_file(t, "DOC.TXT:resource:$data")
        assert streams_of(s) == {"::$DATA": 9, ":Resource:$DATA": len(payload)}
        s.close()


def test_the_store_is_hidden_and_streams_follow_renames_and_go_with_their_file(server):
    with tree(server) as t:
        f = open_file(t, "a.txt:Zone.Identifier", disposition=CreateDisposition.FILE_CREATE)
        f.write(b"[ZoneTransfer]\r\nZoneId=3\r\n", 0)
        f.close()
        (one,) = store_dirs(server.share_path)
        # Not listed, not to be opened, whatever the case.
        listing = smbclient(server, "ls")
        assert ".nimbus-streams" not in listing and "a.txt" in listing
        assert create_status(t, ".nimbus-streams") == OBJECT_NAME_INVALID
        assert create_status(t, ".NIMBUS-STREAMS\\x") == OBJECT_NAME_INVALID
        # A rename keeps them; a missing stream is not found.
        smbclient(server, "rename a.txt b.txt")
        g = open_file(t, "b.txt:Zone.Identifier")
        assert g.read(0, 100) == b"[ZoneTransfer]\r\nZoneId=3\r\n"
        g.close()
        assert create_status(t, "b.txt:Other") == OBJECT_NAME_NOT_FOUND
        # Deleting the file deletes its streams.
        smbclient(server, "del b.txt")
        assert not one.exists() and store_dirs(server.share_path) == []
        assert create_status(t, "b.txt:Zone.Identifier") == OBJECT_NAME_NOT_FOUND


def test_an_overwrite_leaves_a_file_only_its_unnamed_stream(server):
    with tree(server) as t:
        for name in ("o.txt:one", "o.txt:two"):
            open_file(t, name, disposition=CreateDisposition.FILE_CREATE).close()
        f = open_file(t, "o.txt", disposition=CreateDisposition.FILE_OVERWRITE_IF)
        assert streams_of(f) == {"::$DATA": 0}
        f.close()
        assert store_dirs(server.share_path) == []


def test_a_copy_made_with_its_xattrs_does_not_share_the_originals_streams(server):
    with tree(server) as t:
        f = open_file(t, "orig.txt:s", disposition=CreateDisposition.FILE_CREATE)
        f.write(b"original", 0)
        f.close()
        # An administrator's copy on the server's disk, extended attributes and all.
        shutil.copy2(server.share_path / "orig.txt", server.share_path / "copy.txt")
        assert os.getxattr(server.share_path / "copy.txt", "user.nimbus.streams")
        assert create_status(t, "copy.txt:s") == OBJECT_NAME_NOT_FOUND
        c = open_file(t, "copy.txt:s", disposition=CreateDisposition.FILE_CREATE)
        c.write(b"the copy's", 0)
        c.close()
        o = open_file(t, "orig.txt:s")
        assert o.read(0, 100) == b"original"
        o.close()
        assert len(store_dirs(server.share_path)) == 2


def test_smbclient_allinfo_shows_the_8dot3_name_and_streams_and_the_short_name_opens_the_file(server, tmp_path):
    (tmp_path / "data").write_bytes(b"report")
    (tmp_path / "zone").write_bytes(b"[ZoneTransfer]\r\nZoneId=3\r\n")
    out = smbclient(server, f'put {tmp_path / "data"} "Long File Name.docx"; put {tmp_path / "zone"} "Long File Name.docx:Zone.Identifier"; allinfo "Long File Name.docx"')
    altname = next(line.split(": ", 1)[1].strip() for line in out.splitlines() if line.startswith("altname:"))
    assert altname.startswith("LO") and altname.endswith("~1.DOC") and len(altname) == 12
    assert "stream: [::$DATA], 6 bytes" in out
    assert "stream: [:Zone.Identifier:$DATA], 26 bytes" in out
    # The 8.3 name reaches the file (as old programs open it), in any case.
    smbclient(server, f"get {altname.lower()} {tmp_path / 'back'}")
    assert (tmp_path / "back").read_bytes() == b"report"
    # The directory classes with a ShortName carry it, and the EaSize.
    with tree(server) as t:
        f = open_file(t, "Long File Name.docx")
        assert set_eas(f, full_ea_list((b"AUTHOR", b"someone", 0))) == SUCCESS
        size = ea_size(f)
        f.close()
        d = Open(t, "")
        d.create(ImpersonationLevel.Impersonation, 0x1 | 0x80 | 0x100000, FileAttributes.FILE_ATTRIBUTE_DIRECTORY, 0x7, CreateDisposition.FILE_OPEN, CreateOptions.FILE_DIRECTORY_FILE)
        (entry,) = d.query_directory("long file name.docx", FileInformationClass.FILE_ID_BOTH_DIRECTORY_INFORMATION)
        assert entry["short_name"].get_value().decode("utf-16-le") == altname
        assert entry["ea_size"].get_value() == size > 0
        d.close()


def rename(f, new_name: str, replace: bool) -> int:
    """SET_INFO FileRenameInformation (MS-FSCC 2.4.42.2, the SMB2 form)."""
    name = new_name.encode("utf-16-le")
    req = SMB2SetInfoRequest()
    req["info_type"] = 1
    req["file_info_class"] = RENAME_INFO
    req["file_id"] = f.file_id
    req["buffer"] = struct.pack("<B7xQI", int(replace), 0, len(name)) + name
    return call(f, req)[0]


def file_id(f) -> int:
    status, buf = query(f, INTERNAL_INFO)
    assert status == SUCCESS
    return struct.unpack_from("<Q", buf)[0]


def test_a_stream_renamed_to_the_unnamed_stream_becomes_the_files_data(server):
    payload = os.urandom(300_000)
    with tree(server) as t:
        base = open_file(t, "r.txt", disposition=CreateDisposition.FILE_CREATE)
        ident = file_id(base)
        assert set_eas(base, full_ea_list((b"KEEP", b"me", 0))) == SUCCESS
        base.close()
        other = open_file(t, "r.txt:other", disposition=CreateDisposition.FILE_CREATE)
        other.write(b"stays", 0)
        other.close()
        s = open_file(t, "r.txt:Doc", disposition=CreateDisposition.FILE_CREATE)
        s.write(payload, 0)
        # Replacing the file's data must be asked for.
        assert rename(s, "::$DATA", replace=False) == OBJECT_NAME_COLLISION
        # Someone holding the file's data open keeps it.
        holder = open_file(t, "r.txt")
        assert rename(s, "::$DATA", replace=True) == SHARING_VIOLATION
        holder.close()
        assert rename(s, "::$DATA", replace=True) == SUCCESS
        # The handle is now one of the file's data: it reads it and writes it.
        assert s.read(0, 5) == payload[:5]
        s.write(b"HEAD", 0)
        assert streams_of(s) == {"::$DATA": len(payload), ":other:$DATA": 5}
        s.close()
        assert (server.share_path / "r.txt").read_bytes() == b"HEAD" + payload[4:]
        # Still the same file: its id, its EAs and its other stream stay.
        f = open_file(t, "r.txt")
        assert file_id(f) == ident
        status, buf = query(f, FULL_EA_INFO, flags=0x1)
        assert status == SUCCESS and parse_full_ea_list(buf) == [(b"KEEP", b"me", 0)]
        f.close()
        assert create_status(t, "r.txt:Doc") == OBJECT_NAME_NOT_FOUND
        # A file that holds data keeps it: the stream is not made its data.
        s2 = open_file(t, "r.txt:other")
        assert rename(s2, "::$DATA", replace=True) == INVALID_PARAMETER
        assert s2.read(0, 10) == b"stays"
        s2.close()
