"""Replica verification (like kafka-replica-verification): are the replicas of each partition
byte-identical up to the leader's high watermark, and how far behind is each one?

Every replica is read with Fetch and replica_id -2 (Kafka's debugging consumer id), which a
dcmirror broker serves from any replica, leader or follower, up to its log end. Batches are
compared in lockstep (base offset, last offset and a BLAKE2b digest of the whole batch), so
memory stays flat however long the logs are.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from cluster.client.admin import Admin
from cluster.client.connection import BrokerConnection, KafkaConnectionError
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import iter_headers
from cluster.protocol.sentinels import DEBUGGING_REPLICA_ID, READ_UNCOMMITTED

FETCH_BYTES = 1 << 20


@dataclass
class ReplicaReport:
    broker_id: int
    in_isr: bool
    log_start_offset: int = -1
    log_end_offset: int = -1
    lag: int = -1  # leader's log end minus this replica's (-1: unknown)
    batches_compared: int = 0
    status: str = "ok"  # ok | behind | mismatch | unavailable
    detail: str = ""


@dataclass
class PartitionReport:
    topic: str
    partition: int
    leader: int
    high_watermark: int = -1
    compared_from: int = -1
    replicas: list[ReplicaReport] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        """No replica differs below the high watermark and every in-sync replica was read."""
        return all(r.status in ("ok", "behind") or (r.status == "unavailable" and not r.in_isr)
                   for r in self.replicas) and self.leader >= 0

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "leader": self.leader,
                "high_watermark": self.high_watermark, "compared_from": self.compared_from,
                "consistent": self.consistent,
                "replicas": [r.__dict__ for r in self.replicas]}


class ReplicaReadError(Exception):
    pass


async def _fetch(conn: BrokerConnection, topic: str, partition: int, offset: int, max_bytes: int) -> Any:
    resp = await conn.request(ApiKey.FETCH, {
        "replica_id": DEBUGGING_REPLICA_ID, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes,
        "isolation_level": READ_UNCOMMITTED, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{
            "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": "",
    })
    return resp.responses[0].partitions[0]


class _ReplicaReader:
    """One replica's batches in order, as (base_offset, last_offset, digest)."""

    def __init__(self, conn: BrokerConnection, topic: str, partition: int, fetch_bytes: int) -> None:
        self.conn, self.topic, self.partition, self.fetch_bytes = conn, topic, partition, fetch_bytes
        self.log_start_offset = -1
        self.high_watermark = -1
        self.log_end_offset = -1  # known once the reader ran to the end

    async def probe(self) -> None:
        p = await _fetch(self.conn, self.topic, self.partition, 0, 1)
        if p.error_code not in (ErrorCode.none, ErrorCode.offset_out_of_range):
            raise ReplicaReadError(f"{ErrorCode(p.error_code).name} from broker {self.conn.address}")
        self.log_start_offset, self.high_watermark = p.log_start_offset, p.high_watermark

    async def batches(self, start: int) -> AsyncIterator[tuple[int, int, bytes]]:
        offset = start
        while True:
            p = await _fetch(self.conn, self.topic, self.partition, offset, self.fetch_bytes)
            if p.error_code == ErrorCode.offset_out_of_range:
                break  # past this replica's end (or retention moved its start meanwhile)
            if p.error_code != ErrorCode.none:
                raise ReplicaReadError(f"{ErrorCode(p.error_code).name} from broker {self.conn.address}")
            data = bytes(p.records or b"")
            moved = False
            for pos, h in iter_headers(data):
                if h.next_offset <= offset:
                    continue
                yield h.base_offset, h.last_offset, hashlib.blake2b(data[pos:pos + h.size_bytes], digest_size=16).digest()
                offset, moved = h.next_offset, True
            if not moved:
                break
        self.log_end_offset = offset


async def _drain(it: AsyncIterator[tuple[int, int, bytes]]) -> None:
    async for _ in it:
        pass


