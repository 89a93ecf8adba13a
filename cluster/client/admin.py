"""Admin operations over the Kafka protocol: topics, configs, leader elections and partition
reassignments (as kafka-topics, kafka-leader-election and kafka-reassign-partitions do),
groups (as kafka-consumer-groups does), offsets.

Metadata changes go to any broker, which passes them to the active controller; group
requests go to the group's coordinator (FindCoordinator); offset lookups to each
partition's leader (Metadata).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from cluster.client.config import admin_config
from cluster.client.connection import BrokerConnection
from cluster.client.errors import KafkaError
from cluster.client.metadata import ClientCluster
from cluster.client.retry import retrying
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.consumer_protocol import decode_assignment
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import (
    CONFIG_RESOURCE_GROUP,
    CONSUMER_REPLICA_ID,
    COORDINATOR_TRANSACTION,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_UNCOMMITTED,
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
)
from cluster.security.acl import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from cluster.security.scram import (
    DEFAULT_ITERATIONS,
    MECHANISM_TYPES,
    check_iterations,
    salted_password,
)

T = TypeVar("T")
# An admin asking about a topic that does not exist wants that answer now.
ADMIN_FINAL_CODES = frozenset({ErrorCode.unknown_topic_or_partition})
# DescribeTopicPartitions pages one describe follows at most (a cursor that never ends is a broker bug).
MAX_DESCRIBE_PAGES = 10_000
EARLIEST = EARLIEST_TIMESTAMP
LATEST = LATEST_TIMESTAMP


class AdminError(KafkaError):
    """A Kafka error answer to an admin request."""


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    log_end: int
    member_id: str
    client_id: str
    host: str

    @property
    def lag(self) -> int | None:
        return None if self.committed is None else max(0, self.log_end - self.committed)


@dataclass(frozen=True, order=True)
class SharePartitionOffset:
    """A share group's share partition as DescribeShareGroupOffsets answers it."""

    topic: str
    partition: int
    start_offset: int  # -1: never initialized or not started
    leader_epoch: int
    lag: int  # -1: not known
    error_code: int = 0


