"""Follower replicas: one fetcher per leader broker copies its partitions with Kafka Fetch.

A replica that becomes follower (or sees a new leader epoch) first asks the leader with
OffsetForLeaderEpoch where their histories diverge and truncates there (KIP-101/279),
never at a bare high watermark; then it long-polls Fetch (replica_id = its broker id)
from its log end and appends what comes back unchanged. The leader learns each follower's
position from those fetches and asks the controller to add caught-up followers to the ISR.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from cluster.broker.clock import now_ms
from cluster.client.connection import BrokerConnection, KafkaConnectionError
from cluster.protocol.errors import ErrorCode, ProtocolError
from cluster.protocol.record_batch import InvalidRecordBatch
from cluster.replication.fetch_sessions import FollowerSession
from cluster.storage.log import StorageError

if TYPE_CHECKING:
    from cluster.broker.broker import Broker, Partition

log = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1


@dataclass
class FollowerState:
    """What a follower replica knows about its fetching."""

    leader_id: int
    leader_epoch: int
    needs_truncation: bool = True


class ReplicaFetcherManager:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._fetchers: dict[int, ReplicaFetcher] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def spawn(self, fn: Any, *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(fn, *args)

    def update(self) -> None:
        """Match fetchers to the partitions this broker follows (after every metadata change)."""
        wanted: dict[int, dict[tuple[str, int], Partition]] = {}
        for key, part in self.broker.partitions.items():
            if not part.is_leader and part.leader_id >= 0 and part.leader_id != self.broker.node_id:
                wanted.setdefault(part.leader_id, {})[key] = part
        for leader_id, fetcher in list(self._fetchers.items()):
            if leader_id not in wanted:
                fetcher.stop()
                del self._fetchers[leader_id]
        if self._nursery is None:
            return
        for leader_id, parts in wanted.items():
            existing = self._fetchers.get(leader_id)
            if existing is None:
                existing = self._fetchers[leader_id] = ReplicaFetcher(self.broker, leader_id)
                self._nursery.start_soon(existing.run)
            existing.set_partitions(parts)


class ReplicaFetcher:
    def __init__(self, broker: Broker, leader_id: int) -> None:
        self.broker = broker
        self.leader_id = leader_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._cancel = trio.CancelScope()
        self._changed = trio.Event()
        self._conn: BrokerConnection | None = None
        self.session = FollowerSession()
        self._address: tuple[str, int] | None = None

    def stop(self) -> None:
        self.partitions = {}
        self._cancel.cancel()

    def set_partitions(self, parts: dict[tuple[str, int], Partition]) -> None:
        for part in parts.values():
            state = part.follower
            if state is None or state.leader_id != self.leader_id or state.leader_epoch != part.leader_epoch:
                part.follower = FollowerState(self.leader_id, part.leader_epoch)
        self.partitions = dict(parts)
        self._changed.set()

    async def run(self) -> None:
        backoff_s = 0.05
        with self._cancel:
            try:
                while True:
                    if not any(part.follower is not None for part in self.partitions.values()):
                        # Nothing to fetch (a partition this fetcher held may have become ours
                        # to lead a moment ago): wait for set_partitions or stop().
                        self._changed = trio.Event()
                        await self._changed.wait()
                        continue
                    # Every round yields at least once, even when all it finds is an error:
                    # a loop that never awaits would never see stop() and would starve the node.
                    await trio.lowlevel.checkpoint()
                    try:
                        conn = await self._connection()
                        await self._truncate(conn)
                        await self._fetch(conn)
                        backoff_s = 0.05
                    except (KafkaConnectionError, ProtocolError, OSError) as exc:
                        log.debug("fetcher of broker %d from %d: %s", self.broker.node_id, self.leader_id, exc)
                        await self._close()
                        await trio.sleep(backoff_s)
                        backoff_s = min(1.0, backoff_s * 2)
            finally:
                await self._close()

    async def _close(self) -> None:
        self.session.reset()
        if self._conn is not None:
            with trio.CancelScope(shield=True):
                await self._conn.aclose()
            self._conn = None

    async def _connection(self) -> BrokerConnection:
        reg = self.broker.image.brokers.get(self.leader_id)
        if reg is None:
            raise KafkaConnectionError(f"broker {self.leader_id} is not registered")
        address = (reg.host, reg.port)
        if self._conn is None or self._address != address:
            await self._close()
            self._conn = await BrokerConnection(*address, client_id=f"replica-{self.broker.node_id}").connect()
            self._address = address
        return self._conn

    async def _truncate(self, conn: BrokerConnection) -> None:
        todo = [(key, part) for key, part in self.partitions.items()
                if part.follower is not None and part.follower.needs_truncation]
        if not todo:
            return
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), part in todo:
            topics.setdefault(topic, []).append({"partition": index, "current_leader_epoch": part.leader_epoch,
                                                 "leader_epoch": part.log.leader_epochs.latest_epoch})
        resp = await conn.request(23, {"replica_id": self.broker.node_id,
                                       "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
        errors = 0
        for t in resp.topics:
            for p in t.partitions:
                found = self.partitions.get((t.topic, p.partition))
                if found is None or found.follower is None:
                    continue
                if p.error_code != ErrorCode.none:
                    errors += 1  # the leader does not lead it (yet): ask again shortly
                    continue
                part, follower = found, found.follower
                lg = part.log
                own_epoch = lg.leader_epochs.latest_epoch
                if own_epoch == UNDEFINED_EPOCH:
                    target = lg.log_end_offset  # nothing written under any epoch: nothing to compare
                elif p.leader_epoch == UNDEFINED_EPOCH:
                    target = lg.log_start_offset  # the leader has none of our epochs
                else:
                    _, own_end = lg.leader_epochs.end_offset_for(p.leader_epoch, lg.log_end_offset)
                    target = min(p.end_offset, own_end)
                if target < lg.log_end_offset:
                    before = lg.log_end_offset
                    lg.truncate_to(target, now_ms())
                    part.hw = min(part.hw, lg.log_end_offset)
                    log.info("broker %d truncated %s from %d to %d (diverged from leader %d at epoch %d)",
                             self.broker.node_id, lg.name, before, lg.log_end_offset, self.leader_id, p.leader_epoch)
                follower.needs_truncation = False
        if errors:
            await trio.sleep(0.1)

    async def _fetch(self, conn: BrokerConnection) -> None:
        cfg = self.broker.config
        max_bytes = int(cfg["replica.fetch.max.bytes"])
        wanted = {key: (part.log.log_end_offset, part.log.log_start_offset, part.leader_epoch, max_bytes)
                  for key, part in self.partitions.items()
                  if part.follower is not None and not part.follower.needs_truncation}
        if not wanted:
            return
        # In a fetch session only what changed is listed (KIP-227); see fetch_sessions.
        session_id, session_epoch, listed, forgotten = self.session.build(wanted)
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, index in listed:
            fetch_offset, log_start, leader_epoch, _ = wanted[(topic, index)]
            topics.setdefault(topic, []).append({
                "partition": index, "current_leader_epoch": leader_epoch, "fetch_offset": fetch_offset,
                "last_fetched_epoch": -1, "log_start_offset": log_start, "partition_max_bytes": max_bytes,
            })
        gone: dict[str, list[int]] = {}
        for topic, index in forgotten:
            gone.setdefault(topic, []).append(index)
        wait_ms = int(cfg["replica.fetch.wait.max.ms"])
        resp = await conn.request(1, {
            "replica_id": self.broker.node_id, "max_wait": wait_ms, "min_bytes": 1,
            "max_bytes": int(cfg["replica.fetch.response.max.bytes"]), "isolation_level": 0,
            "session_id": session_id, "session_epoch": session_epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in gone.items()], "rack_id": "",
        }, timeout_s=wait_ms / 1000 + 10)
        if resp.error_code != ErrorCode.none:
            # FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH (the leader restarted or
            # evicted us): open a new session with a full fetch.
            log.debug("fetcher of broker %d from %d: session reset (%s)", self.broker.node_id, self.leader_id,
                      ErrorCode(resp.error_code).name)
            self.session.reset()
            if resp.error_code not in (ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch):
                await trio.sleep(0.1)
            return
        self.session.sent_ok(resp.session_id, wanted, listed, forgotten)
        errors = 0
        for t in resp.responses:
            for p in t.partitions:
                fetched = self.partitions.get((t.topic, p.partition_index))
                if fetched is None or fetched.follower is None:
                    continue
                part, state = fetched, fetched.follower
                if p.error_code == ErrorCode.offset_out_of_range:
                    if 0 <= part.log.log_end_offset < p.log_start_offset:
                        # Everything we have is below the leader's log start (retention moved
                        # on while we were away): start over empty where the leader starts.
                        log.info("broker %d: %s ends at %d, below the leader's log start %d: starting over there",
                                 self.broker.node_id, part.log.name, part.log.log_end_offset, p.log_start_offset)
                        part.log.truncate_fully_and_start_at(p.log_start_offset, now_ms())
                        part.hw = min(part.hw, part.log.log_end_offset)
                    else:
                        state.needs_truncation = True
                    errors += 1
                    continue
                if p.error_code != ErrorCode.none:
                    errors += 1  # not leader / epoch mismatch: the metadata will catch up
                    continue
                if p.records:
                    try:
                        part.log.append_as_follower(bytes(p.records), now_ms=now_ms())
                    except InvalidRecordBatch as exc:
                        log.warning("broker %d: fetched data for %s does not fit: %s", self.broker.node_id,
                                    part.log.name, exc)
                        state.needs_truncation = True
                        errors += 1
                    except StorageError as exc:
                        log.error("%s", exc)
                        errors += 1
                part.hw = min(p.high_watermark, part.log.log_end_offset)
        if errors:
            await trio.sleep(0.1)
