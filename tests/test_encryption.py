"""SMB3 encryption with real clients: Debian's smbclient and Python smbprotocol.

What proves a transfer was encrypted: the on-the-wire tests record the
connection with a proxy (tests/tapproxy.py) and check that every message
after the logon (or the tree connect) is a TRANSFORM and that a marker
inside the file never crosses in clear, with a clear transfer beside each
as the positive control. Elsewhere the servers run with
`encryption = "required"`, so any request that arrives in clear is refused
with ACCESS_DENIED and the transfer would fail; the server's logon log line
names the cipher it derived keys for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import struct
import subprocess
import time
import uuid

import pytest
from conftest import Security, require_tool
from smbprotocol import Dialects
from smbprotocol.connection import Capabilities, Ciphers, Connection
from smbprotocol.exceptions import SMBConnectionClosed, SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect
from tapproxy import SESSION_SETUP, STATUS_SUCCESS, TO_CLIENT, TO_SERVER, TREE_CONNECT, Tap, TapProxy
from test_smbclient import BIG_TIMEOUT, MIB, make_file, sha256_file
from test_smbprotocol import TIMEOUT, open_file

# smbclient's names for them (client smb3 encryption/signing algorithms)
CIPHERS = ["AES-128-GCM", "AES-256-GCM", "AES-128-CCM", "AES-256-CCM"]
SIGNERS = ["HMAC-SHA256", "AES-128-CMAC", "AES-128-GMAC"]
# what the server's logon line calls them
LOG_NAMES = {
    "AES-128-GCM": "Aes128Gcm",
    "AES-256-GCM": "Aes256Gcm",
    "AES-128-CCM": "Aes128Ccm",
    "AES-256-CCM": "Aes256Ccm",
    "HMAC-SHA256": "HmacSha256",
    "AES-128-CMAC": "AesCmac",
    "AES-128-GMAC": "AesGmac",
}
SMBPROTOCOL_CIPHERS = {
    "AES-128-GCM": Ciphers.AES_128_GCM,
    "AES-256-GCM": Ciphers.AES_256_GCM,
    "AES-128-CCM": Ciphers.AES_128_CCM,
    "AES-256-CCM": Ciphers.AES_256_CCM,
}
BIG = 100 * MIB
SECRET = "secret"

needs_smbclient = require_tool("smbclient", "smbclient")


def smbclient(server, conf, cwd, commands, *, proto="SMB3_11", protection="encrypt", options=(), share=None, timeout=120):
    cmd = [
        "smbclient", f"//{server.host}/{share or server.share}",
        "-p", str(server.port),
        "-U", f"{server.user}%{server.password}",
        "-m", proto,
        f"--client-protection={protection}",
        "--use-kerberos=off",
        "-s", str(conf),
        "-c", commands,
    ]  # fmt: skip
    for o in options:
        cmd += ["--option", o]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def assert_ok(rc, out, what):
    assert rc == 0 and "NT_STATUS_" not in out, f"{what} failed (rc={rc}):\n{out}"


def put_get_identical(server, conf, client_dir, size, **kw):
    digest = make_file(client_dir / "up.bin", size)
    assert_ok(*smbclient(server, conf, client_dir, "put up.bin remote.bin", timeout=BIG_TIMEOUT, **kw), "put")
    assert sha256_file(server.share_path / "remote.bin") == digest
    assert_ok(*smbclient(server, conf, client_dir, "get remote.bin down.bin", timeout=BIG_TIMEOUT, **kw), "get")
    assert sha256_file(client_dir / "down.bin") == digest


def logons(server) -> list[str]:
    """The server's log lines for successful logons (refusals say "session logon of")."""
    return [line for line in server.log_tail(10_000).splitlines() if "session logon: user" in line]


def assert_each_logon(server, count, text):
    """Exactly `count` logons, each naming `text` (an `all` over no lines is true)."""
    lines = logons(server)
    assert len(lines) == count, lines
    assert all(text in line for line in lines), lines


