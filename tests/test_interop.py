"""Interop details other clients rely on (issue 17, item 7), with raw
messages (tests/rawsmb.py) so that exactly the bytes in question are sent.

- The sync header's Reserved field (Windows' ProcessId) of a response is
  the request's: the Rust `smb` crate checks a response's signature
  against a header carrying its own value there, as Samba and Windows
  echo it.
- An SMB2_ENCRYPTION_CAPABILITIES context with CipherCount 0 (MS-SMB2
  2.2.3.1.2 forbids a client to send one; smb-rs does when it wants no
  encryption) offers no cipher, and is not a malformed request: NEGOTIATE
  succeeds with no encryption context in the response (smb-rs cannot decode
  a cipher id of 0; Samba ignores the context of such a client). A list
  with no cipher in common is answered with cipher 0 (MS-SMB2 3.3.5.4); a
  context too short for the count it states is still refused.
- The Rust `smb` crate itself (interop/smb-rs, built by scripts/test.sh)
  logs on at every dialect it speaks, signed, and encrypted at 3.x, and
  writes and reads a file back identical.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest
import rawsmb
from conftest import SHARE, built_binary

ENCRYPTION_CAPABILITIES = 0x0002


def with_reserved(message: bytes, value: int) -> bytes:
    return message[:32] + struct.pack("<I", value) + message[36:]


def reserved_of(message: bytes) -> int:
    return struct.unpack_from("<I", message, 32)[0]


def negotiate_contexts(resp: bytes) -> dict[int, bytes]:
    """The negotiate contexts of an SMB 3.1.1 NEGOTIATE response (MS-SMB2 2.2.4)."""
    body = rawsmb.HEADER_SIZE
    (count,) = struct.unpack_from("<H", resp, body + 6)
    (offset,) = struct.unpack_from("<I", resp, body + 60)
    out, at = {}, offset
    for _ in range(count):
        kind, length = struct.unpack_from("<HH", resp, at)
        out[kind] = resp[at + 8 : at + 8 + length]
        at += 8 + length
        at += (-at) % 8
    return out


def test_responses_carry_the_requests_reserved_value(server):
    s = rawsmb.connect(server.host, server.port)
    try:
        s.sendall(rawsmb.frame(with_reserved(rawsmb.header(rawsmb.NEGOTIATE, 0, credit_request=8), 0x00C0FFEE) + rawsmb.negotiate_body([0x0202, 0x0210])))
        resp = rawsmb.recv_message(s)
        assert rawsmb.status(resp) == 0
        assert reserved_of(resp) == 0x00C0FFEE
        # Windows' own value comes back as well.
        s.sendall(rawsmb.frame(with_reserved(rawsmb.header(rawsmb.ECHO, 1), 0xFEFF) + rawsmb.echo_body()))
        resp = rawsmb.recv_message(s)
        assert (rawsmb.status(resp), reserved_of(resp)) == (0, 0xFEFF)
    finally:
        s.close()


def test_an_empty_cipher_list_negotiates_no_encryption(server):
    s = rawsmb.connect(server.host, server.port)
    try:
        empty = struct.pack("<HHI", ENCRYPTION_CAPABILITIES, 2, 0) + struct.pack("<H", 0)
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.NEGOTIATE, 0) + rawsmb.negotiate_body([0x0311], [rawsmb.preauth_context(), empty])))
        resp = rawsmb.recv_message(s)
        assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
        assert struct.unpack_from("<H", resp, rawsmb.HEADER_SIZE + 4)[0] == 0x0311
        assert ENCRYPTION_CAPABILITIES not in negotiate_contexts(resp)
    finally:
        s.close()
    s = rawsmb.connect(server.host, server.port)
    try:
        unknown = struct.pack("<HHI", ENCRYPTION_CAPABILITIES, 4, 0) + struct.pack("<HH", 1, 0x0077)
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.NEGOTIATE, 0) + rawsmb.negotiate_body([0x0311], [rawsmb.preauth_context(), unknown])))
        resp = rawsmb.recv_message(s)
        assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
        assert negotiate_contexts(resp)[ENCRYPTION_CAPABILITIES] == struct.pack("<HH", 1, 0)  # one cipher: none
    finally:
        s.close()
    s = rawsmb.connect(server.host, server.port)
    try:
        short = struct.pack("<HHI", ENCRYPTION_CAPABILITIES, 2, 0) + struct.pack("<H", 2)  # two ciphers announced, none there
        s.sendall(rawsmb.frame(rawsmb.header(rawsmb.NEGOTIATE, 0) + rawsmb.negotiate_body([0x0311], [rawsmb.preauth_context(), short])))
        resp = rawsmb.recv_message(s)
        assert rawsmb.status(resp) == rawsmb.STATUS_INVALID_PARAMETER
    finally:
        s.close()


def smbrs_binary() -> Path:
    """The smb-rs client scripts/test.sh builds (NIMBUS_SMBRS_BIN)."""
    return built_binary(
        "NIMBUS_SMBRS_BIN",
        Path(__file__).resolve().parent.parent / "target" / "interop" / "release" / "nimbus-smb-rs-check",
        "CARGO_TARGET_DIR=target/interop cargo build --release --manifest-path interop/smb-rs/Cargo.toml",
    )


@pytest.mark.nimbus_only
@pytest.mark.parametrize(
    ("dialect", "encryption"),
    [("2.0.2", "disabled"), ("2.1", "disabled"), ("3.0", "disabled"), ("3.0.2", "disabled"), ("3.1.1", "disabled"), ("3.0", "required"), ("3.1.1", "required")],
)
def test_the_rust_smb_crate_logs_on_and_reads_back_what_it_wrote(server, dialect, encryption):
    """Signed at every dialect (the test server requires signing), encrypted
    where asked; 3 MB written in 64 KiB WRITEs and read back."""
    size = 3_000_000
    proc = subprocess.run(
        [str(smbrs_binary()), server.host, str(server.port), server.share, server.user, server.password, dialect, encryption, str(size)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (server.share_path / "smb-rs-check.bin").stat().st_size == size
