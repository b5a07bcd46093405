"""Server-side copy and sparse files (issue 17, item 2), driven by real
clients: Debian's smbclient (`scopy`), Python smbclient (`copyfile`, which
copies across shares of one session) and raw FSCTLs through smbprotocol.

- A copy is byte-identical, also of a file larger than one request's 16 MiB,
  and copies within one file overlap as if the source were read first.
- Requests over the limits get STATUS_INVALID_PARAMETER with the server's
  limits in the body (256 chunks, 1 MiB, 16 MiB); a copy stopped by a
  chunk past the source's end reports what was done before it.
- A resume key is good only in the session that asked for it, and only
  while its open lasts; access and byte-range locks are checked as for
  READ and WRITE.
- FSCTL_SET_SPARSE sets FILE_ATTRIBUTE_SPARSE_FILE; FSCTL_SET_ZERO_DATA
  frees the disk blocks of a sparse file and zeroes another in place;
  FSCTL_QUERY_ALLOCATED_RANGES reports the data ranges (all of a
  non-sparse file), BUFFER_OVERFLOW with those that fit.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import struct
import subprocess
import time
import uuid

import pytest
import smbclient
from conftest import in_ci, require_tool
from smbprotocol.connection import Connection, Dialects
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.ioctl import IOCTLFlags, SMB2IOCTLRequest
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    ImpersonationLevel,
    LockFlags,
    Open,
    ShareAccess,
    SMB2LockElement,
    SMB2LockRequest,
)
from smbprotocol.session import Session
from smbprotocol.structure import IntField
from smbprotocol.tree import TreeConnect

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 60
MIB = 1 << 20

FSCTL_SRV_REQUEST_RESUME_KEY = 0x00140078
FSCTL_SRV_COPYCHUNK = 0x001440F2
FSCTL_SRV_COPYCHUNK_WRITE = 0x001480F2
FSCTL_SET_SPARSE = 0x000900C4
FSCTL_SET_ZERO_DATA = 0x000980C8
FSCTL_QUERY_ALLOCATED_RANGES = 0x000940CF
FSCTL_GET_COMPRESSION = 0x0009003C
FSCTL_SET_COMPRESSION = 0x0009C040

SUCCESS = 0
BUFFER_OVERFLOW = 0x80000005
INVALID_PARAMETER = 0xC000000D
INVALID_VIEW_SIZE = 0xC000001F
ACCESS_DENIED = 0xC0000022
BUFFER_TOO_SMALL = 0xC0000023
OBJECT_NAME_NOT_FOUND = 0xC0000034
FILE_LOCK_CONFLICT = 0xC0000054
NOT_SUPPORTED = 0xC00000BB

READ_DATA, WRITE_DATA, APPEND_DATA = 0x1, 0x2, 0x4
READ_ATTRIBUTES, WRITE_ATTRIBUTES, SYNCHRONIZE = 0x80, 0x100, 0x100000
ALL_ACCESS = 0x1F01FF
SPARSE_FILE = 0x200
SHARE_ALL = ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE
LIMITS = (256, MIB, 16 * MIB)


@pytest.fixture
def srv(server_factory):
    """Shares data and other (writable) and ro (read-only)."""
    return server_factory.start([("data", False), ("other", False), ("ro", True)])


@contextlib.contextmanager
def session(server):
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        s = Session(conn, server.user, server.password, auth_protocol="ntlm")
        s.connect()
        yield s
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


def tree(s: Session, server, share: str = "data") -> TreeConnect:
    t = TreeConnect(s, rf"\\{server.host}\{share}")
    t.connect()
    return t


def open_file(t: TreeConnect, name: str, access: int = ALL_ACCESS, disposition=CreateDisposition.FILE_OPEN_IF, directory: bool = False) -> Open:
    f = Open(t, name)
    options = CreateOptions.FILE_DIRECTORY_FILE if directory else CreateOptions.FILE_NON_DIRECTORY_FILE
    f.create(ImpersonationLevel.Impersonation, access | SYNCHRONIZE, FileAttributes.FILE_ATTRIBUTE_NORMAL, SHARE_ALL, disposition, options)
    return f


def fsctl(f: Open, code: int, data: bytes = b"", max_out: int = 1024) -> tuple[int, bytes | None]:
    """(status, output buffer): the output even of a failed IOCTL, or None
    when the server answered with an ERROR body."""
    req = SMB2IOCTLRequest()
    # smbprotocol's CtlCode enum lacks some codes (the compression ones):
    # a plain integer field takes any.
    field = IntField(size=4)
    field.name, field.structure = "ctl_code", req
    req.fields["ctl_code"] = field
    req["ctl_code"] = code
    req["file_id"] = f.file_id
    req["max_output_response"] = max_out
    req["flags"] = IOCTLFlags.SMB2_0_IOCTL_IS_FSCTL
    req["buffer"] = data
    t = f.tree_connect
    conn = t.session.connection
    sent = conn.send(req, sid=t.session.session_id, tid=t.tree_connect_id)
    try:
        header = conn.receive(sent)
        status = SUCCESS
    except SMBResponseException as e:
        header, status = e.header, e.status
    body = header["data"].get_value()
    if len(body) < 48 or struct.unpack_from("<H", body)[0] != 49:
        return status, None
    offset, count = struct.unpack_from("<II", body, 32)
    return status, body[offset - 64 : offset - 64 + count]


def resume_key(f: Open) -> bytes:
    status, out = fsctl(f, FSCTL_SRV_REQUEST_RESUME_KEY, max_out=32)
    assert status == SUCCESS and out is not None and len(out) == 32
    return out[:24]


def copychunk_input(key: bytes, chunks: list[tuple[int, int, int]], count: int | None = None) -> bytes:
    body = key + struct.pack("<II", len(chunks) if count is None else count, 0)
    for src, dst, length in chunks:
        body += struct.pack("<QQII", src, dst, length, 0)
    return body


def copy(target: Open, key: bytes, chunks, code: int = FSCTL_SRV_COPYCHUNK_WRITE, count: int | None = None, max_out: int = 12):
    """(status, (chunks written, chunk bytes written, total bytes) or None)."""
    status, out = fsctl(target, code, copychunk_input(key, chunks, count), max_out=max_out)
    return status, (struct.unpack("<III", out) if out is not None else None)


def lock(f: Open, offset: int, length: int, flags: int) -> None:
    el = SMB2LockElement()
    el["offset"] = offset
    el["length"] = length
    el["flags"] = flags
    req = SMB2LockRequest()
    req["file_id"] = f.file_id
    req["locks"] = [el]
    t = f.tree_connect
    conn = t.session.connection
    conn.receive(conn.send(req, sid=t.session.session_id, tid=t.tree_connect_id))


def pattern(size: int, seed: int = 0) -> bytes:
    out = bytearray()
    block = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{block}".encode()).digest()
        block += 1
    return bytes(out[:size])


@require_tool("smbclient", "smbclient")
def test_smbclient_scopy_copies_a_file_larger_than_one_request(srv, samba_client_conf):
    data = os.urandom(40 * MIB + 12345)  # three FSCTLs of up to 16 MiB
    (srv.share_path / "big.bin").write_bytes(data)
    proc = subprocess.run(
        ["smbclient", f"//{srv.host}/data", "-p", str(srv.port), "-U", f"{srv.user}%{srv.password}", "-s", str(samba_client_conf), "-m", "SMB3_11", "-c", "scopy big.bin copy.bin"],
        capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (srv.share_path / "copy.bin").read_bytes() == data


def test_python_smbclient_copyfile_copies_across_shares_of_one_session(srv):
    data = pattern(5 * MIB + 7, seed=1)
    (srv.share_path / "src.bin").write_bytes(data)
    smbclient.register_session(srv.host, username=srv.user, password=srv.password, port=srv.port, auth_protocol="ntlm")
    try:
        smbclient.copyfile(rf"\\{srv.host}\data\src.bin", rf"\\{srv.host}\other\dst.bin", port=srv.port)
    finally:
        smbclient.reset_connection_cache()
    assert (srv.extra_shares["other"] / "dst.bin").read_bytes() == data


def test_copies_within_one_file_overlap_as_if_read_first(srv):
    data = pattern(3 * MIB, seed=2)
    (srv.share_path / "same.bin").write_bytes(data)
    with session(srv) as s:
        f = open_file(tree(s, srv), "same.bin")
        key = resume_key(f)
        # Forward overlap (target after source), then backward.
        assert copy(f, key, [(0, 4096, MIB)]) == (SUCCESS, (1, 0, MIB))
        want = bytearray(data)
        want[4096 : 4096 + MIB] = data[:MIB]
        assert copy(f, key, [(MIB + 100, MIB, MIB)]) == (SUCCESS, (1, 0, MIB))
        want[MIB : 2 * MIB] = bytes(want[MIB + 100 : 2 * MIB + 100])
        f.close()
    assert (srv.share_path / "same.bin").read_bytes() == bytes(want)


def test_requests_over_the_limits_get_the_limits(srv):
    (srv.share_path / "src.bin").write_bytes(pattern(64 * 1024))
    with session(srv) as s:
        t = tree(s, srv)
        src, dst = open_file(t, "src.bin"), open_file(t, "dst.bin")
        key = resume_key(src)
        over = [
            [(0, 0, 1)] * 257,  # more chunks than allowed
            [(0, 0, MIB + 1)],  # a chunk over 1 MiB
            [(0, i * MIB, MIB) for i in range(17)],  # 17 MiB in all
            [(0, 0, 0)],  # an empty chunk
        ]
        for chunks in over:
            assert copy(dst, key, chunks) == (INVALID_PARAMETER, LIMITS)
        # ChunkCount larger than the buffer holds, up to 2^32-1.
        assert copy(dst, key, [(0, 0, 10)], count=2) == (INVALID_PARAMETER, LIMITS)
        assert copy(dst, key, [], count=0xFFFFFFFF) == (INVALID_PARAMETER, LIMITS)
        # Not even a whole SRV_COPYCHUNK_COPY.
        status, out = fsctl(dst, FSCTL_SRV_COPYCHUNK_WRITE, key[:20], max_out=12)
        assert (status, struct.unpack("<III", out)) == (INVALID_PARAMETER, LIMITS)
        # No room for a SRV_COPYCHUNK_RESPONSE: a plain error.
        assert copy(dst, key, [(0, 0, 10)], max_out=11) == (INVALID_PARAMETER, None)
        assert fsctl(src, FSCTL_SRV_REQUEST_RESUME_KEY, max_out=31) == (INVALID_PARAMETER, None)
        dst.close()
    assert (srv.share_path / "dst.bin").stat().st_size == 0


def test_a_copy_past_the_source_end_stops_there_and_says_how_far_it_got(srv):
    data = pattern(8192, seed=3)
    (srv.share_path / "src.bin").write_bytes(data)
    with session(srv) as s:
        t = tree(s, srv)
        src, dst = open_file(t, "src.bin"), open_file(t, "dst.bin")
        key = resume_key(src)
        assert copy(dst, key, [(0, 0, 4096), (4096, 4096, 8192)]) == (INVALID_VIEW_SIZE, (1, 0, 4096))
        assert copy(dst, key, [(0xFFFFFFFFFFFFF000, 0, 4096)]) == (INVALID_VIEW_SIZE, (0, 0, 0))
        # A target beyond the largest file size (NTFS's) is refused.
        assert copy(dst, key, [(0, 0xFFFFFFFFFFFFF000, 4096)]) == (INVALID_PARAMETER, (0, 0, 0))
        assert copy(dst, key, [(1024, 0, 7168)]) == (SUCCESS, (1, 0, 7168))
        dst.close()
    assert (srv.share_path / "dst.bin").read_bytes() == data[1024:]


def test_a_resume_key_is_good_only_in_its_session_and_while_its_open_lasts(srv):
    (srv.share_path / "src.bin").write_bytes(pattern(4096))
    with session(srv) as s1, session(srv) as s2:
        t1 = tree(s1, srv)
        src = open_file(t1, "src.bin", access=READ_ATTRIBUTES)  # a key needs no data access
        key = resume_key(src)
        theirs = open_file(tree(s2, srv), "theirs.bin")
        assert copy(theirs, key, [(0, 0, 4096)]) == (OBJECT_NAME_NOT_FOUND, None)
        ours = open_file(t1, "ours.bin")
        # The key names an open that may not read: the copy may not either.
        assert copy(ours, key, [(0, 0, 4096)]) == (ACCESS_DENIED, None)
        src.close()
        assert copy(ours, key, [(0, 0, 4096)]) == (OBJECT_NAME_NOT_FOUND, None)
        made_up = bytes(range(24))
        assert copy(ours, made_up, [(0, 0, 4096)]) == (OBJECT_NAME_NOT_FOUND, None)
        # Nothing was written anywhere.
        ours.close()
        theirs.close()
    assert (srv.share_path / "ours.bin").stat().st_size == 0
    assert (srv.share_path / "theirs.bin").stat().st_size == 0


def test_access_is_checked_on_both_ends(srv):
    (srv.share_path / "src.bin").write_bytes(pattern(4096))
    (srv.extra_shares["ro"] / "ro.bin").write_bytes(pattern(4096, seed=9))
    with session(srv) as s:
        t = tree(s, srv)
        write_only = open_file(t, "src.bin", access=WRITE_DATA)
        target = open_file(t, "dst.bin")
        assert copy(target, resume_key(write_only), [(0, 0, 4096)]) == (ACCESS_DENIED, None)
        src = open_file(t, "src.bin", access=READ_DATA)
        key = resume_key(src)
        read_only_target = open_file(t, "dst.bin", access=READ_DATA)
        assert copy(read_only_target, key, [(0, 0, 4096)]) == (ACCESS_DENIED, None)
        # FSCTL_SRV_COPYCHUNK also needs the target readable; _WRITE does not.
        write_target = open_file(t, "dst.bin", access=WRITE_DATA)
        assert copy(write_target, key, [(0, 0, 4096)], code=FSCTL_SRV_COPYCHUNK) == (ACCESS_DENIED, None)
        assert copy(write_target, key, [(0, 0, 4096)]) == (SUCCESS, (1, 0, 4096))
        # A read-only share may be the source.
        ro_src = open_file(tree(s, srv, "ro"), "ro.bin", access=READ_DATA, disposition=CreateDisposition.FILE_OPEN)
        assert copy(target, resume_key(ro_src), [(0, 4096, 4096)], code=FSCTL_SRV_COPYCHUNK) == (SUCCESS, (1, 0, 4096))
        target.close()
    assert (srv.share_path / "dst.bin").read_bytes() == pattern(4096) + pattern(4096, seed=9)


def test_byte_range_locks_of_other_opens_stop_the_copy(srv):
    (srv.share_path / "src.bin").write_bytes(pattern(8192))
    (srv.share_path / "dst.bin").write_bytes(b"\0" * 8192)
    with session(srv) as s, session(srv) as other:
        t = tree(s, srv)
        src, dst = open_file(t, "src.bin"), open_file(t, "dst.bin")
        key = resume_key(src)
        ot = tree(other, srv)
        theirs = open_file(ot, "src.bin")
        lock(theirs, 4096, 4096, LockFlags.SMB2_LOCKFLAG_EXCLUSIVE_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        # The first chunk is copied, the second reads the locked range.
        assert copy(dst, key, [(0, 0, 4096), (4096, 4096, 4096)]) == (FILE_LOCK_CONFLICT, (1, 0, 4096))
        lock(theirs, 4096, 4096, LockFlags.SMB2_LOCKFLAG_UNLOCK)
        their_dst = open_file(ot, "dst.bin")
        lock(their_dst, 0, 1, LockFlags.SMB2_LOCKFLAG_SHARED_LOCK | LockFlags.SMB2_LOCKFLAG_FAIL_IMMEDIATELY)
        assert copy(dst, key, [(0, 0, 4096)]) == (FILE_LOCK_CONFLICT, (0, 0, 0))
        assert copy(dst, key, [(4096, 4096, 4096)]) == (SUCCESS, (1, 0, 4096))
        dst.close()
    assert (srv.share_path / "dst.bin").read_bytes() == pattern(8192)


def file_attributes(srv, name: str) -> int:
    smbclient.register_session(srv.host, username=srv.user, password=srv.password, port=srv.port, auth_protocol="ntlm")
    try:
        return smbclient.stat(rf"\\{srv.host}\data\{name}", port=srv.port).st_file_attributes
    finally:
        smbclient.reset_connection_cache()


def ranges(out: bytes) -> list[tuple[int, int]]:
    return [struct.unpack_from("<qq", out, i) for i in range(0, len(out), 16)]


def qar(f: Open, offset: int, length: int, max_out: int = 1024):
    status, out = fsctl(f, FSCTL_QUERY_ALLOCATED_RANGES, struct.pack("<qq", offset, length), max_out=max_out)
    return status, (ranges(out) if out is not None else None)


def test_sparse_files_punch_holes_and_report_their_data(srv):
    block = 64 * 1024
    data = pattern(8 * block, seed=4)
    path = srv.share_path / "sparse.bin"
    path.write_bytes(data)
    os.sync()
    with session(srv) as s:
        f = open_file(tree(s, srv), "sparse.bin")
        # Not sparse yet: all of it is allocated, and zeroing keeps it so.
        assert qar(f, 0, 8 * block) == (SUCCESS, [(0, 8 * block)])
        assert qar(f, 100, 1000) == (SUCCESS, [(100, 1000)])
        assert fsctl(f, FSCTL_SET_ZERO_DATA, struct.pack("<qq", 0, block)) == (SUCCESS, b"")
        assert qar(f, 0, 8 * block) == (SUCCESS, [(0, 8 * block)])
        assert fsctl(f, FSCTL_SET_SPARSE, b"\x01") == (SUCCESS, b"")
        assert file_attributes(srv, "sparse.bin") & SPARSE_FILE
        allocated_before = path.stat().st_blocks
        # Punch out every other 64 KiB block; the last one past the end of
        # the file, which is not extended.
        for i in (1, 3, 5):
            assert fsctl(f, FSCTL_SET_ZERO_DATA, struct.pack("<qq", i * block, (i + 1) * block)) == (SUCCESS, b"")
        assert fsctl(f, FSCTL_SET_ZERO_DATA, struct.pack("<qq", 7 * block, 7 * block + (1 << 30))) == (SUCCESS, b"")
        assert path.stat().st_size == 8 * block
        assert path.stat().st_blocks < allocated_before
        status, got = qar(f, 0, 8 * block)
        assert status == SUCCESS
        assert got == [(2 * block, block), (4 * block, block), (6 * block, block)]
        # Room for two of the three: BUFFER_OVERFLOW with two; for none:
        # BUFFER_TOO_SMALL.
        assert qar(f, 0, 8 * block, max_out=40) == (BUFFER_OVERFLOW, got[:2])
        assert qar(f, 0, 8 * block, max_out=0) == (BUFFER_TOO_SMALL, None)
        # Nothing there: no ranges, whatever the room.
        assert qar(f, 8 * block, block, max_out=0) == (SUCCESS, [])
        # Malformed: offset + length overflows, a negative offset, no input.
        assert qar(f, 512, -1) == (INVALID_PARAMETER, None)
        assert qar(f, -1, 10) == (INVALID_PARAMETER, None)
        assert fsctl(f, FSCTL_QUERY_ALLOCATED_RANGES, b"") == (INVALID_PARAMETER, None)
        assert fsctl(f, FSCTL_SET_ZERO_DATA, struct.pack("<qq", 4096, 4095)) == (INVALID_PARAMETER, None)
        # Setting other attributes leaves the sparse flag alone; clearing it
        # makes the whole file count as allocated again.
        assert fsctl(f, FSCTL_SET_SPARSE, b"\x00") == (SUCCESS, b"")
        assert not file_attributes(srv, "sparse.bin") & SPARSE_FILE
        assert qar(f, 0, 8 * block) == (SUCCESS, [(0, 8 * block)])
        f.close()
    want = bytearray(data)
    for i in (0, 1, 3, 5, 7):  # zeroed while not sparse, then punched
        want[i * block : (i + 1) * block] = bytes(block)
    assert path.read_bytes() == bytes(want)


def test_sparse_and_compression_controls_check_access_and_kind(srv):
    (srv.share_path / "f.bin").write_bytes(pattern(4096))
    (srv.share_path / "d").mkdir()
    with session(srv) as s:
        t = tree(s, srv)
        # Any of WRITE_DATA, APPEND_DATA, WRITE_ATTRIBUTES may set sparse.
        for access in (WRITE_DATA, APPEND_DATA, WRITE_ATTRIBUTES):
            assert fsctl(open_file(t, "f.bin", access=access), FSCTL_SET_SPARSE) == (SUCCESS, b"")
        reader = open_file(t, "f.bin", access=READ_DATA | READ_ATTRIBUTES)
        assert fsctl(reader, FSCTL_SET_SPARSE) == (ACCESS_DENIED, None)
        assert fsctl(reader, FSCTL_SET_ZERO_DATA, struct.pack("<qq", 0, 10)) == (ACCESS_DENIED, None)
        assert fsctl(open_file(t, "f.bin", access=APPEND_DATA), FSCTL_SET_ZERO_DATA, struct.pack("<qq", 0, 10)) == (ACCESS_DENIED, None)
        assert qar(open_file(t, "f.bin", access=READ_ATTRIBUTES), 0, 10) == (ACCESS_DENIED, None)
        assert fsctl(open_file(t, "d", access=ALL_ACCESS, directory=True), FSCTL_SET_SPARSE) == (INVALID_PARAMETER, None)
        # Compression is not offered: nothing is compressed, and only
        # "none" may be set.
        f = open_file(t, "f.bin")
        assert fsctl(f, FSCTL_GET_COMPRESSION, max_out=2) == (SUCCESS, b"\x00\x00")
        assert fsctl(f, FSCTL_GET_COMPRESSION, max_out=1) == (INVALID_PARAMETER, None)
        assert fsctl(f, FSCTL_SET_COMPRESSION, b"\x00\x00") == (SUCCESS, b"")
        assert fsctl(f, FSCTL_SET_COMPRESSION, b"\x01\x00") == (NOT_SUPPORTED, None)
        assert fsctl(f, FSCTL_SET_COMPRESSION, b"\x07\x00") == (INVALID_PARAMETER, None)
        assert fsctl(f, FSCTL_SET_COMPRESSION, b"\x00") == (INVALID_PARAMETER, None)
    assert file_attributes(srv, "f.bin") & SPARSE_FILE
    assert (srv.share_path / "f.bin").read_bytes() == pattern(4096)


# --------------------------------------------------------------------------
# Block cloning (FSCTL_DUPLICATE_EXTENTS_TO_FILE), on a file system that
# shares extents: XFS with reflink on a loop device.

FSCTL_DUPLICATE_EXTENTS_TO_FILE = 0x00098344
INVALID_HANDLE = 0xC0000008
INVALID_DEVICE_REQUEST = 0xC0000010


@pytest.fixture
def reflink_dir(tmp_path):
    """A share directory on XFS with reflink, a 512 MiB image loop-mounted
    beneath tmp_path and unmounted afterwards. Needs root, mkfs.xfs
    (xfsprogs, which scripts/test.sh installs) and loop devices; a machine
    that cannot mount one skips these tests, saying so."""
    if os.geteuid() != 0:
        pytest.skip("mounting a loop device needs root")
    mkfs = shutil.which("mkfs.xfs", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
    if mkfs is None:
        message = "mkfs.xfs not installed (apt-get install xfsprogs)"
        if in_ci():
            pytest.fail(message + "; CI=true: scripts/test.sh installs it", pytrace=False)
        pytest.skip(message)
    image, mnt = tmp_path / "xfs.img", tmp_path / "xfs"
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run([mkfs, "-q", "-m", "reflink=1", str(image)], check=True, capture_output=True, timeout=60)
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True, timeout=60)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a loop device here: {mounted.stderr.strip()}")
    try:
        share = mnt / "share"
        share.mkdir()
        yield share
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60).returncode == 0:
                break
            time.sleep(0.25)  # the server's descriptors are closing
        else:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


@pytest.fixture
def clone_srv(reflink_dir, server_factory):
    """A server whose share `data` is on XFS with reflink, `other` on the
    test's own file system."""
    return server_factory.start([("data", False), ("other", False)], paths={"data": reflink_dir})


