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
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from cluster.client.accumulator import BufferFull
from cluster.client.admin import Admin, AdminError
from cluster.client.consumer import Consumer, FetchedChunk, PartitionError, TopicIdChanged
from cluster.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError
from cluster.client.producer import DeliveryFuture, Producer
from cluster.common.admin_http import prometheus_text
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.protocol.errors import ErrorCode
from cluster.protocol.records import CODEC_IDS, compress
from cluster.protocol.sentinels import RESOURCE_BROKER
from cluster.security.connector import CLIENT_SECURITY_KEYS
from mirror import checkpoints, deadletter, flow_control, history, provenance, tail
from mirror.core import record_copy
from mirror.core.record_copy import DONE, SIZE_ERRORS, Delivery, PartitionMirror
from mirror.schema_sync import SchemaSync, open_schema_sync
from mirror.topic_sync import sync_owner
from topology.model import MIRROR_CHOICE_KEYS, MIRROR_CONFIG_KEYS, MirrorSpec, Topology

log = logging.getLogger("dcmirror.mirror")

HEARTBEATS_TOPIC = "dcmirror.heartbeats"
SOURCE_SILENT_S = 5.0  # a partition's leader silent longer than this counts as lag (status)
LOOP_WALK_INTERVAL_S = 0.1  # the mirror loop looks at every partition at most this often (see _mirror_loop)
HOLE_PROBE_BYTES = 16 << 10  # of a target partition's first batches, to find its first mirrored record
EVENTS_MAX = 50  # history events (re-creations, divergences, refills, dead letters) kept for status
# Failures a worker rides out (brokers down, leaders moving): the partition is claimed again.
RETRIABLE = (KafkaError, KafkaConnectionError, KafkaTimeoutError, OSError)
INTERNAL_PREFIXES = ("__", "dcmirror.")
TopicPartition = tuple[str, int]


MAX_MESSAGE_BYTES = "max.message.bytes"
MAX_MESSAGE_BYTES_EFFECTIVE = "\0effective max.message.bytes"  # not a config name: never sent anywhere
DEFAULT_MAX_MESSAGE_BYTES = 1048588  # Kafka's message.max.bytes default, if a source does not say
REQUEST_OVERHEAD_BYTES = 16 << 10  # a produce request around its largest batch
LARGE_RECORD_CODEC = "zstd"  # a record that only fits compressed (it came compressed)


DEFAULT_SOCKET_REQUEST_MAX_BYTES = 104_857_600  # Kafka's default


def _value_bytes(r: Any) -> int:
    return (len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0)


def _compressed_bytes(r: Any) -> int:
    """What key and value take compressed with LARGE_RECORD_CODEC (for records too large
    otherwise: rare, and each compressed once more when sent)."""
    return sum(len(compress(CODEC_IDS[LARGE_RECORD_CODEC], part)) for part in (r.key, r.value) if part)


def _record_bytes(r: Any, headers: provenance.Headers) -> int:
    return ((len(r.key) if r.key is not None else 0) + (len(r.value) if r.value is not None else 0)
            + sum(len(k) + (len(v) if v is not None else 0) + 10 for k, v in headers))


def _topic_id(t: Any) -> uuid.UUID | None:
    """A Metadata answer's topic id (None from brokers that do not send them)."""
    topic_id = getattr(t, "topic_id", None)
    return topic_id if isinstance(topic_id, uuid.UUID) and topic_id.int else None


def group_id(flow: MirrorSpec) -> str:
    return f"dcmirror.{flow.source}.{flow.target}"


def _admin_part(client: dict[str, Any]) -> dict[str, Any]:
    """The security settings of a side's client config, for its admin client."""
    return {k: v for k, v in client.items() if k in CLIENT_SECURITY_KEYS}


@dataclass
class WorkerConfig:
    topic_refresh_s: float = 5.0
    commit_interval_s: float = 1.0
    heartbeat_interval_s: float = 1.0
    checkpoint_interval_s: float = 5.0
    flow_control_poll_s: float = flow_control.POLL_INTERVAL_MS / 1000  # re-reading dcmirror.flow-control
    http_port_base: int = 0  # worker N serves /metrics and /v1/status on base + N (0: off)
    http_host: str = "127.0.0.1"  # where the admin HTTP binds (loopback unless told otherwise)
    http_auth_token: str = ""  # a reference to the bearer token every page but /healthz needs
    http_keystore: str = ""  # PEM key + certificate: HTTPS only
    batch_records: int = 5000
    # As Kafka's num.replica.fetchers: fetch sessions (connections) per source broker, the
    # partitions spread over them, each with a Fetch in flight (more bytes on the way over a
    # long round trip than one answer carries). 0: the flow's default, 1 for record flows
    # (their rewriting, not the round trip, bounds them), mirror_topics.REPLICA_FETCHERS for
    # flows of mirror topics.
    replica_fetchers: int = 0
    on_topic_recreated: str = "mirror"  # or "stop": a re-created source topic stops its partitions
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
            elif key == "flow.control.poll.ms":
                c.flow_control_poll_s = max(FLOW_CONTROL_POLL_MIN_MS, int(value)) / 1000
            elif key == "http.port.base":
                c.http_port_base = int(value)
            elif key == "num.replica.fetchers":
                c.replica_fetchers = int(value)  # 1..FETCH_LANES_MAX, checked by topology/load.py
            elif key == "on.topic.recreated":
                if value not in MIRROR_CHOICE_KEYS[key]:
                    raise ValueError(f"mirror flow {flow.name!r}: {key} takes one of "
                                     + ", ".join(MIRROR_CHOICE_KEYS[key]) + f", not {value!r}")
                c.on_topic_recreated = value
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
            elif key in ("group.offset.sync.ms", "acl.sync.ms"):
                pass  # a flow of mirror topics: mirror/topic_sync.py reads them
            elif key in ("schema.sync.ms", "schema.subject.name.strategy", "schema.source.basic.auth.user.info",
                         "schema.target.basic.auth.user.info"):
                pass  # mirror/schema_sync.py reads them
            else:
                raise ValueError(f"mirror flow {flow.name!r}: unknown config {key!r} ("
                                 + ", ".join(MIRROR_CONFIG_KEYS) + ", producer.*, consumer.*)")
        return c


class ProblemRecorder(logging.Handler):
    """Keeps a worker's last warning or error (message and time) for its status: what an
    operator looking at `dcmirror mirror status` from another host wants before the logs."""

    def __init__(self, worker: Any) -> None:  # MirrorWorker or TopicMirrorWorker
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
FLOW_CONTROL_POLL_MIN_MS = 50  # flow.control.poll.ms below this is taken as this
FLOW_CONTROL_FIRST_READ_S = 30.0  # a worker waits this long for its flow's pause state before it joins
RATE_WINDOW_MS = 10_000  # records_per_s_recent: over about the last 10 s of status calls


def _utc(at_ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at_ms / 1000))


