"""Reading the tail of a target partition: who wrote it last, and the last source offset it
holds. Used when a worker takes a partition (claim, fence, resume).

Each question comes in two forms: about one partition, and (the `_many` functions) about many
at once, one request per leader for up to PARTITIONS_PER_REQUEST of them, so that a worker
taking thousands of partitions makes a few dozen round trips instead of ten per partition.
The `_many` functions put a partition whose answer carries an error into `failed` and leave it
out of what they return."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.client.admin import write_txn_marker, write_txn_markers_body
from cluster.client.connection import UnsupportedApi
from cluster.client.errors import KafkaError
from cluster.client.metadata import ClientCluster, TopicPartition
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
# fetch_many: the most one answer may carry; partitions left empty by an answer that may have
# been cut at it are asked again.
TAIL_FETCH_RESPONSE_BYTES = 64 << 20
FIRST_WINDOW_RECORDS = 512


# WriteTxnMarkers refused: not a dcmirror cluster, or no ClusterAction for this principal.
REFUSED_MARKER_CODES = frozenset({ErrorCode.cluster_authorization_failed, ErrorCode.unsupported_version,
                                  ErrorCode.invalid_request})


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
    return _fetched(p)


def _fetched(p: Any) -> Fetched:
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
    if code in REFUSED_MARKER_CODES:
        return False
    if code != ErrorCode.none:
        raise KafkaError(f"fencing producer {producer_id} on {topic}-{partition}", code)
    return True


async def last_mirrored(cluster: ClientCluster, topic: str, partition: int, below: int, source_cluster: str,
                        source_partition: int, *, window: int = FIRST_WINDOW_RECORDS, start: int | None = None
                        ) -> tuple[MirroredPosition | None, list[tuple[int, int]]]:
    """The last record of (`source_cluster`, `source_partition`) in the target partition below
    offset `below` (in target order), searching backwards in growing windows (the first of
    `window` records; above the log start `start`, asked when not given), and the leader
    epochs of its incarnation the window that held it shows ((epoch, first source offset))."""
    if start is None:
        start, _ = await offsets(cluster, topic, partition)
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


# ---- many partitions at once ------------------------------------------------------------

Failed = dict[TopicPartition, KafkaError]


def _by_topic(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for topic, p in tps:
        topics.setdefault(topic, []).append(p)
    return topics


def _kept(answers: Mapping[TopicPartition, tuple[int, Any]], failed: Failed, what: str) -> dict[TopicPartition, Any]:
    out = {}
    for tp, (code, entry) in answers.items():
        if code:
            failed[tp] = KafkaError(f"{what} {tp[0]}-{tp[1]}", code)
        else:
            out[tp] = entry
    return out


async def list_offsets_many(cluster: ClientCluster, tps: Iterable[TopicPartition], timestamp: int,
                            failed: Failed) -> dict[TopicPartition, int]:
    """list_offset of many partitions."""

    def body(part: Sequence[TopicPartition]) -> dict[str, Any]:
        return {"replica_id": CONSUMER_REPLICA_ID, "isolation_level": READ_UNCOMMITTED, "topics": [
            {"name": t, "partitions": [{"partition_index": p, "timestamp": timestamp, "current_leader_epoch": -1}
                                       for p in ps]} for t, ps in _by_topic(part).items()]}

    def answers(resp: Any) -> Iterator[tuple[TopicPartition, int, Any]]:
        for t in resp.topics:
            for p in t.partitions:
                yield (t.name, p.partition_index), p.error_code, int(p.offset)

    got = await cluster.partitions_request(tps, ApiKey.LIST_OFFSETS, body, answers)
    return _kept(got, failed, "listing offsets of")


async def offsets_many(cluster: ClientCluster, tps: Iterable[TopicPartition], failed: Failed
                       ) -> dict[TopicPartition, tuple[int, int]]:
    """offsets of many partitions: (log start offset, high watermark) each."""
    tps = list(tps)
    starts = await list_offsets_many(cluster, tps, EARLIEST_TIMESTAMP, failed)
    ends = await list_offsets_many(cluster, [tp for tp in tps if tp in starts], LATEST_TIMESTAMP, failed)
    return {tp: (starts[tp], end) for tp, end in ends.items()}


async def fetch_many(cluster: ClientCluster, at: Mapping[TopicPartition, int], failed: Failed, *,
                     to_log_end: bool = False, partition_max_bytes: int = TAIL_FETCH_BYTES
                     ) -> dict[TopicPartition, Fetched]:
    """fetch of many partitions, each from its offset in `at` (up to `partition_max_bytes` each).
    A partition holding batches there gets at least one; an answer cut at its size may give
    it fewer than it would alone (callers go on from the last, as from any fetch)."""
    out: dict[TopicPartition, Fetched] = {}
    todo = dict(at)
    while todo:
        cut: set[TopicPartition] = set()

        def body(part: Sequence[TopicPartition], todo: dict[TopicPartition, int] = todo) -> dict[str, Any]:
            return {
                "replica_id": DEBUGGING_REPLICA_ID if to_log_end else CONSUMER_REPLICA_ID, "max_wait": 0,
                "min_bytes": 0, "max_bytes": TAIL_FETCH_RESPONSE_BYTES, "isolation_level": READ_UNCOMMITTED,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": t, "partitions": [{
                    "partition": p, "current_leader_epoch": -1, "fetch_offset": todo[(t, p)],
                    "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}
                    for p in ps]} for t, ps in _by_topic(part).items()]}

        def answers(resp: Any, cut: set[TopicPartition] = cut) -> Iterator[tuple[TopicPartition, int, Any]]:
            total = sum(len(p.records or b"") for r in resp.responses for p in r.partitions)
            # Past this a leader may have left later partitions empty (KIP-74): asked again.
            maybe_cut = total + partition_max_bytes > TAIL_FETCH_RESPONSE_BYTES
            for r in resp.responses:
                for p in r.partitions:
                    if maybe_cut and not p.error_code and not p.records:
                        cut.add((r.topic, p.partition_index))
                    yield (r.topic, p.partition_index), p.error_code, p

        got = await cluster.partitions_request(todo, ApiKey.FETCH, body, answers)
        for tp, entry in _kept({tp: a for tp, a in got.items() if tp not in cut}, failed,
                               "reading the tail of").items():
            out[tp] = _fetched(entry)
        todo = {tp: todo[tp] for tp in cut if tp in todo}
    return out


async def last_writers(cluster: ClientCluster, offs: Mapping[TopicPartition, tuple[int, int]], failed: Failed
                       ) -> dict[TopicPartition, tuple[int, int] | None]:
    """last_writer of many partitions, given each one's (log start, high watermark)."""
    at = {tp: max(start, hw - 1) for tp, (start, hw) in offs.items()}
    last: dict[TopicPartition, BatchHeader] = {}
    while at:
        got = await fetch_many(cluster, at, failed, to_log_end=True)
        further = {}
        for tp, fetched in got.items():
            if not fetched.batches:
                continue
            header = last[tp] = fetched.batches[-1].header
            nxt = header.base_offset + header.last_offset_delta + 1
            if nxt > at[tp]:
                further[tp] = nxt
        at = further
    out: dict[TopicPartition, tuple[int, int] | None] = {}
    for tp in offs:
        if tp in failed:
            continue
        tail_header = last.get(tp)
        out[tp] = (None if tail_header is None or tail_header.producer_id < 0
                   else (tail_header.producer_id, tail_header.producer_epoch))
    return out


