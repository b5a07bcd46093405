"""Share browsing over IPC$ (issue 17, item 1): the srvsvc and wkssvc
named pipes, DCE/RPC on them, driven by the clients people browse with.

- `smbclient -L` lists every share with its type and comment, at SMB
  2.0.2 and 3.1.1, signed or encrypted, and a list too long for one RPC
  fragment (so smbclient reads the rest of the answer with READs after
  STATUS_BUFFER_OVERFLOW).
- `rpcclient` (Debian's smbclient package): srvinfo (NetrServerGetInfo 101),
  netshareenumall (NetrShareEnum, levels 1, 2 and 502), netshareenum
  (NetrShareEnumSticky: no IPC$), netsharegetinfo (a share, an unknown
  one), wkssvc_wkstagetinfo.
- Guests list shares only where the server serves guests.
- For an administrator (`[security] admins`, by name or by a group of the
  user database), rpcclient netsessenum (levels 0, 1, 2, 10, 502, all and
  by client and user), netconnenum (by share, by client), netfileenum
  (levels 2 and 3) list the sessions, tree connects and open files, as
  Samba's NDR decodes them (`-d 10`); an ordinary user gets ACCESS_DENIED
  for all three; netremotetod is the server's clock for anyone;
  NetrShareCheck (raw RPC) answers NERR_DeviceNotShared.
- A client that breaks the RPC protocol loses that pipe (later writes:
  PIPE_DISCONNECTED) and nothing else; unknown pipe names are not found.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import struct
import subprocess
import time
import uuid

import pytest
from conftest import PASSWORD, USER, Security, require_tool, run_nimbus
from smbprotocol.connection import Connection
from smbprotocol.exceptions import SMBResponseException
from smbprotocol.open import CreateDisposition, FilePipePrinterAccessMask, ImpersonationLevel, Open, ShareAccess
from smbprotocol.session import Session
from smbprotocol.tree import TreeConnect

pytestmark = pytest.mark.nimbus_only

TIMEOUT = 60
STATUS_OBJECT_NAME_NOT_FOUND = 0xC0000034
STATUS_PIPE_DISCONNECTED = 0xC00000B0
STATUS_PIPE_EMPTY = 0xC00000D9

COMMENTS = {"data": "Team data", "ro": "Read-only archive"}
SERVER_COMMENT = "Nimbus under test"


@pytest.fixture
def browsing_server(server_factory):
    """Shares data (commented), hidden$ (no comment) and ro (read-only)."""
    return server_factory.start(
        [("data", False), ("hidden$", False), ("ro", True)],
        security=Security(share_comments=COMMENTS, server_comment=SERVER_COMMENT),
    )


def smbclient_list(server, conf, *extra: str, auth: tuple[str, ...] | None = None) -> tuple[int, str]:
    auth = auth if auth is not None else ("-U", f"{server.user}%{server.password}")
    cmd = ["smbclient", "-L", f"//{server.host}", "-p", str(server.port), *auth, "-s", str(conf), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


def listed_shares(output: str) -> dict[str, tuple[str, str]]:
    """smbclient -L's table: name -> (type, comment)."""
    shares = {}
    for line in output.splitlines():
        m = re.match(r"^\t(\S+)\s+(Disk|IPC|Printer)\s*(.*)$", line)
        if m and m[1] != "Sharename":
            shares[m[1]] = (m[2], m[3].strip())
    return shares


EXPECTED = {
    "data": ("Disk", "Team data"),
    "hidden$": ("Disk", ""),
    "ro": ("Disk", "Read-only archive"),
    "IPC$": ("IPC", "Remote IPC"),
}


