"""A real etcd cluster on the loopback interface, for tests of cluster state.

    with EtcdCluster(tmp_path / "etcd") as cluster:
        cluster.etcdctl("put", "k", "v")
        cluster.stop_member(2)          # one of three gone: quorum kept
        ...

or, in a test, the `etcd_cluster` fixture (`from etcd_cluster import
etcd_cluster`), which yields a started three-member cluster and stops it
at the end of the test.

Each member is Debian's etcd 3.4 (`/usr/bin/etcd`, package etcd-server)
with its own data directory and log file under `base_dir`, listening only
on 127.0.0.1 on client and peer ports picked free. Elections are fast
(50 ms heartbeats, 500 ms election timeout): on loopback a lost leader is
replaced in about a second, so a test of a partition does not wait long.

Stopping members simulates a partition: with two of three stopped the last
one cannot commit a write, and with all stopped the cluster does not
answer. `start_member` starts a member again on its existing data
directory and ports, so it rejoins the same cluster.

Waits are bounded and poll the cluster's own answer (`etcdctl endpoint
health`); every etcdctl call has a command timeout and a process timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import _SERVERS, free_port, in_ci, wait_for_port

ETCD = "etcd"
ETCDCTL = "etcdctl"
HEARTBEAT_MS = 50
ELECTION_MS = 500  # ten heartbeats, as etcd advises
QUOTA_BYTES = 64 * 1024 * 1024  # a test stores kilobytes; etcd's default is 2 GiB
START_TIMEOUT = 30.0  # until every member reports healthy
STOP_TIMEOUT = 10.0  # SIGTERM (etcd hands over leadership), then SIGKILL
COMMAND_TIMEOUT = 5.0  # etcdctl --command-timeout
DIAL_TIMEOUT = 2.0  # etcdctl --dial-timeout
PROCESS_SLACK = 5.0  # etcdctl's own start and exit, beyond its timeouts
HEALTH_POLL = 0.1  # pause between health polls while waiting to be ready
HEALTH_FIRST_TIMEOUT = 0.25  # the first health poll's command timeout; doubled on each failure
LOG_TAIL_LINES = 40
START_ATTEMPTS = 3  # a port picked free can be taken before etcd binds it


class EtcdError(RuntimeError):
    """An etcdctl command failed or did not finish; carries its stderr."""

    def __init__(self, cmd: list[str], message: str, stderr: str = ""):
        super().__init__(f"`{' '.join(cmd)}` {message}\nstderr:\n{stderr}")
        self.cmd = cmd
        self.stderr = stderr


class Member:
    """One etcd process: its name, ports, data directory and log file.

    `kind`, `log_path` and `log_tail()` match conftest's Server, so a failed
    test's report carries each member's log.
    """

    def __init__(self, name: str, base_dir: Path):
        self.name = name
        self.kind = f"etcd {name}"
        self.data_dir = base_dir / f"{name}.etcd"
        self.log_path = base_dir / f"{name}.log"
        self.client_port = 0
        self.peer_port = 0
        self.process: subprocess.Popen | None = None

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def launch(self, initial_cluster: str, token: str) -> None:
        args = [
            f"--name={self.name}",
            f"--data-dir={self.data_dir}",
            f"--listen-client-urls={self.client_url}",
            f"--advertise-client-urls={self.client_url}",
            f"--listen-peer-urls={self.peer_url}",
            f"--initial-advertise-peer-urls={self.peer_url}",
            # Read only on the first start: a member with a data directory
            # takes the cluster from it, which is how a restart rejoins.
            f"--initial-cluster={initial_cluster}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={token}",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_MS}",
            f"--quota-backend-bytes={QUOTA_BYTES}",
            "--logger=zap",
            f"--log-outputs={self.log_path}",
        ]
        # ETCD_* variables would set flags behind our back.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
        # zap appends to the log; stderr (a Go panic, a flag error) joins it.
        with open(self.log_path, "ab") as log:
            log.write(f"### {ETCD} {' '.join(args)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [ETCD, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.data_dir.parent,
            )

    def terminate(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def reap(self, deadline: float) -> None:
        """Wait for the process until `deadline`, then kill it."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT)

    def stop(self) -> None:
        self.terminate()
        self.reap(time.monotonic() + STOP_TIMEOUT)


