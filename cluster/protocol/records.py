"""Per-record decoding of RecordBatch v2 (with decompression).

Only where semantics demand records: timestamp lookup, compaction, clients. The broker's
produce and fetch paths never call this.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import cramjam
from crc32c import crc32c

from cluster.protocol.record_batch import (
    BATCH_HEADER_SIZE,
    COMPRESSION_MASK,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidRecordBatch,
    read_header,
)

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"


class Record(NamedTuple):
    """One record with its absolute offset and timestamp (a tuple: clients decode millions)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


def _snappy_decompress(data: bytes) -> bytes:
    # The Java client frames snappy the xerial way; librdkafka writes raw blocks.
    if data.startswith(_XERIAL_MAGIC):
        out = bytearray()
        pos = 16  # magic (8) + version (4) + compatible version (4)
        while pos < len(data):
            n = int.from_bytes(data[pos : pos + 4], "big")
            pos += 4
            out += bytes(cramjam.snappy.decompress_raw(data[pos : pos + n]))
            pos += n
        return bytes(out)
    return bytes(cramjam.snappy.decompress_raw(data))


def decompress(codec: int, data: bytes, *, max_size_bytes: int = 256 << 20) -> bytes:
    """Inflate a batch's records section; the output size is bounded."""
    if codec == COMPRESSION_NONE:
        return data
    try:
        if codec == COMPRESSION_GZIP:
            out = bytes(cramjam.gzip.decompress(data))
        elif codec == COMPRESSION_SNAPPY:
            out = _snappy_decompress(data)
        elif codec == COMPRESSION_LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        elif codec == COMPRESSION_ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        else:
            raise InvalidRecordBatch(f"unknown compression codec {codec}")
    except cramjam.DecompressionError as exc:
        raise InvalidRecordBatch(f"{CODEC_NAMES.get(codec, codec)} records do not decompress: {exc}") from None
    if len(out) > max_size_bytes:
        raise InvalidRecordBatch(f"records inflate to {len(out)} bytes, above {max_size_bytes}")
    return out


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    result = 0
    while True:
        if pos >= len(buf):
            raise InvalidRecordBatch("varint runs past the end of the records")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise InvalidRecordBatch("varint is too long")
    return (result >> 1) ^ -(result & 1), pos


def _bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise InvalidRecordBatch("record field runs past the end of the records")
    return buf[pos : pos + n], pos + n


def _decode_records_py(body: bytes, count: int, base_offset: int, base_timestamp: int) -> list[Record]:
    """The reference decoder (and the fallback without the C codec): the `count` records of
    an uncompressed records section; every length is checked against the bytes that remain."""
    records: list[Record] = []
    size = len(body)
    p = 0
    for _ in range(count):
        length, p = _varint(body, p)
        end = p + length
        if length < 0 or end > size:
            raise InvalidRecordBatch("record length runs past the end of the batch")
        if p >= end:
            raise InvalidRecordBatch("record is empty")
        p += 1  # attributes
        ts_delta, p = _varint(body, p)
        off_delta, p = _varint(body, p)
        key, p = _bytes(body, p)
        value, p = _bytes(body, p)
        n_headers, p = _varint(body, p)
        if n_headers < 0 or n_headers > end - p:
            raise InvalidRecordBatch(f"record declares {n_headers} headers")
        headers = []
        for _ in range(n_headers):
            hk, p = _bytes(body, p)
            hv, p = _bytes(body, p)
            headers.append(((hk or b"").decode("utf-8", "replace"), hv))
        if p != end:
            raise InvalidRecordBatch("record length does not match its fields")
        records.append(Record(base_offset + off_delta, base_timestamp + ts_delta, key, value, tuple(headers)))
    return records


def decode_batch(batch: bytes, pos: int = 0) -> tuple[BatchHeader, list[Record]]:
    """Every record of the batch at `pos` (decompressed)."""
    header = read_header(batch, pos)
    end = pos + LOG_OVERHEAD + header.batch_length
    if end > len(batch):
        raise InvalidRecordBatch("record batch is truncated")
    body = decompress(header.compression, bytes(batch[pos + BATCH_HEADER_SIZE : end]))
    return header, decode_records(body, header.records_count, header.base_offset, header.base_timestamp)


# ---- encoding ---------------------------------------------------------------------------

