#!/usr/bin/env python3
"""Writes the seeds of the `rpc_pipe` fuzz target (fuzz/seeds/rpc_pipe/):
what a client writes to the srvsvc, wkssvc and lsarpc pipes of IPC$ (a BIND, then
REQUESTs for the calls served), in the target's input format: a byte
choosing the service, then each write as a 2-byte little-endian length and
its bytes.

    python3 fuzz/rpc_seeds.py
"""

from __future__ import annotations

import struct
import uuid
from pathlib import Path

OUT = Path(__file__).resolve().parent / "seeds" / "rpc_pipe"
NDR = (uuid.UUID("8a885d04-1ceb-11c9-9fe8-08002b104860"), 2, 0)
SRVSVC = (uuid.UUID("4b324fc8-1670-01d3-1278-5a47bf6ee188"), 3, 0)
WKSSVC = (uuid.UUID("6bffd098-a112-3610-9833-46c3f87e345a"), 1, 0)
LSARPC = (uuid.UUID("12345778-1234-abcd-ef00-0123456789ab"), 0, 0)
# The first policy handle a pipe issues (nimbus-rpc lsarpc::PolicyHandles).
HANDLE = b"\0" * 4 + struct.pack("<Q", 1) + b"nimbusLA"


def rpc_sid(authority: int, *subs: int) -> bytes:
    return struct.pack("<IBB", len(subs), 1, len(subs)) + authority.to_bytes(6, "big") + b"".join(struct.pack("<I", s) for s in subs)


def lookup_sids(*sids: bytes, v2: bool = False, handle: bool = True) -> bytes:
    out = (HANDLE if handle else b"") + struct.pack("<III", len(sids), 0x20000, len(sids))
    out += b"".join(struct.pack("<I", 0x20004 + 4 * i) for i in range(len(sids))) + b"".join(sids)
    out += struct.pack("<IIHxxI", 0, 0, 1, 0)
    return out + (struct.pack("<II", 0, 2) if v2 else b"")


def lookup_names(*names: str) -> bytes:
    out = HANDLE + struct.pack("<II", len(names), len(names))
    for i, n in enumerate(names):
        b = len(n.encode("utf-16-le"))
        out += struct.pack("<HHI", b, b, 0x20000 + 4 * i)
    for n in names:
        u = n.encode("utf-16-le")
        out += struct.pack("<III", len(u) // 2, 0, len(u) // 2) + u + b"\0" * (-len(u) % 4)
    return out + struct.pack("<IIHxxI", 0, 0, 1, 0)


def syntax(s) -> bytes:
    return s[0].bytes_le + struct.pack("<HH", s[1], s[2])


def pdu(ptype: int, flags: int, call_id: int, body: bytes) -> bytes:
    return struct.pack("<BBBB4sHHI", 5, 0, ptype, flags, b"\x10\0\0\0", 16 + len(body), 0, call_id) + body


def bind(interface) -> bytes:
    ctx = struct.pack("<HBB", 0, 1, 0) + syntax(interface) + syntax(NDR)
    return pdu(11, 3, 1, struct.pack("<HHIB3x", 4280, 4280, 0, 1) + ctx)


def request(call_id: int, opnum: int, stub: bytes, flags: int = 3) -> bytes:
    return pdu(0, flags, call_id, struct.pack("<IHH", len(stub), 0, opnum) + stub)


def wstr(s: str, ref: int | None = 0x20000) -> bytes:
    units = (s + "\0").encode("utf-16-le")
    n = len(units) // 2
    out = (struct.pack("<I", ref) if ref is not None else b"") + struct.pack("<III", n, 0, n) + units
    return out + b"\0" * (-len(out) % 4)


def writes(service: int, *parts: bytes) -> bytes:
    return bytes([service]) + b"".join(struct.pack("<H", len(p)) + p for p in parts)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    server = wstr("\\\\127.0.0.1")
    enum = lambda level: server + struct.pack("<IIIIIIII", level, level, 0x20004, 0, 0, 0xFFFFFFFF, 0x20008, 0)
    seeds = {
        "srvsvc-enum-levels": writes(0, bind(SRVSVC), *(request(i + 2, 15, enum(l)) for i, l in enumerate([0, 1, 2, 501, 502]))),
        "srvsvc-getinfo": writes(0, bind(SRVSVC), request(2, 16, server + wstr("data", None) + struct.pack("<I", 1)), request(3, 16, server + wstr("IPC$", None) + struct.pack("<I", 1005))),
        "srvsvc-serverinfo": writes(0, bind(SRVSVC), request(2, 21, server + struct.pack("<I", 101))),
        "srvsvc-fragmented": writes(0, bind(SRVSVC), request(2, 15, enum(1)[:12], 1), request(2, 15, enum(1)[12:], 2)),
        "lsarpc-lookups": writes(
            4,
            bind(LSARPC),
            request(2, 44, b""),
            request(3, 15, lookup_sids(rpc_sid(22, 1, 0), rpc_sid(1, 0), rpc_sid(5, 21, 1, 2, 3, 500))),
            request(4, 57, lookup_sids(rpc_sid(5, 18), v2=True)),
            request(5, 76, lookup_sids(rpc_sid(22, 2, 0), v2=True, handle=False)),
            request(6, 14, lookup_names("root", "Unix Group\\root", "Everyone")),
            request(7, 7, HANDLE + struct.pack("<H", 3)),
            request(8, 0, HANDLE),
        ),
        "wkssvc-getinfo": writes(1, bind(WKSSVC), request(2, 0, server + struct.pack("<I", 100)), request(3, 0, server + struct.pack("<I", 101))),
    }
    for name, data in seeds.items():
        (OUT / name).write_bytes(data)
    print(f"wrote {len(seeds)} seeds to {OUT}")


if __name__ == "__main__":
    main()
