"""Message-level tests with Python's smbprotocol (low-level API) against nimbus.

Each test builds its own Connection / Session / TreeConnect / Open, so it
controls exactly what goes on the wire: the dialect offered, the signing
algorithms offered (SMB 3.1.1 negotiate context), compound chains, credit
requests and the credit charge of each request.

smbprotocol checks the signature of every response that carries the SIGNED
flag, and these tests also check that responses carry it, so a server that
does not sign would fail here.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import pytest
from smbprotocol import Dialects
from smbprotocol.connection import Connection, HashAlgorithms, SigningAlgorithms
from smbprotocol.exceptions import SMBAuthenticationError, SMBException, SMBResponseException
from smbprotocol.file_info import FileInformationClass
from smbprotocol.header import NtStatus, Smb2Flags
from smbprotocol.open import (
    CreateAction,
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

from conftest import Security

TIMEOUT = 30
KIB = 1024
MIB = 1024 * KIB

DIALECTS = {
    "2.0.2": Dialects.SMB_2_0_2,
    "2.1": Dialects.SMB_2_1_0,
    "3.0": Dialects.SMB_3_0_0,
    "3.0.2": Dialects.SMB_3_0_2,
    "3.1.1": Dialects.SMB_3_1_1,
}
MULTI_CREDIT_DIALECTS = {k: v for k, v in DIALECTS.items() if v >= Dialects.SMB_2_1_0}
SIGNING_ALGORITHMS = {
    "HMAC-SHA256": SigningAlgorithms.HMAC_SHA256,
    "AES-CMAC": SigningAlgorithms.AES_CMAC,
    "AES-GMAC": SigningAlgorithms.AES_GMAC,
}


# --------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def smb_connection(server, dialect=Dialects.SMB_3_1_1, signing_algorithms=None):
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(dialect, timeout=TIMEOUT, preferred_signing_algos=signing_algorithms)
    try:
        yield conn
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


@contextlib.contextmanager
def smb_tree(server, dialect=Dialects.SMB_3_1_1, signing_algorithms=None):
    """Yield (connection, session, tree) for alice on the server's share."""
    with smb_connection(server, dialect, signing_algorithms) as conn:
        session = Session(conn, server.user, server.password, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        tree = TreeConnect(session, rf"\\{server.host}\{server.share}")
        tree.connect()  # 3.0 and 3.0.2: also FSCTL_VALIDATE_NEGOTIATE_INFO
        yield conn, session, tree


def open_file(tree, name, disposition=CreateDisposition.FILE_OVERWRITE_IF, send=True):
    f = Open(tree, name)
    result = f.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE | FilePipePrinterAccessMask.DELETE,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
        disposition,
        CreateOptions.FILE_NON_DIRECTORY_FILE,
        send=send,
    )
    return f if send else (f, result)


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


def assert_signed(request):
    """The response to `request` carries the SIGNED flag (smbprotocol verified the signature)."""
    header = request.response
    assert header["flags"].has_flag(Smb2Flags.SMB2_FLAGS_SIGNED), (
        f"response to command {header['command'].get_value()} is not signed although signing is required"
    )


def status_of(excinfo) -> int:
    return excinfo.value.status


def credits_available(conn) -> int:
    return conn.sequence_window["high"] - conn.sequence_window["low"]


def ensure_credits(conn, session, needed: int) -> None:
    """Ask for credits with ECHO until `needed` are available (bounded)."""
    for _ in range(16):
        if credits_available(conn) >= needed:
            return
        granted = conn.echo(sid=session.session_id, timeout=TIMEOUT, credit_request=min(needed, 512))
        assert granted >= 1, "ECHO granted no credit"
    assert credits_available(conn) >= needed, (
        f"server granted {credits_available(conn)} credits after repeated requests; {needed} are needed"
    )


def send_and_receive(conn, session, tree, message, receive, credit_request=None):
    request = conn.send(message, session.session_id, tree.tree_connect_id, credit_request=credit_request)
    return request, receive(request)


# --------------------------------------------------------------------------
# negotiate, logon, signing


