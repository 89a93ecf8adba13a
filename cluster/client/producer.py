"""The producer (trio shell around `accumulator.RecordAccumulator`).

    async with Producer({"bootstrap.servers": "127.0.0.1:9092"}) as producer:
        producer.produce("pageviews", b"value", key=b"user-1")          # never blocks
        md = await producer.send_and_wait("pageviews", b"value")         # waits for the ack
        await producer.flush()

One sender task decides what to send; one task per broker writes its produce requests in
order onto the broker's pipelined connection (up to max.in.flight.requests.per.connection),
and a task per request waits for its answer. Idempotence follows Kafka: InitProducerId,
per-partition sequences, retried batches keep their sequences, and a sequence the broker
cannot accept (OUT_OF_ORDER_SEQUENCE with nothing earlier in doubt, UNKNOWN_PRODUCER_ID)
gets a new producer id, with sequences restarting at 0.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

import trio

from cluster.client.accumulator import (
    BATCH_FULL,
    BufferFull,
    DeliveryCallback,
    ProducerBatch,
    RecordAccumulator,
    RecordMetadata,
    TopicPartition,
)
from cluster.client.config import producer_config
from cluster.client.connection import KafkaAuthenticationError, KafkaConnectionError
from cluster.client.errors import (
    METADATA_ERRORS,
    KafkaError,
    KafkaTimeoutError,
    ProducerFenced,
    error_name,
    is_retriable,
)
from cluster.client.metadata import ClientCluster
from cluster.client.partitioner import partition_for_key
from cluster.common.backoff import Backoff
from cluster.common.clock import SYSTEM_CLOCK, Clock
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from cluster.protocol.records import CODEC_IDS, Record

__all__ = ["Producer", "RecordMetadata", "DeliveryFuture", "BufferFull"]

log = logging.getLogger("dcmirror.client.producer")

Headers = list[tuple[str, bytes | None]] | tuple[tuple[str, bytes | None], ...]
# A record's framing in a batch and a produce request, beyond key, value and headers.
RECORD_MAX_OVERHEAD_BYTES = 61 + 128


class DeliveryFuture:
    """The outcome of one record: `await future.wait()` gives its RecordMetadata or raises."""

    __slots__ = ("metadata", "error", "_event")

    def __init__(self) -> None:
        self.metadata: RecordMetadata | None = None
        self.error: Exception | None = None
        self._event: trio.Event | None = None

    @property
    def done(self) -> bool:
        return self.metadata is not None or self.error is not None

    @classmethod
    def completed(cls, metadata: RecordMetadata) -> DeliveryFuture:
        """A future that is already done (for callers that track outcomes in one list, some
        of which need no delivery)."""
        future = cls()
        future._resolve(metadata, None)
        return future

    def _resolve(self, metadata: RecordMetadata | None, error: Exception | None) -> None:
        self.metadata, self.error = metadata, error
        if self._event is not None:
            self._event.set()

    async def wait(self) -> RecordMetadata:
        if not self.done:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        if self.error is not None:
            raise self.error
        assert self.metadata is not None
        return self.metadata


class Producer:
    def __init__(self, config: Mapping[str, Any], *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock  # record timestamps (CreateTime)
        self.config = producer_config(config)
        self._retry_backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        # Between Metadata requests while a held record's topic is still unknown (being created).
        self._metadata_backoff = Backoff(self.config["retry.backoff.ms"] / 1000,
                                         self.config["retry.backoff.max.ms"] / 1000)
        c = self.config
        self.acks = {"all": -1, "-1": -1, "0": 0, "1": 1}[c["acks"]]
        self.idempotent: bool = c["enable.idempotence"]
        self.compression = CODEC_IDS[c["compression.type"]]
        self.max_request_size: int = c["max.request.size"]
        self.request_timeout_s = c["request.timeout.ms"] / 1000
        self.delivery_timeout_s = c["delivery.timeout.ms"] / 1000
        self.max_block_s = c["max.block.ms"] / 1000
        self.accumulator = RecordAccumulator(
            batch_size=c["batch.size"], buffer_memory=c["buffer.memory"], linger_s=c["linger.ms"] / 1000,
            max_in_flight=c["max.in.flight.requests.per.connection"], idempotent=self.idempotent)
        self.cluster = ClientCluster(c)
        self.accumulator.topic_id_of = self.cluster.metadata.topic_id
        self.metrics = {"records": 0, "batches": 0, "requests": 0, "retries": 0, "errors": 0,
                        "bytes": 0, "producer_id_resets": 0}
        self._random_partitions = c["partitioner"] == "random"
        self._sticky: dict[str, int] = {}
        self._unresolved: dict[str, list[tuple[Any, ...]]] = {}
        self._unresolved_since_s: dict[str, float] = {}
        self._node_channels: dict[int, trio.MemorySendChannel[list[ProducerBatch]]] = {}
        self._node_in_flight: dict[int, int] = {}
        self._wakeup = trio.Event()
        self._progress = trio.Event()
        self._need_metadata = True
        self._refreshing = False
        # While a held record's topic has no metadata: when to ask again (after _metadata_backoff).
        self._metadata_retry_at_s = -math.inf
        self._need_reset = False
        self._claiming = False  # claim() was used: fencing is per partition (see _handle_partition)
        self._initializing = False
        self._metadata_error: Exception | None = None
        self._fatal: Exception | None = None
        self._closing = False
        self._nursery: trio.Nursery | None = None
        self._stack: AsyncExitStack | None = None

    # ---- lifecycle ----------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        self._stack = AsyncExitStack()
        self._nursery = await self._stack.enter_async_context(trio.open_nursery())
        self._nursery.start_soon(self._run_sender)
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is None and not self._closing:
                await self.flush(self.delivery_timeout_s)
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop sending (records not yet sent fail with the close) and close connections."""
        if self._closing and self._stack is None:
            return
        self._closing = True
        closed = KafkaError("producer closed before the record was sent", ErrorCode.unknown_server_error)
        for batch in self.accumulator.all_queued():
            self._fail(batch, closed)
        for held in self._unresolved.values():
            for *_, waiter in held:
                _notify(waiter, None, closed)
        self._unresolved.clear()
        try:
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
        finally:
            if self._stack is not None:
                stack, self._stack = self._stack, None
                await stack.aclose()
            await self.cluster.aclose()

    # ---- producing ----------------------------------------------------------------

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                partition: int | None = None, timestamp_ms: int | None = None, headers: Headers = (),
                on_delivery: DeliveryCallback | DeliveryFuture | None = None, compression: str | None = None) -> None:
        """Queue one record; never blocks. Raises BufferFull when buffer.memory is used up.

        `on_delivery(metadata, error)` is called once the record is acknowledged or failed.
        `compression` (a codec name; the partition must be given and known): the record goes
        in a batch of its own with that codec, and max.request.size bounds it compressed
        (the broker says whether it fits) rather than as it is.
        """
        if self._fatal is not None or self._closing:
            raise self._fatal or RuntimeError("produce() on a closed producer")
        if self._claiming and partition is not None and self.fenced(topic, partition):
            raise ProducerFenced(f"{topic}-{partition} was claimed by another writer: claim it again first",
                                 ErrorCode.producer_fenced)
        size = (0 if value is None else len(value)) + (0 if key is None else len(key))
        if headers:
            size += sum(len(k) + (0 if v is None else len(v)) + 10 for k, v in headers)
        if self._unresolved and topic in self._unresolved:
            # Records held for metadata go first: a later record must not overtake them.
            self._release_unresolved(trio.current_time())
        if compression is not None:
            codec = CODEC_IDS[compression]
            count = self.cluster.metadata.partition_count(topic)
            if partition is None or count is None or not 0 <= partition < count:
                raise KafkaError(f"partition {partition} of topic {topic!r} is not known",
                                 ErrorCode.unknown_topic_or_partition)
            if size > self.accumulator.buffer_memory:
                raise KafkaError(f"a record of about {size} bytes exceeds buffer.memory "
                                 f"{self.accumulator.buffer_memory}", ErrorCode.message_too_large)
            if self.accumulator.buffered_bytes >= self.accumulator.buffer_memory:
                raise BufferFull(f"buffer.memory ({self.accumulator.buffer_memory} bytes) is full")
            self.accumulator.append(topic, partition, self.clock.now_ms() if timestamp_ms is None else timestamp_ms,
                                    key, value, headers, on_delivery, trio.current_time, compression=codec)
            if not self._wakeup.is_set():
                self._wakeup.set()
            return
        if size + RECORD_MAX_OVERHEAD_BYTES > self.max_request_size:
            raise KafkaError(f"a record of about {size + RECORD_MAX_OVERHEAD_BYTES} bytes (key, value, headers) "
                             f"exceeds max.request.size {self.max_request_size}", ErrorCode.message_too_large)
        if timestamp_ms is None:
            timestamp_ms = self.clock.now_ms()
        if self._unresolved and topic in self._unresolved:  # still without metadata: wait behind them
            self._hold_unresolved(topic, (topic, partition, value, key, timestamp_ms, headers, on_delivery))
            return
        if partition is None:
            if key is None and not self._random_partitions:
                partition = self._sticky.get(topic)
            if partition is None:
                count = self.cluster.metadata.partition_count(topic)
                if count is None:
                    self._hold_unresolved(topic, (topic, None, value, key, timestamp_ms, headers, on_delivery))
                    return
                partition = self._choose_partition(topic, key, count)
        else:
            count = self.cluster.metadata.partition_count(topic)
            if count is None:
                self._hold_unresolved(topic, (topic, partition, value, key, timestamp_ms, headers, on_delivery))
                return
            if not 0 <= partition < count:
                raise KafkaError(f"partition {partition} is not in topic {topic!r}, which has {count}",
                                 ErrorCode.unknown_topic_or_partition)
        outcome = self.accumulator.append(topic, partition, timestamp_ms, key, value, headers, on_delivery,
                                          trio.current_time)
        if outcome:
            if outcome == BATCH_FULL and self._sticky.get(topic) == partition:
                del self._sticky[topic]  # sticky partitioning: the next batch goes elsewhere
            if not self._wakeup.is_set():
                self._wakeup.set()

    def produce_tagged(self, topic: str, partition: int, records: Sequence[Record], start: int,
                       prefix: tuple[tuple[str, bytes], ...], offset_key: str, suffix: tuple[tuple[str, bytes], ...],
                       on_delivery: DeliveryCallback | DeliveryFuture | None = None,
                       max_record_bytes: int | None = None) -> tuple[int, int]:
        """Queue fetched `records[start:]` for one known partition, each with headers
        prefix + ((offset_key, b"<its offset>"),) + suffix (the mirror's hot path, in C when
        built), stopping at a record with headers of its own or too large for max.request.size
        (send() such a record: it adds the headers, or raises), or when buffer.memory is full.
        `on_delivery` reports the last record queued; `max_record_bytes` lowers the bound on a
        record's key and value (a topic's own limit). Returns (next index, value bytes queued)."""
        if self._fatal is not None or self._closing:
            raise self._fatal or RuntimeError("produce_tagged() on a closed producer")
        if self._claiming and self.fenced(topic, partition):
            raise ProducerFenced(f"{topic}-{partition} was claimed by another writer: claim it again first",
                                 ErrorCode.producer_fenced)
        count = self.cluster.metadata.partition_count(topic)
        if count is None or not 0 <= partition < count:
            raise KafkaError(f"partition {partition} of topic {topic!r} is not known", ErrorCode.unknown_topic_or_partition)
        end, outcome, value_bytes = self.accumulator.append_tagged(
            topic, partition, records, start, prefix, offset_key, suffix,
            min(self.max_request_size - RECORD_MAX_OVERHEAD_BYTES, max_record_bytes or self.max_request_size),
            on_delivery, trio.current_time)
        if outcome and not self._wakeup.is_set():
            self._wakeup.set()
        return end, value_bytes

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Headers = (), compression: str | None = None) -> DeliveryFuture:
        """Queue one record, waiting up to max.block.ms for buffer space and the topic's
        metadata; returns a future of its delivery. `compression`: as produce()."""
        if (partition is None or compression is not None) and self.cluster.metadata.partition_count(topic) is None:
            self._need_metadata = True
            await self.cluster.wait_for_topic(topic, self.max_block_s)
        future = DeliveryFuture()
        if self.accumulator.buffered_bytes >= self.accumulator.buffer_memory:
            await self._wait_for_space()
        self.produce(topic, value, key, partition=partition, timestamp_ms=timestamp_ms, headers=headers,
                     on_delivery=future, compression=compression)
        if self._wakeup.is_set():
            await trio.lowlevel.checkpoint()  # a batch is ready: let the sender ship it
        return future

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                            **kwargs: Any) -> RecordMetadata:
        future = await self.send(topic, value, key, **kwargs)
        return await future.wait()

    async def _wait_for_space(self) -> None:
        with trio.move_on_after(self.max_block_s):
            while self.accumulator.buffered_bytes >= self.accumulator.buffer_memory:
                self._flush_soon()
                await self._progress.wait()
            return
        raise KafkaTimeoutError(f"buffer.memory stayed full for max.block.ms ({self.max_block_s:g} s)")

    def _flush_soon(self) -> None:
        if not self._wakeup.is_set():
            self._wakeup.set()

    async def flush(self, timeout_s: float | None = None) -> None:
        """Send everything queued now and wait until all of it is acknowledged or failed."""
        self.accumulator.flushing += 1
        self._flush_soon()
        try:
            with trio.fail_after(math.inf if timeout_s is None else timeout_s):
                while self.accumulator.incomplete or self._unresolved:
                    await self._progress.wait()
        except trio.TooSlowError:
            raise KafkaTimeoutError(
                f"flush: {self.accumulator.incomplete} batches still unacknowledged after {timeout_s:g} s"
                + self._unresolved_report(trio.current_time())) from None
        finally:
            self.accumulator.flushing -= 1
        if self._fatal is not None:
            raise self._fatal

    def claim(self, topic: str, partition: int, producer_id: int, producer_epoch: int) -> None:
        """Write `partition` as (producer_id, producer_epoch), sequences from 0 — taking over
        from the writer whose id that is, with a higher epoch, fences it (see accumulator.claim).
        Records already queued for the partition must be flushed first. `producer_id` -1: the
        producer's own id (a partition nobody wrote). From the first claim on, a fenced
        partition fails its own records only, never the producer."""
        self._claiming = True
        self.accumulator.claim(topic, partition, producer_id, producer_epoch)

    def fenced(self, topic: str, partition: int) -> bool:
        state = self.accumulator.partitions.get((topic, partition))
        return state is not None and state.fenced

    @property
    def producer_identity(self) -> tuple[int, int]:
        """(producer id, epoch) of this producer's own writes (-1, -1 until InitProducerId)."""
        return self.accumulator.producer_id, self.accumulator.producer_epoch

    def partitions_for(self, topic: str) -> int | None:
        return self.cluster.metadata.partition_count(topic)

    def _choose_partition(self, topic: str, key: bytes | None, count: int) -> int:
        if key is not None and not self._random_partitions:
            return partition_for_key(key, count)
        if self._random_partitions:
            return random.randrange(count)
        p = self._sticky.get(topic)
        if p is None or p >= count:
            p = self._sticky[topic] = self._random_available_partition(topic, count)
        return p

    def _random_available_partition(self, topic: str, count: int) -> int:
        info = self.cluster.metadata.topics.get(topic)
        available = [p for p, pi in info.partitions.items() if pi.leader >= 0] if info else []
        return random.choice(available) if available else random.randrange(count)

    def _unresolved_report(self, now_s: float) -> str:
        """What flush()'s timeout says about records held for their topic's metadata: per
        topic how many and for how long, what the last Metadata answer said of it."""
        if not self._unresolved:
            return ""
        meta = self.cluster.metadata
        asked = self.cluster.asked_topics
        topics = []
        for topic, held in self._unresolved.items():
            info = meta.topics.get(topic)
            if info is None:
                state = "not in the last answer" + ("" if asked is None or topic in asked else ", which did not ask for it")
            elif info.error_code:
                state = f"last answered {error_name(info.error_code)}"
            else:
                state = "last answered with no partitions"
            waited_s = now_s - self._unresolved_since_s.get(topic, now_s)
            topics.append(f"{len(held)} for {topic!r} for {waited_s:.1f} s ({state})")
        wait_s = self._metadata_retry_at_s - now_s
        if self._refreshing:
            status = f"the next request in {wait_s:.1f} s" if wait_s > 0 else "a request is out"
        elif self._need_metadata or self.cluster.stale():
            status = "a request is due"
        else:
            status = f"the next request in {wait_s:.1f} s" if wait_s > 0 else "no request is due"
        error = f"; last metadata error: {self._metadata_error}" if self._metadata_error is not None else ""
        return (f"; {sum(map(len, self._unresolved.values()))} records wait for their topic's metadata: "
                f"{', '.join(topics)}; metadata last answered {now_s - meta.updated_s:.1f} s ago, {status}{error}")

    def _hold_unresolved(self, topic: str, args: tuple[Any, ...]) -> None:
        held = self._unresolved.get(topic)
        if held is None:
            held = self._unresolved[topic] = []
            self._unresolved_since_s[topic] = trio.current_time()
            self._need_metadata = True  # a new topic: ask now (again only after _metadata_backoff)
        if len(held) >= 100_000:
            raise BufferFull(f"100000 records wait for the metadata of topic {topic!r}")
        held.append(args)
        self._flush_soon()

    def _append_resolved(self, topic: str, partition: int, ts: int, key: bytes | None, value: bytes | None,
                         headers: Headers, waiter: Any, now_s: float) -> None:
        try:
            self.accumulator.append(topic, partition, ts, key, value, headers, waiter, now_s)
        except BufferFull as exc:
            _notify(waiter, None, exc)

    def _release_unresolved(self, now_s: float) -> None:
        for topic in list(self._unresolved):
            count = self.cluster.metadata.partition_count(topic)
            if count is not None:
                for topic_, partition, value, key, ts, headers, waiter in self._unresolved.pop(topic):
                    if partition is None:
                        partition = self._choose_partition(topic_, key, count)
                    elif not 0 <= partition < count:
                        _notify(waiter, None, KafkaError(f"partition {partition} is not in topic {topic!r}, which "
                                                         f"has {count}", ErrorCode.unknown_topic_or_partition))
                        continue
                    self._append_resolved(topic_, partition, ts, key, value, headers, waiter, now_s)
                self._unresolved_since_s.pop(topic, None)
                self._signal_progress()  # flush() waits on _unresolved too (its records may all have failed)
            elif now_s - self._unresolved_since_s[topic] >= self.max_block_s:
                info = self.cluster.metadata.topics.get(topic)
                error: Exception
                if info is not None or self._metadata_error is None:
                    code = info.error_code if info and info.error_code else ErrorCode.unknown_topic_or_partition
                    error = KafkaError(f"topic {topic!r} has no metadata after max.block.ms", code)
                else:
                    error = KafkaTimeoutError(f"topic {topic!r}: no metadata within max.block.ms "
                                              f"({self.max_block_s:g} s): {self._metadata_error}")
                for *_, waiter in self._unresolved.pop(topic):
                    _notify(waiter, None, error)
                self._unresolved_since_s.pop(topic, None)
                self._signal_progress()

    # ---- the sender ---------------------------------------------------------------

    async def _run_sender(self) -> None:
        assert self._nursery is not None
        while True:
            now = trio.current_time()
            await self._maintain(now)
            now = trio.current_time()
            self._dispatch(now)
            deadline = self.accumulator.next_deadline_s(now)
            if self._unresolved or self._need_metadata:
                deadline = min(deadline or math.inf, now + 0.1)
            with trio.move_on_at(math.inf if deadline is None else max(deadline, now + 0.0005)):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    async def _maintain(self, now: float) -> None:
        acc = self.accumulator
        for batch in acc.expired(now, self.delivery_timeout_s):
            acc.partitions[(batch.topic, batch.partition)].queue.appendleft(batch)  # completed() finds it there
            if batch.base_sequence >= 0:
                self._need_reset = True
            self._fail(batch, KafkaTimeoutError(
                f"{batch.count} records to {batch.topic}-{batch.partition} not delivered within "
                f"delivery.timeout.ms ({self.delivery_timeout_s:g} s)"))
        if self._unresolved:
            self._release_unresolved(now)  # before deciding on a refresh: what is still held has no metadata
        if not self._refreshing and (self._need_metadata or self.cluster.stale()
                                     or (self._unresolved and now >= self._metadata_retry_at_s)):
            self._refreshing = True
            assert self._nursery is not None
            self._nursery.start_soon(self._refresh_metadata)
        if self.idempotent and (acc.producer_id < 0 or self._need_reset):
            acc.paused = True
            if acc.in_flight_count() == 0 and not self._initializing:
                # In its own task, so expiry (delivery.timeout.ms, max.block.ms) goes on meanwhile.
                self._initializing = True
                assert self._nursery is not None
                self._nursery.start_soon(self._init_producer_id)

    async def _refresh_metadata(self) -> None:
        # Cleared before the request, not after its answer: a need that arises while it is out
        # (a record held for a topic the request did not name, a batch whose leader moved) must
        # bring another request, not be forgotten when this one's answer arrives.
        self._need_metadata = False
        try:
            self.cluster.want_topics({tp[0] for tp in self.accumulator.partitions} | set(self._unresolved))
            await self.cluster.refresh()
            self._metadata_error = None
            missing = sorted(t for t in self._unresolved if self.cluster.metadata.partition_count(t) is None)
            if missing:
                # Not there yet (UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE while it is being
                # created): _maintain asks again after a backoff, until the topic is there or
                # max.block.ms fails its records (metadata.max.age.ms alone would be minutes).
                delay_s = self._metadata_backoff.next_delay_s()
                log.debug("no metadata yet for %s; asking again in %.2f s", missing, delay_s)
                self._metadata_retry_at_s = trio.current_time() + delay_s
            else:
                self._metadata_backoff.reset()
                self._metadata_retry_at_s = -math.inf
        except KafkaAuthenticationError as exc:
            # Wrong credentials stay wrong: fail what waits, as Kafka's producer does, not retry forever.
            self._set_fatal(exc)
        except (KafkaConnectionError, KafkaError) as exc:
            log.debug("metadata refresh failed: %s", exc)
            self._metadata_error = exc
            self._need_metadata = True
            self._metadata_retry_at_s = trio.current_time() + self.config["retry.backoff.ms"] / 1000
            await trio.sleep_until(self._metadata_retry_at_s)
        finally:
            self._refreshing = False
            self._flush_soon()

    async def _init_producer_id(self) -> None:
        try:
            await self._init_producer_id_until_done()
        finally:
            self._initializing = False
            self._flush_soon()

    async def _init_producer_id_until_done(self) -> None:
        backoff = Backoff(self.config["retry.backoff.ms"] / 1000, self.config["retry.backoff.max.ms"] / 1000)
        while True:
            try:
                conn = await self.cluster.any_connection()
                resp = await conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "transaction_timeout": -1},
                                          timeout_s=self.request_timeout_s)
                if resp.error_code == 0:
                    break
                if not is_retriable(resp.error_code):
                    self._set_fatal(KafkaError("InitProducerId", resp.error_code))
                    return
                log.debug("InitProducerId: retriable error %s", resp.error_code)
            except KafkaAuthenticationError as exc:
                self._set_fatal(exc)
                return
            except KafkaConnectionError as exc:
                log.debug("InitProducerId: %s", exc)
            await backoff.sleep()
        if self.accumulator.producer_id >= 0:
            self.metrics["producer_id_resets"] += 1
            log.warning("producer id %d epoch %d replaced by %d epoch %d: sequences restart at 0",
                        self.accumulator.producer_id, self.accumulator.producer_epoch, resp.producer_id,
                        resp.producer_epoch)
        self.accumulator.reset_producer_id(resp.producer_id, resp.producer_epoch)
        self.accumulator.paused = False
        self._need_reset = False

    def _dispatch(self, now: float) -> None:
        """Drain every sendable batch into produce requests: one batch per partition per
        request, requests up to max.request.size, per broker up to the in-flight limit."""
        acc = self.accumulator
        meta = self.cluster.metadata
        max_in_flight = acc.max_in_flight
        building: dict[int, list[ProducerBatch]] = {}
        in_request: dict[int, set[TopicPartition]] = {}
        sizes: dict[int, int] = {}
        progress = True
        while progress:
            progress = False
            for tp, state in acc.partitions.items():
                if not state.queue:
                    continue
                leader = meta.leader(*tp)
                if leader < 0:
                    self._need_metadata = True
                    continue
                batch = acc.sendable(tp, now)
                if batch is None:
                    continue
                if batch.topic_id is not None and meta.topic_id(tp[0]) not in (None, batch.topic_id):
                    self._fail_old_incarnation(tp, meta.topic_id(tp[0]))
                    continue
                size = len(batch.body) + 128
                if leader in building and (tp in in_request[leader] or sizes[leader] + size > self.max_request_size):
                    self._ship(leader, building.pop(leader))
                if leader not in building:
                    if self._node_in_flight.get(leader, 0) >= max_in_flight:
                        continue
                    building[leader], in_request[leader], sizes[leader] = [], set(), 0
                building[leader].append(acc.drain(tp))
                in_request[leader].add(tp)
                sizes[leader] += size
                progress = True
        for node, batches in building.items():
            self._ship(node, batches)

    def _ship(self, node: int, batches: list[ProducerBatch]) -> None:
        channel = self._node_channels.get(node)
        if channel is None:
            send, receive = trio.open_memory_channel[list[ProducerBatch]](math.inf)
            self._node_channels[node] = channel = send
            assert self._nursery is not None
            self._nursery.start_soon(self._node_sender, node, receive)
        self._node_in_flight[node] = self._node_in_flight.get(node, 0) + 1
        channel.send_nowait(batches)

    async def _node_sender(self, node: int, requests: trio.MemoryReceiveChannel[list[ProducerBatch]]) -> None:
        """Writes one broker's produce requests in order; a task per request awaits the answer."""
        assert self._nursery is not None
        async for batches in requests:
            topics: dict[str, list[dict[str, Any]]] = {}
            for b in batches:
                topics.setdefault(b.topic, []).append({"index": b.partition, "records": b.encode(self.compression)})
            body = {"transactional_id": None, "acks": self.acks, "timeout": int(self.request_timeout_s * 1000),
                    "topic_data": [{"name": t, "partition_data": ps} for t, ps in topics.items()]}
            try:
                conn = await self.cluster.connection(node)
                pending = await conn.send(ApiKey.PRODUCE, body, expect_response=self.acks != 0)
            except (KafkaConnectionError, OSError) as exc:
                self._request_failed(node, batches, exc)
                continue
            self.metrics["requests"] += 1
            if pending is None:  # acks=0: written is all we will ever know
                self._node_in_flight[node] -= 1
                for b in batches:
                    self._succeed(b, -1, -1)
                self._flush_soon()
            else:
                self._nursery.start_soon(self._await_answer, node, batches, pending)

    async def _await_answer(self, node: int, batches: list[ProducerBatch], pending: Any) -> None:
        try:
            resp = await pending.wait(self.request_timeout_s + 5)
        except (KafkaConnectionError, OSError) as exc:
            self._request_failed(node, batches, exc)
            return
        self._node_in_flight[node] -= 1
        by_tp = {(b.topic, b.partition): b for b in batches}
        now = trio.current_time()
        for t in resp.responses:
            for p in t.partition_responses:
                batch = by_tp.pop((t.name, p.index), None)
                if batch is not None:
                    self._handle_partition(batch, p.error_code, p.base_offset, p.log_append_time, now,
                                           getattr(p, "error_message", None))
        for batch in by_tp.values():  # the broker did not answer for it: treat as retriable
            self._retry_or_fail(batch, KafkaError("no answer for the partition", ErrorCode.unknown_server_error), now)
        self._flush_soon()

    def _request_failed(self, node: int, batches: list[ProducerBatch], exc: Exception) -> None:
        self._node_in_flight[node] -= 1
        self._need_metadata = True
        log.debug("produce request to broker %d failed: %s", node, exc)
        now = trio.current_time()
        for batch in batches:
            self._retry_or_fail(batch, exc, now, retriable=True)
        self._flush_soon()

    def _handle_partition(self, batch: ProducerBatch, code: int, base_offset: int, log_append_time: Any,
                          now: float, message: str | None) -> None:
        if code == 0:
            append_ms = _millis(log_append_time)
            self._succeed(batch, base_offset, append_ms)
            return
        if code == ErrorCode.duplicate_sequence_number:
            self._succeed(batch, -1, -1)
            return
        what = f"producing {batch.count} records to {batch.topic}-{batch.partition}" + (f" ({message})" if message else "")
        error = KafkaError(what, code)
        if code in (ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced):
            state = self.accumulator.partitions[(batch.topic, batch.partition)]
            if state.claimed_id >= 0 or self._claiming:
                # Another writer claimed this partition after us: it alone writes it now. A
                # producer that claims partitions (the mirror's) is fenced per partition even
                # where it wrote under its own id (a partition that was empty when it took it).
                state.fenced = True
                fenced = ProducerFenced(what + " (the partition was claimed by another writer)", code)
                for b in [*state.in_flight, *state.queue]:
                    self._fail(b, fenced)
                self._fail(batch, fenced)
                return
            self._set_fatal(ProducerFenced(what, code))
            return
        if code in (ErrorCode.out_of_order_sequence_number, ErrorCode.unknown_producer_id):
            if self.accumulator.earlier_in_doubt(batch):
                self._retry_or_fail(batch, error, now, retriable=True)
            else:
                log.warning("%s: %s; resetting the producer id", what, error)
                self._need_reset = True
                self.accumulator.paused = True
                self._retry_or_fail(batch, error, now, retriable=True)
            return
        if code in METADATA_ERRORS:
            self._need_metadata = True
        self._retry_or_fail(batch, error, now, retriable=is_retriable(code))

    def _retry_or_fail(self, batch: ProducerBatch, error: Exception, now: float, *, retriable: bool = True) -> None:
        if batch.done:
            return
        if retriable and batch.attempts <= self.config["retries"] and now - batch.created_s < self.delivery_timeout_s \
                and not self._closing:
            self.metrics["retries"] += 1
            self.accumulator.requeue(batch, now + self._retry_backoff.delay_s(batch.attempts))
            return
        if batch.base_sequence >= 0 and self.idempotent:
            self._need_reset = True  # later sequences of the partition can no longer follow on
        self._fail(batch, error)

    def _succeed(self, batch: ProducerBatch, base_offset: int, append_ms: int) -> None:
        if batch.done:
            return  # already failed (the producer was fenced while it was in flight)
        self.accumulator.completed(batch)
        self.metrics["records"] += batch.count
        self.metrics["batches"] += 1
        self.metrics["bytes"] += len(batch.body)
        for index, ts, waiter in batch.waiters:
            offset = base_offset + index if base_offset >= 0 else -1
            _notify(waiter, RecordMetadata(batch.topic, batch.partition, offset, append_ms if append_ms >= 0 else ts),
                    None)
        self._signal_progress()

    def _fail(self, batch: ProducerBatch, error: Exception) -> None:
        if batch.done:
            return
        self.accumulator.completed(batch)
        self.metrics["errors"] += batch.count
        log.debug("batch to %s-%d failed: %s", batch.topic, batch.partition, error)
        for _, _, waiter in batch.waiters:
            _notify(waiter, None, error)
        self._signal_progress()

    def _fail_old_incarnation(self, tp: TopicPartition, now_id: Any) -> None:
        """The topic was deleted and created again since these batches were filled (KIP-516):
        they are failed, never written into the new topic (UNKNOWN_TOPIC_ID)."""
        state = self.accumulator.partitions[tp]
        for batch in [b for b in state.queue if b.topic_id not in (None, now_id)]:
            self._fail(batch, KafkaError(f"{batch.count} records for {tp[0]}-{tp[1]}: the topic was deleted and "
                                         f"created again (topic id {batch.topic_id} -> {now_id}) before they were "
                                         "sent", ErrorCode.unknown_topic_id))

    def _set_fatal(self, error: Exception) -> None:
        log.error("producer failed: %s", error)
        self._fatal = error
        for state in self.accumulator.partitions.values():
            for batch in [*state.in_flight, *state.queue]:
                self._fail(batch, error)

    def _signal_progress(self) -> None:
        self._progress.set()
        self._progress = trio.Event()


def _notify(waiter: Any, metadata: RecordMetadata | None, error: Exception | None) -> None:
    if waiter is None:
        return  # a held record produced without on_delivery
    if isinstance(waiter, DeliveryFuture):
        waiter._resolve(metadata, error)
    else:
        try:
            waiter(metadata, error)
        except Exception:
            log.exception("on_delivery callback raised")


def _millis(value: Any) -> int:
    if value is None:
        return -1
    if isinstance(value, int):
        return value
    try:
        return int(value.timestamp() * 1000)
    except (AttributeError, OverflowError, ValueError):
        return -1
