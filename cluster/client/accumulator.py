"""The producer's sans-IO core: per-partition record accumulators, idempotent sequence
bookkeeping and the choice of what to send next. No sockets, no clock: `now_s` comes in.

Records are encoded into a batch's records section as they arrive (the hot path is one
`append_record`); a batch closes when it reaches `batch.size`, and is ready to send when
it is closed, has lingered `linger.ms`, or the producer is flushing. With idempotence each
batch gets its sequence numbers when it is first drained and keeps them across retries;
a partition whose batch is being retried sends only that batch until it succeeds, so the
broker always sees sequences in order.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.protocol.records import (
    Record,
    append_record,
    append_tagged,
    batch_from_records_section,
)

TopicPartition = tuple[str, int]
DeliveryCallback = Callable[["RecordMetadata | None", "Exception | None"], None]

# Per-record bytes held against buffer.memory beyond the encoded record (Kafka counts the
# batch, we count the record plus this, so many tiny records also hit the limit).
RECORD_OVERHEAD_BYTES = 16
BATCH_OVERHEAD_BYTES = 61
SEQUENCE_MAX = 2**31 - 1
NEW_BATCH = 1
BATCH_FULL = 2


class BufferFull(Exception):
    """buffer.memory is used up: wait for deliveries (send() does) or flush."""


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a record was written; offset -1 when the broker does not say (acks=0)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


@dataclass(eq=False, slots=True)
class ProducerBatch:
    topic: str
    partition: int
    created_s: float
    body: bytearray = field(default_factory=bytearray)
    count: int = 0
    base_timestamp: int = -1
    max_timestamp: int = -1
    closed: bool = False
    done: bool = False  # acknowledged or failed for good
    # (record index, timestamp, callback or future) for records someone waits on
    waiters: list[tuple[int, int, Any]] = field(default_factory=list)
    attempts: int = 0
    retry_after_s: float = 0.0
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    _built: bytes | None = None
    _built_for: tuple[int, int, int] | None = None
    compression: int = -1  # this batch's codec (-1: the producer's compression.type)
    topic_id: uuid.UUID | None = None  # the topic's incarnation when the batch began (None: not known)

    @property
    def held_bytes(self) -> int:
        """What the batch counts against buffer.memory."""
        return BATCH_OVERHEAD_BYTES + len(self.body) + RECORD_OVERHEAD_BYTES * self.count

    def encode(self, compression: int) -> bytes:
        """The batch as sent: built once per (producer id, epoch, sequence) and reused by retries;
        `compression` unless the batch has a codec of its own."""
        if self.compression >= 0:
            compression = self.compression
        key = (self.producer_id, self.producer_epoch, self.base_sequence)
        if self._built is None or self._built_for != key:
            self._built = batch_from_records_section(
                bytes(self.body), count=self.count, base_offset=0, last_offset_delta=self.count - 1,
                base_timestamp=self.base_timestamp, max_timestamp=self.max_timestamp,
                producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence, compression=compression)
            self._built_for = key
        return self._built


@dataclass(slots=True)
class PartitionState:
    queue: deque[ProducerBatch] = field(default_factory=deque)
    in_flight: list[ProducerBatch] = field(default_factory=list)
    next_sequence: int = 0
    retrying: bool = False  # a batch with a sequence went back to the queue: send one at a time
    # A claimed partition writes as (producer id, epoch) taken over from its previous writer
    # with the epoch bumped: the broker then refuses the previous writer (see `claim`).
    claimed_id: int = -1
    claimed_epoch: int = -1
    fenced: bool = False  # someone claimed it after us: nothing more is sent


class RecordAccumulator:
    def __init__(self, *, batch_size: int, buffer_memory: int, linger_s: float, max_in_flight: int,
                 idempotent: bool) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_s = linger_s
        self.max_in_flight = max_in_flight
        self.idempotent = idempotent
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self._open: dict[TopicPartition, ProducerBatch] = {}  # the batch records go into, per partition
        self.buffered_bytes = 0
        self.producer_id = -1
        self.producer_epoch = -1
        self.flushing = 0
        self.paused = False  # waiting for a new producer id: nothing is drained
        self.incomplete = 0  # batches appended to and not yet completed or failed
        # The topic id a new batch is stamped with (KIP-516): a batch is never sent into
        # another incarnation of its topic than the one it was filled for.
        self.topic_id_of: Callable[[str], uuid.UUID | None] | None = None

    # ---- appending (hot path) -----------------------------------------------------

    def append(self, topic: str, partition: int, timestamp: int, key: bytes | None, value: bytes | None,
               headers: tuple[tuple[str, bytes | None], ...] | list[tuple[str, bytes | None]],
               waiter: Any, now_s: Callable[[], float] | float, compression: int = -1) -> int:
        """Add a record (the producer's hot path). Returns NEW_BATCH when it started a batch
        (a linger timer begins), BATCH_FULL when a batch filled up (send it), else 0.
        `now_s` may be a clock function: it is only read when a batch starts. `compression`
        (a codec id) puts the record in a batch of its own with that codec."""
        if self.buffered_bytes >= self.buffer_memory:
            raise BufferFull(f"buffer.memory ({self.buffer_memory} bytes) is full")
        batch = self._open.get((topic, partition))
        outcome = 0
        if compression >= 0:
            if batch is not None:
                batch.closed = True
                del self._open[(topic, partition)]
            batch = self._new_batch(topic, partition, now_s() if callable(now_s) else now_s)
            batch.base_timestamp = batch.max_timestamp = timestamp
            batch.compression = compression
            self.buffered_bytes += append_record(batch.body, 0, 0, key, value, headers) + RECORD_OVERHEAD_BYTES
            batch.count = 1
            if waiter is not None:
                batch.waiters.append((0, timestamp, waiter))
            batch.closed = True
            return BATCH_FULL
        if batch is not None:
            body = batch.body
            if len(body) < self.batch_size:
                n = append_record(body, batch.count, timestamp - batch.base_timestamp, key, value, headers)
                if len(body) <= self.batch_size:
                    if timestamp > batch.max_timestamp:
                        batch.max_timestamp = timestamp
                    batch.count += 1
                    self.buffered_bytes += n + RECORD_OVERHEAD_BYTES
                    if waiter is not None:
                        batch.waiters.append((batch.count - 1, timestamp, waiter))
                    if len(body) >= self.batch_size:
                        batch.closed = True
                        del self._open[(topic, partition)]
                        return BATCH_FULL
                    return 0
                del body[-n:]
            batch.closed = True
            del self._open[(topic, partition)]
            outcome = BATCH_FULL
        batch = self._new_batch(topic, partition, now_s() if callable(now_s) else now_s)
        batch.base_timestamp = batch.max_timestamp = timestamp
        n = append_record(batch.body, 0, 0, key, value, headers)
        batch.count = 1
        self.buffered_bytes += n + RECORD_OVERHEAD_BYTES
        if waiter is not None:
            batch.waiters.append((0, timestamp, waiter))
        if len(batch.body) >= self.batch_size:
            batch.closed = True
            return BATCH_FULL
        self._open[(topic, partition)] = batch
        return outcome or NEW_BATCH

    def append_tagged(self, topic: str, partition: int, records: Sequence[Record], start: int,
                      prefix: tuple[tuple[str, bytes], ...], offset_key: str, suffix: tuple[tuple[str, bytes], ...],
                      max_record_bytes: int, waiter: Any, now_s: Callable[[], float] | float) -> tuple[int, int, int]:
        """Add `records[start:]` to one partition, each with headers prefix + (offset_key, its
        offset) + suffix (the mirror's provenance; `append_tagged` in records.py), in C when
        built, until a record has headers of its own or a key and value longer than
        `max_record_bytes`, or buffer.memory is full. `waiter` is told about the last record
        added.

        Returns (next index, outcome as from append(), value bytes added)."""
        tp = (topic, partition)
        i, n = start, len(records)
        outcome = value_bytes = 0
        last: ProducerBatch | None = None
        while i < n and self.buffered_bytes < self.buffer_memory:
            batch = self._open.get(tp)
            if batch is None:
                r = records[i]
                if r.headers or (len(r.key) if r.key is not None else 0) + (
                        len(r.value) if r.value is not None else 0) > max_record_bytes:
                    break
                batch = self._new_batch(topic, partition, now_s() if callable(now_s) else now_s)
                batch.base_timestamp = batch.max_timestamp = records[i].timestamp
                self._open[tp] = batch
                outcome |= NEW_BATCH
            i, added, nbytes, max_ts, vbytes, full = append_tagged(
                batch.body, records, i, batch.count, batch.base_timestamp, self.batch_size, prefix, offset_key, suffix,
                max_record_bytes)
            if added:
                batch.count += added
                self.buffered_bytes += nbytes + RECORD_OVERHEAD_BYTES * added
                if max_ts > batch.max_timestamp:
                    batch.max_timestamp = max_ts
                value_bytes += vbytes
                last = batch
            if full or len(batch.body) >= self.batch_size:
                batch.closed = True
                del self._open[tp]
                outcome |= BATCH_FULL
            else:
                break  # the end, or a record with headers of its own
        if waiter is not None and last is not None:
            last.waiters.append((last.count - 1, records[i - 1].timestamp, waiter))
        return i, outcome, value_bytes

    def _new_batch(self, topic: str, partition: int, now_s: float) -> ProducerBatch:
        state = self.partitions.get((topic, partition))
        if state is None:
            state = self.partitions[(topic, partition)] = PartitionState()
        batch = ProducerBatch(topic, partition, now_s)
        if self.topic_id_of is not None:
            batch.topic_id = self.topic_id_of(topic)
        state.queue.append(batch)
        self.buffered_bytes += BATCH_OVERHEAD_BYTES
        self.incomplete += 1
        return batch

    # ---- choosing what to send ----------------------------------------------------

    def sendable(self, tp: TopicPartition, now_s: float) -> ProducerBatch | None:
        """The partition's first batch if it may be sent now."""
        state = self.partitions.get(tp)
        if state is None or not state.queue or self.paused:
            return None
        batch = state.queue[0]
        if batch.retry_after_s > now_s:
            return None
        if not (batch.closed or self.flushing or now_s - batch.created_s >= self.linger_s or len(state.queue) > 1):
            return None
        if state.retrying and state.in_flight:
            return None  # retries go one at a time, in sequence order
        if len(state.in_flight) >= self.max_in_flight:
            return None
        if self.idempotent and batch.base_sequence < 0 and self.producer_id < 0 and state.claimed_id < 0:
            return None  # no producer id yet
        if state.fenced:
            return None
        return batch

    def next_deadline_s(self, now_s: float) -> float | None:
        """When the next batch that is not yet sendable will be (linger or retry backoff)."""
        best: float | None = None
        for state in self.partitions.values():
            if state.queue:
                batch = state.queue[0]
                t = max(batch.retry_after_s, batch.created_s + self.linger_s)
                if best is None or t < best:
                    best = t
        return best

    def drain(self, tp: TopicPartition) -> ProducerBatch:
        """Take the partition's first batch for sending (after `sendable` said yes)."""
        state = self.partitions[tp]
        batch = state.queue.popleft()
        if not batch.closed:
            batch.closed = True
            self._open.pop(tp, None)
        if self.idempotent and batch.base_sequence < 0:
            if state.claimed_id >= 0:
                batch.producer_id, batch.producer_epoch = state.claimed_id, state.claimed_epoch
            else:
                batch.producer_id, batch.producer_epoch = self.producer_id, self.producer_epoch
            batch.base_sequence = state.next_sequence
            state.next_sequence = (state.next_sequence + batch.count) & SEQUENCE_MAX
        batch.attempts += 1
        state.in_flight.append(batch)
        if not state.queue or state.queue[0].base_sequence < 0:
            state.retrying = False  # requeued batches sit at the front: none are left
        return batch

    # ---- outcomes -----------------------------------------------------------------

    def completed(self, batch: ProducerBatch) -> None:
        """The batch is acknowledged or failed for good: forget it and release its memory."""
        assert not batch.done, "a batch completes once"
        batch.done = True
        state = self.partitions[(batch.topic, batch.partition)]
        if batch in state.in_flight:
            state.in_flight.remove(batch)
        elif batch in state.queue:
            state.queue.remove(batch)
        if not batch.closed:
            batch.closed = True
            self._open.pop((batch.topic, batch.partition), None)
        self.buffered_bytes -= batch.held_bytes
        self.incomplete -= 1

    def requeue(self, batch: ProducerBatch, retry_after_s: float) -> None:
        """A retriable failure: the batch goes back in sequence order, to be sent alone."""
        state = self.partitions[(batch.topic, batch.partition)]
        if batch in state.in_flight:
            state.in_flight.remove(batch)
        batch.retry_after_s = retry_after_s
        queue = state.queue
        i = 0
        while i < len(queue) and 0 <= queue[i].base_sequence and (
                batch.base_sequence < 0 or _seq_before(queue[i].base_sequence, batch.base_sequence)):
            i += 1
        queue.insert(i, batch)
        if batch.base_sequence >= 0:
            state.retrying = True

    def earlier_in_doubt(self, batch: ProducerBatch) -> bool:
        """Whether a batch with a lower sequence of the same partition is still unresolved (so
        an OUT_OF_ORDER_SEQUENCE answer to `batch` is its consequence, not data loss)."""
        state = self.partitions[(batch.topic, batch.partition)]
        return any(0 <= b.base_sequence and _seq_before(b.base_sequence, batch.base_sequence)
                   for b in (*state.in_flight, *state.queue) if b is not batch)

    def in_flight_count(self) -> int:
        return sum(len(s.in_flight) for s in self.partitions.values())

    def claim(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> None:
        """Write `partition` as (producer_id, producer_epoch) from now on, sequences from 0:
        with the previous writer's id and a higher epoch, the broker fences that writer."""
        assert self.idempotent, "claims need enable.idempotence"
        state = self.partitions.get((topic, partition))
        if state is None:
            state = self.partitions[(topic, partition)] = PartitionState()
        assert not state.in_flight and not state.queue, "claim a partition before writing to it"
        state.claimed_id, state.claimed_epoch = producer_id, producer_epoch
        state.next_sequence = 0
        state.fenced = False

    def reset_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """A new producer id/epoch (after a sequence could not be repaired): every partition's
        sequences restart at 0 and unacknowledged batches are renumbered when next sent
        (a claimed partition keeps its claimed id with the epoch bumped once more)."""
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        for state in self.partitions.values():
            assert not state.in_flight, "reset the producer id only with nothing in flight"
            if state.claimed_id >= 0 and state.next_sequence:
                state.claimed_epoch = min(state.claimed_epoch + 1, 32767)
            state.next_sequence = 0
            state.retrying = False
            for batch in state.queue:
                batch.base_sequence = -1
                batch.producer_id = batch.producer_epoch = -1

    def expired(self, now_s: float, delivery_timeout_s: float) -> list[ProducerBatch]:
        """Queued (not in-flight) batches past delivery.timeout.ms, removed from their queues."""
        out = []
        for state in self.partitions.values():
            while state.queue and now_s - state.queue[0].created_s >= delivery_timeout_s:
                batch = state.queue.popleft()
                if not batch.closed:
                    batch.closed = True
                    self._open.pop((batch.topic, batch.partition), None)
                out.append(batch)
        return out

    def all_queued(self) -> list[ProducerBatch]:
        return [b for s in self.partitions.values() for b in s.queue]


def _seq_before(a: int, b: int) -> bool:
    """Sequence a comes before b (sequences wrap at 2**31)."""
    return a != b and ((b - a) & SEQUENCE_MAX) < (1 << 30)