@pytest.mark.parametrize("dialect", list(DIALECTS.values()), ids=list(DIALECTS))
def test_each_dialect_with_signing_required(server, dialect):
    with smb_tree(server, dialect) as (conn, session, tree):
        assert conn.dialect == dialect
        assert session.signing_required
        assert session.session_id != 0
        if dialect == Dialects.SMB_3_1_1:
            assert conn.preauth_integrity_hash_id == HashAlgorithms.SHA_512

        f = open_file(tree, "dialect.bin")
        data = os.urandom(3000)
        msg, recv = f.write(data, 0, send=False)
        request, written = send_and_receive(conn, session, tree, msg, recv)
        assert written == len(data)
        assert_signed(request)
        msg, recv = f.read(0, len(data), send=False)
        request, got = send_and_receive(conn, session, tree, msg, recv)
        assert got == data
        assert_signed(request)
        f.close()
    assert (server.share_path / "dialect.bin").read_bytes() == data


@pytest.mark.parametrize("algorithm", list(SIGNING_ALGORITHMS.values()), ids=list(SIGNING_ALGORITHMS))
def test_smb311_signing_algorithm_forced(server, algorithm):
    # The client offers one algorithm in its SMB2_SIGNING_CAPABILITIES
    # negotiate context, so the server must select that one.
    with smb_tree(server, Dialects.SMB_3_1_1, [algorithm]) as (conn, session, tree):
        assert conn.signing_algorithm_id == algorithm
        f = open_file(tree, "signed.bin")
        data = os.urandom(70 * KIB)
        msg, recv = f.write(data, 0, send=False)
        request, _ = send_and_receive(conn, session, tree, msg, recv)
        assert_signed(request)
        msg, recv = f.read(0, len(data), send=False)
        request, got = send_and_receive(conn, session, tree, msg, recv)
        assert_signed(request)
        assert got == data
        f.close()


@pytest.mark.parametrize("dialect", [Dialects.SMB_2_1_0, Dialects.SMB_3_1_1], ids=["2.1", "3.1.1"])
def test_request_with_bad_signature_refused(server, dialect):
    with smb_tree(server, dialect) as (conn, session, tree):
        genuine = conn._generate_signature

        def corrupt_outgoing(b_header, signing_key, message_id, server_to_redir, command):
            signature = genuine(b_header, signing_key, message_id, server_to_redir, command)
            if server_to_redir:  # responses: check them as usual
                return signature
            return bytes([signature[0] ^ 0xFF]) + signature[1:]

        conn._generate_signature = corrupt_outgoing
        try:
            # MS-SMB2 3.3.5.2.4: a signature that does not verify fails the
            # request with STATUS_ACCESS_DENIED.
            with pytest.raises(SMBResponseException) as excinfo:
                open_file(tree, "badsig.txt")
        finally:
            conn._generate_signature = genuine
        assert status_of(excinfo) == NtStatus.STATUS_ACCESS_DENIED
        open_file(tree, "after-badsig.txt").close()  # a good request still works
    assert not (server.share_path / "badsig.txt").exists()


def test_unsigned_request_refused_when_signing_required(server):
    with smb_tree(server, Dialects.SMB_3_1_1) as (conn, session, tree):
        session.signing_required = False  # the client now sends requests unsigned
        try:
            with pytest.raises(SMBResponseException) as excinfo:
                open_file(tree, "unsigned.txt")
        finally:
            session.signing_required = True
        assert status_of(excinfo) == NtStatus.STATUS_ACCESS_DENIED
    assert not (server.share_path / "unsigned.txt").exists()


def test_smb311_unsigned_tree_connect_refused_when_signing_is_not_required(server_factory):
    """MS-SMB2 3.3.5.7: on 3.1.1 a TREE_CONNECT of a session with keys is
    signed or sealed even where the server does not require signing; it is
    what shows the NEGOTIATE was not altered. smbprotocol without
    require_signing sends it in clear, which is refused as Samba refuses
    it; signed, it is served, and the session's later requests may go
    unsigned."""
    srv = server_factory.start(signing="auto")
    conn = Connection(uuid.uuid4(), srv.host, srv.port, require_signing=False)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        session = Session(conn, srv.user, srv.password, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        assert not session.signing_required
        with pytest.raises(SMBResponseException) as excinfo:
            TreeConnect(session, rf"\\{srv.host}\{srv.share}").connect()
        assert status_of(excinfo) == NtStatus.STATUS_ACCESS_DENIED
        # Refused before the share is looked up: no answer tells an
        # unsigned request which shares exist.
        with pytest.raises(SMBResponseException) as excinfo:
            TreeConnect(session, rf"\\{srv.host}\no-such-share").connect()
        assert status_of(excinfo) == NtStatus.STATUS_ACCESS_DENIED
        session.signing_required = True
        tree = TreeConnect(session, rf"\\{srv.host}\{srv.share}")
        tree.connect()
        session.signing_required = False
        f = open_file(tree, "plain.txt")
        f.write(b"unsigned", 0)
        f.close()
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)
    assert (srv.share_path / "plain.txt").read_bytes() == b"unsigned"
    assert "neither signed nor encrypted" in srv.log_path.read_text(errors="replace")


