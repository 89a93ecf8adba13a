"""Shared hypothesis helpers for the fuzz tests."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import strategies as st

INT32_MAX = 2**31 - 1


def mutate(data: bytes, draw: Any) -> bytes:
    """Overwrite, insert, delete, truncate or splice boundary integers into `data`."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "int32", "int16", "null-array"]))
        pos = draw(st.integers(0, len(buf)))
        if kind == "null-array":
            # An empty array's int32 count 0 becomes -1 (null), keeping the length.
            zeros = [i for i in range(len(buf) - 3) if buf[i : i + 4] == b"\x00\x00\x00\x00"]
            if zeros:
                i = draw(st.sampled_from(zeros))
                buf[i : i + 4] = b"\xff\xff\xff\xff"
        elif kind == "flip" and pos < len(buf):
            buf[pos] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del buf[pos : pos + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del buf[pos:]
        elif kind in ("int32", "int16"):
            fmt, values = (">i", [-(2**31), -2, -1, 0, 1, 0x7FFF, INT32_MAX]) if kind == "int32" else (
                ">h", [-32768, -2, -1, 0, 1, 32767])
            packed = struct.pack(fmt, draw(st.sampled_from(values)))
            buf[pos : pos + len(packed)] = packed
    return bytes(buf)
