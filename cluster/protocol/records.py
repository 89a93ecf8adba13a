"""Per-record decoding of RecordBatch v2 (with decompression).

Only where semantics demand records: timestamp lookup, compaction, clients. The broker's
produce and fetch paths never call this.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class Record:
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


def decode_batch(batch: bytes, pos: int = 0) -> tuple[BatchHeader, list[Record]]:
    """Every record of the batch at `pos` (decompressed)."""
    header = read_header(batch, pos)
    end = pos + LOG_OVERHEAD + header.batch_length
    if end > len(batch):
        raise InvalidRecordBatch("record batch is truncated")
    body = decompress(header.compression, bytes(batch[pos + BATCH_HEADER_SIZE : end]))
    records: list[Record] = []
    p = 0
    for _ in range(header.records_count):
        length, p = _varint(body, p)
        record_end = p + length
        if length < 0 or record_end > len(body):
            raise InvalidRecordBatch("record length runs past the end of the batch")
        p += 1  # attributes
        ts_delta, p = _varint(body, p)
        off_delta, p = _varint(body, p)
        key, p = _bytes(body, p)
        value, p = _bytes(body, p)
        n_headers, p = _varint(body, p)
        headers = []
        for _ in range(n_headers):
            hk, p = _bytes(body, p)
            hv, p = _bytes(body, p)
            headers.append(((hk or b"").decode("utf-8", "replace"), hv))
        if p != record_end:
            raise InvalidRecordBatch("record length does not match its fields")
        records.append(
            Record(header.base_offset + off_delta, header.base_timestamp + ts_delta, key, value, tuple(headers))
        )
    return header, records


# ---- encoding ---------------------------------------------------------------------------

_COMPRESSORS = {
    COMPRESSION_GZIP: lambda b: bytes(cramjam.gzip.compress(b)),
    COMPRESSION_SNAPPY: lambda b: bytes(cramjam.snappy.compress_raw(b)),
    COMPRESSION_LZ4: lambda b: bytes(cramjam.lz4.compress(b)),
    COMPRESSION_ZSTD: lambda b: bytes(cramjam.zstd.compress(b)),
}


def _write_varint(out: bytearray, value: int) -> None:
    v = (value << 1) ^ (value >> 63)  # zigzag
    while v & ~0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(value))
        out += value


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
        rec = bytearray(b"\x00")
        _write_varint(rec, r.timestamp - base_ts)
        _write_varint(rec, r.offset - base)
        _write_bytes(rec, r.key)
        _write_bytes(rec, r.value)
        _write_varint(rec, len(r.headers))
        for hk, hv in r.headers:
            _write_bytes(rec, hk.encode())
            _write_bytes(rec, hv)
        _write_varint(body, len(rec))
        body += rec
    payload = bytes(body) if compression == COMPRESSION_NONE else _COMPRESSORS[compression](bytes(body))
    delta = (records[-1].offset - base if records else 0) if last_offset_delta is None else last_offset_delta
    attributes = (compression & COMPRESSION_MASK) | attributes_extra
    after_crc = struct.pack(
        ">hiqqqhii", attributes, delta, base_ts, max_ts, producer_id, producer_epoch, base_sequence, len(records)
    ) + payload
    crc = crc32c(after_crc)
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, rest
    return struct.pack(">qiibI", base, batch_length, partition_leader_epoch, 2, crc) + after_crc



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