# --------------------------------------------------------------------------
# smbclient


@needs_smbclient
@pytest.mark.nimbus_only
@pytest.mark.parametrize("cipher", CIPHERS)
def test_smbclient_100mib_encrypted_with_each_cipher(server_factory, samba_client_conf, client_dir, cipher):
    srv = server_factory.start(security=Security(encryption="required"))
    put_get_identical(srv, samba_client_conf, client_dir, BIG, options=[f"client smb3 encryption algorithms={cipher}"])
    assert_each_logon(srv, 2, f"encryption {LOG_NAMES[cipher]} required")  # one smbclient run for the put, one for the get


@needs_smbclient
@pytest.mark.nimbus_only
@pytest.mark.parametrize("signer", SIGNERS)
def test_smbclient_100mib_signed_with_each_algorithm(server_factory, samba_client_conf, client_dir, signer):
    srv = server_factory.start(security=Security(signing="required"))
    put_get_identical(srv, samba_client_conf, client_dir, BIG, protection="sign", options=[f"client smb3 signing algorithms={signer}"])
    assert_each_logon(srv, 2, f"signing {LOG_NAMES[signer]}")


@needs_smbclient
@pytest.mark.nimbus_only
@pytest.mark.parametrize("proto", ["SMB3_00", "SMB3_02"])
def test_smbclient_smb30_encrypts_with_aes128_ccm(server_factory, samba_client_conf, client_dir, proto):
    srv = server_factory.start(security=Security(encryption="required"))
    put_get_identical(srv, samba_client_conf, client_dir, 3 * MIB + 7, proto=proto)
    assert_each_logon(srv, 2, "encryption Aes128Ccm required")


@needs_smbclient
def test_client_asking_for_encryption_gets_it_when_server_does_not_ask(server, samba_client_conf, client_dir):
    """encryption = "off" (the default) does not refuse a client that wants privacy."""
    put_get_identical(server, samba_client_conf, client_dir, MIB + 3)


@pytest.fixture
def mixed_server(server_factory):
    """Share "data" in clear (server default), share "secret" with encryption = "required"."""
    return server_factory.start([("data", False), (SECRET, False)], security=Security(share_encryption={SECRET: "required"}))


@needs_smbclient
@pytest.mark.nimbus_only
def test_required_share_refuses_smb21_client_with_reason(mixed_server, samba_client_conf, client_dir):
    rc, out = smbclient(mixed_server, samba_client_conf, client_dir, "ls", proto="SMB2_10", protection="sign", share=SECRET)
    assert rc != 0 and "NT_STATUS_ACCESS_DENIED" in out, out
    log = mixed_server.log_tail()
    assert 'tree connect to "secret" refused: the share requires encryption' in log
    assert "Smb210 has no encryption; SMB 3 is needed" in log
    # the share's own setting wins: the clear share still serves SMB 2.1
    assert_ok(*smbclient(mixed_server, samba_client_conf, client_dir, "mkdir plain", proto="SMB2_10", protection="sign"), "mkdir")
    assert (mixed_server.share_path / "plain").is_dir()


@needs_smbclient
@pytest.mark.nimbus_only
def test_required_share_serves_encrypting_client(mixed_server, samba_client_conf, client_dir):
    assert_ok(*smbclient(mixed_server, samba_client_conf, client_dir, "mkdir inside", share=SECRET), "mkdir")
    assert (mixed_server.extra_shares[SECRET] / "inside").is_dir()


@needs_smbclient
@pytest.mark.nimbus_only
def test_required_share_with_client_protection_off(mixed_server, samba_client_conf, client_dir):
    """smbclient 4.17 still offers ciphers with --client-protection=off and obeys the
    share's ENCRYPT_DATA flag, so it ends up encrypting (Samba's smbd sees the same);
    a client that really sends in clear is refused (smbprotocol test below)."""
    assert_ok(*smbclient(mixed_server, samba_client_conf, client_dir, "mkdir viaoff", protection="off", share=SECRET), "mkdir")
    assert (mixed_server.extra_shares[SECRET] / "viaoff").is_dir()


