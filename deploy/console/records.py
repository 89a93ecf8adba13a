"""The record browser (trio): a partition read by offset or by time as the logged-in user
(their SCRAM credentials, or the topology's for the token and open roles), and a source
record followed to its copy in the aggregate and its warehouse row.

Every read is bounded: at most RECORDS_PER_PAGE_MAX records, FETCH_BYTES_MAX bytes fetched,
READ_TIMEOUT_S seconds. Finding a copy is a binary search over the target partition by the
provenance headers (mirror/provenance.py): a flow appends one source partition's records
into the same partition number of its target topic in source order (a re-created topic's
new incarnation after the old), so at most ~2·log2(n) small reads.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import trio

from cluster.client.metadata import ClientCluster
from cluster.common.secrets import Secret
from cluster.protocol.records import Record
from mirror import tail
from mirror.history import parse_topic_id, topic_id_text
from mirror.provenance import (
    SOURCE_CLUSTER,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC_ID,
    header,
)
from topology.model import ClusterSpec, MirrorSpec, Topology

RECORDS_PER_PAGE_MAX = 200
FETCH_BYTES_MAX = 4 << 20
READ_TIMEOUT_S = 5.0
SEARCH_STEPS_MAX = 64


def client_settings(spec: ClusterSpec, user: str | None, password: Secret | None) -> dict[str, Any]:
    """The cluster's client settings, as `user` when one logged in with SCRAM."""
    config: dict[str, Any] = dict(spec.client_config())
    if user is not None and password is not None:
        config["sasl.username"] = user
        config["sasl.password"] = password  # a Secret: never read as a ${...} reference
    return config


@dataclass(frozen=True)
class Page:
    records: tuple[Record, ...]
    start_offset: int
    end_offset: int
    asked_offset: int


async def read_page(cluster: ClientCluster, topic: str, partition: int, *, offset: int | None = None,
                    timestamp_ms: int | None = None, limit: int = 20) -> Page:
    """Up to `limit` records of a partition from `offset` (clamped into the log), or from the
    first record at or after `timestamp_ms`; the last `limit` records when neither. Read over
    `cluster` (an open client's: no login per page), Fetch by Fetch, below the high watermark."""
    limit = max(1, min(limit, RECORDS_PER_PAGE_MAX))
    with trio.fail_after(READ_TIMEOUT_S):
        start, end = await tail.offsets(cluster, topic, partition)
        if timestamp_ms is not None:
            found = await tail.list_offset(cluster, topic, partition, timestamp_ms)
            at = end if found < 0 else found
        elif offset is None:
            at = max(start, end - limit)
        else:
            at = offset
        at = min(max(at, start), end)
        records: list[Record] = []
        position = at
        while len(records) < limit and position < end:
            fetched = await tail.fetch(cluster, topic, partition, position, max_bytes=FETCH_BYTES_MAX)
            if not fetched.batches:
                break
            records.extend(r for b in fetched.batches for r in b.records if position <= r.offset < end)
            last = fetched.batches[-1].header
            position = max(position + 1, last.base_offset + last.last_offset_delta + 1)
        return Page(tuple(records[:limit]), start, end, at)


def provenance(record: Record) -> dict[str, Any] | None:
    """Where a mirrored record came from (the source topic id as a UUID's text), None for a
    record produced here."""
    cluster, partition, offset = (header(record.headers, h) for h in (SOURCE_CLUSTER, SOURCE_PARTITION, SOURCE_OFFSET))
    if cluster is None or partition is None or offset is None:
        return None
    try:
        where = {"cluster": cluster.decode(errors="replace"), "partition": int(partition), "offset": int(offset)}
    except ValueError:
        return None
    topic_id = parse_topic_id(header(record.headers, SOURCE_TOPIC_ID))
    return where | {"topic_id": str(topic_id) if topic_id else None}


def flow_into_aggregate(topology: Topology, cluster: str, topic: str) -> MirrorSpec | None:
    """The record flow that copies `topic` of `cluster` somewhere (offset-keeping mirror topics
    keep offsets: their copy is at the same offset and needs no search)."""
    for m in topology.mirrors:
        if m.source == cluster and m.matches(topic):
            return m
    return None


async def find_copy(cluster: ClientCluster, target_topic: str, partition: int, source_cluster: str,
                    source_offset: int, source_topic_id: str | None) -> int | None:
    """The offset of the source record's copy in the target partition, or None. Binary search
    on (incarnation order, source offset) over records carrying provenance."""
    with trio.fail_after(READ_TIMEOUT_S * 6):
        return await _search(cluster, (target_topic, partition), source_cluster, source_offset, source_topic_id)


async def _search(cluster: ClientCluster, tp: tuple[str, int], source_cluster: str, source_offset: int,
                  source_topic_id: str | None) -> int | None:
    first = await read_page(cluster, *tp, offset=0, limit=1)
    lo, hi = first.start_offset, first.end_offset  # search [lo, hi)
    incarnation = uuid.UUID(source_topic_id) if source_topic_id else None
    for _ in range(SEARCH_STEPS_MAX):
        if lo >= hi:
            return None
        mid = (lo + hi) // 2
        page = await read_page(cluster, *tp, offset=mid, limit=8)
        probe = next(((r, p) for r in page.records if (p := provenance(r)) is not None
                      and p["cluster"] == source_cluster), None)
        if probe is None:
            hi = mid  # only fences/markers from mid on: look lower
            continue
        record, p = probe
        if p["offset"] == source_offset and (incarnation is None or p["topic_id"] in (None, str(incarnation))):
            return record.offset
        same_incarnation = incarnation is None or p["topic_id"] in (None, str(incarnation))
        if same_incarnation and p["offset"] < source_offset:
            lo = record.offset + 1
        elif same_incarnation:
            hi = mid
        else:
            # Another incarnation: which side it is on is not known from offsets; scan linearly
            # from here is unbounded, so say not found rather than guess.
            return await _scan(cluster, tp, lo, hi, source_cluster, source_offset, str(incarnation))
    return None


async def _scan(client: ClientCluster, tp: tuple[str, int], lo: int, hi: int, cluster: str,
                offset: int, topic_id: str, records_max: int = 5000) -> int | None:
    at = lo
    while at < min(hi, lo + records_max):
        page = await read_page(client, *tp, offset=at, limit=RECORDS_PER_PAGE_MAX)
        if not page.records:
            return None
        for r in page.records:
            p = provenance(r)
            if p and p["cluster"] == cluster and p["offset"] == offset and p["topic_id"] == topic_id:
                return r.offset
        at = page.records[-1].offset + 1
    return None


def warehouse_row_query(table: str, source_cluster: str, partition: int, offset: int,
                        source_topic_id: str | None) -> str:
    """The SQL that finds a source record's row in the warehouse (identity: cluster, topic
    id, partition, offset)."""
    def quoted(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"

    where = [f"source_cluster = {quoted(source_cluster)}", f"source_partition = {int(partition)}",
             f"source_offset = {int(offset)}"]
    if source_topic_id:  # the warehouse keeps the id as the provenance header has it (Kafka's text form)
        text = topic_id_text(uuid.UUID(source_topic_id))
        where.append(f"(source_topic_id IS NULL OR source_topic_id = {quoted(text)})")
    return f"SELECT * FROM {table} WHERE " + " AND ".join(where) + " LIMIT 10"
