"""The trio shell around the share coordinator (cluster/groups/share_coordinator.py), and the
share-partition leaders' way to it (Kafka's persister).

A broker is the share coordinator of the share partitions whose `__share_group_state`
partition it leads (partition = abs(java hash of "group:topicId:partition") % partitions,
`share.coordinator.state.topic.num.partitions`). Every decision's record is appended there
and waits for the in-sync replicas (as acks=all) before the call is answered; a broker that
becomes leader of a state partition replays it. The topic is created on first use with
`share.coordinator.state.topic.replication.factor` replicas (capped by the cluster's size),
compacted, no unclean leader election.

`read_state`/`write_state` are what a share-partition leader calls: the coordinator
directly when it is this broker, else ReadShareGroupState/WriteShareGroupState to the
broker that is.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from cluster.client.broker_channel import BrokerChannel
from cluster.common.clock import Clock
from cluster.controller.image import MetadataImage
from cluster.groups.share_coordinator import Decision, ShareCoordinator
from cluster.groups.share_partition import RecordState, StateBatch
from cluster.groups.share_state_records import (
    SHARE_STATE_TOPIC,
    STATE_BATCHES_MAX,
    ShareKey,
    ShareStateValue,
    delivery_complete_count,
    encode_key,
    encode_value,
    replay,
    state_partition_for,
)
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.records import Record, encode_batch
from cluster.replication.internal_topic import CreateTopics, InternalTopic, InternalTopicSpec
from cluster.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

_RPC_TIMEOUT_S = 10.0  # a share-state call to another broker's coordinator


@dataclass(frozen=True, slots=True)
class StateSummary:
    """ReadShareGroupStateSummary's answer for one share partition."""

    state_epoch: int
    leader_epoch: int
    start_offset: int  # -1: initialized, not started by a leader yet
    delivery_complete_count: int  # settled records in flight (-1: not known)


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ShareStateTopicSettings:
    """How `__share_group_state` is created (Kafka's share.coordinator.state.topic.* configs)."""

    num_partitions: int = 50  # share.coordinator.state.topic.num.partitions
    replication_factor: int = 3  # share.coordinator.state.topic.replication.factor (capped by brokers)
    min_isr: int = 2  # share.coordinator.state.topic.min.isr
    segment_bytes: int = 104_857_600  # share.coordinator.state.topic.segment.bytes
    write_timeout_ms: int = 5000  # a state record waits this long for the in-sync replicas


# What a call answers when its record could not be written or replicated.
_APPEND_ERRORS: dict[int, ErrorCode] = {
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.unknown_topic_or_partition: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
}


