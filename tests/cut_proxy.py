"""A TCP proxy on the loopback interface whose link a test can cut and heal
while it runs: what a partition looks like to the programs on either side.

    with CutProxy("127.0.0.1", etcd_port) as p:
        point a program at 127.0.0.1:p.port
        p.blackhole()   # as a dead switch port: nothing gets through
        p.refuse()      # as a host that is up but not listening
        p.heal()        # forwarding again

Modes, switched at run time (each switch is complete when the call returns):

- pass (`heal()`): every connection accepted is forwarded to the target.
- `blackhole()`: every forwarded connection is reset (a close with
  SO_LINGER 0 sends RST) on both sides. New connections are accepted and
  held open, never forwarded and never answered, until `heal()` resets
  them: what was sent into a dead link is lost, not delivered late.
- `refuse()`: forwarded connections are reset and the listening socket is
  closed, so that a connect() fails at once with ECONNREFUSED; `heal()`
  listens on the same port again.

Ports are picked below the kernel's ephemeral range, so that no outgoing
connection takes a proxy's port while it is not listening.

Bounded: at most `max_connections` forwarded and `max_held` held
connections at a time (past the first a new connection is reset at once
and counted in `overflows`; past the second new connections wait in the
listen backlog, as silent as the held ones, and are reset by `heal()`),
and every thread stops by itself after `lifetime` seconds, at the latest
when the context exits.

`RotatingProxy` forwards each new connection to the next of several
targets in turn: a client that opens three connections to it talks to
three servers, as a client behind a round-robin DNS name or load balancer
in front of a cluster would.
"""

from __future__ import annotations

import random
import select
import socket
import struct
import threading
import time
from pathlib import Path

PASS, BLACKHOLE, REFUSE = "pass", "blackhole", "refuse"
POLL = 0.05  # how often idle threads look at the mode and the stop flag, in seconds
CHUNK = 256 * 1024
MAX_BUFFERED = 4 * 1024 * 1024  # per direction of a forwarded connection; reading pauses beyond it
BACKLOG = 128
CONNECT_TIMEOUT = 2.0  # to the target, which is on this machine
SWITCH_TIMEOUT = 5.0  # until every forwarded connection has been reset
PORT_ATTEMPTS = 200


def _reset(s: socket.socket) -> None:
    """Close `s` so that the peer gets RST instead of FIN."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()


def _listen_port_range() -> tuple[int, int]:
    """Ports outside the kernel's ephemeral range (which connect() takes
    local ports from)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return 10000, max(10001, low - 1)


