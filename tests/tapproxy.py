"""A recording TCP proxy on the loopback interface: what a client and the
server really sent each other, cut into NBSS frames (MS-SMB2 2.1: a zero
byte and a 24-bit length before each message).

    with TapProxy(server.host, server.port) as tap:
        run a client against 127.0.0.1:tap.port
    for direction, message in tap.frames(): ...

Bounded: at most `max_connections` client connections (more are closed at
once), at most `max_bytes` recorded per connection (beyond it the proxy
stops forwarding and `overflowed` is set, so a test cannot pass on a
partial record), and every thread stops by itself after `lifetime`
seconds, at the latest when the context exits.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

TO_SERVER = "client->server"
TO_CLIENT = "server->client"

SMB2_PROTOCOL_ID = b"\xfeSMB"
TRANSFORM_PROTOCOL_ID = b"\xfdSMB"
SESSION_SETUP = 0x0001
TREE_CONNECT = 0x0003
STATUS_SUCCESS = 0
POLL = 0.2  # how often blocked threads look at the stop flag, in seconds


@dataclass
class Frame:
    direction: str
    message: bytes  # the NBSS payload: an SMB2 message or a TRANSFORM

    @property
    def encrypted(self) -> bool:
        return self.message.startswith(TRANSFORM_PROTOCOL_ID)

    @property
    def clear(self) -> bool:
        return self.message.startswith(SMB2_PROTOCOL_ID)

    def __repr__(self) -> str:
        kind = "TRANSFORM" if self.encrypted else f"command {self.command()}" if self.clear else "unknown"
        return f"<{self.direction} {kind}, {len(self.message)} bytes>"

    def command(self) -> int | None:
        """The first header's Command of a clear SMB2 message (MS-SMB2 2.2.1)."""
        return struct.unpack_from("<H", self.message, 12)[0] if self.clear and len(self.message) >= 64 else None

    def status(self) -> int | None:
        return struct.unpack_from("<I", self.message, 8)[0] if self.clear and len(self.message) >= 64 else None


@dataclass
class Tap:
    """One proxied connection: its frames in the order they were forwarded."""

    frames: list[Frame] = field(default_factory=list)
    # The raw bytes of each direction, frame headers included.
    streams: dict[str, bytearray] = field(default_factory=lambda: {TO_SERVER: bytearray(), TO_CLIENT: bytearray()})
    overflowed: bool = False


class TapProxy:
    def __init__(self, host: str, port: int, *, max_connections: int = 4, max_bytes: int = 256 * 1024 * 1024, lifetime: float = 300):
        self.target = (host, port)
        self.max_connections = max_connections
        self.max_bytes = max_bytes
        self.deadline = time.monotonic() + lifetime
        self.taps: list[Tap] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL)
        self.port = self._listener.getsockname()[1]

    def __enter__(self) -> TapProxy:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def overflowed(self) -> bool:
        return any(t.overflowed for t in self.taps)

    def frames(self) -> list[Frame]:
        """Every connection's frames, one connection after another."""
        with self._lock:
            return [f for t in self.taps for f in t.frames]

    def stream(self, direction: str) -> bytes:
        """Every byte sent in one direction, over all connections."""
        with self._lock:
            return b"".join(bytes(t.streams[direction]) for t in self.taps)

    def close(self) -> None:
        self._stop.set()
        self._shutdown_all()
        for t in list(self._threads):
            t.join(timeout=5)
        for s in [self._listener, *self._sockets]:
            s.close()

    # ----------------------------------------------------------------------

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self.deadline

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while self._running():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if len(self.taps) >= self.max_connections:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(None)  # sendall waits for a slow reader; _shutdown_all unblocks it
            tap = Tap()
            with self._lock:
                self.taps.append(tap)
                self._sockets += [client, server]
            self._spawn(self._pump, tap, client, server, TO_SERVER)
            self._spawn(self._pump, tap, server, client, TO_CLIENT)
        self._shutdown_all()

    def _shutdown_all(self) -> None:
        """Unblocks every pump (a blocked recv or sendall returns)."""
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _pump(self, tap: Tap, src: socket.socket, dst: socket.socket, direction: str) -> None:
        """Copies src to dst. Each complete frame is recorded before the bytes
        that end it are forwarded, so an answer is never recorded before the
        request it answers."""
        pending = bytearray()
        while self._running():
            try:
                if not select.select([src], [], [], POLL)[0]:
                    continue
                chunk = src.recv(1024 * 1024)
            except (OSError, ValueError):  # ValueError: closed meanwhile
                break
            if not chunk:
                break
            with self._lock:
                if len(tap.streams[TO_SERVER]) + len(tap.streams[TO_CLIENT]) + len(chunk) > self.max_bytes:
                    tap.overflowed = True
                    break
                tap.streams[direction] += chunk
                pending += chunk
                while len(pending) >= 4:
                    length = struct.unpack_from(">I", pending)[0] & 0xFFFFFF
                    if len(pending) < 4 + length:
                        break
                    if pending[0] == 0:  # a session message; 0x85 is a keep-alive (RFC 1002 4.3.1)
                        tap.frames.append(Frame(direction, bytes(pending[4 : 4 + length])))
                    del pending[: 4 + length]
            try:
                dst.sendall(chunk)
            except OSError:
                break
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass
