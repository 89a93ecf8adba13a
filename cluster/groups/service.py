"""The trio shell around the group coordinator: ownership, persistence, timers.

A broker coordinates the groups whose `__consumer_offsets` partition it leads. Committed
offsets and group metadata are appended to that partition (compacted,
`offsets.topic.num.partitions` partitions) before a request is answered; when a broker
becomes leader of an offsets partition, the state of its groups is replayed from it. The
Kafka group APIs that drive it are in cluster/broker/group_handlers.py.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from cluster.common.clock import Clock
from cluster.controller.image import MetadataImage
from cluster.controller.service import ControllerUnavailable
from cluster.groups.coordinator import GroupCoordinator
from cluster.groups.records import OFFSETS_TOPIC, GroupRecord, offset_record, partition_for, replay
from cluster.groups.state import Pending
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import TRANSACTIONAL_MASK
from cluster.protocol.records import Record, encode_batch
from cluster.replication.internal_topic import CreateTopics, InternalTopic, InternalTopicSpec
from cluster.replication.replica_manager import ReplicaManager

log = logging.getLogger(__name__)

_TXN_OFFSETS_TIMEOUT_S = 15.0  # TxnOffsetCommit waits this long for the in-sync replicas



@dataclass(frozen=True, slots=True)
class OffsetsTopicSettings:
    """How `__consumer_offsets` is created (Kafka's offsets.topic.* broker configs)."""

    num_partitions: int = 50  # offsets.topic.num.partitions
    replication_factor: int = 3  # offsets.topic.replication.factor (capped by the cluster's size)
    segment_bytes: int = 104_857_600  # offsets.topic.segment.bytes
    commit_timeout_ms: int = 5000  # offsets.commit.timeout.ms: a group's records wait this long for the ISR


# What a group call answers when its records could not be written or replicated (the
# mapping of Kafka 4's group coordinator; clients retry, or look for the coordinator again).
_APPEND_ERRORS: dict[ErrorCode, ErrorCode] = {
    ErrorCode.unknown_topic_or_partition: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas: ErrorCode.coordinator_not_available,
    ErrorCode.not_enough_replicas_after_append: ErrorCode.coordinator_not_available,
    ErrorCode.request_timed_out: ErrorCode.coordinator_not_available,
    ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator,
    ErrorCode.kafka_storage_error: ErrorCode.not_coordinator,
    ErrorCode.message_too_large: ErrorCode.unknown_server_error,
    ErrorCode.record_list_too_large: ErrorCode.unknown_server_error,
    ErrorCode.invalid_fetch_size: ErrorCode.unknown_server_error,
}


class GroupService:
    def __init__(self, coordinator: GroupCoordinator, replicas: ReplicaManager, settings: OffsetsTopicSettings, *,
                 clock: Clock, image: Callable[[], MetadataImage], cluster_size: Callable[[], int],
                 create_topics: CreateTopics) -> None:
        self.coordinator = coordinator
        self.replicas = replicas
        self.settings = settings
        self.clock = clock
        self._image = image
        self.offsets_topic = InternalTopic(
            InternalTopicSpec(OFFSETS_TOPIC, settings.num_partitions, settings.replication_factor,
                              settings.segment_bytes),
            image=image, cluster_size=cluster_size, create_topics=create_topics)
        self._state_changed = trio.Event()
        self._opened = False
        self._owned: set[int] = set()
        self._known_topics: dict[str, str] = {}  # name → topic id, as last seen

    @property
    def image(self) -> MetadataImage:
        return self._image()

    @property
    def num_partitions(self) -> int:
        return self.offsets_topic.num_partitions

    # ---- ownership: a broker coordinates the groups of the offsets partitions it leads ----

    def open(self) -> None:
        self._opened = True
        self.on_partitions_changed()

    def on_partitions_changed(self) -> None:
        """Forget offsets of topics deleted or recreated; load the groups of offsets
        partitions this broker now leads; unload the others."""
        ids = {t.name: t.topic_id for t in self.image.topics.values()}
        if any(ids.get(name) != topic_id for name, topic_id in self._known_topics.items()):
            for name, topic_id in self._known_topics.items():
                if ids.get(name) != topic_id:
                    # A topic recreated under the same name must not inherit old committed offsets.
                    self.coordinator.delete_offsets_of_topic(name)
            self.flush_records()
        self._known_topics = ids
        if not self._opened:
            return
        led = self.offsets_topic.led(self.replicas)
        for index in sorted(self._owned - led):
            dropped = [g for g in self.coordinator.groups if partition_for(g, self.num_partitions) == index]
            for g in dropped:
                self.coordinator.unload(g)
            self.coordinator.drop_pending(functools.partial(self._in_offsets_partition, index))
            log.log(logging.INFO if dropped else logging.DEBUG, "no longer coordinating %d group(s) of %s-%d",
                    len(dropped), OFFSETS_TOPIC, index)
        for index in sorted(led - self._owned):
            part = self.replicas.partitions[(OFFSETS_TOPIC, index)]
            records, open_txns = part.log.replay_records()
            groups = replay(records, self.clock.now_ms())
            self.coordinator.load(groups)
            for pid, recs in open_txns.items():  # TxnOffsetCommits waiting for their marker
                for gid, pending in replay(recs, self.clock.now_ms()).items():
                    self.coordinator.add_pending(pid, gid, pending.offsets)
            if groups:
                log.info("loaded %d group(s) from %s-%d (%d records)", len(groups), OFFSETS_TOPIC, index, len(records))
        self._owned = led
        self._state_changed.set()

    def owns(self, group_id: str) -> bool:
        return partition_for(group_id, self.num_partitions) in self._owned

    def _in_offsets_partition(self, index: int, group_id: str) -> bool:
        return partition_for(group_id, self.num_partitions) == index

    async def offsets_topic_loop(self) -> None:
        """Create the offsets topic when the cluster can hold it, so coordinators are ready early."""
        while True:
            try:
                if await self.offsets_topic.ensure():
                    return
            except ControllerUnavailable as exc:
                log.warning("creating %s: %s", OFFSETS_TOPIC, exc)
            await trio.sleep(1.0)

    async def find_coordinator(self, group_id: str) -> int | None:
        """FindCoordinator: the broker that leads the group's offsets partition,
        `__consumer_offsets` created first if it must be (None: not available yet)."""
        return await self.offsets_topic.find_leader(partition_for(group_id, self.num_partitions))

    def complete_txn(self, index: int, producer_id: int, commit: bool) -> None:
        """A transaction marker was written to offsets partition `index`."""
        n = self.coordinator.complete_txn(producer_id, commit,
                                          lambda g: partition_for(g, self.num_partitions) == index,
                                          self.clock.now_ms())
        if n:
            log.debug("%s %d transactional offset(s) of producer %d", "committed" if commit else "dropped", n,
                      producer_id)

    async def txn_commit_offsets(self, *, group_id: str, producer_id: int, producer_epoch: int, member_id: str,
                                 generation_id: int, group_instance_id: str | None,
                                 offsets: list[tuple[str, int, int, int, str | None]]) -> dict[tuple[str, int], int]:
        """TxnOffsetCommit: append the offsets inside the producer's transaction (replicated)
        and hold them pending until its marker."""
        now = self.clock.now_ms()
        results, staged = self.coordinator.txn_commit_offsets(
            group_id=group_id, member_id=member_id, generation_id=generation_id,
            group_instance_id=group_instance_id, offsets=offsets, now_ms=now)
        if not staged:
            return results
        index = partition_for(group_id, self.num_partitions)
        records = [offset_record(group_id, t, p, c) for (t, p), c in staged.items()]
        batch = encode_batch([Record(i, now, r.key, r.value, ()) for i, r in enumerate(records)],
                             producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1,
                             attributes_extra=TRANSACTIONAL_MASK)
        answer = self.replicas.append(OFFSETS_TOPIC, index, batch, min_isr_checked=True)
        if answer["error_code"] == ErrorCode.none:
            responses = [{"name": OFFSETS_TOPIC, "partition_responses": [answer]}]
            await self.replicas.wait_for_acks_all(responses, _TXN_OFFSETS_TIMEOUT_S)
        code = answer["error_code"]
        if code != ErrorCode.none:
            mapped = {ErrorCode.invalid_producer_epoch: ErrorCode.producer_fenced,
                      ErrorCode.not_leader_or_follower: ErrorCode.not_coordinator}.get(
                code, ErrorCode.coordinator_not_available)
            return {tp: (mapped if c == ErrorCode.none else c) for tp, c in results.items()}
        self.coordinator.add_pending(producer_id, group_id, staged)
        return results

    # ---- persistence and timers ---------------------------------------------------------

    def flush_records(self) -> dict[int, dict[str, Any]]:
        """Append what the coordinator produced; the append's answer per partition of the
        offsets topic (failures are also logged). Raises nothing the caller must handle."""
        records = self.coordinator.take_records()
        self._state_changed.set()
        answers: dict[int, dict[str, Any]] = {}
        if not records:
            return answers
        by_partition: dict[int, list[GroupRecord]] = defaultdict(list)
        for r in records:
            by_partition[partition_for(r.group_id, self.num_partitions)].append(r)
        now = self.clock.now_ms()
        for p, recs in by_partition.items():
            batch = encode_batch([Record(i, now, r.key, r.value, ()) for i, r in enumerate(recs)])
            answers[p] = response = self.replicas.append(OFFSETS_TOPIC, p, batch)
            if response["error_code"] != ErrorCode.none:
                log.error("could not persist %d group record(s) to %s-%d: error %s",
                          len(recs), OFFSETS_TOPIC, p, response["error_code"])
        return answers

    async def flush_durable(self, group_id: str) -> int:
        """flush_records, then wait, as Kafka's coordinator does before it answers, until the
        group's records are on every in-sync replica of its offsets partition (acks=all,
        within offsets.commit.timeout.ms): a coordinator that dies after the answer cannot
        take the change with it. NONE, or the coordinator error for the client."""
        answer = self.flush_records().get(partition_for(group_id, self.num_partitions))
        if answer is None:
            return ErrorCode.none  # nothing of this group was written
        if answer["error_code"] == ErrorCode.none:
            await self.replicas.wait_for_acks_all([{"name": OFFSETS_TOPIC, "partition_responses": [answer]}],
                                                  self.settings.commit_timeout_ms / 1000)
        code = ErrorCode(answer["error_code"])
        return int(_APPEND_ERRORS.get(code, code))

    async def timer_loop(self) -> None:
        while True:
            deadline = self.coordinator.next_deadline_ms()
            self._state_changed = trio.Event()
            if deadline is None:
                await self._state_changed.wait()
                continue
            delay_s = max(0.0, (deadline - self.clock.now_ms()) / 1000)
            with trio.move_on_after(delay_s):
                await self._state_changed.wait()
                continue
            self.coordinator.tick(self.clock.now_ms())
            self.flush_records()

    async def wait(self, pending: Pending) -> dict[str, Any]:
        """The answer of a coordinator call, once it is complete (records persisted first)."""
        self.flush_records()
        if not pending.done:
            event = trio.Event()
            pending.on_done = event.set
            await event.wait()
            self.flush_records()
        return pending.result
