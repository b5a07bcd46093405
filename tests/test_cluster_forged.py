"""A forged persistent-open record in etcd (issue 44).

Mallory may not open alice's file: its DACL grants him nothing. He holds an
etcd credential, though, and writes one `/nimbus/open/<id>` record naming
her file under an open id whose incarnation belongs to no live node, then
reconnects to it (DH2C) through n2. A node takes a gone node's open over
for its client; before the fix it reopened the file with the record's
access mask without looking at the file's security descriptor, and
mallory read and overwrote alice's file.

Two defences are tested, each on its own:
  a. every value a node writes to etcd carries a tag of the cluster's
     secret (`[cluster] secret_file`): a record written with an etcd
     credential alone is refused;
  b. a record with a valid tag (as a compromised node could write) is
     reclaimed only by a session whose token the file's DACL grants the
     record's access;
  c. a control: the same forgery of a file whose DACL does grant mallory
     that access is reclaimed, so the first two do not pass merely because
     a hand-made record is never reclaimed.

The forged records are not written from nothing: mallory makes a genuine
persistent open of a file of his own, the test reads its record from etcd,
checks its own decoding against it (the file's dev and inode as `os.stat`
sees them, the tag of the node's secret), and changes only what the attack
changes (open id, file, path, CreateGuid).

NIMBUS_TEST_NO_CLUSTER_SECRET=1 runs the nodes without a secret file, for a
binary that predates `secret_file`: only to show the attack succeeding on
it (these tests then fail); never set in the suite.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import uuid
from base64 import b64decode
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from smbprotocol.exceptions import SMBResponseException

import etcd_cluster as etcd_module
import test_acl as acls
from conftest import PASSWORD, USER, add_user, file_generation, run_nimbus
from etcd_cluster import TAG_LEN, EtcdCluster, etcd_cluster  # noqa: F401  (the fixture)
from etcd_cluster import record_tag as tag
from test_cluster import Node, members, nodes, wait_until  # noqa: F401  (the fixture)
from test_durable import ACCESS, STATUS_ACCESS_DENIED, STATUS_OBJECT_NAME_NOT_FOUND, Client
from test_notify import MALLORY
from test_persistent import persistent_open_uncached, reconnect_uncached

ETCD_PREFIX = b"/nimbus/"
OPEN_ID_SHIFT = 40  # crates/nimbus-cluster/src/cluster.rs
# Far above any incarnation the cluster's counter has drawn (it counts from
# 1, one per node start), so no live node runs it; every byte non-zero, so
# the key passes through etcdctl's argv.
GONE_INCARNATION = 0xABCDEF
WITHOUT_SECRET = os.environ.get("NIMBUS_TEST_NO_CLUSTER_SECRET") == "1"
ALICE_DATA = b"alice's salary review, not for mallory\n" * 32


# --------------------------------------------------------------------------
# The open record (crates/nimbus-state/src/durable_record.rs), as far as the
# forgery needs it: fields it does not change are carried over as bytes.


RENAMING_SECTION = b"\x01"
GENERATION_SECTION = b"\x02"


@dataclass(frozen=True)
class OpenRecord:
    layout: int
    open_id: int
    dev: int
    ino: int
    share: str
    path: str
    access: int
    share_access: int
    mode: int
    position: int
    delete_on_close: int
    owner_sid: str
    owner_name: str
    client_guid: bytes
    create_guid: bytes
    timeout_ms: int
    caching: bytes  # its tag byte and what follows it
    locks: bytes  # the count and the ranges
    lock_sequences: bytes
    create_action: int
    answered: int
    tail: bytes  # layout 2's persistent flag
    renaming: bytes  # the optional rename section, whole (b"": none)
    gen: int  # the file's generation, an optional section (0: none)

    @classmethod
    def decode(cls, b: bytes) -> OpenRecord:
        at = 0

        def take(n: int) -> bytes:
            nonlocal at
            assert at + n <= len(b), "open record truncated"
            at += n
            return b[at - n : at]

        def num(fmt: str) -> int:
            return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

        def text() -> str:
            return take(num("<I")).decode()

        layout, open_id, dev, ino = num("<B"), num("<Q"), num("<Q"), num("<Q")
        share, path = text(), text()
        access, share_access, mode, position, delete_on_close = num("<I"), num("<I"), num("<I"), num("<Q"), num("<B")
        owner_sid, owner_name = text(), text()
        client_guid, create_guid, timeout_ms = take(16), take(16), num("<I")
        kind = num("<B")
        caching = bytes([kind]) + take({0: 0, 1: 1, 2: 16 + 16 + 4 + 2 + 1}[kind])
        count = num("<I")
        locks = struct.pack("<I", count) + take(17 * count)
        lock_sequences, create_action, answered = take(64), num("<B"), num("<B")
        tail = take(1) if layout == 2 else b""
        renaming, gen = b"", 0
        while at < len(b):
            section = take(1)
            if section == RENAMING_SECTION:
                start = at
                text(), text()
                renaming = section + b[start:at]
            elif section == GENERATION_SECTION:
                gen = num("<Q")
            else:
                raise AssertionError(f"unknown section {section!r} in the open record")
        return cls(
            layout, open_id, dev, ino, share, path, access, share_access, mode, position, delete_on_close, owner_sid,
            owner_name, client_guid, create_guid, timeout_ms, caching, locks, lock_sequences, create_action, answered, tail,
            renaming, gen,
        )  # fmt: skip

    def encode(self) -> bytes:
        def text(s: str) -> bytes:
            return struct.pack("<I", len(s.encode())) + s.encode()

        return b"".join(
            [
                struct.pack("<BQQQ", self.layout, self.open_id, self.dev, self.ino),
                text(self.share),
                text(self.path),
                struct.pack("<IIIQB", self.access, self.share_access, self.mode, self.position, self.delete_on_close),
                text(self.owner_sid),
                text(self.owner_name),
                self.client_guid,
                self.create_guid,
                struct.pack("<I", self.timeout_ms),
                self.caching,
                self.locks,
                self.lock_sequences,
                bytes([self.create_action, self.answered]),
                self.tail,
                self.renaming,
                GENERATION_SECTION + struct.pack("<Q", self.gen) if self.gen else b"",
            ]
        )


def open_key(open_id: int) -> bytes:
    return ETCD_PREFIX + b"open/" + open_id.to_bytes(8, "big")


def gone_open_id() -> int:
    """An open id of the gone incarnation whose big-endian bytes hold no NUL
    (they are an argv word for etcdctl)."""
    low = bytes(b % 255 + 1 for b in os.urandom(5))
    return GONE_INCARNATION << OPEN_ID_SHIFT | int.from_bytes(low, "big")


# --------------------------------------------------------------------------
# etcd, through the fixture's own etcdctl (its endpoints and credentials)


def etcd_get(cluster: EtcdCluster, key: bytes) -> bytes | None:
    """The value at `key`: looked for in a listing of the open records, as
    a genuine open id's key has NUL bytes, which argv cannot carry."""
    out = json.loads(cluster.etcdctl("get", "--prefix", os.fsdecode(ETCD_PREFIX + b"open/"), "-w", "json") or "{}")
    found = [b64decode(kv["value"]) for kv in out.get("kvs", []) if b64decode(kv["key"]) == key]
    return found[0] if found else None


