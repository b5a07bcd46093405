"""SMB 3.x multichannel (issue 16, MS-SMB2 3.3.5.5 with
SMB2_SESSION_FLAG_BINDING), with Python smbprotocol against the real server.

A client logs on over one connection and binds a second connection of its
own (same ClientGuid) to the session; requests of the session then go on
either connection, each signed with its channel's key, and the loss of one
connection leaves the session and its open files to the other. smbtorture's
smb2.session.bind* and smb2.multichannel suites (tests/test_smbtorture.py)
check the protocol details; these tests check what a user relies on: data
written across both channels, one dropped mid-transfer, arrives intact.

smbprotocol 1.x cannot bind by itself; `bind_channel` drives a binding with
its own pieces (the SESSION_SETUP exchange of a second Session object with
the existing SessionId and the BINDING flag, signed with the session's key),
as a Windows client does it.
"""

from __future__ import annotations

import hashlib
import os
import time
import types
import uuid

import pytest
import smbprotocol.session as smb_session
from conftest import PASSWORD, USER, Security
from smbprotocol import Dialects
from smbprotocol.connection import Capabilities, Connection
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.open import CreateDisposition, CreateOptions, FilePipePrinterAccessMask, ImpersonationLevel, Open, ShareAccess
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect
from test_smbprotocol import open_file

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 30
BOB = ("bob", "B0b-Secret-2!")
BINDING = 0x01  # SMB2_SESSION_FLAG_BINDING (MS-SMB2 2.2.5)


def connect(server, guid: uuid.UUID, dialect=Dialects.SMB_3_1_1, multichannel: bool = True) -> Connection:
    """A connection whose NEGOTIATE announces SMB2_GLOBAL_CAP_MULTI_CHANNEL
    (unless `multichannel` is false), as a client that binds channels
    does: the server answers the capability only then (MS-SMB2 3.3.5.4)."""
    conn = Connection(guid, server.host, server.port, require_signing=True)
    if multichannel:
        conn.client_capabilities |= Capabilities.SMB2_GLOBAL_CAP_MULTI_CHANNEL
    conn.connect(dialect, timeout=TIMEOUT)
    return conn


def logon(conn: Connection, encrypt: bool = False) -> Session:
    session = Session(conn, USER, PASSWORD, require_encryption=encrypt, auth_protocol="ntlm")
    session.connect()
    return session


def bind_channel(conn2: Connection, s1: Session, user: str = USER, password: str = PASSWORD) -> Session:
    """Binds `conn2` to session `s1` (MS-SMB2 3.2.4.2.3): a SESSION_SETUP
    exchange with s1's SessionId and the BINDING flag, each request signed
    with the session's key, not encrypted. The channel's signing key comes
    from the new exchange (and, on 3.1.1, conn2's preauth hash), which is
    what smbprotocol's own logon arithmetic gives on conn2; the final
    response is verified with it. Encryption keys stay the session's."""
    sid = s1.session_id
    conn2.session_table[sid] = types.SimpleNamespace(
        signing_key=s1.signing_key, signing_required=True, encrypt_data=False, tree_connect_table={}
    )
    channel = Session(conn2, user, password, require_encryption=False, auth_protocol="ntlm")
    channel.session_id = sid
    plain = smb_session.SMB2SessionSetupRequest

    class BindingRequest(plain):
        def __init__(self):
            super().__init__()
            self["flags"] = BINDING

    smb_session.SMB2SessionSetupRequest = BindingRequest
    try:
        channel.connect()
    except BaseException:
        conn2.session_table.pop(sid, None)
        raise
    finally:
        smb_session.SMB2SessionSetupRequest = plain
    channel.encryption_key = s1.encryption_key
    channel.decryption_key = s1.decryption_key
    channel.application_key = s1.application_key
    channel.encrypt_data = s1.encrypt_data
    if s1.encrypt_data:
        channel.signing_required = False
    return channel


def bind_status(conn2: Connection, s1: Session, **kw) -> int:
    """The status a refused binding gets."""
    with pytest.raises(SMBResponseException) as e:
        bind_channel(conn2, s1, **kw)
    return e.value.status


def tree_on(channel: Session, tree: TreeConnect) -> TreeConnect:
    """The tree `tree` (of the same session) as reached over `channel`."""
    t = TreeConnect(channel, tree.share_name)
    t.tree_connect_id = tree.tree_connect_id
    t.encrypt_data = tree.encrypt_data
    t.is_dfs_share = tree.is_dfs_share
    t.is_ca_share = tree.is_ca_share
    t._connected = True
    channel.tree_connect_table[t.tree_connect_id] = t
    return t


def open_on(tree: TreeConnect, f: Open) -> Open:
    """Open `f` (of the same session) as reached over `tree`'s channel."""
    g = Open(tree, f.file_name)
    g.file_id = f.file_id
    g._connected = True
    return g


