"""Power loss: what the server acknowledged as durable survives a crash
that drops every write not synced to the disk (issue 45).

A SIGKILL of the server never loses the page cache, so it cannot tell
whether the server syncs. Here the state directory and the share live on
nimbus-lazyfs (tests/lazyfs), a FUSE file system that keeps written data
in memory until the file is fsynced, as Jepsen's LazyFS does. A power
loss is: SIGKILL the server, SIGKILL the file system, unmount it and mount
the backing directory again. Only what was synced is then there.

What must survive (MS-SMB2 3.3.5.9, 3.3.5.13, 3.3.5.11, 3.3.5.14):
- a persistent handle, once its CREATE is answered, with its locks once
  the LOCK is answered, and under its new name once a rename is;
- data written with SMB2_WRITEFLAG_WRITE_THROUGH, or by an open made with
  FILE_WRITE_THROUGH, once the WRITE is answered;
- data written before a FLUSH, once the FLUSH is answered.

Each test also runs once with the file system acknowledging fsync without
writing anything back (SIGUSR1 to nimbus-lazyfs, after the server started
on a clean store): then the same checks must find losses, which shows
that they can fail.
"""

from __future__ import annotations

import os
import random
import select
import signal
import struct
import subprocess
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from smbprotocol.create_contexts import DurableHandleFlags
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FileAttributes,
    ImpersonationLevel,
    Open,
    RequestedOplockLevel,
    SMB2SetInfoRequest,
)

from conftest import nimbus_binary
from test_durable import ACCESS, HANDLE, READ, SHARE_ALL, STATUS_LOCK_NOT_GRANTED, Client, dh2q, durable_open, lease, plain_open, status_of
from test_macos import rename
from test_persistent import EXCLUSIVE, CaServer, persistent_reconnect

MOUNT_TIMEOUT = 10.0
HANDLE_TIMEOUT_MS = 60_000
DELETE = 0x00010000


class LazyDisk:
    """nimbus-lazyfs over `base/disk`, mounted on `base/mnt`."""

    def __init__(self, base: Path):
        self.backing = base / "disk"
        self.mnt = base / "mnt"
        self.backing.mkdir()
        self.mnt.mkdir()
        self.log = base / "lazyfs.log"
        self.proc: subprocess.Popen | None = None

    def mount(self) -> None:
        binary = nimbus_binary().parent / "nimbus-lazyfs"
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen([str(binary), str(self.backing), str(self.mnt)], stdout=subprocess.PIPE, stderr=err)
        assert self.line() == "mounted", f"nimbus-lazyfs did not mount: {self.log.read_text(errors='replace')}"
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not os.path.ismount(self.mnt):
            assert time.monotonic() < deadline, "the mount did not appear"
            time.sleep(0.01)

    def line(self) -> str:
        """The next line nimbus-lazyfs prints, waited for at most MOUNT_TIMEOUT."""
        ready, _, _ = select.select([self.proc.stdout], [], [], MOUNT_TIMEOUT)
        return self.proc.stdout.readline().decode().strip() if ready else ""

    def ignore_fsync(self) -> None:
        self.proc.send_signal(signal.SIGUSR1)
        assert self.line() == "ignoring fsync"

    def power_loss(self) -> None:
        """Everything not synced is gone; the disk is mounted again."""
        self.unmount()
        self.mount()

    def unmount(self) -> None:
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
        self.proc = None
        subprocess.run(["umount", "-l", str(self.mnt)], check=True)


@pytest.fixture
def disk(tmp_path):
    d = LazyDisk(tmp_path)
    d.mount()
    yield d
    d.unmount()


def open_ca(client: Client, name: str, create_guid: uuid.UUID, key: bytes, *, options: int = 0) -> Open:
    """A persistent handle with an RH lease, with DELETE access (to rename)."""
    f = Open(client.tree, name)
    f.create(
        ImpersonationLevel.Impersonation,
        ACCESS | DELETE,
        FileAttributes.FILE_ATTRIBUTE_NORMAL,
        SHARE_ALL,
        CreateDisposition.FILE_OPEN_IF,
        CreateOptions.FILE_NON_DIRECTORY_FILE | options,
        create_contexts=[dh2q(create_guid, HANDLE_TIMEOUT_MS, DurableHandleFlags.SMB2_DHANDLE_FLAG_PERSISTENT), lease(key, READ | HANDLE)],
        oplock_level=RequestedOplockLevel.SMB2_OPLOCK_LEVEL_LEASE,
    )
    return f


