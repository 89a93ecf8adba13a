"""Provenance headers: where a mirrored record came from, and the decisions that follow from
them (sans-IO: plain functions over records).

Every mirrored record carries, besides its own headers:

    dcmirror.source.cluster    the cluster it was read from (this hop)
    dcmirror.source.partition  its partition there (decimal)
    dcmirror.source.offset     its offset there (decimal)
    dcmirror.path              every cluster it has been in, oldest first, comma-separated

The target partition is the truth for exactly-once: a worker that takes a partition reads
its tail and resumes after the last source offset it finds. `dcmirror.path` keeps a record
from ever being mirrored back into a cluster it passed through (flows A->B and B->A).

A worker taking over a partition fences the previous writer with an ABORT transaction
marker under that writer's producer id and a higher epoch (see worker.py): invisible to
consumers. Aggregates written before that, or targets that refuse markers, hold fence
records (header `dcmirror.fence`, no key, no value) instead; readers skip them (they
carry no provenance).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cluster.protocol.records import Record

SOURCE_CLUSTER = "dcmirror.source.cluster"
SOURCE_PARTITION = "dcmirror.source.partition"
SOURCE_OFFSET = "dcmirror.source.offset"
PATH = "dcmirror.path"
FENCE = "dcmirror.fence"
HEARTBEAT = "dcmirror.heartbeat"
PROVENANCE_HEADERS = frozenset({SOURCE_CLUSTER, SOURCE_PARTITION, SOURCE_OFFSET, PATH})

Headers = tuple[tuple[str, bytes | None], ...]


def header(headers: Iterable[tuple[str, bytes | None]], name: str) -> bytes | None:
    """The last value of header `name` (None if absent)."""
    found = None
    for k, v in headers:
        if k == name:
            found = v
    return found


def path_of(headers: Headers, source_cluster: str) -> list[str]:
    """Clusters the record has been in, ending with the one it is read from now."""
    raw = header(headers, PATH)
    path = raw.decode("utf-8", "replace").split(",") if raw else []
    if not path or path[-1] != source_cluster:
        path.append(source_cluster)
    return path


def passed_through(headers: Headers, cluster: str) -> bool:
    """Whether a record was already in `cluster` (so mirroring it there would loop)."""
    if not headers:
        return False
    raw = header(headers, PATH)
    return raw is not None and cluster in raw.decode("utf-8", "replace").split(",")


def mirrored_headers(headers: Headers, source_cluster: str, partition: int, offset: int) -> Headers:
    """The record's own headers (earlier hops' provenance replaced) plus this hop's."""
    own = tuple((k, v) for k, v in headers if k not in PROVENANCE_HEADERS) if headers else ()
    path = ",".join(path_of(headers, source_cluster)) if headers else source_cluster
    return own + (
        (SOURCE_CLUSTER, source_cluster.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
        (PATH, path.encode()),
    )


def source_position(record: Record, source_cluster: str) -> tuple[int, int] | None:
    """(source partition, source offset) of a record mirrored from `source_cluster`, or None
    (fence records, heartbeats, records from elsewhere)."""
    headers = record.headers
    if not headers:
        return None
    cluster = partition = offset = None
    for k, v in headers:
        if k == SOURCE_CLUSTER:
            cluster = v
        elif k == SOURCE_PARTITION:
            partition = v
        elif k == SOURCE_OFFSET:
            offset = v
    if cluster != source_cluster.encode() or partition is None or offset is None:
        return None
    try:
        return int(partition), int(offset)
    except ValueError:
        return None


def last_mirrored_offset(records: Sequence[Record], source_cluster: str, source_partition: int) -> int | None:
    """The highest source offset of `source_partition` among `records` (a tail of the target
    partition), or None when the tail holds none."""
    best: int | None = None
    for record in reversed(records):
        pos = source_position(record, source_cluster)
        if pos is not None and pos[0] == source_partition:
            if best is None or pos[1] > best:
                best = pos[1]
    return best


def is_fence(record: Record) -> bool:
    return bool(record.headers) and header(record.headers, FENCE) is not None
