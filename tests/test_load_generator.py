"""nimbus-io-load (crates/nimbus-load), bench/small_io.py's client, against
the real server. Not a benchmark: each run lasts a second, only to show
that every operation and protection works and that what the generator
wrote lands where its WRITEs put it. It builds its frames with the
server's own codecs, so these runs also check it against the server's
NTLM, key derivation, signing and sealing, not against itself: a key or
signature of its own making the server did not derive is refused."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, SHARE, built_binary

pytestmark = pytest.mark.nimbus_only

BLOCK = 4096


def load_binary() -> Path:
    return built_binary("NIMBUS_IO_LOAD_BIN", REPO / "target" / "release" / "nimbus-io-load", "cargo build --release -p nimbus-load")


def run_load(server, name: str, *args: str) -> dict:
    proc = subprocess.run(
        [str(load_binary()), server.host, str(server.port), server.share, server.user, server.password, name, *args],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["measuring", "done"], proc.stdout
    return json.loads(lines[2])


@pytest.mark.parametrize("protection", ["plain", "signed", "encrypted"])
@pytest.mark.parametrize("place", ["disk", "memory"])
def test_the_load_generator_reads_writes_locks_and_cycles_with_each_protection(server_factory, request, protection, place):
    """A second each of random 4 KiB READs, WRITEs, lock/unlock pairs and
    open / read / close cycles, 8 in flight on each of 2 connections, then
    cycles at a fixed rate from 20 connections. Plain needs a server that
    does not require signing: its TREE_CONNECT alone is signed (3.1.1),
    the rest go in clear. On a share in memory (tmpfs) small WRITEs run on
    the connection's task; on one on disk (ext4, which refuses RWF_NOWAIT
    writes) they go to the blocking pool
    (crates/nimbus-node/src/connection/frames.rs, `quick_write`)."""
    paths = {SHARE: request.getfixturevalue("memory_dir")} if place == "memory" else None
    server = server_factory.start(signing="auto", paths=paths)
    size = 4 << 20
    path = server.share_path / "small-io.bin"
    # Every block stamped as a WRITE stamps it: --verify checks that each
    # READ's data is the block it asked for, before and after the WRITEs.
    path.write_bytes(b"".join(stamped(at) for at in range(0, size, BLOCK)))
    runs = [["--connections", "2", "--depth", "8", "--op", op] for op in ("read", "write", "lock", "cycle")]
    runs.append(["--connections", "20", "--depth", "1", "--op", "cycle", "--rate", "200"])
    for run in runs:
        r = run_load(server, "small-io.bin", *run, "--block", str(BLOCK), "--seconds", "1", "--protection", protection, "--verify")
        assert r["requests"] > 16, r
        assert r["p50_us"] > 0, r
        assert r["signing"] == ("AesGmac" if protection == "signed" else ""), r
        if "--rate" in run:
            # 200 a second for a second, give or take the last turns: never
            # more; fewer when a loaded machine holds the cycles up, but not
            # the few of a generator that ignores its rate's schedule.
            assert 100 <= r["requests"] <= 210, r
    # Every WRITE put its block where its offset says: the file is as it
    # was stamped, block for block.
    data = path.read_bytes()
    assert len(data) == size
    misplaced = [at for at in range(0, size, BLOCK) if data[at : at + BLOCK] != stamped(at)]
    assert not misplaced, misplaced[:8]
    assert "panicked at" not in server.log_path.read_text(errors="replace")


@pytest.mark.parametrize("protection", ["plain", "encrypted"])
def test_large_answers_made_in_place_arrive_whole_when_the_socket_fills(server_factory, memory_dir, protection):
    """64 KiB READs, which the server answers on the connection's own task,
    64 in flight on each of 2 connections: the reader writes its answers
    itself (crates/nimbus-node/src/connection/send.rs), fills the socket,
    and leaves a message it wrote in part for the writer task to finish
    before anything else. Every answer must arrive whole, in its own seal
    (or unsigned frame), holding its own block."""
    server = server_factory.start(signing="auto", paths={SHARE: memory_dir})
    size = 16 << 20
    path = server.share_path / "large-answers.bin"
    path.write_bytes(b"".join(stamped(at) for at in range(0, size, BLOCK)))
    r = run_load(server, "large-answers.bin", "--connections", "2", "--depth", "64", "--op", "read",
                 "--block", str(64 << 10), "--seconds", "2", "--protection", protection, "--verify")  # fmt: skip
    assert r["requests"] > 128, r
    assert "panicked at" not in server.log_path.read_text(errors="replace")


def test_a_read_of_the_wrong_block_fails_the_run(server_factory, memory_dir):
    """--verify can fail: in a file of zeros no READ's data begins with
    its offset but the first block's."""
    server = server_factory.start(signing="auto", paths={SHARE: memory_dir})
    (server.share_path / "zeros.bin").write_bytes(bytes(1 << 20))
    proc = subprocess.run(
        [str(load_binary()), server.host, str(server.port), server.share, server.user, server.password, "zeros.bin",
         "--depth", "4", "--seconds", "1", "--protection", "signed", "--verify"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1 and "does not begin with its offset" in proc.stderr, proc.stdout + proc.stderr


def stamped(at: int) -> bytes:
    """A WRITE's block: 0x5a with its offset in its first and last 8 bytes."""
    mark = struct.pack("<Q", at)
    return mark + b"\x5a" * (BLOCK - 16) + mark


def test_the_load_generator_is_refused_a_wrong_password(server_factory):
    server = server_factory.start()
    (server.share_path / "f.bin").write_bytes(bytes(1 << 16))
    proc = subprocess.run(
        [str(load_binary()), server.host, str(server.port), server.share, server.user, "not-the-password", "f.bin", "--seconds", "1"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1 and "LOGON_FAILURE" in proc.stderr, proc.stdout + proc.stderr
