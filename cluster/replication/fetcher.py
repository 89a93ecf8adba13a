"""Follower replicas: one fetcher per leader broker copies its partitions with Kafka Fetch.

A replica that becomes follower (or sees a new leader epoch) first asks the leader with
OffsetForLeaderEpoch where their histories diverge and truncates there (KIP-101/279),
never at a bare high watermark; then it long-polls Fetch (replica_id = its broker id)
from its log end and appends what comes back unchanged. The decisions are the sans-IO
`Partition`'s (partition.py); this module is the network around them. The leader learns
each follower's position from those fetches and asks the controller to add caught-up
followers to the ISR.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import trio

from cluster.client.connection import BrokerConnection, KafkaConnectionError
from cluster.common.backoff import Backoff
from cluster.common.clock import Clock
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode, ProtocolError
from cluster.protocol.fetch_session import FetcherSession
from cluster.protocol.sentinels import READ_UNCOMMITTED
from cluster.replication.partition import Partition
from cluster.security.connector import PLAINTEXT, LinkSecurity
from cluster.storage.log import StorageError

log = logging.getLogger(__name__)

# After an answer with partition errors (not leader yet, epoch mismatch): wait this long
# before asking again, so a fetcher does not spin while the metadata catches up.
ERROR_PAUSE_S = 0.1

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class FetcherSettings:
    """Broker configs of the replica fetchers (Kafka's names in the comments)."""

    max_bytes: int = 1_048_576  # replica.fetch.max.bytes (per partition)
    response_max_bytes: int = 10_485_760  # replica.fetch.response.max.bytes
    wait_max_ms: int = 500  # replica.fetch.wait.max.ms
    link: LinkSecurity = PLAINTEXT  # the inter-broker listener's protocol and this broker's login


@dataclass(frozen=True, slots=True)
class FollowerContext:
    """What the fetchers of one broker share: who they are, the replicas they fill (the
    replica manager's live map), where leaders listen, their settings and the clock."""

    node_id: int
    partitions: Mapping[Key, Partition]
    leader_address: Callable[[int], tuple[str, int] | None]
    settings: FetcherSettings
    clock: Clock
    on_log_start_moved: Callable[[], None] = lambda: None  # a follower's log start moved (checkpoint it)
    on_high_watermark_moved: Callable[[Key], None] = lambda key: None  # a follower learned a new one
    on_epochs_changed: Callable[[Partition], None] = lambda part: None  # a fetched batch began a leader epoch


class ReplicaFetcherManager:
    def __init__(self, context: FollowerContext) -> None:
        self.replicas = context
        self._fetchers: dict[int, ReplicaFetcher] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def update(self) -> None:
        """Match fetchers to the partitions this broker follows (after every metadata change)."""
        wanted: dict[int, dict[tuple[str, int], Partition]] = {}
        for key, part in self.replicas.partitions.items():
            if part.follower is not None:
                wanted.setdefault(part.follower.leader_id, {})[key] = part
        for leader_id, fetcher in list(self._fetchers.items()):
            if leader_id not in wanted:
                fetcher.stop()
                del self._fetchers[leader_id]
        if self._nursery is None:
            return
        for leader_id, parts in wanted.items():
            existing = self._fetchers.get(leader_id)
            if existing is None:
                existing = self._fetchers[leader_id] = ReplicaFetcher(self.replicas, leader_id)
                self._nursery.start_soon(existing.run)
            existing.set_partitions(parts)


class ReplicaFetcher:
    def __init__(self, replicas: FollowerContext, leader_id: int) -> None:
        self.replicas = replicas
        self.leader_id = leader_id
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._cancel = trio.CancelScope()
        self._changed = trio.Event()
        self._conn: BrokerConnection | None = None
        self.session = FetcherSession()
        self._address: tuple[str, int] | None = None

    def stop(self) -> None:
        self.partitions = {}
        self._cancel.cancel()

    def set_partitions(self, parts: dict[tuple[str, int], Partition]) -> None:
        self.partitions = dict(parts)
        self._changed.set()

    async def run(self) -> None:
        backoff = Backoff(0.05, 1.0)
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
                        backoff.reset()
                    except (KafkaConnectionError, ProtocolError, OSError) as exc:
                        log.debug("fetcher of broker %d from %d: %s", self.replicas.node_id, self.leader_id, exc)
                        await self._close()
                        await backoff.sleep()
            finally:
                await self._close()

    async def _close(self) -> None:
        self.session.reset()
        if self._conn is not None:
            with trio.CancelScope(shield=True):
                await self._conn.aclose()
            self._conn = None

    async def _connection(self) -> BrokerConnection:
        address = self.replicas.leader_address(self.leader_id)
        if address is None:
            raise KafkaConnectionError(f"broker {self.leader_id} is not registered")
        if self._conn is None or self._address != address:
            await self._close()
            self._conn = await BrokerConnection(*address, client_id=f"replica-{self.replicas.node_id}",
                                                link=self.replicas.settings.link).connect()
            self._address = address
        return self._conn

    async def _truncate(self, conn: BrokerConnection) -> None:
        todo = [(key, part) for key, part in self.partitions.items() if part.needs_truncation]
        if not todo:
            return
        node_id = self.replicas.node_id
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, index), part in todo:
            topics.setdefault(topic, []).append({"partition": index, "current_leader_epoch": part.leader_epoch,
                                                 "leader_epoch": part.log.leader_epochs.latest_epoch})
        resp = await conn.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, {
            "replica_id": node_id, "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]})
        errors = 0
        for t in resp.topics:
            for p in t.partitions:
                found = self.partitions.get((t.topic, p.partition))
                if found is None or not found.needs_truncation:
                    continue
                part = found
                if p.error_code != ErrorCode.none:
                    errors += 1  # the leader does not lead it (yet): ask again shortly
                    continue
                cut = part.truncate_to_leader(p.leader_epoch, p.end_offset, self.replicas.clock.now_ms())
                if cut is not None:
                    log.info("broker %d truncated %s from %d to %d (diverged from leader %d at epoch %d)",
                             node_id, part.log.name, cut.before, cut.after, self.leader_id, p.leader_epoch)
        if errors:
            await trio.sleep(ERROR_PAUSE_S)

    async def _fetch(self, conn: BrokerConnection) -> None:
        settings = self.replicas.settings
        node_id = self.replicas.node_id
        max_bytes = settings.max_bytes
        wanted = {key: (part.log.log_end_offset, part.log.log_start_offset, part.leader_epoch, max_bytes)
                  for key, part in self.partitions.items() if part.fetching}
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
        wait_ms = settings.wait_max_ms
        resp = await conn.request(ApiKey.FETCH, {
            "replica_id": node_id, "max_wait": wait_ms, "min_bytes": 1,
            "max_bytes": settings.response_max_bytes, "isolation_level": READ_UNCOMMITTED,
            "session_id": session_id, "session_epoch": session_epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in gone.items()], "rack_id": "",
        }, timeout_s=wait_ms / 1000 + 10)
        if resp.error_code != ErrorCode.none:
            # FETCH_SESSION_ID_NOT_FOUND / INVALID_FETCH_SESSION_EPOCH (the leader restarted or
            # evicted us): open a new session with a full fetch.
            log.debug("fetcher of broker %d from %d: session reset (%s)", node_id, self.leader_id,
                      ErrorCode(resp.error_code).name)
            self.session.reset()
            if resp.error_code not in (ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch):
                await trio.sleep(ERROR_PAUSE_S)
            return
        self.session.sent_ok(resp.session_id, wanted, listed, forgotten)
        errors = 0
        moved = False
        now = self.replicas.clock.now_ms()
        for t in resp.responses:
            for p in t.partitions:
                found = self.partitions.get((t.topic, p.partition_index))
                if found is None or not found.fetching:
                    continue
                part = found
                before, hw_before = part.log.log_end_offset, part.high_watermark
                try:
                    outcome = part.handle_fetch_answer(p.error_code, bytes(p.records) if p.records else b"",
                                                       p.high_watermark, p.log_start_offset, now)
                except StorageError as exc:
                    log.error("%s", exc)
                    errors += 1
                    continue
                if outcome.restarted_at is not None:
                    log.info("broker %d: %s ended at %d, below the leader's log start %d: starting over there",
                             node_id, part.log.name, before, outcome.restarted_at)
                if outcome.problem is not None:
                    log.warning("broker %d: fetched data for %s does not fit: %s", node_id, part.log.name,
                                outcome.problem)
                errors += outcome.retry
                moved |= outcome.log_start_moved or outcome.restarted_at is not None
                if part.log.leader_epochs.dirty:
                    self.replicas.on_epochs_changed(part)
                if part.high_watermark != hw_before:
                    self.replicas.on_high_watermark_moved(part.key)  # consumers reading here (KIP-392)
        if moved:
            self.replicas.on_log_start_moved()
        if errors:
            await trio.sleep(ERROR_PAUSE_S)
