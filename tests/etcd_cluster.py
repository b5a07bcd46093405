"""A real etcd cluster on the loopback interface, for tests of cluster state.

    with EtcdCluster(tmp_path / "etcd") as cluster:
        cluster.etcdctl("put", "k", "v")
        cluster.stop_member(2)          # one of three gone: quorum kept
        ...

or, in a test, the `etcd_cluster` fixture (`from etcd_cluster import
etcd_cluster`), which yields a started three-member cluster and stops it
at the end of the test (`plain_etcd_cluster`: the same without TLS).

Each member is Debian's etcd 3.4 (`/usr/bin/etcd`, package etcd-server)
with its own data directory and log file under `base_dir`, listening only
on 127.0.0.1 on client and peer ports picked free.

By default (`tls=True`) the cluster is set up as in production: clients and
peers speak TLS only, with certificates of a CA made for the cluster (`Pki`,
openssl), each side must show one that CA signed (`--client-cert-auth`,
`--peer-client-cert-auth`), and etcd's authentication is on. A node is the
etcd user named by its certificate's CN, `nimbus-node`, whose one role
grants readwrite on the prefix `/nimbus/` and nothing else;
`node_toml_lines()` gives the `[cluster]` lines that reach the cluster as
that user (or as another identity, for tests of refusals). The harness's own
etcdctl calls act as `root` (a certificate with CN root). `tls=False` gives
plain http:// without users. Elections are fast
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

import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import struct
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import _SERVERS, free_port, in_ci, toml_str, wait_for_port

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
OPENSSL = "openssl"
OPENSSL_TIMEOUT = 30.0  # one openssl call; a key and a signature take milliseconds
CERT_DAYS = 2  # a test run is over long before

# Identities: who a client is to the cluster, by its certificate (Pki.cert).
ROOT = "root"  # etcd's root user: the harness's own calls
NODE = "nimbus-node"  # a Nimbus node: role ROLE
NOROLE = "nimbus-norole"  # an etcd user without any role
OTHER_CA = "other-ca"  # CN nimbus-node, signed by a CA the members do not trust
EXPIRED = "expired"  # CN nimbus-node, signed by the members' CA, no longer valid
PASSWORD_USER = "nimbus-pw"  # role ROLE, authenticated by password (password_file)
ROLE = "nimbus"
PREFIX = "/nimbus/"


class EtcdError(RuntimeError):
    """An etcdctl command failed or did not finish; carries its stderr."""

    def __init__(self, cmd: list[str], message: str, stderr: str = ""):
        super().__init__(f"`{' '.join(cmd)}` {message}\nstderr:\n{stderr}")
        self.cmd = cmd
        self.stderr = stderr


class Pki:
    """The certificates of a TLS cluster, made with openssl in `dir`.

    ca.pem signs member.pem (serverAuth and clientAuth, IP 127.0.0.1 and DNS
    localhost: members serve clients and peers with it and show it to each
    other) and one client certificate per identity, `<identity>.pem` and
    `.key`, whose CN names the etcd user: ROOT, NODE, NOROLE; EXPIRED has
    CN NODE but validity over in 2020. second-ca.pem, a CA the
    members do not trust, signs OTHER_CA (CN NODE). Keys are mode 0600, as
    Nimbus requires of a key_file.
    """

    IDENTITIES = {ROOT: ROOT, NODE: NODE, NOROLE: NOROLE, OTHER_CA: NODE, EXPIRED: NODE}

    def __init__(self, dir: Path):
        self.dir = Path(dir)
        self.ca = self.dir / "ca.pem"
        self.member = (self.dir / "member.pem", self.dir / "member.key")

    def cert(self, identity: str) -> tuple[Path, Path]:
        """(certificate, key) of a client identity."""
        if identity not in self.IDENTITIES:
            raise ValueError(f"no certificate for {identity!r}; one of {sorted(self.IDENTITIES)}")
        return self.dir / f"{identity}.pem", self.dir / f"{identity}.key"

    def make(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        # Our own openssl configuration, so that what the certificates carry
        # does not depend on the system's openssl.cnf.
        (self.dir / "openssl.cnf").write_text(
            "\n".join(
                [
                    "[req]",
                    "distinguished_name = dn",
                    "x509_extensions = ca_ext",
                    "[dn]",
                    "[ca_ext]",
                    "basicConstraints = critical, CA:TRUE",
                    "keyUsage = critical, keyCertSign, cRLSign",
                    "subjectKeyIdentifier = hash",
                    "[member_ext]",
                    "basicConstraints = critical, CA:FALSE",
                    "keyUsage = critical, digitalSignature, keyEncipherment",
                    "extendedKeyUsage = serverAuth, clientAuth",
                    "subjectAltName = IP:127.0.0.1, DNS:localhost",
                    "[client_ext]",
                    "basicConstraints = critical, CA:FALSE",
                    "keyUsage = critical, digitalSignature",
                    "extendedKeyUsage = clientAuth",
                    # `openssl ca`, only to backdate EXPIRED: `openssl x509`
                    # of OpenSSL 3.0 sets no start date of its own.
                    "[ca]",
                    "default_ca = backdating_ca",
                    "[backdating_ca]",
                    "database = ca-index.txt",
                    "new_certs_dir = .",
                    "serial = ca-serial",
                    "default_md = sha256",
                    "policy = any_name",
                    "unique_subject = no",
                    "[any_name]",
                    "commonName = supplied",
                ]
            )
            + "\n"
        )
        for ca in ("ca", "second-ca"):
            self._openssl("req", "-x509", *self._new_key(ca), "-days", str(CERT_DAYS), "-subj", f"/CN=nimbus test {ca}", "-out", f"{ca}.pem")
        self._issue("member", "member_ext", "/CN=nimbus test etcd member")
        for identity, cn in self.IDENTITIES.items():
            if identity == EXPIRED:
                continue
            self._issue(identity, "client_ext", f"/CN={cn}", ca="second-ca" if identity == OTHER_CA else "ca")
        (self.dir / "ca-index.txt").write_text("")
        (self.dir / "ca-serial").write_text(f"{secrets.randbits(64):016X}\n")
        self._openssl("req", "-new", *self._new_key(EXPIRED), "-subj", f"/CN={NODE}", "-out", f"{EXPIRED}.csr")
        self._openssl(
            "ca", "-batch", "-config", "openssl.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", f"{EXPIRED}.csr",
            "-startdate", "200101000000Z", "-enddate", "200102000000Z", "-extensions", "client_ext", "-notext",
            "-out", f"{EXPIRED}.pem",
        )  # fmt: skip
        for key in self.dir.glob("*.key"):
            key.chmod(0o600)

    def _new_key(self, name: str) -> list[str]:
        return ["-config", "openssl.cnf", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key"]

    def _issue(self, name: str, extensions: str, subject: str, ca: str = "ca") -> None:
        self._openssl("req", "-new", *self._new_key(name), "-subj", subject, "-out", f"{name}.csr")
        self._openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-set_serial", str(secrets.randbits(63)),
            "-days", str(CERT_DAYS), "-extfile", "openssl.cnf", "-extensions", extensions, "-out", f"{name}.pem",
        )  # fmt: skip

    def _openssl(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "OPENSSL_CONF"}
        proc = subprocess.run([OPENSSL, *args], cwd=self.dir, capture_output=True, text=True, env=env, timeout=OPENSSL_TIMEOUT)
        if proc.returncode != 0:
            raise RuntimeError(f"openssl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")


class Member:
    """One etcd process: its name, ports, data directory and log file.

    `kind`, `log_path` and `log_tail()` match conftest's Server, so a failed
    test's report carries each member's log.
    """

    def __init__(
        self,
        name: str,
        base_dir: Path,
        pki: Pki | None = None,
        peer_tls: bool = True,
        data_root: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        self.name = name
        self.extra_args = extra_args
        self.pki = pki
        self.peer_tls = peer_tls
        self.kind = f"etcd {name}"
        self.data_dir = (data_root or base_dir) / f"{name}.etcd"
        self.log_path = base_dir / f"{name}.log"
        self.client_port = 0
        self.peer_port = 0
        # etcd 3.5 and later, TLS: HTTP (metrics, health) on a URL of its
        # own, so the client URL serves gRPC natively over TLS, as a
        # production member is set up (docs/SCALING.md, "Which etcd").
        self.http_port = 0
        self.process: subprocess.Popen | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.pki else "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def http_url(self) -> str:
        """Where the member serves HTTP: /metrics, /health."""
        if self.http_port:
            return f"{self.scheme}://127.0.0.1:{self.http_port}"
        return self.client_url

    def take_ports(self) -> None:
        """Fresh ports (`free_port` hands none out twice in a run)."""
        self.client_port, self.peer_port = free_port(), free_port()
        self.http_port = free_port() if self.pki and separate_http_url() else 0

    @property
    def peer_url(self) -> str:
        scheme = "https" if self.pki and self.peer_tls else "http"
        return f"{scheme}://127.0.0.1:{self.peer_port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def launch(self, initial_cluster: str, token: str, state: str = "new") -> None:
        """Start the process. `state` is etcd's --initial-cluster-state:
        "new" for a member of a cluster being made, "existing" for one
        added to a running cluster (`EtcdCluster.replace_member`)."""
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
            f"--initial-cluster-state={state}",
            f"--initial-cluster-token={token}",
            f"--heartbeat-interval={HEARTBEAT_MS}",
            f"--election-timeout={ELECTION_MS}",
            f"--quota-backend-bytes={QUOTA_BYTES}",
            "--logger=zap",
            f"--log-outputs={self.log_path}",
            *self.extra_args,
        ]
        if self.http_port:
            args.append(f"--listen-client-http-urls={self.http_url}")
        if self.pki:
            cert, key = self.pki.member
            args += [
                f"--cert-file={cert}",
                f"--key-file={key}",
                f"--trusted-ca-file={self.pki.ca}",
                "--client-cert-auth",
            ]
        if self.pki and self.peer_tls:
            cert, key = self.pki.member
            args += [
                f"--peer-cert-file={cert}",
                f"--peer-key-file={key}",
                f"--peer-trusted-ca-file={self.pki.ca}",
                "--peer-client-cert-auth",
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


@dataclass
class Election:
    """One term's election (`EtcdCluster.elections`), in time.time() seconds."""

    term: int
    began: float
    ended: float | None