def etcd_put(cluster: EtcdCluster, key: bytes, value: bytes, scratch: Path, monkeypatch) -> None:
    """Puts a binary value: etcdctl takes a value it is not given in argv
    from its stdin, which the fixture's etcdctl closes, so its program is
    for this one call a script that hands etcdctl the value."""
    real = shutil.which(etcd_module.ETCDCTL)
    assert real, "etcdctl not found"
    data = scratch / "value.bin"
    data.write_bytes(value)
    wrapper = scratch / "etcdctl-stdin"
    wrapper.write_text(f'#!/bin/sh\nexec "{real}" "$@" < "{data}"\n')
    wrapper.chmod(0o700)
    with monkeypatch.context() as m:
        m.setattr(etcd_module, "ETCDCTL", str(wrapper))
        assert cluster.etcdctl("put", os.fsdecode(key)).strip() == "OK"
    assert etcd_get(cluster, key) == value


# --------------------------------------------------------------------------
# the cluster, the users and the files


def cluster_secret(made: list[Node], tmp_path: Path) -> bytes | None:
    """The secret the nodes tag their etcd values with: the one their
    configuration names already, or a new one given to all of them."""
    named = {m[1] for n in made if (m := re.search(r'^secret_file = "([^"]*)"$', n.conf.read_text(), re.M))}
    if named:
        assert len(named) == 1, f"the nodes name different secret files: {named}"
        return Path(named.pop()).read_bytes()
    if WITHOUT_SECRET:
        return None
    path = tmp_path / "cluster.secret"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(48))
    os.close(fd)
    for n in made:
        # [cluster] is the configuration's last table.
        n.conf.write_text(n.conf.read_text() + f'secret_file = "{path}"\n')
    return path.read_bytes()


@dataclass
class Scene:
    cluster: EtcdCluster
    n1: Node
    n2: Node
    secret: bytes | None
    sids: dict[str, str]
    genuine: OpenRecord
    scratch: Path

    def stored(self, key: bytes, value: bytes) -> bytes:
        """`value` as a node of the cluster stores it at `key`."""
        return value if self.secret is None else value + tag(self.secret, key, value)


def ca(node: Node, user: str, password: str) -> SimpleNamespace:
    return SimpleNamespace(host=node.host, port=node.port, share="ca", user=user, password=password)