@pytest.mark.parametrize("dialect", [Dialects.SMB_2_0_2, Dialects.SMB_3_1_1], ids=["2.0.2", "3.1.1"])
def test_wrong_password_refused(server, dialect):
    with smb_connection(server, dialect) as conn:
        session = Session(conn, server.user, "not-the-password", require_encryption=False, auth_protocol="ntlm")
        with pytest.raises((SMBAuthenticationError, SMBResponseException)) as excinfo:
            session.connect()
        if isinstance(excinfo.value, SMBResponseException):
            assert status_of(excinfo) == NtStatus.STATUS_LOGON_FAILURE
        else:
            assert "LOGON_FAILURE" in str(excinfo.value).upper() or "0xc000006d" in str(excinfo.value).lower()


# --------------------------------------------------------------------------
# compound requests


def test_related_compound_create_write_close(server):
    data = b"written by a related compound\n"
    with smb_tree(server) as (conn, session, tree):
        f = Open(tree, "compound.txt")
        create_msg, create_recv = f.create(
            ImpersonationLevel.Impersonation,
            FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
            FileAttributes.FILE_ATTRIBUTE_NORMAL,
            ShareAccess.FILE_SHARE_READ,
            CreateDisposition.FILE_CREATE,
            CreateOptions.FILE_NON_DIRECTORY_FILE,
            send=False,
        )
        # Before the create answers, f.file_id is the "related" FileId
        # (all 0xFF), which tells the server to use the create's handle.
        write_msg, write_recv = f.write(data, 0, send=False)
        close_msg, close_recv = f.close(get_attributes=True, send=False)
        requests = conn.send_compound([create_msg, write_msg, close_msg], session.session_id, tree.tree_connect_id, related=True)
        create_recv(requests[0])
        assert f.create_action == CreateAction.FILE_CREATED
        assert write_recv(requests[1]) == len(data)
        close_recv(requests[2])
        assert f.end_of_file == len(data)  # from the close's post-query attributes
        for request in requests:
            assert_signed(request)
    assert (server.share_path / "compound.txt").read_bytes() == data


def test_related_compound_create_write_read_close(server):
    data = os.urandom(5000)
    with smb_tree(server) as (conn, session, tree):
        f, (create_msg, create_receive) = open_file(tree, "rw-compound.bin", send=False)
        write_msg, write_recv = f.write(data, 0, send=False)
        read_msg, read_recv = f.read(0, len(data), send=False)
        close_msg, close_recv = f.close(send=False)
        requests = conn.send_compound([create_msg, write_msg, read_msg, close_msg], session.session_id, tree.tree_connect_id, related=True)
        create_receive(requests[0])
        assert write_recv(requests[1]) == len(data)
        assert read_recv(requests[2]) == data
        close_recv(requests[3])
    assert (server.share_path / "rw-compound.bin").read_bytes() == data


def test_unrelated_compound(server):
    with smb_tree(server) as (conn, session, tree):
        a = open_file(tree, "a.txt")
        b = open_file(tree, "b.txt")
        wa, ra = a.write(b"to a", 0, send=False)
        wb, rb = b.write(b"to b!", 0, send=False)
        requests = conn.send_compound([wa, wb], session.session_id, tree.tree_connect_id, related=False)
        assert ra(requests[0]) == 4
        assert rb(requests[1]) == 5
        a.close()
        b.close()
    assert (server.share_path / "a.txt").read_bytes() == b"to a"
    assert (server.share_path / "b.txt").read_bytes() == b"to b!"