@needs_smbclient
@pytest.mark.nimbus_only
def test_server_wide_required_refuses_smb21_at_logon(server_factory, samba_client_conf, client_dir):
    srv = server_factory.start(security=Security(encryption="required"))
    rc, out = smbclient(srv, samba_client_conf, client_dir, "ls", proto="SMB2_10", protection="sign")
    assert rc != 0 and "NT_STATUS_ACCESS_DENIED" in out, out
    assert "refused: encryption is required and this session cannot encrypt" in srv.log_tail()


@needs_smbclient
@pytest.mark.nimbus_only
def test_cipher_list_limits_what_is_negotiated(server_factory, samba_client_conf, client_dir):
    srv = server_factory.start(security=Security(encryption="required", ciphers=["AES-256-GCM"]))
    # No common cipher: the session cannot encrypt, so its logon is refused
    # with ACCESS_DENIED (MS-SMB2 3.3.5.5.3, as with a client that has no
    # encryption capability; Samba's smbd answers the same).
    rc, out = smbclient(srv, samba_client_conf, client_dir, "ls", options=["client smb3 encryption algorithms=AES-128-GCM"])
    assert rc == 1 and "session setup failed: NT_STATUS_ACCESS_DENIED" in out, out
    assert "cannot encrypt (the client offered none of the configured ciphers (Smb311))" in srv.log_tail()
    # 3.0 knows only AES-128-CCM, which this server does not offer
    rc, out = smbclient(srv, samba_client_conf, client_dir, "ls", proto="SMB3_00")
    assert rc == 1 and "session setup failed: NT_STATUS_ACCESS_DENIED" in out, out
    assert "cannot encrypt (the client offered none of the configured ciphers (Smb300))" in srv.log_tail()
    assert_ok(*smbclient(srv, samba_client_conf, client_dir, "ls"), "ls with AES-256-GCM")
    assert_each_logon(srv, 1, "encryption Aes256Gcm required")


# --------------------------------------------------------------------------
# on the wire: smbclient through a recording proxy (tests/tapproxy.py), so
# what is proven is what crossed the socket, not what a client believes


SESSION_FLAG_ENCRYPT_DATA = 0x0004  # MS-SMB2 2.2.6 SessionFlags
SHAREFLAG_ENCRYPT_DATA = 0x00008000  # MS-SMB2 2.2.10 ShareFlags
MARKED_SIZE = MIB + 7


def new_marker() -> bytes:
    return b"NIMBUS-CLEAR-TEXT-MARKER-" + uuid.uuid4().hex.encode()


def marked_file(path, marker: bytes) -> bytes:
    """Random bytes with `marker` every 4 KiB: any piece of the file that
    crosses the wire in clear shows it."""
    data = bytearray()
    while len(data) < MARKED_SIZE:
        data += marker + os.urandom(4096)
    data = bytes(data[:MARKED_SIZE])
    path.write_bytes(data)
    return data


def tapped_put_get(server, conf, cwd, marker, share=None, **kw) -> Tap:
    """smbclient puts a marked file and gets it back, in one connection
    through a recording proxy; both copies are byte-identical. Returns the
    connection's record."""
    data = marked_file(cwd / "up.bin", marker)
    (cwd / "down.bin").unlink(missing_ok=True)
    share = share or server.share
    with TapProxy(server.host, server.port) as proxy:
        via_proxy = dataclasses.replace(server, port=proxy.port)
        assert_ok(*smbclient(via_proxy, conf, cwd, "put up.bin tapped.bin; get tapped.bin down.bin", share=share, **kw), "put and get")
    assert not proxy.overflowed
    assert len(proxy.taps) == 1, f"smbclient made {len(proxy.taps)} connections"
    assert (server.extra_shares[share] / "tapped.bin").read_bytes() == data
    assert (cwd / "down.bin").read_bytes() == data
    return proxy.taps[0]


def answer(tap: Tap, command: int) -> int:
    """Index of the server's one successful clear answer to `command`."""
    found = [i for i, f in enumerate(tap.frames) if f.direction == TO_CLIENT and f.command() == command and f.status() == STATUS_SUCCESS]
    assert len(found) == 1, f"{len(found)} successful clear answers to command {command}"
    return found[0]


def session_flags(tap: Tap) -> int:
    """SessionFlags of the SESSION_SETUP response (MS-SMB2 2.2.6)."""
    return struct.unpack_from("<H", tap.frames[answer(tap, SESSION_SETUP)].message, 64 + 2)[0]


def share_flags(tap: Tap) -> int:
    """ShareFlags of the TREE_CONNECT response (MS-SMB2 2.2.10)."""
    return struct.unpack_from("<I", tap.frames[answer(tap, TREE_CONNECT)].message, 64 + 4)[0]


def assert_sealed_from(tap: Tap, start: int, marker: bytes) -> None:
    """Every message from frame `start` on, both ways, is a TRANSFORM; the
    file crossed the wire each way inside them; the marker never did in clear."""
    for direction in (TO_SERVER, TO_CLIENT):
        frames = [f for f in tap.frames[start:] if f.direction == direction]
        in_clear = [f.command() for f in frames if not f.encrypted]
        assert frames, f"{direction}: no messages"
        assert not in_clear, f"{direction}: of {len(frames)} messages, these were in clear: commands {in_clear}"
        assert sum(len(f.message) for f in frames) > MARKED_SIZE, f"{direction}: the file did not go this way"
        assert marker not in tap.streams[direction], f"{direction}: the file crossed the wire in clear"


def assert_marker_visible(tap: Tap, marker: bytes) -> None:
    """The positive control: in clear traffic the same check sees the file."""
    assert not any(f.encrypted for f in tap.frames)
    for direction in (TO_SERVER, TO_CLIENT):
        assert marker in tap.streams[direction], f"{direction}: the marker is not in a clear capture"


@needs_smbclient
@pytest.mark.parametrize("proto, cipher", [("SMB3_11", c) for c in CIPHERS] + [("SMB3_00", "AES-128-CCM")])
def test_on_the_wire_required_encrypts_everything_after_logon(server_factory, samba_client_conf, client_dir, proto, cipher):
    srv = server_factory.start(security=Security(encryption="required"))
    marker = new_marker()
    tap = tapped_put_get(srv, samba_client_conf, client_dir, marker, proto=proto, options=[f"client smb3 encryption algorithms={cipher}"])
    assert_sealed_from(tap, answer(tap, SESSION_SETUP) + 1, marker)
    # Positive control: the same capture of a session that only signs shows the file.
    plain = server_factory.start()
    tap = tapped_put_get(plain, samba_client_conf, client_dir, marker, proto=proto, protection="sign")
    assert not session_flags(tap) & SESSION_FLAG_ENCRYPT_DATA
    assert_marker_visible(tap, marker)


@needs_smbclient
def test_on_the_wire_required_share_is_sealed_and_clear_share_is_not(mixed_server, samba_client_conf, client_dir):
    """The client only signs; the share's flag alone makes it encrypt that tree."""
    marker = new_marker()
    tap = tapped_put_get(mixed_server, samba_client_conf, client_dir, marker, protection="sign", share=SECRET)
    assert not session_flags(tap) & SESSION_FLAG_ENCRYPT_DATA
    assert share_flags(tap) & SHAREFLAG_ENCRYPT_DATA
    assert_sealed_from(tap, answer(tap, TREE_CONNECT) + 1, marker)
    # Positive control: the clear share of the same server, same client settings.
    tap = tapped_put_get(mixed_server, samba_client_conf, client_dir, marker, protection="sign", share="data")
    assert not share_flags(tap) & SHAREFLAG_ENCRYPT_DATA
    assert_marker_visible(tap, marker)


