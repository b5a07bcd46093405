"""QUERY_DIRECTORY search patterns against nimbus, with Python's smbprotocol.

MS-FSA 2.1.5.6.3: a FileNamePattern that is not a valid name component
(wildcards, "." and ".." excepted) fails with STATUS_OBJECT_NAME_INVALID. A
component is at most 255 UTF-16 code units (MS-FSCC 2.1.5) and holds no path
separator, so longer patterns and patterns with `\\` or `/` are refused
before the directory is read; Samba refuses `\\` and `/` with the same status.

The hostile-pattern test is the regression test of a CPU exhaustion: the
matcher nimbus had before took minutes per directory entry for a 16,384
character `<` pattern, and one connection could keep 64 such requests
running. Now such a request is answered at once and other clients keep
being served.

A listed name with a made 8.3 name (FileBothDirectoryInformation's ShortName)
is reached by it: a CREATE of it, in any component of a path, opens the long
name (MS-FSA 2.1.5.1), and a search pattern matches an entry by its name or
its 8.3 name (MS-FSA 2.1.5.6.3), so smbclient's `ls` and `del` by the short
name, which search first, find the file.
"""

from __future__ import annotations

import contextlib
import struct
import threading
import time
import uuid

import pytest
from conftest import require_tool
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.file_info import FileInformationClass
from smbprotocol.header import NtStatus
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    DirectoryAccessMask,
    FileAttributes,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    Open,
    QueryDirectoryFlags,
    ShareAccess,
)
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect
from test_setinfo import query_info, rename_info, set_info
from test_smbclient import run_smbclient

TIMEOUT = 30
# The bound on one hostile query: generous; the old matcher took minutes
# for a single entry.
HOSTILE_BOUND = 10.0
NAMES = FileInformationClass.FILE_NAMES_INFORMATION
RESTART = QueryDirectoryFlags.SMB2_RESTART_SCANS

# 32 KiB on the wire (UTF-16): far beyond the 255-unit limit.
HOSTILE_PATTERNS = {
    "dos-star": "<" * 16384,
    "mixed": ("*?<" * 5462)[:16384],
}