class ShareStateService:
    def __init__(self, coordinator: ShareCoordinator, replicas: ReplicaManager, settings: ShareStateTopicSettings,
                 *, clock: Clock, image: Callable[[], MetadataImage], cluster_size: Callable[[], int],
                 create_topics: CreateTopics) -> None:
        self.coordinator = coordinator
        self.replicas = replicas
        self.settings = settings
        self.clock = clock
        self._image = image
        self.state_topic = InternalTopic(
            InternalTopicSpec(SHARE_STATE_TOPIC, settings.num_partitions, settings.replication_factor,
                              settings.segment_bytes, min_isr=settings.min_isr,
                              extra_configs={"unclean.leader.election.enable": "false"}),
            image=image, cluster_size=cluster_size, create_topics=create_topics)
        self._owned: set[int] = set()
        self._opened = False
        self._locks: dict[int, trio.Lock] = {}  # one decision at a time per state partition
        self.brokers = BrokerChannel(replicas.broker_address, client_id=f"share-persister-{replicas.node_id}",
                                     link=replicas.settings.fetcher.link)

    @property
    def image(self) -> MetadataImage:
        return self._image()

    @property
    def num_partitions(self) -> int:
        return self.state_topic.num_partitions

    # ---- ownership ----------------------------------------------------------------------

    def open(self) -> None:
        self._opened = True
        self.on_partitions_changed()

    def on_partitions_changed(self) -> None:
        if not self._opened:
            return
        led = self.state_topic.led(self.replicas)
        for index in sorted(self._owned - led):
            n = self.coordinator.unload(lambda k, i=index: self.partition_of(k) == i)  # type: ignore[misc]
            log.log(logging.INFO if n else logging.DEBUG, "no longer the share coordinator of %d share "
                    "partition(s) of %s-%d", n, SHARE_STATE_TOPIC, index)
        for index in sorted(led - self._owned):
            part = self.replicas.partitions[(SHARE_STATE_TOPIC, index)]
            states = replay(part.log.replay_records()[0])
            self.coordinator.load(states)
            if states:
                log.info("loaded %d share partition state(s) from %s-%d", len(states), SHARE_STATE_TOPIC, index)
        self._owned = led

    def partition_of(self, key: ShareKey) -> int:
        return state_partition_for(key, self.num_partitions)

    def owns(self, key: ShareKey) -> bool:
        return self.partition_of(key) in self._owned

    @staticmethod
    def parse_key(key: str) -> ShareKey | None:
        """A FindCoordinator key of type SHARE, "group:topicId:partition" (None: not one)."""
        try:
            group_and_topic, partition = key.rsplit(":", 1)
            group, topic_id = group_and_topic.rsplit(":", 1)
            index = int(partition)
        except ValueError:
            return None
        if not group or index < 0:
            return None
        try:  # Kafka writes a topic id in base64 (Uuid.toString), dcmirror's image as a UUID
            canonical = str(uuid.UUID(topic_id)) if len(topic_id) != 22 else \
                str(uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "==")))
        except ValueError:
            return None
        return ShareKey(group, canonical, index)

    async def find_coordinator(self, key: str) -> int | None:
        """FindCoordinator key type SHARE: "group:topicId:partition"."""
        share_key = self.parse_key(key)
        if share_key is None:
            return None
        return await self._coordinator_node(share_key)

    # ---- the coordinator's side: decide, persist, apply ----------------------------------

    def _known(self, key: ShareKey) -> bool:
        topic = self.image.topics.get(key.topic_id)
        return topic is not None and 0 <= key.partition < len(topic.partitions)

    async def execute(self, key: ShareKey, decide: Callable[[ShareCoordinator], Decision]) -> Decision:
        """One call at this coordinator: decided, its record appended and replicated, then applied."""
        if not self.owns(key):
            return Decision(ErrorCode.not_coordinator, "this broker is not the share partition's coordinator")
        if not self._known(key):
            return Decision(ErrorCode.unknown_topic_or_partition, f"no partition {key.partition} of topic id "
                            f"{key.topic_id}")
        index = self.partition_of(key)
        async with self._locks.setdefault(index, trio.Lock()):
            if not self.owns(key):
                return Decision(ErrorCode.not_coordinator, "this broker is no longer the share coordinator")
            decision = decide(self.coordinator)
            if decision.error != ErrorCode.none or decision.record is None:
                return decision
            record = decision.record
            value = None if record.value is None else encode_value(record.value)
            batch = encode_batch([Record(0, self.clock.now_ms(), encode_key(record.key), value, ())])
            answer = self.replicas.append(SHARE_STATE_TOPIC, index, batch, min_isr_checked=True)
            if answer["error_code"] == ErrorCode.none:
                await self.replicas.wait_for_acks_all([{"name": SHARE_STATE_TOPIC, "partition_responses": [answer]}],
                                                      self.settings.write_timeout_ms / 1000)
            code = answer["error_code"]
            if code != ErrorCode.none:
                log.warning("writing the share state of %s to %s-%d: error %s", key.coordinator_key(),
                            SHARE_STATE_TOPIC, index, code)
                return Decision(_APPEND_ERRORS.get(code, ErrorCode.coordinator_not_available),
                                f"the share state could not be written ({ErrorCode(code).name})")
            self.coordinator.applied(record)
            return decision

    # ---- the share-partition leader's side (Kafka's persister) ---------------------------

    async def read_state(self, key: ShareKey, leader_epoch: int) -> tuple[int, ShareStateValue | None]:
        """ReadShareGroupState for a share partition this broker leads: (error, state)."""
        node = await self._coordinator_node(key)
        if node is None:
            return ErrorCode.coordinator_not_available, None
        if node == self.replicas.node_id:
            d = await self.execute(key, lambda c: c.read(key, leader_epoch))
            return d.error, d.state
        body = {"group_id": key.group_id, "topics": [{"topic_id": uuid.UUID(key.topic_id), "partitions": [
            {"partition": key.partition, "leader_epoch": leader_epoch}]}]}
        resp = await self.call(node, ApiKey.READ_SHARE_GROUP_STATE, body)
        if resp is None:
            return ErrorCode.coordinator_not_available, None
        for t in resp.results:
            for p in t.partitions:
                if p.error_code != ErrorCode.none:
                    return int(p.error_code), None
                if len(p.state_batches) > STATE_BATCHES_MAX:
                    return ErrorCode.unknown_server_error, None
                batches = tuple(StateBatch(int(b.first_offset), int(b.last_offset), RecordState(int(b.delivery_state)),
                                           int(b.delivery_count)) for b in p.state_batches)
                return ErrorCode.none, ShareStateValue(int(p.state_epoch), leader_epoch, int(p.start_offset), batches)
        return ErrorCode.unknown_server_error, None

    async def write_state(self, key: ShareKey, value: ShareStateValue) -> int:
        """WriteShareGroupState of a share partition's whole state: the error code."""
        node = await self._coordinator_node(key)
        if node is None:
            return ErrorCode.coordinator_not_available
        if node == self.replicas.node_id:
            d = await self.execute(key, lambda c: c.write(key, value.state_epoch, value.leader_epoch,
                                                          value.start_offset, value.batches))
            return d.error
        body = {"group_id": key.group_id, "topics": [{"topic_id": uuid.UUID(key.topic_id), "partitions": [
            {"partition": key.partition, "state_epoch": value.state_epoch, "leader_epoch": value.leader_epoch,
             "start_offset": value.start_offset,
             "state_batches": [{"first_offset": b.first_offset, "last_offset": b.last_offset,
                                "delivery_state": int(b.state), "delivery_count": b.delivery_count}
                               for b in value.batches]}]}]}
        resp = await self.call(node, ApiKey.WRITE_SHARE_GROUP_STATE, body)
        if resp is None:
            return ErrorCode.coordinator_not_available
        codes = [int(p.error_code) for t in resp.results for p in t.partitions]
        return codes[0] if codes else ErrorCode.unknown_server_error

    # ---- the group coordinator's side: summaries, initializations, deletions --------------

    async def summaries(self, group_id: str, keys: Iterable[ShareKey]) -> dict[ShareKey, tuple[int, StateSummary | None]]:
        """ReadShareGroupStateSummary of one group's share partitions: (error, summary; None
        for a share partition never initialized)."""
        def local(c: ShareCoordinator, k: ShareKey) -> Decision:
            return c.summary(k, -1)

        def part(k: ShareKey) -> dict[str, Any]:
            return {"partition": k.partition, "leader_epoch": -1}

        def answer(p: Any) -> StateSummary | None:
            if int(p.state_epoch) < 0 and int(p.start_offset) < 0:
                return None
            return StateSummary(int(p.state_epoch), int(p.leader_epoch), int(p.start_offset),
                                int(getattr(p, "delivery_complete_count", -1)))

        def summed(d: Decision) -> StateSummary | None:
            s = d.state
            return None if s is None else StateSummary(s.state_epoch, s.leader_epoch, s.start_offset,
                                                       delivery_complete_count(s))
        return await self._each_coordinator(group_id, keys, ApiKey.READ_SHARE_GROUP_STATE_SUMMARY, 1, local, part,
                                            answer, summed)

    async def initialize(self, group_id: str, starts: Mapping[ShareKey, tuple[int, int]]) -> dict[ShareKey, int]:
        """InitializeShareGroupState: each share partition's state made afresh at (state
        epoch, start offset; -1: where `share.auto.offset.reset` says when a leader first
        uses it). The error code per share partition."""
        out = await self._each_coordinator(
            group_id, starts, ApiKey.INITIALIZE_SHARE_GROUP_STATE, 0,
            lambda c, k: c.initialize(k, *starts[k]),
            lambda k: {"partition": k.partition, "state_epoch": starts[k][0], "start_offset": starts[k][1]},
            lambda p: None, lambda d: None)
        return {k: code for k, (code, _) in out.items()}

    async def delete(self, group_id: str, keys: Iterable[ShareKey]) -> dict[ShareKey, int]:
        """DeleteShareGroupState: the share partitions' states go. The error code per share partition."""
        out = await self._each_coordinator(group_id, keys, ApiKey.DELETE_SHARE_GROUP_STATE, 0,
                                           lambda c, k: c.delete(k), lambda k: {"partition": k.partition},
                                           lambda p: None, lambda d: None)
        return {k: code for k, (code, _) in out.items()}

    async def _each_coordinator(self, group_id: str, keys: Iterable[ShareKey], api: ApiKey, version: int,
                                local: Callable[[ShareCoordinator, ShareKey], Decision],
                                partition: Callable[[ShareKey], dict[str, Any]], answer: Callable[[Any], _T],
                                decided: Callable[[Decision], _T]) -> dict[ShareKey, tuple[int, _T | None]]:
        """One share-state call over many share partitions of one group: decided here for
        those whose coordinator this broker is, one request per other coordinator for the
        rest (Kafka's persister batches the same way)."""
        by_node: dict[int | None, list[ShareKey]] = {}
        for key in keys:
            assert key.group_id == group_id, key
            by_node.setdefault(await self._coordinator_node(key), []).append(key)
        out: dict[ShareKey, tuple[int, _T | None]] = {}
        for node, owned in by_node.items():
            if node is None:
                out.update((k, (ErrorCode.coordinator_not_available, None)) for k in owned)
            elif node == self.replicas.node_id:
                for k in owned:
                    d = await self.execute(k, lambda c, k=k: local(c, k))  # type: ignore[misc]
                    out[k] = (int(d.error), decided(d) if d.error == ErrorCode.none else None)
            else:
                topics: dict[str, list[ShareKey]] = {}
                for k in owned:
                    topics.setdefault(k.topic_id, []).append(k)
                body = {"group_id": group_id, "topics": [
                    {"topic_id": uuid.UUID(t), "partitions": [partition(k) for k in ks]} for t, ks in topics.items()]}
                resp = await self.call(node, api, body, version)
                answered: dict[ShareKey, tuple[int, _T | None]] = {}
                for t in resp.results if resp is not None else ():
                    for p in t.partitions:
                        k = ShareKey(group_id, str(t.topic_id), int(p.partition))
                        code = int(p.error_code)
                        answered[k] = (code, answer(p) if code == ErrorCode.none else None)
                out.update((k, answered.get(k, (ErrorCode.coordinator_not_available, None))) for k in owned)
        return out

    async def _coordinator_node(self, key: ShareKey) -> int | None:
        """The share partition's coordinator, `__share_group_state` created first if it must
        be (None: not available yet)."""
        return await self.state_topic.find_leader(self.partition_of(key))

    async def call(self, node: int, api: ApiKey, body: dict[str, Any], version: int | None = 0) -> Any:
        """One request to another broker (None when it could not be answered; the connection
        is dropped then). `version` None: the highest both speak."""
        return await self.brokers.request(node, api, body, version=version, timeout_s=_RPC_TIMEOUT_S)

    async def aclose(self) -> None:
        await self.brokers.aclose()