@needs_smbclient
def test_on_the_wire_desired_encrypts_smb3_and_serves_smb21_in_clear(server_factory, samba_client_conf, client_dir):
    srv = server_factory.start(security=Security(encryption="desired"))
    marker = new_marker()
    # The client only signs; the server's "desired" sets ENCRYPT_DATA on the session.
    tap = tapped_put_get(srv, samba_client_conf, client_dir, marker, protection="sign")
    assert session_flags(tap) & SESSION_FLAG_ENCRYPT_DATA
    assert_sealed_from(tap, answer(tap, SESSION_SETUP) + 1, marker)
    # SMB 2.1 cannot encrypt: "desired" serves it in clear, and the capture shows it.
    tap = tapped_put_get(srv, samba_client_conf, client_dir, marker, proto="SMB2_10", protection="sign")
    assert not session_flags(tap) & SESSION_FLAG_ENCRYPT_DATA
    assert_marker_visible(tap, marker)


# --------------------------------------------------------------------------
# smbprotocol


@contextlib.contextmanager
def encrypted_tree(server, dialect, ciphers=None, share=None, require_encryption=True):
    conn = Connection(uuid.uuid4(), server.host, server.port, require_signing=True)
    conn.connect(dialect, timeout=TIMEOUT, preferred_encryption_algos=ciphers)
    try:
        session = Session(conn, server.user, server.password, require_encryption=require_encryption, auth_protocol="ntlm")
        session.connect()
        tree = TreeConnect(session, rf"\\{server.host}\{share or server.share}")
        tree.connect()
        yield conn, session, tree
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)


@pytest.mark.parametrize("cipher", CIPHERS)
def test_smbprotocol_each_cipher_forced(server_factory, cipher):
    srv = server_factory.start(security=Security(encryption="required"))
    payload = bytes(range(256)) * (4 * 4096)  # 4 MiB
    with encrypted_tree(srv, Dialects.SMB_3_1_1, [SMBPROTOCOL_CIPHERS[cipher]]) as (conn, session, tree):
        assert conn.cipher_id == SMBPROTOCOL_CIPHERS[cipher]
        assert session.encrypt_data
        f = open_file(tree, "enc.bin")
        for off in range(0, len(payload), MIB):
            assert f.write(payload[off : off + MIB], off) == MIB
        assert f.read(0, len(payload)) == payload
        f.close()
    assert (srv.share_path / "enc.bin").read_bytes() == payload


def test_smbprotocol_smb30_encrypts(server_factory):
    srv = server_factory.start(security=Security(encryption="required"))
    with encrypted_tree(srv, Dialects.SMB_3_0_0) as (conn, session, tree):
        f = open_file(tree, "enc30.txt")
        f.write(b"encrypted at 3.0", 0)
        assert f.read(0, 16) == b"encrypted at 3.0"
        f.close()


def test_desired_sets_the_session_flag(server_factory):
    srv = server_factory.start(security=Security(encryption="desired"))
    with encrypted_tree(srv, Dialects.SMB_3_1_1, require_encryption=False) as (conn, session, tree):
        assert session.encrypt_data, "ENCRYPT_DATA session flag not set with encryption = desired"


def test_clear_request_on_encrypted_share_refused(mixed_server):
    with encrypted_tree(mixed_server, Dialects.SMB_3_1_1, share=SECRET, require_encryption=False) as (conn, session, tree):
        assert tree.encrypt_data and not session.encrypt_data
        tree.encrypt_data = False  # the client now sends this share's requests signed, not encrypted
        with pytest.raises(SMBResponseException) as excinfo:
            open_file(tree, "clear.txt")
        assert excinfo.value.status == NtStatus.STATUS_ACCESS_DENIED
        tree.encrypt_data = True
        open_file(tree, "sealed.txt").close()
    assert not (mixed_server.extra_shares[SECRET] / "clear.txt").exists()
    assert (mixed_server.extra_shares[SECRET] / "sealed.txt").exists()


