"""The witness service (MS-SWN, issue 49, first step): DCE/RPC over TCP on
`[witness] listen`, found through the endpoint mapper, NTLM at the
integrity and privacy levels, and GetInterfaceList, Register,
RegisterEx, UnRegister and AsyncNotify.

Two real clients: Samba's rpcclient (its witness commands, through the
endpoint mapper on port 135 of a loopback address of the test's own),
and impacket's DCE/RPC over TCP for what rpcclient cannot send (a cut
stub, an AsyncNotify that waits). The cluster test runs three nodes on
a real three-member etcd: a client registers with n1's interface
through n2's witness service, n1 is killed, and the waiting AsyncNotify
answers RESOURCE_CHANGE once n1's membership expires.
"""

from __future__ import annotations

import json
import os
import random
import signal
import struct
import subprocess
import threading
import time
import uuid

import pytest

from conftest import PASSWORD, USER, add_user, free_port, nimbus_binary, require_tool, wait_for_port, write_config
from etcd_cluster import etcd_cluster  # noqa: F401  (the fixture)
from test_cluster import TTL, Node, nodes  # noqa: F401  (the fixture)
from test_kerberos import kdc  # noqa: F401  (the fixture)

# Nimbus's own service: Samba 4.17 has none (rpcd_witness came with 4.20).
pytestmark = pytest.mark.nimbus_only

WITNESS_UUID = ("ccd8c074-d0e5-4a40-92b4-d074faa6ba28", "1.1")
V1, V2 = 0x00010001, 0x00020000
ERROR_NOT_FOUND, ERROR_TIMEOUT, ERROR_INVALID_STATE = 1168, 1460, 5023


def rpcclient_at(ip: str, level: str, user: str = USER, password: str = PASSWORD) -> list[str]:
    """rpcclient for the witness at `ip`: it asks the endpoint mapper at
    ip:135 for the port, and binds at `level` ("sign", "seal" or "")."""
    binding = f"ncacn_ip_tcp:{ip}[{level}]" if level else f"ncacn_ip_tcp:{ip}"
    return ["stdbuf", "-oL", "rpcclient", "-U", f"{user}%{password}", binding]


def rpc(ip: str, level: str, commands: str, user: str = USER, password: str = PASSWORD) -> str:
    r = subprocess.run(
        [*rpcclient_at(ip, level, user, password), "-c", commands], capture_output=True, text=True, timeout=30
    )
    return r.stdout + r.stderr


@pytest.fixture
def witness_node(tmp_path):
    """One node with the witness service on a loopback address of this
    test's own, its endpoint mapper at port 135 there (the tests run as
    root, as rpcclient only asks port 135). Yields (ip, witness port)."""
    if os.geteuid() != 0:
        pytest.fail("the witness tests bind port 135 for rpcclient's endpoint mapper lookup: run them as root")
    ip = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db)
    port, wport = free_port(), free_port()
    conf = write_config(tmp_path / "nimbus.toml", port, db, [("data", share, False)])
    # SMB on port 445 too: smbtorture's Register tests reach srvsvc there.
    text = conf.read_text().replace("127.0.0.1:", f"{ip}:").replace(f'"{ip}:{port}"', f'"{ip}:{port}", "{ip}:445"')
    conf.write_text(text + f'\n[witness]\nlisten = ["{ip}:{wport}"]\nendpoint_mapper = ["{ip}:135"]\n')
    log = tmp_path / "nimbus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=out, stderr=out)
    try:
        wait_for_port(ip, port, proc)
        wait_for_port(ip, wport, proc)
        wait_for_port(ip, 135, proc)
        yield ip, wport, log
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "panicked at" not in log.read_text(errors="replace")


# impacket, for raw calls -------------------------------------------------


def wstr_ptr(s: str | None, referent: int) -> bytes:
    """A unique pointer to a [string] wchar_t*, pointee in place, padded to 4."""
    if s is None:
        return b"\0\0\0\0"
    units = (s + "\0").encode("utf-16-le")
    n = len(units) // 2
    out = struct.pack("<IIII", referent, n, 0, n) + units
    return out + b"\0" * (-len(out) % 4)


def register_ex(net: str, share: str | None, ip: str, client: str, timeout: int, version: int = V2, flags: int = 0) -> bytes:
    return (
        struct.pack("<I", version)
        + wstr_ptr(net, 0x20000)
        + wstr_ptr(share, 0x20004)
        + wstr_ptr(ip, 0x20008)
        + wstr_ptr(client, 0x2000C)
        + struct.pack("<II", flags, timeout)
    )


def connect(ip: str, port: int, level: str = "seal", password: str = PASSWORD):
    from impacket.dcerpc.v5 import transport
    from impacket.dcerpc.v5.rpcrt import RPC_C_AUTHN_LEVEL_PKT_INTEGRITY, RPC_C_AUTHN_LEVEL_PKT_PRIVACY
    from impacket.uuid import uuidtup_to_bin

    t = transport.DCERPCTransportFactory(f"ncacn_ip_tcp:{ip}[{port}]")
    t.set_credentials(USER, password, "", "", "")
    d = t.get_dce_rpc()
    d.set_auth_level({"sign": RPC_C_AUTHN_LEVEL_PKT_INTEGRITY, "seal": RPC_C_AUTHN_LEVEL_PKT_PRIVACY}[level])
    d.connect()
    d.bind(uuidtup_to_bin(WITNESS_UUID))
    return d