def dup_extents(target: Open, source: Open | bytes, src_off: int, dst_off: int, count: int) -> int:
    file_id = source if isinstance(source, bytes) else source.file_id
    status, _ = fsctl(target, FSCTL_DUPLICATE_EXTENTS_TO_FILE, file_id + struct.pack("<qqq", src_off, dst_off, count), max_out=0)
    return status


def test_block_cloning_shares_the_extents_instead_of_copying(clone_srv):
    size = 8 * MIB
    data = pattern(size, seed=5)
    (clone_srv.share_path / "src.bin").write_bytes(data)
    with open(clone_srv.share_path / "dst.bin", "wb") as f:
        f.truncate(size)
    os.sync()
    free_before = os.statvfs(clone_srv.share_path).f_bfree
    with session(clone_srv) as s:
        t = tree(s, clone_srv)
        src, dst = open_file(t, "src.bin"), open_file(t, "dst.bin")
        assert dup_extents(dst, src, 0, 0, size) == SUCCESS
        os.sync()
        # 8 MiB of data, and (nearly) no block more in use: shared.
        used = (free_before - os.statvfs(clone_srv.share_path).f_bfree) * os.statvfs(clone_srv.share_path).f_frsize
        assert used < MIB, f"{used} bytes newly in use: the extents were copied, not shared"
        # Within one file, without overlap; the rules Windows and Samba keep.
        assert dup_extents(dst, dst, 0, 4 * MIB, MIB) == SUCCESS
        assert dup_extents(dst, dst, 0, 4096, 8192) == NOT_SUPPORTED  # overlapping
        assert dup_extents(dst, src, 0, size - 4096, 8192) == NOT_SUPPORTED  # past the target's end
        assert dup_extents(dst, src, size - 4096, 0, 8192) == NOT_SUPPORTED  # past the source's end
        assert dup_extents(dst, src, 100, 0, 4096) == INVALID_PARAMETER  # not block-aligned
        assert dup_extents(dst, src, 0, 0, 0) == SUCCESS
        assert dup_extents(dst, src, -4096, 0, 4096) == INVALID_PARAMETER
        assert dup_extents(dst, bytes(16), 0, 0, 4096) == INVALID_HANDLE
        writer = open_file(t, "src.bin", access=WRITE_DATA)
        assert dup_extents(dst, writer, 0, 0, 4096) == ACCESS_DENIED
        assert fsctl(dst, FSCTL_DUPLICATE_EXTENTS_TO_FILE, b"\0" * 39, max_out=0) == (INVALID_PARAMETER, None)
        # A share on a file system that cannot share extents does not offer it.
        other = open_file(tree(s, clone_srv, "other"), "x.bin")
        assert dup_extents(other, other, 0, 0, 0) == INVALID_DEVICE_REQUEST
        dst.close()
    want = bytearray(data)
    want[4 * MIB : 5 * MIB] = data[:MIB]
    assert (clone_srv.share_path / "dst.bin").read_bytes() == bytes(want)
    assert (clone_srv.share_path / "src.bin").read_bytes() == data