@dataclass
class Handle:
    """A persistent handle as its client knows it, and what it was told is durable."""

    name: str
    file_id: bytes
    create_guid: uuid.UUID
    key: bytes
    data: dict[int, bytes] = field(default_factory=dict)
    locks: list[tuple[int, int]] = field(default_factory=list)
    # The name a rename the crash cut short would have given it: the
    # handle must come back under one of the two.
    renaming_to: str | None = None


def read(f: Open, offset: int, length: int) -> bytes:
    """What the file holds there; a read past its end is a loss, not an error."""
    try:
        return f.read(offset, length)
    except Exception as e:  # noqa: BLE001
        return f"<{type(e).__name__}>".encode()


def check_after_power_loss(node, client_guid: uuid.UUID, handles: list[Handle], plain: dict[str, bytes]) -> list[str]:
    """What the restarted server lost of what it acknowledged as durable."""
    lost = []
    owner, other = Client(node, client_guid), Client(node, uuid.uuid4())
    try:
        for h in handles:
            f = None
            for name in filter(None, [h.name, h.renaming_to]):
                try:
                    f = persistent_reconnect(owner, name, h.file_id, h.create_guid, h.key)
                    h.name = name
                    break
                except Exception as e:  # noqa: BLE001 - any refusal is a loss
                    refusal = e
            if f is None:
                lost.append(f"{h.name}: persistent handle not reclaimed ({refusal})")
                continue
            for offset, data in h.data.items():
                got = read(f, offset, len(data))
                if got != data:
                    lost.append(f"{h.name}: {len(data)} bytes at {offset} lost (read {got[:16]!r}...)")
            if h.locks:
                probe = plain_open(other, h.name)
                for offset, length in h.locks:
                    if status_of(lambda: other.lock(probe.file_id, offset, length, EXCLUSIVE)) != STATUS_LOCK_NOT_GRANTED:
                        lost.append(f"{h.name}: lock {offset}+{length} lost")
                probe.close()
            f.close()
        for name, data in plain.items():
            f = plain_open(other, name)
            got = read(f, 0, len(data))
            f.close()
            if got != data:
                lost.append(f"{name}: {len(data)} bytes lost (read {got[:16]!r}...)")
    finally:
        owner.close()
        other.close()
    return lost


def acknowledged_then_power_loss(tmp_path: Path, disk: LazyDisk, *, fsync_ignored: bool) -> list[str]:
    srv = CaServer(tmp_path, disk=disk.mnt)
    try:
        node = srv.start()
        if fsync_ignored:
            disk.ignore_fsync()
        client_guid = uuid.uuid4()
        c = Client(node, client_guid)
        ledger = Handle("ledger.dat", b"", uuid.uuid4(), os.urandom(16))
        f = open_ca(c, ledger.name, ledger.create_guid, ledger.key)
        ledger.file_id = f.file_id
        through, flushed = os.urandom(3000), os.urandom(70_000)
        f.write(through, 0, write_through=True)
        f.write(flushed, 65536)
        f.flush()
        c.lock(f.file_id, 0, 100, EXCLUSIVE)
        ledger.data = {0: through, 65536: flushed}
        ledger.locks = [(0, 100)]
        # An open made write-through: each WRITE is on the disk when answered.
        w = Open(c.tree, "write-through.dat")
        w.create(
            ImpersonationLevel.Impersonation,
            ACCESS,
            FileAttributes.FILE_ATTRIBUTE_NORMAL,
            SHARE_ALL,
            CreateDisposition.FILE_OVERWRITE_IF,
            CreateOptions.FILE_NON_DIRECTORY_FILE | CreateOptions.FILE_WRITE_THROUGH,
        )
        plain_data = os.urandom(5000)
        w.write(plain_data, 0)
        # A persistent handle renamed: it comes back under its new name.
        moved = Handle("before.dat", b"", uuid.uuid4(), os.urandom(16))
        g = open_ca(c, moved.name, moved.create_guid, moved.key)
        moved.file_id = g.file_id
        assert rename(g, "after.dat") == 0
        moved.name = "after.dat"

        srv.kill9()
        c.drop()
        disk.power_loss()
        try:
            node = srv.start()
        except Exception as e:  # noqa: BLE001
            return [f"the server did not start after the power loss: {e}"]
        lost = check_after_power_loss(node, client_guid, [ledger, moved], {"write-through.dat": plain_data})
        assert "panicked at" not in srv.log()
        return lost
    finally:
        srv.stop()