@require_tool("smbclient", "smbclient")
@pytest.mark.parametrize(
    "options",
    [
        pytest.param(("-m", "SMB2_02"), id="smb2.0.2-signed"),
        pytest.param(("-m", "SMB3_11"), id="smb3.1.1-signed"),
        pytest.param(("-m", "SMB3_11", "--client-protection=encrypt"), id="smb3.1.1-encrypted"),
    ],
)
def test_smbclient_lists_every_share_with_type_and_comment(browsing_server, samba_client_conf, options):
    rc, out = smbclient_list(browsing_server, samba_client_conf, *options)
    assert listed_shares(out) == EXPECTED, out
    # The workgroup list needs SMB1, which Nimbus does not speak: smbclient
    # says so and still succeeds.
    assert rc == 0, out


@require_tool("smbclient", "smbclient")
def test_a_list_longer_than_one_fragment(server_factory, samba_client_conf):
    names = [f"share-with-a-long-name-{i:03}" for i in range(120)]
    srv = server_factory.start(
        [(n, False) for n in names],
        security=Security(share_comments={n: f"comment of {n}, long enough to need several fragments" for n in names}),
    )
    rc, out = smbclient_list(srv, samba_client_conf)
    shares = listed_shares(out)
    assert rc == 0, out[-2000:]
    assert len(shares) == len(names) + 1
    assert all(shares[n] == ("Disk", f"comment of {n}, long enough to need several fragments") for n in names)


def rpcclient(server, conf, command: str, *, fails: bool = False, auth: tuple[str, str] | None = None, ndr: bool = False, binding: str | None = None) -> str:
    """rpcclient's output for `command`, as `auth` (user, password; the
    server's user by default); it exits 1 when the call fails. `ndr`: with
    the call's answer as Samba's NDR decodes it (debug level 10).
    `binding`: in place of the server's address, e.g. ncacn_np:HOST[sign]."""
    user, password = auth or (server.user, server.password)
    debug = ["-d", "10"] if ndr else []
    cmd = ["rpcclient", "-p", str(server.port), "-U", f"{user}%{password}", "-s", str(conf), *debug, binding or server.host, "-c", command]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == (1 if fails else 0), f"rpcclient -c {command!r}: exit {proc.returncode}\n{out}"
    return out


def netnames(out: str) -> list[str]:
    return re.findall(r"^netname: (\S+)$", out, re.M)


@require_tool("rpcclient", "smbclient")
def test_rpcclient_server_and_share_information(browsing_server, samba_client_conf):
    srv, conf = browsing_server, samba_client_conf
    out = rpcclient(srv, conf, "srvinfo")
    assert "NIMBUS" in out and SERVER_COMMENT in out, out
    assert re.search(r"platform_id\s*:\s*500", out) and re.search(r"os version\s*:\s*10\.0", out), out

    for level in ("", " 1", " 2", " 502"):
        out = rpcclient(srv, conf, f"netshareenumall{level}")
        assert netnames(out) == ["data", "hidden$", "ro", "IPC$"], out
        assert re.findall(r"remark:\t(.*)$", out, re.M) == ["Team data", "", "Read-only archive", "Remote IPC"], out
        # The server's local paths are not shown to clients.
        assert "path:\t/" not in out and str(srv.share_path) not in out, out

    # NetrShareEnumSticky: the configured shares, not IPC$.
    assert netnames(rpcclient(srv, conf, "netshareenum")) == ["data", "hidden$", "ro"]

    out = rpcclient(srv, conf, "netsharegetinfo ro")
    assert netnames(out) == ["ro"] and "Read-only archive" in out, out
    assert "WERR_NERR_NETNAMENOTFOUND" in rpcclient(srv, conf, "netsharegetinfo nosuchshare", fails=True)
    assert "WERR_INVALID_LEVEL" in rpcclient(srv, conf, "netshareenumall 7", fails=True)
    out = rpcclient(srv, conf, "wkssvc_wkstagetinfo")
    assert "WERR" not in out and "NT_STATUS" not in out, out