def call(d, opnum: int, stub: bytes) -> bytes:
    d.call(opnum, stub)
    return d.recv()


def result_of(answer: bytes) -> int:
    return struct.unpack("<I", answer[-4:])[0]


def interfaces(answer: bytes) -> list[tuple[str, str, int]]:
    """(group name, IPv4 address, flags) of each entry of a
    GetInterfaceList answer: 552 bytes each after a 16-byte head."""
    n = struct.unpack("<I", answer[4:8])[0]
    out = []
    for i in range(n):
        e = answer[16 + 552 * i : 16 + 552 * (i + 1)]
        name = e[:520].decode("utf-16-le").split("\0")[0]
        out.append((name, ".".join(str(b) for b in e[528:532]), struct.unpack("<I", e[548:552])[0]))
    return out


def resource_change(answer: bytes) -> tuple[int, str, int]:
    """(message type, resource name, change type) of an AsyncNotify answer."""
    kind, length, num = struct.unpack("<III", answer[4:16])
    assert num == 1, answer.hex()
    message = answer[24 : 24 + length]
    _, change = struct.unpack("<II", message[:8])
    return kind, message[8:].decode("utf-16-le").rstrip("\0"), change


# single node ------------------------------------------------------------


@require_tool("rpcclient", "smbclient")
def test_rpcclient_finds_the_service_through_the_endpoint_mapper_at_integrity_and_privacy(witness_node):
    ip, _, _ = witness_node
    for level in ("sign", "seal"):
        out = rpc(ip, level, "GetInterfaceList")
        # Available ("+"), not another node's witness (" "), version 2.
        assert f" + NIMBUS {ip} V2" in out, f"{level}: {out}"
    # Without authentication, or with a wrong password, nothing is served:
    # the calls are refused with ACCESS_DENIED.
    assert "WERR_ACCESS_DENIED" in rpc(ip, "", "GetInterfaceList")
    assert "WERR_ACCESS_DENIED" in rpc(ip, "sign", "GetInterfaceList", password="wrong")


