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


def rpcclient(server, conf, command: str, *, fails: bool = False) -> str:
    """rpcclient's output for `command`; it exits 1 when the call fails."""
    cmd = ["rpcclient", "-p", str(server.port), "-U", f"{server.user}%{server.password}", "-s", str(conf), server.host, "-c", command]
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
