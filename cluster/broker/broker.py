"""The broker's state and request handlers (one per API, version-agnostic).

Handlers take decoded kio requests and answer with dicts (see protocol/messages.build).
Network I/O lives in server.py; background work (retention, flushes) in service.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from cluster.broker.clock import now_ms
from cluster.broker.config import BrokerConfig, render_config_value
from cluster.broker.group_service import GroupService
from cluster.broker.producer_ids import ProducerIdAllocator
from cluster.broker.topics import InvalidTopic, TopicInfo, TopicStore, validate_topic_name
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import InvalidRecordBatch, UnsupportedMagic
from cluster.storage.config import TOPIC_CONFIG_DEFS, InvalidConfig
from cluster.storage.log import (
    Log,
    OffsetOutOfRange,
    OutOfOrderSequence,
    ProducerFenced,
    RecordTooLarge,
    StorageError,
)
from cluster.storage.log_manager import LogManager

log = logging.getLogger(__name__)

# API key → (min, max) advertised; see shared/PROTOCOL.md. Only what is implemented.
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
    42: (0, 1),  # DeleteGroups
}

LEADER_EPOCH = 0  # a standalone broker is the only leader its partitions ever had
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
    """A partition this broker leads: its log and high watermark."""

    topic: str
    index: int
    log: Log
    leader_epoch: int = LEADER_EPOCH

    @property
    def high_watermark(self) -> int:
        # Single replica: everything appended is committed.
        return self.log.log_end_offset


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
    def __init__(self, data_dir: Path, config: BrokerConfig, advertised_host: str, advertised_port: int) -> None:
        self.data_dir = data_dir
        self.config = config
        self.node_id = int(config["node.id"])
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.topics = TopicStore(data_dir)
        self.logs = LogManager(data_dir)
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.waiters = AppendWaiters()
        self.producer_ids = ProducerIdAllocator(data_dir / "producer-id-block")
        self.groups = GroupService(self)
        g = self.groups
        self.handlers: dict[int, Callable[[int, Any, RequestContext], Awaitable[dict[str, Any] | None]]] = {
            0: self.handle_produce,
            1: self.handle_fetch,
            2: self.handle_list_offsets,
            3: self.handle_metadata,
            19: self.handle_create_topics,
            20: self.handle_delete_topics,
            22: self.handle_init_producer_id,
            23: self.handle_offset_for_leader_epoch,
            32: self.handle_describe_configs,
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

    def open(self) -> None:
        start = time.monotonic()
        self.topics.load(self.node_id)
        self.producer_ids.load()
        self.logs.load_all(self._log_config_for, now_ms())
        for (topic, index), lg in self.logs.logs.items():
            if topic in self.topics.topics:
                self.partitions[(topic, index)] = self._new_partition(topic, index, lg)
            else:
                log.warning("partition directory %s has no topic metadata; ignoring it", lg.dir)
        for info in self.topics.topics.values():
            for p in range(info.partitions):
                if (info.name, p) not in self.partitions:
                    self.create_partition(info, p)
        self.groups.open(now_ms())
        log.info(
            "broker %d loaded %d topic(s), %d partition(s) in %.3f s",
            self.node_id, len(self.topics.topics), len(self.partitions), time.monotonic() - start,
        )

    def close(self) -> None:
        self.logs.close()

    def _log_config_for(self, topic: str) -> Any:
        info = self.topics.topics.get(topic)
        return self.config.log_config(info.configs if info else {})

    def create_partition(self, info: TopicInfo, index: int) -> Partition:
        lg = self.logs.create_log(info.name, index, self.config.log_config(info.configs), now_ms())
        part = self._new_partition(info.name, index, lg)
        self.partitions[(info.name, index)] = part
        return part

    @staticmethod
    def _new_partition(topic: str, index: int, lg: Log) -> Partition:
        part = Partition(topic, index, lg)
        # Becoming leader starts the epoch at the log end, as Kafka's LeaderEpochFileCache does.
        lg.leader_epochs.assign(part.leader_epoch, lg.log_end_offset)
        return part

    def create_topic(self, name: str, partitions: int, configs: dict[str, str]) -> TopicInfo:
        """Create a topic and its logs; raises InvalidTopic/InvalidConfig/ValueError."""
        validate_topic_name(name)
        if partitions < 1 or partitions > int(self.config["max.topic.partitions"]):
            raise ValueError(f"partition count {partitions} must be in 1..{self.config['max.topic.partitions']}")
        if len(self.topics.topics) >= int(self.config["max.topics"]):
            raise ValueError(f"broker holds max.topics={self.config['max.topics']} topics already")
        self.config.log_config(configs)  # validates names and values
        info = self.topics.create(name, partitions, configs)
        for p in range(partitions):
            self.create_partition(info, p)
        log.info("created topic %s with %d partition(s) %s", name, partitions, configs or "")
        return info

    def delete_topic(self, name: str) -> None:
        info = self.topics.delete(name)
        if info is None:
            return
        for p in range(info.partitions):
            self.partitions.pop((name, p), None)
            self.logs.delete_log(name, p)
            self.waiters.notify((name, p))
        # A topic recreated under the same name must not inherit old committed offsets.
        self.groups.coordinator.delete_offsets_of_topic(name)
        self.groups.flush_records()
        log.info("deleted topic %s", name)

    def _maybe_auto_create(self, name: str) -> tuple[TopicInfo | None, int]:
        """(topic, error) for a produce/metadata reference to a topic that may not exist."""
        info = self.topics.topics.get(name)
        if info is not None:
            return info, ErrorCode.none
        if not self.config["auto.create.topics.enable"]:
            try:
                validate_topic_name(name)
            except InvalidTopic:
                return None, ErrorCode.invalid_topic_exception
            return None, ErrorCode.unknown_topic_or_partition
        try:
            return self.create_topic(name, int(self.config["num.partitions"]), {}), ErrorCode.none
        except InvalidTopic:
            return None, ErrorCode.invalid_topic_exception
        except (InvalidConfig, ValueError) as exc:
            log.warning("auto-creating topic %s failed: %s", name, exc)
            return None, ErrorCode.invalid_request

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

    def append(self, topic: str, index: int, records: bytes | None) -> dict[str, Any]:
        """Append one partition's payload; the per-partition produce response."""
        part = self.partitions.get((topic, index))
        if part is None:
            return {"index": index, "error_code": ErrorCode.unknown_topic_or_partition, "base_offset": -1}
        if not records:
            return {"index": index, "error_code": ErrorCode.corrupt_message, "base_offset": -1,
                    "error_message": "produce carries no records"}
        try:
            result = part.log.append_as_leader(records, leader_epoch=part.leader_epoch, now_ms=now_ms())
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
            self.waiters.notify((topic, index))
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
            info, error = self._maybe_auto_create(t.name)
            if info is not None and info.internal:
                info, error = None, ErrorCode.invalid_topic_exception  # only the broker writes internal topics
            if info is None:
                parts = [{"index": p.index, "error_code": error, "base_offset": -1} for p in t.partition_data]
            else:
                parts = [self.append(t.name, p.index, p.records) for p in t.partition_data]
            responses.append({"name": t.name, "partition_responses": parts})
        if req.acks == 0:
            return None
        return {"responses": responses, "throttle_time": 0}

    # ---- Fetch ----------------------------------------------------------------------------

    def _read_partition(self, fp: Any, topic: str, is_follower: bool, budget: int, first: bool) -> tuple[dict[str, Any], int, bool]:
        part = self.partitions.get((topic, fp.partition))
        if part is None:
            return {"partition_index": fp.partition, "error_code": ErrorCode.unknown_topic_or_partition,
                    "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1,
                    "preferred_read_replica": -1, "records": b""}, 0, True
        hw = part.high_watermark
        base = {"partition_index": fp.partition, "high_watermark": hw, "last_stable_offset": hw,
                "log_start_offset": part.log.log_start_offset, "preferred_read_replica": -1,
                "aborted_transactions": None}
        epoch = getattr(fp, "current_leader_epoch", -1)
        if epoch >= 0 and epoch != part.leader_epoch:
            code = ErrorCode.fenced_leader_epoch if epoch < part.leader_epoch else ErrorCode.unknown_leader_epoch
            return {**base, "error_code": code, "records": b""}, 0, True
        limit = max(0, min(fp.partition_max_bytes, budget))
        upper = part.log.log_end_offset if is_follower else hw
        try:
            data = part.log.read(fp.fetch_offset, limit, upper, min_one_batch=first)
        except OffsetOutOfRange:
            return {**base, "error_code": ErrorCode.offset_out_of_range, "records": b""}, 0, True
        return {**base, "error_code": ErrorCode.none, "records": data}, len(data), False

    def _read_all(self, req: Any) -> tuple[list[dict[str, Any]], int, bool]:
        is_follower = req.replica_id >= 0
        budget = req.max_bytes if req.max_bytes > 0 else int(self.config["fetch.max.bytes"])
        budget = min(budget, int(self.config["fetch.max.bytes"]))
        total = 0
        any_error = False
        responses = []
        for t in req.topics:
            parts = []
            for fp in t.partitions:
                resp, size, error = self._read_partition(fp, t.topic, is_follower, budget - total, total == 0)
                parts.append(resp)
                total += size
                any_error |= error
            responses.append({"topic": t.topic, "partitions": parts})
        return responses, total, any_error

    async def handle_fetch(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        max_wait_s = max(0.0, req.max_wait.total_seconds())
        deadline = trio.current_time() + max_wait_s
        keys = [(t.topic, fp.partition) for t in req.topics for fp in t.partitions]
        while True:
            responses, total, any_error = self._read_all(req)
            if total >= req.min_bytes or any_error or trio.current_time() >= deadline or not keys:
                break
            event = trio.Event()
            self.waiters.register(keys, event)
            try:
                with trio.move_on_at(deadline):
                    await event.wait()
            finally:
                self.waiters.unregister(keys, event)
        return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}

    # ---- ListOffsets ----------------------------------------------------------------------

    def list_offset(self, topic: str, index: int, timestamp: int, epoch: int) -> dict[str, Any]:
        part = self.partitions.get((topic, index))
        out: dict[str, Any] = {"partition_index": index, "timestamp": -1, "offset": -1, "leader_epoch": -1}
        if part is None:
            return {**out, "error_code": ErrorCode.unknown_topic_or_partition}
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
        info = self.topics.topics.get(name)
        if info is None:
            return {"error_code": error or ErrorCode.unknown_topic_or_partition, "name": name, "is_internal": False,
                    "partitions": [], "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
        partitions = []
        for p in range(info.partitions):
            part = self.partitions.get((name, p))
            partitions.append({
                "error_code": ErrorCode.none if part else ErrorCode.leader_not_available,
                "partition_index": p,
                "leader_id": self.node_id if part else -1,
                "leader_epoch": part.leader_epoch if part else -1,
                "replica_nodes": [self.node_id],
                "isr_nodes": [self.node_id] if part else [],
                "offline_replicas": [] if part else [self.node_id],
            })
        return {"error_code": ErrorCode.none, "name": name, "is_internal": info.internal, "partitions": partitions,
                "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}

    async def handle_metadata(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        requested = req.topics
        if requested is None or (version == 0 and not requested):
            names = sorted(self.topics.topics)
            topics = [self._topic_metadata(n) for n in names]
        else:
            allow_auto = getattr(req, "allow_auto_topic_creation", True)
            topics = []
            for t in requested:
                error: int = ErrorCode.none
                if t.name not in self.topics.topics:
                    if allow_auto:
                        _, error = self._maybe_auto_create(t.name)
                    else:
                        error = ErrorCode.unknown_topic_or_partition
                topics.append(self._topic_metadata(t.name, error))
        return {
            "throttle_time": 0,
            "brokers": [{"node_id": self.node_id, "host": self.advertised_host, "port": self.advertised_port,
                         "rack": self.config["broker.rack"] or None}],
            "cluster_id": self.topics.cluster_id,
            "controller_id": self.node_id,
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    # ---- CreateTopics / DeleteTopics ------------------------------------------------------

    async def handle_create_topics(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        results = []
        for t in req.topics:
            result: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
            configs = {c.name: c.value for c in t.configs if c.value is not None}
            partitions = t.num_partitions if t.num_partitions != -1 else int(self.config["num.partitions"])
            rf = t.replication_factor
            try:
                validate_topic_name(t.name)
                if t.name in self.topics.topics:
                    result.update(error_code=ErrorCode.topic_already_exists, error_message=f"topic {t.name!r} already exists")
                elif t.assignments:
                    result.update(error_code=ErrorCode.invalid_request,
                                  error_message="manual replica assignment needs a multi-broker cluster")
                elif rf not in (-1, 1):
                    result.update(error_code=ErrorCode.invalid_replication_factor,
                                  error_message=f"replication factor {rf} is larger than the 1 available broker")
                elif partitions < 1:
                    result.update(error_code=ErrorCode.invalid_partitions, error_message=f"partition count {partitions} must be at least 1")
                elif req.validate_only:
                    self.config.log_config(configs)
                else:
                    self.create_topic(t.name, partitions, configs)
            except InvalidTopic as exc:
                result.update(error_code=ErrorCode.invalid_topic_exception, error_message=str(exc))
            except InvalidConfig as exc:
                result.update(error_code=ErrorCode.invalid_config, error_message=str(exc))
            except ValueError as exc:
                result.update(error_code=ErrorCode.invalid_partitions, error_message=str(exc))
            results.append(result)
        return {"throttle_time": 0, "topics": results}

    async def handle_delete_topics(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        responses = []
        for name in req.topic_names:
            if not self.config["delete.topic.enable"]:
                code = ErrorCode.topic_deletion_disabled
            elif name not in self.topics.topics:
                code = ErrorCode.unknown_topic_or_partition
            else:
                self.delete_topic(name)
                code = ErrorCode.none
            responses.append({"name": name, "error_code": code})
        return {"throttle_time": 0, "responses": responses}

    # ---- DescribeConfigs ------------------------------------------------------------------

    async def handle_describe_configs(self, version: int, req: Any, ctx: RequestContext) -> dict[str, Any]:
        results = []
        for r in req.resources:
            keys = set(r.configuration_keys) if r.configuration_keys is not None else None
            result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                      "resource_type": r.resource_type, "resource_name": r.resource_name}
            entries: list[dict[str, Any]] = []
            if r.resource_type == RESOURCE_TOPIC:
                info = self.topics.topics.get(r.resource_name)
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
        producer_id = self.producer_ids.next_id()
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
                elif current >= 0 and current != part.leader_epoch:
                    out["error_code"] = (ErrorCode.fenced_leader_epoch if current < part.leader_epoch
                                         else ErrorCode.unknown_leader_epoch)
                else:
                    epoch, end = part.log.leader_epochs.end_offset_for(p.leader_epoch, part.log.log_end_offset)
                    out.update(error_code=ErrorCode.none, leader_epoch=epoch, end_offset=end)
                parts.append(out)
            topics.append({"topic": t.topic, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}