def test_what_was_acknowledged_as_durable_survives_power_loss(tmp_path, disk):
    assert acknowledged_then_power_loss(tmp_path, disk, fsync_ignored=False) == []


def test_the_power_loss_check_finds_the_losses_when_fsync_is_ignored(tmp_path, disk):
    lost = acknowledged_then_power_loss(tmp_path, disk, fsync_ignored=True)
    assert any("ledger.dat: persistent handle not reclaimed" in line for line in lost), lost
    assert any("write-through.dat" in line for line in lost), lost


def send_rename(f: Open, new_name: str) -> None:
    """Sends a rename to `new_name` (FileRenameInformation, MS-FSCC
    2.4.42) and reads no answer."""
    name = new_name.encode("utf-16-le")
    req = SMB2SetInfoRequest()
    req["info_type"] = 1
    req["file_info_class"] = 10
    req["file_id"] = f.file_id
    req["buffer"] = struct.pack("<B7xQI", 0, 0, len(name)) + name
    tree = f.tree_connect
    tree.session.connection.send(req, sid=tree.session.session_id, tid=tree.tree_connect_id)


class Workload(threading.Thread):
    """One client's mix of persistent opens, write-through, flushed and
    plain writes, locks, renames, closes, write-through opens and durable
    (not persistent) opens, until the server dies under it. It records only
    what the server answered."""

    def __init__(self, node, client_guid: uuid.UUID, prefix: str, seed: int, cut_a_rename: bool = False):
        super().__init__(daemon=True)
        self.node, self.client_guid, self.prefix = node, client_guid, prefix
        self.rng = random.Random(seed)
        # When set: after a random number of steps the workload sends a
        # rename, sets `rename_sent` and reads no answer, so the power loss
        # that follows finds the rename unanswered however fast the server
        # is (a random moment alone catches one only now and then).
        self.cut_after = self.rng.randrange(1, 60) if cut_a_rename else None
        self.rename_sent = threading.Event()
        # What ended the workload, when it was not the power loss.
        self.error: Exception | None = None
        self.handles: list[Handle] = []
        self.plain: dict[str, bytes] = {}
        self.opens: dict[str, Open] = {}
        self.next_offset: dict[str, int] = {}
        # A close the crash cut short may or may not have happened.
        self.uncertain: set[str] = set()
        self.steps = 0
        self.connected = threading.Event()

    def run(self) -> None:
        try:
            self.client = Client(self.node, self.client_guid)
            self.connected.set()
            while not self.rename_sent.is_set():
                self.step()
                self.steps += 1
        except Exception as e:  # noqa: BLE001 - the power loss ends the workload
            self.error = e
            self.connected.set()

    def fresh_range(self, h: Handle, length: int) -> int:
        """Each write gets bytes no other write touches: what a durable
        write left is then the only thing that can be there."""
        offset = self.next_offset.get(h.create_guid.hex, 0)
        self.next_offset[h.create_guid.hex] = offset + length + self.rng.randrange(0, 5000)
        return offset

    def step(self) -> None:
        live = [h for h in self.handles if h.create_guid.hex not in self.uncertain]
        op = self.rng.choice(["open", "through", "flushed", "plain", "lock", "rename", "close", "wt-open", "durable"]) if live else "open"
        n = self.steps
        if live and self.cut_after is not None and n >= self.cut_after:
            op = "unanswered rename"
        if op == "open":
            h = Handle(f"{self.prefix}-{n}.dat", b"", uuid.uuid4(), os.urandom(16))
            f = open_ca(self.client, h.name, h.create_guid, h.key)
            h.file_id = f.file_id
            self.handles.append(h)
            self.opens[h.create_guid.hex] = f
            return
        if op == "durable":
            # A durable handle that is not persistent: nothing about it
            # is promised across a restart; it only adds to the mix.
            f, _ = durable_open(self.client, f"{self.prefix}-d-{n}.dat", uuid.uuid4(), os.urandom(16), timeout_ms=10_000)
            f.write(os.urandom(self.rng.randrange(1, 10_000)), 0)
            return
        if op == "wt-open":
            name, data = f"{self.prefix}-wt-{n}.dat", os.urandom(self.rng.randrange(1, 20_000))
            w = Open(self.client.tree, name)
            w.create(
                ImpersonationLevel.Impersonation,
                ACCESS,
                FileAttributes.FILE_ATTRIBUTE_NORMAL,
                SHARE_ALL,
                CreateDisposition.FILE_CREATE,
                CreateOptions.FILE_NON_DIRECTORY_FILE | CreateOptions.FILE_WRITE_THROUGH,
            )
            w.write(data, 0)
            self.plain[name] = data
            w.close()
            return
        h = self.rng.choice(live)
        f = self.opens[h.create_guid.hex]
        if op in ("through", "flushed", "plain"):
            data = os.urandom(self.rng.randrange(1, 70_000))
            offset = self.fresh_range(h, len(data))
            f.write(data, offset, write_through=op == "through")
            if op == "flushed":
                f.flush()
            if op != "plain":
                h.data[offset] = data
        elif op == "lock":
            offset = (1 << 40) + 100 * len(h.locks)
            self.client.lock(f.file_id, offset, 10, EXCLUSIVE)
            h.locks.append((offset, 10))
        elif op == "rename":
            h.renaming_to = f"{self.prefix}-{n}-renamed.dat"
            assert rename(f, h.renaming_to) == 0
            h.name, h.renaming_to = h.renaming_to, None
        elif op == "unanswered rename":
            h.renaming_to = f"{self.prefix}-{n}-renamed.dat"
            send_rename(f, h.renaming_to)
            self.rename_sent.set()
        elif op == "close":
            self.uncertain.add(h.create_guid.hex)
            f.close()
            self.handles.remove(h)
            self.uncertain.discard(h.create_guid.hex)


