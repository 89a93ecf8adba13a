"""RecordBatch v2 (magic 2) headers: parse, validate and patch without decoding records.

The broker's hot path only touches the 61-byte batch header: the CRC32C covers byte 21 to
the end, so base offset (bytes 0-8) and partition leader epoch (12-16) can be patched
without recomputing it. Per-record decoding lives in `records.py` and is only used where
semantics demand it (timestamp lookup, compaction, clients).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from crc32c import crc32c

from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import NO_SEQUENCE

BATCH_HEADER_SIZE = 61
# baseOffset i64, batchLength i32 — enough to walk batches.
LOG_OVERHEAD = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_LEN = struct.Struct(">qi")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20



class InvalidRecordBatch(ValueError):
    """A batch that fails structural or CRC validation (maps to CORRUPT_MESSAGE)."""


class UnsupportedMagic(InvalidRecordBatch):
    """A batch whose magic byte is not 2 (v0/v1 message sets are not accepted)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % 0x80000000

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the batch header at `pos`; raises InvalidRecordBatch if the bytes are short."""
    if len(buf) - pos < BATCH_HEADER_SIZE:
        raise InvalidRecordBatch(
            f"record batch header needs {BATCH_HEADER_SIZE} bytes, {len(buf) - pos} remain"
        )
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def validate_batch(buf: bytes | bytearray | memoryview, pos: int = 0, *, from_producer: bool = True) -> BatchHeader:
    """Structural and CRC32C check of one whole batch at `pos` (its length must fit).

    Batches read back from the log may have fewer records than their offset span
    (compaction removes records but keeps lastOffsetDelta); producers may not.
    """
    header = read_header(buf, pos)
    if header.magic != 2:
        raise UnsupportedMagic(f"record batch magic {header.magic} is not supported (only 2)")
    if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatch(f"record batch length {header.batch_length} is too small")
    end = pos + LOG_OVERHEAD + header.batch_length
    if end > len(buf):
        raise InvalidRecordBatch(
            f"record batch declares {header.batch_length} bytes, only {len(buf) - pos - LOG_OVERHEAD} remain"
        )
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise InvalidRecordBatch("record batch has a negative offset delta or record count")
    if header.records_count == 0 and not header.is_control and from_producer:
        raise InvalidRecordBatch("record batch holds no records")
    if from_producer and header.records_count > 0 and header.last_offset_delta != header.records_count - 1:
        # Kafka enforces lastOffsetDelta == count-1 for batches from producers.
        raise InvalidRecordBatch(
            f"record batch last offset delta {header.last_offset_delta} does not match "
            f"{header.records_count} records"
        )
    actual = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : end])
    if actual != header.crc:
        raise InvalidRecordBatch(
            f"record batch CRC mismatch: stored {header.crc:#010x}, computed {actual:#010x}"
        )
    return header


def split_batches(
    buf: bytes | bytearray | memoryview, *, validate: bool = True, from_producer: bool = True
) -> list[tuple[int, BatchHeader]]:
    """Every batch in a produce payload as (position, header); the payload must be whole.
    `from_producer` False: batches read from a log (a follower's or a mirror's fetch), which
    compaction may have left with fewer records than their offset span."""
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    n = len(buf)
    while pos < n:
        header = validate_batch(buf, pos, from_producer=from_producer) if validate else read_header(buf, pos)
        out.append((pos, header))
        pos += header.size_bytes
    if not out:
        raise InvalidRecordBatch("produce request carries no record batch")
    return out


def iter_headers(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, strict: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Walk the whole batches in a buffer as (position, header); a partial trailing batch
    ends the walk (a fetch answer may end mid-batch). A batch that declares a length shorter
    than its own header ends it too, or with `strict` raises InvalidRecordBatch."""
    n = len(buf)
    while n - pos >= BATCH_HEADER_SIZE:
        header = BatchHeader(*_HEADER.unpack_from(buf, pos))
        if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
            if strict:
                raise InvalidRecordBatch(
                    f"batch at offset {header.base_offset} declares length {header.batch_length}")
            return
        size = header.batch_length + LOG_OVERHEAD
        if pos + size > n:
            return
        yield pos, header
        pos += size


