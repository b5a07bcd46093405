"""Fixtures that start the real `nimbus` binary on a free loopback port.

Every test that takes `server` (or `readonly_server`, `symlink_server`) gets
its own share directory, user database and server process, so tests never see
each other's files. The server's stderr goes to a log file; when a test fails,
the tail of that log is added to the failure report.

Environment:
  NIMBUS_BIN             the binary to test (default: target/release/nimbus)
  NIMBUS_TEST_VERBOSE=1  start the server with -v (debug logs)
  CI=true                a client program a test needs (smbclient,
                         smbtorture) that is not installed fails the test
                         instead of skipping it (see `require_tool`)

`pytest tests/ --target=samba` runs the same tests against Debian's smbd
(bench/samba_server.py, needs root and the `samba` package): a way to check
what a test expects against the reference implementation.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Child processes are started with fork and exec, not vfork: the suites run
# smbtorture and servers from several threads at once (tests/test_smbtorture.py's
# lanes), and twice in one day a vfork'ed child's exec of the nimbus binary
# failed with EFAULT ("Bad address") there. fork costs a few milliseconds more.
subprocess._USE_VFORK = False  # noqa: SLF001 (CPython 3.11+; a no-op attribute elsewhere)

REPO = Path(__file__).resolve().parent.parent
USER = "alice"
PASSWORD = "Al1ce-Secret!"
SHARE = "data"
READONLY_SHARE = "ro"
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
LOG_TAIL_LINES = 80

_SERVERS = pytest.StashKey[list]()


def pytest_addoption(parser):
    parser.addoption(
        "--target",
        choices=["nimbus", "samba"],
        default="nimbus",
        help="server to test: the nimbus binary (default) or Debian's smbd, for reference",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires_tool(name, package): the test runs the program `name` from Debian's `package` "
        "(use conftest.require_tool)",
    )


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def built_binary(env: str, default: Path, build: str) -> Path:
    """A program scripts/test.sh builds besides nimbus: the path in `env`,
    else `default`. Missing, the test is skipped, saying how to build it;
    under CI=true it fails instead (scripts/test.sh builds it there)."""
    path = Path(os.environ[env]) if os.environ.get(env) else default
    if not path.is_file():
        message = f"no {path} ({build})"
        if in_ci():
            pytest.fail(message + "; CI=true: scripts/test.sh builds it", pytrace=False)
        pytest.skip(message)
    return path


def require_tool(name: str, package: str) -> pytest.MarkDecorator:
    """Mark tests (or a module, as `pytestmark`) that run the program `name`.

    When `name` is not on PATH the test is skipped, naming the apt package
    to install; under CI=true it fails instead, so that a CI image without
    the client cannot turn the interop tests into skips that pass.
    """
    return pytest.mark.requires_tool(name, package)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires_tool"):
        name, package = mark.args
        if shutil.which(name) is not None:
            continue
        message = f"{name} not installed (apt-get install {package})"
        if in_ci():
            pytest.fail(f"{message}; CI=true: a missing client fails the test instead of skipping it", pytrace=False)
        pytest.skip(message)


def pytest_collection_modifyitems(config, items):
    if config.getoption("--target") != "samba":
        return
    skip = pytest.mark.skip(reason="nimbus only: tests the nimbus CLI, or a nimbus policy smbd does not share")
    for item in items:
        if "nimbus_only" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for srv in item.stash.get(_SERVERS, []):
            report.sections.append((f"{srv.kind} server log, last {LOG_TAIL_LINES} lines of {srv.log_path}", srv.log_tail()))
    return report


@dataclass
class Server:
    """A running server under test."""

    kind: str  # "nimbus" or "samba"
    host: str
    port: int
    share: str
    share_path: Path
    user: str
    password: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)
    extra_shares: dict[str, Path] = field(default_factory=dict)
    _stopper: object = field(default=None, repr=False)

    @property
    def unc(self) -> str:
        return f"//{self.host}/{self.share}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self._stopper is not None:
            self._stopper()
            return
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT)


# --------------------------------------------------------------------------
# helpers


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that
    no earlier call in this run handed out. A port handed out is often
    bound only later (a node's SMB port when it starts, after its witness
    port was picked): the kernel, which knows nothing of it, may offer it
    again, and once did, so that a node's two listeners collided and it
    exited at start."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no TCP port left that this test run has not handed out")


def wait_for_port(host: str, port: int, proc: subprocess.Popen, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"server did not accept connections on {host}:{port} within {timeout:.0f} s")


def nimbus_binary() -> Path:
    env = os.environ.get("NIMBUS_BIN")
    path = Path(env) if env else REPO / "target" / "release" / "nimbus"
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"nimbus binary not found at {path}: run `cargo build --release` "
            "(or set NIMBUS_BIN to the binary to test)",
            pytrace=False,
        )
    return path


def run_nimbus(*args: str, input: str | None = None, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    """Run the nimbus CLI; fail the test with its output if `check` and it exits non-zero."""
    cmd = [str(nimbus_binary()), *args]
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, stdin=None if input is not None else subprocess.DEVNULL)
    if check and proc.returncode != 0:
        pytest.fail(
            f"`{' '.join(cmd)}` exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}",
            pytrace=False,
        )
    return proc


def file_generation(path: Path) -> int:
    """The generation the server keys a file by (`nimbus_vfs::Stat::gen`):
    FNV-1a of the handle type (4 bytes, little-endian) and the handle
    `name_to_handle_at(2)` gives the file, 1 for a digest of 0."""
    import ctypes

    class FileHandle(ctypes.Structure):
        _fields_ = [("handle_bytes", ctypes.c_uint32), ("handle_type", ctypes.c_int32), ("f_handle", ctypes.c_ubyte * 128)]

    libc = ctypes.CDLL(None, use_errno=True)
    handle, mount_id = FileHandle(handle_bytes=128), ctypes.c_int(0)
    at_fdcwd, at_symlink_follow = -100, 0x400
    rc = libc.name_to_handle_at(at_fdcwd, os.fsencode(str(path)), ctypes.byref(handle), ctypes.byref(mount_id), at_symlink_follow)
    assert rc == 0, f"name_to_handle_at({path}): errno {ctypes.get_errno()}"
    digest = 0xCBF29CE484222325
    for b in handle.handle_type.to_bytes(4, "little", signed=True) + bytes(handle.f_handle[: handle.handle_bytes]):
        digest = ((digest ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return max(digest, 1)


def add_user(db: Path, user: str = USER, password: str = PASSWORD) -> None:
    run_nimbus("user", "add", user, "--db", str(db), "--password-stdin", input=password + "\n")


def toml_str(value: str) -> str:
    """A TOML basic string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Security:
    """The [security] settings a test server starts with (None: the default)."""

    signing: str = "required"
    encryption: str | None = None
    ciphers: list[str] | None = None
    # share name -> its own `encryption` value
    share_encryption: dict[str, str] = field(default_factory=dict)
    # [limits] keys and integer values (nimbus only)
    limits: dict[str, int] = field(default_factory=dict)
    # shares with guest_ok = true (nimbus only)
    guest_shares: set[str] = field(default_factory=set)
    # more users of the user database, (name, password) (nimbus only)
    extra_users: list[tuple[str, str]] = field(default_factory=list)
    # shares with access_based_enumeration = true (nimbus only)
    abe_shares: set[str] = field(default_factory=set)
    # share name -> its `comment`, and the top-level server_comment (nimbus only)
    share_comments: dict[str, str] = field(default_factory=dict)
    server_comment: str | None = None
    # the top-level apple_model, the Mac model named in AAPL replies (nimbus only)
    apple_model: str | None = None
    # shares with apple_extensions = false (nimbus only)
    no_apple_shares: set[str] = field(default_factory=set)
    # the top-level multichannel switch (None: the default, on)
    multichannel: bool | None = None
    # share name -> its `hide_files` patterns (nimbus only)
    hide_files: dict[str, list[str]] = field(default_factory=dict)
    # [security] admins: users and groups whose sessions administer the server (nimbus only)
    admins: list[str] = field(default_factory=list)

    def needs_config_file(self) -> bool:
        return (
            self.encryption is not None
            or self.ciphers is not None
            or bool(self.share_encryption)
            or bool(self.limits)
            or bool(self.guest_shares)
            or bool(self.abe_shares)
            or bool(self.share_comments)
            or self.server_comment is not None
            or self.apple_model is not None
            or bool(self.no_apple_shares)
            or self.multichannel is not None
            or bool(self.hide_files)
            or bool(self.admins)
        )


