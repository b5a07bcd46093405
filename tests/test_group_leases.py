"""Leases granted through the node (`[cluster] group_leases = true`,
docs/SCALING.md): a node's alike opens of a file that ask a read or
read-handle lease share one grant in the file's caching record, and their
clients' own leases live in the node's memory. Driven with raw SMB 3.1.1
clients (tests/test_oplocks.py) against three real nodes and a real
3-member etcd cluster.

What each test shows:
- the members' opens and closes write nothing to etcd while their group
  holds the file (each would be a write with a grant per lease);
- a break of the group's grant from another node reaches every member,
  each with its own lease key and epoch, and the other node's CREATE waits
  until the last member has acknowledged (a fence on another file, as in
  test_cluster.py, orders what the waiting node has seen);
- a write on another node takes read caching from every member, and so
  does a byte-range lock taken through a member (the first, whose open's
  id names the group's entry in the record), or through the group's first
  open when it asked no lease.
"""

from __future__ import annotations

import struct
import uuid

import pytest

import rawsmb
import test_oplocks as ol
from test_cluster import WAIT, Node, etcd_cluster, etcd_counts, nodes  # noqa: F401  (the fixtures: etcd's data in memory)
from test_locks import CLOSE, EXCLUSIVE, FAIL_IMMEDIATELY, LOCK, close_body, lock_body, message_id

GENERIC_READ = 0x8000_0000
FILE_SHARE_READ, FILE_SHARE_WRITE, FILE_SHARE_DELETE = 0x1, 0x2, 0x4
STATUS_SHARING_VIOLATION = 0xC000_0043
WRITE = 0x09


def with_group_leases(nodes: list[Node]) -> list[Node]:
    """The nodes, their `[cluster]` sections (the last of each file)
    turning group leases on, started."""
    for n in nodes:
        n.conf.write_text(n.conf.read_text() + "group_leases = true\n")
        n.start()
    return nodes


def lease_open(c: ol.Smb311Client, name: str, key: bytes, state: int) -> bytes:
    """A read-only open of `name` sharing everything, asking lease `key` at
    `state`: the CREATE response, which must grant the lease."""
    resp = c.create(name, oplock=ol.LEVEL_LEASE, access=GENERIC_READ, contexts=ol.lease_context(key, state))
    assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
    return resp


def break_of(msg: bytes) -> tuple[int, int, bytes, int, int]:
    """MS-SMB2 2.2.23.2 Lease Break Notification: (epoch, flags, key,
    current state, new state)."""
    assert ol.command_of(msg) == ol.OPLOCK_BREAK
    _, epoch, flags, key, current, new = struct.unpack_from("<HHI16sII", ol.body_of(msg))
    return epoch, flags, key, current, new


def write_body(file_id: bytes, offset: int, data: bytes) -> bytes:
    """MS-SMB2 2.2.21 WRITE."""
    return struct.pack("<HHIQ16sIIHHI", 49, rawsmb.HEADER_SIZE + 48, len(data), offset, file_id, 0, 0, 0, 0, 0) + data


def test_members_opens_and_closes_write_nothing_while_their_group_holds_the_file(nodes, etcd_cluster):  # noqa: F811
    with_group_leases(nodes)
    (nodes[0].share / "g.txt").write_bytes(b"read by many\n")
    # A reader on another node: the file is decided in etcd.
    other = ol.Smb311Client(nodes[1], uuid.uuid4().bytes)
    keeper = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
    looper = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
    try:
        assert rawsmb.status(other.create("g.txt", access=GENERIC_READ)) == 0
        key_k, key_l = uuid.uuid4().bytes, uuid.uuid4().bytes
        resp = lease_open(keeper, "g.txt", key_k, ol.R | ol.H)
        assert ol.lease_of(resp) == (key_k, ol.R | ol.H, 0, 1)
        (rev0, _) = etcd_counts(etcd_cluster)
        pairs = 30
        for i in range(pairs):
            resp = lease_open(looper, "g.txt", key_l, ol.R | ol.H)
            # The member's own lease: its key, all it asked, its own epoch.
            assert ol.lease_of(resp) == (key_l, ol.R | ol.H, 0, 1), (i, ol.lease_of(resp))
            assert rawsmb.status(looper.call(CLOSE, close_body(ol.file_id_of(resp)))) == 0
        (rev1, _) = etcd_counts(etcd_cluster)
        # A grant per lease is two writes per pair (its admit and its
        # close). Besides the pairs: the nodes' own upkeep.
        print(f"{rev1 - rev0} etcd writes for {pairs} open/close pairs with a lease")
        assert rev1 - rev0 <= 5, rev1 - rev0
    finally:
        for c in (other, keeper, looper):
            c.close()