def still_usable(tree: TreeConnect) -> None:
    f = open_file(tree, f"alive-{uuid.uuid4().hex[:8]}.txt")
    f.write(b"ok", 0)
    assert f.read(0, 2) == b"ok"
    f.close()


@pytest.fixture
def mc_server(server_factory):
    return server_factory.start(security=Security(extra_users=[BOB]))


@pytest.mark.parametrize("dialect", [Dialects.SMB_3_0_2, Dialects.SMB_3_1_1], ids=["3.0.2", "3.1.1"])
def test_two_channels_one_dropped_mid_transfer(mc_server, dialect):
    """Writes alternate between two channels of one session; the first
    connection is cut with a write on it unanswered, which the client sends
    again on the second (as Windows replays on another channel); the file on
    disk holds exactly the bytes written. Then the last channel goes too and
    the session's open is released."""
    guid = uuid.uuid4()
    conn1 = connect(mc_server, guid, dialect)
    s1 = logon(conn1)
    tree1 = TreeConnect(s1, rf"\\{mc_server.host}\{mc_server.share}")
    tree1.connect()
    conn2 = connect(mc_server, guid, dialect)
    ch2 = bind_channel(conn2, s1)
    assert ch2.signing_key != s1.signing_key, "the channel has its own signing key"
    tree2 = tree_on(ch2, tree1)

    f1 = open_file(tree1, "big.bin")
    f2 = open_on(tree2, f1)
    chunk = 64 * 1024
    data = os.urandom(48 * chunk)
    for i in range(24):
        f = f1 if i % 2 == 0 else f2
        f.write(data[i * chunk : (i + 1) * chunk], i * chunk)
    # Requests of one channel are answered on it: a read on channel 2 of
    # what channel 1 wrote, and info of the open, agree.
    assert f2.read(0, chunk) == data[:chunk]
    assert f2.read(chunk, chunk) == data[chunk : 2 * chunk]

    # Channel 1 is lost while a write on it is unanswered.
    i = 24
    request, _ = f1.write(data[i * chunk : (i + 1) * chunk], i * chunk, send=False)
    conn1.send(request, sid=s1.session_id, tid=tree1.tree_connect_id)
    conn1.transport.close()
    # The client sends it again on the channel it has left, and goes on.
    for i in range(24, 48):
        f2.write(data[i * chunk : (i + 1) * chunk], i * chunk)
    assert f2.read(47 * chunk, chunk) == data[47 * chunk :]
    still_usable(tree2)
    f2.close()
    assert hashlib.sha256((mc_server.share_path / "big.bin").read_bytes()).digest() == hashlib.sha256(data).digest()

    # An open of the session held by channel 2 only: its loss ends the
    # session, and the open with it.
    f3 = open_file(tree2, "held.txt")
    f3.write(b"x", 0)
    conn2.transport.close()
    conn3 = connect(mc_server, uuid.uuid4())
    s3 = logon(conn3)
    tree3 = TreeConnect(s3, rf"\\{mc_server.host}\{mc_server.share}")
    tree3.connect()
    deadline = time.monotonic() + 10
    while True:
        g = Open(tree3, "held.txt")
        try:
            g.create(
                ImpersonationLevel.Impersonation,
                FilePipePrinterAccessMask.GENERIC_READ | FilePipePrinterAccessMask.GENERIC_WRITE,
                0,
                0,  # no sharing: fails while the lost session's open lasts
                CreateDisposition.FILE_OPEN,
                CreateOptions.FILE_NON_DIRECTORY_FILE,
            )
            break
        except SMBResponseException as e:
            assert e.status == NtStatus.STATUS_SHARING_VIOLATION
            assert time.monotonic() < deadline, "the session outlived its last channel"
            time.sleep(0.05)
    g.close()
    conn3.disconnect()


def test_encrypted_session_binds_and_seals_on_both_channels(server_factory):
    """A session that must encrypt binds its channel with a signed (not
    sealed) binding; requests on the new channel are then sealed with the
    session's keys, and an unsealed one is refused."""
    srv = server_factory.start(security=Security(encryption="required"))
    guid = uuid.uuid4()
    conn1 = connect(srv, guid)
    s1 = logon(conn1, encrypt=True)
    assert s1.encrypt_data
    tree1 = TreeConnect(s1, rf"\\{srv.host}\{srv.share}")
    tree1.connect()
    conn2 = connect(srv, guid)
    ch2 = bind_channel(conn2, s1)
    assert ch2.encrypt_data
    tree2 = tree_on(ch2, tree1)
    f1 = open_file(tree1, "sealed.txt")
    f2 = open_on(tree2, f1)
    f2.write(b"sealed on channel 2", 0)
    assert f1.read(0, 19) == b"sealed on channel 2"
    # The same request, signed but not sealed, is refused on the channel.
    ch2.encrypt_data = False
    tree2.encrypt_data = False
    ch2.signing_required = True
    with pytest.raises(SMBResponseException) as e:
        f2.read(0, 4)
    assert e.value.status == NtStatus.STATUS_ACCESS_DENIED
    f1.close()
    conn1.disconnect()


