"""Provenance headers: where a mirrored record came from, and the decisions that follow from
them (sans-IO: plain functions over records).

Every mirrored record carries, besides its own headers:

    dcmirror.source.cluster    the cluster it was read from (this hop)
    dcmirror.source.partition  its partition there (decimal)
    dcmirror.source.offset     its offset there (decimal)
    dcmirror.source.topic.id   the source topic's id (Kafka's text form): which incarnation
                               of the topic, when it was deleted and created again
    dcmirror.source.leader.epoch  the leader epoch of its batch there (decimal): with the
                               offset, where the source's history and the copy could part
    dcmirror.path              every cluster it has been in, oldest first, comma-separated

The target partition is the truth for exactly-once: a worker that takes a partition reads
its tail and resumes after the last source record it finds (in target order), once the
source confirmed that record's topic id and leader epoch (mirror/history.py). `dcmirror.path` keeps a record
from ever being mirrored back into a cluster it passed through (flows A->B and B->A).

A worker taking over a partition fences the previous writer with an ABORT transaction
marker under that writer's producer id and a higher epoch (see worker.py): invisible to
consumers. Aggregates written before that, or targets that refuse markers, hold fence
records (header `dcmirror.fence`, no key, no value) instead; readers skip them (they
carry no provenance).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

from cluster.protocol.records import Record
from mirror.history import MirroredPosition, parse_topic_id

SOURCE_CLUSTER = "dcmirror.source.cluster"
SOURCE_PARTITION = "dcmirror.source.partition"
SOURCE_OFFSET = "dcmirror.source.offset"
SOURCE_TOPIC_ID = "dcmirror.source.topic.id"
SOURCE_LEADER_EPOCH = "dcmirror.source.leader.epoch"
PATH = "dcmirror.path"
FENCE = "dcmirror.fence"
HEARTBEAT = "dcmirror.heartbeat"
PROVENANCE_HEADERS = frozenset({SOURCE_CLUSTER, SOURCE_PARTITION, SOURCE_OFFSET, SOURCE_TOPIC_ID,
                                SOURCE_LEADER_EPOCH, PATH})

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


# The largest values this hop's headers can take: partition and epoch (int32), offset (int64),
# topic id (22 characters).
_MAX_VALUE_BYTES = {SOURCE_PARTITION: 11, SOURCE_OFFSET: 20, SOURCE_TOPIC_ID: 22, SOURCE_LEADER_EPOCH: 11}
_VARINTS_BYTES = 10  # a header's two length varints, and room for a record's grown varints


def overhead_bytes(source_cluster: str, path_bytes: int) -> int:
    """The most the provenance of one hop adds to a record read from `source_cluster` whose
    dcmirror.path (earlier hops included) is at most `path_bytes` long: what a target topic's
    max.message.bytes needs beyond the source's."""
    values = {**_MAX_VALUE_BYTES, SOURCE_CLUSTER: len(source_cluster.encode()), PATH: max(path_bytes, 1)}
    return sum(len(k) + v + _VARINTS_BYTES for k, v in values.items()) + _VARINTS_BYTES


def incarnation_headers(topic_id: str | None, leader_epoch: int) -> tuple[tuple[str, bytes], ...]:
    """The topic id and leader epoch headers of a run of records (none for what is unknown)."""
    out: tuple[tuple[str, bytes], ...] = ()
    if topic_id:
        out += ((SOURCE_TOPIC_ID, topic_id.encode()),)
    if leader_epoch >= 0:
        out += ((SOURCE_LEADER_EPOCH, b"%d" % leader_epoch),)
    return out


def mirrored_headers(headers: Headers, source_cluster: str, partition: int, offset: int,
                     topic_id: str | None = None, leader_epoch: int = -1) -> Headers:
    """The record's own headers (earlier hops' provenance replaced) plus this hop's."""
    own = tuple((k, v) for k, v in headers if k not in PROVENANCE_HEADERS) if headers else ()
    path = ",".join(path_of(headers, source_cluster)) if headers else source_cluster
    return own + (
        (SOURCE_CLUSTER, source_cluster.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
    ) + incarnation_headers(topic_id, leader_epoch) + ((PATH, path.encode()),)


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


def incarnation_of(record: Record) -> tuple[uuid.UUID | None, int]:
    """(source topic id, source leader epoch) of a mirrored record (None / -1 where its
    provenance does not say: written before it did)."""
    topic_id = epoch = None
    for k, v in record.headers:
        if k == SOURCE_TOPIC_ID:
            topic_id = v
        elif k == SOURCE_LEADER_EPOCH:
            epoch = v
    try:
        leader_epoch = int(epoch) if epoch is not None else -1
    except ValueError:
        leader_epoch = -1
    return parse_topic_id(topic_id), leader_epoch


def last_mirrored(records: Sequence[Record], source_cluster: str, source_partition: int
                  ) -> tuple[MirroredPosition | None, list[tuple[int, int]]]:
    """The last record of `source_partition` among `records` (a window of the target
    partition, in target order: after a divergence or a new incarnation lower source offsets
    follow higher ones) and the (leader epoch, first source offset) of each epoch of that
    record's incarnation in the window; (None, []) when the window holds none."""
    mine = [(pos[1], r) for r in records if (pos := source_position(r, source_cluster)) is not None
            and pos[0] == source_partition]
    if not mine:
        return None, []
    offset, record = mine[-1]
    topic_id, epoch = incarnation_of(record)
    starts: list[tuple[int, int]] = []
    for o, r in mine:
        t, e = incarnation_of(r)
        if t != topic_id or e < 0:
            continue
        while starts and (starts[-1][0] > e or starts[-1][1] > o):
            starts.pop()  # a history the source rewrote (what came after it replaces it)
        if not starts or starts[-1][0] != e:
            starts.append((e, o))
    return MirroredPosition(offset, topic_id, epoch), starts


def is_fence(record: Record) -> bool:
    return bool(record.headers) and header(record.headers, FENCE) is not None
