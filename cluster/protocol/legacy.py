"""Produce v0-2: message sets of magic 0 and 1, up-converted to record batches v2.

Kafka 3.x accepted them and converted on append (4.0 removed them); so does this broker.
kio starts at Produce v3, so a v0-2 request is read here and becomes a v3 request that
the ordinary produce path handles (ACLs, quotas, acks, min.insync.replicas, record
validation); its answer goes back in the client's version. Sans-IO.

A message (magic 0 and 1): crc (CRC-32 of what follows), magic, attributes (the codec in
the low 3 bits; magic 1: bit 3 = LogAppendTime), magic 1: a timestamp, then key and value
as int32-length bytes. A compressed message is a wrapper whose value is a compressed
message set; its inner messages are never compressed again. Magic 0 has no timestamp: the
records get -1 (no timestamp), as Kafka's up-conversion gives them. Batches are written
uncompressed, one per partition, without a producer id (v0-2 producers have none).

Every bound is checked before anything is allocated: the frame's own size bounds the
counts, and the compressed wrappers of one set inflate to `max_inflated_bytes` together.
"""

from __future__ import annotations

import datetime
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from kio.schema.produce.v3 import request as produce_v3

from cluster.protocol.errors import ErrorCode, ProtocolError
from cluster.protocol.records import InvalidRecordBatch, Record, decompress, encode_batch

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MESSAGE_HEADER = struct.Struct(">qi")  # offset, size
_MESSAGE_START = struct.Struct(">Ibb")  # crc, magic, attributes
_CODEC_MASK = 0x07
_LOG_APPEND_TIME = 0x08
MAX_INFLATED_BYTES = 64 << 20  # what one compressed message set may inflate to


