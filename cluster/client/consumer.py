"""The consumer: assign or subscribe (classic consumer groups, see group.py), fetch
prefetching per broker, positions, seek, commits.

    async with Consumer({"bootstrap.servers": bs, "group.id": "g", "auto.offset.reset": "earliest"}) as c:
        c.subscribe(["pageviews"])
        batches = await c.getmany(timeout_s=1.0)      # {(topic, partition): [Record, ...]}
        await c.commit()

One fetch task per broker keeps a Fetch in flight for the partitions that broker leads
while the prefetch buffer (queued.max.messages.kbytes) has room, so records are decoded
while the application works on the previous ones. Only records below the high watermark
arrive (the broker sees to that); control batches are skipped.

Each position belongs to one incarnation of its topic (KIP-516): its topic id, taken when
the position is set. Fetches name the topic by that id (Fetch v13, where the broker speaks
it), so no record of a topic deleted and created again under the same name is ever handed
out as if it followed the old position; the change surfaces instead (`TopicIdChanged` with
auto.offset.reset=none, else a reset). `getmany_chunks` also says which topic id and leader
epochs the records came with, for callers that keep history as a follower does (the mirror).
"""

from __future__ import annotations

import logging
import math
import random
import re
import uuid
import zlib
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, NamedTuple

import trio

from cluster.client.config import consumer_config, isolation_level
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import METADATA_ERRORS, KafkaError
from cluster.client.group import GroupCoordinatorChannel, GroupMembership
from cluster.client.metadata import ClientCluster
from cluster.client.topic_partition import TopicPartition
from cluster.common.backoff import Backoff
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.fetch_session import FetcherSession
from cluster.protocol.record_batch import (
    BATCH_HEADER_SIZE,
    InvalidRecordBatch,
    iter_committed,
    scan_batches,
)
from cluster.protocol.records import Record, decode_records, decompress
from cluster.protocol.sentinels import CONSUMER_REPLICA_ID, EARLIEST_TIMESTAMP, LATEST_TIMESTAMP

__all__ = ["Consumer", "ConsumerRecord", "FetchedChunk", "OffsetOutOfRange", "TopicIdChanged", "TopicPartition",
           "EARLIEST", "LATEST"]

log = logging.getLogger("dcmirror.client.consumer")

EARLIEST = EARLIEST_TIMESTAMP
LATEST = LATEST_TIMESTAMP
FETCH_LANES_MAX = 16  # connections per broker one consumer may fetch over (a flow's num.replica.fetchers)
RebalanceCallback = Callable[[list[TopicPartition]], Awaitable[None]]


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class PartitionError(KafkaError):
    """An error of one partition the application must act on (seek clears it); `tp` names it."""

    def __init__(self, message: str, code: int, tp: TopicPartition | None = None, *,
                 log_start_offset: int = -1, high_watermark: int = -1) -> None:
        super().__init__(message, code)
        self.tp = tp
        self.log_start_offset = log_start_offset
        self.high_watermark = high_watermark


class OffsetOutOfRange(PartitionError):
    """A position outside the log and auto.offset.reset=none: seek somewhere valid."""


class TopicIdChanged(PartitionError):
    """The topic of a position was deleted and created again (another topic id) and
    auto.offset.reset=none: the position means nothing in the new incarnation; seek."""

    def __init__(self, message: str, tp: TopicPartition, old_id: uuid.UUID, new_id: uuid.UUID) -> None:
        super().__init__(message, ErrorCode.unknown_topic_id, tp)
        self.old_id = old_id
        self.new_id = new_id


class FetchedChunk(NamedTuple):
    """Records of one partition as fetched, with the topic id they were fetched under (None
    from brokers without topic ids) and the leader epoch of each run of them: (offset of the
    run's first record, epoch), ascending."""

    tp: TopicPartition
    records: list[Record]
    topic_id: uuid.UUID | None
    leader_epochs: list[tuple[int, int]]

    def epoch_of(self, index: int) -> int:
        """Leader epoch of records[index] (-1 if no batch said)."""
        offset = self.records[index].offset
        epoch = -1
        for first, e in self.leader_epochs:
            if first > offset:
                break
            epoch = e
        return epoch


class RawChunk(NamedTuple):
    """Whole record batches of one partition as the broker sent them (a consumer made with
    raw_batches=True): data and control batches, aborted transactions included, nothing
    decoded. `next_offset` is the offset after the last batch; the first batch may start
    below the position it was fetched from (a batch is never split)."""

    tp: TopicPartition
    data: bytes
    topic_id: uuid.UUID | None
    next_offset: int
    batches: int
    records: int
    fetch_offset: int  # the position it was fetched from: the previous chunk's next_offset


@dataclass(slots=True)
class PartitionPosition:
    position: int | None = None  # next offset the application gets; None: to be looked up
    fetch_offset: int | None = None  # next offset to fetch (ahead of position by what is buffered)
    paused: bool = False  # by the application (pause/resume)
    parked: bool = False  # by an error the application must act on (seek clears it)
    high_watermark: int = -1
    log_start_offset: int = -1
    answered_at_s: float = -1.0  # trio.current_time() of the last fetch answer without error
    retry_after_s: float = 0.0
    epoch: int = 0  # bumped on seek: fetch answers for an older epoch are dropped
    # KIP-392: the replica the leader sent this consumer to (-1: the leader), until when
    read_replica: int = -1
    read_replica_until_s: float = 0.0
    topic_id: uuid.UUID | None = None  # the incarnation the position belongs to (None: not known yet)


