"""impacket (`SMBConnection`) as the client, at SMB 3.0 and 3.1.1, signed
only and encrypted.

impacket announces a single capability in its NEGOTIATE, ENCRYPTION, and
takes every bit of the server's answer as a promise: a DIRECTORY_LEASING it
did not ask for sends its CREATE into parent-directory lease bookkeeping
that it never finishes (UnboundLocalError in smb3.py `create()`), so no
file can be opened. MS-SMB2 3.3.5.4 answers that bit, MULTI_CHANNEL,
PERSISTENT_HANDLES and (3.0, 3.0.2) ENCRYPTION only to a client that asked;
these tests check a real client that asks for little does its whole job:
files of 0 B, 1 B and 5 MiB put and got back byte-identical, a directory
made and listed, a rename, deletes, and the share list over srvsvc.

impacket encrypts a whole session by itself as soon as the server agrees on
AES-128-CCM (the only cipher it knows): "signed" runs a server whose cipher
list lacks it, so the traffic is signed only (and a share that requires
encryption refuses the tree connect, MS-SMB2 3.3.5.7); "encrypted" runs one
whose share requires encryption.
"""

from __future__ import annotations

import io
import os

import pytest
from conftest import PASSWORD, USER, Security
from impacket.smb3structs import SMB2_DIALECT_30, SMB2_DIALECT_311, SMB2_SESSION_FLAG_ENCRYPT_DATA
from impacket.smbconnection import SessionError, SMBConnection

TIMEOUT = 60
SHARE = "data"
MIB = 1024 * 1024
STATUS_ACCESS_DENIED = 0xC0000022
# MS-SMB2 2.2.4 Capabilities
CAP_MULTI_CHANNEL = 0x08
CAP_PERSISTENT_HANDLES = 0x10
CAP_DIRECTORY_LEASING = 0x20
CAP_ENCRYPTION = 0x40

DIALECTS = [pytest.param(SMB2_DIALECT_30, id="3.0"), pytest.param(SMB2_DIALECT_311, id="3.1.1")]
# Every cipher but AES-128-CCM: impacket finds none it knows.
NO_CCM = ["AES-128-GCM", "AES-256-GCM", "AES-256-CCM"]


def impacket_connect(server, dialect: int) -> SMBConnection:
    conn = SMBConnection(server.host, server.host, sess_port=server.port, timeout=TIMEOUT, preferredDialect=dialect)
    conn.login(server.user, server.password)
    assert conn.getDialect() == dialect
    return conn


def server_capabilities(conn: SMBConnection) -> int:
    return conn._SMBConnection._Connection["ServerCapabilities"]


def encrypting(conn: SMBConnection) -> bool:
    """Whether impacket seals what it sends on this session."""
    return bool(conn._SMBConnection._Session["SessionFlags"] & SMB2_SESSION_FLAG_ENCRYPT_DATA)


def put(conn: SMBConnection, path: str, data: bytes) -> None:
    conn.putFile(SHARE, path, io.BytesIO(data).read)


def get(conn: SMBConnection, path: str) -> bytes:
    out = io.BytesIO()
    conn.getFile(SHARE, path, out.write)
    return out.getvalue()


def names_in(conn: SMBConnection, pattern: str) -> set[str]:
    return {f.get_longname() for f in conn.listPath(SHARE, pattern)} - {".", ".."}


def file_work(server, conn: SMBConnection) -> None:
    """Everything a user does with files, checked against the share's
    directory on disk as well as through the client."""
    blobs = {"empty.bin": b"", "one.bin": b"\x5a", "five-mib.bin": os.urandom(5 * MIB + 3)}
    for name, data in blobs.items():
        put(conn, name, data)
        assert (server.share_path / name).read_bytes() == data, name
        assert get(conn, name) == data, name

    conn.createDirectory(SHARE, "folder")
    assert (server.share_path / "folder").is_dir()
    put(conn, "folder\\inner.txt", b"inside\n")
    assert names_in(conn, "folder\\*") == {"inner.txt"}
    listed = {f.get_longname(): f for f in conn.listPath(SHARE, "*")}
    assert set(blobs) | {"folder"} <= set(listed)
    assert listed["folder"].is_directory()
    assert listed["five-mib.bin"].get_filesize() == len(blobs["five-mib.bin"])

    conn.rename(SHARE, "one.bin", "folder\\renamed.bin")
    assert not (server.share_path / "one.bin").exists()
    assert get(conn, "folder\\renamed.bin") == blobs["one.bin"]
    conn.rename(SHARE, "folder", "moved")
    assert names_in(conn, "moved\\*") == {"inner.txt", "renamed.bin"}

    for name in ("moved\\inner.txt", "moved\\renamed.bin", "empty.bin", "five-mib.bin"):
        conn.deleteFile(SHARE, name)
    conn.deleteDirectory(SHARE, "moved")
    assert sorted(p.name for p in server.share_path.iterdir()) == []

    shares = {s["shi1_netname"][:-1] for s in conn.listShares()}
    assert {SHARE, "IPC$"} <= shares, shares


@pytest.mark.parametrize("dialect", DIALECTS)
def test_impacket_signed_file_work_and_share_listing(server_factory, dialect):
    srv = server_factory.start(security=Security(ciphers=NO_CCM))
    conn = impacket_connect(srv, dialect)
    try:
        caps = server_capabilities(conn)
        # Asked for ENCRYPTION alone: no directory leasing, multichannel or
        # persistent handles; and no cipher in common, so no encryption.
        assert caps & (CAP_DIRECTORY_LEASING | CAP_MULTI_CHANNEL | CAP_PERSISTENT_HANDLES | CAP_ENCRYPTION) == 0, hex(caps)
        assert not encrypting(conn)
        file_work(srv, conn)
    finally:
        conn.close()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_impacket_encrypted_file_work_and_share_listing(server_factory, dialect):
    srv = server_factory.start(security=Security(share_encryption={SHARE: "required"}))
    conn = impacket_connect(srv, dialect)
    try:
        caps = server_capabilities(conn)
        assert caps & (CAP_DIRECTORY_LEASING | CAP_MULTI_CHANNEL | CAP_PERSISTENT_HANDLES) == 0, hex(caps)
        # 3.0 agrees on AES-128-CCM by this capability, which impacket
        # asked for; 3.1.1 by negotiate context, never by the bit.
        assert bool(caps & CAP_ENCRYPTION) == (dialect == SMB2_DIALECT_30), hex(caps)
        assert encrypting(conn)
        file_work(srv, conn)
    finally:
        conn.close()


@pytest.mark.nimbus_only
@pytest.mark.parametrize("dialect", DIALECTS)
def test_impacket_without_a_common_cipher_is_refused_by_a_share_that_requires_encryption(server_factory, dialect):
    srv = server_factory.start([(SHARE, False), ("sealed", False)], security=Security(ciphers=NO_CCM, share_encryption={"sealed": "required"}))
    conn = impacket_connect(srv, dialect)
    try:
        with pytest.raises(SessionError) as e:
            conn.connectTree("sealed")
        assert e.value.getErrorCode() == STATUS_ACCESS_DENIED, hex(e.value.getErrorCode())
        assert 'tree connect to "sealed" refused: the share requires encryption' in srv.log_tail()
        # The session goes on, signed, on the share that does not.
        put(conn, "still.txt", b"fine\n")
        assert get(conn, "still.txt") == b"fine\n"
    finally:
        conn.close()
