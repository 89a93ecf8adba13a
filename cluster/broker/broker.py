"""The broker's state and request handlers (one per API, version-agnostic).

Handlers take decoded kio requests and answer with dicts (see protocol/messages.build).
Network I/O lives in server.py. Cluster metadata comes from the metadata quorum
(cluster/controller): the broker registers, heartbeats, and reconciles its partition
replicas with every metadata change it applies; admin requests go to the active controller.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from cluster.broker.clock import now_ms
from cluster.broker.config import BrokerConfig, render_config_value
from cluster.broker.group_service import GroupService
from cluster.broker.metrics import BrokerMetrics, batch_record_count
from cluster.broker.producer_ids import ProducerIdAllocator
from cluster.broker.topics import (
    InvalidTopic,
    read_partition_topic_id,
    validate_topic_name,
    write_meta_properties,
    write_partition_topic_id,
)
from cluster.controller.image import NO_LEADER, MetadataImage, PartitionState, TopicImage
from cluster.controller.service import ControllerUnavailable, build_metadata_service
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import InvalidRecordBatch, UnsupportedMagic
from cluster.replication.fetch_sessions import FetchSessionCache
from cluster.replication.fetcher import FollowerState, ReplicaFetcherManager
from cluster.storage.config import TOPIC_CONFIG_DEFS
from cluster.storage.log import (
    Log,
    NotEnoughReplicas,
    OffsetOutOfRange,
    OutOfOrderSequence,
    ProducerFenced,
    RecordTooLarge,
    StorageError,
)
from cluster.storage.log_manager import (
    METADATA_LOG_DIR,
    REPLICATION_OFFSET_FILE,
    LogManager,
    read_offset_checkpoint,
    write_offset_checkpoint,
)

log = logging.getLogger(__name__)

# API key → (min, max) advertised; see shared/PROTOCOL.md. Only what is implemented.
# Fetch's replica_id of kafka-replica-verification (Kafka's DebuggingConsumerId): may read any
# replica, leader or follower, up to its log end, without counting as a follower.
DEBUGGING_REPLICA_ID = -2
# A leader whose ISR change was refused (say, the follower is still fenced) asks again no
# sooner than this; every follower fetch would otherwise repeat the request.
ISR_CHANGE_RETRY_BACKOFF_MS = 500

SUPPORTED_APIS: dict[int, tuple[int, int]] = {
    0: (0, 8),  # Produce (0-2 answered UNSUPPORTED_VERSION: magic v0/v1 is not stored)
    1: (4, 12),  # Fetch
    2: (1, 5),  # ListOffsets
    3: (0, 8),  # Metadata
    8: (2, 7),  # OffsetCommit
    9: (1, 5),  # OffsetFetch
    10: (0, 2),  # FindCoordinator
    11: (0, 5),  # JoinGroup
    12: (0, 3),  # Heartbeat
    13: (0, 3),  # LeaveGroup
    14: (0, 3),  # SyncGroup
    15: (0, 4),  # DescribeGroups
    16: (0, 2),  # ListGroups
    18: (0, 3),  # ApiVersions
    19: (2, 4),  # CreateTopics
    20: (1, 3),  # DeleteTopics
    22: (0, 1),  # InitProducerId
    23: (2, 3),  # OffsetForLeaderEpoch
    32: (1, 2),  # DescribeConfigs
    33: (0, 1),  # AlterConfigs
    37: (0, 1),  # CreatePartitions
    42: (0, 1),  # DeleteGroups
    43: (0, 1),  # ElectLeaders
    44: (0, 0),  # IncrementalAlterConfigs
    45: (0, 0),  # AlterPartitionReassignments (flexible only)
    46: (0, 0),  # ListPartitionReassignments (flexible only)
    60: (0, 0),  # DescribeCluster (flexible only)
}

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
AUTHORIZED_OPERATIONS_OMITTED = -2147483648
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who sent a request: what JoinGroup/DescribeGroups report as client id and host."""

    client_id: str
    client_host: str


@dataclass
class Partition:
    """A replica of a partition on this broker: its log and its role from the metadata."""

    topic: str
    index: int
    log: Log
    topic_id: str = ""
    is_leader: bool = False
    leader_id: int = NO_LEADER
    leader_epoch: int = -1
    partition_epoch: int = -1
    replicas: list[int] = field(default_factory=list)
    isr: list[int] = field(default_factory=list)
    follower: FollowerState | None = None  # set while this replica follows
    isr_change_pending: bool = False  # leader: an AlterPartition is in flight
    isr_retry_at_ms: int = 0  # leader: after a refused or failed ISR change, not before this
    # Leader: each follower's log end offset (its last fetch offset) and when it last was
    # caught up with the leader's log end.
    replica_leo: dict[int, int] = field(default_factory=dict)
    replica_caught_up_ms: dict[int, int] = field(default_factory=dict)
    # Leader: committed offset (every ISR member has it); follower: learned from fetches. Starts
    # from the replication-offset-checkpoint; never above the log end (truncation cuts it).
    hw: int = 0

    @property
    def high_watermark(self) -> int:
        return min(self.hw, self.log.log_end_offset)

    def advance_high_watermark(self, node_id: int) -> bool:
        """Leader: HW = smallest log end offset in the ISR (never moves back); True if it moved."""
        ends = [self.log.log_end_offset if r == node_id else self.replica_leo.get(r, 0) for r in self.isr]
        new = min(ends) if ends else self.log.log_end_offset
        if new > self.hw:
            self.hw = new
            return True
        return False