@require_tool("rpcclient", "smbclient")
def test_rpcclient_registers_and_unregisters_and_bad_registrations_get_their_errors(witness_node):
    ip, _, _ = witness_node
    p = subprocess.Popen(rpcclient_at(ip, "seal"), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        assert p.stdin and p.stdout
        p.stdin.write(f"Register --net=nimbus --ip={ip} --client=c1\n")
        p.stdin.flush()
        line = p.stdout.readline()
        handle = line.strip()
        assert handle.startswith("0:"), line
        # The handle is the association's: a second UnRegister finds none.
        p.stdin.write(f"UnRegister {handle}\nUnRegister {handle}\nquit\n")
        p.stdin.flush()
        rest = p.communicate(timeout=30)[0]
    finally:
        p.kill()
    assert rest.count("WERR_NOT_FOUND") >= 1 and "UnRegister failed" in rest, rest
    assert rest.count("dcerpc_witness_UnRegister failed") == 1, rest
    cases = {
        # MS-SWN 3.1.4.2: Register takes version 1 only.
        f"Register --version={V2} --net=NIMBUS --ip={ip} --client=c1": "WERR_REVISION_MISMATCH",
        f"Register --net=OTHER --ip={ip} --client=c1": "WERR_INVALID_PARAMETER",
        "Register --net=NIMBUS --ip=192.0.2.1 --client=c1": "WERR_INVALID_STATE",
        f"RegisterEx --net=NIMBUS --share=nosuch --ip={ip} --client=c1": "WERR_INVALID_STATE",
        "UnRegister 0:00000000-0000-0000-0000-000000000000": "WERR_NOT_FOUND",
    }
    for command, error in cases.items():
        assert error in rpc(ip, "sign", command), command
    assert rpc(ip, "sign", f"RegisterEx --net=NIMBUS --share=data --ip={ip} --client=c1").strip().startswith("0:")


@require_tool("smbtorture", "samba-testsuite")
def test_the_packet_level_is_served_signed_and_the_call_level_refused(witness_node):
    """RPC_C_AUTHN_LEVEL_PKT (4) is served as integrity, as Samba serves
    it: rpcclient and smbtorture at `[packet]` get their answers, and the
    node's answers carry signatures the client checks (a BIND_ACK at level
    4 whose answers were unsigned would fail the client's check). Level 3
    (CALL) is refused at BIND."""
    from impacket.dcerpc.v5.rpcrt import RPC_C_AUTHN_LEVEL_CALL, DCERPCException
    from impacket.dcerpc.v5 import transport
    from impacket.uuid import uuidtup_to_bin

    ip, port, log = witness_node
    out = rpc(ip, "packet", "GetInterfaceList")
    assert f" + NIMBUS {ip} V2" in out, out
    # At level 4 indeed (rpcclient falls back to integrity, 5, when it
    # does not understand the binding's level).
    assert "logged on (authentication level 4)" in log.read_text(errors="replace")
    r = subprocess.run(["smbtorture", f"ncacn_ip_tcp:{ip}[{port},packet]", "-U", f"{USER}%{PASSWORD}", "rpc.witness"], capture_output=True, text=True, timeout=120)
    assert "success: witness.GetInterfaceList" in r.stdout + r.stderr, r.stdout + r.stderr
    t = transport.DCERPCTransportFactory(f"ncacn_ip_tcp:{ip}[{port}]")
    t.set_credentials(USER, PASSWORD, "", "", "")
    d = t.get_dce_rpc()
    d.set_auth_level(RPC_C_AUTHN_LEVEL_CALL)
    d.connect()
    with pytest.raises(DCERPCException):
        d.bind(uuidtup_to_bin(WITNESS_UUID))
    assert "authentication level 3" in log.read_text(errors="replace")


@pytest.mark.parametrize("level", ["sign", "seal"])
def test_smbtorture_rpc_witness(witness_node, level):
    """Samba's smbtorture rpc.witness (its client logs on with SPNEGO, whose
    mechListMIC takes the first NTLM sequence number). GetInterfaceList,
    Register, UnRegister and RegisterEx pass; the Register tests first list
    the shares over an srvsvc pipe on port 445 with RPC's own signing or
    sealing. AsyncNotify and AsyncNotify_timeouts drive a cluster through
    clusapi (MS-CMRP, the Windows cluster API), which Nimbus does not
    serve. Samba 4.17 has no witness service at all (rpcd_witness came
    with 4.20)."""
    ip, port, _ = witness_node
    r = subprocess.run(["smbtorture", f"ncacn_ip_tcp:{ip}[{port},{level}]", "-U", f"{USER}%{PASSWORD}", "rpc.witness"], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    for test in ("GetInterfaceList", "Register", "UnRegister", "RegisterEx"):
        assert f"success: witness.{test}" in out, out
    for test in ("AsyncNotify", "AsyncNotify_timeouts"):
        assert f"failure: witness.{test} [" in out and "clusapi" in out, (test, out)


def test_bad_input_gets_its_error_and_the_service_goes_on(witness_node):
    from impacket.dcerpc.v5.rpcrt import DCERPCException

    ip, port, _ = witness_node
    d = connect(ip, port)
    # A cut stub: a fault, and the association goes on.
    with pytest.raises(DCERPCException) as e:
        call(d, 4, register_ex("NIMBUS", "data", ip, "c1", 0)[:10])
    assert "rpc_x_bad_stub_data" in str(e.value), str(e.value)
    # An AsyncNotify and an UnRegister of a handle never issued.
    assert result_of(call(d, 3, b"\0" * 20)) == ERROR_NOT_FOUND
    assert result_of(call(d, 2, b"\x01" * 20)) == ERROR_NOT_FOUND
    assert interfaces(call(d, 0, b"")) == [("NIMBUS", ip, 0x1)]
    # A handle is valid on its own association only.
    h = call(d, 4, register_ex("NIMBUS", "data", ip, "c1", 0))[:20]
    other = connect(ip, port, level="sign")
    assert result_of(call(other, 3, h)) == ERROR_NOT_FOUND
    assert result_of(call(d, 2, h)) == 0


@pytest.mark.parametrize("level", ["sign", "seal"])
def test_a_request_changed_on_the_wire_is_refused_and_the_connection_closed(witness_node, level):
    """One byte of a signed (or sealed) request's stub changed after the
    client protected it: the signature does not verify, nothing runs, and
    the connection closes; a new connection is served."""
    ip, port, log = witness_node
    d = connect(ip, port, level=level)
    send = d._transport.send

    def tampered(data: bytes, *args, **kwargs):
        b = bytearray(data)
        b[24 + 10] ^= 0x01  # a byte of the stub: the net name's
        return send(bytes(b), *args, **kwargs)

    d._transport.send = tampered
    with pytest.raises(Exception):
        call(d, 4, register_ex("NIMBUS", "data", ip, "c1", 0))
    assert "signature does not verify" in log.read_text(errors="replace")
    assert result_of(call(connect(ip, port, level=level), 0, b"")) == 0


def test_a_request_without_its_verifier_on_a_signed_association_closes_it(witness_node):
    """A REQUEST with no auth verifier (auth_length 0) after an integrity
    logon: nothing runs and the connection closes."""
    ip, port, log = witness_node
    d = connect(ip, port, level="sign")
    # C706 12.6.4.9: header (REQUEST, first and last fragment), alloc_hint,
    # context 0, opnum 0 (GetInterfaceList), no stub, no verifier.
    bare = struct.pack("<BBBB4sHHIIHH", 5, 0, 0, 3, b"\x10\0\0\0", 24, 0, 7, 0, 0, 0)
    d._transport.send(bare)
    try:
        got = d._transport.recv()
    except Exception:  # impacket raises on a closed connection, or returns nothing
        got = b""
    assert not got, got
    assert "a request without its signature" in log.read_text(errors="replace")


def test_an_async_notify_waits_out_its_registrations_timeout(witness_node):
    ip, port, _ = witness_node
    d = connect(ip, port)
    answer = call(d, 4, register_ex("NIMBUS", "data", ip, "c1", 1))
    assert result_of(answer) == 0
    began = time.monotonic()
    assert result_of(call(d, 3, answer[:20])) == ERROR_TIMEOUT
    assert time.monotonic() - began >= 0.9


# cluster ----------------------------------------------------------------


def start_with_witness(nodes) -> dict[str, int]:  # noqa: F811
    """Starts the nodes, each with its witness service (no endpoint mapper:
    impacket is given the port); their witness ports by name."""
    ports = {}
    for n in nodes:
        ports[n.name] = free_port()
        n.conf.write_text(n.conf.read_text() + f'\n[witness]\nlisten = ["{n.host}:{ports[n.name]}"]\nendpoint_mapper = []\n')
        n.start()
        wait_for_port(n.host, ports[n.name], n.proc)
    return ports


def waiting_notify(d, handle: bytes) -> tuple[threading.Thread, list[bytes]]:
    """An AsyncNotify sent, its answer awaited on a thread."""
    got: list[bytes] = []
    d.call(3, handle)
    waiter = threading.Thread(target=lambda: got.append(d.recv()), daemon=True)
    waiter.start()
    return waiter, got


def client_move(answer: bytes) -> tuple[int, list[str]]:
    """(message type, addresses) of an AsyncNotify answer with an
    IPADDR_INFO_LIST (MS-SWN 2.2.2.7)."""
    kind, length, num = struct.unpack("<III", answer[4:16])
    assert num == 1, answer.hex()
    message = answer[24 : 24 + length]
    count = struct.unpack("<I", message[8:12])[0]
    addrs = []
    for i in range(count):
        entry = message[12 + 24 * i : 12 + 24 * (i + 1)]
        assert struct.unpack("<I", entry[:4])[0] == 0x01 | 0x08  # IPv4, online
        addrs.append(".".join(str(b) for b in entry[4:8]))
    return kind, addrs


def ip_change(answer: bytes) -> tuple[int, list[tuple[str, int]]]:
    """(message type, [(IPv4 address, flags)]) of an AsyncNotify answer
    with an IPADDR_INFO_LIST (MS-SWN 2.2.2.6-7)."""
    kind, length, num = struct.unpack("<III", answer[4:16])
    assert num == 1, answer.hex()
    message = answer[24 : 24 + length]
    count = struct.unpack("<I", message[8:12])[0]
    entries = [message[12 + 24 * i : 12 + 24 * (i + 1)] for i in range(count)]
    return kind, [(".".join(str(b) for b in e[4:8]), struct.unpack("<I", e[:4])[0]) for e in entries]


def share_capabilities(host: str, port: int, share: str, monkeypatch) -> int:
    """The Capabilities of a 3.1.1 TREE_CONNECT response (MS-SMB2 2.2.10)."""
    from smbprotocol import tree as smbtree
    from smbprotocol.connection import Connection
    from smbprotocol.session import Session

    seen: list[int] = []
    unpack = smbtree.SMB2TreeConnectResponse.unpack

    def recording(self, data):
        out = unpack(self, data)
        seen.append(self["capabilities"].get_value())
        return out

    monkeypatch.setattr(smbtree.SMB2TreeConnectResponse, "unpack", recording)
    conn = Connection(uuid.uuid4(), host, port)
    conn.connect()
    try:
        sess = Session(conn, USER, PASSWORD)
        sess.connect()
        smbtree.TreeConnect(sess, rf"\\{host}\{share}").connect()
    finally:
        conn.disconnect()
    return seen[-1]


def test_a_continuously_available_share_of_a_witness_cluster_announces_cluster_and_scaleout(nodes, monkeypatch):  # noqa: F811
    """MS-SMB2 2.2.10: CA, SCALEOUT and CLUSTER on the CA share, so that a
    client registers with the witness; the other shares announce none."""
    start_with_witness(nodes)
    n = nodes[0]
    assert share_capabilities(n.host, n.port, "ca", monkeypatch) == 0x10 | 0x20 | 0x40
    assert share_capabilities(n.host, n.port, "data", monkeypatch) == 0


def test_nimbus_witness_move_tells_the_client_to_move_through_whichever_node_holds_it(nodes, tmp_path):  # noqa: F811
    """`nimbus witness move` run with any node's configuration: the client
    registered through n2 gets CLIENT_MOVE to n3's address, asked of n2
    alone (the holder its record in etcd names); a move naming a client
    with no registration, or a node that is not a member, is refused and
    tells it nothing."""
    ports = start_with_witness(nodes)
    n1, n2, n3 = nodes
    d = connect(n2.host, ports["n2"])
    me = d.get_rpc_transport().get_socket().getsockname()[0]
    answer = call(d, 4, register_ex("NIMBUS", "ca", n1.host, "c1", 0))
    assert result_of(answer) == 0
    waiter, got = waiting_notify(d, answer[:20])
    # `nimbus status` shows where the registration is held.
    from test_cluster import status_reports, wait_until

    wait_until(
        "n2's figures count its witness registration",
        lambda: status_reports(n2)["n2"].get("witness_registrations") == 1 and status_reports(n2)["n1"].get("witness_registrations") == 0,
        lambda: {k: v.get("witness_registrations") for k, v in status_reports(n2).items()},
    )

    def move(client: str, to: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(nimbus_binary()), "witness", "move", "--config", str(n1.conf), "--client", client, "--to", to], capture_output=True, text=True, timeout=30)

    # Another client's move, to n2: were it delivered here, the answer
    # below would name n2.
    r = move("192.0.2.99", "n2")
    assert r.returncode != 0 and "no registration of the witness clients at 192.0.2.99" in r.stderr, (r.stdout, r.stderr)
    r = move(me, "n9")
    assert r.returncode != 0 and "no such node" in r.stderr, r.stderr
    r = move(me, "n3")
    assert r.returncode == 0 and "asked 1 node(s) (n2)" in r.stdout, (r.stdout, r.stderr)
    waiter.join(timeout=10)
    assert got, "no CLIENT_MOVE"
    assert client_move(got[0]) == (2, [n3.host])
    assert "told 1 registration(s)" in n2.log()


def test_nimbus_witness_move_share_moves_only_that_shares_registrations(nodes):  # noqa: F811
    """`nimbus witness move --share ca --to n3`: the client registered for
    share ca (RegisterEx with its name) gets SHARE_MOVE to n3's address; a
    registration without a share, and moves naming another share or
    another client, tell nobody. The answers show it: each registration's
    first notification is the one meant for it."""
    ports = start_with_witness(nodes)
    n1, n2, n3 = nodes
    with_share = connect(n2.host, ports["n2"])
    without = connect(n2.host, ports["n2"])
    me = with_share.get_rpc_transport().get_socket().getsockname()[0]
    a = call(with_share, 4, register_ex("NIMBUS", "ca", n1.host, "c1", 0))
    b = call(without, 4, register_ex("NIMBUS", None, n1.host, "c1", 0))
    assert result_of(a) == 0 and result_of(b) == 0
    share_waiter, share_got = waiting_notify(with_share, a[:20])
    plain_waiter, plain_got = waiting_notify(without, b[:20])

    def move(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(nimbus_binary()), "witness", "move", "--config", str(n1.conf), *args], capture_output=True, text=True, timeout=30)

    r = move("--share", "nosuch", "--to", "n3")
    assert r.returncode != 0 and "no such share" in r.stderr, r.stderr
    r = move("--to", "n3")
    assert r.returncode != 0, r.stdout
    # Were either delivered to the registration for ca, its answer below
    # would name n2. No registration matches either: nobody is asked.
    for args in (("--share", "data", "--to", "n2"), ("--share", "ca", "--client", "192.0.2.99", "--to", "n2")):
        r = move(*args)
        assert r.returncode != 0 and "no registration of" in r.stderr, (args, r.stdout, r.stderr)
    # n2 holds both registrations, so it is asked, and tells only the one
    # for ca.
    r = move("--share", "CA", "--client", me, "--to", "n3")
    assert r.returncode == 0 and "registered for share CA" in r.stdout and "asked 1 node(s) (n2)" in r.stdout, (r.stdout, r.stderr)
    share_waiter.join(timeout=10)
    assert share_got, "no SHARE_MOVE"
    # MS-SWN 2.2.2.5: SHARE_MOVE (3), n3's address.
    assert client_move(share_got[0]) == (3, [n3.host])
    # The registration without a share heard none of that: its first
    # notification is the client move sent now.
    r = move("--client", me, "--to", "n1")
    assert r.returncode == 0, r.stderr
    plain_waiter.join(timeout=10)
    assert plain_got, "no CLIENT_MOVE"
    assert client_move(plain_got[0]) == (2, [n1.host])
    assert "registration(s) for share CA to move" in n2.log()