class CorruptMessageSet(ValueError):
    """A message set that cannot be read: its partition is answered CORRUPT_MESSAGE."""


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
        return int(_I16.unpack(self.take(2))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def count(self, min_item_bytes: int) -> int:
        n = self.i32()
        if n < 0 or n * min_item_bytes > len(self.buf) - self.pos:
            raise ProtocolError(f"legacy produce declares {n} items that cannot fit")
        return n


def _bytes_field(msg: bytes, pos: int) -> tuple[bytes | None, int]:
    if pos + 4 > len(msg):
        raise CorruptMessageSet("message ends inside a length")
    (n,) = _I32.unpack_from(msg, pos)
    pos += 4
    if n == -1:
        return None, pos
    if n < 0 or pos + n > len(msg):
        raise CorruptMessageSet(f"message field of {n} bytes does not fit")
    return msg[pos : pos + n], pos + n


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_U32 = 0xFFFFFFFF


def _xxh32_short(data: bytes) -> int:
    """xxHash32 (seed 0) of fewer than 16 bytes: an LZ4 frame descriptor's checksum."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    assert len(data) < 16

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & _U32

    h = (p5 + len(data)) & _U32
    i = 0
    while i + 4 <= len(data):
        h = (rotl((h + int.from_bytes(data[i : i + 4], "little") * p3) & _U32, 17) * p4) & _U32
        i += 4
    for b in data[i:]:
        h = (rotl((h + b * p5) & _U32, 11) * p1) & _U32
    h ^= h >> 15
    h = (h * p2) & _U32
    h ^= h >> 13
    h = (h * p3) & _U32
    return h ^ (h >> 16)


def _fix_magic0_lz4(data: bytes) -> bytes:
    """Kafka's clients before 0.10 wrote the LZ4 frame's header checksum over the wrong
    bytes (KAFKA-3160); Kafka reads magic 0 LZ4 ignoring it. Here it is written right."""
    if len(data) < 7 or data[:4] != _LZ4_MAGIC:
        return data
    flags = data[4]
    descriptor_len = 2 + (8 if flags & 0x08 else 0) + (4 if flags & 0x01 else 0)
    at = 4 + descriptor_len
    if len(data) <= at:
        return data
    checksum = (_xxh32_short(data[4:at]) >> 8) & 0xFF
    return data[:at] + bytes([checksum]) + data[at + 1 :]


def read_message_set(data: bytes, *, max_inflated_bytes: int = MAX_INFLATED_BYTES,
                     _wrapped: bool = False) -> Iterator[tuple[int, bytes | None, bytes | None]]:
    """(timestamp, key, value) of every message, compressed wrappers opened. All the
    wrappers of one set together inflate to at most `max_inflated_bytes` (a frame of many
    small compressed wrappers must not multiply the bound)."""
    pos = 0
    inflated_left = max_inflated_bytes
    if not data and not _wrapped:
        raise CorruptMessageSet("empty message set")
    while pos < len(data):
        if len(data) - pos < _MESSAGE_HEADER.size:
            raise CorruptMessageSet("message set ends inside a message header")
        _, size = _MESSAGE_HEADER.unpack_from(data, pos)
        pos += _MESSAGE_HEADER.size
        if size < _MESSAGE_START.size + 8 or pos + size > len(data):
            raise CorruptMessageSet(f"message of {size} bytes does not fit its set")
        msg = data[pos : pos + size]
        pos += size
        crc, magic, attributes = _MESSAGE_START.unpack_from(msg, 0)
        if zlib.crc32(msg[4:]) != crc:
            raise CorruptMessageSet("message CRC does not match")
        if magic not in (0, 1):
            raise CorruptMessageSet(f"magic {magic} in a v0-2 produce")
        at = _MESSAGE_START.size
        timestamp = -1
        if magic == 1:
            if at + 8 > len(msg):
                raise CorruptMessageSet("message ends inside its timestamp")
            (timestamp,) = _I64.unpack_from(msg, at)
            at += 8
        key, at = _bytes_field(msg, at)
        value, at = _bytes_field(msg, at)
        codec = attributes & _CODEC_MASK
        if codec == 0:
            yield timestamp, key, value
            continue
        if _wrapped:
            raise CorruptMessageSet("a compressed message inside a compressed message")
        if value is None:
            raise CorruptMessageSet("a compressed message without a value")
        if codec == 3 and magic == 0:
            value = _fix_magic0_lz4(value)
        try:
            inner = decompress(codec, value, max_size_bytes=inflated_left)
        except InvalidRecordBatch as exc:
            raise CorruptMessageSet(str(exc)) from None
        inflated_left -= len(inner)
        for ts, k, v in read_message_set(inner, max_inflated_bytes=max_inflated_bytes, _wrapped=True):
            # LogAppendTime on the wrapper: the broker's time replaces the inner ones anyway.
            yield (timestamp if magic == 1 and attributes & _LOG_APPEND_TIME else ts), k, v


def up_convert(data: bytes, *, max_inflated_bytes: int = MAX_INFLATED_BYTES) -> bytes:
    """A message set as one uncompressed record batch v2."""
    records = [Record(i, ts, key, value, ())
               for i, (ts, key, value) in enumerate(read_message_set(data, max_inflated_bytes=max_inflated_bytes))]
    return encode_batch(records)


@dataclass
class LegacyProduce:
    """A v0-2 produce read: the v3 request to run and the partitions refused on the way."""

    version: int
    acks: int
    request: Any  # kio ProduceRequest v3
    order: list[tuple[bytes, str, list[int]]]  # topics (as sent, as read) and partitions, for the answer
    refused: dict[tuple[bytes, int], int] = field(default_factory=dict)  # by the name as sent


def decode_legacy_produce(version: int, frame: bytes | bytearray, body_offset: int) -> LegacyProduce:
    """Read a Produce v0-2 body; raises ProtocolError when the frame itself is malformed
    (the connection closes), while a bad message set refuses only its partition."""
    cur = _Cursor(frame, body_offset)
    acks = cur.i16()
    timeout_ms = cur.i32()
    order: list[tuple[bytes, str, list[int]]] = []
    refused: dict[tuple[bytes, int], int] = {}
    topics = []
    for _ in range(cur.count(6)):
        raw_name = cur.take(cur.i16())
        try:
            name: str | None = raw_name.decode("utf-8")
        except UnicodeDecodeError:
            # No topic has such a name; decoding with replacement could make two names one.
            name = None
        indexes: list[int] = []
        parts = []
        for _ in range(cur.count(8)):
            index = cur.i32()
            data = cur.take(cur.i32())
            indexes.append(index)
            if name is None:
                refused[(raw_name, index)] = ErrorCode.invalid_topic_exception
                continue
            try:
                batch = up_convert(data)
            except (CorruptMessageSet, ValueError):
                refused[(raw_name, index)] = ErrorCode.corrupt_message
                continue
            parts.append(produce_v3.PartitionProduceData(index=index, records=batch))  # type: ignore[arg-type]
        order.append((raw_name, name or "", indexes))
        if parts and name is not None:
            topics.append(produce_v3.TopicProduceData(name=name, partition_data=tuple(parts)))  # type: ignore[arg-type]
    if cur.pos != len(frame):
        raise ProtocolError(f"{len(frame) - cur.pos} bytes after a legacy produce request")
    request = produce_v3.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=max(0, timeout_ms)),  # type: ignore[arg-type]
        topic_data=tuple(topics))
    return LegacyProduce(version, acks, request, order, refused)


def encode_legacy_produce_response(legacy: LegacyProduce, correlation_id: int, answer: dict[str, Any]) -> bytes:
    """The size-prefixed v0-2 answer: every partition asked, in the order asked."""
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for t in answer.get("responses", []):
        for p in t["partition_responses"]:
            results[(t["name"], int(p["index"]))] = p
    out = bytearray(_I32.pack(correlation_id))
    out += _I32.pack(len(legacy.order))
    for raw_name, name, indexes in legacy.order:
        out += _I16.pack(len(raw_name)) + raw_name + _I32.pack(len(indexes))
        for index in indexes:
            refused = legacy.refused.get((raw_name, index))
            p = {"error_code": refused} if refused is not None else results.get((name, index), {})
            code = p.get("error_code", ErrorCode.unknown_server_error)
            out += _I32.pack(index) + _I16.pack(int(code)) + _I64.pack(int(p.get("base_offset", -1)))
            if legacy.version >= 2:
                out += _I64.pack(int(p.get("log_append_time", -1)))
    if legacy.version >= 1:
        out += _I32.pack(int(answer.get("throttle_time", 0)))
    return _I32.pack(len(out)) + bytes(out)