class Consumer:
    def __init__(self, config: Mapping[str, Any], *, raw_batches: bool = False, fetch_lanes: int = 1) -> None:
        """`raw_batches`: fetched data is handed out as it came (getmany_raw), never decoded
        (a copier of whole batches: the mirror's offset-keeping flows). `fetch_lanes`: the
        partitions a broker leads are split over this many connections, each with its own
        Fetch in flight, so more bytes are on the way than one fetch answer carries (a
        copier over a long round trip); 1 is what every Kafka client does."""
        if not 1 <= fetch_lanes <= FETCH_LANES_MAX:
            raise ValueError(f"fetch_lanes must be 1..{FETCH_LANES_MAX}, not {fetch_lanes}")
        self.config = consumer_config(config)
        self.raw_batches = raw_batches
        self.fetch_lanes = fetch_lanes
        self._raw: deque[tuple[int, RawChunk]] = deque()  # (seek epoch, chunk)
        c = self.config
        self.group_id: str = c["group.id"]
        self.cluster = ClientCluster(c)
        reset = {"smallest": "earliest", "largest": "latest", "error": "none"}.get(c["auto.offset.reset"],
                                                                                  c["auto.offset.reset"])
        self.auto_offset_reset: str = reset
        self.request_timeout_s = c["request.timeout.ms"] / 1000
        self._assigned: dict[TopicPartition, PartitionPosition] = {}
        # (partition, seek epoch, records, weight against queued.max.messages.kbytes, offset
        # after the chunk's last batch, (topic id, leader epochs): see FetchedChunk)
        self._buffer: deque[_Buffered] = deque()
        self._buffered_bytes = 0
        self._max_buffered_bytes = c["queued.max.messages.kbytes"] * 1024
        self._errors: list[Exception] = []
        self._fatal: Exception | None = None
        self._changed = trio.Event()  # assignment, positions or buffer room changed
        # The same, but for the positions and metadata tasks, which walk every assigned
        # partition when woken: not set by a seek or a resume of partitions with a position
        # and a leader (a claim of thousands would otherwise wake them thousands of times).
        self._background_changed = trio.Event()
        self._arrived = trio.Event()  # records (or an error) arrived
        self._fetchers: set[tuple[int, int]] = set()  # (broker, lane) with a fetcher task
        self._rotation = 0
        self._resolving = False
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None
        self.group: GroupMembership | None = None  # when subscribed
        self.group_channel = GroupCoordinatorChannel(self.cluster, self.group_id, c)
        self._pending_reset: dict[TopicPartition, str] = {}
        self.metrics = {"records": 0, "bytes": 0, "fetches": 0, "fetch_partitions_listed": 0}
        self._sessions: dict[tuple[int, int], FetcherSession] = {}  # (node, lane) -> its fetch session
        self.cluster.on_update(self._metadata_updated)

    # ---- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        self._stack = AsyncExitStack()
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._nursery.start_soon(self._run_positions)
        self._nursery.start_soon(self._run_metadata)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Commit (with enable.auto.commit), leave the group, stop fetching."""
        try:
            if self.group is not None:
                # Shielded and bounded: leaving also runs when the caller is being cancelled.
                with trio.move_on_after(self.request_timeout_s) as scope:
                    scope.shield = True
                    await self.group.leave()
        finally:
            if self._nursery is not None:
                # No task starts from here on (a metadata answer still being taken starts no fetcher).
                nursery, self._nursery = self._nursery, None
                nursery.cancel_scope.cancel()
            if self._stack is not None:
                stack, self._stack = self._stack, None
                await stack.aclose()
            await self.cluster.aclose()

    # ---- assignment ---------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (no group membership; commits still work with a group.id)."""
        if self.group is not None:
            raise RuntimeError("assign() after subscribe(): a consumer does one or the other")
        self._set_assignment(list(partitions))

    def subscribe(self, topics: Iterable[str] = (), *, pattern: str | None = None,
                  on_assign: RebalanceCallback | None = None, on_revoke: RebalanceCallback | None = None) -> None:
        """Join the consumer group for `topics` (or every topic matching `pattern`)."""
        if not self.group_id:
            raise ValueError("subscribe() needs a group.id")
        if self._nursery is None:
            raise RuntimeError("use the consumer as `async with Consumer(...)` before subscribe()")
        if self._assigned and self.group is None:
            raise RuntimeError("subscribe() after assign(): a consumer does one or the other")
        regex = re.compile(pattern) if pattern is not None else None
        if self.group is None:
            self.group = GroupMembership(self.group_channel, list(topics), regex, on_assign, on_revoke,
                                         positions=self._positions, set_assignment=self._set_assignment,
                                         fail=self._fail)
            self._nursery.start_soon(self.group.run)
        else:
            self.group.resubscribe(list(topics), regex)

    def _fail(self, exc: Exception) -> None:
        """A fatal error of the group (FencedInstanceId): raised from every poll from now on."""
        self._fatal = exc
        self._arrived.set()
        self._arrived = trio.Event()

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def _set_assignment(self, partitions: list[TopicPartition],
                        positions: Mapping[TopicPartition, int] | None = None) -> None:
        old = self._assigned
        self._assigned = {tp: old.get(tp) or PartitionPosition() for tp in partitions}
        for tp, offset in (positions or {}).items():
            if tp in self._assigned:
                self._seek_state(self._assigned[tp], offset)
        self._drop_buffered(lambda tp: tp not in self._assigned)
        self.cluster.want_topics({t for t, _ in partitions})
        self._signal_changed()

    # ---- positions ----------------------------------------------------------------

    def position(self, tp: TopicPartition) -> int | None:
        """Offset of the next record the application will get (None until looked up)."""
        return self._state(tp).position

    def highwater(self, tp: TopicPartition) -> int:
        """The partition's high watermark as of the last fetch (-1 before any)."""
        return self._state(tp).high_watermark

    def log_start(self, tp: TopicPartition) -> int:
        """The partition's log start offset as the last fetch answer said (-1: none yet)."""
        state = self._assigned.get(tp)
        return state.log_start_offset if state is not None else -1

    def since_last_answer_s(self, tp: TopicPartition) -> float | None:
        """Seconds since the partition's leader last answered a fetch (None before any): how
        old highwater() is. Long polls keep it under fetch.max.wait.ms while the leader is
        reachable, even when nothing is written."""
        at = self._state(tp).answered_at_s
        return None if at < 0 else trio.current_time() - at

    def seek(self, tp: TopicPartition, offset: int, *, topic_id: uuid.UUID | None = None) -> None:
        """Next getmany() starts at `offset` (EARLIEST / LATEST also accepted), in the
        incarnation `topic_id` of the topic (default: the one the metadata names at the next
        fetch)."""
        state = self._state(tp)
        if offset in (EARLIEST, LATEST):
            self._reset_later(tp, state, "earliest" if offset == EARLIEST else "latest")
        else:
            self._seek_state(state, offset)
            state.topic_id = topic_id
        self._drop_buffered(lambda t: t == tp, (tp,))
        self._signal_changed((tp,))

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for tp in tps or list(self._assigned):
            self.seek(tp, EARLIEST)

    def seek_to_end(self, *tps: TopicPartition) -> None:
        for tp in tps or list(self._assigned):
            self.seek(tp, LATEST)

    async def seek_to_timestamp(self, timestamps: Mapping[TopicPartition, int]) -> None:
        """Seek each partition to its first record at or after the timestamp (ms); to the end if none."""
        offsets = await self.offsets_for_times(timestamps)
        for tp, offset in offsets.items():
            self.seek(tp, LATEST if offset is None else offset)

    def pause(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self._state(tp).paused = True
        paused = set(tps)
        self._drop_buffered(lambda t: t in paused, paused)

    def resume(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self._state(tp).paused = False
        self._signal_changed(tps)

    def _state(self, tp: TopicPartition) -> PartitionPosition:
        state = self._assigned.get(tp)
        if state is None:
            raise KeyError(f"partition {tp[0]}-{tp[1]} is not assigned to this consumer")
        return state

    def _seek_state(self, state: PartitionPosition, offset: int) -> None:
        state.position = state.fetch_offset = offset
        state.epoch += 1
        state.retry_after_s = 0.0
        state.parked = False
        state.topic_id = None  # the incarnation the metadata names at the first fetch, unless said

    def _reset_later(self, tp: TopicPartition, state: PartitionPosition, strategy: str) -> None:
        state.position = state.fetch_offset = None
        state.epoch += 1
        state.topic_id = None
        self._pending_reset[tp] = strategy

    async def list_offsets(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """ListOffsets at each partition's leader: EARLIEST, LATEST or a timestamp (ms);
        None where no record has a timestamp that late."""
        out: dict[TopicPartition, int | None] = {}
        todo = dict(timestamps)
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        for _attempt in range(10):
            meta = self.cluster.metadata
            if any(meta.leader(*tp) < 0 for tp in todo):
                meta = await self.cluster.refresh({t for t, _ in todo})
            for t in sorted({t for t, _ in todo}):
                info = meta.topics.get(t)
                if info is not None and info.error_code in (ErrorCode.topic_authorization_failed,
                                                            ErrorCode.invalid_topic_exception):
                    raise KafkaError(f"listing offsets of {t}", info.error_code)  # no retry will change it
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in todo:
                by_leader.setdefault(self.cluster.metadata.leader(*tp), []).append(tp)
            retry: dict[TopicPartition, int] = {}
            last_error: Exception | None = None
            for leader, tps in by_leader.items():
                if leader < 0:
                    retry.update({tp: todo[tp] for tp in tps})
                    continue
                topics: dict[str, list[dict[str, Any]]] = {}
                for t, p in tps:
                    topics.setdefault(t, []).append({"partition_index": p, "timestamp": todo[(t, p)],
                                                     "current_leader_epoch": -1})
                try:
                    conn = await self.cluster.connection(leader)
                    resp = await conn.request(ApiKey.LIST_OFFSETS, {
                        "replica_id": CONSUMER_REPLICA_ID, "isolation_level": self._isolation_level(),
                        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
                        timeout_s=self.request_timeout_s)
                except KafkaConnectionError as exc:
                    last_error = exc
                    retry.update({tp: todo[tp] for tp in tps})
                    continue
                for t in resp.topics:
                    for p in t.partitions:
                        tp = (t.name, p.partition_index)
                        if p.error_code == 0:
                            out[tp] = None if p.offset < 0 else p.offset
                        elif p.error_code in METADATA_ERRORS or p.error_code == ErrorCode.offset_not_available:
                            retry[tp] = todo[tp]
                            last_error = KafkaError(f"listing offsets of {tp[0]}-{tp[1]}", p.error_code)
                        else:
                            raise KafkaError(f"listing offsets of {tp[0]}-{tp[1]}", p.error_code)
            if not retry:
                return out
            todo = retry
            await self.cluster.refresh({t for t, _ in todo})
            await backoff.sleep()
        raise KafkaError(f"listing offsets of {sorted(todo)} failed after 10 attempts: {last_error}",
                         getattr(last_error, "code", ErrorCode.unknown_server_error))

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        return await self.list_offsets(timestamps)

    async def beginning_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o or 0 for tp, o in (await self.list_offsets({tp: EARLIEST for tp in tps})).items()}

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: o or 0 for tp, o in (await self.list_offsets({tp: LATEST for tp in tps})).items()}

    def _isolation_level(self) -> int:
        return isolation_level(self.config)

    # ---- commits ------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit `offsets` (next offsets to read), or every assigned partition's position."""
        if not self.group_id:
            raise ValueError("commit() needs a group.id")
        if offsets is None:
            offsets = self._positions()
        await self.group_channel.commit_offsets(dict(offsets), self.group)

    def _positions(self) -> dict[TopicPartition, int]:
        return {tp: s.position for tp, s in self._assigned.items() if s.position is not None}

    def commit_async(self, offsets: Mapping[TopicPartition, int] | None = None,
                     on_done: Callable[[Exception | None], None] | None = None) -> None:
        """Start a commit in the background; `on_done(error)` is told how it went."""
        assert self._nursery is not None
        snapshot = dict(offsets) if offsets is not None else self._positions()

        async def run() -> None:
            error: Exception | None = None
            try:
                await self.commit(snapshot)
            except (KafkaError, KafkaConnectionError) as exc:
                error = exc
                log.warning("async commit failed: %s", exc)
            if on_done is not None:
                on_done(error)

        self._nursery.start_soon(run)

    async def committed(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return await self.group_channel.fetch_committed(list(tps))

    # ---- getting records ----------------------------------------------------------

    async def getmany(self, timeout_s: float = 0.0, max_records: int | None = None) -> dict[TopicPartition, list[Record]]:
        """Records that arrived, per partition, in order; waits up to `timeout_s` for some."""
        out: dict[TopicPartition, list[Record]] = {}
        for chunk in await self.getmany_chunks(timeout_s, max_records):
            out.setdefault(chunk.tp, []).extend(chunk.records)
        return out

    async def getmany_chunks(self, timeout_s: float = 0.0, max_records: int | None = None) -> list[FetchedChunk]:
        """As getmany(), as chunks that carry their topic id and leader epochs (a partition's
        chunks in offset order)."""
        out: list[FetchedChunk] = []
        with trio.move_on_after(timeout_s):
            while not self._buffer and not self._errors and self._fatal is None:
                await self._arrived.wait()
        if self._fatal is not None:
            raise self._fatal
        if self._errors:
            raise self._errors.pop(0)
        budget = math.inf if max_records is None else max_records
        buffer = self._buffer
        while buffer and budget > 0:
            tp, epoch, records, weight, end, origin = buffer[0]
            state = self._assigned.get(tp)
            if state is None or state.epoch != epoch or state.paused or state.parked or not records \
                    or state.position is None or records[-1].offset < state.position:
                buffer.popleft()
                self._buffered_bytes -= weight
                if (state is not None and state.epoch == epoch and not state.paused and not state.parked
                        and state.position is not None and end > state.position and (
                            not records or records[-1].offset < state.position)):
                    # Only control batches (transaction markers) or aborted data: the
                    # position moves past them, as a Kafka consumer's does.
                    state.position = end
                    self._signal_changed()
                continue
            if records[0].offset < state.position:
                records = [r for r in records if r.offset >= state.position]
            if len(records) > budget:
                n = int(budget)
                take, rest = records[:n], records[n:]
                share = weight * n // len(records)
                buffer[0] = (tp, epoch, rest, weight - share, end, origin)
                self._buffered_bytes -= share
                records = take
            else:
                buffer.popleft()
                self._buffered_bytes -= weight
                rest = []
            out.append(FetchedChunk(tp, records, origin[0], origin[1]))
            state.position = records[-1].offset + 1 if rest else max(records[-1].offset + 1, end)
            budget -= len(records)
        if out:
            self._signal_changed()
        return out

    async def getmany_raw(self, timeout_s: float = 0.0, max_bytes: int | None = None) -> list[RawChunk]:
        """Whole batches as fetched (a consumer made with raw_batches=True), a partition's
        chunks in offset order, up to about `max_bytes`; each moves the partition's position
        to its next_offset. Chunks of a partition paused, sought or revoked since are dropped."""
        out: list[RawChunk] = []
        with trio.move_on_after(timeout_s):
            while not self._raw and not self._errors and self._fatal is None:
                await self._arrived.wait()
        if self._fatal is not None:
            raise self._fatal
        if self._errors:
            raise self._errors.pop(0)
        budget = math.inf if max_bytes is None else max_bytes
        raw = self._raw
        while raw and (budget > 0 or not out):
            epoch, chunk = raw.popleft()
            self._buffered_bytes -= len(chunk.data)
            state = self._assigned.get(chunk.tp)
            if state is None or state.epoch != epoch or state.paused or state.parked or state.position is None \
                    or chunk.next_offset <= state.position:
                continue
            out.append(chunk)
            state.position = chunk.next_offset
            budget -= len(chunk.data)
        if out:
            self._signal_changed()
        return out

    async def getone(self, timeout_s: float = math.inf) -> ConsumerRecord | None:
        """The next record (None if none came within `timeout_s`)."""
        got = await self.getmany(timeout_s, max_records=1)
        for (topic, partition), records in got.items():
            r = records[0]
            return ConsumerRecord(topic, partition, r.offset, r.timestamp, r.key, r.value, r.headers)
        return None

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        while True:
            record = await self.getone(1.0)
            if record is not None:
                return record

    def _drop_buffered(self, predicate: Callable[[TopicPartition], bool],
                       tps: Collection[TopicPartition] | None = None) -> None:
        """Buffered records of the partitions `predicate` names go, and those partitions fetch
        again from their position; `tps`: those partitions, when the caller knows them (a
        claim seeks thousands one by one: walking every assignment each time was quadratic)."""
        kept: deque[_Buffered] = deque()
        for item in self._buffer:
            if predicate(item[0]):
                self._buffered_bytes -= item[3]
            else:
                kept.append(item)
        self._buffer = kept
        if self._raw:
            raw_kept: deque[tuple[int, RawChunk]] = deque()
            for epoch, chunk in self._raw:
                if predicate(chunk.tp):
                    self._buffered_bytes -= len(chunk.data)
                else:
                    raw_kept.append((epoch, chunk))
            self._raw = raw_kept
        states = self._assigned.items() if tps is None else [(tp, self._assigned[tp]) for tp in tps
                                                              if tp in self._assigned]
        for tp, state in states:
            if predicate(tp) and state.position is not None:
                state.fetch_offset = state.position
                state.epoch += 1

    def _signal_changed(self, tps: Collection[TopicPartition] | None = None) -> None:
        """Wake the background tasks; `tps`: only these partitions changed (their fetchers; the
        positions and metadata tasks only if one of them lacks a position or a leader)."""
        self._changed.set()
        self._changed = trio.Event()
        meta = self.cluster.metadata
        if tps is None or any((s := self._assigned.get(tp)) is not None and s.position is None
                              or meta.leader(*tp) < 0 for tp in tps):
            self._background_changed.set()
            self._background_changed = trio.Event()
        self._ensure_fetchers(tps)

    # ---- background: positions, metadata, fetching -------------------------------

    async def _run_positions(self) -> None:
        """Find a starting offset for partitions without one: the group's committed offset,
        else auto.offset.reset."""
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        while True:
            missing = [tp for tp, s in self._assigned.items() if s.position is None]
            if missing:
                try:
                    await self._resolve_positions(missing)
                except (KafkaError, KafkaConnectionError) as exc:
                    log.debug("looking up positions failed: %s", exc)
                    await backoff.sleep()
                    continue
                backoff.reset()
                self._signal_changed()
                continue
            await self._background_changed.wait()

    async def _resolve_positions(self, missing: list[TopicPartition]) -> None:
        committed: dict[TopicPartition, int | None] = {}
        if self.group_id:
            need_committed = [tp for tp in missing if tp not in self._pending_reset]
            if need_committed:
                committed = await self.committed(need_committed)
        resets: dict[TopicPartition, int] = {}
        for tp in missing:
            state = self._assigned.get(tp)
            if state is None or state.position is not None:
                continue
            offset = committed.get(tp)
            if offset is not None and tp not in self._pending_reset:
                self._seek_state(state, offset)
                continue
            strategy = self._pending_reset.get(tp, self.auto_offset_reset)
            if strategy == "none":
                self._errors.append(OffsetOutOfRange(
                    f"partition {tp[0]}-{tp[1]} has no committed offset and auto.offset.reset=none",
                    ErrorCode.offset_out_of_range))
                self._arrived.set()
                self._arrived = trio.Event()
                state.position = state.fetch_offset = -1
                state.parked = True  # until the application seeks
                continue
            resets[tp] = EARLIEST if strategy == "earliest" else LATEST
        if resets:
            found = await self.list_offsets(resets)
            for tp, offset in found.items():
                state = self._assigned.get(tp)
                if state is not None and state.position is None:
                    self._seek_state(state, offset or 0)
                    self._pending_reset.pop(tp, None)

    async def _run_metadata(self) -> None:
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        while True:
            # Look before waiting: an assignment made before this task first ran has already
            # signalled its change.
            changed = self._background_changed
            leaderless = any(self.cluster.metadata.leader(*tp) < 0 for tp in self._assigned)
            if self.cluster.stale() or leaderless:
                try:
                    await self.cluster.refresh()
                except (KafkaError, KafkaConnectionError) as exc:
                    log.debug("metadata refresh failed: %s", exc)
                    await trio.sleep(self.config["retry.backoff.ms"] / 1000)
                self._check_incarnations()
                self._ensure_fetchers()
                leaderless = any(self.cluster.metadata.leader(*tp) < 0 for tp in self._assigned)
                if leaderless:
                    log.debug("no leader known for %s", sorted(f"{t}-{p}" for t, p in self._assigned
                                                             if self.cluster.metadata.leader(t, p) < 0))
            else:
                self._ensure_fetchers()  # e.g. a read replica's time is up: back to the leader
            # A partition without a leader (a topic being created again, an election) is
            # looked up again with backoff, not after metadata.max.age.ms.
            wait_s = backoff.next_delay_s() if leaderless else self.config["metadata.max.age.ms"] / 1000
            if not leaderless:
                backoff.reset()
            with trio.move_on_after(wait_s):
                await changed.wait()

    def _metadata_updated(self) -> None:
        """Any refresh of the cluster's metadata, whichever task made it: a partition whose
        leader it names is fetched from that leader now. (The group's heartbeat loop refreshes
        every metadata.max.age.ms too; had only the metadata task's own refreshes started
        fetchers, the group's would keep the metadata fresh, the metadata task would find
        nothing stale, and a leader elected while a partition had none would not be fetched
        from for as long as that went on.)"""
        self._check_incarnations()
        self._ensure_fetchers()

    def _check_incarnations(self) -> None:
        """Positions of a topic that was deleted and created again (the metadata names another
        topic id than the position's): with auto.offset.reset=none the application is told
        (TopicIdChanged) and the partition waits for a seek; otherwise it is reset."""
        meta = self.cluster.metadata
        for tp, state in self._assigned.items():
            now_id = meta.topic_id(tp[0])
            if state.topic_id is None or now_id is None or now_id == state.topic_id or state.parked:
                continue
            old_id = state.topic_id
            if self.auto_offset_reset == "none":
                self._errors.append(TopicIdChanged(
                    f"topic {tp[0]} was deleted and created again (topic id {old_id} -> {now_id}): position "
                    f"{state.position} of partition {tp[1]} belongs to the old topic", tp, old_id, now_id))
                state.parked = True
                self._drop_buffered(lambda t, tp=tp: t == tp, (tp,))  # type: ignore[misc]
                self._arrived.set()
                self._arrived = trio.Event()
            else:
                log.warning("topic %s was deleted and created again (topic id %s -> %s): partition %d reset to "
                            "the %s offset", tp[0], old_id, now_id, tp[1], self.auto_offset_reset)
                self._reset_later(tp, state, self.auto_offset_reset)
                self._drop_buffered(lambda t, tp=tp: t == tp, (tp,))  # type: ignore[misc]
                self._signal_changed()

    def _fetch_node(self, tp: TopicPartition, state: PartitionPosition, now: float) -> int:
        """Where `tp` is fetched from: the read replica the leader named (KIP-392) while
        that lasts (metadata.max.age.ms, then the leader is asked again), else the leader."""
        if state.read_replica >= 0:
            if now < state.read_replica_until_s and state.read_replica in self.cluster.metadata.brokers:
                return state.read_replica
            state.read_replica = -1
        return self.cluster.metadata.leader(*tp)

    def _lane(self, tp: TopicPartition) -> int:
        """Which of a broker's fetch lanes fetches `tp` (stable, spread by partition)."""
        return 0 if self.fetch_lanes == 1 else (zlib.crc32(tp[0].encode()) + tp[1]) % self.fetch_lanes

    def _ensure_fetchers(self, tps: Collection[TopicPartition] | None = None) -> None:
        """A fetcher for every (node, lane) some partition (of `tps`, default all) fetches from."""
        if self._nursery is None:
            return
        now = trio.current_time()
        states = self._assigned.items() if tps is None else [(tp, self._assigned[tp]) for tp in tps
                                                              if tp in self._assigned]
        for tp, state in states:
            node = self._fetch_node(tp, state, now)
            key = (node, self._lane(tp))
            if node >= 0 and key not in self._fetchers:
                log.debug("fetching from broker %d (lane %d)", *key)
                self._fetchers.add(key)
                self._nursery.start_soon(self._run_fetcher, *key)

    def _fetchable(self, node: int, now: float, lane: int = 0) -> list[tuple[TopicPartition, PartitionPosition]]:
        return [(tp, s) for tp, s in self._assigned.items()
                if not s.paused and not s.parked and s.fetch_offset is not None and s.fetch_offset >= 0
                and s.retry_after_s <= now and self._fetch_node(tp, s, now) == node and self._lane(tp) == lane]

    async def _run_fetcher(self, node: int, lane: int = 0) -> None:
        """Keep a Fetch in flight to `node` while the prefetch buffer has room. The next
        fetch goes out as soon as an answer's batch headers say where it ends, before its
        records are decoded, so the broker works while this side decodes."""
        pending: _SentFetch | None = None
        try:
            while True:
                if pending is None:
                    pending = await self._send_fetch(node, lane)
                    if pending is None:
                        now = trio.current_time()
                        if not any(self._fetch_node(tp, s, now) == node and self._lane(tp) == lane
                                   for tp, s in self._assigned.items()):
                            # Its partitions are another node's now (a new leader, the end of
                            # a read replica's time): that node's fetcher takes them.
                            self._fetchers.discard((node, lane))
                            self._ensure_fetchers()
                            return
                        with trio.move_on_after(0.2):
                            await self._changed.wait()
                        continue
                answer, requested, names, listing = pending
                pending = None
                session = self._sessions.get((node, lane))
                try:
                    resp = await answer.wait(self.request_timeout_s + self.config["fetch.max.wait.ms"] / 1000)
                except KafkaConnectionError as exc:
                    log.debug("fetch from broker %d failed: %s", node, exc)
                    if session is not None:
                        session.reset()
                    self._leave_read_replica(node, list(requested))
                    await self._backoff_partitions(list(requested))
                    continue
                self.metrics["fetches"] += 1
                if resp.error_code != ErrorCode.none:
                    # FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH (the broker
                    # restarted or evicted the session), FETCH_SESSION_TOPIC_ID_ERROR: the
                    # next fetch is a full one that opens a new session.
                    log.debug("fetch from broker %d: %s; opening a new fetch session", node,
                              KafkaError("fetch", resp.error_code))
                    if session is not None:
                        session.reset()
                    if resp.error_code not in SESSION_ERRORS:
                        await self._backoff_partitions(list(requested))
                    continue
                if session is not None and listing is not None:
                    session.sent_ok(resp.session_id, *listing)
                    self.metrics["fetch_partitions_listed"] += len(listing[1])
                    if resp.session_id:
                        self._answered_unchanged(requested)
                decode = self._handle_fetch(resp, requested, node, names)
                if decode:
                    pending = await self._send_fetch(node, lane)
                    self._decode(decode)
        finally:
            log.debug("no more fetching from broker %d (lane %d)", node, lane)
            self._fetchers.discard((node, lane))

    async def _send_fetch(self, node: int, lane: int = 0) -> _SentFetch | None:
        """A Fetch of the partitions `node` serves this lane. In an incremental fetch session
        (KIP-227, FetchRequest v7+, as the Java consumer) it lists only the partitions whose
        fetch offset changed since the broker last heard of them, and the broker answers only
        the partitions with something new: at thousands of partitions the request and the
        answer are a few partitions, not all of them."""
        c = self.config
        parts = (self._fetchable(node, trio.current_time(), lane) if self._buffered_bytes < self._max_buffered_bytes
                 else [])
        if not parts:
            return None
        self._rotation = rotation = (self._rotation + 1) % len(parts)
        parts = parts[rotation:] + parts[:rotation]  # fair share of max_bytes
        meta = self.cluster.metadata
        for (t, _), s in parts:
            if s.topic_id is None:
                s.topic_id = meta.topic_id(t)
        requested = {tp: (s.fetch_offset or 0, s.epoch) for tp, s in parts}
        # One incarnation per topic name in a request: a partition whose position belongs to
        # another one than the others waits for the next request.
        ids: dict[str, uuid.UUID | None] = {}
        for (t, p), s in parts:
            if ids.setdefault(t, s.topic_id) != s.topic_id:
                del requested[(t, p)]
        partition_max_bytes = c["max.partition.fetch.bytes"]
        try:
            conn = await self.cluster.connection(node, "data" if lane == 0 else f"fetch-{lane}")
        except KafkaConnectionError as exc:
            log.debug("fetch from broker %d failed: %s", node, exc)
            self._leave_read_replica(node, list(requested))
            await self._backoff_partitions(list(requested))
            return None
        top_version = conn.versions.get(ApiKey.FETCH, (0, -1))[1]
        # KIP-516: by topic id wherever every topic's is known and the broker speaks v13,
        # so an answer can only come from the incarnation each position belongs to.
        by_id = all(ids.values()) and top_version >= FETCH_BY_TOPIC_ID_VERSION
        session = self._sessions.get((node, lane))
        if top_version >= FETCH_SESSION_VERSION and c["fetch.sessions.enable"]:
            if session is None:
                session = self._sessions[node, lane] = FetcherSession()
            if session.by_id != by_id:
                session.reset()  # a session keeps partitions by topic name or by id, not both
                session.by_id = by_id
            wanted: dict[TopicPartition, tuple[int, ...]] = {
                tp: (offset, partition_max_bytes) for tp, (offset, _) in requested.items()}
            session_id, session_epoch, listed, forgotten = session.build(wanted)
            listing: tuple[dict[TopicPartition, tuple[int, ...]], list[TopicPartition], list[TopicPartition]] | None \
                = (wanted, listed, forgotten)
        else:
            session_id, session_epoch, listed, forgotten, listing = 0, -1, list(requested), [], None
        topics: dict[str, list[dict[str, Any]]] = {}
        for t, p in listed:
            topics.setdefault(t, []).append({
                "partition": p, "current_leader_epoch": -1, "fetch_offset": requested[(t, p)][0],
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": partition_max_bytes})
        gone: dict[str, list[int]] = {}
        for t, p in forgotten:
            gone.setdefault(t, []).append(p)
        # v13 forgets by topic id: the one this fetch names, else the metadata's.
        gone_ids = {t: ids.get(t) or self.cluster.metadata.topic_id(t) for t in gone}
        body = {"replica_id": CONSUMER_REPLICA_ID, "max_wait": c["fetch.max.wait.ms"], "min_bytes": c["fetch.min.bytes"],
                "max_bytes": c["fetch.max.bytes"], "isolation_level": self._isolation_level(),
                "session_id": session_id, "session_epoch": session_epoch, "rack_id": c["client.rack"],
                "forgotten_topics_data": [{"topic": t, "topic_id": gone_ids[t], "partitions": ps}
                                          for t, ps in gone.items()],
                "topics": [{"topic": t, "topic_id": ids[t], "partitions": ps} for t, ps in topics.items()]}
        try:
            answer = await conn.send(ApiKey.FETCH, body, version=FETCH_BY_TOPIC_ID_VERSION if by_id else None)
        except KafkaConnectionError as exc:
            log.debug("fetch from broker %d failed: %s", node, exc)
            if session is not None:
                session.reset()
            self._leave_read_replica(node, list(requested))
            await self._backoff_partitions(list(requested))
            return None
        names = {topic_id: t for t, topic_id in ids.items()} if by_id else None
        return answer, requested, names, listing

    def _answered_unchanged(self, requested: dict[TopicPartition, tuple[int, int]]) -> None:
        """In a session the answer leaves out the partitions with nothing new: they were
        answered too (a source that stops answering shows as silence, never these)."""
        now = trio.current_time()
        assigned = self._assigned
        for tp, asked in requested.items():
            state = assigned.get(tp)
            if state is not None and (state.fetch_offset, state.epoch) == asked:
                state.answered_at_s = now

    def _leave_read_replica(self, node: int, tps: list[TopicPartition]) -> None:
        """A read replica that failed: back to the leader (which may name it again)."""
        for tp in tps:
            state = self._assigned.get(tp)
            if state is not None and state.read_replica == node:
                state.read_replica = -1

    async def _backoff_partitions(self, tps: list[TopicPartition]) -> None:
        until = trio.current_time() + self.config["retry.backoff.ms"] / 1000 * random.uniform(0.8, 1.2)
        for tp in tps:
            if tp in self._assigned:
                self._assigned[tp].retry_after_s = until
        try:
            await self.cluster.refresh()
        except (KafkaError, KafkaConnectionError):
            pass
        self._check_incarnations()
        self._signal_changed()

    def _handle_fetch(self, resp: Any, requested: dict[TopicPartition, tuple[int, int]], node: int = -1,
                      names: dict[uuid.UUID | None, str] | None = None) -> list[_Decode]:
        """Errors, high watermarks and next fetch offsets (from batch headers alone); returns
        the record data still to decode: (partition, epoch, data, first offset wanted, aborted
        transactions, topic id). `node` answered; a leader may name another replica to read
        from (KIP-392). `names`: topic id -> name of a fetch by topic id (v13)."""
        decode: list[_Decode] = []
        arrived = False
        reset = False
        stale_leaders = False
        moved = False
        for t in resp.responses:
            topic = t.topic if names is None else names.get(t.topic_id)
            if topic is None:
                continue
            for p in t.partitions:
                tp = (topic, p.partition_index)
                state = self._assigned.get(tp)
                asked = requested.get(tp)
                if state is None or asked is None or (state.fetch_offset, state.epoch) != asked:
                    continue  # revoked, paused or seeked while the fetch was out
                preferred = getattr(p, "preferred_read_replica", -1)
                if p.error_code == 0 and preferred >= 0 and preferred != node:
                    state.read_replica = preferred
                    state.read_replica_until_s = trio.current_time() + self.config["metadata.max.age.ms"] / 1000
                    moved = True
                    continue
                if p.error_code != 0 and state.read_replica == node:
                    # A follower that cannot serve this (not caught up, not a replica any more,
                    # another epoch): ask the leader again, as Kafka's consumer does.
                    state.read_replica = -1
                    moved = True
                    continue
                if p.error_code == 0:
                    state.high_watermark = p.high_watermark
                    state.log_start_offset = p.log_start_offset
                    state.answered_at_s = trio.current_time()
                    if p.records:
                        try:
                            next_offset = _next_fetch_offset(p.records, asked[0])
                        except InvalidRecordBatch as exc:
                            self._corrupt(tp, state, asked[0], exc)
                            arrived = True
                            continue
                        if next_offset > asked[0]:
                            state.fetch_offset = next_offset
                            aborted = getattr(p, "aborted_transactions", None)
                            decode.append((tp, state.epoch, p.records, asked[0],
                                           None if aborted is None else [(a.producer_id, a.first_offset)
                                                                         for a in aborted], state.topic_id))
                elif p.error_code == ErrorCode.offset_out_of_range:
                    log.info("offset %d out of range for %s-%d (log start %d, high watermark %d); "
                             "auto.offset.reset=%s", asked[0], tp[0], tp[1], p.log_start_offset, p.high_watermark,
                             self.auto_offset_reset)
                    if self.auto_offset_reset == "none":
                        self._errors.append(OffsetOutOfRange(
                            f"offset {asked[0]} of {tp[0]}-{tp[1]} is out of range "
                            f"[{p.log_start_offset}, {p.high_watermark}]", p.error_code, tp,
                            log_start_offset=p.log_start_offset, high_watermark=p.high_watermark))
                        state.parked = True
                        arrived = True
                    else:
                        self._reset_later(tp, state, self.auto_offset_reset)
                        reset = True
                elif p.error_code == ErrorCode.unknown_topic_id:
                    log.debug("fetching %s-%d from broker %d: UNKNOWN_TOPIC_ID", tp[0], tp[1], node)
                    # The incarnation the position belongs to is gone: the metadata tells
                    # whether another one took its name (_check_incarnations).
                    stale_leaders = True
                    state.retry_after_s = trio.current_time() + self.config["retry.backoff.ms"] / 1000
                elif p.error_code in METADATA_ERRORS or p.error_code == ErrorCode.not_leader_or_follower:
                    log.debug("fetching %s-%d from broker %d: %s", tp[0], tp[1], node, KafkaError("fetch", p.error_code))
                    stale_leaders = True
                    state.retry_after_s = trio.current_time() + self.config["retry.backoff.ms"] / 1000
                else:
                    log.warning("fetching %s-%d: %s", tp[0], tp[1], KafkaError("fetch", p.error_code))
                    state.retry_after_s = trio.current_time() + self.config["retry.backoff.ms"] / 1000
        if arrived:
            self._arrived.set()
            self._arrived = trio.Event()
        if stale_leaders:
            self.cluster.metadata.updated_s = -1e18  # the metadata task refreshes
        if moved:
            self._ensure_fetchers()
        if stale_leaders or reset or moved:
            self._signal_changed()  # wakes the metadata and positions tasks
        return decode

    def _corrupt(self, tp: TopicPartition, state: PartitionPosition, offset: int, exc: Exception) -> None:
        self._errors.append(KafkaError(f"corrupt data fetched from {tp[0]}-{tp[1]} at offset {offset}: {exc}",
                                       ErrorCode.corrupt_message))
        state.parked = True

    def _decode(self, work: list[_Decode]) -> None:
        arrived = False
        for tp, epoch, data, from_offset, aborted, topic_id in work:
            state = self._assigned.get(tp)
            if state is None or state.epoch != epoch:
                continue
            if self.raw_batches:
                try:
                    span = scan_batches(data, strict=True)
                except InvalidRecordBatch as exc:
                    self._corrupt(tp, state, from_offset, exc)
                    arrived = True
                    continue
                if span.count:
                    whole = bytes(memoryview(data)[:span.end]) if span.end < len(data) else bytes(data)
                    self._raw.append((epoch, RawChunk(tp, whole, topic_id, span.next_offset, span.count,
                                                      span.records, from_offset)))
                    self._buffered_bytes += span.end
                    self.metrics["bytes"] += span.end
                    arrived = True
                continue
            leader_epochs: list[tuple[int, int]] = []
            try:
                records = self._parse(data, from_offset, aborted, leader_epochs)
                end = _next_fetch_offset(data, from_offset)
            except InvalidRecordBatch as exc:
                self._corrupt(tp, state, from_offset, exc)
                arrived = True
                continue
            # A chunk of markers only still counts against queued.max.messages.kbytes (a
            # little), so a consumer nobody polls stops fetching them too.
            weight = _approx_bytes(records) if records else _EMPTY_CHUNK_BYTES
            self._buffer.append((tp, epoch, records, weight, end, (topic_id, leader_epochs)))
            self._buffered_bytes += weight
            arrived = True
        if arrived:
            self._arrived.set()
            self._arrived = trio.Event()

    def _parse(self, data: bytes, fetch_offset: int, aborted: list[tuple[int, int]] | None = None,
               leader_epochs: list[tuple[int, int]] | None = None) -> list[Record]:
        """Records at or after `fetch_offset` from the whole batches in `data` (a partial last
        batch is left for the next fetch; control batches are skipped). `aborted` (read_committed:
        the fetch answer's aborted transactions, (producer id, first offset)) drops the
        batches of aborted transactions, as Kafka's consumer does. `leader_epochs` gets
        (first offset, epoch) of each run of records of one leader epoch."""
        records: list[Record] = []
        for pos, header in iter_committed(data, aborted, strict=True, check_crcs=self.config["check.crcs"]):
            if header.base_offset + header.last_offset_delta >= fetch_offset:
                body = data[pos + BATCH_HEADER_SIZE:pos + header.size_bytes]
                if header.compression:
                    body = decompress(header.compression, body)
                batch = decode_records(body, header.records_count, header.base_offset, header.base_timestamp)
                if batch and batch[0].offset < fetch_offset:
                    batch = [r for r in batch if r.offset >= fetch_offset]
                if batch and leader_epochs is not None and (
                        not leader_epochs or leader_epochs[-1][1] != header.partition_leader_epoch):
                    leader_epochs.append((batch[0].offset, header.partition_leader_epoch))
                records.extend(batch)
        self.metrics["records"] += len(records)
        self.metrics["bytes"] += len(data)
        return records


_EMPTY_CHUNK_BYTES = 64
FETCH_BY_TOPIC_ID_VERSION = 13  # KIP-516
FETCH_SESSION_VERSION = 7  # KIP-227
SESSION_ERRORS = frozenset({ErrorCode.fetch_session_id_not_found, ErrorCode.invalid_fetch_session_epoch,
                            ErrorCode.fetch_session_topic_id_error})
# A Fetch in flight: its answer, the partitions asked (position, seek epoch), topic id ->
# name of a fetch by id, and for a session what build() listed (wanted, listed, forgotten).
_SentFetch = tuple[Any, dict[TopicPartition, tuple[int, int]], dict[uuid.UUID | None, str] | None,
                   tuple[dict[TopicPartition, tuple[int, ...]], list[TopicPartition], list[TopicPartition]] | None]
# A buffered chunk: partition, seek epoch, records, weight, offset after its last batch,
# (topic id, leader epochs).
_Buffered = tuple[TopicPartition, int, list[Record], int, int, tuple[uuid.UUID | None, list[tuple[int, int]]]]
# Fetched data to decode: partition, seek epoch, data, first offset wanted, aborted
# transactions, topic id.
_Decode = tuple[TopicPartition, int, bytes, int, list[tuple[int, int]] | None, uuid.UUID | None]


def _next_fetch_offset(data: bytes, fetch_offset: int) -> int:
    """Where the next fetch starts: after the last whole batch in `data` (headers only)."""
    return max(fetch_offset, scan_batches(data, strict=True).next_offset)


def _approx_bytes(records: list[Record]) -> int:
    """Bytes a chunk holds against queued.max.messages.kbytes (estimated from its ends)."""
    first, last = records[0], records[-1]
    per = (len(first.value or b"") + len(first.key or b"") + len(last.value or b"") + len(last.key or b"")) // 2 + 40
    return per * len(records)