@contextlib.contextmanager
def smb_tree(server):
    """Yield (connection, session, tree) for the server's user on its share."""
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        session = Session(conn, server.user, server.password, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        tree = TreeConnect(session, rf"\\{server.host}\{server.share}")
        tree.connect()
        yield conn, session, tree
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


def open_directory(tree, name):
    d = Open(tree, name)
    d.create(
        ImpersonationLevel.Impersonation,
        DirectoryAccessMask.FILE_LIST_DIRECTORY | DirectoryAccessMask.FILE_READ_ATTRIBUTES,
        FileAttributes.FILE_ATTRIBUTE_DIRECTORY,
        ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
        CreateDisposition.FILE_OPEN,
        CreateOptions.FILE_DIRECTORY_FILE,
    )
    return d


def query_status(conn, session, tree, d, pattern) -> tuple[int, float]:
    """Send one QUERY_DIRECTORY (RESTART_SCANS); return its status and how long it took."""
    message, unpack = d.query_directory(pattern, NAMES, flags=RESTART, send=False)
    start = time.monotonic()
    request = conn.send(message, session.session_id, tree.tree_connect_id)
    try:
        conn.receive(request, timeout=TIMEOUT)
        status = NtStatus.STATUS_SUCCESS
    except SMBResponseException as e:
        status = e.status
    return status, time.monotonic() - start


def list_names(d, pattern) -> list[str]:
    """Every name matching `pattern`, over as many queries as it takes."""
    names: list[str] = []
    flags = RESTART
    for _ in range(1000):
        try:
            entries = d.query_directory(pattern, NAMES, flags=flags)
        except SMBResponseException as e:
            if e.status in (NtStatus.STATUS_NO_MORE_FILES, NtStatus.STATUS_NO_SUCH_FILE):
                return names
            raise
        flags = 0
        names += [e["file_name"].get_value().decode("utf-16-le") for e in entries]
    raise AssertionError("listing does not end")


def status_name(status: int) -> str:
    for name, value in vars(NtStatus).items():
        if name.startswith("STATUS_") and value == status:
            return name
    return f"0x{status:08x}"


@pytest.fixture
def many(server):
    """A directory "many" of 2000 files with names of about 200 characters:
    the even ones without a dot, the odd ones with a dot near the end."""
    d = server.share_path / "many"
    d.mkdir()
    dotless, dotted = [], []
    for i in range(2000):
        if i % 2 == 0:
            name = f"{i:04d}-" + "n" * 195
            dotless.append(name)
        else:
            name = f"{i:04d}-" + "d" * 190 + ".txt"
            dotted.append(name)
        (d / name).touch()
    return dotless, dotted


# --------------------------------------------------------------------------
# path separators and the length limit


@pytest.mark.parametrize("pattern", ["sub/f.txt", "sub/*", "/", "*/", "sub\\f.txt", "sub\\*", "\\", "..\\*", "../*"])
def test_pattern_with_path_separator_refused(server, pattern):
    sub = server.share_path / "sub"
    sub.mkdir()
    (sub / "f.txt").write_text("x")
    with smb_tree(server) as (conn, session, tree):
        d = open_directory(tree, "")
        status, _ = query_status(conn, session, tree, d, pattern)
        assert status == NtStatus.STATUS_OBJECT_NAME_INVALID, status_name(status)
        # The open still lists normally afterwards.
        assert "sub" in list_names(d, "*")
        d.close()


def test_pattern_length_limit_is_255_utf16_units(server):
    longest = "x" * 255
    (server.share_path / longest).touch()
    (server.share_path / "short.txt").touch()
    with smb_tree(server) as (conn, session, tree):
        d = open_directory(tree, "")
        assert list_names(d, longest) == [longest]
        assert list_names(d, "x" * 254 + "*") == [longest]
        assert list_names(d, "<" * 255) == [longest]
        for pattern in ("x" * 256, "x" * 255 + "*", "*" * 256, "\U0001F600" * 128):
            status, _ = query_status(conn, session, tree, d, pattern)
            assert status == NtStatus.STATUS_OBJECT_NAME_INVALID, (len(pattern), status_name(status))
        # 127 characters beyond the BMP are 254 units: valid, and no match.
        status, _ = query_status(conn, session, tree, d, "\U0001F600" * 127)
        assert status == NtStatus.STATUS_NO_SUCH_FILE, status_name(status)
        d.close()


def test_wildcards_on_long_names(server, many):
    dotless, dotted = many
    with smb_tree(server) as (conn, session, tree):
        d = open_directory(tree, "many")
        start = time.monotonic()
        # `<` never takes the last dot: 255 of them match the dotless names only.
        assert sorted(list_names(d, "<" * 255)) == sorted(dotless)
        # `<` up to the last dot, then the extension.
        assert sorted(list_names(d, "<<<.TXT")) == sorted(dotted)
        assert sorted(list_names(d, "*?<" * 85)) == sorted(dotless + dotted)
        # "0000-": no short name matches it (its third character on is a hash).
        assert list_names(d, "0000-" + ">" * 250) == [dotless[0]]
        assert list_names(d, "0001" + "?" * 191 + '"TXT') == [dotted[0]]
        assert time.monotonic() - start < 5 * HOSTILE_BOUND
        d.close()


# --------------------------------------------------------------------------
# hostile patterns


def test_hostile_patterns_answered_at_once_while_others_are_served(server, many):
    threads_per_pattern = 2
    burst = 4  # requests each hostile connection keeps outstanding at once
    iterations = 30
    done = threading.Event()
    errors: list[str] = []
    results: list[tuple[str, int, float]] = []
    lock = threading.Lock()
    started = threading.Barrier(threads_per_pattern * len(HOSTILE_PATTERNS) + 1, timeout=60)

    def hostile(kind: str, pattern: str) -> None:
        try:
            with smb_tree(server) as (conn, session, tree):
                d = open_directory(tree, "many")
                conn.echo(sid=session.session_id, timeout=TIMEOUT, credit_request=burst * 4)
                first = True
                while first or not done.is_set():
                    requests = []
                    for _ in range(burst):
                        message, _unpack = d.query_directory(pattern, NAMES, flags=RESTART, send=False)
                        requests.append((time.monotonic(), conn.send(message, session.session_id, tree.tree_connect_id)))
                    if first:
                        started.wait()
                        first = False
                    for sent, request in requests:
                        try:
                            conn.receive(request, timeout=TIMEOUT)
                            status = NtStatus.STATUS_SUCCESS
                        except SMBResponseException as e:
                            status = e.status
                        with lock:
                            results.append((kind, status, time.monotonic() - sent))
        except Exception as e:  # reported by the main thread
            with lock:
                errors.append(f"{kind}: {e!r}")
            with contextlib.suppress(threading.BrokenBarrierError):
                started.abort()

    workers = [
        threading.Thread(target=hostile, args=(kind, pattern), daemon=True)
        for kind, pattern in HOSTILE_PATTERNS.items()
        for _ in range(threads_per_pattern)
    ]
    for w in workers:
        w.start()
    completed = 0
    try:
        # Every hostile connection has its first burst on the wire.
        started.wait()
        with smb_tree(server) as (conn, session, tree):
            payload = bytes(range(256)) * 16
            for i in range(iterations):
                f = Open(tree, "victim.bin")
                f.create(
                    ImpersonationLevel.Impersonation,
                    FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
                    FileAttributes.FILE_ATTRIBUTE_NORMAL,
                    ShareAccess.FILE_SHARE_READ,
                    CreateDisposition.FILE_OVERWRITE_IF,
                    CreateOptions.FILE_NON_DIRECTORY_FILE,
                )
                data = payload[i:] + payload[:i]
                f.write(data, 0)
                assert f.read(0, len(data)) == data
                f.close()
                completed += 1
    finally:
        done.set()
        for w in workers:
            w.join(timeout=3 * TIMEOUT)
    assert not errors, errors
    assert completed == iterations
    assert all(not w.is_alive() for w in workers), "a hostile query was never answered"
    for kind in HOSTILE_PATTERNS:
        mine = [r for r in results if r[0] == kind]
        assert len(mine) >= threads_per_pattern * burst, f"{kind}: only {len(mine)} answers"
        statuses = {status_name(status) for _, status, _ in mine}
        assert statuses == {"STATUS_OBJECT_NAME_INVALID"}, (kind, statuses)
        slowest = max(t for _, _, t in mine)
        assert slowest < HOSTILE_BOUND, f"{kind}: slowest answer took {slowest:.1f} s"


# --------------------------------------------------------------------------
# 8.3 names


# Long names of assorted case and extension, with their contents.
LONG_NAMES = [
    "z.Qcr5q",
    "Quarterly Report.xlsx",
    "setup_wizard_data.cab",
    "ALLCAPS LONG NAME.TXT",
    "mixed.Case.Name.Doc",
    "no extension at all",
    "trailing.dots.in.name.tar.gz",
    "a+b=c.txt",
    ".hidden-config",
    "résumé final.pdf",
]


def short_names(d) -> dict[str, str]:
    """{long name: short name} from a FileIdBothDirectoryInformation listing."""
    out = {}
    flags = RESTART
    while True:
        try:
            entries = d.query_directory("*", FileInformationClass.FILE_ID_BOTH_DIRECTORY_INFORMATION, flags=flags)
        except SMBResponseException as e:
            if e.status == NtStatus.STATUS_NO_MORE_FILES:
                return out
            raise
        flags = 0
        for e in entries:
            out[e["file_name"].get_value().decode("utf-16-le")] = e["short_name"].get_value().decode("utf-16-le")


def open_file(tree, name, access=FilePipePrinterAccessMask.GENERIC_READ, options=CreateOptions.FILE_NON_DIRECTORY_FILE):
    """Opens an existing file, sharing everything."""
    f = Open(tree, name)
    f.create(
        ImpersonationLevel.Impersonation,
        access,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
        CreateDisposition.FILE_OPEN,
        options,
    )
    return f


def test_generated_short_names_reach_their_files(server):
    """MS-FSA 2.1.5.1: a name a listing gave as the 8.3 name of a file
    opens that file, in any component of a path."""
    root = server.share_path
    longdir = root / "Long Directory Name"
    longdir.mkdir()
    for i, name in enumerate(LONG_NAMES):
        (root / name).write_bytes(f"content {i}".encode())
    (root / "SHORT.TXT").write_bytes(b"already 8.3")
    (root / "lower.txt").write_bytes(b"already 8.3")
    with smb_tree(server) as (_conn, _session, tree):
        d = open_directory(tree, "")
        shorts = short_names(d)
        d.close()
        # An 8.3-valid name has no other.
        assert shorts["SHORT.TXT"] == shorts["lower.txt"] == ""
        short_dir = shorts["Long Directory Name"]
        assert "~" in short_dir
        for i, name in enumerate(LONG_NAMES):
            short = shorts[name]
            assert short and "~" in short and short != name, (name, short)
            # A search by the short name finds the file by its long name
            # (MS-FSA 2.1.5.6.3 matches Link.ShortName too), as `dir` and
            # FindFirstFile do.
            d = open_directory(tree, "")
            assert list_names(d, short) == [name]
            assert list_names(d, short.lower()) == [name]
            d.close()
            # Open and read by the short name, in either case.
            for spelled in (short, short.lower()):
                f = open_file(tree, spelled)
                assert f.read(0, 64) == f"content {i}".encode(), (name, spelled)
                # FileAlternateNameInformation gives the same short name.
                alt = query_info(f, FileInformationClass.FILE_ALTERNATE_NAME_INFORMATION)
                (length,) = struct.unpack_from("<I", alt)
                assert alt[4 : 4 + length].decode("utf-16-le") == short
                f.close()
            # Rename by the short name into the directory named by its short name.
            f = open_file(tree, short, access=FilePipePrinterAccessMask.DELETE | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES)
            set_info(f, FileInformationClass.FILE_RENAME_INFORMATION, rename_info(f"{short_dir}\\{name}"))
            f.close()
            assert (longdir / name).read_bytes() == f"content {i}".encode()
            assert not (root / name).exists()
            # A short directory name in the middle of a path; delete on close.
            sub = open_directory(tree, short_dir)
            inner = short_names(sub)[name]
            sub.close()
            assert inner == short
            f = open_file(
                tree,
                f"{short_dir}\\{inner}",
                access=FilePipePrinterAccessMask.DELETE | FilePipePrinterAccessMask.FILE_READ_ATTRIBUTES,
                options=CreateOptions.FILE_NON_DIRECTORY_FILE | CreateOptions.FILE_DELETE_ON_CLOSE,
            )
            f.close()
            assert not (longdir / name).exists(), name


def test_wildcards_match_short_names(server):
    """As on Windows, `*.XLS` lists `Quarterly Report.xlsx` (its
    short name ends in .XLS), and a pattern no short name can match finds
    only what its long names match."""
    for name in ("Quarterly Report.xlsx", "budget.xls", "notes.txt", "Long Notes.txts"):
        (server.share_path / name).touch()
    with smb_tree(server) as (_conn, _session, tree):
        d = open_directory(tree, "")
        assert sorted(list_names(d, "*.xls")) == ["Quarterly Report.xlsx", "budget.xls"]
        assert sorted(list_names(d, "*.TXT")) == ["Long Notes.txts", "notes.txt"]
        assert sorted(list_names(d, "*~1.*")) == ["Long Notes.txts", "Quarterly Report.xlsx"]
        # An 8.3 name is its own short name: nothing else reaches it.
        assert list_names(d, "*~*") == list_names(d, "*~1.*")
        assert list_names(d, "*.xlsx") == ["Quarterly Report.xlsx"]
        d.close()


@require_tool("smbclient", "smbclient")
def test_smbclient_reaches_files_by_short_name(server, samba_client_conf, tmp_path):
    """smbclient's `allinfo` and `get` open the short name; `ls` and `del`
    search for it first (QUERY_DIRECTORY with the short name as pattern)."""
    for i, name in enumerate(LONG_NAMES):
        (server.share_path / name).write_bytes(f"content {i}".encode())
    with smb_tree(server) as (_conn, _session, tree):
        d = open_directory(tree, "")
        shorts = short_names(d)
        d.close()
    for i, name in enumerate(LONG_NAMES):
        short = shorts[name]
        rc, out = run_smbclient(server, "SMB3", f'allinfo "{short}"; get "{short}" got{i}; ls "{short}"', samba_client_conf, tmp_path)
        assert rc == 0 and "NT_STATUS_" not in out, out
        assert f"altname: {short}" in out
        assert (tmp_path / f"got{i}").read_bytes() == f"content {i}".encode()
        assert name in out  # `ls` lists the long name
        rc, out = run_smbclient(server, "SMB3", f'del "{short}"', samba_client_conf, tmp_path)
        assert rc == 0 and "NT_STATUS_" not in out, out
        assert not (server.share_path / name).exists(), name
