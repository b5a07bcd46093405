"""Kerberos logons (issue 16, first step): a real MIT KDC (krb5-kdc) in a
temp dir on loopback, a keytab for cifs/localhost, and Debian's smbclient
with --use-kerberos=required against `nimbus serve` with `[kerberos]`:
signed and encrypted SMB 3.1.1 sessions; an unknown principal, a ticket
for a key the server does not have, a principal of another service and an
NTLM logon with `ntlm = false` are each refused with a log line that says
why; `nimbus serve` refuses a keytab others can read. The FIPS build
(`--features fips`, NIMBUS_FIPS_BIN, built by scripts/test.sh) with
`fips = true` serves an encrypted Kerberos session with an AES-256 session
key and refuses NTLM and a CCM-only client, each with its reason in the
log. Python's smbprotocol logs on with Kerberos too (a bare krb5 token, no
SPNEGO around it), signed and encrypted.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import PASSWORD, USER, add_user, built_binary, free_port, in_ci, nimbus_binary, run_nimbus, toml_str, wait_for_port
from kdc import HOST, REALM, Kdc, have_kdc

TIMEOUT = 60
# The server looks at the user database file at most once a second.
RELOAD_WAIT = 1.3

pytestmark = [
    pytest.mark.nimbus_only,
    pytest.mark.requires_tool("smbclient", "smbclient"),
    pytest.mark.requires_tool("krb5kdc", "krb5-kdc"),
    pytest.mark.requires_tool("kadmin.local", "krb5-admin-server"),
    pytest.mark.requires_tool("kinit", "krb5-user"),
]


@pytest.fixture(scope="module")
def kdc(tmp_path_factory):
    if not have_kdc() and not in_ci():
        pytest.skip("MIT KDC not installed (apt-get install krb5-kdc krb5-admin-server krb5-user)")
    k = Kdc(tmp_path_factory.mktemp("kdc"))
    yield k
    k.stop()


class KrbServer:
    """`nimbus serve` with [kerberos] on 127.0.0.1 (clients name it localhost)."""

    def __init__(self, base: Path, kdc: Kdc, keytab: Path, *, ntlm: bool = True, extra: str = "", encryption: str | None = None, fips_binary: Path | None = None):
        self.base = base
        self.port = free_port()
        self.share = base / "share"
        self.share.mkdir(parents=True, exist_ok=True)
        self.user_db = base / "users.db"
        add_user(self.user_db)  # USER, the principal the tests log on as
        conf = base / "nimbus.toml"
        lines = [
            f"listen = [{toml_str(f'127.0.0.1:{self.port}')}]",
            f"user_db = {toml_str(str(self.user_db))}",
            "[security]",
            'signing = "required"',
        ]
        if encryption:
            lines.append(f"encryption = {toml_str(encryption)}")
        if fips_binary is not None:
            lines.append("fips = true")
        lines += [
            "[[share]]",
            'name = "data"',
            f"path = {toml_str(str(self.share))}",
            "[kerberos]",
            f"keytab = {toml_str(str(keytab))}",
        ]
        if fips_binary is None:  # with fips = true NTLM is off, and ntlm = true an error
            lines.append(f"ntlm = {'true' if ntlm else 'false'}")
        lines.append(extra)
        conf.write_text("\n".join(lines) + "\n")
        self.log_path = base / "nimbus.log"
        self.proc = subprocess.Popen(
            [str(fips_binary or nimbus_binary()), "serve", "--config", str(conf)],
            stdout=open(self.log_path, "wb"),
            stderr=subprocess.STDOUT,
            env=kdc.env,
        )
        wait_for_port("127.0.0.1", self.port, self.proc)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def start(kdc, tmp_path):
    servers = []

    def go(keytab: Path, **kw) -> KrbServer:
        s = KrbServer(tmp_path / f"server{len(servers)}", kdc, keytab, **kw)
        servers.append(s)
        return s

    yield go
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def keytab(kdc):
    return kdc.service_keytab(kdc.dir / "cifs.keytab")


@pytest.fixture(scope="module")
def tickets(kdc, tmp_path_factory):
    """The environment of a client logged on as USER@REALM."""
    ccache = tmp_path_factory.mktemp("ccache") / "user"
    return kdc.kinit(USER, kdc.user(USER), ccache)


def smbclient_args(server: KrbServer, env: dict, conf: Path, *, protection: str = "sign", kerberos: str = "required") -> list[str]:
    # smbclient takes the service principal from the UNC's host name
    # (cifs/files.nimbus.test, never for "localhost" or an address); -I
    # gives the address it connects to.
    return [
        "smbclient", f"//{HOST}/data", "-I", "127.0.0.1", "-p", str(server.port),
        f"--use-kerberos={kerberos}", f"--use-krb5-ccache={env['KRB5CCNAME']}", "-m", "SMB3_11",
        f"--client-protection={protection}", "-s", str(conf),
    ]  # fmt: skip


def smbclient(server: KrbServer, env: dict, conf: Path, cwd: Path, commands: str, *, protection: str = "sign", kerberos: str = "required", extra: tuple = ()) -> tuple[int, str]:
    cmd = [*smbclient_args(server, env, conf, protection=protection, kerberos=kerberos), *extra, "-c", commands]
    p = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("protection", ["sign", "encrypt"])
def test_smbclient_logs_on_with_a_kerberos_ticket_and_moves_data(start, keytab, tickets, samba_client_conf, tmp_path, protection):
    server = start(keytab)
    data = os.urandom(3 * 1024 * 1024 + 17)
    (tmp_path / "up.bin").write_bytes(data)
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "put up.bin k.bin; get k.bin down.bin", protection=protection)
    assert rc == 0, out + server.log()[-3000:]
    assert hashlib.sha256((tmp_path / "down.bin").read_bytes()).digest() == hashlib.sha256(data).digest()
    assert (server.share / "k.bin").read_bytes() == data
    log = server.log()
    # The session is the mapped user's, and signed or encrypted with keys
    # from the ticket's session key.
    assert f"user {REALM}\\{USER} from" in log, log[-3000:]
    if protection == "encrypt":
        assert "encryption Aes" in log


def test_an_encryption_only_server_serves_kerberos_with_aes_256(start, keytab, tickets, samba_client_conf, tmp_path):
    # AES-256 ciphers derive their keys from the whole 32-byte session key
    # of an aes256-cts ticket (MS-SMB2 3.3.5.5.3), not its first 16 bytes:
    # a wrong key would fail the first encrypted response.
    server = start(keytab, encryption="required", extra="")
    (tmp_path / "f.txt").write_text("hello\n")
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "put f.txt; ls", protection="encrypt", extra=("--option=client smb encrypt=required", "--option=client smb3 encryption algorithms=AES-256-GCM"))
    assert rc == 0, out + server.log()[-3000:]
    assert "f.txt" in out
    assert "Aes256Gcm" in server.log()


def test_a_principal_without_a_user_is_refused(kdc, start, keytab, samba_client_conf, tmp_path):
    server = start(keytab)
    env = kdc.kinit("stranger", kdc.user("stranger"), tmp_path / "cc")
    rc, out = smbclient(server, env, samba_client_conf, tmp_path, "ls")
    assert rc != 0 and "NT_STATUS_LOGON_FAILURE" in out, out
    assert 'Kerberos logon of "stranger@NIMBUS.TEST" refused: user "stranger" is not in the user database' in server.log()


def test_a_principal_mapped_by_user_map_logs_on_as_that_user(kdc, start, keytab, tickets, samba_client_conf, tmp_path):
    server = start(keytab, extra=f"map_by_name = false\n[kerberos.user_map]\n{toml_str('ops/admin@' + REALM)} = {toml_str(USER)}")
    env = kdc.kinit("ops/admin", kdc.user("ops/admin"), tmp_path / "cc")
    rc, out = smbclient(server, env, samba_client_conf, tmp_path, "ls")
    assert rc == 0, out + server.log()[-2000:]
    assert f"user {REALM}\\{USER} from" in server.log()
    # With map_by_name = false, a principal the map does not name is
    # refused even though a user of its name exists.
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "ls")
    assert rc != 0, out
    assert f'Kerberos logon of "{USER}@{REALM}" refused: no user is mapped' in server.log()


def test_a_ticket_for_a_key_the_server_does_not_have_is_refused(kdc, start, tickets, samba_client_conf, tmp_path):
    # The server's keytab holds an older key of cifs/localhost: the KDC
    # issues tickets for the new one, which the server cannot decrypt.
    stale = tmp_path / "stale.keytab"
    kdc.kadmin(f"ktadd -k {stale} cifs/{HOST}")
    stale.chmod(0o600)
    kdc.kadmin(f"ktadd -k {kdc.dir / 'cifs.keytab'} cifs/{HOST}")  # new kvno, in the shared keytab
    server = start(stale)
    env = dict(tickets)
    rc, out = smbclient(server, env, samba_client_conf, tmp_path, "ls")
    assert rc != 0, out
    assert "Kerberos logon refused: gss_accept_sec_context:" in server.log(), server.log()[-2000:]


def test_ntlm_is_refused_when_turned_off_and_kerberos_still_works(start, keytab, tickets, samba_client_conf, tmp_path):
    server = start(keytab, ntlm=False)
    cmd = ["smbclient", f"//{HOST}/data", "-I", "127.0.0.1", "-p", str(server.port), "-U", f"{USER}%{PASSWORD}", "--use-kerberos=off", "-m", "SMB3_11", "-s", str(samba_client_conf), "-c", "ls"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "NTLM is turned off ([kerberos] ntlm = false)" in server.log()
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "ls")
    assert rc == 0, out + server.log()[-2000:]


def test_a_keytab_others_can_read_is_refused_at_start(kdc, keytab, tmp_path):
    loose = tmp_path / "loose.keytab"
    loose.write_bytes(keytab.read_bytes())
    loose.chmod(0o644)
    conf = tmp_path / "n.toml"
    db = tmp_path / "users.db"
    add_user(db)
    conf.write_text(
        f"listen = [{toml_str('127.0.0.1:' + str(free_port()))}]\nuser_db = {toml_str(str(db))}\n"
        f"[[share]]\nname = \"data\"\npath = {toml_str(str(tmp_path))}\n"
        f"[kerberos]\nkeytab = {toml_str(str(loose))}\n"
    )
    p = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30, env=kdc.env)
    assert p.returncode != 0
    assert "kerberos.keytab" in p.stderr + p.stdout and "chmod 600" in p.stderr + p.stdout, p.stderr + p.stdout


def test_config_check_finds_a_keytab_without_the_principal(kdc, keytab, tmp_path):
    db = tmp_path / "users.db"
    add_user(db)
    conf = tmp_path / "n.toml"
    conf.write_text(
        f"listen = [{toml_str('127.0.0.1:' + str(free_port()))}]\nuser_db = {toml_str(str(db))}\n"
        f"[[share]]\nname = \"data\"\npath = {toml_str(str(tmp_path))}\n"
        f"[kerberos]\nkeytab = {toml_str(str(keytab))}\nprincipal = {toml_str('cifs/other.nimbus.test@' + REALM)}\n"
    )
    p = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30, env=kdc.env)
    assert p.returncode != 0, p.stdout
    assert "kerberos.keytab" in p.stderr and "ktadd" in p.stderr, p.stderr
    # The right principal passes.
    conf.write_text(conf.read_text().replace("cifs/other.nimbus.test", f"cifs/{HOST}"))
    p = subprocess.run([str(nimbus_binary()), "config", "check", str(conf)], capture_output=True, text=True, timeout=30, env=kdc.env)
    assert p.returncode == 0, p.stderr


def test_a_session_ends_with_its_ticket_and_only_letting_go_still_works(kdc, start, keytab, tickets, samba_client_conf, tmp_path):
    # MS-SMB2 3.3.5.2.9: past the ticket's end the session answers
    # NETWORK_SESSION_EXPIRED (the client must re-authenticate with a new
    # ticket). The wait is the ticket's own lifetime, not a race; `tickets`
    # made the principal and its keytab.
    server = start(keytab)
    env = kdc.kinit(USER, kdc.dir / f"{USER}.keytab", tmp_path / "short", "-l", "4s")
    # Interactive smbclient, its output line-buffered (stdbuf) so that the
    # test sees the first listing before it waits.
    cmd = ["stdbuf", "-oL", *smbclient_args(server, env, samba_client_conf)]
    p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(TIMEOUT / 2, p.kill)
    killer.start()
    try:
        p.stdin.write("ls\n")
        p.stdin.flush()
        first = ""
        while "blocks of size" not in first:
            line = p.stdout.readline()
            assert line, first + server.log()[-2000:]
            first += line
        # The ticket (4 s, plus the 2 s of clock skew MIT allows) ends;
        # the session's next request is refused.
        time.sleep(7)
        out, _ = p.communicate("ls\nquit\n", timeout=TIMEOUT)
    finally:
        killer.cancel()
    assert "NT_STATUS_NETWORK_SESSION_EXPIRED" in out, first + out + server.log()[-2000:]


def loopback_host_name() -> tuple[str, str]:
    """This machine's name and the loopback address it resolves to (Debian
    puts `127.0.1.1 <hostname>` in /etc/hosts). smbtorture, unlike
    smbclient, cannot be given an address besides the name, and refuses
    Kerberos for "localhost" and for addresses."""
    name = socket.gethostname()
    try:
        addr = socket.gethostbyname(name)
    except OSError as e:
        addr = f"unresolved ({e})"
    if not addr.startswith("127."):
        message = f"host name {name!r} resolves to {addr}, not a loopback address (Debian's /etc/hosts has 127.0.1.1 {name})"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return name, addr


@pytest.mark.requires_tool("smbtorture", "samba-testsuite")
def test_smbtorture_expiry_and_re_authentication_with_kerberos(kdc, tmp_path, samba_client_conf):
    # smbtorture's Kerberos-only session tests: it logs on with a 4 s ticket
    # (gensec_gssapi:requested_life_time), waits it out, expects
    # NETWORK_SESSION_EXPIRED for everything but LOGOFF, CLOSE, unlock,
    # ECHO and CANCEL, then re-authenticates (expire1*) or logs off.
    name, addr = loopback_host_name()
    kdc.krb5_conf.write_text(kdc.krb5_conf.read_text().replace("[domain_realm]\n", f"[domain_realm]\n  {name} = {REALM}\n"))
    keytab = kdc.service_keytab(tmp_path / "host.keytab", f"cifs/{name}")
    password = "T0rture-Kerberos!"
    kdc.kadmin(f"addprinc -pw {password} torturer")
    base = tmp_path / "server"
    base.mkdir()
    (base / "share").mkdir()
    db = base / "users.db"
    add_user(db, "torturer", password)
    port = free_port()
    conf = base / "nimbus.toml"
    conf.write_text(
        f"listen = [{toml_str(f'{addr}:{port}')}]\nuser_db = {toml_str(str(db))}\n"
        f"[[share]]\nname = \"data\"\npath = {toml_str(str(base / 'share'))}\n"
        f"[kerberos]\nkeytab = {toml_str(str(keytab))}\n"
    )
    log = base / "nimbus.log"
    proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=kdc.env)
    try:
        wait_for_port(addr, port, proc)
        tests = ["expire1s", "expire2e", "expire_disconnect", "reauth1"]
        cmd = [
            "smbtorture", f"//{name}/data", "-p", str(port), "-k", "yes", "-U", f"torturer@{REALM}%{password}",
            "-s", str(samba_client_conf), *[f"smb2.session.{t}" for t in tests],
        ]  # fmt: skip
        p = subprocess.run(cmd, env=kdc.env, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
        out = p.stdout + p.stderr
        for t in tests:
            assert f"success: {t}" in out, out[-4000:] + log.read_text(errors="replace")[-2000:]
        assert "ticket ends in" in log.read_text(errors="replace")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_user_removed_from_the_database_logs_on_with_a_ticket_no_more(kdc, start, keytab, tickets, samba_client_conf, tmp_path):
    # The Kerberos path reloads the user database as the NTLM path does.
    server = start(keytab)
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "ls")
    assert rc == 0, out + server.log()[-2000:]
    run_nimbus("user", "del", USER, "--db", str(server.user_db))
    time.sleep(RELOAD_WAIT)
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "ls")
    assert rc != 0, out
    assert f'user "{USER}" is not in the user database' in server.log()


def fips_binary() -> Path:
    """The `--features fips` build scripts/test.sh makes (NIMBUS_FIPS_BIN)."""
    return built_binary(
        "NIMBUS_FIPS_BIN",
        Path(__file__).resolve().parent.parent / "target" / "fips" / "release" / "nimbus",
        "CARGO_TARGET_DIR=target/fips cargo build --release -p nimbus --features fips",
    )


def test_a_fips_build_serves_kerberos_with_encryption_and_refuses_ntlm_and_ccm(start, keytab, tickets, samba_client_conf, tmp_path):
    server = start(keytab, encryption="required", fips_binary=fips_binary())
    log = server.log()
    assert "FIPS mode" in log and "Kerberos logons only" in log, log
    # CCM has no FIPS-approved implementation in the provider: not offered,
    # and the start-up log says so.
    assert "AES-128-CCM" in log and "no approved implementation" in log, log

    data = os.urandom(2 * 1024 * 1024 + 5)
    (tmp_path / "up.bin").write_bytes(data)
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "put up.bin f.bin; get f.bin down.bin", protection="encrypt")
    assert rc == 0, out + server.log()[-3000:]
    assert (tmp_path / "down.bin").read_bytes() == data
    session = [line for line in server.log().splitlines() if f"user {REALM}\\{USER} from" in line]
    assert session and "encryption Aes" in session[-1] and "Ccm" not in session[-1], server.log()[-3000:]
    assert "signing AesGmac" in session[-1] or "signing AesCmac" in session[-1], session[-1]
    # The session key's type, as the library names it, is one FIPS mode
    # takes (any other is refused: nimbus-auth's unit tests). A client
    # that offers AES-256 gets an AES-256 GSS-API subkey (RFC 4537) even
    # with a weaker ticket, so smbclient cannot present another here.
    assert session[-1].rstrip().endswith("key aes256-cts-hmac-sha1-96)"), session[-1]

    # A client that encrypts with CCM only finds no cipher in common on a
    # server that requires encryption.
    rc, out = smbclient(server, tickets, samba_client_conf, tmp_path, "ls", protection="encrypt", extra=("--option=client smb3 encryption algorithms=AES-128-CCM",))
    assert rc != 0, out

    # NTLM is refused, with the reason in the log.
    cmd = ["smbclient", f"//{HOST}/data", "-I", "127.0.0.1", "-p", str(server.port), "-U", f"{USER}%{PASSWORD}", "--use-kerberos=off", "-m", "SMB3_11", "-s", str(samba_client_conf), "-c", "ls"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "FIPS mode ([security] fips = true) turns NTLM off" in server.log(), server.log()[-3000:]


@pytest.mark.parametrize("encrypt", [False, True], ids=["signed", "encrypted"])
def test_smbprotocol_logs_on_with_kerberos(start, keytab, tickets, tmp_path, monkeypatch, encrypt):
    # Python's smbprotocol through pyspnego and python-gssapi (MIT krb5 in
    # this process): the client's ticket cache and the realm's krb5.conf.
    import uuid

    import gssapi  # noqa: F401 (tests/requirements.txt; pyspnego needs it for Kerberos)

    from smbprotocol.connection import Connection, Dialects
    from smbprotocol.open import CreateDisposition, CreateOptions, FileAttributes, ImpersonationLevel, Open, ShareAccess
    from smbprotocol.session import Session
    from smbprotocol.tree import TreeConnect

    monkeypatch.setenv("KRB5_CONFIG", tickets["KRB5_CONFIG"])
    monkeypatch.setenv("KRB5CCNAME", tickets["KRB5CCNAME"])
    server = start(keytab, encryption="required" if encrypt else None)
    conn = Connection(uuid.uuid4(), "127.0.0.1", server.port, require_signing=True)
    conn.connect(Dialects.SMB_3_1_1, timeout=TIMEOUT)
    try:
        session = Session(conn, auth_protocol="kerberos", require_encryption=encrypt, hostname_override=HOST)
        session.connect()
        tree = TreeConnect(session, rf"\\{HOST}\data")
        tree.connect()
        f = Open(tree, "krb.bin")
        f.create(ImpersonationLevel.Impersonation, 0x12019F, FileAttributes.FILE_ATTRIBUTE_NORMAL, ShareAccess.FILE_SHARE_READ, CreateDisposition.FILE_OVERWRITE_IF, CreateOptions.FILE_NON_DIRECTORY_FILE)
        data = os.urandom(300_000)
        f.write(data, 0)
        assert f.read(0, len(data)) == data
        f.close()
    finally:
        conn.disconnect(close=True, timeout=TIMEOUT)
    assert (server.share / "krb.bin").read_bytes() == data
    session_line = [line for line in server.log().splitlines() if f"session logon: user {REALM}\\{USER} from" in line]
    assert session_line and "key aes256-cts-hmac-sha1-96" in session_line[-1], server.log()[-3000:]
    assert ("required" in session_line[-1]) == encrypt, session_line[-1]