def write_config(path: Path, port: int, user_db: Path, shares: list[tuple[str, Path, bool]], security: Security | None = None) -> Path:
    security = security or Security()
    lines = [
        f"listen = [{toml_str(f'127.0.0.1:{port}')}]",
        f"user_db = {toml_str(str(user_db))}",
    ]
    if security.server_comment is not None:
        lines.append(f"server_comment = {toml_str(security.server_comment)}")
    if security.apple_model is not None:
        lines.append(f"apple_model = {toml_str(security.apple_model)}")
    if security.multichannel is not None:
        lines.append(f"multichannel = {'true' if security.multichannel else 'false'}")
    lines += [
        "",
        "[security]",
        f"signing = {toml_str(security.signing)}",
    ]
    if security.encryption is not None:
        lines.append(f"encryption = {toml_str(security.encryption)}")
    if security.ciphers is not None:
        lines.append(f"ciphers = [{', '.join(toml_str(c) for c in security.ciphers)}]")
    if security.admins:
        lines.append(f"admins = [{', '.join(toml_str(a) for a in security.admins)}]")
    if security.limits:
        lines += ["", "[limits]"] + [f"{key} = {int(value)}" for key, value in security.limits.items()]
    for name, share_path, read_only in shares:
        lines += [
            "",
            "[[share]]",
            f"name = {toml_str(name)}",
            f"path = {toml_str(str(share_path))}",
            f"read_only = {'true' if read_only else 'false'}",
        ]
        if name in security.share_encryption:
            lines.append(f"encryption = {toml_str(security.share_encryption[name])}")
        if name in security.guest_shares:
            lines.append("guest_ok = true")
        if name in security.abe_shares:
            lines.append("access_based_enumeration = true")
        if name in security.no_apple_shares:
            lines.append("apple_extensions = false")
        if name in security.share_comments:
            lines.append(f"comment = {toml_str(security.share_comments[name])}")
        if name in security.hide_files:
            lines.append(f"hide_files = [{', '.join(toml_str(p) for p in security.hide_files[name])}]")
    path.write_text("\n".join(lines) + "\n")
    return path