@pytest.mark.nimbus_only
@pytest.mark.parametrize("dialect", [Dialects.SMB_3_0_0, Dialects.SMB_3_0_2], ids=["3.0", "3.0.2"])
def test_smb30_client_without_the_encryption_capability_is_refused_by_a_required_share(mixed_server, dialect):
    """MS-SMB2 3.3.5.4: on 3.0 and 3.0.2 the ENCRYPTION capability (and with
    it AES-128-CCM) is answered only to a client that announced it; such a
    session cannot encrypt, so a share that requires encryption refuses its
    tree connect with ACCESS_DENIED (3.3.5.7), and the share in clear
    serves it."""
    conn = Connection(uuid.uuid4(), mixed_server.host, mixed_server.port, require_signing=True)
    conn.client_capabilities &= ~Capabilities.SMB2_GLOBAL_CAP_ENCRYPTION
    conn.connect(dialect, timeout=TIMEOUT)
    try:
        assert not conn.supports_encryption
        assert not conn.server_capabilities.has_flag(Capabilities.SMB2_GLOBAL_CAP_ENCRYPTION)
        session = Session(conn, mixed_server.user, mixed_server.password, require_encryption=False, auth_protocol="ntlm")
        session.connect()
        assert not session.encrypt_data
        with pytest.raises(SMBResponseException) as excinfo:
            TreeConnect(session, rf"\\{mixed_server.host}\{SECRET}").connect()
        assert excinfo.value.status == NtStatus.STATUS_ACCESS_DENIED
        assert f'tree connect to "{SECRET}" refused: the share requires encryption and this session cannot encrypt' in mixed_server.log_tail()
        tree = TreeConnect(session, rf"\\{mixed_server.host}\{mixed_server.share}")
        tree.connect()
        f = open_file(tree, "clear30.txt")
        f.write(b"signed only", 0)
        f.close()
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect(close=True, timeout=TIMEOUT)
    assert (mixed_server.share_path / "clear30.txt").read_bytes() == b"signed only"


def test_tampered_encrypted_message_closes_only_that_connection(server_factory):
    """MS-SMB2 3.3.5.2.1.1: a message that fails to decrypt disconnects its
    connection. Another connection, open all the while, keeps working."""
    srv = server_factory.start(security=Security(encryption="required"))
    with encrypted_tree(srv, Dialects.SMB_3_1_1) as (_other_conn, _other_session, other_tree):
        other = open_file(other_tree, "other.bin")
        other.write(b"before", 0)
        with encrypted_tree(srv, Dialects.SMB_3_1_1) as (conn, session, tree):
            genuine = conn._encrypt

            def tamper(b_data, sess):
                header = genuine(b_data, sess)
                data = bytearray(header["data"].get_value())
                data[5] ^= 0x01
                header["data"] = bytes(data)
                return header

            conn._encrypt = tamper
            with pytest.raises(SMBConnectionClosed):
                open_file(tree, "tampered.txt")
        assert srv.alive()
        if srv.kind == "nimbus":
            assert "not accepted: Authentication; closing connection" in srv.log_tail()
        # the other connection: a write and a read back after the tampering
        other.write(b"after the tampering", 0)
        assert other.read(0, 19) == b"after the tampering"
        other.close()
    assert (srv.share_path / "other.bin").read_bytes() == b"after the tampering"
    assert not (srv.share_path / "tampered.txt").exists()
    with encrypted_tree(srv, Dialects.SMB_3_1_1) as (conn, session, tree):
        open_file(tree, "after.txt").close()
    assert (srv.share_path / "after.txt").exists()


@pytest.mark.nimbus_only
def test_encrypted_message_for_unknown_session_or_too_short_closes_connection(server_factory):
    srv = server_factory.start(security=Security(encryption="required"))
    cases = {
        "short": b"\xfdSMB" + b"\x00" * 20,
        "unknown session": b"\xfdSMB" + b"\x00" * 32 + (16).to_bytes(4, "little") + b"\x00\x00\x01\x00" + (0xDEAD).to_bytes(8, "little") + b"\x00" * 16,
    }
    for name, message in cases.items():
        with socket.create_connection((srv.host, srv.port), timeout=TIMEOUT) as s:
            s.sendall(len(message).to_bytes(4, "big") + message)
            assert s.recv(4) == b"", f"{name}: connection not closed"
    assert srv.alive()
    log = srv.log_tail()
    assert "shorter than its TRANSFORM header" in log
    assert "session 0xdead, which has no encryption keys" in log