def test_logoff_on_one_channel_ends_the_session_on_all(mc_server):
    guid = uuid.uuid4()
    conn1 = connect(mc_server, guid)
    s1 = logon(conn1)
    tree1 = TreeConnect(s1, rf"\\{mc_server.host}\{mc_server.share}")
    tree1.connect()
    f1 = open_file(tree1, "f.txt")
    conn2 = connect(mc_server, guid)
    ch2 = bind_channel(conn2, s1)
    ch2.disconnect(close=False)  # LOGOFF on channel 2
    s1.signing_required = False
    del conn1.session_table[s1.session_id]
    with pytest.raises(SMBResponseException) as e:
        f1.read(0, 1)
    assert e.value.status == NtStatus.STATUS_USER_SESSION_DELETED
    conn1.disconnect(False)
    conn2.disconnect(False)


def test_refused_bindings_leave_the_session_alone(server_factory):
    """Each refusal gets the status Windows and Samba give, and the
    session goes on on its first channel."""
    srv = server_factory.start(security=Security(extra_users=[BOB], limits={"max_channels_per_session": 2}))
    guid = uuid.uuid4()
    conn1 = connect(srv, guid)
    s1 = logon(conn1)
    tree1 = TreeConnect(s1, rf"\\{srv.host}\{srv.share}")
    tree1.connect()

    # Another user cannot take over the session's channel.
    assert bind_status(connect(srv, guid), s1, user=BOB[0], password=BOB[1]) == NtStatus.STATUS_ACCESS_DENIED
    # A wrong password fails as a logon does.
    assert bind_status(connect(srv, guid), s1, password="wrong") == NtStatus.STATUS_LOGON_FAILURE
    # Another client (ClientGuid) cannot bind the session.
    assert bind_status(connect(srv, uuid.uuid4()), s1) == NtStatus.STATUS_USER_SESSION_DELETED
    # 2.1 has no multichannel. (smbtorture's bind_negative_* tests mix
    # dialects and signing algorithms; smbprotocol can sign a binding only
    # with its connection's algorithm, so mixes are left to them.)
    s21 = logon(connect(srv, guid, Dialects.SMB_2_1_0))
    assert bind_status(connect(srv, guid, Dialects.SMB_2_1_0), s21) == NtStatus.STATUS_REQUEST_NOT_ACCEPTED
    # A session the server does not know.
    conn = connect(srv, guid)
    ghost = types.SimpleNamespace(session_id=s1.session_id ^ 0x5A5A, signing_key=s1.signing_key, encryption_key=None, decryption_key=None, application_key=None, encrypt_data=False)
    assert bind_status(conn, ghost) == NtStatus.STATUS_USER_SESSION_DELETED

    # limits.max_channels_per_session = 2: the second channel binds, a
    # third is refused.
    conn2 = connect(srv, guid)
    bind_channel(conn2, s1)
    assert bind_status(connect(srv, guid), s1) == 0xC000009A  # STATUS_INSUFFICIENT_RESOURCES
    # Binding the bound connection again.
    with pytest.raises(SMBResponseException) as e:
        bind_channel(conn2, s1)
    assert e.value.status in (NtStatus.STATUS_REQUEST_NOT_ACCEPTED, NtStatus.STATUS_ACCESS_DENIED)
    still_usable(tree1)
    conn1.disconnect()


def test_multichannel_off(server_factory):
    """`multichannel = false`: the capability is not offered and a binding
    is refused; 2.1 never offers it."""
    srv = server_factory.start(security=Security(multichannel=False))
    guid = uuid.uuid4()
    conn1 = connect(srv, guid)
    assert not conn1.supports_multi_channel
    s1 = logon(conn1)
    assert bind_status(connect(srv, guid), s1) == NtStatus.STATUS_REQUEST_NOT_ACCEPTED
    on = server_factory.start()
    assert connect(on, uuid.uuid4()).supports_multi_channel
    assert not connect(on, uuid.uuid4(), Dialects.SMB_2_1_0).supports_multi_channel


def test_a_connection_that_did_not_announce_multichannel_cannot_bind(server_factory):
    """MS-SMB2 3.3.5.4: MULTI_CHANNEL is answered only to a client that
    announced it, and a binding comes only over a connection that has it
    (3.3.5.5): the same session binds once the second connection
    announces it."""
    srv = server_factory.start()
    guid = uuid.uuid4()
    conn1 = connect(srv, guid)
    s1 = logon(conn1)
    quiet = connect(srv, guid, multichannel=False)
    assert not quiet.supports_multi_channel
    assert bind_status(quiet, s1) == NtStatus.STATUS_REQUEST_NOT_ACCEPTED
    tree1 = TreeConnect(s1, rf"\\{srv.host}\{srv.share}")
    tree1.connect()
    channel = bind_channel(connect(srv, guid), s1)
    still_usable(tree_on(channel, tree1))
    conn1.disconnect()
