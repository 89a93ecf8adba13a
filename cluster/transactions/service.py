"""The trio shell around the transaction coordinator: ownership, persistence, markers, timers.

A broker coordinates the transactional ids whose `__transaction_state` partition it leads
(partition = abs(java hash of the id) % partitions, as for groups). Every decision's write
is appended there and waits for the in-sync replicas (as acks=all) before it counts and
before the client is answered. Once a transaction is PrepareCommit/PrepareAbort, the
coordinator writes its markers (WriteTxnMarkers) to the leader of every partition in it —
directly when this broker leads the partition — retrying until each is written; then
writes CompleteCommit/CompleteAbort. A broker that becomes leader of a state partition
replays it and finishes the markers of every transaction it finds preparing, so a
coordinator kill -9 mid-commit loses nothing and exposes nothing aborted.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from cluster.client.admin import write_txn_markers_body
from cluster.client.broker_channel import BrokerChannel
from cluster.common.backoff import Backoff
from cluster.common.clock import Clock
from cluster.controller.image import MetadataImage
from cluster.groups.records import partition_for
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.records import Record, encode_batch
from cluster.replication.internal_topic import CreateTopics, InternalTopic, InternalTopicSpec
from cluster.replication.replica_manager import ReplicaManager
from cluster.transactions.coordinator import Decision, TransactionCoordinator
from cluster.transactions.state import (
    TRANSACTION_STATE_TOPIC,
    TxnMetadata,
    TxnState,
    key,
    replay,
    value,
)

log = logging.getLogger(__name__)

_WRITE_TIMEOUT_S = 15.0
_VERIFY_TIMEOUT_S = 5.0  # a produce waits this long at most for its transaction's verification
_MARKER_RETRY_S = 0.1
_MARKER_RETRY_MAX_S = 2.0


@dataclass(frozen=True, slots=True)
class TransactionStateSettings:
    """How `__transaction_state` is created (Kafka's transaction.state.log.* configs)."""

    num_partitions: int = 50  # transaction.state.log.num.partitions
    replication_factor: int = 3  # transaction.state.log.replication.factor (capped by the cluster's size)
    min_isr: int = 2  # transaction.state.log.min.isr
    segment_bytes: int = 104_857_600  # transaction.state.log.segment.bytes
    abort_check_interval_ms: int = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms


# Called after a marker lands on a `__consumer_offsets` partition: (partition, producer id, commit).
MarkerListener = Callable[[int, int, bool], None]


class TransactionService:
    def __init__(self, coordinator: TransactionCoordinator, replicas: ReplicaManager,
                 settings: TransactionStateSettings, *, clock: Clock, image: Callable[[], MetadataImage],
                 cluster_size: Callable[[], int], create_topics: CreateTopics,
                 next_producer_id: Callable[[], Awaitable[int]]) -> None:
        self.coordinator = coordinator
        self.replicas = replicas
        self.settings = settings
        self.clock = clock
        self._image = image
        self.state_topic = InternalTopic(
            InternalTopicSpec(TRANSACTION_STATE_TOPIC, settings.num_partitions, settings.replication_factor,
                              settings.segment_bytes, min_isr=settings.min_isr,
                              extra_configs={"unclean.leader.election.enable": "false"}),
            image=image, cluster_size=cluster_size, create_topics=create_topics)
        self._next_producer_id = next_producer_id
        self._owned: set[int] = set()
        self._opened = False
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        self.brokers = BrokerChannel(replicas.broker_address, client_id=f"txn-coordinator-{replicas.node_id}",
                                     link=replicas.settings.fetcher.link)
        self.marker_listeners: list[MarkerListener] = []
        self._completing: set[tuple[str, int, int]] = set()  # (id, producer id, epoch) with markers in flight

    @property
    def image(self) -> MetadataImage:
        return self._image()

    @property
    def num_partitions(self) -> int:
        return self.state_topic.num_partitions

    # ---- ownership ----------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._timer_loop)
            task_status.started()
            await trio.sleep_forever()

    def open(self) -> None:
        self._opened = True
        self.on_partitions_changed()

    def on_partitions_changed(self) -> None:
        if not self._opened:
            return
        led = self.state_topic.led(self.replicas)
        for index in sorted(self._owned - led):
            gone = [i for i in self.coordinator.txns if self.partition_of(i) == index]
            self.coordinator.unload(gone)
            log.log(logging.INFO if gone else logging.DEBUG, "no longer coordinating %d transactional id(s) of %s-%d",
                    len(gone), TRANSACTION_STATE_TOPIC, index)
        for index in sorted(led - self._owned):
            part = self.replicas.partitions[(TRANSACTION_STATE_TOPIC, index)]
            txns = replay(part.log.replay_records()[0])
            self.coordinator.load(txns)
            if txns:
                log.info("loaded %d transactional id(s) from %s-%d", len(txns), TRANSACTION_STATE_TOPIC, index)
            for meta in txns.values():
                if meta.state.preparing:
                    self._start_markers(meta)
        self._owned = led
        self._changed.set()

    def partition_of(self, txn_id: str) -> int:
        return partition_for(txn_id, self.num_partitions)

    def owns(self, txn_id: str) -> bool:
        return self.partition_of(txn_id) in self._owned

    def coordinator_for(self, txn_id: str) -> int | None:
        """The broker leading the id's state partition (None: not known or fenced)."""
        return self.state_topic.leader_of(self.partition_of(txn_id))

    async def find_coordinator(self, txn_id: str) -> int | None:
        """FindCoordinator: `__transaction_state` created first if it must be (None: not available yet)."""
        return await self.state_topic.find_leader(self.partition_of(txn_id))

    async def verify(self, txn_id: str, producer_id: int, producer_epoch: int,
                     partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """KIP-890: ask the transaction's coordinator (this broker, or AddPartitionsToTxn v4
        verify_only to the one that is) whether `partitions` are in the producer's ongoing
        transaction. A coordinator that cannot be asked gives NOT_ENOUGH_REPLICAS, which
        every client retries (as Kafka answers)."""
        node = self.coordinator_for(txn_id)
        if node == self.replicas.node_id and self.owns(txn_id):
            return self.coordinator.verify(txn_id, producer_id, producer_epoch, partitions)
        unavailable: dict[tuple[str, int], int] = dict.fromkeys(partitions, ErrorCode.not_enough_replicas)
        if node is None or node == self.replicas.node_id:
            return unavailable
        topics: dict[str, list[int]] = defaultdict(list)
        for t, p in partitions:
            topics[t].append(p)
        body = {"transactions": [{"transactional_id": txn_id, "producer_id": producer_id,
                                  "producer_epoch": producer_epoch, "verify_only": True,
                                  "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}]}
        resp = await self.brokers.request(node, ApiKey.ADD_PARTITIONS_TO_TXN, body, version=4,
                                          timeout_s=_VERIFY_TIMEOUT_S, what=f"verifying {txn_id}")
        if resp is None or resp.error_code != ErrorCode.none:
            return unavailable
        out = dict(unavailable)
        for txn in resp.results_by_transaction:
            for t in txn.topic_results:
                for r in t.results_by_partition:
                    code = r.partition_error_code
                    if code in (ErrorCode.not_coordinator, ErrorCode.coordinator_not_available,
                                ErrorCode.coordinator_load_in_progress, ErrorCode.concurrent_transactions):
                        code = ErrorCode.not_enough_replicas
                    out[(t.name, r.partition_index)] = code
        return out

    # ---- decisions ----------------------------------------------------------------------

    async def decide(self, txn_id: str, decision: Decision) -> int:
        """Carry a decision out: write it (replicated), apply it, start its markers. The
        error code to answer with."""
        if decision.write is None:
            return decision.error
        if not self.owns(txn_id):
            return ErrorCode.not_coordinator
        self.coordinator.busy.add(txn_id)
        try:
            code = await self._persist(txn_id, None if decision.remove else decision.write)
        finally:
            self.coordinator.busy.discard(txn_id)
        if code != ErrorCode.none:
            return code
        self.coordinator.applied(None if decision.remove else decision.write, txn_id)
        self._changed.set()
        if decision.markers:
            self._start_markers(decision.write)
        return decision.error

    async def _persist(self, txn_id: str, meta: TxnMetadata | None) -> int:
        index = self.partition_of(txn_id)
        now = self.clock.now_ms()
        batch = encode_batch([Record(0, now, key(txn_id), None if meta is None else value(meta), ())])
        answer = self.replicas.append(TRANSACTION_STATE_TOPIC, index, batch, min_isr_checked=True)
        responses = [{"name": TRANSACTION_STATE_TOPIC, "partition_responses": [answer]}]
        if answer["error_code"] == ErrorCode.none:
            await self.replicas.wait_for_acks_all(responses, _WRITE_TIMEOUT_S)
        code = answer["error_code"]
        if code == ErrorCode.none:
            return code
        log.warning("writing the state of transactional id %s to %s-%d: error %s", txn_id, TRANSACTION_STATE_TOPIC,
                    index, code)
        if code in (ErrorCode.not_leader_or_follower, ErrorCode.unknown_topic_or_partition):
            return ErrorCode.not_coordinator
        return ErrorCode.coordinator_not_available  # as Kafka maps NOT_ENOUGH_REPLICAS and timeouts

    async def new_producer_id(self, txn_id: str) -> int | None:
        if not self.coordinator.needs_producer_id(txn_id):
            return None
        return await self._next_producer_id()

    # ---- markers ------------------------------------------------------------------------

    def _start_markers(self, meta: TxnMetadata) -> None:
        self.coordinator.busy.add(meta.transactional_id)
        task = (meta.transactional_id, meta.producer_id, meta.producer_epoch)
        if task in self._completing:
            # Still running from before this broker lost and regained the id: one writer of
            # these markers only (a second one, late, would end the id's next transaction).
            return
        self._completing.add(task)
        assert self._nursery is not None
        self._nursery.start_soon(self._complete, meta)

    async def _complete(self, meta: TxnMetadata) -> None:
        txn_id = meta.transactional_id
        commit = meta.state is TxnState.PREPARE_COMMIT
        # Markers are retried for as long as this broker coordinates the id (Kafka too):
        # a partition without a leader gets one when its broker returns.
        backoff = Backoff(_MARKER_RETRY_S, _MARKER_RETRY_MAX_S)
        try:
            remaining = set(meta.partitions)
            while remaining:
                if not self.owns(txn_id):
                    return  # the next coordinator finishes it
                remaining = await self._write_markers(meta, commit, remaining)
                if remaining:
                    await backoff.sleep()
        finally:
            self.coordinator.busy.discard(txn_id)
            self._completing.discard((txn_id, meta.producer_id, meta.producer_epoch))
        backoff.reset()
        while self.owns(txn_id):
            code = await self.decide(txn_id, self.coordinator.complete(txn_id, self.clock.now_ms()))
            if code == ErrorCode.none:
                log.info("transaction of %s (producer %d epoch %d) %s on %d partition(s)", txn_id,
                         meta.producer_id, meta.producer_epoch, "committed" if commit else "aborted",
                         len(meta.partitions))
                return
            await backoff.sleep()

    async def _write_markers(self, meta: TxnMetadata, commit: bool,
                             partitions: set[tuple[str, int]]) -> set[tuple[str, int]]:
        """One round of markers; the partitions still to do."""
        by_leader: dict[int, list[tuple[str, int]]] = defaultdict(list)
        remaining: set[tuple[str, int]] = set()
        for topic, index in partitions:
            p = self.image.partition(topic, index)
            if p is None:
                continue  # the topic was deleted: nothing left to mark
            if p.leader < 0:
                remaining.add((topic, index))
            else:
                by_leader[p.leader].append((topic, index))
        epoch = self.replicas.partitions.get((TRANSACTION_STATE_TOPIC, self.partition_of(meta.transactional_id)))
        coordinator_epoch = epoch.leader_epoch if epoch is not None else 0
        for leader, tps in by_leader.items():
            if leader == self.replicas.node_id:
                codes = await self.write_local_markers(meta.producer_id, meta.producer_epoch, commit,
                                                       coordinator_epoch, tps)
                # INVALID_PRODUCER_EPOCH: a newer marker of this producer is there already.
                done = {tp for tp, c in codes.items() if c in (ErrorCode.none, ErrorCode.invalid_producer_epoch)}
            else:
                done = await self._write_remote_markers(leader, meta.producer_id, meta.producer_epoch, commit,
                                                        coordinator_epoch, tps)
            remaining.update(tp for tp in tps if tp not in done)
        return remaining

    async def write_local_markers(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                                  tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Append markers as the leader and wait for the in-sync replicas; error per partition
        (done ones map to NONE). Used by the coordinator and by the WriteTxnMarkers API."""
        by_topic: dict[str, list[dict[str, Any]]] = defaultdict(list)
        responses: list[dict[str, Any]]
        for topic, index in tps:
            by_topic[topic].append(self.replicas.write_marker(topic, index, producer_id=producer_id,
                                                             producer_epoch=producer_epoch, commit=commit,
                                                             coordinator_epoch=coordinator_epoch))
        responses = [{"name": t, "partition_responses": rs} for t, rs in by_topic.items()]
        await self.replicas.wait_for_acks_all(responses, _WRITE_TIMEOUT_S)
        out: dict[tuple[str, int], int] = {}
        for t in responses:
            name: str = t["name"]
            for r in t["partition_responses"]:
                out[(name, r["index"])] = r["error_code"]
                if r["error_code"] == ErrorCode.none and name == "__consumer_offsets":
                    for listener in self.marker_listeners:
                        listener(r["index"], producer_id, commit)
        return out

    async def _write_remote_markers(self, leader: int, producer_id: int, producer_epoch: int, commit: bool,
                                    coordinator_epoch: int, tps: list[tuple[str, int]]) -> set[tuple[str, int]]:
        request = write_txn_markers_body(producer_id, producer_epoch, commit, coordinator_epoch, tps)
        resp = await self.brokers.request(leader, ApiKey.WRITE_TXN_MARKERS, request, timeout_s=_WRITE_TIMEOUT_S + 5)
        done: set[tuple[str, int]] = set()
        for marker in resp.markers if resp is not None else ():
            for t in marker.topics:
                for p in t.partitions:
                    if p.error_code in (ErrorCode.none, ErrorCode.invalid_producer_epoch):
                        done.add((t.name, p.partition_index))
        return done

    # ---- timers -------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        interval_s = self.settings.abort_check_interval_ms / 1000
        while True:
            deadline = self.coordinator.next_deadline_ms()
            self._changed = trio.Event()
            wait_s = interval_s if deadline is None else max(0.0, (deadline - self.clock.now_ms()) / 1000)
            with trio.move_on_after(min(wait_s, interval_s)):
                await self._changed.wait()
            for decision in self.coordinator.expired(self.clock.now_ms()):
                assert decision.write is not None
                txn_id = decision.write.transactional_id
                if decision.write.state is TxnState.PREPARE_ABORT:
                    log.info("transaction of %s timed out after %d ms: aborting it (producer %d fenced at epoch %d)",
                             txn_id, decision.write.timeout_ms, decision.write.producer_id,
                             decision.write.producer_epoch)
                if await self.decide(txn_id, decision) != ErrorCode.none:
                    self.coordinator.expiry_failed(txn_id, self.clock.now_ms() + self.settings.abort_check_interval_ms)

    async def aclose(self) -> None:
        await self.brokers.aclose()