def witness_list(n) -> list[dict]:
    """`nimbus witness list --json` with node n's configuration."""
    r = subprocess.run([str(nimbus_binary()), "witness", "list", "--config", str(n.conf), "--json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_registrations_live_in_etcd_while_their_clients_hold_them(nodes):  # noqa: F811
    """Each registration is kept in etcd by the node holding it, so that
    `nimbus witness list`, run with any node's configuration, shows every
    node's: the holder, the client, the node and address it watches, the
    share. UnRegister takes it out at once; a client whose connection
    closes takes its registrations with it; a holder killed with SIGKILL
    takes them with its lease. The table names them too."""
    from test_cluster import wait_until

    ports = start_with_witness(nodes)
    n1, n2, n3 = nodes
    assert witness_list(n1) == []
    through_n2 = connect(n2.host, ports["n2"])
    through_n3 = connect(n3.host, ports["n3"])
    me = through_n2.get_rpc_transport().get_socket().getsockname()[0]
    a = call(through_n2, 4, register_ex("NIMBUS", "ca", n1.host, "ws-one", 0, flags=1))
    b = call(through_n3, 4, register_ex("NIMBUS", None, n2.host, "ws-two", 0))
    c = call(through_n3, 4, register_ex("NIMBUS", "ca", n1.host, "ws-two", 0))
    assert result_of(a) == result_of(b) == result_of(c) == 0
    # Written before the answer: no wait.
    seen = {(r["holder"], r["client_name"], r["node"], r["address"], r["share"], r["ip_notify"], r["client"]) for r in witness_list(n1)}
    assert seen == {
        ("n2", "ws-one", "n1", n1.host, "ca", True, me),
        ("n3", "ws-two", "n2", n2.host, None, False, me),
        ("n3", "ws-two", "n1", n1.host, "ca", False, me),
    }, seen
    table = subprocess.run([str(nimbus_binary()), "witness", "list", "--config", str(n3.conf)], capture_output=True, text=True, timeout=30)
    assert table.returncode == 0 and "HELD BY" in table.stdout and "3 registration(s)" in table.stdout, (table.stdout, table.stderr)
    # UnRegister: out at once.
    assert result_of(call(through_n3, 2, b[:20])) == 0
    left = witness_list(n2)
    assert sorted((r["holder"], r["node"]) for r in left) == [("n2", "n1"), ("n3", "n1")], left
    # A connection that closes takes its registrations.
    through_n3.disconnect()
    wait_until("n3's registrations to go with their connection", lambda: [r["holder"] for r in witness_list(n1)] == ["n2"], lambda: witness_list(n1))
    # A holder killed: its registrations go with its lease.
    n2.proc.send_signal(signal.SIGKILL)
    n2.proc.wait()
    wait_until("n2's registrations to go with its lease", lambda: witness_list(n1) == [], lambda: witness_list(n1))


def test_nimbus_drain_moves_a_witness_client_which_keeps_its_persistent_handle(nodes):  # noqa: F811
    """`nimbus drain` of n1: the client registered for n1 (through n2) is
    told to move to n3, n1 refuses new connections, the client reconnects
    to n3 and reclaims its persistent handle (taken over from n1, which let
    go of it: not reopened) with its data, and n1 stops by itself once its
    client has gone, handing back what it held."""
    import rawsmb
    from test_cluster import CaTarget
    from test_durable import Client
    from test_persistent import persistent_open_uncached, reconnect_uncached

    ports = start_with_witness(nodes)
    n1, n2, n3 = nodes
    guid, create_guid = uuid.uuid4(), uuid.uuid4()
    first = Client(CaTarget(n1), guid)
    f = persistent_open_uncached(first, "moving.dat", create_guid)
    f.write(b"kept across the move", 0)
    file_id = f.file_id
    d = connect(n2.host, ports["n2"])
    answer = call(d, 4, register_ex("NIMBUS", "ca", n1.host, "c1", 0))
    assert result_of(answer) == 0
    waiter, got = waiting_notify(d, answer[:20])

    r = subprocess.run([str(nimbus_binary()), "drain", "--config", str(n1.conf), "--to", "n3", "--within", "60"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "registered through n2" in r.stdout, (r.stdout, r.stderr)
    waiter.join(timeout=10)
    assert got, "no CLIENT_MOVE"
    assert client_move(got[0]) == (2, [n3.host])
    # n1 takes no new connection meanwhile, and is still running.
    deadline = time.monotonic() + 10
    while "draining: new connections refused" not in n1.log():
        assert time.monotonic() < deadline, "n1 never began its drain"
        time.sleep(0.1)
    s = rawsmb.connect(n1.host, n1.port)
    assert rawsmb.is_closed(s)
    assert n1.proc and n1.proc.poll() is None
    # The client moves where it was told.
    first.drop()
    again = Client(CaTarget(n3), guid)
    try:
        g = reconnect_uncached(again, "moving.dat", file_id, create_guid)
        assert g.read(0, 20) == b"kept across the move"
        assert "taken over from the node that let go of it" in n3.log()
        g.close()
    finally:
        again.close()
    # n1 stops by itself, as at SIGTERM; the others go on.
    assert n1.proc.wait(timeout=30) == 0, n1.log()[-2000:]
    log = n1.log()
    assert "drained; shutting down" in log and "handed back" in log
    assert all(n.proc and n.proc.poll() is None for n in (n2, n3))


def test_a_client_registered_through_n2_hears_that_n1_went(nodes):  # noqa: F811
    """n1 is killed; the client that registered for n1's interface through
    n2's witness service gets RESOURCE_CHANGE (unavailable) for n1's
    address once n1's membership expires (node_ttl_secs), and
    RESOURCE_CHANGE (available) once n1 is back."""
    ports = start_with_witness(nodes)
    n1, n2, _ = nodes
    d = connect(n2.host, ports["n2"])
    listed = interfaces(call(d, 0, b""))
    # Every node, and every one but n2 offered as a witness.
    assert sorted(listed) == sorted((n.name, n.host, 0x1 | (0x4 if n is not n2 else 0)) for n in nodes), listed
    answer = call(d, 4, register_ex("NIMBUS", "ca", n1.host, "c1", 0))
    assert result_of(answer) == 0
    handle = answer[:20]
    # Another client asks for IP notifications too
    # (WITNESS_REGISTER_IP_NOTIFICATION); its AsyncNotify waits 10 s at most.
    ip_client = connect(n2.host, ports["n2"])
    answer = call(ip_client, 4, register_ex("NIMBUS", None, n1.host, "c2", 10, flags=0x1))
    assert result_of(answer) == 0
    ip_handle = answer[:20]

    waiter, got = waiting_notify(d, handle)
    waiter.join(timeout=TTL + 1)
    assert not got, "AsyncNotify answered while n1 was alive"
    assert n1.proc
    n1.proc.kill()
    killed = time.monotonic()
    waiter.join(timeout=TTL + 10)
    assert got, "no notification after n1 was killed"
    assert time.monotonic() - killed <= TTL + 5
    # MS-SWN 2.2.2.5: RESOURCE_CHANGE, the address, unavailable (0xff).
    assert resource_change(got[0]) == (1, n1.host, 0xFF)
    assert result_of(got[0]) == 0
    # The client that asked for IP notifications hears the same, then
    # IP_CHANGE: n1's address offline (IPv4 0x1 | OFFLINE 0x10). The other
    # has no second notification: its next waits.
    assert resource_change(call(ip_client, 3, ip_handle)) == (1, n1.host, 0xFF)
    assert ip_change(call(ip_client, 3, ip_handle)) == (4, [(n1.host, 0x1 | 0x10)])
    # n1 starts again at the same address: available (0x1), and for the
    # other client its address online (IPv4 0x1 | ONLINE 0x8). Nothing
    # comes while n1 is still down.
    waiter, got = waiting_notify(d, handle)
    waiter.join(timeout=TTL + 1)
    assert not got, "a notification while n1 was still down"
    n1.start()
    waiter.join(timeout=TTL + 10)
    assert got, "no notification after n1 came back"
    assert resource_change(got[0]) == (1, n1.host, 0x1)
    assert resource_change(call(ip_client, 3, ip_handle)) == (1, n1.host, 0x1)
    assert ip_change(call(ip_client, 3, ip_handle)) == (4, [(n1.host, 0x1 | 0x8)])


# Kerberos ------------------------------------------------------------------

KRB_USER, KRB_PASSWORD = "watcher", "W1tness-Kerberos!"


@pytest.fixture
def kerberos_witness(kdc, tmp_path):  # noqa: F811
    """One node with [kerberos] and the witness service on the loopback
    address this machine's name resolves to (Kerberos needs a name), its
    keytab holding cifs/<name> and host/<name>, the service RPC clients
    ask for. Yields (name, address, witness port, log)."""
    from kdc import REALM
    from test_kerberos import loopback_host_name

    if os.geteuid() != 0:
        pytest.fail("the witness tests bind port 135 for rpcclient's endpoint mapper lookup: run them as root")
    name, addr = loopback_host_name()
    conf_text = kdc.krb5_conf.read_text()
    if f"  {name} = {REALM}\n" not in conf_text:
        kdc.krb5_conf.write_text(conf_text.replace("[domain_realm]\n", f"[domain_realm]\n  {name} = {REALM}\n"))
    keytab = tmp_path / "node.keytab"
    for service in ("cifs", "host"):
        kdc.kadmin(f"addprinc -randkey {service}/{name}")
        kdc.kadmin(f"ktadd -k {keytab} {service}/{name}")
    keytab.chmod(0o600)
    kdc.kadmin(f"addprinc -pw {KRB_PASSWORD} {KRB_USER}")
    share = tmp_path / "share"
    share.mkdir()
    db = tmp_path / "users.db"
    add_user(db, KRB_USER, KRB_PASSWORD)
    port, wport = free_port(), free_port()
    conf = write_config(tmp_path / "nimbus.toml", port, db, [("data", share, False)])
    text = conf.read_text().replace("127.0.0.1:", f"{addr}:")
    conf.write_text(
        text
        + f'\n[kerberos]\nkeytab = "{keytab}"\n'
        + f'\n[witness]\nlisten = ["{addr}:{wport}"]\nendpoint_mapper = ["{addr}:135"]\n'
    )
    log = tmp_path / "nimbus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(nimbus_binary()), "serve", "--config", str(conf)], stdout=out, stderr=out, env=kdc.env)
    try:
        wait_for_port(addr, port, proc)
        wait_for_port(addr, wport, proc)
        wait_for_port(addr, 135, proc)
        yield name, addr, wport, log
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert "panicked at" not in log.read_text(errors="replace")


def smbtorture_witness_kerberos(kdc, name: str, port: int, level: str) -> str:  # noqa: F811
    from kdc import REALM

    r = subprocess.run(
        ["smbtorture", f"ncacn_ip_tcp:{name}[{port},{level}]", "--use-kerberos=required", "-U", f"{KRB_USER}@{REALM}%{KRB_PASSWORD}", "rpc.witness"],
        capture_output=True, text=True, timeout=120, env=kdc.env,
    )  # fmt: skip
    return r.stdout + r.stderr


@require_tool("rpcclient", "smbclient")
@require_tool("smbtorture", "samba-testsuite")
@require_tool("kinit", "krb5-user")
def test_rpcclient_and_smbtorture_log_on_to_the_witness_with_kerberos_at_integrity_and_privacy(kdc, kerberos_witness, tmp_path):  # noqa: F811
    """A Kerberos logon (SPNEGO, and bare krb5) of Samba's clients at the
    integrity and privacy levels: the DCE style's three legs, MIC tokens
    and DCE-style wrap tokens with headers signed. The client checks every
    answer's verifier, so a call that returns checked ours, and ours
    checked its requests."""
    from kdc import REALM

    name, addr, wport, log = kerberos_witness
    for level in ("sign", "seal"):
        out = smbtorture_witness_kerberos(kdc, name, wport, level)
        for test in ("GetInterfaceList", "UnRegister"):
            assert f"success: witness.{test}" in out, f"{level}: {out}"
    # rpcclient takes its ticket from a credential cache only.
    ccache = tmp_path / "ccache"
    env = dict(kdc.env, KRB5CCNAME=f"FILE:{ccache}")
    subprocess.run(["kinit", f"{KRB_USER}@{REALM}"], input=KRB_PASSWORD + "\n", env=env, check=True, capture_output=True, text=True, timeout=30)
    for level in ("sign", "seal", "krb5,sign", "krb5,seal"):
        r = subprocess.run(
            ["rpcclient", "--use-kerberos=required", f"--use-krb5-ccache=FILE:{ccache}", f"ncacn_ip_tcp:{name}[{level}]", "-c", "GetInterfaceList"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        out = r.stdout + r.stderr
        assert f" + NIMBUS {addr} V2" in out, f"{level}: {out}\n{log.read_text(errors='replace')[-3000:]}"
    logged = log.read_text(errors="replace")
    for level in (5, 6):
        assert f"{REALM}\\{KRB_USER} logged on (authentication level {level})" in logged, logged[-3000:]


def changing_proxy(addr: str, port: int, change) -> tuple[int, threading.Thread]:
    """A one-connection proxy to addr:port on addr that hands each PDU the
    client sends (cut by its frag_length, C706 12.6.4) to `change`, which
    returns what to send in its place, or None to send it as it is; after
    the first change the rest passes unchanged. Bounded: it ends when either side closes, or
    after 60 s."""
    import socket

    listener = socket.create_server((addr, 0))
    listener.settimeout(60)

    def pump(src, dst, flip: bool) -> None:
        buf, flipped = b"", not flip
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if flipped:
                    dst.sendall(data)
                    continue
                buf += data
                while len(buf) >= 10 and len(buf) >= struct.unpack_from("<H", buf, 8)[0]:
                    n = struct.unpack_from("<H", buf, 8)[0]
                    pdu = bytes(buf[:n])
                    buf = buf[n:]
                    changed = None if flipped else change(bytearray(pdu))
                    flipped = flipped or changed is not None
                    dst.sendall(pdu if changed is None else changed)
                if flipped and buf:
                    dst.sendall(buf)
                    buf = b""
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def serve() -> None:
        with listener:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((addr, port), timeout=60)
            client.settimeout(60)
            back = threading.Thread(target=pump, args=(upstream, client, False), daemon=True)
            back.start()
            pump(client, upstream, True)
            back.join(60)
            client.close()
            upstream.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return listener.getsockname()[1], t


@require_tool("smbtorture", "samba-testsuite")
@pytest.mark.parametrize("level", ["sign", "seal"])
def test_a_kerberos_protected_request_changed_on_the_wire_is_refused(kdc, kerberos_witness, level):  # noqa: F811
    """The first request's alloc_hint (a header field nothing else checks)
    is changed on its way: the headers are signed, so the MIC or wrap token
    does not verify, nothing runs and the connection closes."""
    name, _, wport, log = kerberos_witness

    def alloc_hint(pdu: bytearray) -> bytes | None:
        if pdu[2] != 0:  # REQUEST
            return None
        pdu[16] ^= 0x01
        return bytes(pdu)

    port, proxy = changing_proxy(kerberos_witness[1], wport, alloc_hint)
    out = smbtorture_witness_kerberos(kdc, name, port, level)
    proxy.join(60)
    assert "success: witness.GetInterfaceList" not in out, out
    assert "a request whose signature does not verify" in log.read_text(errors="replace")


@require_tool("smbtorture", "samba-testsuite")
def test_a_bind_stripped_of_header_signing_gets_no_kerberos_logon(kdc, kerberos_witness):  # noqa: F811
    """PFC_SUPPORT_HEADER_SIGN cleared from the BIND on its way (the BIND
    itself is not protected): were the logon served, its tokens would not
    cover the opnum or the padding. It is refused, and nothing is
    answered."""
    name, _, wport, log = kerberos_witness

    def no_header_signing(pdu: bytearray) -> bytes | None:
        if pdu[2] != 11 or not pdu[3] & 0x04:  # a BIND asking for it
            return None
        pdu[3] &= ~0x04
        return bytes(pdu)

    port, proxy = changing_proxy(kerberos_witness[1], wport, no_header_signing)
    out = smbtorture_witness_kerberos(kdc, name, port, "sign")
    proxy.join(60)
    assert "success: witness.GetInterfaceList" not in out, out
    assert "which its logon cannot protect" in log.read_text(errors="replace")


@require_tool("smbtorture", "samba-testsuite")
@pytest.mark.parametrize("level", ["sign", "seal"])
def test_a_kerberos_protected_request_sent_twice_is_refused_the_second_time(kdc, kerberos_witness, level):  # noqa: F811
    """The first request is sent again right after itself, as one who
    recorded it would replay it: its token verifies once; the second time
    GSS-API's replay detection refuses it and the connection closes."""
    name, _, wport, log = kerberos_witness

    def twice(pdu: bytearray) -> bytes | None:
        return bytes(pdu) * 2 if pdu[2] == 0 else None  # REQUEST

    port, proxy = changing_proxy(kerberos_witness[1], wport, twice)
    smbtorture_witness_kerberos(kdc, name, port, level)
    proxy.join(60)
    logged = log.read_text(errors="replace")
    assert "a token replayed, out of order or after a gap" in logged, logged[-3000:]
    assert "a request whose signature does not verify" in logged, logged[-3000:]