@require_tool("rpcclient", "smbclient")
@pytest.mark.parametrize("level", ["sign", "seal"])
def test_rpcclient_asks_for_rpcs_own_signing_or_sealing_on_a_pipe(browsing_server, samba_client_conf, level):
    """RPC's own logon on an IPC$ pipe (NTLM in SPNEGO, as rpcclient does
    with [sign] or [seal]), over srvsvc and lsarpc: every request's
    verifier is checked, and the client checks every answer's."""
    srv, conf = browsing_server, samba_client_conf
    binding = f"ncacn_np:{srv.host}[{level}]"
    out = rpcclient(srv, conf, "srvinfo", binding=binding)
    assert "NIMBUS" in out and SERVER_COMMENT in out, out
    # Several fragments each way: the answer is long.
    out = rpcclient(srv, conf, "netshareenumall 502", binding=binding)
    assert netnames(out) == ["data", "hidden$", "ro", "IPC$"], out
    out = rpcclient(srv, conf, "lookupnames Everyone", binding=binding)
    assert "S-1-1-0" in out, out
    if srv.kind == "nimbus":
        wanted = {"sign": 5, "seal": 6}[level]
        assert f"logged on (authentication level {wanted})" in srv.log_path.read_text(errors="replace")
    # A wrong password: the logon fails, and so does the call.
    out = rpcclient(srv, conf, "srvinfo", binding=binding, auth=(srv.user, "wrong"), fails=True)
    assert "NIMBUS" not in out, out


@require_tool("smbclient", "smbclient")
def test_rpcclient_names_sids_and_finds_sids_for_names(browsing_server, samba_client_conf):
    """lsarpc: the SIDs nimbus puts in security descriptors (S-1-22-1-UID,
    S-1-22-2-GID, Everyone) get names, and names get SIDs."""
    srv, conf = browsing_server, samba_client_conf
    uid, gid = os.getuid(), os.getgid()
    user, group = pwd.getpwuid(uid).pw_name, grp.getgrgid(gid).gr_name
    unused = next(u for u in range(3_999_999_999, 4_000_000_100) if not has_uid(u))
    out = rpcclient(srv, conf, f"lookupsids S-1-22-1-{uid} S-1-22-2-{gid} S-1-1-0 S-1-5-18 S-1-22-1-{unused}")
    assert f"S-1-22-1-{uid} Unix User\\{user} (1)" in out, out
    assert f"S-1-22-2-{gid} Unix Group\\{group} (4)" in out, out
    assert "S-1-1-0 \\Everyone (5)" in out, out
    assert "S-1-5-18 NT AUTHORITY\\SYSTEM (5)" in out, out
    assert f"S-1-22-1-{unused} *unknown*\\*unknown* (8)" in out, out
    out = rpcclient(srv, conf, f"lookupnames {user} Everyone")
    assert f"{user} S-1-22-1-{uid} (User: 1)" in out, out
    assert "Everyone S-1-1-0 (Well-known Group: 5)" in out, out
    # LookupSids3, without a policy handle.
    out = rpcclient(srv, conf, f"lookupsids3 S-1-22-1-{uid}")
    assert f"S-1-22-1-{uid} {user} (1)" in out, out
    # A server in a workgroup: its name, no domain SID.
    out = rpcclient(srv, conf, "lsaquery")
    assert "Domain Name: WORKGROUP" in out and "Domain Sid: (NULL SID)" in out, out