async def verify_partition(conns: dict[int, BrokerConnection | None], topic: str, partition: int,
                           leader: int, replicas: list[int], isr: list[int],
                           fetch_bytes: int = FETCH_BYTES) -> PartitionReport:
    report = PartitionReport(topic, partition, leader)
    reports = {r: ReplicaReport(r, r in isr) for r in replicas}
    report.replicas = list(reports.values())
    readers: dict[int, _ReplicaReader] = {}
    for r in replicas:
        conn = conns.get(r)
        if conn is None:
            reports[r].status, reports[r].detail = "unavailable", "broker is not registered or not reachable"
            continue
        reader = _ReplicaReader(conn, topic, partition, fetch_bytes)
        try:
            await reader.probe()
        except (ReplicaReadError, KafkaConnectionError) as exc:
            reports[r].status, reports[r].detail = "unavailable", str(exc)
            continue
        readers[r] = reader
    if leader not in readers:
        if leader in reports and reports[leader].status == "ok":
            reports[leader].status = "unavailable"
        return report
    hw = report.high_watermark = readers[leader].high_watermark
    start = report.compared_from = max(rd.log_start_offset for rd in readers.values())
    iters = {r: rd.batches(start) for r, rd in readers.items()}
    pending: dict[int, tuple[int, int, bytes] | None] = {}
    comparing = {r for r in readers if r != leader}
    try:
        async for batch in iters[leader]:
            base, last, digest = batch
            if last >= hw:
                break
            reports[leader].batches_compared += 1
            for r in list(comparing):
                other = pending.pop(r, None)
                try:
                    while other is None or other[0] < base:
                        other = await iters[r].__anext__()
                except StopAsyncIteration:
                    comparing.discard(r)
                    reports[r].status = "behind"
                    reports[r].detail = f"ends at {readers[r].log_end_offset}, below the high watermark {hw}"
                    continue
                if other == batch:
                    reports[r].batches_compared += 1
                    continue
                comparing.discard(r)
                reports[r].status = "mismatch"
                reports[r].detail = (f"batch at offset {other[0]}-{other[1]} differs from the leader's "
                                     f"{base}-{last}")
        await _drain(iters[leader])
        for r in readers:
            if r != leader:
                await _drain(iters[r])
    except (ReplicaReadError, KafkaConnectionError) as exc:
        for r in readers:
            if reports[r].status == "ok" and readers[r].log_end_offset < 0:
                reports[r].status, reports[r].detail = "unavailable", str(exc)
    leader_end = readers[leader].log_end_offset
    for r, rd in readers.items():
        reports[r].log_start_offset = rd.log_start_offset
        reports[r].log_end_offset = rd.log_end_offset
        if rd.log_end_offset >= 0 and leader_end >= 0:
            reports[r].lag = max(0, leader_end - rd.log_end_offset)
    return report


async def verify_replicas(admin: Admin, topics: list[str] | None = None, *,
                          include_internal: bool = False, fetch_bytes: int = FETCH_BYTES) -> list[PartitionReport]:
    meta = await admin.metadata(topics)
    brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
    conns: dict[int, BrokerConnection | None] = {}
    for node_id, address in brokers.items():
        try:
            conns[node_id] = await admin._conn(*address)
        except KafkaConnectionError:
            conns[node_id] = None
    out = []
    for t in sorted(meta.topics, key=lambda t: t.name):
        if t.error_code != ErrorCode.none:
            raise ReplicaReadError(f"topic {t.name!r}: {ErrorCode(t.error_code).name}")
        if t.is_internal and not include_internal and topics is None:
            continue
        for p in sorted(t.partitions, key=lambda p: p.partition_index):
            out.append(await verify_partition(conns, t.name, p.partition_index, p.leader_id,
                                              list(p.replica_nodes), list(p.isr_nodes), fetch_bytes))
    return out