class ServerFactory:
    """Starts servers for one test and stops them all at its end."""

    def __init__(self, request, tmp_path: Path):
        self.request = request
        self.tmp = tmp_path
        self.target = request.config.getoption("--target")
        self.servers: list[Server] = []
        self.count = 0

    def start(self, shares: list[tuple[str, bool]] | None = None, signing: str = "required", security: Security | None = None, nofile: int | None = None, paths: dict[str, Path] | None = None) -> Server:
        """Start a server with the given shares (name, read_only); the first is Server.share.

        Each share gets an empty directory beneath the test's temp dir, or
        the existing directory `paths` gives for its name.
        `security` gives encryption settings (and overrides `signing`).
        `nofile` starts nimbus with that descriptor limit, soft and hard.
        """
        shares = shares or [(SHARE, False)]
        security = security or Security(signing=signing)
        self.count += 1
        base = self.tmp / f"server{self.count}"
        base.mkdir()
        share_paths = {}
        for name, _ro in shares:
            if paths and name in paths:
                share_paths[name] = paths[name]
                continue
            p = base / "shares" / name
            p.mkdir(parents=True)
            share_paths[name] = p
        log_path = base / f"{self.target}.log"
        if self.target == "samba":
            srv = self._start_samba(base, shares, share_paths, log_path, security)
        else:
            srv = self._start_nimbus(base, shares, share_paths, log_path, security, nofile)
        self.servers.append(srv)
        self.request.node.stash.setdefault(_SERVERS, []).append(srv)
        return srv

    def _start_nimbus(self, base, shares, share_paths, log_path, security: Security, nofile: int | None = None) -> Server:
        db = base / "users.db"
        add_user(db)
        for name, password in security.extra_users:
            add_user(db, name, password)
        env = dict(os.environ, RUST_BACKTRACE="1", NO_COLOR="1")  # plain log lines in the file
        verbose = ["-v"] if os.environ.get("NIMBUS_TEST_VERBOSE") == "1" else []
        last_error = None
        for _attempt in range(3):  # a port picked free can be taken before we bind it
            port = free_port()
            if all(not ro for _, ro in shares) and not security.needs_config_file():
                args = ["serve", "--listen", f"127.0.0.1:{port}", "--user-db", str(db), "--signing", security.signing]
                for name, _ro in shares:
                    args += ["--share", f"{name}={share_paths[name]}"]
            else:  # read-only shares and encryption settings need the config file
                conf = write_config(base / "nimbus.toml", port, db, [(n, share_paths[n], ro) for n, ro in shares], security)
                args = ["serve", "--config", str(conf)]
            with open(log_path, "ab") as log:
                log.write(f"### nimbus {' '.join(args + verbose)}\n".encode())
                log.flush()
                proc = subprocess.Popen(
                    [str(nimbus_binary()), *args, *verbose],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=base,
                    preexec_fn=None if nofile is None else (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))),
                )
            srv = Server("nimbus", "127.0.0.1", port, shares[0][0], share_paths[shares[0][0]], USER, PASSWORD, log_path, proc, dict(share_paths))
            try:
                wait_for_port("127.0.0.1", port, proc)
                return srv
            except RuntimeError as e:  # exited: maybe the port was taken meanwhile
                last_error = e
                if "in use" not in srv.log_tail(5).lower():
                    break
            except TimeoutError as e:
                srv.stop()
                last_error = e
                break
        pytest.fail(f"nimbus did not start: {last_error}\n--- server log ---\n{srv.log_tail()}", pytrace=False)

    def _start_samba(self, base, shares, share_paths, log_path, security: Security) -> Server:
        if security.share_encryption:
            pytest.skip("per-share encryption is not mapped to smb.conf by the samba target")
        if security.limits:
            pytest.skip("[limits] are not mapped to smb.conf by the samba target")
        if security.guest_shares:
            pytest.skip("guest shares are not mapped to smb.conf by the samba target")
        if security.abe_shares:
            pytest.skip("access-based enumeration is not mapped to smb.conf by the samba target")
        if security.share_comments or security.server_comment is not None:
            pytest.skip("share and server comments are not mapped to smb.conf by the samba target")
        if security.apple_model is not None or security.no_apple_shares:
            pytest.skip("apple_model and apple_extensions are not mapped to smb.conf by the samba target")
        if security.multichannel is not None:
            pytest.skip("the multichannel switch is not mapped to smb.conf by the samba target")
        options = {}
        if security.encryption is not None:
            options["server smb encrypt"] = {"off": "off", "desired": "desired", "required": "required"}[security.encryption]
        if security.ciphers is not None:
            options["server smb3 encryption algorithms"] = " ".join(security.ciphers)
        sys.path.insert(0, str(REPO / "bench"))
        try:
            import samba_server
        finally:
            sys.path.pop(0)
        port = free_port()
        with open(log_path, "ab") as log:
            sam = samba_server.start_samba(
                base / "samba",
                port,
                [samba_server.SambaShare(n, share_paths[n], ro) for n, ro in shares],
                USER,
                PASSWORD,
                signing="mandatory" if security.signing == "required" else "auto",
                log_file=log,
                options=options,
            )
        return Server("samba", "127.0.0.1", port, shares[0][0], share_paths[shares[0][0]], USER, PASSWORD, log_path, sam.process, dict(share_paths), sam.stop)

    def stop_all(self) -> list[str]:
        """Stop every server; return a message for each that had died during the test."""
        died = []
        for srv in self.servers:
            code = srv.process.poll()
            if code is not None:
                # The log goes in the message: a passed call's temporary
                # directory, the log's, is gone by the time this failure
                # is reported (pytest.ini: tmp_path_retention_policy).
                died.append(
                    f"{srv.kind} server on port {srv.port} exited during the test with status {code}\n"
                    f"--- last lines of {srv.log_path} ---\n{srv.log_tail()}"
                )
            srv.stop()
        return died


