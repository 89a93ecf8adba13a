"""Hand-built RecordBatch v2 (magic 2) encoding for storage tests.

Uncompressed only. The layout follows the Kafka protocol guide: a 61-byte batch header
(base offset, length, partition leader epoch, magic, CRC32C over attributes..end,
attributes, last offset delta, first/max timestamp, producer id/epoch, base sequence,
record count) then the records, each a varint-length-prefixed structure of zig-zag
varints and byte strings.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from crc32c import crc32c

Header = tuple[str, bytes | None]

# Everything from "attributes" on (covered by the CRC).
_AFTER_CRC = struct.Struct(">hiqqqhii")
# base offset, batch length, partition leader epoch, magic, crc
_PREFIX = struct.Struct(">qiibI")


@dataclass(frozen=True)
class Rec:
    """One record to encode; timestamp None = the batch's base timestamp."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[Header] = field(default_factory=tuple)
    timestamp: int | None = None


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    z &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _bytes_field(b: bytes | None) -> bytes:
    if b is None:
        return _zigzag_varint(-1)
    return _zigzag_varint(len(b)) + b


def encode_record(offset_delta: int, timestamp_delta: int, rec: Rec) -> bytes:
    body = bytearray()
    body.append(0)  # attributes (unused)
    body += _zigzag_varint(timestamp_delta)
    body += _zigzag_varint(offset_delta)
    body += _bytes_field(rec.key)
    body += _bytes_field(rec.value)
    body += _zigzag_varint(len(rec.headers))
    for hk, hv in rec.headers:
        body += _bytes_field(hk.encode())
        body += _bytes_field(hv)
    return _zigzag_varint(len(body)) + bytes(body)


def encode_batch(
    records: Sequence[Rec | bytes],
    *,
    base_timestamp: int = 1_700_000_000_000,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    attributes: int = 0,
) -> bytes:
    """One uncompressed magic-2 batch. Plain `bytes` items are values without key/headers.

    Record timestamps default to the batch's base timestamp; maxTimestamp is the largest
    record timestamp.
    """
    recs = [r if isinstance(r, Rec) else Rec(r) for r in records]
    assert recs, "a batch needs at least one record"
    stamps = [base_timestamp if r.timestamp is None else r.timestamp for r in recs]
    first_ts = stamps[0]
    body = b"".join(encode_record(i, ts - first_ts, r) for i, (r, ts) in enumerate(zip(recs, stamps, strict=True)))
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            len(recs) - 1,  # last offset delta
            first_ts,
            max(stamps),
            producer_id,
            producer_epoch,
            base_sequence,
            len(recs),
        )
        + body
    )
    crc = crc32c(after_crc)
    # batchLength counts everything after the length field itself.
    batch_length = 4 + 1 + 4 + len(after_crc)
    return _PREFIX.pack(base_offset, batch_length, partition_leader_epoch, 2, crc) + after_crc


def values_batch(
    values: Sequence[bytes],
    *,
    ts: int = 1_700_000_000_000,
    ts_step: int = 0,
    **kwargs: int,
) -> bytes:
    """Batch of plain values with timestamps ts, ts+step, ts+2*step, ..."""
    return encode_batch(
        [Rec(v, timestamp=ts + i * ts_step) for i, v in enumerate(values)], base_timestamp=ts, **kwargs
    )