@require_tool("smbclient", "smbclient")
def test_rpcclient_names_the_servers_own_accounts(browsing_server, samba_client_conf):
    """The users of the user database are the server's accounts,
    S-1-5-21-<machine>-<RID> as `nimbus user list --sids` prints them, named
    SERVER\\user both ways, with the server's None group beside them."""
    srv, conf = browsing_server, samba_client_conf
    listed = run_nimbus("user", "list", "--db", str(srv.log_path.parent / "users.db"), "--sids").stdout
    sid = dict(line.split(" ", 1) for line in listed.splitlines())[USER]
    assert re.fullmatch(r"S-1-5-21-\d+-\d+-\d+-1000", sid), listed
    machine = sid.rsplit("-", 1)[0]
    out = rpcclient(srv, conf, f"lookupnames {USER}")
    assert f"{USER} {sid} (User: 1)" in out, out
    out = rpcclient(srv, conf, f"lookupsids {sid} {machine}-513 {machine}-4242")
    m = re.search(rf"{re.escape(sid)} (\S+)\\{USER} \(1\)", out)
    assert m, out
    server_name = m[1]
    assert f"{machine}-513 {server_name}\\None (2)" in out, out
    assert f"{machine}-4242 *unknown*\\*unknown* (8)" in out, out
    # rpcclient's command line takes a backslash as an escape: doubled.
    out = rpcclient(srv, conf, f"lookupnames {server_name}\\\\{USER}")
    assert sid in out, out
    # The server's groups are its local groups (aliases).
    db = str(srv.log_path.parent / "users.db")
    run_nimbus("group", "set", "editors", "--db", db, "--members", USER)
    group_sid = run_nimbus("group", "list", "--db", db).stdout.split()[1]
    assert group_sid == f"{machine}-1001", group_sid
    # The server reloads the database at a logon, at most once a second:
    # each rpcclient logs on anew.
    deadline = time.monotonic() + 10
    while "*unknown*" in (out := rpcclient(srv, conf, f"lookupsids {group_sid}")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert f"{group_sid} {server_name}\\editors (4)" in out, out
    out = rpcclient(srv, conf, "lookupnames editors")
    assert group_sid in out, out


def has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def test_guests_list_shares_only_where_guests_are_served(server_factory, samba_client_conf):
    srv = server_factory.start([("data", False), ("public", False)], security=Security(guest_shares={"public"}))
    rc, out = smbclient_list(srv, samba_client_conf, auth=("-U", "nobody-known%x"))
    assert set(listed_shares(out)) == {"data", "public", "IPC$"}, out
    assert rc == 0, out


# --------------------------------------------------------------------------
# raw RPC on a pipe, with smbprotocol


NDR = (uuid.UUID("8a885d04-1ceb-11c9-9fe8-08002b104860"), 2, 0)
SRVSVC = (uuid.UUID("4b324fc8-1670-01d3-1278-5a47bf6ee188"), 3, 0)


def syntax(s) -> bytes:
    return s[0].bytes_le + struct.pack("<HH", s[1], s[2])


def pdu(ptype: int, flags: int, call_id: int, body: bytes, version: int = 5) -> bytes:
    """A connection-oriented DCE/RPC PDU (C706 12.6.3.1)."""
    return struct.pack("<BBBB4sHHI", version, 0, ptype, flags, b"\x10\0\0\0", 16 + len(body), 0, call_id) + body


def bind_pdu() -> bytes:
    ctx = struct.pack("<HBB", 0, 1, 0) + syntax(SRVSVC) + syntax(NDR)
    return pdu(11, 3, 1, struct.pack("<HHIB3x", 4280, 4280, 0, 1) + ctx)


def server_info_request(call_id: int) -> bytes:
    """NetrServerGetInfo level 100 with a null server name."""
    stub = struct.pack("<II", 0, 100)
    return pdu(0, 3, call_id, struct.pack("<IHH", len(stub), 0, 21) + stub)


@pytest.fixture
def ipc(browsing_server):
    conn = Connection(uuid.uuid4(), browsing_server.host, browsing_server.port)
    conn.connect(timeout=TIMEOUT)
    session = Session(conn, USER, PASSWORD, require_encryption=False, auth_protocol="ntlm")
    session.connect()
    tree = TreeConnect(session, rf"\\{browsing_server.host}\IPC$")
    tree.connect()
    data = TreeConnect(session, rf"\\{browsing_server.host}\data")
    data.connect()
    yield tree, data
    conn.disconnect()


def open_pipe(tree, name: str = "srvsvc") -> Open:
    pipe = Open(tree, name)
    pipe.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.FILE_READ_DATA | FilePipePrinterAccessMask.FILE_WRITE_DATA,
        0,
        ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE,
        CreateDisposition.FILE_OPEN,
        0,
    )
    return pipe