def test_related_compound_error_cascades(server):
    # MS-SMB2 3.3.5.2.7.2: when the create fails, the related requests that
    # use its FileId fail with the same status.
    with smb_tree(server) as (conn, session, tree):
        f, (create_msg, create_recv) = open_file(tree, "does-not-exist.txt", CreateDisposition.FILE_OPEN, send=False)
        read_msg, read_recv = f.read(0, 10, send=False)
        close_msg, close_recv = f.close(send=False)
        requests = conn.send_compound([create_msg, read_msg, close_msg], session.session_id, tree.tree_connect_id, related=True)
        statuses = []
        for request, recv in zip(requests, (create_recv, read_recv, close_recv)):
            with pytest.raises(SMBResponseException) as excinfo:
                recv(request)
            statuses.append(status_of(excinfo))
        assert statuses == [NtStatus.STATUS_OBJECT_NAME_NOT_FOUND] * 3, [hex(s) for s in statuses]


# --------------------------------------------------------------------------
# credits


def test_credits_granted(server):
    with smb_tree(server) as (conn, session, tree):
        assert credits_available(conn) >= 1, "no credit left after logon and tree connect"
        granted = conn.echo(sid=session.session_id, timeout=TIMEOUT, credit_request=32)
        assert granted >= 1
        ensure_credits(conn, session, 16)


@pytest.mark.parametrize("dialect", list(MULTI_CREDIT_DIALECTS.values()), ids=list(MULTI_CREDIT_DIALECTS))
def test_large_write_and_read_charged_per_64k(server, dialect):
    with smb_tree(server, dialect) as (conn, session, tree):
        assert conn.supports_multi_credit, "server did not announce SMB2_GLOBAL_CAP_LARGE_MTU"
        f = open_file(tree, "large.bin")
        for size in (MIB, min(8 * MIB, conn.max_write_size, conn.max_read_size)):
            charge = (size - 1) // (64 * KIB) + 1
            data = os.urandom(size)
            ensure_credits(conn, session, charge)
            msg, recv = f.write(data, 0, send=False)
            request, written = send_and_receive(conn, session, tree, msg, recv, credit_request=charge)
            assert request.message["credit_charge"].get_value() == charge
            assert written == size
            # A response may grant 0 while the client still holds credits, but
            # the server must never leave the client without one.
            assert credits_available(conn) >= 1, "WRITE response left the client with no credit"

            ensure_credits(conn, session, charge)
            msg, recv = f.read(0, size, send=False)
            request, got = send_and_receive(conn, session, tree, msg, recv, credit_request=charge)
            assert request.message["credit_charge"].get_value() == charge
            assert got == data
            # A response may grant 0 while the client still holds credits, but
            # the server must never leave the client without one.
            assert credits_available(conn) >= 1, "READ response left the client with no credit"
        f.close()


def test_server_allows_8mib_reads_and_writes(server):
    with smb_connection(server, Dialects.SMB_3_1_1) as conn:
        assert conn.max_read_size >= 8 * MIB
        assert conn.max_write_size >= 8 * MIB


def assert_undercharged_read_refused(server, charge: int = 1) -> None:
    """MS-SMB2 3.3.5.2.5: a request whose CreditCharge is less than its
    payload needs (one credit per 64 KiB) fails with STATUS_INVALID_PARAMETER,
    and the open stays usable."""
    with smb_tree(server, Dialects.SMB_3_1_1) as (conn, session, tree):
        (server.share_path / "big.bin").write_bytes(os.urandom(MIB))
        f = open_file(tree, "big.bin", CreateDisposition.FILE_OPEN)
        ensure_credits(conn, session, 16)
        genuine = conn._calculate_credit_charge
        conn._calculate_credit_charge = lambda message: charge
        try:
            msg, recv = f.read(0, MIB, send=False)
            request = conn.send(msg, session.session_id, tree.tree_connect_id)
        finally:
            conn._calculate_credit_charge = genuine
        with pytest.raises(SMBResponseException) as excinfo:
            recv(request)
        assert status_of(excinfo) == NtStatus.STATUS_INVALID_PARAMETER
        assert f.read(0, 1024) == (server.share_path / "big.bin").read_bytes()[:1024]
        f.close()


def test_insufficient_credit_charge_refused(server):
    assert_undercharged_read_refused(server)


# --------------------------------------------------------------------------
# directories


