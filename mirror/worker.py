"""One mirror worker of one flow: a member of the consumer group `dcmirror.<source>.<target>`
on the source cluster and an idempotent producer into the target cluster.

Exactly once without transactions: source partition p of topic T goes to partition p of
the renamed target topic, and each target partition has one writer at a time. Taking a
partition, a worker (1) claims it — its writes from now on carry the previous writer's
producer id with a higher epoch, so the broker refuses that writer if it still lives —
(2) fences that writer on the partition with an ABORT transaction marker under the claim
(WriteTxnMarkers, replicated before it is answered): a control batch, which no consumer is
ever given, so the target holds nothing but source records; nothing the previous writer
sent can land after it, (3) reads back from the high watermark to the last mirrored source
offset and (4) resumes right after it. A target that refuses the marker (a foreign Kafka
cluster, a principal without ClusterAction) gets the old fence record instead. The target is the truth; the source group's
committed offsets follow behind, for lag and tools.
"""

from __future__ import annotations

import collections
import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from cluster.client.accumulator import BufferFull
from cluster.client.admin import Admin, AdminError
from cluster.client.consumer import Consumer
from cluster.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from cluster.client.producer import DeliveryFuture, Producer, RecordMetadata
from cluster.common.admin_http import prometheus_text
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.protocol.errors import ErrorCode
from cluster.security.connector import CLIENT_SECURITY_KEYS
from mirror import checkpoints, provenance, tail
from topology.model import MIRROR_CONFIG_KEYS, MirrorSpec, Topology

log = logging.getLogger("dcmirror.mirror")

HEARTBEATS_TOPIC = "dcmirror.heartbeats"
SOURCE_SILENT_S = 5.0  # a partition's leader silent longer than this counts as lag (status)
# Failures a worker rides out (brokers down, leaders moving): the partition is claimed again.
RETRIABLE = (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError)
INTERNAL_PREFIXES = ("__", "dcmirror.")
TopicPartition = tuple[str, int]


def group_id(flow: MirrorSpec) -> str:
    return f"dcmirror.{flow.source}.{flow.target}"


@dataclass
class PartitionMirror:
    """Bookkeeping of one source partition this worker mirrors."""

    source: TopicPartition
    target: TopicPartition
    next_offset: int = -1  # next source offset to mirror
    acked_offset: int = -1  # highest source offset the target acknowledged
    committed_offset: int = -1  # what the source group last committed (next offset)
    pending: list[tuple[int, DeliveryFuture]] = field(default_factory=list)
    last_timestamp_ms: int = -1  # of the last record mirrored
    records: int = 0
    bytes: int = 0
    broken: str | None = None  # why it must be claimed again


def _admin_part(client: dict[str, Any]) -> dict[str, Any]:
    """The security settings of a side's client config, for its admin client."""
    return {k: v for k, v in client.items() if k in CLIENT_SECURITY_KEYS}


@dataclass
class WorkerConfig:
    topic_refresh_s: float = 5.0
    commit_interval_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    checkpoint_interval_s: float = 5.0
    http_port_base: int = 0  # worker N serves /metrics and /v1/status on base + N (0: off)
    http_host: str = "127.0.0.1"  # where the admin HTTP binds (loopback unless told otherwise)
    http_auth_token: str = ""  # a reference to the bearer token every page but /healthz needs
    http_keystore: str = ""  # PEM key + certificate: HTTPS only
    batch_records: int = 5000
    producer: dict[str, Any] = field(default_factory=dict)
    consumer: dict[str, Any] = field(default_factory=dict)
    # This flow's own principal on each side (source.* / target.*: sasl.*, ssl.*), over the
    # cluster's `client` settings, for every client of that side (consumer/producer and admin).
    source: dict[str, Any] = field(default_factory=dict)
    target: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_flow(cls, flow: MirrorSpec) -> WorkerConfig:
        """Flow `config` keys: topic.refresh.ms, offset.commit.interval.ms, heartbeat.interval.ms,
        and producer.* / consumer.* passed to the clients."""
        c = cls()
        for key, value in flow.config.items():
            if key == "topic.refresh.ms":
                c.topic_refresh_s = int(value) / 1000
            elif key == "offset.commit.interval.ms":
                c.commit_interval_s = int(value) / 1000
            elif key == "heartbeat.interval.ms":
                c.heartbeat_interval_s = int(value) / 1000
            elif key == "checkpoint.interval.ms":
                c.checkpoint_interval_s = int(value) / 1000
            elif key == "http.port.base":
                c.http_port_base = int(value)
            elif key == "http.host":
                c.http_host = value
            elif key == "http.auth.token":
                c.http_auth_token = value
            elif key == "http.ssl.keystore.location":
                c.http_keystore = value
            elif key.startswith("producer."):
                c.producer[key.removeprefix("producer.")] = value
            elif key.startswith("consumer."):
                c.consumer[key.removeprefix("consumer.")] = value
            elif key.startswith("source."):
                c.source[key.removeprefix("source.")] = value
            elif key.startswith("target."):
                c.target[key.removeprefix("target.")] = value
            else:
                raise ValueError(f"mirror flow {flow.name!r}: unknown config {key!r} ("
                                 + ", ".join(MIRROR_CONFIG_KEYS) + ", producer.*, consumer.*)")
        return c