@require_tool("smbtorture", "samba-testsuite")
def test_smbtorture_block_cloning_on_a_file_system_that_shares_extents(clone_srv, samba_client_conf):
    """smbtorture's dup_extents tests, which skip on the CI's ext4 share
    (tests/smbtorture/expected-skips.txt), run here."""
    tests = [
        "simple", "len_beyond_dest", "len_beyond_src", "len_zero", "sparse_src", "sparse_dest", "sparse_both",
        "src_is_dest", "src_is_dest_overlap", "bad_handle", "src_lock", "dest_lock",
    ]  # fmt: skip
    proc = subprocess.run(
        ["smbtorture", f"//{clone_srv.host}/data", "-p", str(clone_srv.port), "-U", f"{clone_srv.user}%{clone_srv.password}", "--use-kerberos=off", "-s", str(samba_client_conf),
         *(f"smb2.ioctl.dup_extents_{t}" for t in tests)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    outcomes = dict((m[1], m[0]) for m in re.findall(r"^(success|failure|error|skip): dup_extents_(\S+)", out, re.M))
    # sparse_dest sets its target's size from the request it has not filled
    # in yet (0), so it asks to clone past the target's end: MS-FSCC 2.3.8
    # refuses that with STATUS_NOT_SUPPORTED, as nimbus does (len_beyond_dest
    # accepts either answer, as Windows Server 2016 succeeds).
    assert outcomes == {t: ("failure" if t == "sparse_dest" else "success") for t in tests}, out
    assert "sparse_dest [\n../../source4/torture/smb2/ioctl.c:6159: status was NT_STATUS_NOT_SUPPORTED" in out, out
