"""Logon hardening from the security review (issue 11), against the real
nimbus binary: the failed-logon back-off counts per account whatever the
spelling, the user database must be private and is reloaded when it
changes, names the file cannot hold are refused, and NTLM logons that were
tampered with or relayed from another service are refused.

Clients: Python smbprotocol (pyspnego's NTLM) for ordinary logons, and for
the NTLM checks pyspnego's NTLM client driven by hand over a raw socket
(tests/rawsmb.py), so that the SPNEGO layer around it can be built with or
without a mechListMIC, and the client can be told another target name or
channel."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import struct
import subprocess
import time
import uuid

import pytest
import rawsmb
import spnego
from conftest import PASSWORD, USER, Security, add_user, free_port, nimbus_binary, run_nimbus
from smbprotocol import Dialects
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBException, SMBResponseException
from smbprotocol.header import NtStatus
from smbprotocol.session import Session
from spnego.channel_bindings import GssChannelBindings

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 30
STATUS_MORE_PROCESSING_REQUIRED = 0xC0000016
STATUS_LOGON_FAILURE = 0xC000006D
STATUS_ACCOUNT_LOCKED_OUT = 0xC0000234
# The server looks at the user database file at most once a second.
RELOAD_WAIT = 1.3


def logon(srv, user, password):
    """An smbprotocol NTLM logon; returns the status."""
    conn = Connection(uuid.uuid4(), srv.host, srv.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        Session(conn, user, password, require_encryption=False, auth_protocol="ntlm").connect()
        return NtStatus.STATUS_SUCCESS
    except SMBResponseException as e:
        return e.status
    except SMBException as e:  # smbprotocol wraps logon failures
        return getattr(e, "status", None) or str(e)
    finally:
        with contextlib.suppress(Exception):
            conn.disconnect()


def user_db(srv):
    """The database file the `server_factory` server was started with."""
    return srv.share_path.parent.parent / "users.db"


# --------------------------------------------------------------------------
# 7. back-off per account, not per spelling


def test_unicode_spellings_of_one_account_share_one_backoff_budget(server_factory):
    limits = {"max_failed_logons_per_user": 2, "max_failed_logons_per_address": 100, "logon_backoff_secs": 30, "max_logon_backoff_secs": 30}
    srv = server_factory.start(security=Security(limits=limits))
    # U+0131 dotless i upper-cases to "I": "alıce" is the account "alice"
    # for the user database, but lower-cased it was a name of its own.
    assert logon(srv, "alice", "wrong") == STATUS_LOGON_FAILURE
    assert logon(srv, "al\u0131ce", "wrong") == STATUS_LOGON_FAILURE
    assert logon(srv, USER, PASSWORD) == STATUS_ACCOUNT_LOCKED_OUT
    assert "too many failed logons for this user" in srv.log_tail()


def test_unicode_spellings_of_an_unknown_name_share_one_budget(server_factory):
    limits = {"max_failed_logons_per_user": 2, "max_failed_logons_per_address": 100, "logon_backoff_secs": 30, "max_logon_backoff_secs": 30}
    srv = server_factory.start(security=Security(limits=limits))
    # U+017F long s upper-cases to "S".
    assert logon(srv, "\u017fam", "guess1") == STATUS_LOGON_FAILURE
    assert logon(srv, "sam", "guess2") == STATUS_LOGON_FAILURE
    assert logon(srv, "SAM", "guess3") == STATUS_ACCOUNT_LOCKED_OUT
    # Other names are not affected.
    assert logon(srv, USER, PASSWORD) == NtStatus.STATUS_SUCCESS


# --------------------------------------------------------------------------
# 10d. the user database must be private


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o620, 0o604], ids=lambda m: f"{m:o}")
def test_user_db_others_can_read_or_write_is_refused_at_start(tmp_path, mode):
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600, "`nimbus user add` creates the file private"
    os.chmod(db, mode)
    cmd = [str(nimbus_binary()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--share", f"data={share}", "--user-db", str(db)]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"nimbus served with a user database of mode {mode:o}:\n{out}")
    assert proc.returncode != 0, out
    assert str(db) in out and f"{mode:04o}" in out and f"chmod 600 {db}" in out, out


# --------------------------------------------------------------------------
# 10e. user changes take effect without a restart


def test_user_del_add_and_password_change_take_effect_without_restart(server):
    db = user_db(server)
    assert logon(server, USER, PASSWORD) == NtStatus.STATUS_SUCCESS

    run_nimbus("user", "del", USER, "--db", str(db))
    time.sleep(RELOAD_WAIT)
    assert logon(server, USER, PASSWORD) == STATUS_LOGON_FAILURE
    assert "reloaded, 0 user(s)" in server.log_tail()

    add_user(db, "bob", "B0b-Secret!")
    time.sleep(RELOAD_WAIT)
    assert logon(server, "bob", "B0b-Secret!") == NtStatus.STATUS_SUCCESS

    add_user(db, "bob", "new-B0b-Secret!")  # a password change
    time.sleep(RELOAD_WAIT)
    assert logon(server, "bob", "B0b-Secret!") == STATUS_LOGON_FAILURE
    assert logon(server, "bob", "new-B0b-Secret!") == NtStatus.STATUS_SUCCESS

    # A file that became readable by others is not loaded: the error names
    # the file and the fix, and the users loaded before stay.
    os.chmod(db, 0o644)
    time.sleep(RELOAD_WAIT)
    assert logon(server, "bob", "new-B0b-Secret!") == NtStatus.STATUS_SUCCESS
    log = server.log_tail()
    assert f"chmod 600 {db}" in log and "not reloaded" in log, log


# --------------------------------------------------------------------------
# 10f. names the file format cannot hold


@pytest.mark.parametrize("name", ["#x", "#", "a:b", "line\nbreak", "tab\there"])
def test_user_add_refuses_names_the_file_cannot_hold(tmp_path, name):
    db = tmp_path / "users.db"
    add_user(db)
    proc = run_nimbus("user", "add", name, "--db", str(db), "--password-stdin", input="whatever\n", check=False)
    assert proc.returncode != 0
    assert "invalid user name" in proc.stderr, proc.stderr
    assert run_nimbus("user", "list", "--db", str(db)).stdout.split() == [USER]


# --------------------------------------------------------------------------
# 10a-b. NTLM: mechListMIC, target name, channel bindings (raw SPNEGO)

OID_NTLMSSP = bytes.fromhex("2b06010401823702020a")
OID_SPNEGO = bytes.fromhex("2b0601050502")


def der(tag: int, content: bytes) -> bytes:
    n = len(content)
    if n < 0x80:
        length = bytes([n])
    else:
        raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(raw)]) + raw
    return bytes([tag]) + length + content


def der_fields(buf: bytes) -> dict[int, bytes]:
    """The tag -> content of each TLV in `buf` (one level)."""
    out, i = {}, 0
    while i < len(buf):
        tag, n = buf[i], buf[i + 1]
        i += 2
        if n & 0x80:
            k = n & 0x7F
            n = int.from_bytes(buf[i : i + k], "big")
            i += k
        out[tag] = buf[i : i + n]
        i += n
    return out


MECH_TYPES = der(0x30, der(0x06, OID_NTLMSSP))


def neg_token_init(mech_token: bytes) -> bytes:
    """RFC 4178 4.2.1 NegTokenInit in the GSS-API framing (RFC 2743 3.1)."""
    init = der(0x30, der(0xA0, MECH_TYPES) + der(0xA2, der(0x04, mech_token)))
    return der(0x60, der(0x06, OID_SPNEGO) + der(0xA0, init))


def neg_token_resp(response_token: bytes, mech_list_mic: bytes | None) -> bytes:
    """RFC 4178 4.2.2 NegTokenResp as clients send it (no negState)."""
    fields = der(0xA2, der(0x04, response_token))
    if mech_list_mic is not None:
        fields += der(0xA3, der(0x04, mech_list_mic))
    return der(0xA1, der(0x30, fields))


def response_token(neg_token_resp_bytes: bytes) -> bytes:
    resp = der_fields(neg_token_resp_bytes)[0xA1]
    fields = der_fields(der_fields(resp)[0x30])
    return der_fields(fields[0xA2])[0x04]


def session_setup(s, message_id: int, session_id: int, token: bytes) -> tuple[int, int, bytes]:
    """One SESSION_SETUP; returns (status, session id, security buffer)."""
    s.sendall(rawsmb.frame(rawsmb.header(rawsmb.SESSION_SETUP, message_id, session_id=session_id, credit_request=8) + rawsmb.session_setup_body(token)))
    resp = rawsmb.recv_message(s)
    # MS-SMB2 2.2.6: SecurityBufferOffset and Length after StructureSize, SessionFlags.
    offset, length = struct.unpack_from("<HH", resp, rawsmb.HEADER_SIZE + 4)
    return rawsmb.status(resp), rawsmb.session_id(resp), resp[offset : offset + length]


def ntlm_logon(srv, *, service="cifs", hostname="127.0.0.1", channel_bindings=None, mech_list_mic=True, user=USER, password=PASSWORD) -> int:
    """An NTLM logon through SPNEGO by pyspnego's NTLM client (which puts a
    MIC in its AUTHENTICATE, MsvAvTargetName = service/hostname and, when
    given, MsvAvChannelBindings); the SPNEGO tokens are built here. Returns
    the final status."""
    ctx = spnego.client(user, password, hostname=hostname, service=service, protocol="ntlm", channel_bindings=channel_bindings)
    with contextlib.closing(rawsmb.connect(srv.host, srv.port)) as s:
        rawsmb.negotiate(s)
        status, sid, buf = session_setup(s, 1, 0, neg_token_init(ctx.step()))
        assert status == STATUS_MORE_PROCESSING_REQUIRED, hex(status)
        authenticate = ctx.step(response_token(buf))
        assert ctx.complete
        # The client's mechListMIC: an NTLM signature over the MechTypeList
        # it sent (RFC 4178 5, MS-SPNG 3.3.5.1).
        mic = ctx.sign(MECH_TYPES) if mech_list_mic else None
        status, _, _ = session_setup(s, 2, sid, neg_token_resp(authenticate, mic))
        return status


def test_ntlm_mic_without_spnego_mech_list_mic_is_refused(server):
    assert ntlm_logon(server) == rawsmb.STATUS_SUCCESS  # the harness itself is right
    assert ntlm_logon(server, mech_list_mic=False) == STATUS_LOGON_FAILURE
    assert "missing SPNEGO mechListMIC although the NTLM AUTHENTICATE has a MIC" in server.log_tail()


@pytest.mark.parametrize("service,hostname", [("cifs", "127.0.0.1"), ("CIFS", "localhost"), ("host", "127.0.0.1")])
def test_target_name_of_this_server_is_accepted(server, service, hostname):
    assert ntlm_logon(server, service=service, hostname=hostname) == rawsmb.STATUS_SUCCESS


@pytest.mark.parametrize("service,hostname", [("HTTP", "evil.example"), ("cifs", "evil.example"), ("ldap", "127.0.0.1"), ("cifs", "10.1.2.3")])
def test_foreign_target_name_is_refused(server, service, hostname):
    assert ntlm_logon(server, service=service, hostname=hostname) == STATUS_LOGON_FAILURE
    log = server.log_tail()
    assert "MsvAvTargetName" in log and f"{service}/{hostname}" in log, log


def test_channel_bindings_of_a_tls_channel_are_refused(server):
    cert_hash = hashlib.sha256(b"some other server's certificate").digest()
    cbt = GssChannelBindings(application_data=b"tls-server-end-point:" + cert_hash)
    assert ntlm_logon(server, channel_bindings=cbt) == STATUS_LOGON_FAILURE
    assert "MsvAvChannelBindings" in server.log_tail()
    # Empty bindings mean no channel.
    assert ntlm_logon(server, channel_bindings=GssChannelBindings()) == rawsmb.STATUS_SUCCESS