class ProblemRecorder(logging.Handler):
    """Keeps a worker's last warning or error (message and time) for its status: what an
    operator looking at `dcmirror mirror status` from another host wants before the logs."""

    def __init__(self, worker: MirrorWorker) -> None:
        super().__init__(logging.WARNING)
        self.worker = worker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        self.worker.last_problem = {"level": record.levelname, "message": message[:PROBLEM_MAX_CHARS],
                                    "at_ms": int(record.created * 1000)}


PROBLEM_MAX_CHARS = 500
RATE_WINDOW_MS = 10_000  # records_per_s_recent: over about the last 10 s of status calls


class MirrorWorker:
    def __init__(self, topology: Topology, flow: MirrorSpec, name: str | None = None, *,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.topology = topology
        self.flow = flow
        self.name = name or f"{flow.name}-{socket.gethostname()}-{id(self) & 0xFFFF:x}"
        self.source = topology.cluster(flow.source)
        self.target = topology.cluster(flow.target)
        self.config = WorkerConfig.from_flow(flow)
        self.partitions: dict[TopicPartition, PartitionMirror] = {}
        self.topics: dict[str, str] = {}  # source topic -> target topic
        self.metrics: dict[str, Any] = {"records": 0, "bytes": 0, "skipped_cycle": 0, "data_loss_records": 0,
                                        "claims": 0, "fenced": 0, "started_ms": clock.now_ms()}
        self.last_problem: dict[str, Any] | None = None
        self._rate_samples: collections.deque[tuple[int, int]] = collections.deque(maxlen=64)
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._source_admin: Admin | None = None
        self._target_admin: Admin | None = None
        self._assigned = trio.Event()
        self._stopping = trio.Event()
        self._stopped = trio.Event()
        self._totals: dict[TopicPartition, tuple[int, int]] = {}  # records, bytes of partitions given up
        self._fence_records_warned = False

    # ---- setup ----------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        c = self.config
        source_client = self.source.client_config(c.source)
        target_client = self.target.client_config(c.target)
        producer_config = {**target_client, "client.id": self.name, "acks": "all",
                           "enable.idempotence": True, "linger.ms": 5, "max.block.ms": 30000, **c.producer}
        consumer_config = {**source_client, "client.id": self.name,
                           "group.id": group_id(self.flow), "enable.auto.commit": False,
                           "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                           "session.timeout.ms": 10000,
                           "heartbeat.interval.ms": 1000, "metadata.max.age.ms": int(c.topic_refresh_s * 1000),
                           # Workers run beside their target (consume remote, produce local):
                           # a stretched source serves them from its replicas in the target's
                           # datacenter (KIP-392), if its brokers declare racks.
                           "client.rack": self.target.datacenter,
                           **c.consumer}
        async with Admin(self.source.bootstrap(), client_id=self.name, config=_admin_part(source_client)) as sadmin, \
                Admin(self.target.bootstrap(), client_id=self.name, config=_admin_part(target_client)) as tadmin, \
                Producer(producer_config) as producer, Consumer(consumer_config) as consumer:
            self._source_admin, self._target_admin = sadmin, tadmin
            self._producer, self._consumer = producer, consumer
            await self._sync_topics()
            consumer.subscribe(sorted(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke)
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._stop_when_asked, consumer, nursery)
                nursery.start_soon(self._watch_topics)
                nursery.start_soon(self._commit_loop)
                nursery.start_soon(self._heartbeat_loop)
                nursery.start_soon(self._checkpoint_loop)
                await self._mirror_loop()

    async def stop(self) -> None:
        """Hand the partitions over cleanly: leave the group (flush, commit) while the producer
        still runs, then stop."""
        self._stopping.set()
        await self._stopped.wait()

    async def _stop_when_asked(self, consumer: Consumer, nursery: trio.Nursery) -> None:
        await self._stopping.wait()
        try:
            with trio.move_on_after(60):
                if consumer.group is not None:
                    # Leave (-> on_revoke: flush, commit) from here; the consumer itself is closed by
                    # the task that opened it (its nursery belongs to that task).
                    await consumer.group.leave()
        finally:
            self._stopped.set()
            nursery.cancel_scope.cancel()

    async def _sync_topics(self) -> bool:
        """Source topics the flow matches → target topics with the same partition count and
        configs (the target's replication factor); returns whether the set changed."""
        assert self._source_admin is not None and self._target_admin is not None
        meta = await self._source_admin.metadata(None)
        matching = {t.name: len(t.partitions) for t in meta.topics
                    if t.error_code == 0 and not t.name.startswith(INTERNAL_PREFIXES) and self.flow.matches(t.name)
                    and not self._is_copy_from_target(t.name)}
        target_meta = await self._target_admin.metadata(None)
        target_counts = {t.name: len(t.partitions) for t in target_meta.topics if t.error_code == 0}
        rf = min(self.topology.defaults.replication_factor, len(self.target.brokers))
        mapping = {}
        for name, count in sorted(matching.items()):
            target_name = self.flow.target_topic(name, self.source.datacenter)
            mapping[name] = target_name
            have = target_counts.get(target_name)
            if have is None:
                configs = await self._source_topic_configs(name)
                try:
                    await self._target_admin.create_topic(target_name, count, rf, configs)
                    log.info("created %s in %s: %d partitions, RF %d, configs %s", target_name, self.flow.target,
                             count, rf, configs)
                except AdminError as exc:
                    if exc.code != ErrorCode.topic_already_exists:
                        raise
            elif have < count:
                await self._target_admin.create_partitions(target_name, count)
                log.info("added partitions to %s in %s: %d -> %d", target_name, self.flow.target, have, count)
        changed = mapping != self.topics
        self.topics = mapping
        return changed

    def _is_copy_from_target(self, topic: str) -> bool:
        """Whether `topic` is what a flow from our target into our source names its copies:
        its records all passed through the target, so mirroring it back would only grow a
        chain of empty topics (east.west.east...)."""
        for other in self.topology.mirrors:
            if other.source == self.flow.target and other.target == self.flow.source:
                dc = self.topology.cluster(other.source).datacenter
                pattern = re.escape(other.rename)
                for name, value in (("source", other.source), ("target", other.target), ("source_dc", dc)):
                    pattern = pattern.replace(re.escape("{" + name + "}"), re.escape(value))
                pattern = pattern.replace(re.escape("{topic}"), ".+")
                if re.fullmatch(pattern, topic):
                    return True
        return False

    async def _source_topic_configs(self, topic: str) -> dict[str, str]:
        assert self._source_admin is not None
        out = {}
        for entry in await self._source_admin.topic_configs(topic):
            source = getattr(entry, "config_source", None)
            if source == 1 and entry.value is not None:  # DYNAMIC_TOPIC_CONFIG: set on the topic itself
                out[entry.name] = entry.value
        return out

    async def _watch_topics(self) -> None:
        while True:
            await trio.sleep(self.config.topic_refresh_s)
            try:
                if await self._sync_topics():
                    log.info("flow %s now mirrors %s", self.flow.name, sorted(self.topics))
                    assert self._consumer is not None
                    self._consumer.subscribe(sorted(self.topics))
            except RETRIABLE as exc:
                log.warning("topic refresh failed: %s", exc)

    # ---- taking and giving up partitions -------------------------------------------

    async def _on_assign(self, tps: list[TopicPartition]) -> None:
        assert self._consumer is not None
        # Nothing is fetched before a partition is claimed and sought: it would be read twice.
        self._consumer.pause(*tps)
        for tp in tps:
            topic, p = tp
            if topic not in self.topics:
                await self._sync_topics()
            pm = self.partitions[tp] = PartitionMirror(tp, (self.topics[topic], p))
            previous = self._totals.get(tp)
            if previous is not None:
                pm.records, pm.bytes = previous
            try:
                await self._claim(pm)
            except RETRIABLE as exc:
                pm.broken = f"claim failed: {exc}"  # the mirror loop claims it again, with backoff
        self._assigned.set()

    async def _on_revoke(self, tps: list[TopicPartition]) -> None:
        assert self._producer is not None
        try:
            await self._producer.flush(30)
        except RETRIABLE as exc:
            log.warning("flush before revocation: %s", exc)
        self._settle()
        await self._commit()
        for tp in tps:
            pm = self.partitions.pop(tp, None)
            if pm is not None:
                self._totals[tp] = (pm.records, pm.bytes)

    async def _claim(self, pm: PartitionMirror) -> None:
        """Fence the previous writer of the target partition, then resume after the last
        source offset the target holds."""
        assert self._producer is not None and self._consumer is not None
        producer, consumer = self._producer, self._consumer
        topic, p = pm.target
        assert self._target_admin is not None
        cluster = self._target_admin.cluster
        await producer.flush(30)
        await cluster.wait_for_topic(topic, 30)
        with trio.fail_after(30):
            while (producer.partitions_for(topic) or 0) <= p:  # e.g. partitions just added
                await producer.cluster.refresh({topic})
                if (producer.partitions_for(topic) or 0) <= p:
                    await trio.sleep(0.2)
        writer = await tail.last_writer(cluster, topic, p)
        below = None
        if writer is not None:
            epoch = min(writer[1] + 1, 32767)
            producer.claim(topic, p, writer[0], epoch)
            if not await tail.abort_marker(cluster, topic, p, writer[0], epoch):
                if not self._fence_records_warned:
                    self._fence_records_warned = True
                    log.warning("%s: the target refuses WriteTxnMarkers (not a dcmirror cluster, or no "
                                "ClusterAction for this principal): fencing with a record instead, which "
                                "consumers of the target will see", self.name)
                fence = await producer.send_and_wait(topic, None, None, partition=p,
                                                     headers=[(provenance.FENCE, self.name.encode())])
                below = fence.offset
        if below is None:
            # The marker is replicated: the high watermark is past it and past every batch
            # the fenced writer got into the log; nothing of it can land later.
            _, below = await tail.offsets(cluster, topic, p)
            fence_at = below - 1  # the marker: nothing else is written meanwhile
        else:
            fence_at = below
        last = await tail.last_mirrored(cluster, topic, p, below, self.flow.source, pm.source[1])
        start, _ = await tail.offsets(self._source_cluster_client(), pm.source[0], pm.source[1])
        resume = start if last is None else last + 1
        if resume < start:
            lost = start - resume
            self.metrics["data_loss_records"] += lost
            log.error("DATA LOSS: %s-%d offsets %d..%d were deleted by retention at the source before they were "
                      "mirrored (%d records); resuming at %d", pm.source[0], pm.source[1], resume, start - 1, lost,
                      start)
            resume = start
        pm.next_offset = resume
        pm.acked_offset = resume - 1
        pm.broken = None
        consumer.seek(pm.source, resume)
        consumer.resume(pm.source)
        self.metrics["claims"] += 1
        log.info("%s took %s-%d -> %s-%d (fence at offset %d%s); resuming at source offset %d", self.name,
                 pm.source[0], pm.source[1], topic, p, fence_at,
                 f", previous writer {writer[0]} epoch {writer[1]} fenced" if writer else "", resume)

    def _source_cluster_client(self) -> Any:
        # The admin's connections: the consumer's carry long-polling Fetches, which a request
        # would queue behind (a broker answers one connection's requests in order).
        assert self._source_admin is not None
        return self._source_admin.cluster

    # ---- mirroring ------------------------------------------------------------------

    async def _mirror_loop(self) -> None:
        assert self._consumer is not None and self._producer is not None
        consumer, producer = self._consumer, self._producer
        target_cluster = self.flow.target
        source_cluster = self.flow.source
        source_bytes = source_cluster.encode()
        while True:
            for broken in [pm for pm in self.partitions.values() if pm.broken]:
                log.warning("re-claiming %s-%d: %s", broken.source[0], broken.source[1], broken.broken)
                try:
                    await self._claim(broken)
                except RETRIABLE as exc:
                    broken.broken = f"claim failed: {exc}"
                    log.warning("claiming %s-%d failed: %s", broken.source[0], broken.source[1], exc)
                    await trio.sleep(1)
            batches = await consumer.getmany(timeout_s=0.5, max_records=self.config.batch_records)
            for tp, records in batches.items():
                pm = self.partitions.get(tp)
                if pm is None or pm.broken or pm.next_offset < 0:
                    continue  # not (yet) ours: claimed first, then sought
                if records[0].offset > pm.next_offset:
                    try:
                        await self._check_gap(pm, records[0].offset)
                    except RETRIABLE as exc:
                        log.warning("checking a gap in %s-%d: %s", tp[0], tp[1], exc)
                ttopic, tpart = pm.target
                future: DeliveryFuture | None = None
                # Provenance of records without headers of their own (nearly all): only the
                # offset varies, so the producer adds it in C (produce_tagged).
                prefix = ((provenance.SOURCE_CLUSTER, source_bytes), (provenance.SOURCE_PARTITION, b"%d" % tp[1]))
                suffix = ((provenance.PATH, source_bytes),)
                i, n = 0, len(records)
                while i < n and records[i].offset < pm.next_offset:
                    i += 1
                first = i
                count = nbytes = 0
                try:
                    while i < n:
                        r = records[i]
                        if not r.headers:
                            f = DeliveryFuture()
                            end, vbytes = producer.produce_tagged(ttopic, tpart, records, i, prefix,
                                                                  provenance.SOURCE_OFFSET, suffix, on_delivery=f)
                            if end > i:
                                future = f
                                nbytes += vbytes
                                count += end - i
                                i = end
                                continue
                            headers: provenance.Headers = prefix + (
                                (provenance.SOURCE_OFFSET, b"%d" % r.offset),) + suffix
                        elif provenance.passed_through(r.headers, target_cluster) or provenance.is_fence(r):
                            # Back where it came from, or another flow's fence: not data to copy.
                            self.metrics["skipped_cycle"] += 1
                            i += 1
                            continue
                        else:
                            headers = provenance.mirrored_headers(r.headers, source_cluster, tp[1], r.offset)
                        # A record with headers of its own, or buffer.memory is full (send waits for room).
                        future = await producer.send(ttopic, r.value, r.key, partition=tpart, timestamp_ms=r.timestamp,
                                                     headers=headers)
                        nbytes += len(r.value) if r.value is not None else 0
                        count += 1
                        i += 1
                except KafkaError as exc:  # e.g. the target lost the partition's metadata
                    pm.broken = f"producing: {exc}"
                    continue
                if i > first:
                    pm.next_offset = records[i - 1].offset + 1
                    pm.last_timestamp_ms = records[i - 1].timestamp
                pm.records += count
                pm.bytes += nbytes
                if future is None and pm.next_offset > 0:
                    # Only skipped records: they count as done once everything before them is.
                    future = DeliveryFuture.completed(RecordMetadata(ttopic, tpart, -1, -1))
                if future is not None:
                    pm.pending.append((pm.next_offset - 1, future))
                    self.metrics["records"] = sum(x.records for x in self.partitions.values()) + sum(
                        n for tp, (n, _) in self._totals.items() if tp not in self.partitions)
            for tp, pm in self.partitions.items():
                try:
                    position = consumer.position(tp)
                except KeyError:
                    continue  # being revoked
                if pm.broken or pm.next_offset < 0 or position is None or position <= pm.next_offset:
                    continue
                # The consumer moved past transaction markers or aborted data of the source:
                # nothing there to copy, done once everything before it is.
                pm.next_offset = position
                pm.pending.append((position - 1, DeliveryFuture.completed(RecordMetadata(*pm.target, -1, -1))))
            self._settle()
            # getmany() returns at once while records are buffered: without this the loop would
            # run until buffer.memory filled before the sender and the fetcher got a turn.
            await trio.lowlevel.checkpoint()

    def _settle(self) -> None:
        """Move acknowledged positions forward; a failed delivery breaks the partition (it is
        claimed again: the target says where to resume)."""
        for pm in self.partitions.values():
            while pm.pending and pm.pending[0][1].done:
                offset, future = pm.pending.pop(0)
                if future.error is not None:
                    pm.broken = f"delivery failed: {future.error}"
                    pm.pending.clear()
                    if isinstance(future.error, KafkaError) and future.error.code in (
                            ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced):
                        self.metrics["fenced"] += 1
                    break
                pm.acked_offset = max(pm.acked_offset, offset)

    async def _check_gap(self, pm: PartitionMirror, first: int) -> None:
        """Records skipped between the expected offset and `first`: compaction leaves such gaps
        legitimately; below the source's log start they were deleted before being mirrored."""
        start, _ = await tail.offsets(self._source_cluster_client(), *pm.source)
        if pm.next_offset < start:
            lost = min(start, first) - pm.next_offset
            self.metrics["data_loss_records"] += lost
            log.error("DATA LOSS: %s-%d offsets %d..%d were deleted at the source before they were mirrored "
                      "(%d records)", pm.source[0], pm.source[1], pm.next_offset, min(start, first) - 1, lost)

    # ---- offsets, heartbeats, metrics ----------------------------------------------

    async def _commit(self) -> None:
        assert self._consumer is not None
        offsets = {tp: pm.acked_offset + 1 for tp, pm in self.partitions.items()
                   if pm.acked_offset + 1 > pm.committed_offset and pm.acked_offset >= 0}
        if not offsets:
            return
        try:
            await self._consumer.commit(offsets)
        except RETRIABLE as exc:
            log.info("committing source offsets: %s", exc)
            return
        for tp, offset in offsets.items():
            if tp in self.partitions:
                self.partitions[tp].committed_offset = offset

    async def _commit_loop(self) -> None:
        while True:
            await trio.sleep(self.config.commit_interval_s)
            self._settle()
            await self._commit()

    async def _heartbeat_loop(self) -> None:
        """A heartbeat per flow into the target's dcmirror.heartbeats topic (key = flow name), so
        the aggregate side can tell a quiet source from a broken flow."""
        assert self._producer is not None and self._target_admin is not None
        try:
            await self._target_admin.create_topic(HEARTBEATS_TOPIC, 1, min(3, len(self.target.brokers)),
                                                  {"cleanup.policy": "compact,delete", "retention.ms": "86400000"})
        except AdminError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                log.warning("creating %s: %s", HEARTBEATS_TOPIC, exc)
        while True:
            beat = {"flow": self.flow.name, "source": self.flow.source, "target": self.flow.target,
                    "worker": self.name, "timestamp_ms": self.clock.now_ms(), "lag_records": self.lag_records()}
            try:
                self._producer.produce(HEARTBEATS_TOPIC, orjson.dumps(beat), f"{self.flow.name}/{self.name}".encode(),
                                       headers=[(provenance.HEARTBEAT, b"1")])
            except (BufferFull, KafkaError):
                pass
            await trio.sleep(self.config.heartbeat_interval_s)

    async def _checkpoint_loop(self) -> None:
        """Translate the committed offsets of the source's consumer groups (the flow's `groups`
        regex; default every group but internal ones) for the partitions this worker owns, and
        write them as checkpoints into the target."""
        assert self._source_admin is not None and self._target_admin is not None and self._producer is not None
        pattern = re.compile(self.flow.groups or ".*")
        try:
            await self._target_admin.create_topic(checkpoints.CHECKPOINTS_TOPIC, 1, min(3, len(self.target.brokers)),
                                                  {"cleanup.policy": "compact"})
        except AdminError as exc:
            if exc.code != ErrorCode.topic_already_exists:
                log.warning("creating %s: %s", checkpoints.CHECKPOINTS_TOPIC, exc)
        written: dict[tuple[str, TopicPartition], int] = {}
        while True:
            await trio.sleep(self.config.checkpoint_interval_s)
            try:
                groups = [g for g, _, _ in await self._source_admin.list_groups()
                          if not g.startswith(INTERNAL_PREFIXES) and pattern.fullmatch(g)]
                for group in groups:
                    committed = await self._source_admin.committed_offsets(group)
                    for tp, offset in committed.items():
                        pm = self.partitions.get(tp)
                        if pm is None or written.get((group, tp)) == offset:
                            continue
                        target_offset = await checkpoints.translate(self._target_admin.cluster, pm.target[0], pm.target[1],
                                                                    self.flow.source, tp[1], offset)
                        if target_offset is None:
                            continue  # the mirror has not copied that far yet
                        cp = checkpoints.Checkpoint(group, self.flow.source, tp[0], tp[1], offset, pm.target[0],
                                                    target_offset, self.clock.now_ms())
                        self._producer.produce(checkpoints.CHECKPOINTS_TOPIC, cp.value(), cp.key)
                        written[(group, tp)] = offset
                        self.metrics["checkpoints"] = self.metrics.get("checkpoints", 0) + 1
            except (*RETRIABLE, BufferFull) as exc:
                log.info("checkpoints: %s", exc)

    def lag_records(self) -> int:
        assert self._consumer is not None
        total = 0
        for tp, pm in self.partitions.items():
            try:
                hw = self._consumer.highwater(tp)
            except KeyError:
                continue
            if hw >= 0:
                total += max(0, hw - (pm.acked_offset + 1))
        return total

    def status(self) -> dict[str, Any]:
        """Metrics per flow and partition (lag in records and seconds, record age, throughput)."""
        now_ms = self.clock.now_ms()
        parts = []
        consumer = self._consumer
        for tp, pm in sorted(self.partitions.items()):
            hw = consumer.highwater(tp) if consumer and tp in consumer.assignment() else -1
            lag = max(0, hw - (pm.acked_offset + 1)) if hw >= 0 else None
            lag_s = 0.0 if lag == 0 else (None if pm.last_timestamp_ms < 0 else (now_ms - pm.last_timestamp_ms) / 1000)
            # The high watermark is only as fresh as the leader's last answer: a source that
            # stopped answering (cut off, down) may hold anything since, so the lag is at least
            # that long, and keeps growing, rather than the 0 of the last answer.
            silent_s = consumer.since_last_answer_s(tp) if consumer and tp in consumer.assignment() else None
            if silent_s is not None and silent_s > SOURCE_SILENT_S:
                lag_s = max(lag_s or 0.0, silent_s)
            parts.append({"topic": tp[0], "partition": tp[1], "target_topic": pm.target[0],
                          "next_offset": pm.next_offset, "acked_offset": pm.acked_offset, "high_watermark": hw,
                          "lag_records": lag, "records": pm.records, "bytes": pm.bytes,
                          "record_age_s": None if pm.last_timestamp_ms < 0 else (now_ms - pm.last_timestamp_ms) / 1000,
                          "lag_s": lag_s, "source_silent_s": silent_s})
        uptime = max(1e-9, (self.clock.now_ms() - self.metrics["started_ms"]) / 1000)
        samples = self._rate_samples
        samples.append((now_ms, self.metrics["records"]))
        while len(samples) > 2 and now_ms - samples[1][0] >= RATE_WINDOW_MS:
            samples.popleft()
        span_ms = now_ms - samples[0][0]
        recent = (self.metrics["records"] - samples[0][1]) * 1000 / span_ms if span_ms > 0 else None
        return {"flow": self.flow.name, "worker": self.name, "source": self.flow.source, "target": self.flow.target,
                "group": group_id(self.flow), **{k: v for k, v in self.metrics.items() if k != "started_ms"},
                "records_per_s": self.metrics["records"] / uptime, "records_per_s_recent": recent,
                "lag_records": sum(p["lag_records"] or 0 for p in parts), "uptime_s": uptime,
                "last_problem": self.last_problem, "partitions": parts}


    def prometheus(self) -> bytes:
        """Prometheus text: throughput, lag, record age, claims, data loss, per flow and partition."""
        st = self.status()
        base = {"flow": self.flow.name, "worker": self.name}
        parts = st["partitions"]

        def per_partition(key: str) -> list[tuple[dict[str, str], float]]:
            return [(base | {"topic": p["topic"], "partition": str(p["partition"])}, float(p[key]))
                    for p in parts if p[key] is not None]

        return prometheus_text({
            "dcmirror_mirror_records_total": ("counter", "Records mirrored", [(base, st["records"])]),
            "dcmirror_mirror_partition_records_total": ("counter", "Records mirrored per source partition",
                                                        per_partition("records")),
            "dcmirror_mirror_partition_bytes_total": ("counter", "Value bytes mirrored per source partition",
                                                      per_partition("bytes")),
            "dcmirror_mirror_lag_records": ("gauge", "Source records not yet acknowledged by the target",
                                            per_partition("lag_records")),
            "dcmirror_mirror_lag_seconds": ("gauge", "Age of the oldest unmirrored data (0 when caught up)",
                                            per_partition("lag_s")),
            "dcmirror_mirror_record_age_seconds": ("gauge", "Age of the last mirrored record",
                                                   per_partition("record_age_s")),
            "dcmirror_mirror_source_silent_seconds": ("gauge", "Seconds since the source partition's leader "
                                                      "last answered a fetch", per_partition("source_silent_s")),
            "dcmirror_mirror_claims_total": ("counter", "Partitions taken over (fenced and resumed)",
                                             [(base, st["claims"])]),
            "dcmirror_mirror_fenced_total": ("counter", "Deliveries refused because another worker claimed "
                                             "the partition", [(base, st["fenced"])]),
            "dcmirror_mirror_skipped_cycle_total": ("counter", "Records not mirrored back into a cluster they "
                                                    "came from", [(base, st["skipped_cycle"])]),
            "dcmirror_mirror_data_loss_records_total": ("counter", "Source records deleted before they were "
                                                        "mirrored", [(base, st["data_loss_records"])]),
        })

    def cluster_view(self) -> dict[str, Any]:
        """/v1/cluster: which clusters this worker connects, and how far behind it is."""
        st = self.status()
        return {"flow": self.flow.name, "worker": self.name, "group": group_id(self.flow),
                "source": {"cluster": self.source.name, "datacenter": self.source.datacenter,
                           "bootstrap": self.source.bootstrap()},
                "target": {"cluster": self.target.name, "datacenter": self.target.datacenter,
                           "bootstrap": self.target.bootstrap()},
                "partitions": len(st["partitions"]), "lag_records": st["lag_records"]}

    def routes(self) -> dict[str, Any]:
        return {"/healthz": lambda: ("text/plain", b"ok\n"),
                "/metrics": lambda: ("text/plain; version=0.0.4", self.prometheus()),
                "/v1/status": lambda: ("application/json", orjson.dumps(self.status())),
                "/v1/cluster": lambda: ("application/json", orjson.dumps(self.cluster_view()))}


def flows_of(topology: Topology, name: str | None) -> list[MirrorSpec]:
    if name is None:
        return list(topology.mirrors)
    for flow in topology.mirrors:
        if flow.name == name:
            return [flow]
    names = ", ".join(f.name for f in topology.mirrors) or "(none)"
    raise ValueError(f"no mirror flow {name!r} in the topology; flows: {names}")


def as_mapping(status: Mapping[str, Any]) -> bytes:
    return orjson.dumps(status)
