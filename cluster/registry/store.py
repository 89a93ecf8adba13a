"""The registry's trio shell over its cluster's `_schemas` topic.

At start the topic is created if missing (1 partition, cleanup.policy=compact, replication
factor min(3, brokers); min.insync.replicas is the cluster's default) and read from its
beginning into a RegistryState; then it is tailed for as long as the store runs. A write
is planned against the state, produced (acks=all, idempotent), and answered only once the
tail has applied it (read-your-writes): the state never holds what the topic does not.

One instance writes (the primary, elected through the cluster: election.py); the others
raise NotPrimary so the HTTP layer forwards the request. Writes are serialized by a lock,
so a plan is always made against the state that includes every earlier write, and a new
primary first reads the topic to its end (what the previous primary wrote).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import trio

from cluster.client.admin import Admin, AdminError
from cluster.client.consumer import LATEST, Consumer
from cluster.client.errors import KafkaError
from cluster.client.producer import DeliveryFuture, Producer
from cluster.client.topic_partition import TopicPartition
from cluster.protocol.errors import ErrorCode
from cluster.registry.election import PrimaryElection
from cluster.registry.state import (
    PRIMARY_HEADER,
    Record,
    RegistryError,
    RegistryState,
    generation_of,
    primary_record,
)
from cluster.security.connector import CLIENT_SECURITY_KEYS

log = logging.getLogger(__name__)

SCHEMAS_TOPIC = "_schemas"
WRITE_TIMEOUT_S = 30.0
"""A write not acknowledged and read back by then answers 50002 (Confluent's timeout)."""
TAIL_POLL_S = 1.0
T = TypeVar("T")


class NotPrimary(Exception):
    """This instance does not write: forward to `primary_url`."""

    def __init__(self, primary_url: str) -> None:
        super().__init__(primary_url)
        self.primary_url = primary_url


class RegistryStore:
    """The state of one registry and the topic it lives in."""

    def __init__(self, client_config: Mapping[str, Any], *, state: RegistryState | None = None,
                 topic: str = SCHEMAS_TOPIC, write_timeout_s: float = WRITE_TIMEOUT_S,
                 election: PrimaryElection | None = None) -> None:
        self.client_config = dict(client_config)
        self.state = state if state is not None else RegistryState()
        self.topic = topic
        self.write_timeout_s = write_timeout_s
        self.ready = False
        self._lock = trio.Lock()
        self._applied = trio.Event()           # set (and replaced) whenever the tail applies records
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self.election = election
        self._primary_generation: int | None = None   # the generation this primary's records carry
        self._elected_in: int | None = None           # the election generation it was announced for
        self.metrics = {"writes": 0, "records_written": 0, "write_errors": 0, "writes_fenced": 0}

    # -- the topic ------------------------------------------------------------------------

    async def ensure_topic(self) -> None:
        admin_config = {k: v for k, v in self.client_config.items() if k in CLIENT_SECURITY_KEYS}
        async with Admin(self.client_config["bootstrap.servers"], client_id="dcmirror-registry",
                         config=admin_config) as admin:
            meta = await admin.metadata([self.topic])
            if any(t.name == self.topic and t.error_code == 0 for t in meta.topics):
                return
            replication = min(3, max(1, len(meta.brokers)))
            try:
                await admin.create_topic(self.topic, 1, replication, {"cleanup.policy": "compact"})
                log.info("created %s (1 partition, replication factor %d, compacted)", self.topic, replication)
            except AdminError as exc:
                if exc.code != ErrorCode.topic_already_exists:
                    raise

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Create the topic if needed, replay it, report started, then tail it and serve
        writes until cancelled."""
        await self.ensure_topic()
        tp: TopicPartition = (self.topic, 0)
        consumer_config = {**self.client_config, "group.id": "", "enable.auto.commit": False,
                           "auto.offset.reset": "earliest"}
        producer_config = {**self.client_config, "acks": "all", "enable.idempotence": True, "linger.ms": 0,
                           "client.id": "dcmirror-registry"}
        async with Consumer(consumer_config) as consumer, Producer(producer_config) as producer:
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end = (await consumer.list_offsets({tp: LATEST}))[tp] or 0
            while self.state.applied_offset < end - 1:
                await self._consume(consumer, tp, TAIL_POLL_S)
            self._producer = producer
            self._consumer = consumer
            self.ready = True
            log.info("registry state replayed from %s: %d records applied, %d skipped", self.topic,
                     self.state.records_applied, self.state.records_skipped)
            task_status.started()
            try:
                while True:
                    await self._consume(consumer, tp, TAIL_POLL_S)
            finally:
                self.ready = False
                self._producer = None
                self._consumer = None

    async def _consume(self, consumer: Consumer, tp: TopicPartition, timeout_s: float) -> None:
        batches = await consumer.getmany(timeout_s=timeout_s)
        applied = False
        for record in batches.get(tp, ()):
            self.state.apply(record.key, record.value, record.offset, generation_of(record.headers))
            applied = True
        if applied:
            self._applied.set()
            self._applied = trio.Event()

    # -- writes -----------------------------------------------------------------------------

    async def write(self, plan: Callable[[RegistryState], tuple[list[Record], T]]) -> T:
        """Plan against the current state, append the records, wait until the tail has
        applied them, answer the plan's answer. RegistryError from the plan passes through;
        a store failure is 50001, a timeout 50002."""
        async with self._lock:
            await self._check_primary()
            records, answer = plan(self.state)
            if not records:
                return answer
            await self._append(records)
            return answer

    async def _append(self, records: list[Record]) -> None:
        """Produce `records` (tagged with this primary's generation), wait until the tail has
        applied them; a record the log fenced (a newer primary announced itself first) is 50004."""
        producer = self._producer
        if producer is None:
            raise RegistryError(500, 50003, "Error while forwarding the request to the primary: "
                                            "the registry is not ready")
        self.metrics["writes"] += 1
        last = -1
        offsets: list[int] = []
        headers = () if self._primary_generation is None else (
            (PRIMARY_HEADER, str(self._primary_generation).encode()),)
        with trio.move_on_after(self.write_timeout_s) as scope:
            try:
                futures = []
                for key, value in records:
                    fut = DeliveryFuture()
                    producer.produce(self.topic, value, key, partition=0, headers=headers, on_delivery=fut)
                    futures.append(fut)
                for fut in futures:
                    offsets.append((await fut.wait()).offset)
                    last = max(last, offsets[-1])
            except KafkaError as exc:
                self.metrics["write_errors"] += 1
                log.warning("writing to %s failed: %s", self.topic, exc)
                raise RegistryError(500, 50001, "Error in the backend data store") from exc
            while self.state.applied_offset < last:
                await self._applied.wait()
        if scope.cancelled_caught:
            self.metrics["write_errors"] += 1
            raise RegistryError(500, 50002, "Register operation timed out")
        if any(self.state.fenced(offset) for offset in offsets):
            self.metrics["write_errors"] += 1
            self.metrics["writes_fenced"] += 1
            self._elected_in = None  # the next write asks the election again
            log.warning("a write of primary generation %s was fenced: a newer primary (generation %d) "
                        "announced itself first; this instance no longer writes", self._primary_generation,
                        self.state.primary_generation)
            raise RegistryError(500, 50004, "Unknown leader: this instance is no longer the primary; "
                                            "the request was not applied, retry it")
        self.metrics["records_written"] += len(records)

    async def catch_up(self, timeout_s: float) -> bool:
        """Wait until everything in the topic now is applied (after a write another
        instance made for us: read-your-writes here too)."""
        consumer = self._consumer
        if consumer is None:
            return False
        tp: TopicPartition = (self.topic, 0)
        end = (await consumer.list_offsets({tp: LATEST}))[tp] or 0
        return await self.wait_applied(end - 1, timeout_s)

    async def _check_primary(self) -> None:
        election = self.election
        if election is None:
            return
        if not await election.wait_decided(self.write_timeout_s):
            raise RegistryError(500, 50004, "Unknown leader: no primary elected")
        if not election.is_primary:
            assert election.primary_url is not None
            raise NotPrimary(election.primary_url)
        if self._elected_in != election.generation:
            # Newly primary: the coordinator confirms the election is current (a heartbeat sent
            # now is accepted in its generation), everything the previous primary wrote is
            # applied, then the log is told a newer primary writes now: a generation above every
            # one announced before (the election's own, unless the group was forgotten and its
            # generations started again), which fences a stale primary's later writes.
            generation = election.generation
            if not await election.confirm(self.write_timeout_s):
                raise RegistryError(500, 50004, "Unknown leader: the primary election is changing; retry")
            if not await self.catch_up(self.write_timeout_s):
                raise RegistryError(500, 50002, "Timed out reading the schemas topic to its end")
            self._primary_generation = max(generation, self.state.primary_generation + 1)
            try:
                await self._append([primary_record(self._primary_generation, election.url)])
            except RegistryError:
                self._primary_generation = None
                raise
            self._elected_in = generation

    async def wait_applied(self, offset: int, timeout_s: float = math.inf) -> bool:
        with trio.move_on_after(timeout_s):
            while self.state.applied_offset < offset:
                await self._applied.wait()
            return True
        return False