def test_a_break_from_another_node_reaches_every_member_and_waits_for_the_last(nodes):
    with_group_leases(nodes)
    (nodes[0].share / "g.txt").write_bytes(b"cached by two\n")
    (nodes[0].share / "fence.txt").write_bytes(b"fence\n")
    a = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
    b = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
    d = ol.Smb311Client(nodes[1], uuid.uuid4().bytes)
    key_a, key_b, key_f = uuid.uuid4().bytes, uuid.uuid4().bytes, uuid.uuid4().bytes
    try:
        for c in (a, b, d):
            c.s.settimeout(WAIT)
        # A reader on node 2 first, so that the file is decided in etcd.
        resp = d.create("g.txt", access=GENERIC_READ)
        assert rawsmb.status(resp) == 0
        d_reader = ol.file_id_of(resp)
        assert ol.lease_of(lease_open(a, "g.txt", key_a, ol.R | ol.H)) == (key_a, ol.R | ol.H, 0, 1)
        assert ol.lease_of(lease_open(b, "g.txt", key_b, ol.R | ol.H)) == (key_b, ol.R | ol.H, 0, 1)
        # A lease of a's on another file, alone (it writes), for the fence.
        resp = a.create("fence.txt", oplock=ol.LEVEL_LEASE, contexts=ol.lease_context(key_f, ol.R | ol.W | ol.H))
        assert ol.lease_of(resp) == (key_f, ol.R | ol.W | ol.H, 0, 1)
        # Node 2's client opens g.txt sharing no reading: the members'
        # handle caching must go first (MS-FSA 2.1.5.1.2: a sharing
        # violation breaks handle caching and waits).
        mid, aid = d.start_create("g.txt", access=GENERIC_READ, share=FILE_SHARE_WRITE)
        for c, key in ((a, key_a), (b, key_b)):
            epoch, flags, got, current, new = break_of(c.recv())
            assert (flags, got, current, new, epoch) == (ol.LEASE_BREAK_ACK_REQUIRED, key, ol.R | ol.H, ol.R, 2)
        assert rawsmb.status(a.call(ol.OPLOCK_BREAK, ol.lease_ack_body(key_a, ol.R))) == 0
        # The fence: once node 2 has seen a's acknowledgement of the fence's
        # break in etcd, it has seen whatever node 1 wrote before it. The
        # CREATE of g.txt must still wait: b has not answered.
        fmid, faid = d.start_create("fence.txt", oplock=ol.LEVEL_LEASE, contexts=ol.lease_context(uuid.uuid4().bytes, ol.R))
        assert break_of(a.recv())[1:] == (ol.LEASE_BREAK_ACK_REQUIRED, key_f, ol.R | ol.W | ol.H, ol.R | ol.H)
        assert rawsmb.status(a.call(ol.OPLOCK_BREAK, ol.lease_ack_body(key_f, ol.R | ol.H))) == 0
        assert rawsmb.status(d.final(fmid, faid)) == 0
        # The last member answers: the CREATE goes on, and is refused: the
        # members still read, and it shares no reading.
        assert rawsmb.status(b.call(ol.OPLOCK_BREAK, ol.lease_ack_body(key_b, ol.R))) == 0
        assert rawsmb.status(d.final(mid, aid)) == STATUS_SHARING_VIOLATION
        # The members hold what they acknowledged, at the break's epoch.
        assert ol.lease_of(lease_open(a, "g.txt", key_a, ol.R)) == (key_a, ol.R, 0, 2)
        assert rawsmb.status(d.call(CLOSE, close_body(d_reader))) == 0
    finally:
        for c in (a, b, d):
            c.close()


class TwoMembers:
    """Clients a and b of node 1 and `other` of node 2, each with a lease
    key of its own, the nodes' file "g.txt" holding `content`; closed on
    exit."""

    def __init__(self, nodes: list[Node], content: bytes):
        with_group_leases(nodes)
        (nodes[0].share / "g.txt").write_bytes(content)
        self.a = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
        self.b = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
        self.other = ol.Smb311Client(nodes[1], uuid.uuid4().bytes)
        self.key_a, self.key_b = uuid.uuid4().bytes, uuid.uuid4().bytes
        for c in (self.a, self.b, self.other):
            c.s.settimeout(WAIT)

    def __enter__(self) -> TwoMembers:
        return self

    def __exit__(self, *_) -> None:
        for c in (self.a, self.b, self.other):
            c.close()


