"""Reading the tail of a target partition: who wrote it last, and the last source offset it
holds. Used when a worker takes a partition (claim, fence, resume)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio

from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import METADATA_ERRORS, KafkaError
from cluster.client.metadata import ClientCluster
from cluster.protocol.record_batch import (
    BATCH_HEADER_SIZE,
    CONTROL_MASK,
    LOG_OVERHEAD,
    BatchHeader,
    read_header,
)
from cluster.protocol.records import Record, decode_records, decompress
from mirror.provenance import last_mirrored_offset

FETCH = 1
LIST_OFFSETS = 2
DEBUGGING_REPLICA_ID = -2  # Kafka's debugging consumer id: read up to the log end, not the high watermark
CONSUMER_REPLICA_ID = -1
TAIL_FETCH_BYTES = 4 << 20
FIRST_WINDOW_RECORDS = 512


@dataclass(frozen=True)
class Batch:
    header: BatchHeader
    records: list[Record]


LEADER_ATTEMPTS = 5


async def _leader_request(cluster: ClientCluster, topic: str, partition: int, api_key: int, body: dict[str, Any]) -> Any:
    """The request answered by the partition's current leader: on a moved leader (its error
    in the answer) or a dead connection the metadata is refreshed and the request retried."""
    for attempt in range(LEADER_ATTEMPTS):
        leader = cluster.metadata.leader(topic, partition)
        if leader < 0 or attempt:
            await cluster.refresh({topic})
            leader = cluster.metadata.leader(topic, partition)
            if leader < 0:
                if attempt == LEADER_ATTEMPTS - 1:
                    raise KafkaError(f"{topic}-{partition} has no leader", 5)
                await trio.sleep(0.2 * (attempt + 1))
                continue
        try:
            conn = await cluster.connection(leader)
            resp = await conn.request(api_key, body)
        except KafkaConnectionError:
            if attempt == LEADER_ATTEMPTS - 1:
                raise
            await trio.sleep(0.2 * (attempt + 1))
            continue
        code = _partition_error(api_key, resp)
        if code in METADATA_ERRORS and attempt < LEADER_ATTEMPTS - 1:
            await trio.sleep(0.1 * (attempt + 1))
            continue
        return resp
    raise AssertionError("unreachable")


def _partition_error(api_key: int, resp: Any) -> int:
    try:
        if api_key == LIST_OFFSETS:
            return int(resp.topics[0].partitions[0].error_code)
        return int(resp.responses[0].partitions[0].error_code)
    except (IndexError, AttributeError):
        return 0


async def offsets(cluster: ClientCluster, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, high watermark) at the partition's leader."""
    out = []
    for ts in (-2, -1):
        resp = await _leader_request(cluster, topic, partition, LIST_OFFSETS, {
            "replica_id": -1, "isolation_level": 0,
            "topics": [{"name": topic, "partitions": [{"partition_index": partition, "timestamp": ts,
                                                        "current_leader_epoch": -1}]}]})
        p = resp.topics[0].partitions[0]
        if p.error_code:
            raise KafkaError(f"listing offsets of {topic}-{partition}", p.error_code)
        out.append(p.offset)
    return out[0], out[1]


async def fetch_batches(cluster: ClientCluster, topic: str, partition: int, offset: int, *,
                        to_log_end: bool = False, max_bytes: int = TAIL_FETCH_BYTES) -> list[Batch]:
    """Whole batches from `offset` (to the high watermark, or with `to_log_end` to the log end)."""
    resp = await _leader_request(cluster, topic, partition, FETCH, {
        "replica_id": DEBUGGING_REPLICA_ID if to_log_end else CONSUMER_REPLICA_ID, "max_wait": 0, "min_bytes": 0,
        "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": max_bytes}]}]})
    p = resp.responses[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"reading the tail of {topic}-{partition} at offset {offset}", p.error_code)
    data = p.records or b""
    batches = []
    pos = 0
    while pos + BATCH_HEADER_SIZE <= len(data):
        header = read_header(data, pos)
        end = pos + LOG_OVERHEAD + header.batch_length
        if end > len(data):
            break
        records: list[Record] = []
        if not header.attributes & CONTROL_MASK:
            body = decompress(header.compression, data[pos + BATCH_HEADER_SIZE:end])
            records = decode_records(body, header.records_count, header.base_offset, header.base_timestamp)
        batches.append(Batch(header, records))
        pos = end
    return batches


async def last_writer(cluster: ClientCluster, topic: str, partition: int) -> tuple[int, int] | None:
    """(producer id, epoch) of the last batch in the partition's log, up to its log end
    (batches not yet committed included: their writer must be fenced too); None when the
    partition is empty or its last writer was not idempotent."""
    start, hw = await offsets(cluster, topic, partition)
    at = max(start, hw - 1)
    last: BatchHeader | None = None
    while True:
        batches = await fetch_batches(cluster, topic, partition, at, to_log_end=True)
        if not batches:
            break
        last = batches[-1].header
        nxt = last.base_offset + last.last_offset_delta + 1
        if nxt <= at:
            break
        at = nxt
    if last is None or last.producer_id < 0:
        return None
    return last.producer_id, last.producer_epoch


async def last_mirrored(cluster: ClientCluster, topic: str, partition: int, below: int, source_cluster: str,
                        source_partition: int) -> int | None:
    """The highest source offset (of `source_cluster`, `source_partition`) held in the target
    partition below offset `below`, searching backwards in growing windows."""
    start, _ = await offsets(cluster, topic, partition)
    window = FIRST_WINDOW_RECORDS
    hi = below
    while hi > start:
        lo = max(start, hi - window)
        records: list[Record] = []
        at = lo
        while at < hi:
            batches = await fetch_batches(cluster, topic, partition, at)
            if not batches:
                break
            for b in batches:
                records.extend(r for r in b.records if lo <= r.offset < hi)
            at = batches[-1].header.base_offset + batches[-1].header.last_offset_delta + 1
        found = last_mirrored_offset(records, source_cluster, source_partition)
        if found is not None:
            return found
        hi = lo
        window *= 4
    return None