@pytest.mark.parametrize(
    "info_class",
    [FileInformationClass.FILE_ID_BOTH_DIRECTORY_INFORMATION, FileInformationClass.FILE_NAMES_INFORMATION],
    ids=["FileIdBothDirectoryInformation", "FileNamesInformation"],
)
def test_directory_of_10000_entries_listed_completely(server, info_class):
    big = server.share_path / "big"
    big.mkdir()
    expected = set()
    for i in range(10_000):
        name = f"entry-{i:05d}-{'x' * (i % 17)}.dat"
        (big / name).touch()
        expected.add(name)

    with smb_tree(server) as (conn, session, tree):
        d = open_directory(tree, "big")
        seen: list[str] = []
        requests = 0
        flags = QueryDirectoryFlags.SMB2_RESTART_SCANS
        while True:
            requests += 1
            assert requests < 2000, "listing does not end"
            try:
                entries = d.query_directory("*", info_class, flags=flags)
            except SMBResponseException as e:
                assert e.status == NtStatus.STATUS_NO_MORE_FILES, f"query directory failed: {e}"
                break
            flags = 0
            assert entries, "an empty successful QUERY_DIRECTORY response"
            seen += [e["file_name"].get_value().decode("utf-16-le") for e in entries]
        assert requests > 2, "10,000 entries should need several 64 KiB responses"
        assert len(seen) == len(set(seen)), "an entry was listed twice"
        assert set(seen) == expected | {".", ".."}

        # RESTART_SCANS starts again from the first entry.
        again = d.query_directory("*", info_class, flags=QueryDirectoryFlags.SMB2_RESTART_SCANS)
        assert again and again[0]["file_name"].get_value().decode("utf-16-le") == seen[0]
        d.close()


def open_status(tree, name, disposition) -> int:
    try:
        f = open_file(tree, name, disposition)
    except SMBResponseException as e:
        return e.status
    f.close()
    return NtStatus.STATUS_SUCCESS


def test_names_in_a_large_directory_match_without_case_whoever_made_them(server):
    # A directory large enough for the server to index its names rather
    # than list it for every new name (nimbus_vfs::NameIndex): changes made
    # on the server's disk are seen at once all the same.
    big = server.share_path / "many"
    big.mkdir()
    for i in range(1500):
        (big / f"file-{i}.dat").touch()
    with smb_tree(server) as (conn, session, tree):
        # New names: the first one builds the index, later ones use it.
        for i in range(20):
            assert open_status(tree, f"many\\NEW-{i}.txt", CreateDisposition.FILE_CREATE) == NtStatus.STATUS_SUCCESS
        assert open_status(tree, "many\\FILE-7.DAT", CreateDisposition.FILE_OPEN) == NtStatus.STATUS_SUCCESS
        # Made on disk by someone else: found under any case, not duplicated.
        (big / "Report.TXT").write_bytes(b"on disk")
        assert open_status(tree, "many\\report.txt", CreateDisposition.FILE_OPEN_IF) == NtStatus.STATUS_SUCCESS
        f = open_file(tree, "many\\REPORT.txt", CreateDisposition.FILE_OPEN)
        assert f.read(0, 7) == b"on disk"
        f.close()
        assert not (big / "report.txt").exists()
        # Renamed and removed on disk: the old names are gone at once.
        (big / "Report.TXT").rename(big / "Renamed.TXT")
        assert open_status(tree, "many\\report.txt", CreateDisposition.FILE_OPEN) == NtStatus.STATUS_OBJECT_NAME_NOT_FOUND
        assert open_status(tree, "many\\RENAMED.txt", CreateDisposition.FILE_OPEN) == NtStatus.STATUS_SUCCESS
        (big / "Renamed.TXT").unlink()
        assert open_status(tree, "many\\renamed.txt", CreateDisposition.FILE_OPEN) == NtStatus.STATUS_OBJECT_NAME_NOT_FOUND
    assert sorted(p.name for p in big.iterdir() if p.name.startswith("NEW")) == sorted(f"NEW-{i}.txt" for i in range(20))