def status_of(call) -> int:
    with pytest.raises(SMBResponseException) as e:
        call()
    return e.value.status


def test_rpc_over_write_and_read(ipc):
    tree, _ = ipc
    pipe = open_pipe(tree)
    assert status_of(lambda: pipe.read(0, 4280)) == STATUS_PIPE_EMPTY
    pipe.write(bind_pdu())
    ack = pipe.read(0, 4280)
    assert ack[2] == 12, ack.hex()  # BIND_ACK
    pipe.write(server_info_request(2))
    resp = pipe.read(0, 4280)
    assert resp[2] == 2, resp.hex()  # RESPONSE
    assert "NIMBUS".encode("utf-16-le") in resp
    assert resp[-4:] == b"\0\0\0\0"  # WERR_OK
    pipe.close()


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda: pdu(11, 3, 1, b"", version=4), id="not-version-5"),
        pytest.param(lambda: server_info_request(1), id="request-before-bind"),
        pytest.param(lambda: bind_pdu()[:8] + b"\x08\x00" + bind_pdu()[10:], id="fragment-shorter-than-its-header"),
        pytest.param(lambda: bind_pdu() + bind_pdu(), id="second-bind"),
    ],
)
def test_a_broken_rpc_stream_closes_only_its_pipe(ipc, bad):
    tree, data = ipc
    pipe = open_pipe(tree)
    assert status_of(lambda: pipe.write(bad())) == STATUS_PIPE_DISCONNECTED
    assert status_of(lambda: pipe.write(bind_pdu())) == STATUS_PIPE_DISCONNECTED
    # Another pipe of the session, and its files, are unaffected.
    again = open_pipe(tree)
    again.write(bind_pdu())
    assert again.read(0, 4280)[2] == 12
    f = Open(data, "still-here.txt")
    f.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.FILE_READ_DATA | FilePipePrinterAccessMask.FILE_WRITE_DATA,
        0,
        0,
        CreateDisposition.FILE_OVERWRITE_IF,
        0,
    )
    f.write(b"ok")
    assert f.read(0, 2) == b"ok"


@pytest.mark.parametrize("name", ["spoolss", "srvsvc\\..\\x", "", "lsarpc-not-a-pipe", "samr"])
def test_unknown_pipe_names_are_not_found(ipc, name):
    tree, _ = ipc
    assert status_of(lambda: open_pipe(tree, name)) == STATUS_OBJECT_NAME_NOT_FOUND


# --------------------------------------------------------------------------
# administration: sessions, tree connects, open files, the clock

BOB = ("bob", "B0b-Secret!")
CAROL = ("carol", "C4rol-Secret!")


@pytest.fixture
def admin_server(server_factory):
    """alice administers the server by name, members of group ops by the
    group; bob and carol (not yet in ops) are ordinary users."""
    return server_factory.start(
        [("data", False)],
        security=Security(admins=[USER, "ops"], extra_users=[BOB, CAROL]),
    )


@pytest.fixture
def bob_with_a_file_open(admin_server):
    """bob's session from 127.0.0.1, connected to data, with report.txt open
    for writing."""
    srv = admin_server
    conn = Connection(uuid.uuid4(), srv.host, srv.port)
    conn.connect(timeout=TIMEOUT)
    session = Session(conn, BOB[0], BOB[1], require_encryption=False, auth_protocol="ntlm")
    session.connect()
    tree = TreeConnect(session, rf"\\{srv.host}\data")
    tree.connect()
    f = Open(tree, "report.txt")
    f.create(
        ImpersonationLevel.Impersonation,
        FilePipePrinterAccessMask.FILE_READ_DATA | FilePipePrinterAccessMask.FILE_WRITE_DATA,
        0,
        ShareAccess.FILE_SHARE_READ,
        CreateDisposition.FILE_OVERWRITE_IF,
        0,
    )
    yield tree
    conn.disconnect()