def write_txn_markers_body(producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                           partitions: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """A WriteTxnMarkers request ending one producer's transaction on `partitions`."""
    topics: dict[str, list[int]] = {}
    for topic, index in partitions:
        topics.setdefault(topic, []).append(index)
    return {"markers": [{"producer_id": producer_id, "producer_epoch": producer_epoch, "transaction_result": commit,
                         "coordinator_epoch": coordinator_epoch,
                         "topics": [{"name": t, "partition_indexes": ps} for t, ps in topics.items()]}]}


async def write_txn_marker(cluster: ClientCluster, topic: str, partition: int, *, producer_id: int,
                           producer_epoch: int, commit: bool, coordinator_epoch: int = 0) -> int:
    """Have the partition's leader write a transaction marker (needs ClusterAction there);
    its error code."""
    resp = await cluster.leader_request(topic, partition, ApiKey.WRITE_TXN_MARKERS, write_txn_markers_body(
        producer_id, producer_epoch, commit, coordinator_epoch, [(topic, partition)]))
    return int(resp.markers[0].topics[0].partitions[0].error_code)


def _retried(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Retry an admin operation on unreachable brokers and retriable errors, within
    default.api.timeout.ms (as Kafka's AdminClient bounds each call)."""

    @functools.wraps(fn)
    async def wrapper(self: Admin, *args: Any, **kwargs: Any) -> T:
        c = self.cluster.config
        async for attempt in retrying(self.api_timeout_s, c["retry.backoff.ms"], c["retry.backoff.max.ms"],
                                      final_codes=ADMIN_FINAL_CODES):
            with attempt:
                return await fn(self, *args, **kwargs)
        raise AssertionError("unreachable")

    return wrapper


class Admin:
    def __init__(self, bootstrap: str, *, client_id: str = "dcmirror-admin",
                 config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.client_id = client_id
        settings = {"bootstrap.servers": bootstrap, "client.id": client_id, **(config or {})}
        self.api_timeout_s = settings.pop("default.api.timeout.ms", 60_000) / 1000
        self.cluster = ClientCluster(admin_config(settings))
        self._by_address: dict[tuple[str, int], BrokerConnection] = {}

    async def __aenter__(self) -> Admin:
        # Fail fast (with every address tried) when no broker is reachable at all.
        await self.cluster.any_connection()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self._by_address.values():
            await conn.aclose()
        await self.cluster.aclose()

    async def _conn(self, host: str, port: int) -> BrokerConnection:
        """A connection by address (to brokers the metadata may not list, e.g. a coordinator)."""
        for node_id, address in self.cluster.metadata.brokers.items():
            if address == (host, port):
                return await self.cluster.connection(node_id)
        conn = self._by_address.get((host, port))
        if conn is None or conn.closed:
            conn = await BrokerConnection(host, port, client_id=self.client_id, link=self.cluster.link).connect()
            self._by_address[(host, port)] = conn
        return conn

    async def connection_to(self, host: str, port: int) -> BrokerConnection:
        """An open connection to the broker at host:port (a tool that asks every broker, as
        DescribeCluster lists them: the client's metadata knows only the brokers it met)."""
        return await self._conn(host, port)

    async def _any(self) -> BrokerConnection:
        return await self.cluster.any_connection()

    async def coordinator(self, group_id: str) -> BrokerConnection:
        node = await self.cluster.coordinator(group_id)
        return await self.cluster.connection(node)

    @_retried
    async def metadata(self, topics: list[str] | None) -> Any:
        body: dict[str, Any] = {"topics": None if topics is None else [{"name": t} for t in topics],
                                "allow_auto_topic_creation": False}
        return await (await self._any()).request(ApiKey.METADATA, body)

    async def _by_leader(self, partitions: Sequence[tuple[str, int]]) -> list[tuple[BrokerConnection, list[tuple[str, int]]]]:
        """Partitions grouped by their leader's connection; AdminError for an unknown one."""
        meta = await self.metadata(sorted({t for t, _ in partitions}))
        brokers = {b.node_id: (b.host, b.port) for b in meta.brokers}
        leaders = {(t.name, p.partition_index): p.leader_id for t in meta.topics for p in t.partitions}
        by_leader: dict[int, list[tuple[str, int]]] = {}
        for tp in partitions:
            if tp not in leaders:
                raise AdminError(f"partition {tp[0]}-{tp[1]}", ErrorCode.unknown_topic_or_partition)
            if leaders[tp] not in brokers:
                raise AdminError(f"partition {tp[0]}-{tp[1]}", ErrorCode.leader_not_available)
            by_leader.setdefault(leaders[tp], []).append(tp)
        return [(await self._conn(*brokers[leader]), tps) for leader, tps in by_leader.items()]

    @_retried
    async def list_offsets(self, partitions: list[tuple[str, int]], timestamp: int, *,
                           isolation_level: int = READ_UNCOMMITTED) -> dict[tuple[str, int], int]:
        """Offsets per partition for a timestamp (EARLIEST, LATEST or epoch ms), asked of each
        leader; LATEST under READ_COMMITTED is the last stable offset."""
        out: dict[tuple[str, int], int] = {}
        for conn, tps in await self._by_leader(partitions):
            topics: dict[str, list[dict[str, Any]]] = {}
            for t, p in tps:
                topics.setdefault(t, []).append({"partition_index": p, "timestamp": timestamp,
                                                 "current_leader_epoch": -1})
            resp = await conn.request(ApiKey.LIST_OFFSETS, {"replica_id": CONSUMER_REPLICA_ID, "isolation_level": isolation_level,
                                          "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
            for t in resp.topics:
                for p in t.partitions:
                    if p.error_code != 0:
                        raise AdminError(f"listing offsets of {t.name}-{p.partition_index}", p.error_code)
                    out[(t.name, p.partition_index)] = p.offset
        return out

    @_retried
    async def delete_records(self, offsets: Mapping[tuple[str, int], int],
                             timeout_ms: int = 30_000) -> dict[tuple[str, int], int]:
        """DeleteRecords: each partition's records below its offset (-1: the high watermark)
        go; the low watermark per partition. AdminError on the first partition refused."""
        out: dict[tuple[str, int], int] = {}
        for conn, tps in await self._by_leader(list(offsets)):
            topics: dict[str, list[dict[str, Any]]] = {}
            for t, p in tps:
                topics.setdefault(t, []).append({"partition_index": p, "offset": offsets[(t, p)]})
            resp = await conn.request(ApiKey.DELETE_RECORDS, {
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()], "timeout": timeout_ms},
                timeout_s=timeout_ms / 1000 + 10)
            for t in resp.topics:
                for p in t.partitions:
                    if p.error_code != 0:
                        raise AdminError(f"deleting records of {t.name}-{p.partition_index}", p.error_code)
                    out[(t.name, p.partition_index)] = p.low_watermark
        return out

    async def describe_log_dirs(self) -> dict[int, dict[str, Any]]:
        """Every broker's data directory: {node: {"log_dir", "total_bytes", "usable_bytes",
        "partitions": {(topic, partition): (bytes, offset lag)}}}."""
        meta = await self.metadata([])
        out: dict[int, dict[str, Any]] = {}
        for b in meta.brokers:
            conn = await self._conn(b.host, b.port)
            resp = await conn.request(ApiKey.DESCRIBE_LOG_DIRS, {"topics": None})
            if resp.error_code != 0:
                raise AdminError(f"describing the log dirs of broker {b.node_id}", resp.error_code)
            for d in resp.results:
                out[b.node_id] = {"log_dir": d.log_dir, "error_code": d.error_code, "total_bytes": d.total_bytes,
                                  "usable_bytes": d.usable_bytes, "partitions": {
                                      (t.name, p.partition_index): (p.partition_size, p.offset_lag)
                                      for t in d.topics for p in t.partitions}}
        return out

    # ---- topics and cluster ----------------------------------------------------------

    @_retried
    async def describe_cluster(self) -> Any:
        resp = await (await self._any()).request(ApiKey.DESCRIBE_CLUSTER, {"include_cluster_authorized_operations": False})
        if resp.error_code != 0:
            raise AdminError("describing the cluster", resp.error_code)
        return resp

    async def raw(self, api_key: ApiKey, body: dict[str, Any]) -> Any:
        """One request of any API to any broker, its answer as decoded (tools and tests)."""
        return await (await self._any()).request(api_key, body)

    @_retried
    async def describe_topic_partitions(self, topics: list[str] | None = None, *,
                                        partitions_per_request: int = 2000) -> list[dict[str, Any]]:
        """DescribeTopicPartitions, page after page (the broker's cursor) until every
        partition of `topics` (None: every topic) is described: one dict per topic (name,
        error_code, topic_id, is_internal, partitions), in name order, a topic split over
        pages merged back into one."""
        wanted = [{"name": t} for t in topics or []]
        cursor: dict[str, Any] | None = None
        merged: dict[str, Any] = {}
        for _ in range(MAX_DESCRIBE_PAGES):
            conn = await self._any()
            resp = await conn.request(ApiKey.DESCRIBE_TOPIC_PARTITIONS, {
                "topics": wanted, "response_partition_limit": partitions_per_request, "cursor": cursor})
            for t in resp.topics:
                entry = merged.setdefault(t.name, {"name": t.name, "error_code": t.error_code, "topic_id": t.topic_id,
                                                   "is_internal": t.is_internal, "partitions": []})
                entry["partitions"] += [{"partition": p.partition_index, "error_code": p.error_code,
                                         "leader": p.leader_id, "leader_epoch": p.leader_epoch,
                                         "replicas": list(p.replica_nodes), "isr": list(p.isr_nodes),
                                         "elr": list(p.eligible_leader_replicas or ()),
                                         "last_known_elr": list(p.last_known_elr or ()),
                                         "offline": list(p.offline_replicas)} for p in t.partitions]
            if resp.next_cursor is None:
                return [merged[n] for n in sorted(merged, key=lambda n: n or "")]
            cursor = {"topic_name": resp.next_cursor.topic_name,
                      "partition_index": resp.next_cursor.partition_index}
        raise AdminError(f"DescribeTopicPartitions did not finish in {MAX_DESCRIBE_PAGES} pages",
                         ErrorCode.unknown_server_error)

    @_retried
    async def create_topic(self, name: str, partitions: int = -1, replication_factor: int = -1,
                           configs: dict[str, str] | None = None,
                           assignments: list[list[int]] | None = None, validate_only: bool = False) -> None:
        body = {"topics": [{
            "name": name, "num_partitions": -1 if assignments else partitions,
            "replication_factor": -1 if assignments else replication_factor,
            "assignments": [{"partition_index": i, "broker_ids": r} for i, r in enumerate(assignments or [])],
            "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
        }], "timeout": 30_000, "validate_only": validate_only}
        resp = await (await self._any()).request(ApiKey.CREATE_TOPICS, body)
        for t in resp.topics:
            if t.error_code != 0:
                raise AdminError(f"creating topic {name!r} ({t.error_message or ''})", t.error_code)

    @_retried
    async def delete_topic(self, name: str) -> None:
        resp = await (await self._any()).request(ApiKey.DELETE_TOPICS, {"topic_names": [name], "timeout": 30_000})
        for r in resp.responses:
            if r.error_code != 0:
                raise AdminError(f"deleting topic {name!r}", r.error_code)

    @_retried
    async def create_partitions(self, name: str, count: int) -> None:
        resp = await (await self._any()).request(ApiKey.CREATE_PARTITIONS, {"topics": [{"name": name, "count": count, "assignments": None}],
                                           "timeout": 30_000, "validate_only": False})
        for r in resp.results:
            if r.error_code != 0:
                raise AdminError(f"adding partitions to {name!r} ({r.error_message or ''})", r.error_code)

    async def _config_conn(self, resource_type: int, name: str) -> BrokerConnection:
        """A broker's own configs go to that broker (as Kafka's AdminClient sends them);
        topics and the cluster-wide default to any broker."""
        if resource_type == RESOURCE_BROKER and name:
            node_id = int(name)
            if node_id not in self.cluster.metadata.brokers:
                await self.cluster.refresh()
            if node_id not in self.cluster.metadata.brokers:
                raise ValueError(f"broker {node_id} is not a live broker of the cluster")
            return await self.cluster.connection(node_id)
        return await self._any()

    @_retried
    async def alter_configs(self, resource_type: int, name: str, set_configs: Mapping[str, str],
                            delete: Sequence[str] = (), *, validate_only: bool = False) -> None:
        """IncrementalAlterConfigs SET and DELETE on one resource (a topic, a broker id, or
        "" for the brokers' cluster-wide default)."""
        configs = ([{"name": k, "config_operation": 0, "value": v} for k, v in set_configs.items()]
                   + [{"name": k, "config_operation": 1, "value": None} for k in delete])
        resp = await (await self._config_conn(resource_type, name)).request(
            ApiKey.INCREMENTAL_ALTER_CONFIGS, {"resources": [{"resource_type": resource_type, "resource_name": name,
                                                              "configs": configs}], "validate_only": validate_only})
        for r in resp.responses:
            if r.error_code != 0:
                raise AdminError(f"changing configs of {_resource_text(resource_type, name)} "
                                 f"({r.error_message or ''})", r.error_code)

    async def alter_topic_configs(self, name: str, set_configs: dict[str, str], delete: list[str]) -> None:
        await self.alter_configs(RESOURCE_TOPIC, name, set_configs, delete)

    @_retried
    async def describe_configs(self, resource_type: int, name: str, *, synonyms: bool = False) -> list[Any]:
        """DescribeConfigs entries of one resource (name, value, config_source, read_only,
        is_sensitive, synonyms when asked)."""
        resp = await (await self._config_conn(resource_type, name)).request(
            ApiKey.DESCRIBE_CONFIGS, {"resources": [{"resource_type": resource_type, "resource_name": name,
                                                     "configuration_keys": None}],
                                      "include_synonyms": synonyms, "include_documentation": False})
        (result,) = resp.results
        if result.error_code != 0:
            raise AdminError(f"describing configs of {_resource_text(resource_type, name)} "
                             f"({result.error_message or ''})", result.error_code)
        return list(result.configs)

    async def topic_configs(self, name: str) -> list[Any]:
        """DescribeConfigs entries of a topic (name, value, config_source ...)."""
        return await self.describe_configs(RESOURCE_TOPIC, name)

    @_retried
    async def elect_leaders(self, election_type: int = 0,
                            partitions: list[tuple[str, int]] | None = None) -> dict[tuple[str, int], tuple[int, str]]:
        """(error code, message) per partition; with partitions=None every partition is a candidate
        and only the ones that changed are reported."""
        topic_partitions = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for t, p in partitions:
                by_topic.setdefault(t, []).append(p)
            topic_partitions = [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]
        resp = await (await self._any()).request(ApiKey.ELECT_LEADERS, {"election_type": election_type, "topic_partitions": topic_partitions,
                                           "timeout": 30_000})
        if getattr(resp, "error_code", 0) != 0:
            raise AdminError("electing leaders", resp.error_code)
        return {(r.topic, p.partition_id): (int(p.error_code), p.error_message or "")
                for r in resp.replica_election_results for p in r.partition_result}

    @_retried
    async def describe_features(self) -> dict[str, tuple[int, int, int]]:
        """Feature levels (KIP-584, ApiVersions v3): name -> (supported min, supported max,
        finalized level; 0 when not finalized)."""
        resp = await (await self._any()).request(ApiKey.API_VERSIONS, {
            "client_software_name": "dcmirror", "client_software_version": "1"}, version=3)
        if resp.error_code != 0:
            raise AdminError("describing features", resp.error_code)
        finalized = {f.name: int(f.max_version_level) for f in resp.finalized_features}
        return {f.name: (int(f.min_version), int(f.max_version), finalized.get(f.name, 0))
                for f in resp.supported_features}

    @_retried
    async def update_features(self, levels: Mapping[str, int], *, downgrade: str | None = None,
                              validate_only: bool = False) -> None:
        """UpdateFeatures: finalize `levels` (all or nothing). `downgrade` "safe" or "unsafe"
        allows lowering a level."""
        kind = {None: 1, "safe": 2, "unsafe": 3}[downgrade]
        resp = await (await self._any()).request(ApiKey.UPDATE_FEATURES, {
            "timeout": 30_000, "validate_only": validate_only,
            "feature_updates": [{"feature": name, "max_version_level": level, "upgrade_type": kind}
                                for name, level in levels.items()]})
        if resp.error_code != 0:
            raise AdminError(f"updating features ({resp.error_message or ''})", resp.error_code)
        for r in resp.results:
            if r.error_code != 0:
                raise AdminError(f"updating feature {r.feature} ({r.error_message or ''})", r.error_code)

    @_retried
    async def alter_reassignments(self, targets: dict[tuple[str, int], list[int] | None]) -> dict[tuple[str, int], tuple[int, str]]:
        """Start (replicas) or cancel (None) reassignments; (error code, message) per partition."""
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (t, p), replicas in sorted(targets.items()):
            by_topic.setdefault(t, []).append({"partition_index": p, "replicas": replicas})
        resp = await (await self._any()).request(ApiKey.ALTER_PARTITION_REASSIGNMENTS, {"timeout": 30_000, "topics": [
            {"name": t, "partitions": ps} for t, ps in by_topic.items()]})
        if resp.error_code != 0:
            raise AdminError(f"reassigning partitions ({resp.error_message or ''})", resp.error_code)
        return {(t.name, p.partition_index): (int(p.error_code), p.error_message or "")
                for t in resp.responses for p in t.partitions}

    @_retried
    async def list_reassignments(self) -> dict[tuple[str, int], tuple[list[int], list[int], list[int]]]:
        """(replicas, adding, removing) of every partition being moved."""
        resp = await (await self._any()).request(ApiKey.LIST_PARTITION_REASSIGNMENTS, {"timeout": 30_000, "topics": None})
        if resp.error_code != 0:
            raise AdminError("listing reassignments", resp.error_code)
        return {(t.name, p.partition_index): (list(p.replicas), list(p.adding_replicas), list(p.removing_replicas))
                for t in resp.topics for p in t.partitions}

    # ---- groups ----------------------------------------------------------------------

    async def list_transactions(self) -> list[tuple[str, int, int, str]]:
        """Every broker's transactional ids (ListTransactions): (id, coordinator node,
        producer id, state)."""
        md = await self.metadata([])
        rows = []
        for b in sorted(md.brokers, key=lambda b: b.node_id):
            conn = await self._conn(b.host, b.port)
            resp = await conn.request(ApiKey.LIST_TRANSACTIONS, {"state_filters": [], "producer_id_filters": [],
                                                                 "duration_filter": -1})
            if resp.error_code:
                raise KafkaError(f"ListTransactions on broker {b.node_id}", resp.error_code)
            rows += [(s.transactional_id, b.node_id, s.producer_id, s.transaction_state)
                     for s in resp.transaction_states]
        return rows

    async def transaction_coordinator(self, txn_id: str, *, retry_s: float = 0.3) -> BrokerConnection:
        """The connection to the transactional id's coordinator (FindCoordinator, asked again
        while none is available: bound it with a cancel scope)."""
        while True:
            conn = await self.cluster.any_connection()
            resp = await conn.request(ApiKey.FIND_COORDINATOR, {"key": txn_id, "key_type": COORDINATOR_TRANSACTION})
            if resp.error_code == ErrorCode.none:
                return await self._conn(resp.host, resp.port)
            if resp.error_code != ErrorCode.coordinator_not_available:
                raise KafkaError(f"finding the coordinator of {txn_id}", resp.error_code)
            await trio.sleep(retry_s)

    async def fence_transactional_id(self, txn_id: str, *, retry_s: float = 0.3) -> tuple[int, int]:
        """InitProducerId under the id, as a new producer instance would (Admin.fenceProducers):
        the coordinator completes a transaction preparing to commit or abort, aborts one
        still open (answering CONCURRENT_TRANSACTIONS meanwhile) and bumps the epoch, so the
        old producer is fenced. Returns (producer id, new epoch); bound it with a cancel scope."""
        while True:
            conn = await self.transaction_coordinator(txn_id, retry_s=retry_s)
            resp = await conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": txn_id,
                                                                "transaction_timeout": 60_000})
            if resp.error_code == ErrorCode.none:
                return resp.producer_id, resp.producer_epoch
            if resp.error_code not in (ErrorCode.concurrent_transactions, ErrorCode.not_coordinator,
                                       ErrorCode.coordinator_not_available, ErrorCode.coordinator_load_in_progress):
                raise KafkaError(f"fencing {txn_id}", resp.error_code)
            await trio.sleep(retry_s)

    @_retried
    async def list_groups(self) -> list[tuple[str, str, str]]:
        """(group id, protocol type, state) for every group of the cluster (asks every broker)."""
        meta = await self.metadata([])
        listed: list[Any] = []
        for b in meta.brokers:
            conn = await self._conn(b.host, b.port)
            resp = await conn.request(ApiKey.LIST_GROUPS, {})
            if resp.error_code != 0:
                raise AdminError(f"listing groups on broker {b.node_id}", resp.error_code)
            listed.extend(resp.groups)
        groups = [g.group_id for g in listed]
        described = {g.group_id: g for g in (await self.describe_groups(groups) if groups else [])}
        return [(g.group_id, g.protocol_type, described[g.group_id].group_state if g.group_id in described else "")
                for g in listed]

    @_retried
    async def group_ids(self) -> list[str]:
        """The id of every group of the cluster (ListGroups on every broker), sorted, without
        describing them (list_groups does, one request per group)."""
        meta = await self.metadata([])
        ids: set[str] = set()
        for b in meta.brokers:
            resp = await (await self._conn(b.host, b.port)).request(ApiKey.LIST_GROUPS, {})
            if resp.error_code != 0:
                raise AdminError(f"listing groups on broker {b.node_id}", resp.error_code)
            ids.update(g.group_id for g in resp.groups)
        return sorted(ids)

    @_retried
    async def describe_groups(self, groups: list[str]) -> list[Any]:
        out = []
        for group_id in groups:
            conn = await self.coordinator(group_id)
            resp = await conn.request(ApiKey.DESCRIBE_GROUPS, {"groups": [group_id], "include_authorized_operations": False})
            out.extend(resp.groups)
        return out

    @_retried
    async def list_share_groups(self) -> list[tuple[str, str]]:
        """(group id, state) of every share group of the cluster (KIP-932): ListGroups v5
        with the type filter "share" on every broker, sorted."""
        meta = await self.metadata([])
        found: dict[str, str] = {}
        for b in meta.brokers:
            conn = await self._conn(b.host, b.port)
            if conn.versions.get(ApiKey.LIST_GROUPS, (0, 0))[1] < 5:
                continue  # a broker older than share groups holds none
            resp = await conn.request(ApiKey.LIST_GROUPS, {"states_filter": [], "types_filter": ["share"]}, version=5)
            if resp.error_code != 0:
                raise AdminError(f"listing share groups on broker {b.node_id}", resp.error_code)
            found.update((g.group_id, g.group_state) for g in resp.groups)
        return sorted(found.items())

    @_retried
    async def describe_share_group(self, group_id: str) -> Any:
        """ShareGroupDescribe v1 of one share group: state, epochs, each member and its
        assignment. AdminError GROUP_ID_NOT_FOUND when it is no share group."""
        conn = await self.coordinator(group_id)
        if ApiKey.SHARE_GROUP_DESCRIBE not in conn.versions:
            raise AdminError(f"describing share group {group_id!r}: the broker has no share groups",
                             ErrorCode.unsupported_version)
        resp = await conn.request(ApiKey.SHARE_GROUP_DESCRIBE,
                                  {"group_ids": [group_id], "include_authorized_operations": False}, version=1)
        (group,) = resp.groups
        if group.error_code != 0:
            raise AdminError(f"describing share group {group_id!r}", group.error_code)
        return group

    @_retried
    async def share_group_offsets(self, group_id: str, topics: Mapping[str, Sequence[int]] | None = None
                                  ) -> list[SharePartitionOffset]:
        """DescribeShareGroupOffsets (v1, with lag) of one group: the share partitions of
        `topics` (topic -> partitions), or every one the group initialized (None), sorted.
        AdminError for the group's own error."""
        conn = await self.coordinator(group_id)
        if ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS not in conn.versions:
            raise AdminError(f"describing share group {group_id!r}'s offsets: the broker does not serve it",
                             ErrorCode.unsupported_version)
        asked = None if topics is None else [{"topic_name": t, "partitions": list(ps)} for t, ps in topics.items()]
        version = min(1, conn.versions[ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS][1])
        resp = await conn.request(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS,
                                  {"groups": [{"group_id": group_id, "topics": asked}]}, version=version)
        (group,) = resp.groups
        if group.error_code != 0:
            raise AdminError(f"describing share group {group_id!r}'s offsets", group.error_code)
        return sorted(SharePartitionOffset(t.topic_name, p.partition_index, p.start_offset, p.leader_epoch,
                                           getattr(p, "lag", -1), p.error_code)
                      for t in group.topics for p in t.partitions)

    @_retried
    async def alter_share_group_offsets(self, group_id: str, offsets: Mapping[tuple[str, int], int]
                                        ) -> dict[tuple[str, int], int]:
        """AlterShareGroupOffsets: the share partitions start again at these offsets (the
        group must have no members). The error code per partition; AdminError for the
        group's (NON_EMPTY_GROUP while members are in)."""
        conn = await self.coordinator(group_id)
        topics: dict[str, list[dict[str, int]]] = {}
        for (t, p), offset in sorted(offsets.items()):
            topics.setdefault(t, []).append({"partition_index": p, "start_offset": offset})
        resp = await conn.request(ApiKey.ALTER_SHARE_GROUP_OFFSETS, {
            "group_id": group_id, "topics": [{"topic_name": t, "partitions": ps} for t, ps in topics.items()]},
            version=0)
        if resp.error_code != 0:
            raise AdminError(f"altering share group {group_id!r}'s offsets", resp.error_code)
        return {(t.topic_name, p.partition_index): p.error_code for t in resp.responses for p in t.partitions}

    @_retried
    async def delete_share_group_offsets(self, group_id: str, topics: Sequence[str]) -> dict[str, tuple[int, str | None]]:
        """DeleteShareGroupOffsets: the group's share partitions of these topics go (the
        group must have no members). (error code, message) per topic; AdminError for the
        group's."""
        conn = await self.coordinator(group_id)
        resp = await conn.request(ApiKey.DELETE_SHARE_GROUP_OFFSETS, {
            "group_id": group_id, "topics": [{"topic_name": t} for t in dict.fromkeys(topics)]}, version=0)
        if resp.error_code != 0:
            raise AdminError(f"deleting share group {group_id!r}'s offsets", resp.error_code)
        return {t.topic_name: (t.error_code, t.error_message) for t in resp.responses}

    @_retried
    async def describe_consumer_group(self, group_id: str) -> Any | None:
        """KIP-848's view of a consumer-protocol group (ConsumerGroupDescribe): epochs, the
        assignor, each member's current and target assignment. None for a classic group or
        none at all (GROUP_ID_NOT_FOUND), or a broker without the API."""
        conn = await self.coordinator(group_id)
        if ApiKey.CONSUMER_GROUP_DESCRIBE not in conn.versions:
            return None
        resp = await conn.request(ApiKey.CONSUMER_GROUP_DESCRIBE,
                                  {"group_ids": [group_id], "include_authorized_operations": False})
        (group,) = resp.groups
        if group.error_code == ErrorCode.group_id_not_found:
            return None
        if group.error_code != 0:
            raise AdminError(f"describing consumer group {group_id!r}", group.error_code)
        return group

    @_retried
    async def committed_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        conn = await self.coordinator(group_id)
        resp = await conn.request(ApiKey.OFFSET_FETCH, {"group_id": group_id, "topics": None})
        if resp.error_code != 0:
            raise AdminError(f"fetching offsets of group {group_id!r}", resp.error_code)
        return {(t.name, p.partition_index): p.committed_offset
                for t in resp.topics for p in t.partitions if p.committed_offset >= 0}

    @_retried
    async def describe_group_lag(self, group_id: str) -> tuple[Any, list[PartitionLag]]:
        (group,) = await self.describe_groups([group_id])
        owners: dict[tuple[str, int], tuple[str, str, str]] = {}
        for m in group.members:
            try:
                assigned = decode_assignment(bytes(m.member_assignment))
            except ValueError:
                assigned = []  # a foreign protocol's assignment: no owner shown
            for tp in assigned:
                owners[tp] = (m.member_id, m.client_id, m.client_host)
        committed = await self.committed_offsets(group_id)
        partitions = sorted(set(committed) | set(owners))
        ends = await self.list_offsets(partitions, LATEST) if partitions else {}
        rows = [
            PartitionLag(t, p, committed.get((t, p)), ends[(t, p)], *owners.get((t, p), ("-", "-", "-")))
            for t, p in partitions
        ]
        return group, rows

    @_retried
    async def commit_offsets(self, group_id: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit as an admin (no generation): the group must have no active members."""
        conn = await self.coordinator(group_id)
        topics: dict[str, list[dict[str, Any]]] = {}
        for (t, p), off in sorted(offsets.items()):
            topics.setdefault(t, []).append({"partition_index": p, "committed_offset": off,
                                             "committed_leader_epoch": -1, "committed_metadata": ""})
        resp = await conn.request(ApiKey.OFFSET_COMMIT, {"group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
                                      "group_instance_id": None, "retention_time": -1,
                                      "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code != 0:
                    raise AdminError(f"committing {t.name}-{p.partition_index} for group {group_id!r}", p.error_code)

    @_retried
    async def delete_group_offsets(self, group_id: str, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """OffsetDelete: the group's committed offsets of `partitions` go; the error code per
        partition (GROUP_SUBSCRIBED_TO_TOPIC while members consume the topic). AdminError
        for the group's own error."""
        conn = await self.coordinator(group_id)
        topics: dict[str, list[dict[str, Any]]] = {}
        for t, p in partitions:
            topics.setdefault(t, []).append({"partition_index": p})
        resp = await conn.request(ApiKey.OFFSET_DELETE, {
            "group_id": group_id, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
        if resp.error_code != 0:
            raise AdminError(f"deleting offsets of group {group_id!r}", resp.error_code)
        return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}

    @_retried
    async def delete_group(self, group_id: str) -> None:
        conn = await self.coordinator(group_id)
        resp = await conn.request(ApiKey.DELETE_GROUPS, {"groups_names": [group_id]})
        for r in resp.results:
            if r.error_code != 0:
                raise AdminError(f"deleting group {group_id!r}", r.error_code)

    # ---- users (SCRAM) and ACLs ---------------------------------------------------------------

    @_retried
    async def alter_scram_credentials(self, upsertions: list[tuple[str, str, int, bytes, bytes]],
                                      deletions: list[tuple[str, str]]) -> dict[str, tuple[int, str | None]]:
        """upsertions: (user, mechanism, iterations, salt, salted password); deletions:
        (user, mechanism). The password never leaves this process: only its salted form."""
        body = {"upsertions": [{"name": n, "mechanism": MECHANISM_TYPES[m], "iterations": i, "salt": s,
                                "salted_password": sp} for n, m, i, s, sp in upsertions],
                "deletions": [{"name": n, "mechanism": MECHANISM_TYPES[m]} for n, m in deletions]}
        resp = await (await self._any()).request(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, body)
        return {r.user: (int(r.error_code), r.error_message) for r in resp.results}

    async def set_scram_password(self, user: str, password: bytes, mechanisms: Sequence[str] = tuple(MECHANISM_TYPES),
                                 iterations: int = DEFAULT_ITERATIONS) -> dict[str, tuple[int, str | None]]:
        """The user's credential for each mechanism, from a fresh salt (as kafka-configs
        --add-config 'SCRAM-SHA-512=[password=...]'); only the salted password is sent."""
        check_iterations(iterations)
        ups = []
        for mechanism in mechanisms:
            salt = secrets.token_bytes(32)
            ups.append((user, mechanism, iterations, salt, salted_password(mechanism, password, salt, iterations)))
        return await self.alter_scram_credentials(ups, [])

    @_retried
    async def describe_scram_credentials(self, users: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
        resp = await (await self._any()).request(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, {
            "users": None if users is None else [{"name": u} for u in users]})
        if resp.error_code != 0:
            raise AdminError("describing SCRAM users", resp.error_code)
        names = {v: k for k, v in MECHANISM_TYPES.items()}
        out = {}
        for r in resp.results:
            if r.error_code != 0:
                raise AdminError(f"describing user {r.user!r}", r.error_code)
            out[r.user] = [(names.get(i.mechanism, str(i.mechanism)), int(i.iterations)) for i in r.credential_infos]
        return out

    @_retried
    async def create_acls(self, bindings: list[AclBinding]) -> None:
        resp = await (await self._any()).request(ApiKey.CREATE_ACLS, {"creations": [
            {"resource_type": int(b.resource_type), "resource_name": b.resource_name,
             "resource_pattern_type": int(b.pattern_type), "principal": b.principal, "host": b.host,
             "operation": int(b.operation), "permission_type": int(b.permission)} for b in bindings]})
        for b, r in zip(bindings, resp.results, strict=False):
            if r.error_code != 0:
                raise AdminError(f"creating ACL {b} ({r.error_message})", r.error_code)

    @staticmethod
    def _filter_body(f: AclFilter) -> dict[str, Any]:
        return {"resource_type_filter": int(f.resource_type), "resource_name_filter": f.resource_name,
                "pattern_type_filter": int(f.pattern_type), "principal_filter": f.principal, "host_filter": f.host,
                "operation": int(f.operation), "permission_type": int(f.permission)}

    @_retried
    async def describe_acls(self, f: AclFilter) -> list[AclBinding]:
        resp = await (await self._any()).request(ApiKey.DESCRIBE_ACLS, self._filter_body(f))
        if resp.error_code != 0:
            raise AdminError(f"describing ACLs ({resp.error_message})", resp.error_code)
        return [AclBinding(ResourceType(r.resource_type), r.resource_name, PatternType(r.pattern_type), a.principal,
                           a.host, AclOperation(a.operation), AclPermissionType(a.permission_type))
                for r in resp.resources for a in r.acls]

    async def delete_acls(self, filters: list[AclFilter]) -> list[AclBinding]:
        resp = await (await self._any()).request(ApiKey.DELETE_ACLS, {"filters": [self._filter_body(f)
                                                                                  for f in filters]})
        out = []
        for r in resp.filter_results:
            if r.error_code != 0:
                raise AdminError(f"deleting ACLs ({r.error_message})", r.error_code)
            out += [AclBinding(ResourceType(m.resource_type), m.resource_name, PatternType(m.pattern_type),
                               m.principal, m.host, AclOperation(m.operation), AclPermissionType(m.permission_type))
                    for m in r.matching_acls]
        return out

    # ---- client quotas (as kafka-configs --entity-type users/clients) ------------------------

    @_retried
    async def describe_client_quotas(self, components: Sequence[tuple[str, int, str | None]] = (), *,
                                     strict: bool = False) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
        """Quotas of the entities the filter matches: (entity type, match type, name) with
        match type 0 exact, 1 the default entity, 2 any name. Entities are (type, name)
        pairs sorted by type, None naming the default."""
        resp = await (await self._any()).request(ApiKey.DESCRIBE_CLIENT_QUOTAS, {
            "components": [{"entity_type": t, "match_type": m, "match": n} for t, m, n in components],
            "strict": strict})
        if resp.error_code != 0:
            raise AdminError(f"describing client quotas ({resp.error_message})", resp.error_code)
        return {tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)):
                {v.key: float(v.value) for v in entry.values} for entry in resp.entries or ()}

    @_retried
    async def alter_client_quotas(self, entries: Sequence[tuple[Mapping[str, str | None], Mapping[str, float | None]]],
                                  *, validate_only: bool = False) -> None:
        """Set (a value) or remove (None) quota keys of entities ({entity type: name or None
        for the default}); the first refused entity raises AdminError with the broker's message."""
        resp = await (await self._any()).request(ApiKey.ALTER_CLIENT_QUOTAS, {"entries": [
            {"entity": [{"entity_type": t, "entity_name": n} for t, n in entity.items()],
             "ops": [{"key": k, "value": 0.0 if v is None else float(v), "remove": v is None} for k, v in ops.items()]}
            for entity, ops in entries], "validate_only": validate_only})
        for r in resp.entries:
            if r.error_code != 0:
                entity = ", ".join(f"{e.entity_type}={e.entity_name if e.entity_name is not None else '<default>'}"
                                   for e in r.entity)
                raise AdminError(f"altering client quotas of {entity} ({r.error_message})", r.error_code)


def _resource_text(resource_type: int, name: str) -> str:
    if resource_type == CONFIG_RESOURCE_GROUP:
        return f"group {name!r}"
    if resource_type == RESOURCE_BROKER:
        return f"broker {name}" if name else "the brokers' cluster-wide default"
    return f"{name!r}"