class FlowWorker:
    """What both kinds of flow worker (records with provenance: MirrorWorker; mirror topics:
    mirror/mirror_topics.py) do the same way: follow the flow's topics, follow the flow's
    pause state (mirror/flow_control.py), and stop by leaving the source group. Subclasses set
    config, flow, name, topics, _consumer, _stopping, _stopped and define _sync_topics (whether
    the mapping of source to target topics changed) and _claimed (the partitions the consumer
    fetches unless the flow is paused).

    Pausing: every assigned partition of the consumer is paused (its prefetched records are
    dropped; its position stays after the last record handed to the worker), records handed
    out already are written and acknowledged as usual, group membership and heartbeats go on.
    A claim made while paused leaves its partition paused. Resuming resumes the claimed
    partitions at their positions: nothing is skipped or read twice."""

    config: WorkerConfig
    flow: MirrorSpec
    name: str
    topics: dict[str, str]
    _consumer: Consumer | None
    _stopping: trio.Event
    _stopped: trio.Event
    flow_pause: flow_control.FlowPause
    flow_control_error: str | None = None  # why the pause state cannot be read now (status)

    async def _sync_topics(self) -> bool:
        raise NotImplementedError

    def _claimed(self) -> list[TopicPartition]:
        raise NotImplementedError

    def _resume_fetching(self, tp: TopicPartition) -> None:
        """A claim is done: fetch the partition, unless the flow is paused."""
        assert self._consumer is not None
        if not self.flow_pause.paused:
            self._consumer.resume(tp)

    async def _read_flow_control(self, cluster: Any, cluster_name: str) -> None:
        """The flow's pause state before the worker joins the source group, so that a restarted
        worker of a paused flow copies nothing. A state that cannot be read within
        FLOW_CONTROL_FIRST_READ_S (target unreachable) or may not be (no Read ACL) counts as
        running, said in a warning; the follower keeps reading it."""
        with trio.move_on_after(FLOW_CONTROL_FIRST_READ_S):
            while True:
                try:
                    await flow_control.poll(cluster, self.flow_pause, cluster_name=cluster_name)
                except flow_control.FlowControlDenied as exc:
                    self._flow_control_failed(str(exc), logging.WARNING)
                    return
                except RETRIABLE as exc:
                    self.flow_control_error = str(exc)
                    await trio.sleep(1)
                    continue
                self.flow_control_error = None
                if self.flow_pause.paused:
                    self._log_pause()
                return
        log.warning("%s: the pause state of flow %s (%s in %s) could not be read within %g s (%s): mirroring "
                    "until it can be", self.name, self.flow.name, flow_control.FLOW_CONTROL_TOPIC, cluster_name,
                    FLOW_CONTROL_FIRST_READ_S, self.flow_control_error)

    async def _follow_flow_control(self, cluster: Any, cluster_name: str) -> None:
        while True:
            await trio.sleep(self.config.flow_control_poll_s)
            try:
                changed = await flow_control.poll(cluster, self.flow_pause, cluster_name=cluster_name)
            except flow_control.FlowControlDenied as exc:
                self._flow_control_failed(str(exc), logging.WARNING)
                continue
            except RETRIABLE as exc:
                self._flow_control_failed(f"reading {flow_control.FLOW_CONTROL_TOPIC}: {exc}", logging.INFO)
                continue
            self.flow_control_error = None
            if changed:
                self._apply_pause()

    def _flow_control_failed(self, why: str, level: int) -> None:
        if why != self.flow_control_error:  # said once per distinct reason
            log.log(level, "%s: %s", self.name, why)
        self.flow_control_error = why

    def _log_pause(self) -> None:
        c = self.flow_pause.control
        if c.paused:
            log.info("flow %s PAUSED (at %s%s): %s fetches nothing more from %s and writes nothing more into %s",
                     self.flow.name, _utc(c.at_ms), f", reason: {c.reason}" if c.reason else "", self.name,
                     self.flow.source, self.flow.target)
        else:
            log.info("flow %s RESUMED (at %s): %s goes on where it stopped", self.flow.name, _utc(c.at_ms), self.name)

    def _apply_pause(self) -> None:
        self._log_pause()
        consumer = self._consumer
        if consumer is None:
            return
        if self.flow_pause.paused:
            consumer.pause(*consumer.assignment())
        else:
            assigned = consumer.assignment()
            consumer.resume(*[tp for tp in self._claimed() if tp in assigned])

    def pause_status(self) -> dict[str, Any]:
        """For /v1/status: paused, since when, why, and whether the state could be read."""
        fp = self.flow_pause.status()
        return {"paused": fp["paused"], "paused_since_ms": fp["since_ms"], "pause_reason": fp["reason"],
                "flow_control": {**fp, "error": self.flow_control_error}}

    async def stop(self) -> None:
        """Hand the partitions over cleanly: leave the group (flush, commit) while the
        clients still run, then stop."""
        self._stopping.set()
        await self._stopped.wait()

    def fenced(self) -> Exception | None:
        """Another worker joined the flow's group under this one's name (FencedInstanceId)."""
        consumer = self._consumer
        return consumer.group.fenced if consumer is not None and consumer.group is not None else None

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


