"""Fetched record batches -> Arrow record batches with the Kafka source's columns (sans-IO).

    key binary, value binary, topic string, partition int, offset bigint,
    timestamp timestamp, timestampType int
    [headers array<struct<key: string, value: binary>>]                       includeHeaders
    [sourceCluster string, sourcePartition int, sourceOffset bigint,
     sourceTopicId string, sourceLeaderEpoch int, fence boolean]              includeProvenance

With includeProvenance the mirror's provenance headers become columns and are left out of
`headers`. sourceTopicId is the dcmirror.source.topic.id header's text as it is (Kafka's
22-character form; which incarnation of the source topic), sourceLeaderEpoch the source
batch's leader epoch: with them a source offset that was mirrored twice (the topic created
again, or an unclean election's diverged copy and the source's new record) gives two
distinct rows. A column is null where its header is absent (records mirrored before
workers wrote it, records with no provenance) or unreadable; numbers are read as plain
decimals (an optional "-", digits) in the column's range.

Rows are built column by column: the per-record work is one C call per batch when the
record codec extension is built (`_columns`), else the reference Python loop below (the
tests keep both equal).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from cluster.protocol.record_batch import (
    BATCH_HEADER_SIZE,
    CONTROL_MASK,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    InvalidRecordBatch,
    read_header,
)
from cluster.protocol.records import decode_records, decompress
from mirror.provenance import (
    FENCE,
    PATH,
    SOURCE_CLUSTER,
    SOURCE_LEADER_EPOCH,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC_ID,
)

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
CREATE_TIME = 0
LOG_APPEND_TIME = 1
# Provenance headers that become columns (and leave `headers`) with includeProvenance.
PROVENANCE_COLUMN_HEADERS = frozenset({SOURCE_CLUSTER, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TOPIC_ID,
                                       SOURCE_LEADER_EPOCH, PATH})
# Arrow binary/string arrays use 32-bit offsets: a batch is cut well before 2 GiB.
MAX_BATCH_BYTES = 256 << 20
MAX_BATCH_ROWS = 1 << 20


def spark_schema(include_headers: bool, include_provenance: bool) -> str:
    """The data source's schema as Spark DDL."""
    ddl = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
           "timestampType INT")
    if include_headers:
        ddl += ", headers ARRAY<STRUCT<key: STRING, value: BINARY>>"
    if include_provenance:
        ddl += (", sourceCluster STRING, sourcePartition INT, sourceOffset BIGINT, sourceTopicId STRING, "
                "sourceLeaderEpoch INT, fence BOOLEAN")
    return ddl


def arrow_schema(include_headers: bool, include_provenance: bool) -> pa.Schema:
    fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
              pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
              pa.field("timestamp", TIMESTAMP_TYPE), pa.field("timestampType", pa.int32())]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    if include_provenance:
        fields += [pa.field("sourceCluster", pa.string()), pa.field("sourcePartition", pa.int32()),
                   pa.field("sourceOffset", pa.int64()), pa.field("sourceTopicId", pa.string()),
                   pa.field("sourceLeaderEpoch", pa.int32()), pa.field("fence", pa.bool_())]
    return pa.schema(fields)


@dataclass(frozen=True)
class Section:
    """One batch's records section (decompressed), and which of its offsets are wanted."""

    body: bytes
    count: int
    base_offset: int
    base_timestamp: int
    log_append_time: int  # the batch's max timestamp when it is LogAppendTime, else -1
    start: int  # wanted offsets: [start, end)
    end: int


def sections(data: bytes, start: int, end: int) -> Iterator[Section]:
    """The records sections of the whole batches in `data` that hold offsets in [start, end)
    (control batches skipped; a partial last batch is ignored)."""
    pos = 0
    size = len(data)
    while pos + BATCH_HEADER_SIZE <= size:
        header = read_header(data, pos)
        if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
            raise InvalidRecordBatch(f"batch at offset {header.base_offset} declares length {header.batch_length}")
        batch_end = pos + LOG_OVERHEAD + header.batch_length
        if batch_end > size:
            break
        if header.base_offset >= end:
            break
        if header.base_offset + header.last_offset_delta >= start and not header.attributes & CONTROL_MASK:
            body = data[pos + BATCH_HEADER_SIZE:batch_end]
            if header.compression:
                body = decompress(header.compression, body)
            log_append = header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else -1
            yield Section(body, header.records_count, header.base_offset, header.base_timestamp, log_append,
                          start, end)
        pos = batch_end


INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_DECIMAL = re.compile(rb"-?[0-9]{1,19}")


def _decimal_or_none(raw: bytes | None, low: int, high: int) -> int | None:
    """A header's plain decimal (an optional "-", then digits: no sign "+", spaces or "_" as
    int() would take) within [low, high], else None; as the C loop's parse_decimal reads it."""
    if raw is None or len(raw) > 19 or not _DECIMAL.fullmatch(raw):
        return None
    value = int(raw)
    return value if low <= value <= high else None


class PyColumnBuilder:
    """The reference builder: decodes records to tuples, then columns."""

    def __init__(self, include_headers: bool, include_provenance: bool) -> None:
        self.include_headers = include_headers
        self.include_provenance = include_provenance
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[list[tuple[str, bytes | None]]] = []
        self.clusters: list[str | None] = []
        self.source_partitions: list[int | None] = []
        self.source_offsets: list[int | None] = []
        self.topic_ids: list[str | None] = []
        self.leader_epochs: list[int | None] = []
        self.fences: list[bool] = []
        self.size_bytes = 0

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def add_chunk(self, data: bytes, start: int, end: int) -> None:
        """The records in [start, end) of the whole batches in a fetched chunk."""
        for section in sections(data, start, end):
            self.add(section)

    def add(self, section: Section) -> None:
        records = decode_records(section.body, section.count, section.base_offset, section.base_timestamp)
        if records and (records[0].offset < section.start or records[-1].offset >= section.end):
            records = [r for r in records if section.start <= r.offset < section.end]
        if not records:
            return
        offsets, timestamps, keys, values, headers = zip(*records, strict=True)
        self.offsets += offsets
        if section.log_append_time >= 0:
            self.timestamps += [section.log_append_time] * len(records)
            self.types += [LOG_APPEND_TIME] * len(records)
        else:
            self.timestamps += timestamps
            self.types += [CREATE_TIME] * len(records)
        self.keys += keys
        self.values += values
        self.size_bytes += sum(len(k) for k in keys if k) + sum(len(v) for v in values if v)
        if not (self.include_headers or self.include_provenance):
            return
        for hs in headers:
            cluster = partition = offset = topic_id = epoch = None
            fence = False
            own: list[tuple[str, bytes | None]] = []
            for k, v in hs:
                if self.include_provenance and k in PROVENANCE_COLUMN_HEADERS:
                    if k == SOURCE_CLUSTER:
                        cluster = v
                    elif k == SOURCE_PARTITION:
                        partition = v
                    elif k == SOURCE_OFFSET:
                        offset = v
                    elif k == SOURCE_TOPIC_ID:
                        topic_id = v
                    elif k == SOURCE_LEADER_EPOCH:
                        epoch = v
                    continue
                if k == FENCE:
                    fence = True
                own.append((k, v))
            if self.include_headers:
                self.headers.append(own)
            if self.include_provenance:
                self.clusters.append(None if cluster is None else cluster.decode("utf-8", "replace"))
                self.source_partitions.append(_decimal_or_none(partition, INT32_MIN, INT32_MAX))
                self.source_offsets.append(_decimal_or_none(offset, INT64_MIN, INT64_MAX))
                self.topic_ids.append(None if topic_id is None else topic_id.decode("utf-8", "replace"))
                self.leader_epochs.append(_decimal_or_none(epoch, INT32_MIN, INT32_MAX))
                self.fences.append(fence)

    def finish(self, topic: str, partition: int) -> pa.RecordBatch:
        n = self.rows
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            repeated_string(topic, n),
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.array(np.asarray(self.offsets, dtype=np.int64)),
            micros(np.asarray(self.timestamps, dtype=np.int64)),
            pa.array(np.asarray(self.types, dtype=np.int32)),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, HEADER_TYPE))
        if self.include_provenance:
            arrays += [pa.array(self.clusters, pa.string()), pa.array(self.source_partitions, pa.int32()),
                       pa.array(self.source_offsets, pa.int64()), pa.array(self.topic_ids, pa.string()),
                       pa.array(self.leader_epochs, pa.int32()), pa.array(self.fences, pa.bool_())]
        return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(self.include_headers, self.include_provenance))


