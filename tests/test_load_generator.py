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
def test_the_load_generator_reads_writes_and_locks_with_each_protection(server_factory, memory_dir, protection):
    """Plain needs a server that does not require signing: its TREE_CONNECT
    alone is signed (3.1.1), the rest go in clear."""
    server = server_factory.start(signing="auto", paths={SHARE: memory_dir})
    size = 4 << 20
    path = server.share_path / "small-io.bin"
    path.write_bytes(bytes(size))
    for op in ("read", "write", "lock"):
        r = run_load(server, "small-io.bin", "--connections", "2", "--depth", "8", "--op", op,
                     "--block", str(BLOCK), "--seconds", "1", "--protection", protection)  # fmt: skip
        assert r["requests"] > 16 and r["errors"] == 0, r
        assert r["bytes"] == (0 if op == "lock" else r["requests"] * BLOCK), r
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"], r
        assert r["signing"] == ("AesGmac" if protection == "signed" else ""), r
    data = path.read_bytes()
    assert len(data) == size

    # Every WRITE put a block of 0x5a at a multiple of the block, with its
    # offset in its first and last 8 bytes.
    def stamped(at: int) -> bytes:
        mark = struct.pack("<Q", at)
        return mark + b"\x5a" * (BLOCK - 16) + mark

    written = sum(1 for at in range(0, size, BLOCK) if data[at : at + BLOCK] == stamped(at))
    untouched = sum(1 for at in range(0, size, BLOCK) if data[at : at + BLOCK] == bytes(BLOCK))
    assert written > 0 and written + untouched == size // BLOCK, (written, untouched)
    log = server.log_path.read_text(errors="replace")
    assert "panicked at" not in log


def test_the_load_generator_is_refused_a_wrong_password(server_factory):
    server = server_factory.start()
    (server.share_path / "f.bin").write_bytes(bytes(1 << 16))
    proc = subprocess.run(
        [str(load_binary()), server.host, str(server.port), server.share, server.user, "not-the-password", "f.bin", "--seconds", "1"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 1 and "LOGON_FAILURE" in proc.stderr, proc.stdout + proc.stderr