@pytest.mark.nimbus_only  # hide_files is nimbus's key (Samba: "hide files")
def test_dot_files_and_hide_files_are_shown_hidden(server_factory):
    srv = server_factory.start(security=Security(hide_files={"data": ["*.tmp", "desktop.ini"]}))
    for name in (".profile", "draft.TMP", "Desktop.ini", "plain.txt"):
        (srv.share_path / name).write_bytes(b"x")
    (srv.share_path / ".config").mkdir()
    hidden = FileAttributes.FILE_ATTRIBUTE_HIDDEN
    with smb_tree(srv) as (conn, session, tree):
        d = open_directory(tree, "")
        listed = {
            e["file_name"].get_value().decode("utf-16-le"): e["file_attributes"].get_value()
            for e in d.query_directory("*", FileInformationClass.FILE_ID_BOTH_DIRECTORY_INFORMATION, flags=QueryDirectoryFlags.SMB2_RESTART_SCANS)
        }
        d.close()
        assert {n for n, a in listed.items() if a & hidden} == {".profile", "draft.TMP", "Desktop.ini", ".config"}
        assert listed[".config"] & FileAttributes.FILE_ATTRIBUTE_DIRECTORY
        # An open says the same; an overwrite that does not ask for HIDDEN
        # is no attempt to strip it (it is not stored, so not refused).
        f = open_file(tree, ".profile", CreateDisposition.FILE_OVERWRITE_IF)
        assert f.file_attributes & hidden
        f.close()
        f = open_file(tree, "plain.txt", CreateDisposition.FILE_OPEN)
        assert not f.file_attributes & hidden
        f.close()


def test_query_directory_pattern_and_single_entry(server):
    for name in ("alpha.txt", "alps.txt", "beta.txt", "al.log"):
        (server.share_path / name).write_bytes(b"")
    with smb_tree(server) as (conn, session, tree):
        d = open_directory(tree, "")
        names = [
            e["file_name"].get_value().decode("utf-16-le")
            for e in d.query_directory("al*.txt", FileInformationClass.FILE_NAMES_INFORMATION, flags=QueryDirectoryFlags.SMB2_RESTART_SCANS)
        ]
        assert sorted(names) == ["alpha.txt", "alps.txt"]
        single = d.query_directory(
            "*",
            FileInformationClass.FILE_NAMES_INFORMATION,
            flags=QueryDirectoryFlags.SMB2_RESTART_SCANS | QueryDirectoryFlags.SMB2_RETURN_SINGLE_ENTRY,
        )
        assert len(single) == 1
        d.close()


# --------------------------------------------------------------------------
# confinement to the share


OUTSIDE_SECRET = b"SECRET-OUTSIDE-THE-SHARE\n"

# Names sent as they are (smbprotocol does not clean them) that, resolved on
# the server's disk from the share root, land exactly on secret.txt in the
# share's parent directory: {parent} is that directory's name, {to_root}
# enough `..\` to reach / and {absolute} its absolute path in backslashes.
DOTDOT_ESCAPES = {
    "dotdot": "..\\secret.txt",
    "sub-dotdot-dotdot": "sub\\..\\..\\secret.txt",
    "dotdot-dotdot-parent": "..\\..\\{parent}\\secret.txt",
    "dotdots-to-root": "{to_root}{absolute}\\secret.txt",
}


@pytest.mark.parametrize("template", list(DOTDOT_ESCAPES.values()), ids=list(DOTDOT_ESCAPES))
def test_dotdot_path_refused(server, template):
    share = server.share_path
    (share / "sub").mkdir()
    outside = share.parent / "secret.txt"
    outside.write_bytes(OUTSIDE_SECRET)
    path = template.format(
        parent=outside.parent.name,
        to_root="..\\" * (len(share.parts) - 1),  # parts[0] is "/"
        absolute=str(outside.parent).replace("/", "\\"),
    )
    # The test's own check: resolved from the share root, the name reaches the file outside.
    assert Path(os.path.normpath(share / path.replace("\\", "/"))) == outside

    with smb_tree(server) as (conn, session, tree):
        f = Open(tree, path)
        with pytest.raises(SMBResponseException) as excinfo:
            f.create(
                ImpersonationLevel.Impersonation,
                FilePipePrinterAccessMask.GENERIC_READ,
                FileAttributes.FILE_ATTRIBUTE_NORMAL,
                ShareAccess.FILE_SHARE_READ,
                CreateDisposition.FILE_OPEN,
                CreateOptions.FILE_NON_DIRECTORY_FILE,
            )
            # Only reached if the open succeeded: show what it gave away.
            pytest.fail(f"{path!r} was opened; it reads {f.read(0, 64)!r}")
        # Samba's smbd answers the same to each of these names (pytest
        # --target=samba: its check_path_syntax() refuses a `..` that climbs
        # above the share root), as nimbus does (names.rs to_vfs_path)
        # before any lookup.
        assert status_of(excinfo) == NtStatus.STATUS_OBJECT_PATH_SYNTAX_BAD
    assert outside.read_bytes() == OUTSIDE_SECRET


