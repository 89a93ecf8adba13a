"""What every client needs from a cluster: bootstrap, a metadata cache (brokers, partition
leaders and leader epochs) and one pipelined connection per broker, reconnected with backoff.

Producer, consumer and admin share this; it never retries requests itself (callers own
their retry policy), but it does refresh metadata when they report a stale leader.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from cluster.client.config import ClientConfig
from cluster.client.connection import (
    BrokerConnection,
    KafkaAuthenticationError,
    KafkaConnectionError,
    parse_bootstrap,
)
from cluster.client.errors import METADATA_ERRORS, KafkaError, KafkaTimeoutError
from cluster.common.backoff import Backoff
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.sentinels import COORDINATOR_GROUP
from cluster.security.connector import LinkSecurity

log = logging.getLogger("dcmirror.client")

# leader_request: tries before the last error is raised (each after a metadata refresh).
LEADER_ATTEMPTS = 5
# partitions_request: partitions named in one request (bounds its answer).
PARTITIONS_PER_REQUEST = 1_000
TopicPartition = tuple[str, int]
BOOTSTRAP_NODE_BASE = -1000  # bootstrap addresses before their node ids are known


@dataclass(slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader: int  # -1: no leader right now
    leader_epoch: int
    replicas: list[int]
    isr: list[int]
    error_code: int = 0


@dataclass(slots=True)
class TopicInfo:
    name: str
    error_code: int
    partitions: dict[int, PartitionInfo] = field(default_factory=dict)
    topic_id: uuid.UUID | None = None  # KIP-516 (Metadata v10+; None from older brokers)


class ClusterMetadata:
    """Brokers, topics and leaders as the last Metadata answer described them."""

    def __init__(self) -> None:
        self.brokers: dict[int, tuple[str, int]] = {}
        self.topics: dict[str, TopicInfo] = {}
        self.controller_id = -1
        self.cluster_id: str | None = None
        self.updated_s = -1e18

    def update(self, response: Any, now_s: float, *, all_topics: bool) -> None:
        self.brokers = {b.node_id: (b.host, b.port) for b in response.brokers}
        self.controller_id = getattr(response, "controller_id", -1)
        self.cluster_id = getattr(response, "cluster_id", None)
        if all_topics:
            self.topics = {}
        for t in response.topics:
            topic_id = getattr(t, "topic_id", None)
            info = TopicInfo(t.name, t.error_code, topic_id=topic_id if topic_id and topic_id.int else None)
            for p in t.partitions:
                info.partitions[p.partition_index] = PartitionInfo(
                    t.name, p.partition_index, p.leader_id, getattr(p, "leader_epoch", -1),
                    list(p.replica_nodes), list(p.isr_nodes), p.error_code)
            self.topics[t.name] = info
        self.updated_s = now_s

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        if info is None or info.error_code != 0 or not info.partitions:
            return None
        return len(info.partitions)

    def topic_id(self, topic: str) -> uuid.UUID | None:
        info = self.topics.get(topic)
        return None if info is None or info.error_code != 0 else info.topic_id

    def leader(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        p = info.partitions.get(partition) if info else None
        return -1 if p is None else p.leader


class ClientCluster:
    """Connections and metadata for one cluster, shared by a client's tasks."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.bootstrap = parse_bootstrap(config["bootstrap.servers"])
        self.client_id: str = config["client.id"]
        self.link = LinkSecurity.from_config(config.as_dict())  # TLS and SASL of every connection
        self.metadata = ClusterMetadata()
        # One connection per (broker, lane): group coordination gets its own lane so that
        # heartbeats and commits never queue behind a long-polling Fetch (a broker answers a
        # connection's requests in order), as the Java client keeps a coordinator connection.
        self._connections: dict[tuple[int, str], BrokerConnection] = {}
        self._connect_locks: dict[tuple[int, str], trio.Lock] = {}
        self._reconnect_after_s: dict[int, float] = {}
        self._reconnect_backoff: dict[int, Backoff] = {}
        self._wanted_topics: set[str] = set()
        self._all_topics = False
        self._refresh_lock = trio.Lock()
        self._refreshed = trio.Event()
        self._refresh_error: Exception | None = None
        # The topics the latest Metadata request named (None: all topics).
        self.asked_topics: set[str] | None = set()
        # Told of every Metadata answer taken, whichever task asked for it (on_update).
        self._listeners: list[Callable[[], None]] = []
        self.closed = False

    # ---- connections --------------------------------------------------------------

    def address(self, node_id: int) -> tuple[str, int]:
        if node_id <= BOOTSTRAP_NODE_BASE:
            return self.bootstrap[BOOTSTRAP_NODE_BASE - node_id]
        if node_id not in self.metadata.brokers:
            raise KafkaConnectionError(f"broker {node_id} is not in the cluster metadata")
        return self.metadata.brokers[node_id]

    async def connection(self, node_id: int, lane: str = "data") -> BrokerConnection:
        """The connection to a broker (per lane: "data" or "group"), opened or reopened on
        demand with reconnect backoff."""
        key = (node_id, lane)
        conn = self._connections.get(key)
        if conn is not None and not conn.closed:
            return conn
        lock = self._connect_locks.setdefault(key, trio.Lock())
        async with lock:
            conn = self._connections.get(key)
            if conn is not None and not conn.closed:
                return conn
            wait_s = self._reconnect_after_s.get(node_id, 0.0) - trio.current_time()
            if wait_s > 0:
                await trio.sleep(wait_s)
            host, port = self.address(node_id)
            conn = BrokerConnection(host, port, client_id=self.client_id,
                                    max_in_flight=self.config["max.in.flight.requests.per.connection"],
                                    max_response_bytes=self.config["receive.message.max.bytes"], link=self.link)
            try:
                await conn.connect(self.config["socket.connection.setup.timeout.ms"] / 1000)
            except KafkaConnectionError:
                backoff = self._reconnect_backoff.get(node_id)
                if backoff is None:
                    backoff = self._reconnect_backoff[node_id] = Backoff(
                        self.config["reconnect.backoff.ms"] / 1000, self.config["reconnect.backoff.max.ms"] / 1000)
                self._reconnect_after_s[node_id] = trio.current_time() + backoff.next_delay_s()
                raise
            self._reconnect_backoff.pop(node_id, None)
            self._reconnect_after_s.pop(node_id, None)
            self._connections[key] = conn
            return conn

    def open_lanes(self) -> set[tuple[int, str]]:
        """(broker, lane) of every connection open now."""
        return {key for key, conn in self._connections.items() if not conn.closed}

    async def any_connection(self) -> BrokerConnection:
        """A connection to some broker: a live one, else each known broker, else bootstrap."""
        for conn in self._connections.values():
            if not conn.closed:
                return conn
        candidates = list(self.metadata.brokers)
        random.shuffle(candidates)
        candidates += [BOOTSTRAP_NODE_BASE - i for i in range(len(self.bootstrap))]
        errors: list[KafkaConnectionError] = []
        for node_id in candidates:
            try:
                return await self.connection(node_id)
            except KafkaConnectionError as exc:
                errors.append(exc)
        text = "; ".join(str(e) for e in errors)
        if any(isinstance(e, KafkaAuthenticationError) for e in errors):
            raise KafkaAuthenticationError(f"authentication failed: {text}")  # reachable, but refused us
        raise KafkaConnectionError("no broker of the cluster is reachable: " + text)

    async def aclose(self) -> None:
        self.closed = True
        for conn in self._connections.values():
            await conn.aclose()
        self._connections.clear()

    # ---- metadata -----------------------------------------------------------------

    def on_update(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after every Metadata answer this cluster takes, whoever asked
        for it: the tasks sharing a cluster refresh it at their own times (a consumer's
        metadata task, its group's heartbeat loop, a failed fetch, a position lookup), and
        each refresh keeps the others from finding the metadata stale."""
        self._listeners.append(listener)

    def want_topics(self, topics: set[str] | None) -> None:
        """Topics to keep metadata for (None: all topics, for pattern subscriptions)."""
        if topics is None:
            self._all_topics = True
        else:
            self._wanted_topics |= topics

    async def refresh(self, topics: set[str] | None = None) -> ClusterMetadata:
        """Ask any broker for metadata of the wanted topics (plus `topics`). A caller that comes
        while a request is out shares it if it names all of `topics`; else it waits for it and
        then asks again (that answer would not have them)."""
        if topics:
            self._wanted_topics |= topics
        while self._refresh_lock.locked():
            event = self._refreshed
            asked = self.asked_topics
            shared = asked is None or not topics or topics <= asked
            await event.wait()
            if shared:
                if self._refresh_error is not None:
                    raise self._refresh_error  # the shared request failed: so did ours
                return self.metadata
        async with self._refresh_lock:
            self._refresh_error = None
            all_topics = self._all_topics
            names = None if all_topics else sorted(self._wanted_topics)
            self.asked_topics = None if names is None else set(names)
            try:
                conn = await self.any_connection()
                asked_at = trio.current_time()
                body = {"topics": None if names is None else [{"name": t} for t in names],
                        "allow_auto_topic_creation": False,
                        "include_cluster_authorized_operations": False,
                        "include_topic_authorized_operations": False}
                resp = await conn.request(ApiKey.METADATA, body, timeout_s=self.config["request.timeout.ms"] / 1000)
                took_s = trio.current_time() - asked_at
                if took_s > 1.0:
                    log.debug("metadata from %s took %.1f s", conn.address, took_s)
                before = _leaders(self.metadata) if log.isEnabledFor(logging.DEBUG) else None
                self.metadata.update(resp, trio.current_time(), all_topics=all_topics)
                if before is not None:
                    after = _leaders(self.metadata)
                    moved = sorted(f"{t}-{p}: {before.get((t, p))} -> {le}" for (t, p), le in after.items()
                                   if before.get((t, p)) != le)
                    if moved:
                        more = f"; and {len(moved) - 20} more" if len(moved) > 20 else ""
                        log.debug("metadata from %s: leader (epoch) of %s%s", conn.address, "; ".join(moved[:20]), more)
                for listener in self._listeners:
                    listener()
            except (KafkaConnectionError, KafkaError) as exc:
                self._refresh_error = exc
                raise
            finally:
                event, self._refreshed = self._refreshed, trio.Event()
                event.set()
        return self.metadata

    def stale(self) -> bool:
        return trio.current_time() - self.metadata.updated_s > self.config["metadata.max.age.ms"] / 1000

    async def wait_for_topic(self, topic: str, timeout_s: float) -> int:
        """Partition count of `topic`, refreshing metadata with backoff until it exists."""
        count = self.metadata.partition_count(topic)
        if count is not None:
            return count
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        last_error: Exception | None = None
        with trio.move_on_after(timeout_s):
            while True:
                try:
                    meta = await self.refresh({topic})
                    count = meta.partition_count(topic)
                    if count is not None:
                        return count
                    info = meta.topics.get(topic)
                    last_error = KafkaError(f"topic {topic!r}", info.error_code if info else
                                            ErrorCode.unknown_topic_or_partition)
                except KafkaAuthenticationError:
                    raise  # wrong credentials: waiting will not help
                except KafkaConnectionError as exc:
                    last_error = exc
                await backoff.sleep()
        raise KafkaTimeoutError(f"topic {topic!r} unavailable after {timeout_s:g} s: {last_error}")

    async def coordinator(self, group_id: str, *, key_type: int = COORDINATOR_GROUP) -> int:
        """Node id of the group's coordinator (FindCoordinator); raises KafkaError."""
        conn = await self.any_connection()
        resp = await conn.request(ApiKey.FIND_COORDINATOR, {"key": group_id, "key_type": key_type},
                                  timeout_s=self.config["request.timeout.ms"] / 1000)
        if resp.error_code != 0:
            raise KafkaError(f"finding the coordinator of group {group_id!r}", resp.error_code)
        self.metadata.brokers.setdefault(resp.node_id, (resp.host, resp.port))
        return int(resp.node_id)

    async def leader_request(self, topic: str, partition: int, api_key: ApiKey, body: dict[str, Any]) -> Any:
        """A request about one partition, answered by its current leader (Fetch, ListOffsets,
        OffsetForLeaderEpoch with that one partition). On a moved leader (a metadata error
        in the answer) or a dead connection the metadata is refreshed and the request sent
        again, up to LEADER_ATTEMPTS times; then the last answer or error is the caller's."""
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        for attempt in range(LEADER_ATTEMPTS):
            last = attempt == LEADER_ATTEMPTS - 1
            leader = self.metadata.leader(topic, partition)
            if leader < 0 or attempt:
                await self.refresh({topic})
                leader = self.metadata.leader(topic, partition)
                info = self.metadata.topics.get(topic)
                if info is not None and info.error_code in (ErrorCode.topic_authorization_failed,
                                                            ErrorCode.invalid_topic_exception):
                    raise KafkaError(f"{topic}-{partition}", info.error_code)  # no retry will change it
                if leader < 0:
                    if last:
                        raise KafkaError(f"{topic}-{partition} has no leader", ErrorCode.leader_not_available)
                    await backoff.sleep()
                    continue
            try:
                conn = await self.connection(leader)
                resp = await conn.request(api_key, body)
            except KafkaConnectionError:
                if last:
                    raise
                await backoff.sleep()
                continue
            if _first_partition_error(api_key, resp) in METADATA_ERRORS and not last:
                await backoff.sleep()
                continue
            return resp
        raise AssertionError("unreachable")


    async def partitions_request(
            self, tps: Iterable[TopicPartition], api_key: ApiKey,
            body_of: Callable[[Sequence[TopicPartition]], dict[str, Any]],
            answers_of: Callable[[Any], Iterable[tuple[TopicPartition, int, Any]]], *,
            per_request: int = PARTITIONS_PER_REQUEST) -> dict[TopicPartition, tuple[int, Any]]:
        """leader_request for many partitions at once: each leader is asked about its
        partitions, up to `per_request` in one request (built by `body_of`); `answers_of`
        splits an answer into (partition, error code, entry). Partitions answered with a
        metadata error, without a leader or whose leader could not be reached are asked again
        after a refresh, up to LEADER_ATTEMPTS times; then their last error code stays (an
        unreachable leader raises the connection error). (error code, entry) per partition."""
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        out: dict[TopicPartition, tuple[int, Any]] = {}
        todo = list(dict.fromkeys(tps))
        for attempt in range(LEADER_ATTEMPTS):
            last = attempt == LEADER_ATTEMPTS - 1
            if attempt:
                await backoff.sleep()
                await self.refresh({t for t, _ in todo})
            by_leader: dict[int, list[TopicPartition]] = {}
            again: list[TopicPartition] = []
            for tp in todo:
                leader = self.metadata.leader(*tp)
                if leader < 0 and not attempt:
                    await self.refresh({t for t, _ in todo})
                    leader = self.metadata.leader(*tp)
                if leader < 0:
                    info = self.metadata.topics.get(tp[0])
                    code: int = ErrorCode.leader_not_available
                    if info is not None and info.error_code:
                        code = info.error_code
                    elif info is not None and info.partitions and tp[1] not in info.partitions:
                        code = ErrorCode.unknown_topic_or_partition
                    out[tp] = (code, None)
                    if code not in (ErrorCode.topic_authorization_failed, ErrorCode.invalid_topic_exception):
                        again.append(tp)
                    continue
                by_leader.setdefault(leader, []).append(tp)
            for leader, mine in by_leader.items():
                for i in range(0, len(mine), per_request):
                    part = mine[i:i + per_request]
                    try:
                        conn = await self.connection(leader)
                        resp = await conn.request(api_key, body_of(part))
                    except KafkaConnectionError:
                        if last:
                            raise
                        again.extend(part)
                        continue
                    answered = set()
                    for tp, code, entry in answers_of(resp):
                        answered.add(tp)
                        out[tp] = (code, entry)
                        if code in METADATA_ERRORS:
                            again.append(tp)
                    for tp in part:
                        if tp not in answered:
                            out[tp] = (ErrorCode.unknown_server_error, None)
            todo = again
            if not todo:
                break
        return out


def _leaders(meta: ClusterMetadata) -> dict[tuple[str, int], tuple[int, int]]:
    return {(t, p): (info.leader, info.leader_epoch) for t, ti in meta.topics.items() for p, info in ti.partitions.items()}


def _first_partition_error(api_key: ApiKey, resp: Any) -> int:
    """The error code of the one partition a leader request asked about."""
    try:
        if api_key == ApiKey.LIST_OFFSETS:
            return int(resp.topics[0].partitions[0].error_code)
        if api_key == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            return int(resp.topics[0].partitions[0].error_code)
        return int(resp.responses[0].partitions[0].error_code)
    except (IndexError, AttributeError):
        return 0
