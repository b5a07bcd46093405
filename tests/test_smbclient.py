"""Debian's smbclient (Samba 4.17) against nimbus, at each maximum protocol.

Every command runs with `--client-protection=sign`, so each request after
logon is signed (HMAC-SHA256 for SMB 2.x, AES-CMAC or AES-GMAC for 3.x).
smbclient's exit status is that of its last command only, so each step that
must succeed runs on its own and its output is checked for NT_STATUS_ too;
what the share holds afterwards is checked on the server's disk.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
from pathlib import Path

import pytest
from conftest import require_tool

PROTOCOLS = ["SMB2_02", "SMB2_10", "SMB3_00", "SMB3_02", "SMB3_11"]
MIB = 1024 * 1024
SMALL_SIZES = [0, 1, MIB + 1]
BIG_SIZE = 100 * MIB
BIG_PROTOCOLS = ["SMB2_02", "SMB3_11"]  # 100 MiB at the oldest and newest dialect only, to bound time
TIMEOUT = 120
BIG_TIMEOUT = 600

pytestmark = require_tool("smbclient", "smbclient")  # skipped when missing; fails under CI=true


def run_smbclient(server, proto, commands, conf, cwd, *, share=None, user=None, password=None, timeout=TIMEOUT):
    """Run one smbclient invocation; return (returncode, combined output)."""
    share = share or server.share
    user = user or server.user
    password = server.password if password is None else password
    cmd = [
        "smbclient",
        f"//{server.host}/{share}",
        "-p", str(server.port),
        "-U", f"{user}%{password}",
        "-m", proto,
        "--client-protection=sign",
        "--use-kerberos=off",
        "-s", str(conf),
        "-c", commands,
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(params=PROTOCOLS)
def proto(request):
    return request.param


@pytest.fixture
def smb(server, proto, samba_client_conf, client_dir):
    """smb(commands) runs smbclient on the `server` fixture and asserts success."""

    def run(commands, timeout=TIMEOUT):
        rc, out = run_smbclient(server, proto, commands, samba_client_conf, client_dir, timeout=timeout)
        assert rc == 0 and "NT_STATUS_" not in out, f"smbclient -c {commands!r} failed (rc={rc}):\n{out}"
        return out

    return run


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def make_file(path: Path, size: int) -> str:
    """Write `size` pseudo-random bytes (the same for the same size); return their sha256."""
    rng = random.Random(size)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = rng.randbytes(min(left, 4 * MIB))
            f.write(chunk)
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


LS_LINE = re.compile(r"^  (?P<name>.+?)\s+(?P<attrs>[A-Z]*)\s+(?P<size>\d+)\s+\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}$")


def parse_ls(output: str) -> dict[str, tuple[str, int]]:
    """smbclient `ls` lines -> {name: (attribute letters, size)}."""
    entries = {}
    for line in output.splitlines():
        m = LS_LINE.match(line)
        if m:
            entries[m["name"]] = (m["attrs"], int(m["size"]))
    return entries


# --------------------------------------------------------------------------
# browse


def test_ls_lists_files_and_directories(server, smb):
    (server.share_path / "hello.txt").write_bytes(b"hello")
    (server.share_path / "sub").mkdir()
    (server.share_path / "sub" / "inner.bin").write_bytes(b"x" * 3000)

    entries = parse_ls(smb("ls"))
    assert {".", "..", "hello.txt", "sub"} <= set(entries), entries
    assert entries["hello.txt"][1] == 5
    assert "D" in entries["sub"][0]
    assert "D" not in entries["hello.txt"][0]

    inner = parse_ls(smb("ls sub\\*"))
    assert inner.get("inner.bin", ("", -1))[1] == 3000, inner


def test_ls_with_wildcards(server, smb):
    for name in ("a1.txt", "a2.txt", "b1.txt", "a10.log"):
        (server.share_path / name).write_text(name)
    names = set(parse_ls(smb("ls a?.txt"))) - {".", ".."}
    assert names == {"a1.txt", "a2.txt"}
    names = set(parse_ls(smb("ls *.log"))) - {".", ".."}
    assert names == {"a10.log"}


def test_mkdir_creates_directories(server, smb):
    smb("mkdir newdir")
    smb("mkdir newdir\\child")
    assert (server.share_path / "newdir").is_dir()
    assert (server.share_path / "newdir" / "child").is_dir()
    entries = parse_ls(smb("ls newdir\\*"))
    assert "D" in entries["child"][0]


def test_mkdir_existing_name_refused(server, proto, samba_client_conf, client_dir):
    (server.share_path / "taken").mkdir()
    rc, out = run_smbclient(server, proto, "mkdir taken", samba_client_conf, client_dir)
    assert "NT_STATUS_OBJECT_NAME_COLLISION" in out, out


# --------------------------------------------------------------------------
# put and get


def transfer_cases():
    for proto in PROTOCOLS:
        for size in SMALL_SIZES:
            yield pytest.param(proto, size, id=f"{proto}-{size}B")
        if proto in BIG_PROTOCOLS:
            yield pytest.param(proto, BIG_SIZE, id=f"{proto}-100MiB")


@pytest.mark.parametrize(("proto", "size"), list(transfer_cases()))
def test_put_then_get_is_byte_identical(server, proto, size, samba_client_conf, client_dir):
    timeout = BIG_TIMEOUT if size >= BIG_SIZE else TIMEOUT
    src = client_dir / "upload.bin"
    digest = make_file(src, size)
    try:
        rc, out = run_smbclient(server, proto, "put upload.bin remote.bin", samba_client_conf, client_dir, timeout=timeout)
        assert rc == 0 and "NT_STATUS_" not in out, out
        on_server = server.share_path / "remote.bin"
        assert on_server.stat().st_size == size
        assert sha256_file(on_server) == digest, "the file on the server differs from what was put"

        rc, out = run_smbclient(server, proto, "get remote.bin download.bin", samba_client_conf, client_dir, timeout=timeout)
        assert rc == 0 and "NT_STATUS_" not in out, out
        down = client_dir / "download.bin"
        assert down.stat().st_size == size
        assert sha256_file(down) == digest, "the file got back differs from what was put"
    finally:
        if size >= BIG_SIZE:  # don't leave 300 MiB per case in pytest's kept temp dirs
            for p in (src, client_dir / "download.bin", server.share_path / "remote.bin"):
                p.unlink(missing_ok=True)


@pytest.mark.parametrize("protection", ["off", "sign"])
@pytest.mark.parametrize("place", ["disk", "memory"])
def test_get_is_byte_identical_with_and_without_signing(server_factory, request, samba_client_conf, client_dir, protection, place):
    """Unsigned and signed large READs, from a share on disk and one in
    memory (tmpfs), give the file's bytes: whole (8 MiB READs, the last
    one short) and from an offset that is not a multiple of anything
    (reget resumes after what the local file holds)."""
    paths = {"data": request.getfixturevalue("memory_dir")} if place == "memory" else None
    server = server_factory.start(signing="auto", paths=paths)
    size = 20 * MIB + 12345
    digest = make_file(server.share_path / "big.bin", size)
    expected = (server.share_path / "big.bin").read_bytes()

    def smbclient(commands):
        cmd = [
            "smbclient", f"//{server.host}/{server.share}", "-p", str(server.port),
            "-U", f"{server.user}%{server.password}", "-m", "SMB3_11",
            f"--client-protection={protection}", "--use-kerberos=off", "-s", str(samba_client_conf), "-c", commands,
        ]  # fmt: skip
        proc = subprocess.run(cmd, cwd=client_dir, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "NT_STATUS_" not in out, f"smbclient -c {commands!r}:\n{out}"

    smbclient("get big.bin whole.bin")
    assert sha256_file(client_dir / "whole.bin") == digest, "the file got differs from the server's"
    (client_dir / "part.bin").write_bytes(expected[: 3 * MIB + 777])
    smbclient("reget big.bin part.bin")
    assert (client_dir / "part.bin").read_bytes() == expected, "the file resumed at an offset differs"


def test_put_overwrites_and_truncates(server, smb, client_dir):
    (server.share_path / "f.txt").write_bytes(b"a much longer original content\n")
    (client_dir / "short.txt").write_bytes(b"short\n")
    smb("put short.txt f.txt")
    assert (server.share_path / "f.txt").read_bytes() == b"short\n"


def test_put_into_subdirectory(server, smb, client_dir):
    (server.share_path / "d1" / "d2").mkdir(parents=True)
    (client_dir / "x.txt").write_bytes(b"nested\n")
    smb("cd d1\\d2; put x.txt")
    assert (server.share_path / "d1" / "d2" / "x.txt").read_bytes() == b"nested\n"


def test_get_missing_file_reports_not_found(server, proto, samba_client_conf, client_dir):
    rc, out = run_smbclient(server, proto, "get no-such-file.txt", samba_client_conf, client_dir)
    assert rc != 0
    assert "NT_STATUS_OBJECT_NAME_NOT_FOUND" in out, out
    assert not (client_dir / "no-such-file.txt").exists()


# --------------------------------------------------------------------------
# rename and delete


def test_rename_file(server, smb):
    (server.share_path / "old.txt").write_bytes(b"content\n")
    smb("rename old.txt new.txt")
    assert not (server.share_path / "old.txt").exists()
    assert (server.share_path / "new.txt").read_bytes() == b"content\n"


def test_rename_directory(server, smb):
    (server.share_path / "olddir").mkdir()
    (server.share_path / "olddir" / "f").write_bytes(b"f")
    smb("rename olddir newdir")
    assert not (server.share_path / "olddir").exists()
    assert (server.share_path / "newdir" / "f").read_bytes() == b"f"


def test_rename_onto_existing_refused_without_replace(server, proto, samba_client_conf, client_dir):
    (server.share_path / "a.txt").write_bytes(b"a")
    (server.share_path / "b.txt").write_bytes(b"b")
    rc, out = run_smbclient(server, proto, "rename a.txt b.txt", samba_client_conf, client_dir)
    assert "NT_STATUS_OBJECT_NAME_COLLISION" in out, out
    assert (server.share_path / "a.txt").read_bytes() == b"a"
    assert (server.share_path / "b.txt").read_bytes() == b"b"


def test_rename_with_replace(server, smb):
    (server.share_path / "a.txt").write_bytes(b"a")
    (server.share_path / "b.txt").write_bytes(b"b")
    smb("rename a.txt b.txt -f")
    assert not (server.share_path / "a.txt").exists()
    assert (server.share_path / "b.txt").read_bytes() == b"a"


def test_rm_file(server, smb):
    (server.share_path / "doomed.txt").write_bytes(b"x")
    (server.share_path / "kept.txt").write_bytes(b"y")
    smb("rm doomed.txt")
    assert not (server.share_path / "doomed.txt").exists()
    assert (server.share_path / "kept.txt").exists()


def test_rm_with_wildcard(server, smb):
    for name in ("x1.tmp", "x2.tmp", "keep.txt"):
        (server.share_path / name).write_bytes(b"x")
    smb("rm *.tmp")
    assert sorted(p.name for p in server.share_path.iterdir()) == ["keep.txt"]


def test_rmdir_empty_directory(server, smb):
    (server.share_path / "empty").mkdir()
    smb("rmdir empty")
    assert not (server.share_path / "empty").exists()


def test_rmdir_non_empty_directory_refused(server, proto, samba_client_conf, client_dir):
    (server.share_path / "full").mkdir()
    (server.share_path / "full" / "f").write_bytes(b"f")
    rc, out = run_smbclient(server, proto, "rmdir full", samba_client_conf, client_dir)
    assert "NT_STATUS_DIRECTORY_NOT_EMPTY" in out, out
    assert (server.share_path / "full" / "f").exists()


def test_deltree_removes_a_tree(server, smb):
    root = server.share_path / "tree"
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.txt").write_bytes(b"a")
    (root / "sub" / "b.txt").write_bytes(b"b")
    (root / "sub" / "deeper" / "c.bin").write_bytes(os.urandom(70000))
    (server.share_path / "bystander.txt").write_bytes(b"stays")
    smb("deltree tree")
    assert not root.exists()
    assert (server.share_path / "bystander.txt").read_bytes() == b"stays"


# --------------------------------------------------------------------------
# logon


def test_wrong_password_refused(server, proto, samba_client_conf, client_dir):
    rc, out = run_smbclient(server, proto, "ls", samba_client_conf, client_dir, password="not-the-password")
    assert rc != 0
    assert "NT_STATUS_LOGON_FAILURE" in out, out


def test_unknown_user_refused(server, proto, samba_client_conf, client_dir):
    rc, out = run_smbclient(server, proto, "ls", samba_client_conf, client_dir, user="mallory", password="whatever")
    assert rc != 0
    assert "NT_STATUS_LOGON_FAILURE" in out, out


def test_unknown_share_refused(server, proto, samba_client_conf, client_dir):
    rc, out = run_smbclient(server, proto, "ls", samba_client_conf, client_dir, share="nosuchshare")
    assert rc != 0
    assert "NT_STATUS_BAD_NETWORK_NAME" in out, out


# --------------------------------------------------------------------------
# confinement to the share


def assert_refused_without_leak(rc, out, local_file: Path, secret: str):
    assert rc != 0, out
    assert "NT_STATUS_" in out, out
    assert secret not in out
    if local_file.exists():
        assert secret not in local_file.read_text(errors="replace"), f"{local_file} holds content from outside the share"


OUTSIDE_SECRET = "SECRET-OUTSIDE-THE-SHARE"

# Paths that, resolved on the server's disk from the share root, land exactly
# on secret.txt beside the share (in the share's parent directory). {parent}
# is that directory's name, {to_root} enough `..\` to reach / and
# {absolute} the parent directory's absolute path in backslashes.
#
# smbclient cannot send a `..` component: every command passes its path
# through client_clean_name() (dos_clean_name, then unix_clean_name), which
# drops each `..` with the component before it, or alone at the root; the
# cleaned name is what it opens and what its error message quotes. So these
# cases show that the cleaned names stay inside the share; the raw `..` on
# the wire is tests/test_smbprotocol.py's test_dotdot_path_refused.
DOTDOT_ESCAPES = [
    # (path typed, name smbclient sends, status: the same from nimbus and Samba's smbd)
    ("../secret.txt", "\\secret.txt", "NT_STATUS_OBJECT_NAME_NOT_FOUND"),
    ("..\\secret.txt", "\\secret.txt", "NT_STATUS_OBJECT_NAME_NOT_FOUND"),
    ("sub\\..\\..\\secret.txt", "\\secret.txt", "NT_STATUS_OBJECT_NAME_NOT_FOUND"),
    ("../../{parent}/secret.txt", "\\{parent}\\secret.txt", "NT_STATUS_OBJECT_PATH_NOT_FOUND"),
    ("{to_root}{absolute}\\secret.txt", "{absolute}\\secret.txt", "NT_STATUS_OBJECT_PATH_NOT_FOUND"),
]


def fill_escape(template: str, share: Path) -> str:
    outside = share.parent
    return template.format(
        parent=outside.name,
        to_root="..\\" * (len(share.parts) - 1),  # parts[0] is "/"
        absolute=str(outside).replace("/", "\\"),
    )


@pytest.mark.parametrize(("path", "sent", "status"), DOTDOT_ESCAPES, ids=["dotdot-slash", "dotdot-backslash", "sub-dotdot-dotdot", "dotdot-dotdot-parent", "dotdots-to-root"])
def test_get_dotdot_path_refused(server, proto, samba_client_conf, client_dir, path, sent, status):
    share = server.share_path
    (share / "sub").mkdir()
    outside = share.parent / "secret.txt"
    outside.write_text(OUTSIDE_SECRET + "\n")
    path, sent = fill_escape(path, share), fill_escape(sent, share)
    # The test's own check: resolved from the share root, the path reaches the file outside.
    assert Path(os.path.normpath(share / path.replace("\\", "/"))) == outside

    rc, out = run_smbclient(server, proto, f'get "{path}" leak.txt', samba_client_conf, client_dir)
    assert rc != 0, out
    assert f"{status} opening remote file {sent}" in out, out
    assert OUTSIDE_SECRET not in out
    assert not (client_dir / "leak.txt").exists(), "smbclient wrote a local file although the open failed"


def test_get_dotdot_path_reaches_only_the_cleaned_name_inside_the_share(server, proto, samba_client_conf, client_dir):
    # With a file inside the share where the cleaned name points, smbclient
    # gets that one: never the file outside that the `..` named.
    share = server.share_path
    (share.parent / "secret.txt").write_text(OUTSIDE_SECRET + "\n")
    (share / "secret.txt").write_text("inside the share\n")
    rc, out = run_smbclient(server, proto, 'get "..\\secret.txt" got.txt', samba_client_conf, client_dir)
    assert rc == 0 and "NT_STATUS_" not in out, out
    assert (client_dir / "got.txt").read_text() == "inside the share\n"


@pytest.mark.parametrize(
    ("path", "secret"),
    [
        ("escape/passwd", "root:"),
        ("passwd-link", "root:"),
        ("parent-link/secret.txt", "SECRET-OUTSIDE-THE-SHARE"),
    ],
)
def test_get_through_escaping_symlink_refused(symlink_server, proto, samba_client_conf, client_dir, path, secret):
    rc, out = run_smbclient(symlink_server, proto, f'get "{path}" leak.txt', samba_client_conf, client_dir)
    assert_refused_without_leak(rc, out, client_dir / "leak.txt", secret)


def test_put_through_escaping_symlink_refused(symlink_server, proto, samba_client_conf, client_dir):
    (client_dir / "planted.txt").write_text("planted\n")
    rc, out = run_smbclient(symlink_server, proto, "put planted.txt parent-link/planted.txt", samba_client_conf, client_dir)
    assert rc != 0 and "NT_STATUS_" in out, out
    assert not (symlink_server.share_path.parent / "planted.txt").exists(), "a file was written outside the share"


def test_symlink_inside_share_followed(symlink_server, proto, samba_client_conf, client_dir):
    rc, out = run_smbclient(symlink_server, proto, "get inside-link got.txt", samba_client_conf, client_dir)
    assert rc == 0 and "NT_STATUS_" not in out, out
    assert (client_dir / "got.txt").read_text() == "inside the share\n"


# --------------------------------------------------------------------------
# read-only share


def test_readonly_share_allows_reading(readonly_server, proto, samba_client_conf, client_dir):
    rc, out = run_smbclient(readonly_server, proto, "get hello.txt", samba_client_conf, client_dir)
    assert rc == 0 and "NT_STATUS_" not in out, out
    assert (client_dir / "hello.txt").read_text() == "hello from a read-only share\n"


def test_readonly_share_refuses_put(readonly_server, proto, samba_client_conf, client_dir):
    (client_dir / "new.txt").write_text("new\n")
    rc, out = run_smbclient(readonly_server, proto, "put new.txt", samba_client_conf, client_dir)
    assert rc != 0
    assert re.search(r"NT_STATUS_(ACCESS_DENIED|MEDIA_WRITE_PROTECTED)", out), out
    assert not (readonly_server.share_path / "new.txt").exists()


def test_readonly_share_refuses_changes(readonly_server, proto, samba_client_conf, client_dir):
    for commands in ("mkdir newdir", "rm hello.txt", "rename hello.txt other.txt"):
        rc, out = run_smbclient(readonly_server, proto, commands, samba_client_conf, client_dir)
        assert re.search(r"NT_STATUS_(ACCESS_DENIED|MEDIA_WRITE_PROTECTED)", out), f"{commands}: {out}"
    assert sorted(p.name for p in readonly_server.share_path.iterdir()) == ["hello.txt"]