@dataclass(frozen=True)
class ClusterMembership:
    """Who this node is and who votes in the metadata quorum."""

    node_id: int
    voters: dict[int, tuple[str, int]]
    cluster_id: str
    brokers: dict[int, tuple[str, int]] = field(default_factory=dict)  # every broker (observers of dedicated controllers)


class AppendWaiters:
    """Wakes long-polling fetches when a partition they watch gets data."""

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[trio.Event]] = {}

    def register(self, keys: list[tuple[str, int]], event: trio.Event) -> None:
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)

    def unregister(self, keys: list[tuple[str, int]], event: trio.Event) -> None:
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def notify(self, key: tuple[str, int]) -> None:
        waiters = self._waiters.pop(key, None)
        if waiters:
            for event in waiters:
                event.set()


class Broker:
    def __init__(self, data_dir: Path, config: BrokerConfig, advertised_host: str, advertised_port: int,
                 membership: ClusterMembership | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        if membership is None:
            # A standalone broker: node 1 (or node.id), its own single-voter quorum.
            node_id = int(config["node.id"])
            membership = ClusterMembership(node_id, {node_id: (advertised_host, advertised_port)}, "")
        self.membership = membership
        self.node_id = membership.node_id
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.logs = LogManager(data_dir)
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.waiters = AppendWaiters()
        self.metrics = BrokerMetrics(list(SUPPORTED_APIS))
        self.metadata = build_metadata_service(
            self.node_id, membership.voters, data_dir / METADATA_LOG_DIR, config,
            observers={b: a for b, a in membership.brokers.items() if b not in membership.voters})
        self.metadata.on_applied = self._on_metadata_applied
        self.broker_epoch = -1
        self.incarnation_id = str(uuid.uuid4())
        self.ready = trio.Event()
        self._logs_loaded = False
        self.fetch_sessions = FetchSessionCache(int(config["max.incremental.fetch.session.cache.slots"]))
        self._hw_checkpoint: dict[str, int] = {}  # read at startup, consumed as replicas open
        self._known_topics: dict[str, str] = {}
        self._reconciled_once = False
        self._shutting_down = False
        self._shutdown_done = trio.Event()
        self._shutdown_wanted = trio.Event()
        self.producer_ids = ProducerIdAllocator(self)
        self.fetchers = ReplicaFetcherManager(self)
        self.groups = GroupService(self)
        from cluster.broker.admin_handlers import AdminHandlers

        admin = AdminHandlers(self)
        g = self.groups
        self.handlers: dict[int, Callable[[int, Any, RequestContext], Awaitable[dict[str, Any] | None]]] = {
            0: self.handle_produce,
            1: self.handle_fetch,
            2: self.handle_list_offsets,
            3: self.handle_metadata,
            19: admin.handle_create_topics,
            20: admin.handle_delete_topics,
            22: self.handle_init_producer_id,
            23: self.handle_offset_for_leader_epoch,
            32: self.handle_describe_configs,
            33: admin.handle_alter_configs,
            37: admin.handle_create_partitions,
            43: admin.handle_elect_leaders,
            44: admin.handle_incremental_alter_configs,
            45: admin.handle_alter_partition_reassignments,
            46: admin.handle_list_partition_reassignments,
            60: admin.handle_describe_cluster,
            8: g.handle_offset_commit,
            9: g.handle_offset_fetch,
            10: g.handle_find_coordinator,
            11: g.handle_join_group,
            12: g.handle_heartbeat,
            13: g.handle_leave_group,
            14: g.handle_sync_group,
            15: g.handle_describe_groups,
            16: g.handle_list_groups,
            42: g.handle_delete_groups,
        }

    # ---- lifecycle -----------------------------------------------------------------------

    @property
    def image(self) -> MetadataImage:
        return self.metadata.image

    @property
    def cluster_id(self) -> str:
        return self.membership.cluster_id or "dcmirror-standalone"

    async def start(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register with the controller, load the logs, heartbeat; `ready` once unfenced."""
        write_meta_properties(self.data_dir, self.node_id, self.cluster_id)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.metadata.run)
            await nursery.start(self.fetchers.run)
            task_status.started()
            await self._register()
            start = time.monotonic()
            self.logs.load_all(self._log_config_for, now_ms())
            self._hw_checkpoint = read_offset_checkpoint(self.data_dir / REPLICATION_OFFSET_FILE,
                                                         "high watermarks start at 0")
            self._logs_loaded = True
            self._reconcile()
            self.groups.open(now_ms())
            log.info("broker %d loaded %d partition(s) in %.3f s", self.node_id, len(self.partitions),
                     time.monotonic() - start)
            nursery.start_soon(self._heartbeat_loop)
            nursery.start_soon(self.isr_shrink_loop)
            while True:
                reg = self.image.brokers.get(self.node_id)
                if reg is not None and reg.broker_epoch == self.broker_epoch and not reg.fenced:
                    break
                await self.metadata.wait_for_offset(self.image.offset + 1)
            self.ready.set()
            nursery.start_soon(self._ensure_offsets_topic)
            log.info("broker %d is ready (broker epoch %d, controller %d)", self.node_id, self.broker_epoch,
                     self.metadata.leader_id)

    @property
    def cluster_size(self) -> int:
        """Brokers the cluster is declared with (the topology), or 1 standalone."""
        return len(self.membership.brokers) or len(self.membership.voters)

    async def _ensure_offsets_topic(self) -> None:
        while True:
            try:
                await self.groups.offsets_topic_loop()
                return
            except ControllerUnavailable as exc:
                log.warning("creating __consumer_offsets: %s", exc)
                await trio.sleep(1.0)

    async def _register(self) -> None:
        while True:
            try:
                result = await self.metadata.call("register_broker", {
                    "broker_id": self.node_id, "incarnation_id": self.incarnation_id,
                    "host": self.advertised_host, "port": self.advertised_port,
                    "rack": self.config["broker.rack"] or None,
                }, timeout_s=10.0)
            except ControllerUnavailable as exc:
                log.warning("broker %d is waiting for the metadata quorum: %s", self.node_id, exc)
                continue
            if result["error_code"] == ErrorCode.none:
                self.broker_epoch = int(result["broker_epoch"])
                await self.metadata.wait_for_offset(int(result["metadata_offset"]))
                return
            log.warning("registration of broker %d failed: %s", self.node_id, result.get("error_message"))
            await trio.sleep(0.5)

    async def _heartbeat_loop(self) -> None:
        interval_s = int(self.config["broker.heartbeat.interval.ms"]) / 1000
        while True:
            reg = self.image.brokers.get(self.node_id)
            caught_up = reg is not None and reg.broker_epoch == self.broker_epoch
            try:
                result = await self.metadata.call("broker_heartbeat", {
                    "broker_id": self.node_id, "broker_epoch": self.broker_epoch, "caught_up": caught_up,
                    "want_shutdown": self._shutting_down,
                }, timeout_s=max(1.0, 4 * interval_s))
            except ControllerUnavailable as exc:
                log.warning("heartbeat of broker %d got no answer: %s", self.node_id, exc)
                continue
            code = result["error_code"]
            if code == ErrorCode.stale_broker_epoch:
                log.warning("broker %d was registered again elsewhere or forgotten: registering anew", self.node_id)
                self.incarnation_id = str(uuid.uuid4())
                await self._register()
                continue
            if code == ErrorCode.none and self._shutting_down and result.get("should_shut_down"):
                self._shutdown_done.set()
                return
            with trio.move_on_after(interval_s):
                await self._shutdown_wanted.wait()

    async def controlled_shutdown(self, timeout_s: float) -> bool:
        """Ask the controller to move leadership away; True when it confirmed."""
        if not self.ready.is_set():
            return False
        self._shutting_down = True
        self._shutdown_wanted.set()
        with trio.move_on_after(timeout_s):
            await self._shutdown_done.wait()
            log.info("broker %d: controlled shutdown complete, it leads no partitions", self.node_id)
            await self.metadata.resign()
            return True
        log.warning("broker %d: controlled shutdown did not complete within %.1f s", self.node_id, timeout_s)
        return False

    def checkpoint_high_watermarks(self) -> Callable[[], None]:
        """What writes every replica's high watermark now (the file write may run in a thread)."""
        offsets = {key: part.high_watermark for key, part in self.partitions.items()}
        return functools.partial(write_offset_checkpoint, self.data_dir / REPLICATION_OFFSET_FILE, offsets)

    def close(self) -> None:
        if not self._logs_loaded:
            # Nothing was opened (say, the listener's port was taken): leave the data directory
            # as it is, without an empty recovery-point file and a clean-shutdown marker.
            return
        self.checkpoint_high_watermarks()()
        self.logs.close()

    def _log_config_for(self, topic: str) -> Any:
        t = self.image.topic(topic)
        return self.config.log_config(t.configs if t else {})

    # ---- acting on metadata ----------------------------------------------------------------

    def _on_metadata_applied(self, records: list[dict[str, Any]]) -> None:
        if self._logs_loaded:
            self._reconcile()

    def _reconcile(self) -> None:
        """Make the local replicas match the metadata image."""
        wanted: dict[tuple[str, int], tuple[TopicImage, PartitionState]] = {}
        for t, p in self.image.all_partitions():
            if self.node_id in p.replicas:
                wanted[(t.name, p.partition)] = (t, p)
        for key in list(self.partitions):
            if key not in wanted or wanted[key][0].topic_id != self.partitions[key].topic_id:
                self._drop_replica(key)
        for key in list(self.logs.logs):
            if key not in self.partitions and key not in wanted:
                # Found on disk at startup but unknown to the metadata: never delete data on
                # that evidence alone (a lost metadata directory would empty the broker).
                self.logs.delete_log(*key, keep_as_stray=True)
        configs: dict[str, Any] = {}  # one LogConfig per topic, not per partition
        for key, (t, p) in wanted.items():
            config = configs.get(t.topic_id)
            if config is None:
                config = configs[t.topic_id] = self.config.log_config(t.configs)
            part = self.partitions.get(key)
            if part is None:
                part = self._open_replica(t, p, config)
            self._apply_partition_state(part, p, config)
        ids = {t.name: t.topic_id for t in self.image.topics.values()}
        for name, topic_id in self._known_topics.items():
            if ids.get(name) != topic_id:
                # A topic recreated under the same name must not inherit old committed offsets.
                self.groups.coordinator.delete_offsets_of_topic(name)
                self.groups.flush_records()
        self._known_topics = ids
        self._reconciled_once = True
        self.groups.on_partitions_changed()
        self.fetchers.update()

    def _open_replica(self, t: TopicImage, p: PartitionState, config: Any) -> Partition:
        lg = self.logs.get(t.name, p.partition)
        if lg is not None:
            on_disk = read_partition_topic_id(lg.dir)
            if on_disk is not None and on_disk != t.topic_id:
                log.info("%s belongs to an earlier topic of that name (id %s)", lg.dir.name, on_disk)
                self.logs.delete_log(t.name, p.partition, keep_as_stray=not self._reconciled_once)
                lg = None
        if lg is None:
            lg = self.logs.create_log(t.name, p.partition, config, now_ms())
        write_partition_topic_id(lg.dir, t.topic_id)
        part = Partition(t.name, p.partition, lg, t.topic_id)
        part.hw = min(self._hw_checkpoint.pop(lg.name, 0), lg.log_end_offset)
        self.partitions[(t.name, p.partition)] = part
        return part

    def _apply_partition_state(self, part: Partition, p: PartitionState, config: Any) -> None:
        if part.log.config != config:
            part.log.config = config
        was_leader, old_epoch, old_isr = part.is_leader, part.leader_epoch, part.isr
        part.is_leader = p.leader == self.node_id
        part.leader_id = p.leader
        part.leader_epoch = p.leader_epoch
        part.partition_epoch = p.partition_epoch
        part.replicas = list(p.replicas)
        part.isr = list(p.isr)
        if part.is_leader and old_isr and old_isr != part.isr:
            # Counted by the leader, whoever changed the ISR: the leader itself (a lagging or
            # caught-up follower) or the controller (a fenced broker leaves every ISR).
            if not set(old_isr) <= set(part.isr):
                self.metrics.isr_shrinks += 1
            if not set(part.isr) <= set(old_isr):
                self.metrics.isr_expands += 1
        if part.is_leader and not was_leader:
            # A new leader starts from the high watermark it learned as a follower (or read
            # from its checkpoint); the followers' next fetches move it on.
            part.hw = part.high_watermark
            part.replica_leo = {}
            part.replica_caught_up_ms = {r: now_ms() for r in part.isr}
        if part.is_leader:
            part.follower = None
            if part.advance_high_watermark(self.node_id):
                self.waiters.notify((part.topic, part.index))
        if part.is_leader and (not was_leader or old_epoch != p.leader_epoch):
            # Becoming leader starts the epoch at the log end, as Kafka's LeaderEpochFileCache does.
            part.log.leader_epochs.assign(p.leader_epoch, part.log.log_end_offset)
            log.info("broker %d leads %s-%d (leader epoch %d)", self.node_id, part.topic, part.index, p.leader_epoch)
        if was_leader != part.is_leader or old_epoch != p.leader_epoch:
            self.waiters.notify((part.topic, part.index))  # long polls re-check leadership

    def _drop_replica(self, key: tuple[str, int]) -> None:
        self.partitions.pop(key, None)
        self.logs.delete_log(*key)
        self.waiters.notify(key)

    async def call_controller(self, op: str, args: dict[str, Any], timeout_s: float = 30.0) -> dict[str, Any]:
        """Run a controller operation; a successful change is applied here before returning,
        so this broker's next Metadata answer shows it. Raises ControllerUnavailable."""
        result = await self.metadata.call(op, args, timeout_s=timeout_s)
        if result.get("error_code") == ErrorCode.none and "metadata_offset" in result:
            await self.metadata.wait_for_offset(int(result["metadata_offset"]))
        return result

    async def create_topics(self, specs: list[dict[str, Any]], *, validate_only: bool = False) -> list[dict[str, Any]]:
        """Create topics through the controller; per-topic results once applied here."""
        result = await self.call_controller("create_topics", {"topics": specs, "validate_only": validate_only})
        if result["error_code"] != ErrorCode.none:
            return [{"name": s["name"], "error_code": result["error_code"], "error_message": result.get("error_message")}
                    for s in specs]
        topics: list[dict[str, Any]] = result["topics"]
        return topics

    async def _maybe_auto_create(self, name: str) -> tuple[TopicImage | None, int]:
        """(topic, error) for a produce/metadata reference to a topic that may not exist."""
        t = self.image.topic(name)
        if t is not None:
            return t, ErrorCode.none
        try:
            validate_topic_name(name)
        except InvalidTopic:
            return None, ErrorCode.invalid_topic_exception
        if not self.config["auto.create.topics.enable"]:
            return None, ErrorCode.unknown_topic_or_partition
        try:
            results = await self.create_topics([{"name": name, "num_partitions": -1, "replication_factor": -1}])
        except ControllerUnavailable as exc:
            log.warning("auto-creating topic %s failed: %s", name, exc)
            return None, ErrorCode.leader_not_available
        code = results[0]["error_code"]
        if code not in (ErrorCode.none, ErrorCode.topic_already_exists):
            log.warning("auto-creating topic %s failed: %s", name, results[0].get("error_message"))
            return None, ErrorCode.invalid_topic_exception if code == ErrorCode.invalid_topic_exception else code
        return self.image.topic(name), ErrorCode.none

    # ---- ApiVersions ----------------------------------------------------------------------

    @staticmethod
    def api_versions_body(error: int = ErrorCode.none) -> dict[str, Any]:
        return {
            "error_code": error,
            "api_keys": [
                {"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(SUPPORTED_APIS.items())
            ],
            "throttle_time": 0,
        }

    # ---- Produce --------------------------------------------------------------------------

    def append(self, topic: str, index: int, records: bytes | None, *, min_isr_checked: bool = False) -> dict[str, Any]:
        """Append one partition's payload; the per-partition produce response. With
        `min_isr_checked` (acks=all) an ISR below min.insync.replicas refuses new batches
        with NOT_ENOUGH_REPLICAS (a duplicate still gets its original offsets)."""
        part = self.partitions.get((topic, index))
        if part is None:
            code = ErrorCode.not_leader_or_follower if self.image.partition(topic, index) else ErrorCode.unknown_topic_or_partition
            return {"index": index, "error_code": code, "base_offset": -1}
        if not part.is_leader:
            return {"index": index, "error_code": ErrorCode.not_leader_or_follower, "base_offset": -1}
        if not records:
            return {"index": index, "error_code": ErrorCode.corrupt_message, "base_offset": -1,
                    "error_message": "produce carries no records"}
        enough = True
        if min_isr_checked:
            min_isr = int(part.log.config["min.insync.replicas"])  # kept current by _reconcile
            enough = len(part.isr) >= min_isr
        try:
            result = part.log.append_as_leader(records, leader_epoch=part.leader_epoch, now_ms=now_ms(),
                                               enough_replicas=enough)
        except NotEnoughReplicas:
            return {"index": index, "error_code": ErrorCode.not_enough_replicas, "base_offset": -1,
                    "error_message": f"the ISR {part.isr} is smaller than min.insync.replicas="
                                     f"{part.log.config['min.insync.replicas']}"}
        except UnsupportedMagic as exc:
            return self._produce_error(index, ErrorCode.unsupported_for_message_format, exc)
        except InvalidRecordBatch as exc:
            return self._produce_error(index, ErrorCode.corrupt_message, exc)
        except RecordTooLarge as exc:
            return self._produce_error(index, ErrorCode.message_too_large, exc)
        except ProducerFenced as exc:
            return self._produce_error(index, ErrorCode.invalid_producer_epoch, exc)
        except OutOfOrderSequence as exc:
            return self._produce_error(index, ErrorCode.out_of_order_sequence_number, exc)
        except StorageError as exc:
            log.error("%s", exc)
            return self._produce_error(index, ErrorCode.kafka_storage_error, exc)
        if not result.duplicate:
            part.advance_high_watermark(self.node_id)
            self.waiters.notify((topic, index))
            counters = self.metrics.topic(topic)
            counters.records_in += result.record_count
            counters.bytes_in += len(records)
        return {
            "index": index,
            "error_code": ErrorCode.none,
            "base_offset": result.base_offset,
            "log_append_time": result.log_append_time_ms,
            "log_start_offset": result.log_start_offset,
        }

    @staticmethod
    def _produce_error(index: int, code: int, exc: Exception) -> dict[str, Any]:
        return {"index": index, "error_code": code, "base_offset": -1, "log_start_offset": -1,
                "error_message": str(exc)}

    async def handle_produce(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any] | None:
        if req.acks == 0 and req.transactional_id is not None:
            return None
        if req.transactional_id is not None:
            code = ErrorCode.transactional_id_authorization_failed
            return {"responses": [
                {"name": t.name, "partition_responses": [self._produce_error(p.index, code, Exception("transactions are not supported")) for p in t.partition_data]}
                for t in req.topic_data
            ], "throttle_time": 0}
        responses = []
        for t in req.topic_data:
            info, error = await self._maybe_auto_create(t.name)
            if info is not None and info.internal:
                info, error = None, ErrorCode.invalid_topic_exception  # only the broker writes internal topics
            if info is None:
                parts = [{"index": p.index, "error_code": error, "base_offset": -1} for p in t.partition_data]
            else:
                parts = [self.append(t.name, p.index, p.records, min_isr_checked=req.acks == -1)
                         for p in t.partition_data]
                failed = sum(p["error_code"] != ErrorCode.none for p in parts)
                if failed:
                    self.metrics.topic(t.name).produce_errors += failed
            responses.append({"name": t.name, "partition_responses": parts})
        if req.acks == 0:
            return None
        if req.acks == -1:
            await self._wait_for_isr(responses, max(0.0, req.timeout.total_seconds()))
        return {"responses": responses, "throttle_time": 0}

    async def _wait_for_isr(self, responses: list[dict[str, Any]], timeout_s: float) -> None:
        """acks=all: hold the answer until every appended batch is below the high watermark."""
        deadline = trio.current_time() + timeout_s
        for t in responses:
            for r in t["partition_responses"]:
                if r["error_code"] != ErrorCode.none or r.get("base_offset", -1) < 0:
                    continue
                key = (t["name"], r["index"])
                needed = r["base_offset"] + 1
                while True:
                    part = self.partitions.get(key)
                    if part is None or not part.is_leader:
                        r.update(error_code=ErrorCode.not_leader_or_follower, error_message="leadership moved")
                        break
                    if part.high_watermark >= needed:
                        min_isr = int(part.log.config["min.insync.replicas"])
                        if len(part.isr) < min_isr:
                            r.update(error_code=ErrorCode.not_enough_replicas_after_append,
                                     error_message=f"the ISR shrank to {part.isr} while waiting")
                        break
                    if trio.current_time() >= deadline:
                        r.update(error_code=ErrorCode.request_timed_out,
                                 error_message="the in-sync replicas did not all acknowledge in time")
                        break
                    event = trio.Event()
                    self.waiters.register([key], event)
                    try:
                        with trio.move_on_at(deadline):
                            await event.wait()
                    finally:
                        self.waiters.unregister([key], event)

    # ---- Fetch ----------------------------------------------------------------------------

    def _read_partition(self, fp: Any, topic: str, replica_id: int, budget: int, first: bool) -> tuple[dict[str, Any], int, bool]:
        is_follower = replica_id >= 0
        debugging = replica_id == DEBUGGING_REPLICA_ID
        part = self.partitions.get((topic, fp.partition))
        if part is None or not (part.is_leader or debugging) or (is_follower and replica_id not in part.replicas):
            code = (ErrorCode.not_leader_or_follower if part is not None or self.image.partition(topic, fp.partition)
                    else ErrorCode.unknown_topic_or_partition)
            return {"partition_index": fp.partition, "error_code": code,
                    "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                    "preferred_read_replica": -1, "records": b""}, 0, True
        hw = part.high_watermark
        base = {"partition_index": fp.partition, "high_watermark": hw, "last_stable_offset": hw,
                "log_start_offset": part.log.log_start_offset, "preferred_read_replica": -1,
                "aborted_transactions": None}
        epoch = getattr(fp, "current_leader_epoch", -1)
        if epoch >= 0 and epoch != part.leader_epoch and not debugging:
            code = ErrorCode.fenced_leader_epoch if epoch < part.leader_epoch else ErrorCode.unknown_leader_epoch
            return {**base, "error_code": code, "records": b""}, 0, True
        limit = max(0, min(fp.partition_max_bytes, budget))
        if is_follower:
            self._on_follower_fetch(part, replica_id, fp.fetch_offset)
        # Followers and the replica verifier read to the log end; consumers only what is committed.
        upper = part.log.log_end_offset if is_follower or debugging else hw
        try:
            data = part.log.read(fp.fetch_offset, limit, upper, min_one_batch=first)
        except OffsetOutOfRange:
            return {**base, "error_code": ErrorCode.offset_out_of_range, "records": b""}, 0, True
        return {**base, "error_code": ErrorCode.none, "records": data}, len(data), False

    def _read_all(self, wanted: list[tuple[str, Any]], replica_id: int,
                  max_bytes: int) -> tuple[list[tuple[str, dict[str, Any]]], int, bool]:
        budget = max_bytes if max_bytes > 0 else int(self.config["fetch.max.bytes"])
        budget = min(budget, int(self.config["fetch.max.bytes"]))
        total = 0
        any_error = False
        out = []
        for topic, fp in wanted:
            resp, size, error = self._read_partition(fp, topic, replica_id, budget - total, total == 0)
            out.append((topic, resp))
            total += size
            any_error |= error
        return out, total, any_error

    async def handle_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        session = None
        full = True
        if req.replica_id >= 0 and getattr(req, "session_epoch", -1) >= 0:
            # A follower: incremental fetch session (KIP-227); consumers stay sessionless.
            session, full, error = self.fetch_sessions.open(req, req.replica_id)
            if error != ErrorCode.none:
                return {"throttle_time": 0, "error_code": error, "session_id": 0, "responses": []}
        if session is not None:
            wanted = [(topic, fp) for (topic, _), fp in session.partitions.items()]
        else:
            wanted = [(t.topic, fp) for t in req.topics for fp in t.partitions]
        max_wait_s = max(0.0, req.max_wait.total_seconds())
        deadline = trio.current_time() + max_wait_s
        keys = [(topic, fp.partition) for topic, fp in wanted]
        while True:
            answers, total, any_error = self._read_all(wanted, req.replica_id, req.max_bytes)
            if total >= req.min_bytes or any_error or trio.current_time() >= deadline or not keys:
                break
            event = trio.Event()
            self.waiters.register(keys, event)
            try:
                with trio.move_on_at(deadline):
                    await event.wait()
            finally:
                self.waiters.unregister(keys, event)
        if req.replica_id >= 0:
            self.metrics.replication_bytes_out += total
        elif total and req.replica_id != DEBUGGING_REPLICA_ID:
            for topic, resp in answers:
                data = resp["records"]
                if data:
                    counters = self.metrics.topic(topic)
                    counters.bytes_out += len(data)
                    counters.records_out += batch_record_count(data)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for topic, resp in answers:
            if session is None or session.include((topic, resp["partition_index"]), resp, full):
                by_topic.setdefault(topic, []).append(resp)
        return {"throttle_time": 0, "error_code": ErrorCode.none,
                "session_id": session.session_id if session is not None else 0,
                "responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}

    def _on_follower_fetch(self, part: Partition, replica_id: int, fetch_offset: int) -> None:
        """A follower's fetch offset is its log end: the high watermark may move, and a
        follower that caught up joins the ISR."""
        if replica_id not in part.replicas:
            return
        part.replica_leo[replica_id] = fetch_offset
        if fetch_offset >= part.log.log_end_offset:
            part.replica_caught_up_ms[replica_id] = now_ms()
        if part.advance_high_watermark(self.node_id):
            self.waiters.notify((part.topic, part.index))
        if (replica_id not in part.isr and not part.isr_change_pending and now_ms() >= part.isr_retry_at_ms
                and fetch_offset >= part.log.log_end_offset and fetch_offset >= part.high_watermark):
            part.isr_change_pending = True
            self.fetchers.spawn(self._expand_isr, part, replica_id)

    async def isr_shrink_loop(self) -> None:
        """Leader: followers not caught up for replica.lag.time.max.ms leave the ISR."""
        lag_max_ms = int(self.config["replica.lag.time.max.ms"])
        while True:
            await trio.sleep(lag_max_ms / 2000)
            now = now_ms()
            for part in list(self.partitions.values()):
                if not part.is_leader or part.isr_change_pending:
                    continue
                laggards = [r for r in part.isr if r != self.node_id
                            and now - part.replica_caught_up_ms.get(r, now) > lag_max_ms]
                if laggards:
                    part.isr_change_pending = True
                    self.fetchers.spawn(self._alter_isr, part, [r for r in part.isr if r not in laggards],
                                        f"shrink (lagging: {laggards})")

    async def _expand_isr(self, part: Partition, replica_id: int) -> None:
        await self._alter_isr(part, [*part.isr, replica_id], f"expand with {replica_id}")

    async def _alter_isr(self, part: Partition, isr: list[int], what: str) -> None:
        try:
            result = await self.call_controller("alter_partition", {
                "broker_id": self.node_id, "broker_epoch": self.broker_epoch, "topic_id": part.topic_id,
                "partition": part.index, "leader_epoch": part.leader_epoch,
                "partition_epoch": part.partition_epoch, "isr": isr,
            }, timeout_s=10.0)
            if result["error_code"] == ErrorCode.none:
                log.info("broker %d: ISR of %s-%d is now %s (%s)", self.node_id, part.topic, part.index, isr, what)
            else:
                part.isr_retry_at_ms = now_ms() + ISR_CHANGE_RETRY_BACKOFF_MS
                log.info("ISR %s of %s-%d refused: %s", what, part.topic, part.index, result.get("error_message"))
        except ControllerUnavailable as exc:
            part.isr_retry_at_ms = now_ms() + ISR_CHANGE_RETRY_BACKOFF_MS
            log.warning("ISR %s of %s-%d failed: %s", what, part.topic, part.index, exc)
        finally:
            part.isr_change_pending = False

    # ---- ListOffsets ----------------------------------------------------------------------

    def list_offset(self, topic: str, index: int, timestamp: int, epoch: int) -> dict[str, Any]:
        part = self.partitions.get((topic, index))
        out: dict[str, Any] = {"partition_index": index, "timestamp": -1, "offset": -1, "leader_epoch": -1}
        if part is None or not part.is_leader:
            code = (ErrorCode.not_leader_or_follower if part is not None or self.image.partition(topic, index)
                    else ErrorCode.unknown_topic_or_partition)
            return {**out, "error_code": code}
        if epoch >= 0 and epoch != part.leader_epoch:
            code = ErrorCode.fenced_leader_epoch if epoch < part.leader_epoch else ErrorCode.unknown_leader_epoch
            return {**out, "error_code": code}
        out["error_code"] = ErrorCode.none
        out["leader_epoch"] = part.leader_epoch
        if timestamp == LATEST_TIMESTAMP:
            out["offset"] = part.high_watermark
        elif timestamp == EARLIEST_TIMESTAMP:
            out["offset"] = part.log.log_start_offset
        elif timestamp == MAX_TIMESTAMP:
            out["offset"], out["timestamp"] = part.log.max_timestamp_offset()
        elif timestamp >= 0:
            found = part.log.offset_for_timestamp(timestamp)
            if found is not None and found[0] < part.high_watermark:
                out["offset"], out["timestamp"] = found
        else:
            out["error_code"] = ErrorCode.invalid_request
        return out

    async def handle_list_offsets(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        topics = []
        for t in req.topics:
            parts = [
                self.list_offset(t.name, p.partition_index, p.timestamp, getattr(p, "current_leader_epoch", -1))
                for p in t.partitions
            ]
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    # ---- Metadata -------------------------------------------------------------------------

    def _topic_metadata(self, name: str, error: int = ErrorCode.none) -> dict[str, Any]:
        t = self.image.topic(name)
        if t is None:
            return {"error_code": error or ErrorCode.unknown_topic_or_partition, "name": name, "is_internal": False,
                    "partitions": [], "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        live = {b.broker_id for b in self.image.unfenced_brokers()}
        partitions = []
        for index in sorted(t.partitions):
            p = t.partitions[index]
            partitions.append({
                "error_code": ErrorCode.none if p.leader != NO_LEADER else ErrorCode.leader_not_available,
                "partition_index": index,
                "leader_id": p.leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": list(p.replicas),
                "isr_nodes": list(p.isr),
                "offline_replicas": [r for r in p.replicas if r not in live],
            })
        return {"error_code": ErrorCode.none, "name": name, "is_internal": t.internal, "partitions": partitions,
                "topic_id": uuid.UUID(t.topic_id), "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}

    @property
    def controller_id(self) -> int:
        leader = self.metadata.leader_id
        if leader >= 0 and leader in self.image.brokers:
            return leader
        # Never -1 (admin clients loop on it). Dedicated controllers are not reachable by
        # clients: like KRaft, name this broker, which forwards admin requests.
        return self.node_id

    async def handle_metadata(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        requested = req.topics
        if requested is None or (version == 0 and not requested):
            names = sorted(self.image.topics_by_name)
            topics = [self._topic_metadata(n) for n in names]
        else:
            allow_auto = getattr(req, "allow_auto_topic_creation", True)
            topics = []
            for t in requested:
                error: int = ErrorCode.none
                if self.image.topic(t.name) is None:
                    if allow_auto:
                        _, error = await self._maybe_auto_create(t.name)
                    else:
                        error = ErrorCode.unknown_topic_or_partition
                topics.append(self._topic_metadata(t.name, error))
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack}
                        for b in self.image.unfenced_brokers()],
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id,
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # ---- DescribeConfigs ------------------------------------------------------------------

    async def handle_describe_configs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        results = []
        for r in req.resources:
            keys = set(r.configuration_keys) if r.configuration_keys is not None else None
            result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                      "resource_type": r.resource_type, "resource_name": r.resource_name}
            entries: list[dict[str, Any]] = []
            if r.resource_type == RESOURCE_TOPIC:
                info = self.image.topic(r.resource_name)
                if info is None:
                    result.update(error_code=ErrorCode.unknown_topic_or_partition,
                                  error_message=f"topic {r.resource_name!r} does not exist")
                else:
                    cfg = self.config.log_config(info.configs)
                    for name in TOPIC_CONFIG_DEFS:
                        if keys is not None and name not in keys:
                            continue
                        source = (SOURCE_TOPIC if name in cfg.overrides
                                  else SOURCE_STATIC_BROKER if name in cfg.broker_defaults else SOURCE_DEFAULT)
                        entries.append({"name": name, "value": render_config_value(cfg[name]), "read_only": False,
                                        "config_source": source, "is_sensitive": False, "synonyms": []})
            elif r.resource_type == RESOURCE_BROKER:
                if r.resource_name not in ("", str(self.node_id)):
                    result.update(error_code=ErrorCode.invalid_request,
                                  error_message=f"this is broker {self.node_id}, not {r.resource_name}")
                else:
                    for name, value, is_default in self.config.describe():
                        if keys is not None and name not in keys:
                            continue
                        entries.append({"name": name, "value": value, "read_only": True,
                                        "config_source": SOURCE_DEFAULT if is_default else SOURCE_STATIC_BROKER,
                                        "is_sensitive": False, "synonyms": []})
            else:
                result.update(error_code=ErrorCode.invalid_request,
                              error_message=f"resource type {r.resource_type} is not supported")
            result["configs"] = entries
            results.append(result)
        return {"throttle_time": 0, "results": results}

    # ---- InitProducerId / OffsetForLeaderEpoch --------------------------------------------

    async def handle_init_producer_id(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        if req.transactional_id is not None:
            return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed,
                    "producer_id": -1, "producer_epoch": -1}
        try:
            producer_id = await self.producer_ids.next_id()
        except ControllerUnavailable as exc:
            log.warning("no producer id block: %s", exc)
            return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available,
                    "producer_id": -1, "producer_epoch": -1}
        return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": producer_id, "producer_epoch": 0}

    async def handle_offset_for_leader_epoch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                part = self.partitions.get((t.topic, p.partition))
                out: dict[str, Any] = {"partition": p.partition, "leader_epoch": -1, "end_offset": -1}
                current = getattr(p, "current_leader_epoch", -1)
                if part is None:
                    out["error_code"] = ErrorCode.unknown_topic_or_partition
                elif not part.is_leader:
                    out["error_code"] = ErrorCode.not_leader_or_follower
                elif current >= 0 and current != part.leader_epoch:
                    out["error_code"] = (ErrorCode.fenced_leader_epoch if current < part.leader_epoch
                                         else ErrorCode.unknown_leader_epoch)
                else:
                    epoch, end = part.log.leader_epochs.end_offset_for(p.leader_epoch, part.log.log_end_offset)
                    out.update(error_code=ErrorCode.none, leader_epoch=epoch, end_offset=end)
                parts.append(out)
            topics.append({"topic": t.topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}