class EtcdCluster:
    """`members` etcd processes forming one cluster on 127.0.0.1: with `tls`
    (the default) TLS only, certificates asked of clients and peers, and
    etcd users; without, plain http:// open to anyone. `peer_tls` and
    `auth` False take one part off a TLS cluster (plain links between the
    members; no users and roles), for bench/cluster_contention.py to tell
    what each part costs. `data_root`: where the members keep their data,
    when not beside their logs in `base_dir` (a memory file system, for a
    test that judges the nodes' answers and not etcd's durability, whose
    fsyncs would otherwise wait behind the test's own disk writes).
    `extra_args`: more flags for every member's etcd."""

    def __init__(
        self,
        base_dir: Path,
        members: int = 3,
        tls: bool = True,
        peer_tls: bool = True,
        auth: bool = True,
        data_root: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ):
        if members < 1:
            raise ValueError("a cluster needs at least one member")
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.pki = Pki(self.base_dir / "pki") if tls else None
        self.peer_tls = peer_tls
        self.auth = auth
        self.data_root = data_root
        self.extra_args = extra_args
        self.members = [Member(f"m{i}", self.base_dir, self.pki, peer_tls, data_root, extra_args) for i in range(members)]
        self.retired: list[Member] = []  # members `replace_member` removed
        # A test's list of servers whose logs a failure report carries (the
        # fixtures' stash): members `replace_member` adds join it.
        self.report: list | None = None
        self.root_password = secrets.token_urlsafe(18)
        self.passwords = {PASSWORD_USER: secrets.token_urlsafe(18)}
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
        if self.pki and not self.pki.ca.exists():
            self.pki.make()
        for _attempt in range(START_ATTEMPTS):
            self._new_identity()
            try:
                for m in self.members:
                    m.launch(self._initial_cluster, self.token)
                self.wait_healthy(timeout=START_TIMEOUT)
                if self.pki and self.auth:
                    self._enable_auth()
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
        for m in self.members + self.retired:
            m.stop()

    def replace_member(self, i: int) -> Member:
        """Replace member `i` as an operator does, without stopping the
        cluster: `etcdctl member add` of a new member (next name, new
        ports, the same member certificate), its start with the cluster the
        add answered, a wait until every member is healthy, then `etcdctl
        member remove` of member `i` and its stop. The new member takes
        index `i`; the old one moves to `retired`. Returns the new member.

        etcd refuses a change of members while one has been connected to
        the leader for less than a few seconds: `_reconfigure` tries it
        again."""
        old = self.members[i]
        names = {m.name for m in self.members + self.retired}
        new = Member(next(f"m{n}" for n in range(len(names) + 1) if f"m{n}" not in names), self.base_dir, self.pki, self.peer_tls, self.data_root, self.extra_args)
        new.take_ports()
        kept = [m.client_url for m in self.members if m is not old]
        added = self._reconfigure("member", "add", new.name, f"--peer-urls={new.peer_url}", endpoints=kept)
        initial = next(
            (line.split("=", 1)[1].strip('"') for line in added.splitlines() if line.startswith("ETCD_INITIAL_CLUSTER=")),
            None,
        )
        if initial is None:
            raise RuntimeError(f"etcdctl member add did not name the cluster:\n{added}")
        new.launch(initial, "unused-by-a-member-that-joins", state="existing")
        self.members[i] = new
        if self.report is not None:
            self.report.append(new)
        self.wait_healthy(timeout=START_TIMEOUT)
        listed = json.loads(self.etcdctl("member", "list", "-w", "json", endpoints=kept)).get("members", [])
        ids = [m["ID"] for m in listed if m.get("name") == old.name]
        if len(ids) != 1:
            raise RuntimeError(f"member {old.name} is listed {len(ids)} times: {listed}")
        # etcdctl wants the id in hex; -w json gives it as a decimal number.
        self._reconfigure("member", "remove", f"{ids[0]:x}", endpoints=[m.client_url for m in self.members])
        old.stop()
        self.retired.append(old)
        return new

    def stop_member(self, i: int) -> None:
        """Stop member `i` (its data directory stays), as if cut off."""
        self.members[i].stop()

    def kill_member(self, i: int) -> None:
        """Kill member `i` with SIGKILL, as a crash: unlike `stop_member`, a
        leader hands nothing over, and its peers learn of the loss only when
        its heartbeats stop. Returns once the process has exited; its data
        directory stays, for `start_member`."""
        m = self.members[i]
        if m.alive():
            m.process.kill()
        if m.process is not None:
            m.process.wait(timeout=STOP_TIMEOUT)

    def leader(self) -> int | None:
        """The index of the member the running members take for their
        leader (`etcdctl endpoint status`), or None while they know none
        or disagree."""
        running = [m for m in self.members if m.alive()]
        if not running:
            return None
        try:
            out = self.etcdctl("endpoint", "status", "-w", "json", endpoints=[m.client_url for m in running])
        except EtcdError:
            return None
        statuses = {s["Endpoint"]: s["Status"] for s in json.loads(out)}
        leaders = {s.get("leader", 0) for s in statuses.values()}
        if len(statuses) != len(running) or len(leaders) != 1:
            return None
        leader = leaders.pop()
        for i, m in enumerate(self.members):
            if m.alive() and statuses[m.client_url]["header"]["member_id"] == leader:
                return i
        return None

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

    @property
    def scheme(self) -> str:
        """"https" or "http": for endpoints of proxies in front of members."""
        return "https" if self.pki else "http"

    def node_toml_lines(self, identity: str | None = NODE, endpoints: list[str] | None = None, user: str | None = None) -> list[str]:
        """The `[cluster]` lines (after the header) with which a Nimbus node
        reaches this cluster: etcd endpoints (default: all members) and,
        with TLS, ca_file and the client certificate of `identity` (None:
        no certificate); `user` adds username and password_file, of a user
        `self.passwords` knows or of a name with no such user."""
        eps = self.endpoints if endpoints is None else endpoints
        lines = [etcd_toml_line(eps)]
        if self.pki:
            lines.append(f"ca_file = {toml_str(str(self.pki.ca))}")
            if identity is not None:
                cert, key = self.pki.cert(identity)
                lines += [f"cert_file = {toml_str(str(cert))}", f"key_file = {toml_str(str(key))}"]
        if user is not None:
            lines += [f"username = {toml_str(user)}", f"password_file = {toml_str(str(self.password_file(user)))}"]
        lines.append(f"secret_file = {toml_str(str(self.secret_file()))}")
        return lines

    def untagged(self, full_key: bytes, stored: bytes) -> bytes:
        """A value as a node wrote it at `full_key`, its tag checked and
        taken off (see `record_tag`)."""
        value, found = stored[:-TAG_LEN], stored[-TAG_LEN:]
        assert hmac.compare_digest(found, record_tag(self.secret_file().read_bytes(), full_key, value)), (
            f"{full_key!r}: no valid tag of the cluster secret"
        )
        return value

    def secret_file(self) -> Path:
        """The cluster secret every node of this cluster shares (32 random
        bytes, mode 0600): the nodes tag the records they write with it."""
        path = self.base_dir / "cluster.secret"
        if not path.exists():
            path.touch(mode=0o600)
            path.chmod(0o600)  # whatever the umask
            path.write_bytes(secrets.token_bytes(32))
        return path

    def password_file(self, user: str) -> Path:
        """A file (mode 0600) holding `user`'s password: the one etcd knows,
        or, for a user it does not, a random one."""
        path = self.base_dir / f"{user}.password"
        if not path.exists():
            path.touch(mode=0o600)
            path.chmod(0o600)  # whatever the umask
            path.write_text(self.passwords.get(user, secrets.token_urlsafe(18)) + "\n")
        return path

    def etcdctl_command(
        self,
        *args: str,
        endpoints: list[str] | None = None,
        timeout: float = COMMAND_TIMEOUT,
        identity: str | None = ROOT,
        tls: bool = True,
    ) -> tuple[list[str], dict[str, str]]:
        """The command line and environment of `etcdctl(...)`, for a command
        that runs on while the test goes on (`etcdctl watch`)."""
        eps = self.endpoints if endpoints is None else endpoints
        security: list[str] = []
        if self.pki and tls:
            security.append(f"--cacert={self.pki.ca}")
            if identity is not None:
                cert, key = self.pki.cert(identity)
                security += [f"--cert={cert}", f"--key={key}"]
        elif self.pki:
            eps = [e.replace("https://", "http://", 1) for e in eps]
        cmd = [
            ETCDCTL,
            f"--endpoints={','.join(eps)}",
            f"--dial-timeout={DIAL_TIMEOUT:g}s",
            f"--command-timeout={timeout:g}s",
            *security,
            *args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD_", "ETCDCTL_"))}
        env["ETCDCTL_API"] = "3"
        return cmd, env

    def etcdctl(
        self,
        *args: str,
        endpoints: list[str] | None = None,
        timeout: float = COMMAND_TIMEOUT,
        identity: str | None = ROOT,
        tls: bool = True,
    ) -> str:
        """Run `etcdctl` (API v3) against `endpoints` (default: all members)
        and return its stdout; raise EtcdError with its stderr if it fails
        or outlives its timeouts.

        On a TLS cluster it trusts the cluster's CA and shows the
        certificate of `identity` (default root; None: none), unless `tls`
        is False, which sends plain text to the https:// endpoints."""
        cmd, env = self.etcdctl_command(*args, endpoints=endpoints, timeout=timeout, identity=identity, tls=tls)
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

    def metrics(self, i: int) -> str:
        """Member `i`'s Prometheus metrics, fetched over its HTTP URL (as
        root, on a TLS cluster)."""
        context = None
        if self.pki:
            context = ssl.create_default_context(cafile=str(self.pki.ca))
            context.load_cert_chain(*self.pki.cert(ROOT))
        with urllib.request.urlopen(f"{self.members[i].http_url}/metrics", timeout=10, context=context) as r:
            return r.read().decode()

    def elections(self) -> list[Election]:
        """Every leader election the members' logs record, oldest first, in
        time.time() seconds: from the first member that stood for a term
        (zap's "became candidate at term N") to the one that won it
        ("became leader at term N"), or None when no member has won yet.
        Terms that nobody won are folded into the next one.
        On two shared cores a leader starved for an election timeout loses
        its followers, who elect another: etcd is then unavailable for a
        moment that no kill or cut of the test caused, and a test that
        judges the nodes' answers uses these spans to tell the two apart."""
        began: dict[int, float] = {}
        ended: dict[int, float] = {}
        for m in self.members:
            try:
                lines = m.log_path.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                if not line.startswith("{") or "became " not in line:
                    continue
                try:
                    entry = json.loads(line)
                    words = entry["msg"].split()
                    at = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if words[-3:-1] != ["at", "term"] or not words[-1].isdigit():
                    continue
                term = int(words[-1])
                if "became candidate" in entry["msg"]:
                    began[term] = min(at, began.get(term, at))
                elif "became leader" in entry["msg"]:
                    ended[term] = at
        # A term that nobody won runs on into the next one: etcd has no
        # leader from the first candidacy to the next win.
        found: list[Election] = []
        since: float | None = None
        for term in sorted(began):
            since = began[term] if since is None else since
            if term in ended or term == max(began):
                found.append(Election(term, since, ended.get(term)))
                since = None
        return found

    def log_tails(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(f"--- etcd {m.name} log, last {lines} lines of {m.log_path} ---\n{m.log_tail(lines)}" for m in self.members)

    # ------------------------------------------------------------ internal

    def _reconfigure(self, *args: str, endpoints: list[str]) -> str:
        """`etcdctl member add|remove ...`, tried again until START_TIMEOUT
        while etcd refuses it for a member connected too recently: an add
        while one is ("unhealthy cluster"), a remove that would leave fewer
        members connected for etcd's health interval (5 s in etcd 3.4) than
        a quorum ("not enough started members")."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                return self.etcdctl(*args, endpoints=endpoints)
            except EtcdError as e:
                transient = "unhealthy cluster" in e.stderr or "not enough started members" in e.stderr
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(HEALTH_POLL)

    def _enable_auth(self) -> None:
        """Users and the role, then `auth enable` (etcd 3.4 wants a root
        user with a password and the root role first). Users authenticated by their
        certificate's CN have no password at all."""
        self.etcdctl("user", "add", ROOT, f"--new-user-password={self.root_password}", "--interactive=false")
        self.etcdctl("role", "add", ROOT)
        self.etcdctl("user", "grant-role", ROOT, ROOT)
        self.etcdctl("role", "add", ROLE)
        self.etcdctl("role", "grant-permission", ROLE, "--prefix=true", "readwrite", PREFIX)
        for user in (NODE, NOROLE):
            self.etcdctl("user", "add", user, "--no-password")
        self.etcdctl("user", "add", PASSWORD_USER, f"--new-user-password={self.passwords[PASSWORD_USER]}", "--interactive=false")
        for user in (NODE, PASSWORD_USER):
            self.etcdctl("user", "grant-role", user, ROLE)
        self.etcdctl("auth", "enable")

    def _new_identity(self) -> None:
        """Fresh ports, token and data directories for a first start."""
        for m in self.members:
            m.take_ports()
            shutil.rmtree(m.data_dir, ignore_errors=True)
        self.token = f"nimbus-test-{uuid.uuid4().hex}"
        self._initial_cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)


@functools.cache
def separate_http_url() -> bool:
    """Whether the etcd in PATH takes `--listen-client-http-urls` (3.5 and
    later). Debian 12's, which CI runs, is 3.4: its TLS client URLs serve
    gRPC through Go's HTTP/2 server, with HTTP."""
    out = subprocess.run([ETCD, "--version"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT).stdout
    found = re.search(r"etcd Version: (\d+)\.(\d+)", out)
    return bool(found) and (int(found[1]), int(found[2])) >= (3, 5)


def etcd_toml_line(endpoints: list[str]) -> str:
    """`etcd = [...]` of a node's [cluster] section."""
    return "etcd = [" + ", ".join(toml_str(e) for e in endpoints) + "]"


TAG_LEN = 32  # HMAC-SHA256
TAG_CONTEXT = b"nimbus etcd record tag v1"


def record_tag(secret: bytes, full_key: bytes, value: bytes) -> bytes:
    """The tag a node of the cluster appends to `value` stored at `full_key`
    (crates/nimbus-state/src/etcd_seal.rs): HMAC-SHA256 under a key derived
    from the secret, over the key's length, the key and the value."""
    derived = hmac.new(secret, TAG_CONTEXT, hashlib.sha256).digest()
    return hmac.new(derived, struct.pack(">Q", len(full_key)) + full_key + value, hashlib.sha256).digest()


def require_etcd() -> None:
    """Skip the test when etcd is not installed; under CI=true, fail it."""
    for name, package in ((ETCD, "etcd-server"), (ETCDCTL, "etcd-client"), (OPENSSL, "openssl")):
        if shutil.which(name) is None:
            message = f"{name} not installed (apt-get install {package})"
            if in_ci():
                pytest.fail(f"{message}; CI=true: a missing program fails the test instead of skipping it", pytrace=False)
            pytest.skip(message)


def started(request, base_dir: Path, tls: bool, data_root: Path | None = None) -> Iterator[EtcdCluster]:
    require_etcd()
    cluster = EtcdCluster(base_dir, tls=tls, data_root=data_root)
    cluster.report = request.node.stash.setdefault(_SERVERS, [])
    cluster.report.extend(cluster.members)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def started_in_memory(request, base_dir: Path, prefix: str) -> Iterator[EtcdCluster]:
    """`started` with TLS, the members' data in /dev/shm: for tests that
    judge the nodes, not etcd's own durability (test_etcd_failover.py has
    tests of that). On the test machine's one disk, a stall of etcd's
    fsync (2.3 s seen) outlasts a node's lease of 2 s, and a test fails for
    the disk's sake."""
    data = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm"))
    try:
        yield from started(request, base_dir, tls=True, data_root=data)
    finally:
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def etcd_cluster(request, tmp_path) -> Iterator[EtcdCluster]:
    """A started three-member etcd cluster with TLS and users, stopped after
    the test; a failed test's report carries each member's log."""
    yield from started(request, tmp_path / "etcd", tls=True)


@pytest.fixture
def plain_etcd_cluster(request, tmp_path) -> Iterator[EtcdCluster]:
    """The same, on plain http:// without users."""
    yield from started(request, tmp_path / "etcd", tls=False)