def random_power_losses(tmp_path: Path, disk: LazyDisk, rounds: int, *, fsync_ignored: bool) -> tuple[list[str], Counter]:
    """`rounds` power losses, each at a random moment of a workload; every
    time the store must open and nothing acknowledged as durable be lost.
    Returns the losses and how much was checked."""
    srv = CaServer(tmp_path, disk=disk.mnt)
    rng = random.Random(45)
    lost: list[str] = []
    checked: Counter = Counter()
    total_steps = 0
    try:
        node = srv.start()
        for r in range(rounds):
            if fsync_ignored:
                disk.ignore_fsync()
            # One round in ten ends on a rename sent and not answered.
            cut_a_rename = r % 10 == 9
            work = Workload(node, uuid.uuid4(), f"r{r}", seed=r, cut_a_rename=cut_a_rename)
            work.start()
            assert work.connected.wait(30), "the workload's client did not connect"
            if cut_a_rename:
                # Until the rename is out, or the workload ended without it
                # (its error then says why).
                deadline = time.monotonic() + 60
                while not work.rename_sent.wait(0.1) and work.is_alive():
                    assert time.monotonic() < deadline, "the workload sent no rename within 60 s"
                assert work.rename_sent.is_set(), f"the workload ended before its rename: {work.error!r}"
            else:
                # The random point: a moment of the workload, wherever its
                # requests stand then.
                time.sleep(rng.uniform(0.0, 0.6))
            srv.kill9()
            work.join(30)
            assert not work.is_alive(), "the workload did not end with the server"
            total_steps += work.steps
            disk.power_loss()
            try:
                node = srv.start()
            except Exception as e:  # noqa: BLE001
                lost.append(f"round {r}: the server did not start after the power loss: {e}")
                break
            handles = [h for h in work.handles if h.create_guid.hex not in work.uncertain]
            checked.update(
                handles=len(handles),
                durable_writes=sum(len(h.data) for h in handles),
                locks=sum(len(h.locks) for h in handles),
                renames_cut_short=sum(1 for h in handles if h.renaming_to),
                write_through_opens=len(work.plain),
                steps=work.steps,
            )
            lost += [f"round {r}: {line}" for line in check_after_power_loss(node, work.client_guid, handles, work.plain)]
            if fsync_ignored and lost:
                break
        log = srv.log()
        assert "panicked at" not in log
        assert total_steps >= rounds, f"the workloads made only {total_steps} steps in {rounds} rounds"
        return lost, checked
    finally:
        srv.stop()


ROUNDS = 100


def test_power_loss_at_random_points_of_a_mixed_workload_loses_nothing_acknowledged(tmp_path, disk):
    lost, checked = random_power_losses(tmp_path, disk, ROUNDS, fsync_ignored=False)
    print(f"{ROUNDS} power losses checked: {dict(checked)}")
    assert lost == []
    # Every kind of promise was put to the test at least once.
    for kind in ("handles", "durable_writes", "locks", "renames_cut_short", "write_through_opens"):
        assert checked[kind] > 0, f"no {kind} were checked: {dict(checked)}"


def test_random_power_losses_find_the_losses_when_fsync_is_ignored(tmp_path, disk):
    lost, _ = random_power_losses(tmp_path, disk, 10, fsync_ignored=True)
    assert lost != []
