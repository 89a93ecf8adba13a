"""Produce v0-2 (magic v0/v1 message sets): parsed just enough to refuse them cleanly.

kio starts at Produce v3. Old clients still get a well-formed answer with
UNSUPPORTED_VERSION per partition instead of a dropped connection.
"""

from __future__ import annotations

import struct

from cluster.protocol.errors import ErrorCode, ProtocolError

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class _Cursor:
    def __init__(self, buf: bytes | bytearray, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ProtocolError("legacy produce request is truncated")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self.take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self.take(4))[0]

    def count(self, min_item_bytes: int) -> int:
        n = self.i32()
        if n < 0 or n * min_item_bytes > len(self.buf) - self.pos:
            raise ProtocolError(f"legacy produce declares {n} items that cannot fit")
        return n


def refuse_legacy_produce(version: int, correlation_id: int, frame: bytes | bytearray, body_offset: int) -> bytes | None:
    """The size-prefixed v0-2 response refusing every partition, or None for acks=0."""
    cur = _Cursor(frame, body_offset)
    acks = cur.i16()
    cur.i32()  # timeout
    topics = []
    for _ in range(cur.count(6)):
        name = cur.take(cur.i16())
        parts = []
        for _ in range(cur.count(8)):
            parts.append(cur.i32())
            cur.take(cur.i32())
        topics.append((name, parts))
    if acks == 0:
        return None
    out = bytearray(_I32.pack(correlation_id))
    out += _I32.pack(len(topics))
    for name, parts in topics:
        out += _I16.pack(len(name)) + name + _I32.pack(len(parts))
        for p in parts:
            out += _I32.pack(p) + _I16.pack(ErrorCode.unsupported_version) + struct.pack(">q", -1)
            if version >= 2:
                out += struct.pack(">q", -1)
    if version >= 1:
        out += _I32.pack(0)
    return _I32.pack(len(out)) + bytes(out)
