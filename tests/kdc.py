"""A real MIT Kerberos KDC for the tests (Debian's krb5-kdc): a test realm
in a temp dir, on a loopback port, with the principals the tests need, and
the environment (KRB5_CONFIG, KRB5CCNAME) a client of it runs with.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

REALM = "NIMBUS.TEST"
HOST = "files.nimbus.test"  # smbclient asks for cifs/<the host of the UNC>; -I gives the address
START_TIMEOUT = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Kdc:
    """The KDC of realm REALM, running until stop()."""

    def __init__(self, base: Path):
        self.dir = base
        self.port = _free_port()
        self.krb5_conf = base / "krb5.conf"
        self.kdc_conf = base / "kdc.conf"
        self.log = base / "kdc.log"
        self.krb5_conf.write_text(
            "[libdefaults]\n"
            f"  default_realm = {REALM}\n"
            "  dns_lookup_kdc = false\n"
            "  dns_lookup_realm = false\n"
            "  rdns = false\n"
            "  dns_canonicalize_hostname = false\n"
            "  udp_preference_limit = 1\n"
            # MIT adds the allowed clock skew to a context's lifetime (the
            # GSS expiry a server enforces is ticket end + skew): 2 s keeps
            # the ticket-expiry test short.
            "  clockskew = 2\n"
            "[realms]\n"
            f"  {REALM} = {{\n    kdc = 127.0.0.1:{self.port}\n  }}\n"
            "[domain_realm]\n"
            f"  {HOST} = {REALM}\n"
        )
        self.kdc_conf.write_text(
            "[kdcdefaults]\n"
            f"  kdc_listen = 127.0.0.1:{self.port}\n"
            f"  kdc_tcp_listen = 127.0.0.1:{self.port}\n"
            "[realms]\n"
            f"  {REALM} = {{\n"
            f"    database_name = {base / 'principal'}\n"
            f"    key_stash_file = {base / 'stash'}\n"
            f"    acl_file = {base / 'kadm5.acl'}\n"
            "    max_life = 10h\n"
            "    supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal\n"
            "  }\n"
            "[logging]\n"
            f"  kdc = FILE:{self.log}\n"
        )
        (base / "kadm5.acl").write_text("")
        self.env = dict(os.environ, KRB5_CONFIG=str(self.krb5_conf), KRB5_KDC_PROFILE=str(self.kdc_conf))
        self._run("kdb5_util", "create", "-s", "-r", REALM, "-P", "master-password-for-tests")
        self.proc = subprocess.Popen(["krb5kdc", "-n", "-r", REALM], env=self.env, stdout=subprocess.DEVNULL, stderr=open(base / "krb5kdc.err", "wb"))
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"krb5kdc exited: {(base / 'krb5kdc.err').read_text(errors='replace')}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("krb5kdc did not listen") from None
                time.sleep(0.1)

    def _run(self, *args: str) -> str:
        p = subprocess.run(args, env=self.env, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {p.stdout}{p.stderr}")
        return p.stdout

    def kadmin(self, query: str) -> str:
        return self._run("kadmin.local", "-r", REALM, "-q", query)

    def service_keytab(self, path: Path, principal: str = f"cifs/{HOST}") -> Path:
        """A keytab with a fresh random key of `principal` (mode 600)."""
        self.kadmin(f"addprinc -randkey {principal}")
        self.kadmin(f"ktadd -k {path} {principal}")
        path.chmod(0o600)
        return path

    def user(self, name: str) -> Path:
        """A principal `name` with a random key, and a keytab to kinit with."""
        self.kadmin(f"addprinc -randkey {name}")
        keytab = self.dir / f"{name.replace('/', '_')}.keytab"
        self.kadmin(f"ktadd -k {keytab} {name}")
        return keytab

    def kinit(self, name: str, keytab: Path, ccache: Path, *extra: str) -> dict[str, str]:
        """Logs `name` on; returns the environment a client uses its tickets with."""
        env = dict(self.env, KRB5CCNAME=f"FILE:{ccache}")
        p = subprocess.run(["kinit", *extra, "-k", "-t", str(keytab), name], env=env, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise RuntimeError(f"kinit {name}: {p.stdout}{p.stderr}")
        return env

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def have_kdc() -> bool:
    return all(shutil.which(t) for t in ("krb5kdc", "kdb5_util", "kadmin.local", "kinit"))