class EtcdCluster:
    """`members` etcd processes forming one cluster on 127.0.0.1."""

    def __init__(self, base_dir: Path, members: int = 3):
        if members < 1:
            raise ValueError("a cluster needs at least one member")
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.members = [Member(f"m{i}", self.base_dir) for i in range(members)]
        self.token = ""
        self._initial_cluster = ""

    # ---------------------------------------------------------------- life

    def start(self) -> None:
        """Start every member and wait until all of them report healthy.

        On failure everything is stopped and the error carries the tail of
        each member's log.

        Takes 0.2 to 2.3 s (measured): on a first start each member asks its
        peers whether the cluster exists and gives a peer that is itself
        still starting a second to answer; etcd 3.4 has no flag for it.
        """
        error: Exception | None = None
        for _attempt in range(START_ATTEMPTS):
            self._new_identity()
            try:
                for m in self.members:
                    m.launch(self._initial_cluster, self.token)
                self.wait_healthy(timeout=START_TIMEOUT)
                return
            except (RuntimeError, TimeoutError) as e:
                error = e
                self.stop()
                if not any("address already in use" in m.log_tail(10) for m in self.members):
                    break
            except BaseException:  # etcd missing, interrupted: leave nothing running
                self.stop()
                raise
        raise RuntimeError(f"etcd cluster did not start: {error}\n{self.log_tails()}")

    def stop(self) -> None:
        """Stop every member, one after the other: SIGTERM, then SIGKILL if
        it has not exited after STOP_TIMEOUT. Safe to call again, or on a
        cluster never started.

        Not all at once: a leader that gets SIGTERM hands leadership to its
        best-connected peer first, and if that peer is stopping too, the
        leader waits out etcd's request timeout (measured: 6 s per stop
        against 0.1 s one at a time). Stopped in turn, a leader either hands
        over to a live peer at once or, with no peer left, skips the
        hand-over.
        """
        for m in self.members:
            m.stop()

    def stop_member(self, i: int) -> None:
        """Stop member `i` (its data directory stays), as if cut off."""
        self.members[i].stop()

    def start_member(self, i: int) -> None:
        """Start member `i` again on its data directory and ports: it rejoins
        the cluster. Waits only until it listens, since it cannot be healthy
        before a quorum is back; use `wait_healthy` for that."""
        m = self.members[i]
        if m.alive():
            return
        if not m.data_dir.is_dir():
            raise RuntimeError(f"member {m.name} was never started")
        m.launch(self._initial_cluster, self.token)
        try:
            wait_for_port("127.0.0.1", m.client_port, m.process, timeout=START_TIMEOUT)
        except (RuntimeError, TimeoutError) as e:
            m.stop()
            raise RuntimeError(f"etcd {m.name} did not start again: {e}\n{m.log_tail()}") from e

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -------------------------------------------------------------- access

    @property
    def endpoints(self) -> list[str]:
        """Client URLs of all members, running or not, in member order."""
        return [m.client_url for m in self.members]

    def etcdctl(self, *args: str, endpoints: list[str] | None = None, timeout: float = COMMAND_TIMEOUT) -> str:
        """Run `etcdctl` (API v3) against `endpoints` (default: all members)
        and return its stdout; raise EtcdError with its stderr if it fails
        or outlives its timeouts."""
        eps = self.endpoints if endpoints is None else endpoints
        cmd = [
            ETCDCTL,
            f"--endpoints={','.join(eps)}",
            f"--dial-timeout={DIAL_TIMEOUT:g}s",
            f"--command-timeout={timeout:g}s",
            *args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
        env["ETCDCTL_API"] = "3"
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                timeout=DIAL_TIMEOUT + timeout + PROCESS_SLACK,
            )
        except subprocess.TimeoutExpired as e:
            stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            raise EtcdError(cmd, f"did not exit within {e.timeout:g} s", stderr) from None
        if proc.returncode != 0:
            raise EtcdError(cmd, f"exited {proc.returncode}", proc.stderr)
        return proc.stdout

    def wait_healthy(self, timeout: float = START_TIMEOUT, endpoints: list[str] | None = None) -> None:
        """Poll `etcdctl endpoint health` until every endpoint (default: all
        members) answers healthy, which needs a leader and a quorum.

        Raises RuntimeError at once if a member process has exited, and
        TimeoutError, with the last answer, after `timeout` seconds.
        """
        eps = self.endpoints if endpoints is None else endpoints
        deadline = time.monotonic() + timeout
        last = ""
        # Before a leader exists a health check blocks for its whole command
        # timeout, so start short (a healthy loopback cluster answers in
        # milliseconds) and double it, in case a loaded machine is slower.
        poll_timeout = HEALTH_FIRST_TIMEOUT
        while True:
            for m in self.members:
                if m.client_url in eps and m.process is not None and m.process.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited with status {m.process.returncode}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"etcd endpoints {eps} not healthy within {timeout:g} s; last answer:\n{last}")
            try:
                self.etcdctl("endpoint", "health", endpoints=eps, timeout=max(0.1, min(poll_timeout, remaining)))
                return
            except EtcdError as e:
                last = e.stderr.strip()
            poll_timeout = min(2 * poll_timeout, COMMAND_TIMEOUT)
            time.sleep(HEALTH_POLL)

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(f"--- etcd {m.name} log, last {lines} lines of {m.log_path} ---\n{m.log_tail(lines)}" for m in self.members)

    # ------------------------------------------------------------ internal

    def _new_identity(self) -> None:
        """Fresh ports, token and data directories for a first start."""
        ports: list[int] = []
        while len(ports) < 2 * len(self.members):
            p = free_port()
            if p not in ports:  # the kernel may hand the same port out twice
                ports.append(p)
        for m, (client, peer) in zip(self.members, zip(ports[0::2], ports[1::2])):
            m.client_port, m.peer_port = client, peer
            shutil.rmtree(m.data_dir, ignore_errors=True)
        self.token = f"nimbus-test-{uuid.uuid4().hex}"
        self._initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)


def require_etcd() -> None:
    """Skip the test when etcd is not installed; under CI=true, fail it."""
    for name, package in ((ETCD, "etcd-server"), (ETCDCTL, "etcd-client")):
        if shutil.which(name) is None:
            message = f"{name} not installed (apt-get install {package})"
            if in_ci():
                pytest.fail(f"{message}; CI=true: a missing program fails the test instead of skipping it", pytrace=False)
            pytest.skip(message)


@pytest.fixture
def etcd_cluster(request, tmp_path) -> Iterator[EtcdCluster]:
    """A started three-member etcd cluster, stopped after the test; a failed
    test's report carries each member's log."""
    require_etcd()
    cluster = EtcdCluster(tmp_path / "etcd")
    request.node.stash.setdefault(_SERVERS, []).extend(cluster.members)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