def test_a_write_on_another_node_takes_read_caching_from_every_member(nodes):
    with TwoMembers(nodes, b"read, then written\n") as t:
        resp = t.other.create("g.txt")
        assert rawsmb.status(resp) == 0
        writer = ol.file_id_of(resp)
        assert ol.lease_of(lease_open(t.a, "g.txt", t.key_a, ol.R)) == (t.key_a, ol.R, 0, 1)
        assert ol.lease_of(lease_open(t.b, "g.txt", t.key_b, ol.R)) == (t.key_b, ol.R, 0, 1)
        assert rawsmb.status(t.other.call(WRITE, write_body(writer, 0, b"W"))) == 0
        # Each member is told, with its own key; read caching alone needs
        # no answer (MS-SMB2 3.3.4.7).
        for c, key in ((t.a, t.key_a), (t.b, t.key_b)):
            epoch, flags, got, current, new = break_of(c.recv())
            assert (flags, got, current, new, epoch) == (0, key, ol.R, 0, 2)
        assert rawsmb.status(t.other.call(CLOSE, close_body(writer))) == 0


def test_a_lock_through_the_first_member_takes_read_caching_from_the_others(nodes):
    with TwoMembers(nodes, b"locked by a reader\n") as t:
        assert rawsmb.status(t.other.create("g.txt", access=GENERIC_READ)) == 0
        # a's open is the group's first: its id names the group's entry.
        fa = ol.file_id_of(lease_open(t.a, "g.txt", t.key_a, ol.R | ol.H))
        assert ol.lease_of(lease_open(t.b, "g.txt", t.key_b, ol.R | ol.H)) == (t.key_b, ol.R | ol.H, 0, 1)
        # MS-FSA 2.1.5.7: a byte-range lock ends other opens' read caching.
        # The members' leases are one grant in the record: it is broken,
        # and each member is told (a's own too: its lease is its group's).
        # a's break comes before its lock's response.
        mid = t.a.send(LOCK, lock_body(fa, (0, 10, EXCLUSIVE | FAIL_IMMEDIATELY)))
        assert break_of(t.a.recv())[1:] == (ol.LEASE_BREAK_ACK_REQUIRED, t.key_a, ol.R | ol.H, 0)
        resp = t.a.recv()
        assert (message_id(resp), rawsmb.status(resp)) == (mid, 0)
        epoch, flags, got, current, new = break_of(t.b.recv())
        assert (flags, got, current, new, epoch) == (ol.LEASE_BREAK_ACK_REQUIRED, t.key_b, ol.R | ol.H, 0, 2)
        for c, key in ((t.a, t.key_a), (t.b, t.key_b)):
            assert rawsmb.status(c.call(ol.OPLOCK_BREAK, ol.lease_ack_body(key, 0))) == 0



def test_a_lock_through_the_group_s_first_open_without_a_lease_takes_read_caching_from_the_members(nodes):
    with TwoMembers(nodes, b"locked by a reader without a lease\n") as t:
        assert rawsmb.status(t.other.create("g.txt", access=GENERIC_READ)) == 0
        # The first open of node 1's group asks no lease: its id names the
        # group's entry, which is the one open of the members' grant.
        first = ol.Smb311Client(nodes[0], uuid.uuid4().bytes)
        try:
            first.s.settimeout(WAIT)
            resp = first.create("g.txt", access=GENERIC_READ)
            assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
            ff = ol.file_id_of(resp)
            for c, key in ((t.a, t.key_a), (t.b, t.key_b)):
                assert ol.lease_of(lease_open(c, "g.txt", key, ol.R | ol.H)) == (key, ol.R | ol.H, 0, 1)
            # Its lock is not the grant's holder's own: every member is told.
            resp = first.call(LOCK, lock_body(ff, (0, 10, EXCLUSIVE | FAIL_IMMEDIATELY)))
            assert rawsmb.status(resp) == 0, hex(rawsmb.status(resp))
            for c, key in ((t.a, t.key_a), (t.b, t.key_b)):
                epoch, flags, got, current, new = break_of(c.recv())
                assert (flags, got, current, new, epoch) == (ol.LEASE_BREAK_ACK_REQUIRED, key, ol.R | ol.H, 0, 2)
                assert rawsmb.status(c.call(ol.OPLOCK_BREAK, ol.lease_ack_body(key, 0))) == 0
        finally:
            first.close()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