@pytest.fixture
def scene(nodes, etcd_cluster, tmp_path) -> Scene:  # noqa: F811
    db = tmp_path / "users.db"
    add_user(db, *MALLORY)
    sids = dict(line.split(" ", 1) for line in run_nimbus("user", "list", "--db", str(db), "--sids").stdout.splitlines())
    secret = cluster_secret(nodes, tmp_path)
    n1, n2 = nodes[0].start(), nodes[1].start()
    share = n1.share
    with acls.smb_tree(ca(n1, USER, PASSWORD), USER, PASSWORD) as alice:
        # Alice's file: hers alone.
        f = acls.create(alice, "payroll.xlsx", acls.READ_CONTROL | acls.WRITE_DAC | acls.WRITE_DATA, acls.CreateDisposition.FILE_CREATE)
        f.write(ALICE_DATA, 0)
        acls.set_sd(f, acls.descriptor(acls.acl(acls.ace(acls.ALLOW, 0, acls.FILE_ALL_ACCESS, sids[USER]))))
        f.close()
        # The control's: anyone's.
        f = acls.create(alice, "team-notes.txt", acls.READ_CONTROL | acls.WRITE_DAC | acls.WRITE_DATA, acls.CreateDisposition.FILE_CREATE)
        f.write(b"notes for the whole team\n", 0)
        acls.set_sd(f, acls.descriptor(acls.acl(acls.ace(acls.ALLOW, 0, acls.FILE_ALL_ACCESS, acls.EVERYONE))))
        f.close()
    with acls.smb_tree(ca(n2, *MALLORY), *MALLORY) as tm:
        # The premise: mallory's own open of alice's file is refused.
        for access in (acls.READ_DATA, acls.WRITE_DATA):
            status = acls.create_status(tm, "payroll.xlsx", access, disposition=acls.CreateDisposition.FILE_OPEN)
            assert status == STATUS_ACCESS_DENIED, hex(status)
        assert acls.create_status(tm, "team-notes.txt", ACCESS, disposition=acls.CreateDisposition.FILE_OPEN) == 0
    # Mallory's genuine persistent open of a file of his own, through n1.
    own = Client(ca(n1, *MALLORY), uuid.uuid4())
    try:
        f = persistent_open_uncached(own, "mallory.txt", uuid.uuid4())
        # The record is marked answered as the response goes out; a write
        # after it is answered after the mark.
        f.write(b"mallory's own", 0)
        open_id = int.from_bytes(f.file_id[:8], "little")
        key = open_key(open_id)
        untagged = (lambda raw: raw[:-TAG_LEN]) if secret is not None else (lambda raw: raw)
        wait_until(
            "mallory's open record is marked answered",
            lambda: (raw := etcd_get(etcd_cluster, key)) is not None and OpenRecord.decode(untagged(raw)).answered == 1,
        )
        raw = etcd_get(etcd_cluster, key)
        if secret is not None:
            # The test's tag is the node's: the forgeries of cases b and c
            # carry the tag a node of this cluster would write.
            assert raw[-TAG_LEN:] == tag(secret, key, raw[:-TAG_LEN]), "the record's tag is not the one this test computes"
            raw = raw[:-TAG_LEN]
        genuine = OpenRecord.decode(raw)
        st = os.stat(share / "mallory.txt")
        assert (genuine.open_id, genuine.dev, genuine.ino) == (open_id, st.st_dev, st.st_ino)
        assert genuine.gen == file_generation(share / "mallory.txt")
        assert (genuine.share, genuine.path, genuine.owner_sid) == ("ca", "mallory.txt", sids[MALLORY[0]])
        assert (genuine.answered, genuine.layout) == (1, 1)
        assert genuine.encode() == raw
        f.close()
    finally:
        own.close()
    return Scene(etcd_cluster, n1, n2, secret, sids, genuine, tmp_path)


def forge(s: Scene, name: str) -> OpenRecord:
    """Mallory's genuine record made to name `name`, under an open id of a
    gone incarnation and a new CreateGuid; its access mask (read, write,
    read attributes) is the one his own open had."""
    st = os.stat(s.n1.share / name)
    return replace(
        s.genuine,
        open_id=gone_open_id(),
        dev=st.st_dev,
        ino=st.st_ino,
        gen=file_generation(s.n1.share / name),
        path=name,
        create_guid=uuid.uuid4().bytes,
        timeout_ms=60_000,
    )


def attack(s: Scene, record: OpenRecord) -> tuple[int, bytes | None]:
    """Mallory's DH2C reconnect of `record` through n2; granted, he reads
    the file and overwrites it. The reconnect's status and what he read."""
    thief = Client(ca(s.n2, *MALLORY), uuid.UUID(bytes=s.genuine.client_guid))
    try:
        file_id = record.open_id.to_bytes(8, "little") + os.urandom(8)
        try:
            f = reconnect_uncached(thief, record.path, file_id, uuid.UUID(bytes=record.create_guid))
        except SMBResponseException as e:
            return e.status, None
        read = f.read(0, 4096)
        f.write(b"mallory was here", 0)
        f.close()
        return 0, read
    finally:
        thief.close()


