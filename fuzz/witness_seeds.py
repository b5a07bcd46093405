#!/usr/bin/env python3
"""Writes the seeds of the `rpc_ip_tcp` fuzz target (fuzz/seeds/rpc_ip_tcp/)
and its first regression inputs: what a client sends to the witness
service's port and to the endpoint mapper, in the target's input format (a
mode byte, then for mode 0 each PDU as a 2-byte little-endian length and its
bytes; for modes 1 and 2 a bare stub).

    python3 fuzz/witness_seeds.py
"""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
NDR = (uuid.UUID("8a885d04-1ceb-11c9-9fe8-08002b104860"), 2, 0)
WITNESS = (uuid.UUID("ccd8c074-d0e5-4a40-92b4-d074faa6ba28"), 1, 1)
EPMAPPER = (uuid.UUID("e1af8308-5d1f-11c9-91a4-08002b14a0fa"), 3, 0)


def syntax(s) -> bytes:
    return s[0].bytes_le + struct.pack("<HH", s[1], s[2])


def pdu(ptype: int, call_id: int, body: bytes, auth: bytes = b"") -> bytes:
    """`auth`: the 8-byte sec_trailer and the token; auth_length counts the token."""
    length = 16 + len(body) + len(auth)
    auth_length = max(len(auth) - 8, 0)
    return struct.pack("<BBBB4sHHI", 5, 0, ptype, 3, b"\x10\0\0\0", length, auth_length, call_id) + body + auth


def bind(iface, auth: bytes = b"") -> bytes:
    body = struct.pack("<HHI", 5840, 5840, 0) + struct.pack("<BBH", 1, 0, 0)
    body += struct.pack("<HBB", 0, 1, 0) + syntax(iface) + syntax(NDR)
    return pdu(11, 1, body, auth)


def request(call_id: int, opnum: int, stub: bytes) -> bytes:
    return pdu(0, call_id, struct.pack("<IHH", len(stub), 0, opnum) + stub)


def stream(*pdus: bytes) -> bytes:
    return b"\0" + b"".join(struct.pack("<H", len(p)) + p for p in pdus)


def tower(iface) -> bytes:
    floors = [
        (b"\x0d" + syntax(iface)[:18], struct.pack("<H", iface[2])),
        (b"\x0d" + syntax(NDR)[:18], b"\0\0"),
        (b"\x0b", b"\0\0"),
        (b"\x07", b"\0\0"),
        (b"\x09", b"\0\0\0\0"),
    ]
    t = struct.pack("<H", len(floors))
    for lhs, rhs in floors:
        t += struct.pack("<H", len(lhs)) + lhs + struct.pack("<H", len(rhs)) + rhs
    return t


def ept_map(iface) -> bytes:
    t = tower(iface)
    stub = struct.pack("<I", 0) + struct.pack("<III", 0x20000, len(t), len(t)) + t
    stub += b"\0" * (-len(stub) % 4)
    return stub + b"\0" * 20 + struct.pack("<I", 4)


def wstr(s: str, referent: int) -> bytes:
    units = (s + "\0").encode("utf-16-le")
    out = struct.pack("<IIII", referent, len(units) // 2, 0, len(units) // 2) + units
    return out + b"\0" * (-len(out) % 4)


def register_ex() -> bytes:
    return struct.pack("<I", 0x00020000) + wstr("NIMBUS", 0x20000) + wstr("data", 0x20004) + wstr("127.0.0.1", 0x20008) + wstr("client", 0x2000C) + struct.pack("<II", 0, 30)


SEEDS = {
    "epmapper-map-witness": stream(bind(EPMAPPER), request(2, 3, ept_map(WITNESS))),
    "witness-unauthenticated-register": stream(bind(WITNESS), request(2, 4, register_ex())),
    # A BIND carrying an NTLMSSP NEGOTIATE at the privacy level.
    "witness-bind-ntlmssp": stream(bind(WITNESS, struct.pack("<BBBBI", 10, 6, 0, 0, 0) + b"NTLMSSP\0\x01\0\0\0\x37\x82\x08\xe2" + b"\0" * 16)),
    "witness-register-ex-stub": b"\x01" + register_ex(),
    "epmapper-map-stub": b"\x02" + ept_map(WITNESS),
}

REGRESSIONS = {
    # auth_length larger than the PDU: refused, never sliced past the end.
    "auth-length-past-the-pdu": stream(pdu(11, 1, bind(WITNESS)[16:], b"")[:10] + b"\xff\x7f" + pdu(11, 1, bind(WITNESS)[16:])[12:]),
    # A tower that claims 4 GiB.
    "tower-claims-4-gib": b"\x02" + struct.pack("<IIII", 0, 0x20000, 0xFFFFFFFF, 0xFFFFFFFF),
}


def main() -> None:
    for sub, files in (("seeds/rpc_ip_tcp", SEEDS), ("regressions/rpc_ip_tcp", REGRESSIONS)):
        d = HERE / sub
        d.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (d / name).write_bytes(data)


if __name__ == "__main__":
    main()