def test_encrypted_cancel_is_answered_before_the_request_after_it(server_factory):
    """A CANCEL and the request right behind it, both sealed: the cancelled
    CHANGE_NOTIFY's CANCELLED answer comes first, as smbtorture
    smb2.session.expire2e expects (sealed frames used to run side by side on
    the blocking pool, where the second request could be answered before
    the CANCEL had run). Many rounds, so an order left to chance shows."""
    from smbprotocol.change_notify import CompletionFilter, SMB2ChangeNotifyRequest
    from smbprotocol.connection import SMB2Echo
    from smbprotocol.open import (
        CreateDisposition,
        CreateOptions,
        DirectoryAccessMask,
        ImpersonationLevel,
        Open,
        ShareAccess,
    )

    srv = server_factory.start(security=Security(encryption="required"))
    (srv.share_path / "watched").mkdir()
    with encrypted_tree(srv, Dialects.SMB_3_1_1) as (conn, session, tree):
        watched = Open(tree, "watched")
        watched.create(
            ImpersonationLevel.Impersonation,
            DirectoryAccessMask.FILE_LIST_DIRECTORY | DirectoryAccessMask.SYNCHRONIZE,
            0,
            ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE | ShareAccess.FILE_SHARE_DELETE,
            CreateDisposition.FILE_OPEN,
            CreateOptions.FILE_DIRECTORY_FILE,
        )
        # The order responses arrive in, as (message id, status): seen
        # where smbprotocol opens each sealed message.
        arrived = []
        genuine = conn._decrypt

        def record(message):
            plain = genuine(message)
            arrived.append((struct.unpack_from("<Q", plain, 24)[0], struct.unpack_from("<I", plain, 8)[0]))
            return plain

        conn._decrypt = record
        # The CANCEL is held back and goes out in one write with the ECHO
        # behind it: the server reads both at once.
        held = []
        genuine_send = conn.transport.send

        def send(message):
            message = message.pack() if hasattr(message, "pack") else message
            framed = struct.pack(">L", len(message)) + message
            if not held:
                held.append(framed)
                return
            with conn.transport._sock_lock:
                conn.transport._sock.sendall(held.pop() + framed)

        for _ in range(100):
            ask = SMB2ChangeNotifyRequest()
            ask["file_id"] = watched.file_id
            ask["output_buffer_length"] = 4096
            ask["completion_filter"] = CompletionFilter.FILE_NOTIFY_CHANGE_FILE_NAME
            notify = conn.send(ask, sid=session.session_id, tid=tree.tree_connect_id)
            notify_id = notify.message["message_id"].get_value()
            # Its interim answer (an AsyncId) says it waits.
            deadline = time.monotonic() + TIMEOUT
            while notify.async_id is None:
                assert time.monotonic() < deadline, "no interim response to the CHANGE_NOTIFY"
                time.sleep(0.001)
            conn.transport.send = send
            notify.cancel()
            echo = conn.send(SMB2Echo(), sid=session.session_id)
            conn.transport.send = genuine_send
            echo_id = echo.message["message_id"].get_value()
            conn.receive(echo)
            with pytest.raises(SMBResponseException) as excinfo:
                conn.receive(notify)
            assert excinfo.value.status == NtStatus.STATUS_CANCELLED
            finals = [i for i, (mid, st) in enumerate(arrived) if mid == notify_id and st != NtStatus.STATUS_PENDING]
            echoes = [i for i, (mid, _) in enumerate(arrived) if mid == echo_id]
            assert finals and echoes and finals[0] < echoes[0], f"ECHO answered before the CANCELLED: {arrived[-4:]}"
        watched.close()
