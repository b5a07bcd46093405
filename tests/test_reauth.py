"""Session re-authentication (issue 16, MS-SMB2 3.3.5.5.2), with Python
smbprotocol against the real server: the same user re-authenticates a
session that goes on with its open files and its first keys; another user
(answered LOGON_FAILURE, as a wrong password is), or a wrong password, ends
the session (its files close, later requests get
USER_SESSION_DELETED). smbtorture smb2.session.reauth1/6 and
smb2.notify.invalid-reauth check the same-user and failure cases too
(tests/test_smbtorture.py).
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from conftest import PASSWORD, USER, Security
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect
from test_smbprotocol import open_file

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 30
BOB = ("bob", "B0b-Secret-2!")


def reauthenticate(session: Session, user: str, password: str) -> None:
    """Runs a SESSION_SETUP exchange as `user` on `session`'s id.

    smbprotocol has no re-authentication call: a second Session object with
    the same id sends the exchange (signed with the session's key, which the
    server keeps), and the first one, with the keys the server still uses,
    goes back in the connection's table afterwards.
    """
    conn = session.connection
    again = Session(conn, user, password, require_encryption=False, auth_protocol="ntlm")
    again.session_id = session.session_id
    real_verify = conn.verify_signature

    def verify_with_the_session_keys(header, session_id, force=False):
        # smbprotocol checks the final response with keys derived from the
        # new exchange; the server signs with the session's, as it must.
        conn.session_table[session.session_id] = session
        return real_verify(header, session_id, force)

    conn.verify_signature = verify_with_the_session_keys
    try:
        again.connect()
    finally:
        conn.verify_signature = real_verify
        conn.session_table[session.session_id] = session


def assert_session_deleted(session: Session, f) -> None:
    """The server no longer knows the session: a request on it gets
    USER_SESSION_DELETED (unsigned, as there is no key to sign with, so
    smbprotocol must not try to verify it)."""
    del session.connection.session_table[session.session_id]
    session.signing_required = False
    with pytest.raises(SMBResponseException) as e:
        f.read(0, 1)
    assert e.value.status == NtStatus.STATUS_USER_SESSION_DELETED


@pytest.fixture
def bob_server(server_factory):
    return server_factory.start(security=Security(extra_users=[BOB]))


@pytest.fixture
def alice(bob_server):
    conn = Connection(uuid.uuid4(), bob_server.host, bob_server.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    session = Session(conn, USER, PASSWORD, require_encryption=False, auth_protocol="ntlm")
    session.connect()
    tree = TreeConnect(session, f"\\\\{bob_server.host}\\{bob_server.share}")
    tree.connect()
    yield conn, session, tree
    with contextlib.suppress(Exception):
        conn.disconnect()


def test_the_same_user_re_authenticates_and_the_session_goes_on(bob_server, alice):
    conn, session, tree = alice
    f = open_file(tree, "kept.txt")
    f.write(b"before", 0)
    reauthenticate(session, USER, PASSWORD)
    # Same session, same keys (signed requests verify), same open file.
    f.write(b" after", 6)
    assert f.read(0, 12) == b"before after"
    f.close()
    assert "session re-authenticated: user" in bob_server.log_tail()


def test_another_user_ends_the_session_and_closes_its_files(bob_server, alice):
    conn, session, tree = alice
    f = open_file(tree, "alices.txt")
    f.write(b"alice's", 0)
    with pytest.raises(SMBResponseException) as e:
        reauthenticate(session, *BOB)
    # Answered as a wrong password would be: re-authentication must not
    # tell a right password for another user from a wrong one.
    assert e.value.status == NtStatus.STATUS_LOGON_FAILURE
    # The session is gone: bob did not inherit alice's open file.
    assert_session_deleted(session, f)
    assert "ended the session: not its user" in bob_server.log_tail()


def test_a_wrong_password_ends_the_session(bob_server, alice):
    conn, session, tree = alice
    f = open_file(tree, "x.txt")
    with pytest.raises(SMBResponseException) as e:
        reauthenticate(session, USER, PASSWORD + "-wrong")
    assert e.value.status == NtStatus.STATUS_LOGON_FAILURE
    assert_session_deleted(session, f)