async def abort_markers(cluster: ClientCluster, writers: Mapping[TopicPartition, tuple[int, int]], failed: Failed
                        ) -> dict[TopicPartition, bool]:
    """abort_marker on many partitions, each fencing its (producer id, epoch): one
    WriteTxnMarkers request per leader carries them all."""
    if not writers:
        return {}

    def body(part: Sequence[TopicPartition]) -> dict[str, Any]:
        of_writer: dict[tuple[int, int], list[TopicPartition]] = {}
        for tp in part:
            of_writer.setdefault(writers[tp], []).append(tp)
        return {"markers": [write_txn_markers_body(pid, epoch, False, 0, tps)["markers"][0]
                            for (pid, epoch), tps in of_writer.items()]}

    def answers(resp: Any) -> Iterator[tuple[TopicPartition, int, Any]]:
        for marker in resp.markers:
            for t in marker.topics:
                for p in t.partitions:
                    yield (t.name, p.partition_index), p.error_code, None

    try:
        got = await cluster.partitions_request(writers, ApiKey.WRITE_TXN_MARKERS, body, answers)
    except UnsupportedApi:
        return {tp: False for tp in writers}
    out: dict[TopicPartition, bool] = {}
    for tp, (code, _) in got.items():
        if code in REFUSED_MARKER_CODES:
            out[tp] = False
        elif code:
            failed[tp] = KafkaError(f"fencing producer {writers[tp][0]} on {tp[0]}-{tp[1]}", code)
        else:
            out[tp] = True
    return out


