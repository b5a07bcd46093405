#!/usr/bin/env python3
"""Start Debian's Samba `smbd` on a loopback port, confined to one directory.

The reference server for benchmarks (Nimbus against Samba, same client, same
run) and for checking what a test in tests/ expects: `pytest tests/
--target=samba` runs the suite against smbd instead of nimbus.

Everything smbd writes (configuration, password database, locks, logs) stays
beneath the state directory given; nothing under /etc/samba or /var is read
or changed. smbd must run as root: the user the client logs on as is mapped
(through a `username map`) to root, the only Unix account that is sure to
exist, so files created through the share belong to root.

As a program:

    sudo python3 bench/samba_server.py --port 4451 --share data=/tmp/share \
        --user alice --password 'Al1ce-Secret!'

runs smbd in the foreground until interrupted and prints the smbclient line.
Needs Debian's `samba` package (smbd, pdbedit).
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from netutil import free_port, wait_listening

SMBD = shutil.which("smbd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") or "/usr/sbin/smbd"
PDBEDIT = shutil.which("pdbedit", path=os.environ.get("PATH", "") + ":/usr/bin:/usr/sbin") or "/usr/bin/pdbedit"


@dataclass
class SambaShare:
    name: str
    path: Path
    read_only: bool = False


@dataclass
class SambaServer:
    """A running smbd. Use as a context manager, or call stop()."""

    state_dir: Path
    port: int
    shares: list[SambaShare]
    user: str
    password: str
    log_path: Path
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def config_path(self) -> Path:
        return self.state_dir / "smb.conf"

    def stop(self, timeout: float = 10.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        # smbd runs in a session and process group of its own (it signals its
        # whole group when it exits, and forks a child per connection):
        # end the group.
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
        except ProcessLookupError:
            proc.wait(timeout=timeout)

    def __enter__(self) -> "SambaServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _smb_conf(state: Path, port: int, shares: list[SambaShare], signing: str, extra: dict[str, str]) -> str:
    dirs = {name: state / name for name in ("private", "lock", "state", "cache", "pid", "ncalrpc", "log", "binddns")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(dirs["private"], 0o700)
    lines = [
        "[global]",
        "server role = standalone server",
        "workgroup = NIMBUSTEST",
        "netbios name = SAMBAREF",
        f"smb ports = {port}",
        "interfaces = 127.0.0.1",
        "bind interfaces only = yes",
        "disable netbios = yes",
        f"private dir = {dirs['private']}",
        f"binddns dir = {dirs['binddns']}",
        f"lock directory = {dirs['lock']}",
        f"state directory = {dirs['state']}",
        f"cache directory = {dirs['cache']}",
        f"pid directory = {dirs['pid']}",
        f"ncalrpc dir = {dirs['ncalrpc']}",
        f"log file = {dirs['log']}/log.%m",
        f"passdb backend = tdbsam:{dirs['private']}/passdb.tdb",
        f"username map = {state}/usermap",
        f"server signing = {signing}",
        "server min protocol = SMB2_02",
        "server max protocol = SMB3_11",
        "map to guest = never",
        "restrict anonymous = 2",
        "ntlm auth = ntlmv2-only",
        "load printers = no",
        "printing = bsd",
        "printcap name = /dev/null",
        "disable spoolss = yes",
        "obey pam restrictions = no",
        *(f"{k} = {v}" for k, v in extra.items()),
        "",
    ]
    for share in shares:
        lines += [
            f"[{share.name}]",
            f"path = {share.path}",
            f"read only = {'yes' if share.read_only else 'no'}",
            "wide links = no",
            "",
        ]
    return "\n".join(lines)


def start_samba(
    state_dir: Path,
    port: int,
    shares: list[SambaShare],
    user: str,
    password: str,
    *,
    signing: str = "mandatory",
    start_timeout: float = 20.0,
    log_file=None,
    options: dict[str, str] | None = None,
) -> SambaServer:
    """Write a private smb.conf beneath state_dir, add the user, start smbd.

    Returns once the port accepts connections. `log_file` (an open binary
    file) receives smbd's debug output; by default state_dir/smbd.log.
    `options` adds smb.conf [global] parameters.
    """
    if os.geteuid() != 0:
        raise PermissionError("smbd needs root to serve files as the logged-on user")
    for tool in (SMBD, PDBEDIT):
        if not Path(tool).exists():
            raise FileNotFoundError(f"{tool} not found: apt-get install samba")
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    unix_user = getpass.getuser()
    (state_dir / "usermap").write_text(f"{unix_user} = {user}\n")
    conf = state_dir / "smb.conf"
    conf.write_text(_smb_conf(state_dir, port, shares, signing, options or {}))

    subprocess.run(
        [PDBEDIT, f"--configfile={conf}", "-a", "-t", "-u", unix_user],
        input=f"{password}\n{password}\n",
        text=True,
        check=True,
        capture_output=True,
        timeout=30,
    )

    log_path = state_dir / "smbd.log"
    own_log = log_file is None
    if own_log:
        log_file = open(log_path, "wb")
    else:
        log_path = Path(getattr(log_file, "name", log_path))
    try:
        proc = subprocess.Popen(
            [SMBD, "--foreground", "--no-process-group", "--debug-stdout", "-d", "1", f"--configfile={conf}"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        if own_log:
            log_file.close()
    server = SambaServer(state_dir, port, shares, user, password, log_path, proc)
    try:
        wait_listening(port, proc, "smbd", start_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--share", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--read-only-share", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--user", default="alice")
    parser.add_argument("--password", default="Al1ce-Secret!")
    parser.add_argument("--signing", default="mandatory", choices=["mandatory", "auto", "disabled"])
    parser.add_argument("--state-dir", help="where smb.conf, passdb and logs go (default: a temp dir)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", help="extra smb.conf [global] parameter")
    args = parser.parse_args()

    shares = []
    for spec, ro in [(s, False) for s in args.share] + [(s, True) for s in args.read_only_share]:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            parser.error(f"share {spec!r}: write NAME=PATH")
        shares.append(SambaShare(name, Path(path).resolve(), ro))
    port = args.port or free_port()
    state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="samba-ref-"))
    options = dict(o.split("=", 1) for o in args.option)
    def terminate(signum, frame):
        raise KeyboardInterrupt  # smbd runs in a session of its own: stop it below, not by inheritance

    signal.signal(signal.SIGTERM, terminate)
    server = start_samba(state, port, shares, args.user, args.password, signing=args.signing, options=options)
    print(f"smbd listening on 127.0.0.1:{port}; state and log in {state}", flush=True)
    print(f"smbclient //127.0.0.1/{shares[0].name} -p {port} -U {args.user}%{args.password} -m SMB3_11", flush=True)
    try:
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
