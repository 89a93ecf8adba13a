"""Reading the tail of a target partition: who wrote it last, and the last source offset it
holds. Used when a worker takes a partition (claim, fence, resume)."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.client.admin import write_txn_marker
from cluster.client.connection import UnsupportedApi
from cluster.client.errors import KafkaError
from cluster.client.metadata import ClientCluster
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import BATCH_HEADER_SIZE, CONTROL_MASK, BatchHeader, iter_headers
from cluster.protocol.records import Record, decode_records, decompress
from cluster.protocol.sentinels import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_UNCOMMITTED,
)
from mirror.history import MirroredPosition
from mirror.provenance import last_mirrored as last_mirrored_in

TAIL_FETCH_BYTES = 4 << 20
FIRST_WINDOW_RECORDS = 512


@dataclass(frozen=True)
class Batch:
    header: BatchHeader
    records: list[Record]


async def list_offset(cluster: ClientCluster, topic: str, partition: int, timestamp: int) -> int:
    """ListOffsets of one partition at its leader: EARLIEST, LATEST or a time (ms; -1 when no
    record is that late)."""
    resp = await cluster.leader_request(topic, partition, ApiKey.LIST_OFFSETS, {
        "replica_id": CONSUMER_REPLICA_ID, "isolation_level": READ_UNCOMMITTED,
        "topics": [{"name": topic, "partitions": [{"partition_index": partition, "timestamp": timestamp,
                                                    "current_leader_epoch": -1}]}]})
    p = resp.topics[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"listing offsets of {topic}-{partition}", p.error_code)
    return int(p.offset)


async def offsets(cluster: ClientCluster, topic: str, partition: int) -> tuple[int, int]:
    """(log start offset, high watermark) at the partition's leader."""
    return (await list_offset(cluster, topic, partition, EARLIEST_TIMESTAMP),
            await list_offset(cluster, topic, partition, LATEST_TIMESTAMP))


@dataclass(frozen=True)
class Fetched:
    batches: list[Batch]
    high_watermark: int
    log_start_offset: int


async def fetch_batches(cluster: ClientCluster, topic: str, partition: int, offset: int, *,
                        to_log_end: bool = False, max_bytes: int = TAIL_FETCH_BYTES) -> list[Batch]:
    """Whole batches from `offset` (to the high watermark, or with `to_log_end` to the log end)."""
    return (await fetch(cluster, topic, partition, offset, to_log_end=to_log_end, max_bytes=max_bytes)).batches


async def fetch(cluster: ClientCluster, topic: str, partition: int, offset: int, *,
                to_log_end: bool = False, max_bytes: int = TAIL_FETCH_BYTES) -> Fetched:
    """As fetch_batches, with the partition's high watermark and log start as the leader answered."""
    resp = await cluster.leader_request(topic, partition, ApiKey.FETCH, {
        "replica_id": DEBUGGING_REPLICA_ID if to_log_end else CONSUMER_REPLICA_ID, "max_wait": 0, "min_bytes": 0,
        "max_bytes": max_bytes, "isolation_level": READ_UNCOMMITTED, "session_id": 0, "session_epoch": -1,
        "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": max_bytes}]}]})
    p = resp.responses[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"reading the tail of {topic}-{partition} at offset {offset}", p.error_code)
    data = p.records or b""
    batches = []
    for pos, header in iter_headers(data, strict=True):
        records: list[Record] = []
        if not header.attributes & CONTROL_MASK:
            body = decompress(header.compression, data[pos + BATCH_HEADER_SIZE:pos + header.size_bytes])
            records = decode_records(body, header.records_count, header.base_offset, header.base_timestamp)
        batches.append(Batch(header, records))
    return Fetched(batches, p.high_watermark, p.log_start_offset)


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


async def abort_marker(cluster: ClientCluster, topic: str, partition: int, producer_id: int,
                       producer_epoch: int) -> bool:
    """Fence `producer_id` below `producer_epoch` on the partition with an ABORT transaction
    marker (WriteTxnMarkers to its leader): a control batch no consumer is ever given,
    replicated before the answer. False when the target refuses it (a cluster that is not
    dcmirror's, or a principal without ClusterAction there)."""
    try:
        code = await write_txn_marker(cluster, topic, partition, producer_id=producer_id,
                                      producer_epoch=producer_epoch, commit=False)
    except UnsupportedApi:
        return False
    if code in (ErrorCode.cluster_authorization_failed, ErrorCode.unsupported_version,
                ErrorCode.invalid_request):
        return False
    if code != ErrorCode.none:
        raise KafkaError(f"fencing producer {producer_id} on {topic}-{partition}", code)
    return True


async def last_mirrored(cluster: ClientCluster, topic: str, partition: int, below: int, source_cluster: str,
                        source_partition: int) -> tuple[MirroredPosition | None, list[tuple[int, int]]]:
    """The last record of (`source_cluster`, `source_partition`) in the target partition below
    offset `below` (in target order), searching backwards in growing windows, and the leader
    epochs of its incarnation the window that held it shows ((epoch, first source offset))."""
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
        found, starts = last_mirrored_in(records, source_cluster, source_partition)
        if found is not None:
            return found, starts
        hi = lo
        window *= 4
    return None, []


async def end_offset_for_epoch(cluster: ClientCluster, topic: str, partition: int, leader_epoch: int
                               ) -> tuple[int, int]:
    """OffsetForLeaderEpoch at the partition's leader, as a consumer asks it (KIP-320): the
    largest epoch at or below `leader_epoch` the leader has and where it ends ((-1, -1) when
    it keeps none that old)."""
    resp = await cluster.leader_request(topic, partition, ApiKey.OFFSET_FOR_LEADER_EPOCH, {
        "replica_id": CONSUMER_REPLICA_ID,
        "topics": [{"topic": topic, "partitions": [{"partition": partition, "current_leader_epoch": -1,
                                                     "leader_epoch": leader_epoch}]}]})
    p = resp.topics[0].partitions[0]
    if p.error_code:
        raise KafkaError(f"asking where leader epoch {leader_epoch} of {topic}-{partition} ends", p.error_code)
    return p.leader_epoch, p.end_offset