async def fetch_ranges(cluster: ClientCluster, ranges: Mapping[TopicPartition, tuple[int, int]], failed: Failed
                       ) -> dict[TopicPartition, list[Record]]:
    """The records at offsets [lo, hi) of many partitions (what the leader still has of them)."""
    records: dict[TopicPartition, list[Record]] = {tp: [] for tp in ranges}
    at = {tp: lo for tp, (lo, hi) in ranges.items() if lo < hi}
    while at:
        got = await fetch_many(cluster, at, failed)
        further = {}
        for tp, fetched in got.items():
            if not fetched.batches:
                continue
            lo, hi = ranges[tp]
            for b in fetched.batches:
                records[tp].extend(r for r in b.records if lo <= r.offset < hi)
            last = fetched.batches[-1].header
            nxt = last.base_offset + last.last_offset_delta + 1
            if at[tp] < nxt < hi:
                further[tp] = nxt
        at = further
    return {tp: rs for tp, rs in records.items() if tp not in failed}


async def last_mirrored_many(cluster: ClientCluster, asks: Mapping[TopicPartition, tuple[int, int, int]],
                             source_cluster: str, failed: Failed
                             ) -> dict[TopicPartition, tuple[MirroredPosition | None, list[tuple[int, int]]]]:
    """last_mirrored of many target partitions, each asked as (log start, below, source
    partition): the first window of all in one go, the rarer longer searches one by one."""
    windows = {tp: (max(start, below - FIRST_WINDOW_RECORDS), below) for tp, (start, below, _) in asks.items()}
    held = await fetch_ranges(cluster, windows, failed)
    out: dict[TopicPartition, tuple[MirroredPosition | None, list[tuple[int, int]]]] = {}
    for tp, records in held.items():
        start, _, source_partition = asks[tp]
        found, starts = last_mirrored_in(records, source_cluster, source_partition)
        lo = windows[tp][0]
        if found is None and lo > start:
            try:
                found, starts = await last_mirrored(cluster, tp[0], tp[1], lo, source_cluster, source_partition,
                                                    window=FIRST_WINDOW_RECORDS * 4, start=start)
            except KafkaError as exc:
                failed[tp] = exc
                continue
        out[tp] = (found, starts)
    return out


async def end_offsets_for_epochs(cluster: ClientCluster, asks: Mapping[TopicPartition, int], failed: Failed
                                 ) -> dict[TopicPartition, tuple[int, int]]:
    """end_offset_for_epoch of many partitions, each for its leader epoch in `asks`."""
    if not asks:
        return {}

    def body(part: Sequence[TopicPartition]) -> dict[str, Any]:
        return {"replica_id": CONSUMER_REPLICA_ID, "topics": [
            {"topic": t, "partitions": [{"partition": p, "current_leader_epoch": -1, "leader_epoch": asks[(t, p)]}
                                        for p in ps]} for t, ps in _by_topic(part).items()]}

    def answers(resp: Any) -> Iterator[tuple[TopicPartition, int, Any]]:
        for t in resp.topics:
            for p in t.partitions:
                yield (t.topic, p.partition), p.error_code, (p.leader_epoch, p.end_offset)

    got = await cluster.partitions_request(asks, ApiKey.OFFSET_FOR_LEADER_EPOCH, body, answers)
    return _kept(got, failed, "asking where a leader epoch ends in")
