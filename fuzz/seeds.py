#!/usr/bin/env python3
"""Records real client traffic as seeds for the `connection` fuzz target.

Starts the release nimbus binary with a guest share, puts a recording proxy
in front of it, and runs Debian's smbclient through the proxy (anonymous
logon, one run per dialect). What each client sent is saved as one seed:
the raw byte stream, NBSS headers included, with the session ids the
server assigned rewritten to 1, 2, ... (the fuzz harness maps them back to
the sessions its own server creates, so the recorded logon replays).

    python3 fuzz/seeds.py            writes fuzz/seeds/connection/*.bin

From the same streams it cuts seeds for the decoder targets: each request
body prefixed with the selector byte of its decoder (wire_decoders), and the
SESSION_SETUP security buffers of one logon (auth_tokens).
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "seeds" / "connection"
COMMANDS = "put hello.txt; ls; get hello.txt -; mkdir d; cd d; put hello.txt h2; ls; del h2; cd ..; rmdir d; allinfo hello.txt; rename hello.txt bye.txt; del bye.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int) -> None:
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("nimbus did not start")


class Recorder:
    """A one-connection-at-a-time TCP proxy that keeps what the client sent."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.port = self.listener.getsockname()[1]
        self.streams: list[bytearray] = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.target_port))
            sent = bytearray()
            self.streams.append(sent)
            threading.Thread(target=self.pump, args=(client, server, sent), daemon=True).start()
            threading.Thread(target=self.pump, args=(server, client, None), daemon=True).start()

    @staticmethod
    def pump(src, dst, record):
        try:
            while data := src.recv(65536):
                if record is not None:
                    record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def renumber_sessions(stream: bytes) -> bytes:
    """Rewrites SessionId fields (MS-SMB2 2.2.1.2, offset 40) to 1, 2, ..."""
    out = bytearray(stream)
    ids: dict[int, int] = {}
    pos = 0
    while pos + 4 <= len(out):
        length = struct.unpack(">I", out[pos : pos + 4])[0] & 0xFFFFFF
        msg = pos + 4
        off = msg
        while off + 64 <= msg + length and out[off : off + 4] == b"\xfeSMB":
            sid = struct.unpack_from("<Q", out, off + 40)[0]
            if sid:
                struct.pack_into("<Q", out, off + 40, ids.setdefault(sid, len(ids) + 1))
            nxt = struct.unpack_from("<I", out, off + 20)[0]
            if not nxt:
                break
            off += nxt
        pos = msg + length
    return bytes(out)


# wire_decoders' selector byte for each command's request decoder.
DECODER = {0x0: 1, 0x1: 5, 0x3: 6, 0x5: 7, 0x6: 9, 0x7: 10, 0x8: 11, 0x9: 12, 0xA: 23, 0xB: 13, 0xE: 15, 0x10: 16, 0x11: 17}


def messages(stream: bytes):
    """Each SMB2 message (header and body) of a recorded stream."""
    pos = 0
    while pos + 4 <= len(stream):
        length = struct.unpack(">I", stream[pos : pos + 4])[0] & 0xFFFFFF
        frame = stream[pos + 4 : pos + 4 + length]
        off = 0
        while off + 64 <= len(frame) and frame[off : off + 4] == b"\xfeSMB":
            nxt = struct.unpack_from("<I", frame, off + 20)[0]
            yield frame[off : off + nxt] if nxt else frame[off:]
            if not nxt:
                break
            off += nxt
        pos += 4 + length


def derive_message_seeds(stream: bytes, tag: str) -> None:
    decoders = OUT.parent / "wire_decoders"
    auth = OUT.parent / "auth_tokens"
    decoders.mkdir(exist_ok=True)
    auth.mkdir(exist_ok=True)
    tokens = []
    for i, msg in enumerate(messages(stream)):
        command = struct.unpack_from("<H", msg, 12)[0]
        # Named by content, so equal inputs from different runs are kept once.
        for seed in (b"\x00" + msg[:64], bytes([DECODER[command]]) + msg[64:] if command in DECODER else None):
            if seed:
                (decoders / hashlib.sha1(seed).hexdigest()[:16]).write_bytes(seed)
        if command == 0x1 and len(msg) >= 64 + 24:
            off, length = struct.unpack_from("<HH", msg, 64 + 12)
            tokens.append(msg[off : off + length])
    if tokens:
        (auth / f"{tag}-logon").write_bytes(b"\xff".join(tokens))


def main() -> None:
    binary = ROOT / "target" / "release" / "nimbus"
    if not binary.exists():
        subprocess.run(["cargo", "build", "--release", "-p", "nimbus"], cwd=ROOT, check=True)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "share").mkdir()
        (tmp / "hello.txt").write_bytes(b"hello, fuzzer\n" * 64)
        subprocess.run([str(binary), "user", "add", "seed", "--db", str(tmp / "users.db"), "--password-stdin"], input="seed-password\n", text=True, check=True, stdout=subprocess.DEVNULL)
        port = free_port()
        (tmp / "nimbus.toml").write_text(
            f'listen = ["127.0.0.1:{port}"]\nuser_db = "{tmp}/users.db"\n[security]\nsigning = "auto"\n'
            f'[[share]]\nname = "share"\npath = "{tmp}/share"\nguest_ok = true\n'
        )
        server = subprocess.Popen([str(binary), "serve", "--config", str(tmp / "nimbus.toml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(port)
            recorder = Recorder(port)
            for proto in ("SMB2_02", "SMB2_10", "SMB3_00", "SMB3_02", "SMB3_11"):
                before = len(recorder.streams)
                subprocess.run(
                    ["smbclient", "//127.0.0.1/share", "-N", "-p", str(recorder.port), "-m", proto, "--option=client min protocol=SMB2_02", "-c", COMMANDS],
                    cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False,
                )
                time.sleep(0.3)
                for i, stream in enumerate(recorder.streams[before:]):
                    if stream:
                        path = OUT / f"smbclient-anonymous-{proto.lower()}-{i}.bin"
                        path.write_bytes(renumber_sessions(bytes(stream)))
                        derive_message_seeds(bytes(stream), f"{proto.lower()}-{i}")
                        print(f"{path.relative_to(ROOT)}: {len(stream)} bytes")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