def iter_committed(
    buf: bytes | bytearray | memoryview, aborted: Iterable[tuple[int, int]] | None, *, strict: bool = False,
    check_crcs: bool = False,
) -> Iterator[tuple[int, BatchHeader]]:
    """The data batches of `iter_headers` a read_committed consumer keeps: control batches
    (transaction markers) and the batches of aborted transactions are left out. `aborted` is
    a Fetch answer's aborted_transactions as (producer id, first offset): from its first
    offset on, a producer's transactional batches are dropped until its ABORT marker, as
    Kafka's consumer does (KIP-98). `check_crcs` validates every batch, markers included."""
    pending = sorted(aborted or (), key=lambda a: a[1])
    aborting: set[int] = set()
    for pos, header in iter_headers(buf, strict=strict):
        if check_crcs:
            validate_batch(buf, pos, from_producer=False)
        while pending and pending[0][1] <= header.base_offset + header.last_offset_delta:
            aborting.add(pending.pop(0)[0])
        if header.attributes & CONTROL_MASK:
            aborting.discard(header.producer_id)  # its transaction ends here
            continue
        if header.attributes & TRANSACTIONAL_MASK and header.producer_id in aborting:
            continue
        yield pos, header


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """What `scan_batches` found: the whole batches from the start position up to `end`."""

    end: int  # position after the last whole batch counted
    count: int  # batches
    records: int  # records they hold (records_count fields)
    next_offset: int  # the offset after the last of them; -1 when there is none


# base offset, batch length, last offset delta (byte 23), records count (byte 57)
_SPAN_FIELDS = struct.Struct(">qi11xi30xi")
_NO_MAX_OFFSET = 2**63 - 1


def scan_batches(
    buf: bytes | bytearray | memoryview, pos: int = 0, *, max_offset: int = _NO_MAX_OFFSET, strict: bool = False
) -> BatchSpan:
    """The whole batches at `pos` that lie entirely below `max_offset`, reading only four
    header fields per batch (cheap enough for every fetch, on the broker and in clients).
    `strict` as in `iter_headers`."""
    n = len(buf)
    count = records = 0
    next_offset = -1
    unpack = _SPAN_FIELDS.unpack_from
    while n - pos >= BATCH_HEADER_SIZE:
        base_offset, batch_length, last_delta, records_count = unpack(buf, pos)
        if batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
            if strict:
                raise InvalidRecordBatch(f"batch at offset {base_offset} declares length {batch_length}")
            break
        size = batch_length + LOG_OVERHEAD
        if pos + size > n or base_offset + last_delta >= max_offset:
            break
        pos += size
        count += 1
        records += records_count
        next_offset = base_offset + last_delta + 1
    return BatchSpan(pos, count, records, next_offset)


def patched_prefix(header_bytes: bytes | memoryview, base_offset: int, leader_epoch: int) -> bytes:
    """The first 17 bytes of a batch with base offset and leader epoch replaced."""
    return (
        _I64.pack(base_offset)
        + bytes(header_bytes[8:12])
        + _I32.pack(leader_epoch)
        + bytes(header_bytes[16:17])
    )





ZSTD = 4
_LEGACY_RECORD_OVERHEAD_V0 = 14  # the smallest batch length any magic allows


def produce_records_problem(records: bytes | None, api_version: int) -> tuple[int, str] | None:
    """What Kafka refuses in a Produce v3+ partition before it reaches the log
    (ProduceRequest.validateRecords over ByteBufferLogInputStream): (error code, message),
    or None. A length below any batch's or a magic byte above 2 is CORRUPT_MESSAGE; anything
    but exactly one whole batch of magic 2 is INVALID_RECORD (a truncated batch is not
    one); zstd before v7 is UNSUPPORTED_COMPRESSION_TYPE."""
    data = records or b""
    whole = 0
    pos = 0
    first_magic = None
    while len(data) - pos >= LOG_OVERHEAD:
        (length,) = _I32.unpack_from(data, pos + 8)
        if length < _LEGACY_RECORD_OVERHEAD_V0:
            return ErrorCode.corrupt_message, f"Record size {length} is less than the minimum record overhead (14)"
        if len(data) - pos < MAGIC_OFFSET + 1:
            break
        magic = struct.unpack_from(">b", data, pos + MAGIC_OFFSET)[0]
        if not 0 <= magic <= 2:
            return ErrorCode.corrupt_message, f"Invalid magic found in record: {magic}"
        if LOG_OVERHEAD + length > len(data) - pos:
            break
        first_magic = magic if first_magic is None else first_magic
        whole += 1
        pos += LOG_OVERHEAD + length
    if whole == 0:
        return (ErrorCode.invalid_record,
                f"Produce requests with version {api_version} must have at least one record batch per partition")
    if first_magic != 2:
        return (ErrorCode.invalid_record, f"Produce requests with version {api_version} are only allowed to "
                                          "contain record batches with magic version 2")
    if api_version < 7 and struct.unpack_from(">h", data, ATTRIBUTES_OFFSET)[0] & COMPRESSION_MASK == ZSTD:
        return (ErrorCode.unsupported_compression_type,
                f"Produce requests with version {api_version} are not allowed to use ZStandard compression")
    if whole > 1:
        return (ErrorCode.invalid_record, f"Produce requests with version {api_version} are only allowed to "
                                          "contain exactly one record batch per partition")
    return None