class MirrorWorker(FlowWorker):
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
                                        "claims": 0, "fenced": 0, "source_recreations": 0, "divergences": 0,
                                        "diverged_records": 0, "target_refills": 0, "dead_letter_records": 0,
                                        "started_ms": clock.now_ms()}
        # What happened to the histories of the partitions (newest last), for status.
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=EVENTS_MAX)
        # Per source partition, the last position the target acknowledged to this process:
        # (topic id, leader epoch, next offset). A target found holding less has lost records.
        self._acknowledged: dict[TopicPartition, tuple[uuid.UUID | None, int, int]] = {}
        self._target_ids: dict[str, uuid.UUID] = {}  # target topic -> id, as last seen
        self._target_limits: dict[str, int] = {}  # target topic -> max.message.bytes this flow set or saw
        self._dead_lettered: set[tuple[TopicPartition, uuid.UUID | None, int]] = set()
        # The largest request the target's brokers read (socket.request.max.bytes): a record
        # that cannot fit one even compressed is dead-lettered rather than sent forever.
        self._target_request_max_bytes = DEFAULT_SOCKET_REQUEST_MAX_BYTES
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
        self.schema_sync: SchemaSync | None = None  # flows with `schemas` (mirror/schema_sync.py)
        self.flow_pause = flow_control.FlowPause(flow.name)

    # ---- setup ----------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        c = self.config
        source_client = self.source.client_config(c.source)
        target_client = self.target.client_config(c.target)
        producer_config = {**target_client, "client.id": self.name, "acks": "all",
                           "enable.idempotence": True, "linger.ms": 5, "max.block.ms": 30000, **c.producer}
        consumer_config = {**source_client, "client.id": self.name,
                           "group.id": group_id(self.flow), "enable.auto.commit": False,
                           # Static membership (KIP-345): a worker restarted under its name takes
                           # its partitions back at once, without waiting for its old session to
                           # expire and a rebalance of every worker.
                           "group.instance.id": self.name,
                           # Every position is set by a claim; one the source no longer has (a
                           # truncation, a re-created topic) is claimed again, never reset blindly.
                           "auto.offset.reset": "none", "isolation.level": "read_committed",
                           "session.timeout.ms": 10000,
                           "heartbeat.interval.ms": 1000, "metadata.max.age.ms": int(c.topic_refresh_s * 1000),
                           # Workers run beside their target (consume remote, produce local):
                           # a stretched source serves them from its replicas in the target's
                           # datacenter (KIP-392), if its brokers declare racks.
                           "client.rack": self.target.datacenter,
                           **c.consumer}
        async with Admin(self.source.bootstrap(), client_id=self.name, config=_admin_part(source_client)) as sadmin, \
                Admin(self.target.bootstrap(), client_id=self.name, config=_admin_part(target_client)) as tadmin, \
                Producer(producer_config) as producer, Consumer(consumer_config, fetch_lanes=c.replica_fetchers or 1) as consumer, \
                open_schema_sync(self.flow, self.source, self.target, clock=self.clock) as schema_sync:
            self._source_admin, self._target_admin = sadmin, tadmin
            self._producer, self._consumer = producer, consumer
            self.schema_sync = schema_sync
            await self._read_target_request_limit()
            await self._sync_topics()
            try:
                await flow_control.ensure_topic(tadmin, cluster_name=self.flow.target)
            except (*RETRIABLE, flow_control.FlowControlDenied) as exc:
                log.warning("creating %s: %s", flow_control.FLOW_CONTROL_TOPIC, exc)
            await self._read_flow_control(tadmin.cluster, self.flow.target)
            consumer.subscribe(sorted(self.topics), on_assign=self._on_assign, on_revoke=self._on_revoke)
            task_status.started()
            async with trio.open_nursery() as nursery:
                if schema_sync is not None:
                    schema_sync.topics = lambda: self.topics
                    schema_sync.leads = lambda: sync_owner(self.topics) in self.partitions
                    nursery.start_soon(schema_sync.run)
                nursery.start_soon(self._stop_when_asked, consumer, nursery)
                nursery.start_soon(self._watch_topics)
                nursery.start_soon(self._commit_loop)
                nursery.start_soon(self._heartbeat_loop)
                nursery.start_soon(self._checkpoint_loop)
                nursery.start_soon(self._follow_flow_control, tadmin.cluster, self.flow.target)
                await self._mirror_loop()

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
        target_ids = {t.name: _topic_id(t) for t in target_meta.topics if t.error_code == 0}
        target_epochs = {(t.name, p.partition_index): p.leader_epoch for t in target_meta.topics if t.error_code == 0
                         for p in t.partitions}
        rf = min(self.topology.defaults.replication_factor, len(self.target.brokers))
        mapping = {}
        for name, count in sorted(matching.items()):
            target_name = self.flow.target_topic(name, self.source.datacenter)
            mapping[name] = target_name
            have = target_counts.get(target_name)
            source_configs = await self._source_topic_configs(name)
            want_limit = self._target_limit_for(int(source_configs.pop(MAX_MESSAGE_BYTES_EFFECTIVE)))
            if have is None:
                for pm in self.partitions.values():
                    if pm.target[0] == target_name and not pm.broken:
                        # Nothing more goes there until the claim has looked at what it holds.
                        pm.broken = f"target topic {target_name} is gone from {self.flow.target}"
                configs = {**source_configs, MAX_MESSAGE_BYTES: str(want_limit)}
                try:
                    await self._target_admin.create_topic(target_name, count, rf, configs)
                    self._target_limits[target_name] = want_limit
                    if target_name in self._target_ids:
                        log.warning("target topic %s was gone from %s (deleted?): created it again with %d partitions; "
                                    "the partitions mirrored into it are refilled from what %s still holds",
                                    target_name, self.flow.target, count, self.flow.source)
                    else:
                        log.info("created %s in %s: %d partitions, RF %d, configs %s", target_name, self.flow.target,
                                 count, rf, configs)
                except AdminError as exc:
                    if exc.code != ErrorCode.topic_already_exists:
                        raise
                self._target_ids.pop(target_name, None)  # learnt again from the next metadata
                continue
            if have < count:
                await self._target_admin.create_partitions(target_name, count)
                log.info("added partitions to %s in %s: %d -> %d", target_name, self.flow.target, have, count)
            await self._size_target(target_name, want_limit)
            now_id = target_ids.get(target_name)
            if now_id is not None:
                self._target_ids[target_name] = now_id
                for pm in self.partitions.values():
                    if pm.target[0] == target_name and pm.target_topic_id not in (None, now_id) and not pm.broken:
                        pm.broken = (f"target topic {target_name} was deleted and created again (topic id "
                                     f"{pm.target_topic_id} -> {now_id})")
        self._size_producer()
        await self._check_target_tails(target_epochs)
        changed = mapping != self.topics
        self.topics = mapping
        return changed

    async def _check_target_tails(self, epochs: dict[TopicPartition, int]) -> None:
        """A target partition whose leader changed may have lost acknowledged records (an
        unclean election there, a restore): its tail against what it acknowledged to us."""
        assert self._target_admin is not None
        for pm in list(self.partitions.values()):
            epoch = epochs.get(pm.target, -1)
            if pm.broken or pm.stopped or epoch < 0 or epoch == pm.target_leader_epoch:
                continue
            if pm.target_leader_epoch < 0:
                pm.target_leader_epoch = epoch
                continue
            pm.target_leader_epoch = epoch
            self._settle()
            _, hw = await tail.offsets(self._target_admin.cluster, *pm.target)
            found, _ = await tail.last_mirrored(self._target_admin.cluster, *pm.target, hw, self.flow.source,
                                                pm.source[1])
            acknowledged = self._acknowledged.get(pm.source)
            if record_copy.target_lost_acknowledged(found, acknowledged):
                assert acknowledged is not None
                pm.broken = (f"the target's leader changed (epoch {epoch}) and it holds "
                             f"{'nothing' if found is None else f'source offsets up to {found.offset}'} of what it "
                             f"acknowledged (up to {acknowledged[2] - 1})")

    async def _read_target_request_limit(self) -> None:
        assert self._target_admin is not None
        try:
            meta = await self._target_admin.metadata([])
            node = min(b.node_id for b in meta.brokers)
            entries = {e.name: e.value for e in await self._target_admin.describe_configs(RESOURCE_BROKER, str(node))}
            self._target_request_max_bytes = int(entries.get("socket.request.max.bytes")
                                                 or DEFAULT_SOCKET_REQUEST_MAX_BYTES)
        except (*RETRIABLE, ValueError) as exc:
            log.info("reading the target's socket.request.max.bytes: %s; assuming %d", exc,
                     DEFAULT_SOCKET_REQUEST_MAX_BYTES)

    def _target_limit_for(self, source_limit: int) -> int:
        """Whatever the source accepts must fit in the target with the headers the flow adds."""
        return source_limit + provenance.overhead_bytes(
            self.flow.source, sum(len(c.encode()) + 1 for c in self.topology.clusters))

    async def _follow_source_limit(self, pm: PartitionMirror) -> bool:
        """Before a record is dead-lettered for its size: read the source topic's limit again
        (it may have grown since the last topic refresh, the record with it) and size the
        target and the producer from it. Returns whether the target now takes more."""
        assert self._target_admin is not None
        ttopic = pm.target[0]
        before = self._target_limits.get(ttopic) or 0
        try:
            configs = await self._source_topic_configs(pm.source[0])
            await self._size_target(ttopic, self._target_limit_for(int(configs[MAX_MESSAGE_BYTES_EFFECTIVE])))
        except (*RETRIABLE, AdminError, ValueError) as exc:
            log.warning("reading the limit of %s/%s before dead-lettering a record: %s", self.flow.source,
                        pm.source[0], exc)
            return False
        self._size_producer()
        return (self._target_limits.get(ttopic) or 0) > before

    async def _size_target(self, target_name: str, want_limit: int) -> None:
        """Raise the target topic's max.message.bytes to `want_limit` (the source's limit plus
        the headers the flow adds) if it is below: set on the topic by this flow, or found there."""
        assert self._target_admin is not None
        have = self._target_limits.get(target_name)
        if have is None:
            entries = {e.name: e.value for e in await self._target_admin.topic_configs(target_name)}
            have = int(entries.get(MAX_MESSAGE_BYTES) or 0)
            self._target_limits[target_name] = have
        if have < want_limit:
            await self._target_admin.alter_topic_configs(target_name, {MAX_MESSAGE_BYTES: str(want_limit)}, [])
            self._target_limits[target_name] = want_limit
            log.info("%s in %s: max.message.bytes %d -> %d (the source's limit plus the flow's headers)",
                     target_name, self.flow.target, have, want_limit)

    def _size_producer(self) -> None:
        """The flow's producer takes the largest record any target topic of the flow takes."""
        if self._producer is None or not self._target_limits:
            return
        need = max(self._target_limits.values()) + REQUEST_OVERHEAD_BYTES
        if self._producer.max_request_size < need:
            log.info("producer max.request.size %d -> %d (the largest target topic limit)",
                     self._producer.max_request_size, need)
            self._producer.max_request_size = need

    def _is_copy_from_target(self, topic: str) -> bool:
        return record_copy.is_copy_from_target(self.topology, self.flow, topic)

    async def _source_topic_configs(self, topic: str) -> dict[str, str]:
        """The configs set on the source topic itself, and under MAX_MESSAGE_BYTES_EFFECTIVE its
        max.message.bytes in force (set there or the broker's default)."""
        assert self._source_admin is not None
        out = {MAX_MESSAGE_BYTES_EFFECTIVE: str(DEFAULT_MAX_MESSAGE_BYTES)}
        for entry in await self._source_admin.topic_configs(topic):
            source = getattr(entry, "config_source", None)
            if entry.name == MAX_MESSAGE_BYTES and entry.value:
                out[MAX_MESSAGE_BYTES_EFFECTIVE] = entry.value
            if source == 1 and entry.value is not None:  # DYNAMIC_TOPIC_CONFIG: set on the topic itself
                out[entry.name] = entry.value
        return out

    # ---- taking and giving up partitions -------------------------------------------

    async def _on_assign(self, tps: list[TopicPartition]) -> None:
        assert self._consumer is not None
        # Nothing is fetched before a partition is claimed and sought: it would be read twice.
        self._consumer.pause(*tps)
        if any(topic not in self.topics for topic, _ in tps):
            await self._sync_topics()
        pms = []
        for tp in tps:
            topic, p = tp
            pm = self.partitions[tp] = PartitionMirror(tp, (self.topics[topic], p))
            previous = self._totals.get(tp)
            if previous is not None:
                pm.records, pm.bytes = previous
            pms.append(pm)
        await self._claim_all(pms)
        self._assigned.set()

    async def _claim_all(self, pms: list[PartitionMirror]) -> bool:
        """_claim_many; when a whole step fails (a dead connection) every partition is left
        broken with the reason, and the mirror loop claims them again, with backoff. False
        then."""
        try:
            await self._claim_many(pms)
        except RETRIABLE as exc:
            for pm in pms:
                pm.broken = f"claim failed: {exc}"
            return False
        return True

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

    async def _claim_many(self, pms: list[PartitionMirror]) -> None:
        """Fence the previous writer of each target partition, then resume after the last
        source record the target holds, once the source confirmed that record's history
        (mirror/history.py): a re-created source topic is mirrored from its start, records
        the source no longer holds as mirrored are reported and the source's records at
        those offsets mirrored, a target that lost records is refilled.

        Every step asks about all the partitions at once (mirror/tail.py's `_many`: one
        request per leader); a partition a step fails for is left broken with the reason and
        claimed again by the mirror loop. A dead connection fails them all."""
        assert self._producer is not None and self._consumer is not None and self._target_admin is not None
        producer = self._producer
        cluster = self._target_admin.cluster
        if any(pm.refused for pm in pms):
            # A record was refused for its size: the source's limit may have grown since the
            # last refresh; the target is sized again before it is sent once more.
            for pm in pms:
                if pm.refused:
                    self._target_limits.pop(pm.target[0], None)
            await self._sync_topics()
        await producer.flush(30)
        need: dict[str, int] = {}
        for pm in pms:
            need[pm.target[0]] = max(need.get(pm.target[0], 0), pm.target[1] + 1)
        for topic in need:
            await cluster.wait_for_topic(topic, 30)
        with trio.fail_after(30):
            while short := {t for t, n in need.items() if (producer.partitions_for(t) or 0) < n}:
                await producer.cluster.refresh(short)  # e.g. partitions just added
                if any((producer.partitions_for(t) or 0) < need[t] for t in short):
                    await trio.sleep(0.2)
        target_ids = {pm.target: producer.cluster.metadata.topic_id(pm.target[0]) for pm in pms}
        failed: tail.Failed = {}  # by target partition
        failed_source: tail.Failed = {}  # by source partition

        def live() -> list[PartitionMirror]:
            return [pm for pm in pms if pm.target not in failed and pm.source not in failed_source]

        offs = await tail.offsets_many(cluster, [pm.target for pm in pms], failed)
        writers = await tail.last_writers(cluster, {pm.target: offs[pm.target] for pm in live()}, failed)
        fencing: dict[TopicPartition, tuple[int, int]] = {}
        for pm in live():
            writer = writers[pm.target]
            if writer is not None:
                fencing[pm.target] = (writer[0], min(writer[1] + 1, 32767))
                producer.claim(*pm.target, *fencing[pm.target])
            else:
                producer.claim(*pm.target, -1, -1)  # nothing to fence; writes resume (an abandoned partition)
        marked = await tail.abort_markers(cluster, fencing, failed)
        fence_records: dict[TopicPartition, int] = {}
        for target, done in marked.items():
            if done:
                continue
            if not self._fence_records_warned:
                self._fence_records_warned = True
                log.warning("%s: the target refuses WriteTxnMarkers (not a dcmirror cluster, or no "
                            "ClusterAction for this principal): fencing with a record instead, which "
                            "consumers of the target will see", self.name)
            try:
                fence = await producer.send_and_wait(target[0], None, None, partition=target[1],
                                                     headers=[(provenance.FENCE, self.name.encode())])
            except RETRIABLE as exc:
                failed[target] = KafkaError(f"fencing {target[0]}-{target[1]} with a record: {exc}",
                                            getattr(exc, "code", ErrorCode.unknown_server_error))
                continue
            fence_records[target] = fence.offset
        # The markers are replicated: the high watermark is past them and past every batch the
        # fenced writers got into the log; nothing of theirs can land later.
        after = await tail.offsets_many(cluster, [pm.target for pm in live()], failed)
        below = {t: fence_records.get(t, hw) for t, (_, hw) in after.items()}
        mirrored = await tail.last_mirrored_many(
            cluster, {pm.target: (after[pm.target][0], below[pm.target], pm.source[1]) for pm in live()},
            self.flow.source, failed)
        source = self._source_cluster_client()
        source_ids = await self._source_topic_ids({pm.source[0] for pm in live()}, failed_source, live())
        source_offs = await tail.offsets_many(source, [pm.source for pm in live()], failed_source)
        asks = {}
        for pm in live():
            found, _ = mirrored[pm.target]
            source_id = source_ids.get(pm.source[0])
            if found is not None and found.leader_epoch >= 0 and (
                    found.topic_id is None or source_id is None or found.topic_id == source_id):
                asks[pm.source] = found.leader_epoch
        replies = await tail.end_offsets_for_epochs(source, asks, failed_source)
        answered = [pm for pm in live() if pm.source not in asks or pm.source in replies]
        decisions = {pm.source: history.resume_point(mirrored[pm.target][0], source_ids.get(pm.source[0]),
                                                     *source_offs[pm.source], replies.get(pm.source),
                                                     mirrored[pm.target][1]) for pm in answered}
        # Holes below the tail, for the partitions on the same history whose target starts at 0.
        fills = await self._holes_many(
            {pm.source: (pm, found, source_offs[pm.source][0]) for pm in answered
             if (found := mirrored[pm.target][0]) is not None and after[pm.target][0] == 0
             and record_copy.needs_hole_check(found, decisions[pm.source])}, failed, failed_source)
        for pm in live():
            if pm.source not in decisions:
                continue
            fence_at = fence_records.get(pm.target, below[pm.target] - 1)  # the marker: nothing else is written
            try:
                await self._resume_claimed(pm, target_ids[pm.target], writers[pm.target], fence_at,
                                           mirrored[pm.target], source_ids.get(pm.source[0]), source_offs[pm.source],
                                           decisions[pm.source], fills.get(pm.source))
            except RETRIABLE as exc:
                pm.broken = f"claim failed: {exc}"
        for pm in pms:
            why = failed.get(pm.target) or failed_source.get(pm.source)
            if why is not None:
                pm.broken = f"claim failed: {why}"

    async def _resume_claimed(self, pm: PartitionMirror, target_id: uuid.UUID | None,
                              writer: tuple[int, int] | None, fence_at: int,
                              mirrored: tuple[history.MirroredPosition | None, list[tuple[int, int]]],
                              source_id: uuid.UUID | None, source_offsets: tuple[int, int],
                              decision: history.Resume, fill: tuple[int, int] | None) -> None:
        """The end of a claim, once the target is fenced and both sides were asked: where the
        partition resumes (or why it stops), said in the log, metrics and events."""
        assert self._consumer is not None and self._producer is not None and self._target_admin is not None
        if (fenced := self.fenced()) is not None:
            raise fenced  # fenced while claiming: the partitions are the other copy's
        consumer = self._consumer
        topic, p = pm.target
        found, epoch_starts = mirrored
        start, _ = source_offsets
        plan = record_copy.ClaimPlan.of(found, decision, fill, start, pm.source[0], source_id,
                                        self.config.on_topic_recreated)
        resume = plan.resume
        self._report_history(pm, found, decision, source_id, resume, fill)
        if plan.stop is not None:
            pm.stopped, pm.broken = plan.stop, None
            consumer.pause(pm.source)
            return
        pm.stopped = None
        pm.fill_until = plan.fill_until
        pm.next_offset = resume
        pm.acked_offset = resume - 1
        pm.broken = None
        pm.target_topic_id = target_id
        pm.history.reset(source_id, plan.last_epoch, epoch_starts if plan.keep_epoch_starts else None)
        consumer.seek(pm.source, resume, topic_id=source_id)
        self._resume_fetching(pm.source)
        self.metrics["claims"] += 1
        log.info("%s took %s-%d -> %s-%d (fence at offset %d%s); resuming at source offset %d%s", self.name,
                 pm.source[0], pm.source[1], topic, p, fence_at,
                 f", previous writer {writer[0]} epoch {writer[1]} fenced" if writer else "", resume,
                 " once the flow is resumed (paused)" if self.flow_pause.paused else "")

    def _claimed(self) -> list[TopicPartition]:
        return [tp for tp, pm in self.partitions.items() if not pm.broken and not pm.stopped and pm.next_offset >= 0]

    async def _source_topic_ids(self, topics: set[str], failed: tail.Failed, pms: list[PartitionMirror]
                                ) -> dict[str, uuid.UUID | None]:
        """The source's topic ids of `topics` (one Metadata request); the partitions of `pms`
        whose topic the source answers with an error go into `failed`."""
        assert self._source_admin is not None
        if not topics:
            return {}
        meta = await self._source_admin.metadata(sorted(topics))
        out: dict[str, uuid.UUID | None] = {}
        for t in meta.topics:
            if t.name not in topics:
                continue
            if t.error_code:
                for pm in pms:
                    if pm.source[0] == t.name:
                        failed[pm.source] = KafkaError(f"looking up source topic {t.name}", t.error_code)
                continue
            out[t.name] = _topic_id(t)
        return out

    async def _holes_many(self, asks: dict[TopicPartition, tuple[PartitionMirror, history.MirroredPosition, int]],
                          failed: tail.Failed, failed_source: tail.Failed) -> dict[TopicPartition, tuple[int, int]]:
        """Per source partition, source offsets [source_start, F) missing below the first record
        F of the source partition's current incarnation in a target partition that never lost
        a record at its start (log start 0; `asks`: source partition -> (its mirror, its tail,
        the source's log start)): what a re-created target got from retried writes of the old
        one before it was refilled. (F, where to go on once the hole is filled) for those that
        have one. Both sides are asked once for all the partitions (a claim of thousands asked
        twice per partition, one after another: 20 s of a restart at 5,000)."""
        assert self._target_admin is not None
        heads = await tail.fetch_many(self._target_admin.cluster, {pm.target: 0 for pm, _, _ in asks.values()},
                                      failed, partition_max_bytes=HOLE_PROBE_BYTES)
        firsts: dict[TopicPartition, int] = {}
        for source_tp, (pm, found, source_start) in asks.items():
            head = heads.get(pm.target)
            first = None if head is None else self._first_mirrored(pm, head.batches, found)
            if first is not None and first > source_start:
                firsts[source_tp] = first
        if not firsts:
            return {}
        held = await tail.fetch_many(self._source_cluster_client(), {tp: asks[tp][2] for tp in firsts},
                                     failed_source, partition_max_bytes=HOLE_PROBE_BYTES)
        out = {}
        for tp, first in firsts.items():
            if tp not in held:
                continue
            # Compaction or aborted transactions may have left the source nothing there.
            starts = [r.offset for sb in held[tp].batches for r in sb.records[:1]]
            fill = record_copy.hole(first, asks[tp][2], starts[0] if starts else None, asks[tp][1])
            if fill is not None:
                out[tp] = fill
        return out

    def _first_mirrored(self, pm: PartitionMirror, batches: list[tail.Batch],
                        found: history.MirroredPosition) -> int | None:
        """The source offset of the first record of the source partition's current incarnation
        in the target's first batches; None if an older incarnation comes first or none is there."""
        for b in batches:
            for r in b.records:
                pos = provenance.source_position(r, self.flow.source)
                if pos is None or pos[0] != pm.source[1]:
                    continue
                topic_id, _ = provenance.incarnation_of(r)
                if found.topic_id is not None and topic_id != found.topic_id:
                    return None  # an older incarnation first: no hole of this one can be told
                return pos[1]
        return None

    def _report_history(self, pm: PartitionMirror, found: history.MirroredPosition | None,
                        decision: history.Resume, source_id: uuid.UUID | None, resume: int,
                        fill: tuple[int, int] | None) -> None:
        """Say what the claim found of the partition's history: log, metrics, status events."""
        topic, p = pm.source
        where = f"{self.flow.source}/{topic}-{p}"
        target = f"{self.flow.target}/{pm.target[0]}-{pm.target[1]}"
        if decision.new_incarnation:
            self.metrics["source_recreations"] += 1
            action = ("stopped (on.topic.recreated = stop)" if self.config.on_topic_recreated == "stop"
                      else f"mirroring the new one from offset {decision.offset} after the old one's records")
            log.warning("source topic %s was deleted and created again (topic id %s -> %s): %s; %s",
                        where, found.topic_id if found else None, source_id, action, target)
            self._event("source_recreated", pm, old_topic_id=str(found.topic_id if found else None),
                        new_topic_id=str(source_id), resume_offset=decision.offset)
        if decision.divergence is not None:
            d = decision.divergence
            self._diverged(pm, d)
        # This process saw the target acknowledge more of the same history than it holds now:
        # the target lost records (deleted and created again, truncated, restored).
        acknowledged = self._acknowledged.get(pm.source)
        if record_copy.claim_findings(found, decision, acknowledged, fill).refill:
            self.metrics["target_refills"] += 1
            held = "nothing of it" if found is None else f"source offsets up to {found.offset}"
            if fill is not None:
                held = f"source offsets {fill[0]}..{fill[1] - 1} but not {resume}..{fill[0] - 1}"
            gone = decision.lost_before_start
            log.warning("target %s lost records mirrored from %s: it holds %s%s; refilling from source offset %d%s",
                        target, where, held,
                        f" (acknowledged before: up to {acknowledged[2] - 1})" if acknowledged else "", resume,
                        f"; the source no longer has {gone} of them" if gone else "; the source still has them all")
            self._event("target_refilled", pm, held_up_to=None if found is None else found.offset,
                        resume_offset=resume, hole=list(fill) if fill else None, source_gone=gone)
        if decision.lost_before_start:
            lost = decision.lost_before_start
            self.metrics["data_loss_records"] += lost
            log.error("DATA LOSS: %s offsets %d..%d were deleted by retention at the source before they were "
                      "mirrored (%d records); resuming at %d", where, decision.offset - lost, decision.offset - 1,
                      lost, decision.offset)

    def _diverged(self, pm: PartitionMirror, d: history.Divergence) -> None:
        topic, p = pm.source
        self.metrics["divergences"] += 1
        self.metrics["diverged_records"] += d.offsets
        log.error("DIVERGED: %s/%s-%d no longer holds source offsets %d..%d as they were mirrored into %s (%d "
                  "offsets, mirrored in leader epoch %d; the source's epoch %s ends at %d): they stay in the "
                  "target; mirroring the source's records from offset %d", self.flow.source, topic, p,
                  d.start_offset, d.end_offset, pm.target[0], d.offsets, d.mirrored_epoch,
                  d.source_epoch if d.source_epoch >= 0 else "?", d.start_offset, d.start_offset)
        self._event("diverged", pm, start_offset=d.start_offset, end_offset=d.end_offset, offsets=d.offsets,
                    mirrored_epoch=d.mirrored_epoch, source_epoch=d.source_epoch)

    def _event(self, kind: str, pm: PartitionMirror, **details: Any) -> None:
        self.events.append({"kind": kind, "topic": pm.source[0], "partition": pm.source[1],
                            "target_topic": pm.target[0], "at_ms": self.clock.now_ms(), **details})

    def _source_cluster_client(self) -> Any:
        # The admin's connections: the consumer's carry long-polling Fetches, which a request
        # would queue behind (a broker answers one connection's requests in order).
        assert self._source_admin is not None
        return self._source_admin.cluster

    # ---- mirroring ------------------------------------------------------------------

    async def _mirror_loop(self) -> None:
        assert self._consumer is not None and self._producer is not None
        consumer = self._consumer
        next_walk_s = 0.0
        while True:
            if (fenced := self.fenced()) is not None:
                raise fenced  # another copy of this worker took its partitions: stop, claim nothing
            # Every partition is looked at (broken ones, positions past markers) at most every
            # LOOP_WALK_INTERVAL_S: at thousands of partitions a walk after every poll was a
            # quarter of the worker's time. The partitions of each poll's chunks are looked at always.
            now_s = trio.current_time()
            walk = now_s >= next_walk_s
            if walk:
                next_walk_s = now_s + LOOP_WALK_INTERVAL_S
            broken = [pm for pm in self.partitions.values() if pm.broken and not pm.stopped] if walk else []
            if broken:
                for b in broken:
                    log.warning("re-claiming %s-%d: %s", b.source[0], b.source[1], b.broken)
                await self._claim_all(broken)
                still = [b for b in broken if b.broken]
                for b in still:
                    log.warning("claiming %s-%d failed: %s", b.source[0], b.source[1], b.broken)
                if still:
                    await trio.sleep(1)
            try:
                chunks = await consumer.getmany_chunks(timeout_s=0.5, max_records=self.config.batch_records)
            except PartitionError as exc:
                # A position the source no longer has, or a topic created again: the claim
                # looks at both sides' history again. Partitions not claimed yet wait for it.
                pm = self.partitions.get(exc.tp) if exc.tp is not None else None
                if pm is not None and pm.next_offset >= 0 and not pm.broken:
                    pm.broken = f"source: {exc}"
                    if isinstance(exc, TopicIdChanged):
                        log.warning("%s", exc)
                continue
            for chunk in chunks:
                pm = self.partitions.get(chunk.tp)
                if pm is None or not pm.copying:
                    continue  # not (yet) ours: claimed first, then sought
                try:
                    await self._mirror_chunk(pm, chunk)
                except KafkaError as exc:  # e.g. the target lost the partition's metadata
                    pm.broken = f"producing: {exc}"
            walked = (self.partitions.items() if walk else
                      [(c.tp, pm) for c in chunks if (pm := self.partitions.get(c.tp)) is not None])
            for tp, pm in walked:
                try:
                    position = consumer.position(tp)
                except KeyError:
                    continue  # being revoked
                if position is not None:
                    pm.passed_to(position)  # past transaction markers or aborted data of the source
            self._settle()
            # getmany() returns at once while records are buffered: without this the loop would
            # run until buffer.memory filled before the sender and the fetcher got a turn.
            await trio.lowlevel.checkpoint()

    async def _mirror_chunk(self, pm: PartitionMirror, chunk: FetchedChunk) -> None:
        """Hand one chunk of source records to the producer, run by leader-epoch run: a run of
        another epoch than the last mirrored one is copied only once the source confirmed that
        epoch still ends at or after the position (as a follower truncates, KIP-279)."""
        assert self._consumer is not None
        records = chunk.records
        tp = chunk.tp
        refusal = pm.refusal(records[0].offset, chunk.topic_id)
        if refusal is not None:
            pm.broken = refusal
            return
        step = pm.fill_step([r.offset for r in records])
        if step is not None and step.filled:
            # The hole is filled: the rest is in the target already.
            pm.fill_until = None
            if step.keep:
                await self._mirror_runs(pm, chunk._replace(records=records[:step.keep]))
            pm.next_offset = step.go_on
            pm.done_up_to(step.go_on - 1)
            self._consumer.seek(tp, step.go_on, topic_id=pm.history.topic_id)
            log.info("%s-%d: the hole is filled; going on at source offset %d", tp[0], tp[1], step.go_on)
            return
        if records[0].offset > pm.next_offset:
            try:
                await self._check_gap(pm, records[0].offset)
            except RETRIABLE as exc:
                log.warning("checking a gap in %s-%d: %s", tp[0], tp[1], exc)
        await self._mirror_runs(pm, chunk)

    async def _mirror_runs(self, pm: PartitionMirror, chunk: FetchedChunk) -> None:
        assert self._consumer is not None and self._producer is not None
        records, tp = chunk.records, chunk.tp
        if self.schema_sync is not None:
            # No record reaches the target before its schema id is in the target's context.
            await self.schema_sync.admit(records)
        epochs = chunk.leader_epochs or [(records[0].offset, history.NO_EPOCH)]
        bounds = [i for i, r in enumerate(records) if any(r.offset == first for first, _ in epochs[1:])]
        starts = [0, *bounds]
        topic_id_text = history.topic_id_text(pm.history.topic_id) if pm.history.topic_id else None
        for n, i in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(records)
            epoch = chunk.epoch_of(i)
            if pm.history.needs_check(epoch) and epoch >= 0:
                reply = await tail.end_offset_for_epoch(self._source_cluster_client(), tp[0], tp[1],
                                                        pm.history.last_epoch)
                divergence = pm.history.divergence(pm.next_offset, *reply)
                if divergence is not None:
                    await self._rewind(pm, divergence)
                    return
            run = records if (i == 0 and end == len(records)) else records[i:end]
            await self._produce_run(pm, run, topic_id_text, epoch)
            pm.history.mirrored(run[0].offset, epoch)

    async def _rewind(self, pm: PartitionMirror, d: history.Divergence) -> None:
        """The source rewrote its history below the position: what was mirrored stays (reported),
        the source's records from the divergence point on are mirrored next."""
        assert self._consumer is not None and self._producer is not None
        await self._producer.flush(30)
        self._settle()
        self._diverged(pm, d)
        pm.rewound(d)
        self._consumer.seek(pm.source, d.start_offset, topic_id=pm.history.topic_id)

    async def _produce_run(self, pm: PartitionMirror, records: list[Any], topic_id_text: str | None,
                           epoch: int) -> None:
        """Queue records of one leader epoch with their provenance; records the target cannot
        take for their size go to the dead-letter topic instead."""
        assert self._producer is not None
        producer = self._producer
        source_cluster = self.flow.source
        source_bytes = source_cluster.encode()
        target_cluster = self.flow.target
        ttopic, tpart = pm.target
        sp = pm.source[1]
        future: DeliveryFuture | None = None  # of the last records queued together
        # Provenance of records without headers of their own (nearly all): only the offset
        # varies, so the producer adds it in C (produce_tagged).
        prefix = ((provenance.SOURCE_CLUSTER, source_bytes), (provenance.SOURCE_PARTITION, b"%d" % sp))
        suffix = provenance.incarnation_headers(topic_id_text, epoch) + ((provenance.PATH, source_bytes),)

        def limits() -> tuple[int, int]:
            # Records larger than the second (key and value) go one at a time, compressed if need be.
            return record_copy.record_limits(self._target_limits.get(ttopic), producer.max_request_size,
                                             self._target_request_max_bytes,
                                             provenance.overhead_bytes(source_cluster, len(source_bytes)))

        record_max, tagged_max = limits()
        followed: set[int] = set()  # offsets for which the source's limit was read again

        async def grew(offset: int) -> bool:
            """Whether the target takes more after reading the source's limit again (once per record)."""
            nonlocal record_max, tagged_max
            if offset in followed:
                return False
            followed.add(offset)
            if not await self._follow_source_limit(pm):
                return False
            record_max, tagged_max = limits()
            return True

        i, n = 0, len(records)
        count = nbytes = 0
        while i < n:
            r = records[i]
            refused = pm.refused.get(r.offset)
            if not r.headers and refused is None:
                f = DeliveryFuture()
                end, vbytes = producer.produce_tagged(ttopic, tpart, records, i, prefix, provenance.SOURCE_OFFSET,
                                                      suffix, on_delivery=f, max_record_bytes=tagged_max)
                if end > i:
                    future = f
                    nbytes += vbytes
                    count += end - i
                    i = end
                    continue
            if future is not None:  # what came before goes first (pending is in offset order)
                pm.pending.append((records[i - 1].offset, future, False))
                future = None
            if record_copy.dead_letter_refused(refused) and not await grew(r.offset):
                assert refused is not None
                del pm.refused[r.offset]
                self._dead_letter(pm, r, topic_id_text, epoch, refused[0])
                pm.done_up_to(r.offset)
                i += 1
                continue
            if not r.headers:
                headers: provenance.Headers = prefix + ((provenance.SOURCE_OFFSET, b"%d" % r.offset),) + suffix
            elif provenance.passed_through(r.headers, target_cluster) or provenance.is_fence(r):
                # Back where it came from, or another flow's fence: not data to copy.
                self.metrics["skipped_cycle"] += 1
                i += 1
                continue
            else:
                headers = provenance.mirrored_headers(r.headers, source_cluster, sp, r.offset, topic_id_text, epoch)
            # A record with headers of its own, one larger than a batch, or buffer.memory is
            # full (send waits for room). One too large for a request even so is compressed
            # on its own: the source took it compressed.
            size = _record_bytes(r, headers)
            alone = size > producer.accumulator.batch_size or refused is not None
            compressed = size > record_max
            if compressed and _compressed_bytes(r) + size - _value_bytes(r) > record_max:
                if await grew(r.offset):
                    continue  # the source's limit grew (the record with it): weigh it again
                self._dead_letter(pm, r, topic_id_text, epoch, f"{size} bytes, {_compressed_bytes(r)} compressed with "
                                  f"{LARGE_RECORD_CODEC}: more than the target takes (max.message.bytes "
                                  f"{self._target_limits.get(ttopic)}, socket.request.max.bytes "
                                  f"{self._target_request_max_bytes})")
                pm.done_up_to(r.offset)
                i += 1
                continue
            one: Delivery
            try:
                one = await producer.send(ttopic, r.value, r.key, partition=tpart, timestamp_ms=r.timestamp,
                                          headers=headers, compression=LARGE_RECORD_CODEC if compressed else None)
            except KafkaError as exc:
                if exc.code not in SIZE_ERRORS:
                    raise
                if await grew(r.offset):
                    continue
                self._dead_letter(pm, r, topic_id_text, epoch, str(exc))
                one = DONE
            pm.pending.append((r.offset, one, alone))
            nbytes += len(r.value) if r.value is not None else 0
            count += 1
            i += 1
        if i > 0:
            pm.next_offset = records[i - 1].offset + 1
            pm.last_timestamp_ms = records[i - 1].timestamp
        pm.records += count
        pm.bytes += nbytes
        if future is not None:
            pm.pending.append((pm.next_offset - 1, future, False))
        elif i > 0 and (not pm.pending or pm.pending[-1][0] < pm.next_offset - 1):
            # Skipped records at the end: they count as done once everything before them is.
            pm.done_up_to(pm.next_offset - 1)
        self.metrics["records"] = sum(x.records for x in self.partitions.values()) + sum(
            m for tp, (m, _) in self._totals.items() if tp not in self.partitions)

    def _dead_letter(self, pm: PartitionMirror, r: Any, topic_id_text: str | None, epoch: int, reason: str) -> None:
        """A record the target cannot take: said once (log, metric, status) and written as a
        dead-letter entry (its coordinates, never its data) into the target's dead-letter topic;
        the partition moves on behind it."""
        assert self._producer is not None
        key = (pm.source, pm.history.topic_id, r.offset)
        if key in self._dead_lettered:
            return
        self._dead_lettered.add(key)
        entry = deadletter.DeadLetter(
            flow=self.flow.name, source_cluster=self.flow.source, topic=pm.source[0], partition=pm.source[1],
            offset=r.offset, topic_id=topic_id_text, leader_epoch=epoch, timestamp_ms=r.timestamp,
            size_bytes=(len(r.key) if r.key else 0) + (len(r.value) if r.value else 0), reason=reason[:300],
            target_topic=pm.target[0], worker=self.name, at_ms=self.clock.now_ms())
        self.metrics["dead_letter_records"] += 1
        log.error("DEAD LETTER: %s/%s-%d offset %d (%d bytes) cannot be written into %s/%s: %s; its coordinates "
                  "are in %s, the partition goes on behind it", self.flow.source, pm.source[0], pm.source[1], r.offset,
                  entry.size_bytes, self.flow.target, pm.target[0], reason, deadletter.DEAD_LETTER_TOPIC)
        self._event("dead_letter", pm, offset=r.offset, size_bytes=entry.size_bytes, reason=reason[:300])
        try:
            self._producer.produce(deadletter.DEAD_LETTER_TOPIC, entry.value(), entry.key, headers=[
                (provenance.HEARTBEAT, b"0")])
        except (BufferFull, KafkaError) as exc:
            log.warning("writing the dead-letter entry of %s-%d offset %d: %s", pm.source[0], pm.source[1], r.offset,
                        exc)

    def _settle(self) -> None:
        """Acknowledged positions forward, failed deliveries break their partition
        (PartitionMirror.settle)."""
        for pm in self.partitions.values():
            settled = pm.settle()
            if settled.fenced:
                self.metrics["fenced"] += 1
            if settled.advanced:
                self._acknowledged[pm.source] = pm.acknowledged()

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
        offsets = {tp: offset for tp, pm in self.partitions.items() if (offset := pm.commit_offset()) is not None}
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
        for topic, configs in ((HEARTBEATS_TOPIC, {"cleanup.policy": "compact,delete", "retention.ms": "86400000"}),
                               (deadletter.DEAD_LETTER_TOPIC, deadletter.DEAD_LETTER_CONFIGS)):
            try:
                await self._target_admin.create_topic(topic, 1, min(3, len(self.target.brokers)), configs)
            except AdminError as exc:
                if exc.code != ErrorCode.topic_already_exists:
                    log.warning("creating %s: %s", topic, exc)
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
                                                                    self.flow.source, tp[1], offset, pm.history.topic_id)
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
        # Once, not per partition: a copy of the assignment per partition made this O(n^2),
        # and a worker of 5,000 partitions spent its whole event loop in it.
        assigned = consumer.assignment() if consumer else set()
        for tp, pm in sorted(self.partitions.items()):
            hw = consumer.highwater(tp) if consumer and tp in assigned else -1
            lag = pm.lag_records(hw)
            lag_s = 0.0 if lag == 0 else (None if pm.last_timestamp_ms < 0 else (now_ms - pm.last_timestamp_ms) / 1000)
            # The high watermark is only as fresh as the leader's last answer: a source that
            # stopped answering (cut off, down) may hold anything since, so the lag is at least
            # that long, and keeps growing, rather than the 0 of the last answer.
            # Paused, nothing asks the source's leader: its silence says nothing about the source.
            silent_s = (consumer.since_last_answer_s(tp) if consumer and tp in assigned
                        and not self.flow_pause.paused else None)
            if silent_s is not None and silent_s > SOURCE_SILENT_S:
                lag_s = max(lag_s or 0.0, silent_s)
            state = pm.state(self.flow_pause.paused)
            parts.append({"topic": tp[0], "partition": tp[1], "target_topic": pm.target[0], "state": state,
                          "reason": pm.stopped or pm.broken,
                          "source_topic_id": str(pm.history.topic_id) if pm.history.topic_id else None,
                          "leader_epoch": pm.history.last_epoch,
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
                "last_problem": self.last_problem, "events": list(self.events), "partitions": parts,
                **self.pause_status(),
                "schema_sync": self.schema_sync.status() if self.schema_sync is not None else None}


    def prometheus(self) -> bytes:
        """Prometheus text: throughput, lag, record age, claims, data loss, per flow and partition."""
        st = self.status()
        base = {"flow": self.flow.name, "worker": self.name}
        parts = st["partitions"]

        def per_partition(key: str) -> list[tuple[dict[str, str], float]]:
            return [(base | {"topic": p["topic"], "partition": str(p["partition"])}, float(p[key]))
                    for p in parts if p[key] is not None]

        schemas = self.schema_sync.prometheus(base) if self.schema_sync is not None else {}
        return prometheus_text({
            **schemas,
            "dcmirror_mirror_records_total": ("counter", "Records mirrored", [(base, st["records"])]),
            "dcmirror_mirror_flow_paused": ("gauge", "1 while the flow is paused (dcmirror mirror pause)",
                                            [(base, 1.0 if st["paused"] else 0.0)]),
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
            "dcmirror_mirror_source_recreations_total": ("counter", "Source topics found deleted and created again "
                                                         "(a new incarnation, mirrored after the old one)",
                                                         [(base, st["source_recreations"])]),
            "dcmirror_mirror_divergences_total": ("counter", "Times a source no longer held what was mirrored "
                                                  "(unclean election, truncation, restore)",
                                                  [(base, st["divergences"])]),
            "dcmirror_mirror_diverged_records_total": ("counter", "Mirrored source offsets the source no longer holds "
                                                       "as mirrored (they stay in the target)",
                                                       [(base, st["diverged_records"])]),
            "dcmirror_mirror_target_refills_total": ("counter", "Target partitions found missing mirrored records and "
                                                     "refilled from the source", [(base, st["target_refills"])]),
            "dcmirror_mirror_dead_letter_records_total": ("counter", "Source records the target cannot take, written "
                                                          "to dcmirror.deadletter", [(base, st["dead_letter_records"])]),
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