def _listener(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # A forwarded connection this side closed first lingers in TIME_WAIT
        # on the port; listening again must not wait for it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(BACKLOG)
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


class _Link:
    """One forwarded connection: the accepted socket and the one to the
    target, copied both ways by one thread."""

    def __init__(self, client: socket.socket, server: socket.socket):
        self.client, self.server = client, server
        self.cut = threading.Event()  # set by a switch: reset both sides
        self.done = threading.Event()  # set by the thread when both are closed


class CutProxy:
    def __init__(self, host: str, port: int, *, max_connections: int = 64, max_held: int = 64, lifetime: float = 300):
        self.targets = [(host, port)]
        self.forwarded = [0]  # connections forwarded to each target
        self.max_connections = max_connections
        self.max_held = max_held
        self.deadline = time.monotonic() + lifetime
        self.mode = PASS
        self.accepted = 0  # connections accepted, in any mode
        self.overflows = 0  # connections reset because max_connections were forwarded
        self.resets = 0  # connections reset by a switch or an overflow
        self.errors: list[str] = []  # what went wrong in the proxy itself (a test should find none)
        self._lock = threading.Lock()  # mode, listener, links and held sockets
        self._stop = threading.Event()
        self._links: list[_Link] = []
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._sock = self._bind()
        self.port = self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> CutProxy:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------- switches

    def heal(self) -> None:
        """Forward again: held connections and any still in the backlog are
        reset, new ones are forwarded."""
        with self._lock:
            for s in self._held:
                _reset(s)
                self.resets += 1
            self._held.clear()
            if self._sock is None:
                try:
                    self._sock = _listener(self.port)
                except OSError as e:
                    self.errors.append(f"cannot listen on 127.0.0.1:{self.port} again: {e}")
                    raise
            else:
                self._reset_backlog()
            self.mode = PASS

    def blackhole(self) -> None:
        """Reset every forwarded connection; hold new ones silent."""
        self._cut(BLACKHOLE)

    def refuse(self) -> None:
        """Reset every forwarded connection; refuse new ones."""
        self._cut(REFUSE)

    def _cut(self, mode: str) -> None:
        self._await_resets(self._begin_cut(mode))

    def _begin_cut(self, mode: str) -> list[_Link]:
        """Switches to `mode` and tells every forwarded connection's thread
        to reset it; returns them."""
        with self._lock:
            self.mode = mode
            links = list(self._links)
            for link in links:
                link.cut.set()
            if mode == REFUSE and self._sock is not None:
                # shutdown() stops the listening at once; close() alone
                # would not while the accepting thread's select() still
                # holds the socket. Connections in the backlog are reset.
                try:
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self._sock.close()
                self._sock = None
        return links

    def _await_resets(self, links: list[_Link]) -> None:
        """Each link's thread resets its sockets within POLL; a switch is
        complete once they all have."""
        deadline = time.monotonic() + SWITCH_TIMEOUT
        for link in links:
            if not link.done.wait(max(0.0, deadline - time.monotonic())):
                self.errors.append(f"a forwarded connection was not reset within {SWITCH_TIMEOUT:g} s")

    def close(self) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(timeout=SWITCH_TIMEOUT)
        with self._lock:
            for s in self._held:
                _reset(s)
            self._held.clear()
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    # ------------------------------------------------------------- internal

    def _bind(self) -> socket.socket:
        low, high = _listen_port_range()
        error: OSError | None = None
        for _ in range(PORT_ATTEMPTS):
            try:
                return _listener(random.randint(low, high))
            except OSError as e:
                error = e
        raise RuntimeError(f"no free port in {low}-{high} to listen on: {error}")

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self.deadline

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _reset_backlog(self) -> None:
        """Reset the connections waiting in the listen backlog (called with
        the lock held, the listener non-blocking)."""
        while True:
            try:
                s, _ = self._sock.accept()
            except OSError:  # BlockingIOError: none left
                return
            self.accepted += 1
            self.resets += 1
            _reset(s)

    def _accept(self) -> None:
        while self._running():
            with self._lock:
                sock, mode = self._sock, self.mode
                held_full = mode == BLACKHOLE and len(self._held) >= self.max_held
            if sock is None or held_full:
                # Not listening, or holding all it may: new connections are
                # refused by the kernel, or wait in the backlog.
                self._stop.wait(POLL)
                continue
            try:
                if not select.select([sock], [], [], POLL)[0]:
                    continue
            except (OSError, ValueError):  # closed by refuse() meanwhile
                continue
            with self._lock:
                if sock is not self._sock:
                    continue
                try:
                    client, _ = sock.accept()
                except OSError:  # BlockingIOError: taken by _reset_backlog
                    continue
                self.accepted += 1
                if self.mode == BLACKHOLE:
                    self._held.append(client)
                    continue
                if self.mode == REFUSE:  # not reached: refuse() closes the listener
                    _reset(client)
                    self.resets += 1
                    continue
                if len(self._links) >= self.max_connections:
                    _reset(client)
                    self.overflows += 1
                    self.resets += 1
                    continue
            with self._lock:
                n = sum(self.forwarded) % len(self.targets)
                self.forwarded[n] += 1
            try:
                server = socket.create_connection(self.targets[n], timeout=CONNECT_TIMEOUT)
            except OSError:
                # The target refused: so does the proxy.
                _reset(client)
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setblocking(False)
            link = _Link(client, server)
            with self._lock:
                # A switch between the accept and now has not seen this link.
                if self.mode != PASS:
                    link.cut.set()
                self._links.append(link)
            self._spawn(self._pump, link)

    def _pump(self, link: _Link) -> None:
        """Copies both ways without blocking, until either side closes, the
        link is cut or the proxy stops."""
        peer = {link.client: link.server, link.server: link.client}
        outbox = {link.client: bytearray(), link.server: bytearray()}  # bytes waiting to be sent to the key
        reset = True
        try:
            while self._running() and not link.cut.is_set():
                readable = [s for s in peer if len(outbox[peer[s]]) < MAX_BUFFERED]
                writable = [s for s in peer if outbox[s]]
                r, w, _ = select.select(readable, writable, [], POLL)
                if link.cut.is_set():
                    break
                for s in w:
                    try:
                        sent = s.send(outbox[s])
                    except BlockingIOError:
                        continue
                    del outbox[s][:sent]
                closed = False
                for s in r:
                    try:
                        data = s.recv(CHUNK)
                    except BlockingIOError:
                        continue
                    if not data:
                        closed = True
                        break
                    outbox[peer[s]] += data
                if closed:
                    # One side closed in order: forward what it sent before
                    # its FIN, then close the other side in order too.
                    for s, data in outbox.items():
                        if data:
                            s.setblocking(True)
                            s.settimeout(POLL * 10)
                            s.sendall(data)
                    reset = False
                    break
        except OSError:  # a side reset the connection: reset the other
            pass
        finally:
            for s in (link.client, link.server):
                if reset:
                    _reset(s)
                else:
                    s.close()
            with self._lock:
                if reset:
                    self.resets += 1
                if link in self._links:
                    self._links.remove(link)
            link.done.set()


class RotatingProxy(CutProxy):
    """A CutProxy that forwards the first connection to the first target,
    the second to the second, and so on round the list."""

    def __init__(self, targets: list[tuple[str, int]], **kwargs):
        super().__init__(*targets[0], **kwargs)
        self.targets = list(targets)
        self.forwarded = [0] * len(targets)

    def rewind(self) -> None:
        """The next connection goes to the first target again."""
        with self._lock:
            self.forwarded = [0] * len(self.targets)


class ProxySet:
    """One CutProxy per target, switched together: a program given
    `urls` instead of the targets' loses all of them at once."""

    def __init__(self, targets: list[tuple[str, int]], **kwargs):
        self.proxies: list[CutProxy] = []
        try:
            for host, port in targets:
                self.proxies.append(CutProxy(host, port, **kwargs))
        except BaseException:
            self.close()
            raise

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies]

    @property
    def errors(self) -> list[str]:
        return [e for p in self.proxies for e in p.errors]

    @property
    def overflows(self) -> int:
        return sum(p.overflows for p in self.proxies)

    def __enter__(self) -> ProxySet:
        for p in self.proxies:
            p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def heal(self) -> None:
        for p in self.proxies:
            p.heal()

    def blackhole(self) -> None:
        self._cut(BLACKHOLE)

    def refuse(self) -> None:
        self._cut(REFUSE)

    def _cut(self, mode: str) -> None:
        # All links are cut before waiting for any: the targets are lost
        # together, not one after another.
        pending = [(p, p._begin_cut(mode)) for p in self.proxies]
        for p, links in pending:
            p._await_resets(links)

    def close(self) -> None:
        for p in self.proxies:
            p.close()