# --------------------------------------------------------------------------
# fixtures


@pytest.fixture
def server_factory(request, tmp_path):
    """Start more servers, or servers with other shares: factory.start([(name, read_only), ...])."""
    factory = ServerFactory(request, tmp_path)
    yield factory
    died = factory.stop_all()
    if died:
        pytest.fail("; ".join(died), pytrace=False)


@pytest.fixture
def memory_dir():
    """A directory on tmpfs (/dev/shm), removed after the test."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        if os.environ.get("CI"):
            pytest.fail("/dev/shm (tmpfs) is missing")
        pytest.skip("no /dev/shm")
    d = Path(tempfile.mkdtemp(prefix="nimbus-test-", dir=shm))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(server_factory) -> Server:
    """nimbus serving share "data" (read-write, empty) to alice, signing required."""
    return server_factory.start()


@pytest.fixture
def readonly_server(server_factory) -> Server:
    """nimbus serving share "ro" read-only (from a config file) holding hello.txt."""
    srv = server_factory.start([(READONLY_SHARE, True)])
    (srv.share_path / "hello.txt").write_text("hello from a read-only share\n")
    return srv


@pytest.fixture
def symlink_server(server_factory) -> Server:
    """nimbus serving "data" with symlinks that lead outside the share.

    escape -> /etc, passwd-link -> /etc/passwd, parent-link -> .. (the
    directory above the share root, which holds a file secret.txt), and one
    harmless link inside the share: inside-link -> inside.txt.
    """
    srv = server_factory.start()
    root = srv.share_path
    (root.parent / "secret.txt").write_text("SECRET-OUTSIDE-THE-SHARE\n")
    (root / "inside.txt").write_text("inside the share\n")
    os.symlink("/etc", root / "escape")
    os.symlink("/etc/passwd", root / "passwd-link")
    os.symlink("..", root / "parent-link")
    os.symlink("inside.txt", root / "inside-link")
    return srv


@pytest.fixture
def client_dir(tmp_path) -> Path:
    """A local directory for the client's side of transfers."""
    d = tmp_path / "client"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def samba_client_conf(tmp_path_factory) -> Path:
    """A private smb.conf for smbclient and smbtorture.

    Keeps the clients off the system's /etc/samba/smb.conf and puts their
    caches in a temp dir, so they behave the same on every machine and run
    as any user.
    """
    d = tmp_path_factory.mktemp("samba-client")
    for sub in ("lock", "state", "cache", "private"):
        (d / sub).mkdir()
    conf = d / "smb.conf"
    conf.write_text(
        "[global]\n"
        "workgroup = NIMBUSTEST\n"
        "client min protocol = SMB2_02\n"
        "client max protocol = SMB3_11\n"
        f"lock directory = {d / 'lock'}\n"
        f"state directory = {d / 'state'}\n"
        f"cache directory = {d / 'cache'}\n"
        f"private dir = {d / 'private'}\n"
    )
    return conf


# Skips a CI run may have: tests/skip_allowlist.txt, one `node id prefix:
# reason` per line. Under CI any other skip fails the run, so that a test
# that stops running (a tool missing, a mount refused, a guard gone wrong)
# is not taken for a test that passes.
SKIP_ALLOWLIST = Path(__file__).with_name("skip_allowlist.txt")


def allowed_skips() -> list[str]:
    lines = SKIP_ALLOWLIST.read_text().splitlines() if SKIP_ALLOWLIST.exists() else []
    return [line.split(":", 1)[0].strip() for line in lines if line.strip() and not line.startswith("#")]


def pytest_sessionfinish(session, exitstatus):
    if not in_ci():
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    allowed = allowed_skips()
    unlisted = sorted({r.nodeid for r in skipped if not any(r.nodeid.startswith(a) for a in allowed)})
    if unlisted:
        print(f"\nCI=true: {len(unlisted)} skips not in {SKIP_ALLOWLIST.name}:\n  " + "\n  ".join(unlisted))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