def granted(status: int, read: bytes | None, now: bytes) -> str:
    return f"reconnect answered {status:#x}; mallory read {(read or b'')[:40]!r}, alice's file now {now[:40]!r}"


def taken_over(node: Node, record: OpenRecord) -> bool:
    return re.search(rf"open {record.open_id:#x} of {re.escape(record.path)} taken over from a gone node", node.log()) is not None


# --------------------------------------------------------------------------


def test_a_forged_open_record_without_the_clusters_tag_is_refused(scene, monkeypatch):
    """Case a: an etcd credential without the cluster's secret."""
    s = scene
    record = forge(s, "payroll.xlsx")
    # Written as etcdctl writes it: no tag.
    etcd_put(s.cluster, open_key(record.open_id), record.encode(), s.scratch, monkeypatch)
    status, read = attack(s, record)
    alice_now = (s.n1.share / "payroll.xlsx").read_bytes()
    assert status == STATUS_OBJECT_NAME_NOT_FOUND, granted(status, read, alice_now)
    assert alice_now == ALICE_DATA
    assert not taken_over(s.n2, record)
    assert "without a valid tag" in s.n2.log(), "n2 logged no refusal of the untagged record"


def test_a_forged_open_record_with_a_valid_tag_is_not_reclaimed_past_the_files_dacl(scene, monkeypatch):
    """Case b: a record as a compromised node (holding the secret) writes it."""
    s = scene
    record = forge(s, "payroll.xlsx")
    key = open_key(record.open_id)
    etcd_put(s.cluster, key, s.stored(key, record.encode()), s.scratch, monkeypatch)
    status, read = attack(s, record)
    alice_now = (s.n1.share / "payroll.xlsx").read_bytes()
    assert status == STATUS_OBJECT_NAME_NOT_FOUND, granted(status, read, alice_now)
    assert alice_now == ALICE_DATA
    # Refused for the DACL, not the tag: the test's tag is the nodes'.
    assert "without a valid tag" not in s.n2.log()
    assert re.search(rf"open {record.open_id:#x} of payroll.xlsx not claimed: the file's security descriptor", s.n2.log())
    # Not even held on n2 with the record's access, waiting for a client:
    # it would keep a share-mode entry on alice's file.
    assert not taken_over(s.n2, record)


def test_a_forged_open_record_with_a_valid_tag_of_a_file_mallory_may_open_is_reclaimed(scene, monkeypatch):
    """Case c, the control: the forgery of cases a and b, tagged, naming a
    file whose DACL grants mallory its access, is reclaimed."""
    s = scene
    record = forge(s, "team-notes.txt")
    key = open_key(record.open_id)
    etcd_put(s.cluster, key, s.stored(key, record.encode()), s.scratch, monkeypatch)
    status, read = attack(s, record)
    assert status == 0, f"the control was refused: {status:#x}"
    assert read == b"notes for the whole team\n"
    assert taken_over(s.n2, record)
    assert (s.n1.share / "team-notes.txt").read_bytes().startswith(b"mallory was here")
    assert (s.n1.share / "payroll.xlsx").read_bytes() == ALICE_DATA


def test_a_node_with_another_secret_is_refused_before_it_writes_anything(nodes, etcd_cluster, tmp_path):  # noqa: F811
    """A node given another `[cluster] secret_file` than the running nodes'
    would refuse every record they wrote, and they every record it writes:
    it is refused at start, with the key and the fix named, before its
    registration could fail the running node's listings of the members."""
    cluster_secret(nodes[:2], tmp_path)
    n1 = nodes[0].start()
    other = tmp_path / "another.secret"
    fd = os.open(other, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    n2 = nodes[1]
    conf, replaced = re.subn(r'^secret_file = "[^"]*"$', f'secret_file = "{other}"', n2.conf.read_text(), flags=re.M)
    assert replaced == 1
    n2.conf.write_text(conf)
    proc = n2.run(timeout=60)
    out = proc.stderr + proc.stdout
    assert proc.returncode != 0, out
    assert "[cluster] secret_file" in out and "copy the running nodes' secret_file" in out, out
    # Nothing of n2's in etcd: n1 lists the members as before, and serves.
    assert etcd_cluster.etcdctl("get", "--prefix", "--keys-only", "/nimbus/nodes/").split() == ["/nimbus/nodes/n1"]
    assert set(members(etcd_cluster)) == {"n1"}
    assert "without a valid tag" not in n1.log()
    assert n1.proc.poll() is None