def ndr_entries(out: str, struct_name: str) -> list[dict[str, str]]:
    """The entries of an enumeration as rpcclient -d 10 prints the answer:
    each `array: struct <struct_name>` block's fields, name -> value (a
    string without its quotes, a number in decimal)."""
    answer = out[out.index("out: struct") :]
    entries = []
    for block in answer.split(f"array: struct {struct_name}")[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines()[1:]:
            m = re.match(r"^\s+(\w+)\s+: (?:'(.*)'|0x[0-9a-f]+ \((\d+)\)|(-?\d+))$", line)
            if m:
                fields[m[1]] = next(v for v in m.groups()[1:] if v is not None)
            elif not re.match(r"^\s+\w+\s+: \*$", line):
                break
        entries.append(fields)
    return entries


def result_of(out: str) -> str:
    return re.findall(r"^\s+result\s+: (\S+)$", out, re.M)[-1]


@require_tool("rpcclient", "smbclient")
def test_an_administrator_lists_sessions(admin_server, bob_with_a_file_open, samba_client_conf):
    srv, conf = admin_server, samba_client_conf
    out = rpcclient(srv, conf, "netsessenum", ndr=True)
    sessions = {e["user"]: e for e in ndr_entries(out, "srvsvc_NetSessInfo1")}
    assert set(sessions) == {USER, "bob"}, out
    assert sessions["bob"]["client"] == "\\\\127.0.0.1", out
    assert sessions["bob"]["num_open"] == "1", out
    assert sessions["bob"]["user_flags"] == "0", out
    # Each level, for bob's sessions from 127.0.0.1 (the command line
    # takes a backslash as an escape: doubled).
    for level, name in [(0, "srvsvc_NetSessInfo0"), (2, "srvsvc_NetSessInfo2"), (10, "srvsvc_NetSessInfo10"), (502, "srvsvc_NetSessInfo502")]:
        out = rpcclient(srv, conf, f"netsessenum \\\\\\\\127.0.0.1 bob {level}", ndr=True)
        entries = ndr_entries(out, name)
        assert len(entries) == 1 and entries[0]["client"] == "\\\\127.0.0.1", out
        if level != 0:
            assert entries[0]["user"] == "bob", out
            assert int(entries[0]["time"]) < 600 and int(entries[0]["idle_time"]) < 600, out
        if level == 502:
            assert entries[0]["transport"] == "\\Device\\NetbiosSmb", out
    out = rpcclient(srv, conf, "netsessenum \\\\\\\\10.9.9.9", fails=True)
    assert "WERR_NERR_CLIENTNAMENOTFOUND" in out, out


@require_tool("rpcclient", "smbclient")
def test_an_administrator_lists_tree_connects_and_open_files(admin_server, bob_with_a_file_open, samba_client_conf):
    srv, conf = admin_server, samba_client_conf
    # Connections to a share name their client; from a client, their share.
    out = rpcclient(srv, conf, "netconnenum 1 data", ndr=True)
    conns = ndr_entries(out, "srvsvc_NetConnInfo1")
    assert [(c["user"], c["share"], c["num_open"], c["conn_type"]) for c in conns] == [("bob", "127.0.0.1", "1", "0")], out
    out = rpcclient(srv, conf, "netconnenum 1 \\\\\\\\127.0.0.1", ndr=True)
    conns = ndr_entries(out, "srvsvc_NetConnInfo1")
    assert sorted((c["user"], c["share"]) for c in conns) == [(USER, "IPC$"), ("bob", "data")], out
    out = rpcclient(srv, conf, "netconnenum 0 data", ndr=True)
    assert len(ndr_entries(out, "srvsvc_NetConnInfo0")) == 1, out
    assert "WERR_NERR_NETNAMENOTFOUND" in rpcclient(srv, conf, "netconnenum 1 nosuchshare", fails=True)

    out = rpcclient(srv, conf, "netfileenum", ndr=True)
    files = ndr_entries(out, "srvsvc_NetFileInfo3")
    assert len(files) == 1, out
    assert files[0]["user"] == "bob" and files[0]["path"].endswith("/report.txt"), out
    # PERM_FILE_READ | PERM_FILE_WRITE
    assert files[0]["permissions"] == "3" and files[0]["num_locks"] == "0", out
    out = rpcclient(srv, conf, "netfileenum 2", ndr=True)
    assert [f["fid"] for f in ndr_entries(out, "srvsvc_NetFileInfo2")] == [files[0]["fid"]], out


@require_tool("rpcclient", "smbclient")
def test_only_administrators_list_sessions_connections_and_files(admin_server, bob_with_a_file_open, samba_client_conf):
    srv, conf = admin_server, samba_client_conf
    for command in ["netsessenum", "netsessenum '' '' 10", "netconnenum 1 data", "netfileenum"]:
        out = rpcclient(srv, conf, command, auth=BOB, fails=True)
        assert "WERR_ACCESS_DENIED" in out, out
    # A member of a group named in admins administers from its next logon
    # (the server reloads the user database at a logon, at most once a
    # second: each rpcclient logs on anew).
    db = str(srv.log_path.parent / "users.db")
    assert "WERR_ACCESS_DENIED" in rpcclient(srv, conf, "netfileenum", auth=CAROL, fails=True)
    run_nimbus("group", "set", "ops", "--db", db, "--members", CAROL[0])
    deadline = time.monotonic() + 10
    while True:
        proc = subprocess.run(
            ["rpcclient", "-p", str(srv.port), "-U", "%".join(CAROL), "-s", str(conf), srv.host, "-c", "netfileenum"],
            capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL,
        )
        if proc.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@require_tool("rpcclient", "smbclient")
def test_anyone_reads_the_servers_clock(admin_server, samba_client_conf):
    before = time.time()
    out = rpcclient(admin_server, samba_client_conf, "netremotetod", auth=BOB, ndr=True)
    after = time.time()
    fields = dict(re.findall(r"^\s+(elapsed|hours|mins|day|month|year|tinterval)\s+: 0x[0-9a-f]+ \((\d+)\)$", out, re.M))
    assert result_of(out) == "WERR_OK", out
    assert int(before) - 1 <= int(fields["elapsed"]) <= after + 1, out
    t = time.gmtime(int(fields["elapsed"]))
    assert (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min) == tuple(int(fields[k]) for k in ["year", "month", "day", "hours", "mins"]), out


def share_check_request(call_id: int, device: str) -> bytes:
    """NetrShareCheck (opnum 20) of `device`, with a null server name."""
    units = (device + "\0").encode("utf-16-le")
    n = len(units) // 2
    stub = struct.pack("<IIII", 0, n, 0, n) + units + b"\0" * (-len(units) % 4)
    return pdu(0, 3, call_id, struct.pack("<IHH", len(stub), 0, 20) + stub)


def test_share_check_finds_no_shared_device(ipc):
    tree, _ = ipc
    pipe = open_pipe(tree)
    pipe.write(bind_pdu())
    assert pipe.read(0, 4280)[2] == 12
    for call_id, device in [(2, "C:"), (3, "LPT1:")]:
        pipe.write(share_check_request(call_id, device))
        resp = pipe.read(0, 4280)
        assert resp[2] == 2, resp.hex()  # RESPONSE, not a FAULT
        # Type (0: set only on success), then NERR_DeviceNotShared.
        assert resp[24:] == struct.pack("<II", 0, 2311), resp.hex()
    pipe.close()


@pytest.mark.parametrize("level", ["sign", "seal"])
def test_a_signed_pipe_request_changed_on_its_way_closes_the_pipe(browsing_server, level):
    """impacket's NTLM logon on the srvsvc pipe at integrity or privacy: a
    call is answered; then one byte of a request's stub is changed after
    impacket signed it, and the server refuses it and closes the pipe
    (the SMB session goes on)."""
    from impacket.dcerpc.v5 import srvs, transport
    from impacket.dcerpc.v5.rpcrt import RPC_C_AUTHN_LEVEL_PKT_INTEGRITY, RPC_C_AUTHN_LEVEL_PKT_PRIVACY

    srv = browsing_server
    t = transport.SMBTransport(srv.host, dstport=srv.port, filename=r"\srvsvc", username=srv.user, password=srv.password)
    d = t.get_dce_rpc()
    d.set_auth_level({"sign": RPC_C_AUTHN_LEVEL_PKT_INTEGRITY, "seal": RPC_C_AUTHN_LEVEL_PKT_PRIVACY}[level])
    d.connect()
    d.bind(srvs.MSRPC_UUID_SRVS)
    info = srvs.hNetrServerGetInfo(d, 101)
    assert info["InfoStruct"]["ServerInfo101"]["sv101_comment"].rstrip("\x00") == SERVER_COMMENT
    if srv.kind != "nimbus":
        return
    send = d._transport.send

    def tampered(data: bytes, *args, **kwargs):
        b = bytearray(data)
        b[24 + 4] ^= 0x01  # a byte of the stub (the level)
        return send(bytes(b), *args, **kwargs)

    d._transport.send = tampered
    with pytest.raises(Exception):
        srvs.hNetrServerGetInfo(d, 101)
    assert "RPC pipe closed: a request whose signature does not verify" in srv.log_path.read_text(errors="replace")


def test_wrong_passwords_in_rpcs_own_logon_count_toward_the_back_off(server_factory):
    """Three wrong passwords in RPC's own logon on the srvsvc pipe, over one
    SMB session, back the user off as three wrong SESSION_SETUPs would
    (limits.max_failed_logons_per_user): the right password is then
    refused there too, and so is a new SMB logon (STATUS_ACCOUNT_LOCKED_OUT).
    The back-off lasts 30 s, far longer than the test."""
    from impacket.dcerpc.v5 import srvs, transport
    from impacket.dcerpc.v5.rpcrt import RPC_C_AUTHN_LEVEL_PKT_INTEGRITY, DCERPCException
    from impacket.smbconnection import SessionError, SMBConnection

    limits = {"max_failed_logons_per_user": 3, "max_failed_logons_per_address": 100, "logon_backoff_secs": 30, "max_logon_backoff_secs": 30}
    srv = server_factory.start([("data", False)], security=Security(server_comment=SERVER_COMMENT, limits=limits))
    if srv.kind != "nimbus":
        pytest.skip("Nimbus's back-off")
    smb = SMBConnection(srv.host, srv.host, sess_port=srv.port)
    smb.login(srv.user, srv.password)

    def rpc_logon(password: str) -> bool:
        t = transport.SMBTransport(srv.host, dstport=srv.port, filename=r"\srvsvc", smb_connection=smb)
        d = t.get_dce_rpc()
        d.set_credentials(srv.user, password)
        d.set_auth_level(RPC_C_AUTHN_LEVEL_PKT_INTEGRITY)
        d.connect()
        try:
            d.bind(srvs.MSRPC_UUID_SRVS)
            srvs.hNetrServerGetInfo(d, 101)
            return True
        except DCERPCException:
            return False
        finally:
            d.disconnect()

    assert rpc_logon(srv.password)
    for _ in range(3):
        assert not rpc_logon("wrong")
    assert not rpc_logon(srv.password)
    again = SMBConnection(srv.host, srv.host, sess_port=srv.port)
    with pytest.raises(SessionError) as e:
        again.login(srv.user, srv.password)
    assert e.value.getErrorCode() == 0xC0000234  # STATUS_ACCOUNT_LOCKED_OUT