def repeated_string(text: str, n: int) -> pa.Array:
    """`text` n times as an Arrow string array (built from buffers, no per-row objects)."""
    raw = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def micros(millis: np.ndarray) -> pa.Array:
    return pa.array(millis * 1000, TIMESTAMP_TYPE)


class CColumnBuilder:
    """The same columns from the C loop (spark_aggregate/_columns.c): one call per fetched
    chunk, its buffers wrapped into Arrow arrays without copying."""

    def __init__(self, include_headers: bool, include_provenance: bool) -> None:
        self.include_headers = include_headers
        self.include_provenance = include_provenance
        self.flags = (1 if include_headers else 0) | (2 if include_provenance else 0)
        self.chunks: list[dict[str, Any]] = []
        self.rows = 0
        self.size_bytes = 0

    def add_chunk(self, data: bytes, start: int, end: int) -> None:
        assert _columns is not None
        got = _columns.decode_chunk(data, start, end, self.flags, decompress)
        if got["rows"]:
            self.chunks.append(got)
            self.rows += got["rows"]
            self.size_bytes += got["size_bytes"]

    def finish(self, topic: str, partition: int) -> pa.RecordBatch:
        schema = arrow_schema(self.include_headers, self.include_provenance)
        batches = [self._batch(chunk, topic, partition, schema) for chunk in self.chunks]
        if not batches:
            return pa.RecordBatch.from_pylist([], schema=schema)
        return batches[0] if len(batches) == 1 else pa.concat_batches(batches)

    def _batch(self, got: dict[str, Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
        n = got["rows"]
        arrays = [
            _binary(pa.binary(), n, got["key"]),
            _binary(pa.binary(), n, got["value"]),
            repeated_string(topic, n),
            pa.array(np.full(n, partition, dtype=np.int32)),
            pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(got["offset"])]),
            pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, pa.py_buffer(got["timestamp"])]),
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(got["type"])]),
        ]
        if self.include_headers:
            lists, keys, values = got["headers"]
            entries = (len(keys[0]) // 4) - 1
            struct = pa.StructArray.from_arrays([_binary(pa.string(), entries, keys), _binary(pa.binary(), entries, values)],
                                                fields=list(HEADER_TYPE.value_type))
            arrays.append(pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(lists)]),
                                                   struct, type=HEADER_TYPE))
        if self.include_provenance:
            cluster, partitions, offsets, topic_ids, epochs, fences = got["provenance"]
            arrays += [
                _binary(pa.string(), n, cluster),
                _fixed(pa.int32(), n, partitions),
                _fixed(pa.int64(), n, offsets),
                _binary(pa.string(), n, topic_ids),
                _fixed(pa.int32(), n, epochs),
                pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(fences)]),
            ]
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _buffer(raw: bytes | None) -> pa.Buffer | None:
    return None if raw is None else pa.py_buffer(raw)


def _fixed(kind: pa.DataType, n: int, parts: tuple[bytes, bytes | None, int]) -> pa.Array:
    values, valid, nulls = parts
    return pa.Array.from_buffers(kind, n, [_buffer(valid), pa.py_buffer(values)], nulls)


def _binary(kind: pa.DataType, n: int, parts: tuple[bytes, bytes, bytes | None, int]) -> pa.Array:
    offsets, data, valid, nulls = parts
    return pa.Array.from_buffers(kind, n, [_buffer(valid), pa.py_buffer(offsets), pa.py_buffer(data)], nulls)


ColumnBuilder = PyColumnBuilder | CColumnBuilder


def new_builder(include_headers: bool, include_provenance: bool, *, backend: str | None = None) -> ColumnBuilder:
    """A builder for the C loop when it is built (or `backend` "c" / "python" asks)."""
    if backend == "python" or (backend is None and _columns is None):
        return PyColumnBuilder(include_headers, include_provenance)
    return CColumnBuilder(include_headers, include_provenance)


try:
    from spark_aggregate import _columns  # type: ignore[attr-defined]
except ImportError:  # no compiler when installed: the Python builder, same results
    _columns = None
else:
    _columns.set_error_class(InvalidRecordBatch)
COLUMNS_BACKEND = "c" if _columns is not None else "python"