@pytest.mark.parametrize("path", ["sub\\..\\inside.txt", ".\\inside.txt", "sub\\.\\..\\inside.txt"], ids=["sub-dotdot", "dot", "sub-dot-dotdot"])
def test_dot_components_inside_the_share_resolve_as_written(server, path):
    """As smbd does (smbtorture smb2.notify.tree watches `zqy\\..`): a dot
    component that stays inside the share names the directory as written,
    never through a link on disk."""
    (server.share_path / "sub").mkdir()
    (server.share_path / "inside.txt").write_bytes(b"inside")
    with smb_tree(server) as (conn, session, tree):
        f = open_file(tree, path, CreateDisposition.FILE_OPEN)
        try:
            assert f.read(0, 6) == b"inside"
        finally:
            f.close()


def test_a_directory_created_where_a_file_is(server):
    """MS-FSA 2.1.5.1.2, as Windows and Samba answer: FILE_CREATE of a
    directory over a file of that name is OBJECT_NAME_COLLISION (the name
    is taken), FILE_OPEN_IF and FILE_OPEN of one are NOT_A_DIRECTORY; the
    file stays as it was."""
    (server.share_path / "taken").write_bytes(b"a file")
    with smb_tree(server) as (conn, session, tree):
        for disposition, expected in (
            (CreateDisposition.FILE_CREATE, NtStatus.STATUS_OBJECT_NAME_COLLISION),
            (CreateDisposition.FILE_OPEN_IF, NtStatus.STATUS_NOT_A_DIRECTORY),
            (CreateDisposition.FILE_OPEN, NtStatus.STATUS_NOT_A_DIRECTORY),
        ):
            d = Open(tree, "taken")
            with pytest.raises(SMBResponseException) as excinfo:
                d.create(
                    ImpersonationLevel.Impersonation,
                    DirectoryAccessMask.FILE_LIST_DIRECTORY | DirectoryAccessMask.FILE_READ_ATTRIBUTES,
                    FileAttributes.FILE_ATTRIBUTE_DIRECTORY,
                    ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
                    disposition,
                    CreateOptions.FILE_DIRECTORY_FILE,
                )
            assert status_of(excinfo) == expected, f"{disposition}: {status_of(excinfo):#x}"
    assert (server.share_path / "taken").read_bytes() == b"a file"


def test_create_through_escaping_symlink_refused(symlink_server):
    with smb_tree(symlink_server) as (conn, session, tree):
        with pytest.raises(SMBException):
            open_file(tree, "parent-link\\planted.txt", CreateDisposition.FILE_CREATE)
    assert not (symlink_server.share_path.parent / "planted.txt").exists(), "a file was created outside the share"


def test_network_interface_info_lists_the_address_listened_on(server):
    """FSCTL_QUERY_NETWORK_INTERFACE_INFO (MS-SMB2 2.2.32.5): the server
    listens on 127.0.0.1 only, so that is the one address listed, with the
    loopback interface's index and a speed."""
    import socket
    import struct

    from smbprotocol.ioctl import CtlCode, IOCTLFlags, SMB2IOCTLRequest, SMB2IOCTLResponse

    with smb_tree(server) as (conn, session, tree):
        req = SMB2IOCTLRequest()
        req["ctl_code"] = CtlCode.FSCTL_QUERY_NETWORK_INTERFACE_INFO
        req["file_id"] = b"\xff" * 16
        req["max_output_response"] = 8192
        req["flags"] = IOCTLFlags.SMB2_0_IOCTL_IS_FSCTL
        resp = conn.receive(conn.send(req, sid=session.session_id, tid=tree.tree_connect_id))
        ioctl = SMB2IOCTLResponse()
        ioctl.unpack(resp["data"].get_value())
        out = ioctl["buffer"].get_value()
    assert len(out) == 152
    nxt, index, capability, _, speed, family = struct.unpack_from("<IIIIQH", out)
    assert nxt == 0 and family == 0x0002
    assert socket.inet_ntoa(out[28:32]) == "127.0.0.1"
    assert index == socket.if_nametoindex("lo")
    assert speed > 0 and capability & ~0x3 == 0