_COMPRESSORS = {
    COMPRESSION_GZIP: lambda b: bytes(cramjam.gzip.compress(b)),
    COMPRESSION_SNAPPY: lambda b: bytes(cramjam.snappy.compress_raw(b)),
    # level 1: LZ4 fast mode, as librdkafka (cramjam's default is about 4x slower for the same size here)
    COMPRESSION_LZ4: lambda b: bytes(cramjam.lz4.compress(b, level=1)),
    COMPRESSION_ZSTD: lambda b: bytes(cramjam.zstd.compress(b)),
}


def _zigzag(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# Encoded varints of 0 .. 2**14-1: record lengths, deltas and sizes are almost always small.
_VARINTS = [_zigzag(i) for i in range(1 << 14)]
_VARINT_TABLE_SIZE = len(_VARINTS)
_NULL = _zigzag(-1)


def varint(value: int) -> bytes:
    return _VARINTS[value] if 0 <= value < _VARINT_TABLE_SIZE else _zigzag(value)


def _field(value: bytes | None) -> bytes:
    return _NULL if value is None else varint(len(value)) + value


def _append_record_py(body: bytearray, offset_delta: int, timestamp_delta: int, key: bytes | None,
                      value: bytes | None, headers: Headers = ()) -> int:
    """Append one record to a records section; returns its encoded size. The producer's hot path."""
    t = _VARINTS
    if headers:
        hs = b"".join(_field(k.encode()) + _field(v) for k, v in headers)
        tail = varint(len(headers)) + hs
    else:
        tail = b"\x00"
    rec = b"".join((
        b"\x00",
        t[timestamp_delta] if 0 <= timestamp_delta < _VARINT_TABLE_SIZE else _zigzag(timestamp_delta),
        t[offset_delta] if offset_delta < _VARINT_TABLE_SIZE else _zigzag(offset_delta),
        _NULL if key is None else (t[len(key)] if len(key) < _VARINT_TABLE_SIZE else _zigzag(len(key))) + key,
        _NULL if value is None else (t[len(value)] if len(value) < _VARINT_TABLE_SIZE else _zigzag(len(value))),
        b"" if value is None else value,
        tail,
    ))
    n = len(rec)
    prefix = t[n] if n < _VARINT_TABLE_SIZE else _zigzag(n)
    body += prefix
    body += rec
    return len(prefix) + n


Headers = tuple[tuple[str, bytes | None], ...] | list[tuple[str, bytes | None]]


def _append_tagged_py(body: bytearray, records: Sequence[Record], start: int, offset_delta: int,
                      base_timestamp: int, batch_size: int, prefix: Headers, offset_key: str,
                      suffix: Headers, max_record_bytes: int) -> tuple[int, int, int, int, int, bool]:
    """Append `records[start:]` (decoded records, e.g. fetched from another cluster) to a
    records section whose next offset delta is `offset_delta`, each with headers
    ``prefix + ((offset_key, b"<its offset>"),) + suffix`` — the mirror's provenance — until
    a record has headers of its own or a key and value longer than `max_record_bytes` (the
    caller decides about those) or the section would pass `batch_size` bytes (a section
    holding no record yet takes one of any size).

    Returns (next index, records appended, bytes appended, max timestamp or -1, value bytes
    appended, full) where `full` says the section has no room for records[next index]."""
    i, n = start, len(records)
    appended = nbytes = value_bytes = 0
    max_ts = -1
    while i < n:
        offset, timestamp, key, value, headers = records[i]
        if headers or (len(key) if key is not None else 0) + (len(value) if value is not None else 0) > max_record_bytes:
            break
        if offset_delta + appended and len(body) >= batch_size:
            return i, appended, nbytes, max_ts, value_bytes, True
        size = _append_record_py(body, offset_delta + appended, timestamp - base_timestamp, key, value,
                                 (*prefix, (offset_key, b"%d" % offset), *suffix))
        if offset_delta + appended and len(body) > batch_size:
            del body[-size:]
            return i, appended, nbytes, max_ts, value_bytes, True
        appended += 1
        nbytes += size
        if timestamp > max_ts:
            max_ts = timestamp
        if value is not None:
            value_bytes += len(value)
        i += 1
    return i, appended, nbytes, max_ts, value_bytes, False


try:
    from cluster.protocol import _speedups  # type: ignore[attr-defined]
except ImportError:  # no compiler when installed: the Python codec, same results
    _speedups = None  # type: ignore[assignment]

decode_records: Callable[[bytes, int, int, int], list[Record]]
"""The `count` records of an (uncompressed) records section: decode_records(body, count, base_offset, base_timestamp)."""
append_tagged: Callable[..., tuple[int, int, int, int, int, bool]]
"""Append records with provenance-style headers in one call (see _append_tagged_py)."""
append_record: Callable[..., int]
"""Append one record to a records section; returns its encoded size:
append_record(body, offset_delta, timestamp_delta, key, value, headers=()). The producer's hot path."""
if _speedups is not None:
    _speedups.set_error_class(InvalidRecordBatch)
    decode_records = functools.partial(_speedups.decode_records, Record)
    append_record = _speedups.append_record
    append_tagged = _speedups.append_tagged
else:
    decode_records = _decode_records_py
    append_record = _append_record_py
    append_tagged = _append_tagged_py
CODEC_BACKEND = "c" if _speedups is not None else "python"


def compress(codec: int, data: bytes) -> bytes:
    return data if codec == COMPRESSION_NONE else _COMPRESSORS[codec](data)


_BATCH_AFTER_CRC = struct.Struct(">hiqqqhii")
_BATCH_BEFORE_CRC = struct.Struct(">qiibI")


def batch_from_records_section(records_section: bytes, *, count: int, base_offset: int, last_offset_delta: int,
                               base_timestamp: int, max_timestamp: int, producer_id: int = -1,
                               producer_epoch: int = -1, base_sequence: int = -1, partition_leader_epoch: int = -1,
                               compression: int = COMPRESSION_NONE, attributes_extra: int = 0) -> bytes:
    """A magic-2 batch around an encoded records section (compressed here)."""
    payload = compress(compression, records_section)
    attributes = (compression & COMPRESSION_MASK) | attributes_extra
    after_crc = _BATCH_AFTER_CRC.pack(attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id,
                                      producer_epoch, base_sequence, count) + payload
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, rest
    return _BATCH_BEFORE_CRC.pack(base_offset, batch_length, partition_leader_epoch, 2, crc32c(after_crc)) + after_crc


def encode_batch(
    records: list[Record],
    *,
    base_offset: int | None = None,
    last_offset_delta: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    compression: int = COMPRESSION_NONE,
    attributes_extra: int = 0,
    max_timestamp: int | None = None,
) -> bytes:
    """A magic-2 batch of `records` (their offsets and timestamps are kept as deltas).

    `last_offset_delta` may exceed len(records) - 1 when records were removed (compaction).
    """
    if not records and not attributes_extra:
        raise ValueError("a record batch needs at least one record")
    base = records[0].offset if base_offset is None else base_offset
    base_ts = min((r.timestamp for r in records), default=-1)
    max_ts = max((r.timestamp for r in records), default=-1) if max_timestamp is None else max_timestamp
    body = bytearray()
    for r in records:
        append_record(body, r.offset - base, r.timestamp - base_ts, r.key, r.value, r.headers)
    delta = (records[-1].offset - base if records else 0) if last_offset_delta is None else last_offset_delta
    return batch_from_records_section(
        bytes(body), count=len(records), base_offset=base, last_offset_delta=delta, base_timestamp=base_ts,
        max_timestamp=max_ts, producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        partition_leader_epoch=partition_leader_epoch, compression=compression, attributes_extra=attributes_extra)


CODEC_IDS = {name: codec for codec, name in CODEC_NAMES.items()} | {"uncompressed": COMPRESSION_NONE}
_MAX_TIMESTAMP_OFFSET = 35
_ATTR = struct.Struct(">h")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")


def rewrite_batch(batch: bytes | memoryview, *, compression: int | None, log_append_time_ms: int | None) -> bytes:
    """A batch conformed to topic configs: recompressed and/or stamped with LogAppendTime.

    Stamping alone only patches attributes and maxTimestamp and recomputes the CRC; a codec
    change decodes and re-encodes the records (offsets, timestamps, producer fields kept).
    """
    header = read_header(batch)
    if compression is not None and compression != header.compression:
        _, records = decode_batch(bytes(batch))
        return encode_batch(
            records, base_offset=header.base_offset, last_offset_delta=header.last_offset_delta,
            producer_id=header.producer_id, producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence, partition_leader_epoch=header.partition_leader_epoch,
            compression=compression,
            attributes_extra=(header.attributes & ~COMPRESSION_MASK & ~0x08) | (0x08 if log_append_time_ms is not None else 0),
            max_timestamp=log_append_time_ms,
        )
    out = bytearray(batch)
    if log_append_time_ms is not None:
        _ATTR.pack_into(out, 21, header.attributes | 0x08)
        _I64.pack_into(out, _MAX_TIMESTAMP_OFFSET, log_append_time_ms)
        _U32.pack_into(out, 17, crc32c(memoryview(out)[21:]))
    return bytes(out)
