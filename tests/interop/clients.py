"""Thin produce/consume/admin wrappers over the real clients, with bounded waits.

Consumers never join a group (the broker has no group coordinator yet): confluent-kafka
uses assign() with explicit offsets and no commits, kafka-python and aiokafka use
group_id=None with assign().
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tests.interop.common import Got, Rec, norm_headers

# ---------------------------------------------------------------- confluent-kafka


def ck_admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def ck_create_topic(
    bootstrap: str, topic: str, partitions: int, config: Mapping[str, str] | None = None
) -> None:
    from confluent_kafka.admin import NewTopic

    admin = ck_admin(bootstrap)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=dict(config or {}))],
        operation_timeout=10,
        request_timeout=15,
    )
    futures[topic].result(timeout=20)
    ck_wait_topic(bootstrap, topic, partitions)


def ck_wait_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 15.0) -> None:
    """Wait until Metadata shows the topic with `partitions` partitions, each with a leader."""
    admin = ck_admin(bootstrap)
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=5)
        t = md.topics.get(topic)
        last = t
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
            p.leader >= 0 and p.error is None for p in t.partitions.values()
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {topic} not ready with {partitions} partitions: {last!r}")


def ck_partition_count(bootstrap: str, topic: str) -> int:
    md = ck_admin(bootstrap).list_topics(topic=topic, timeout=10)
    t = md.topics[topic]
    assert t.error is None, t.error
    return len(t.partitions)


def ck_produce(
    bootstrap: str,
    topic: str,
    recs: Sequence[Rec],
    conf: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = 60.0,
    flush_every: int | None = None,
) -> list[tuple[int, int]]:
    """Produce all records; return (partition, offset) from each delivery report.
    flush_every=N flushes after every N records, so each chunk becomes its own batch."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "message.timeout.ms": 30000,
            "socket.timeout.ms": 10000,
            **(conf or {}),
        }
    )
    results: list[tuple[int, int] | None] = [None] * len(recs)
    errors: list[tuple[int, Any]] = []

    def report(i: int) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append((i, err))
            else:
                results[i] = (msg.partition(), msg.offset())

        return cb

    deadline = time.monotonic() + timeout_s
    for i, r in enumerate(recs):
        kwargs: dict[str, Any] = {
            "key": r.key,
            "value": r.value,
            "timestamp": r.timestamp_ms,
            "on_delivery": report(i),
        }
        if r.headers:
            kwargs["headers"] = list(r.headers)
        if r.partition is not None:
            kwargs["partition"] = r.partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                assert time.monotonic() < deadline, "producer queue stayed full"
                producer.poll(0.1)
        if flush_every and (i + 1) % flush_every == 0:
            assert producer.flush(max(1.0, deadline - time.monotonic())) == 0, "flush timed out"
        elif i % 500 == 0:
            producer.poll(0)
    remaining = producer.flush(max(1.0, deadline - time.monotonic()))
    assert remaining == 0, f"{remaining} records still undelivered after {timeout_s}s; errors={errors[:5]}"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:5]}"
    assert all(x is not None for x in results)
    return [x for x in results if x is not None]


def ck_consumer(bootstrap: str, conf: Mapping[str, Any] | None = None) -> Any:
    from confluent_kafka import Consumer

    # confluent-kafka insists on a group.id even for assign(); nothing is committed.
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "interop-assign-only",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            "socket.timeout.ms": 10000,
            "fetch.wait.max.ms": 100,
            **(conf or {}),
        }
    )


def ck_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """(low, high) watermark per partition, queried from the broker (ListOffsets)."""
    from confluent_kafka import TopicPartition

    consumer = ck_consumer(bootstrap)
    try:
        return {
            p: tuple(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10))
            for p in range(partitions)
        }
    finally:
        consumer.close()


def ck_got(msg: Any) -> Got:
    from confluent_kafka import TIMESTAMP_CREATE_TIME

    ts_type, ts = msg.timestamp()
    return Got(
        partition=msg.partition(),
        offset=msg.offset(),
        key=msg.key(),
        value=msg.value(),
        headers=norm_headers(msg.headers()),
        timestamp_ms=ts,
        create_time=ts_type == TIMESTAMP_CREATE_TIME,
    )


def ck_consume(
    bootstrap: str,
    topic: str,
    counts: Mapping[int, int],
    *,
    start: int | Mapping[int, int] | None = None,
    conf: Mapping[str, Any] | None = None,
    timeout_s: float = 45.0,
    settle_s: float = 0.5,
) -> list[Got]:
    """Assign every partition in `counts` at `start` (default OFFSET_BEGINNING) and read
    until each partition delivered its expected count (then `settle_s` more, to catch
    extras). Returns what arrived even when short, so the caller's exact comparison says
    what is missing."""
    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    if start is None:
        start = OFFSET_BEGINNING
    starts = start if isinstance(start, Mapping) else {p: start for p in counts}
    consumer = ck_consumer(bootstrap, conf)
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in counts])
        got: list[Got] = []
        seen: dict[int, int] = {p: 0 for p in counts}
        deadline = time.monotonic() + timeout_s
        while any(seen[p] < n for p, n in counts.items()) and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error():
                    raise AssertionError(f"consumer error on {topic}: {msg.error()!r}")
                got.append(ck_got(msg))
                seen[msg.partition()] = seen.get(msg.partition(), 0) + 1
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            for msg in consumer.consume(num_messages=1000, timeout=0.2):
                if msg.error():
                    raise AssertionError(f"consumer error on {topic}: {msg.error()!r}")
                got.append(ck_got(msg))
        return got
    finally:
        consumer.close()


# ---------------------------------------------------------------- kafka-python


class QuotaAdmin:
    """Describe/AlterClientQuotas through kafka-python's own protocol classes (its encoder, on
    its admin connection): neither confluent-kafka 2.16 nor kafka-python 3.0's
    KafkaAdminClient has a client-quota call."""

    def __init__(self, bootstrap: str, **conf: Any) -> None:
        from kafka.admin import KafkaAdminClient

        self.client = KafkaAdminClient(**{"bootstrap_servers": bootstrap, "request_timeout_ms": 15000, **conf})
        self.last_throttle_ms = 0

    def _send(self, request: Any) -> Any:
        async def send() -> Any:
            return await self.client._manager.send(request)

        response = self.client._manager.run(send)
        self.last_throttle_ms = int(getattr(response, "throttle_time_ms", 0))
        return response

    def alter(self, entries: list[tuple[dict[str, str | None], dict[str, float | None]]],
              validate_only: bool = False) -> list[tuple[int, str | None]]:
        """(error code, message) per entry; a None value removes the key."""
        from kafka.protocol.admin import AlterClientQuotasRequest

        request = AlterClientQuotasRequest(entries=[
            (tuple(entity.items()), tuple((k, 0.0 if v is None else v, v is None) for k, v in ops.items()))
            for entity, ops in entries], validate_only=validate_only)
        return [(r.error_code, r.error_message) for r in self._send(request).entries]

    def describe(self, components: list[tuple[str, int, str | None]], strict: bool = False
                 ) -> tuple[int, str | None, dict[tuple[tuple[str, str | None], ...], dict[str, float]]]:
        from kafka.protocol.admin import DescribeClientQuotasRequest

        r = self._send(DescribeClientQuotasRequest(components=components, strict=strict))
        found = {tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity)):
                 {v.key: v.value for v in entry.values} for entry in r.entries or ()}
        return r.error_code, r.error_message, found

    def close(self) -> None:
        self.client.close()


def kp_create_topic(
    bootstrap: str, topic: str, partitions: int, config: Mapping[str, str] | None = None
) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    try:
        admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1,
                      topic_configs=dict(config or {}))],
            timeout_ms=10000,
        )
        topics = admin.describe_topics([topic])
        assert len(topics) == 1 and topics[0]["error_code"] == 0, topics
        assert len(topics[0]["partitions"]) == partitions, topics
    finally:
        admin.close()


def kp_produce(
    bootstrap: str, topic: str, recs: Sequence[Rec], *, timeout_s: float = 60.0, **conf: Any
) -> list[tuple[int, int]]:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        linger_ms=5,
        request_timeout_ms=15000,
        max_block_ms=30000,
        **conf,
    )
    try:
        futures = [
            producer.send(
                topic,
                key=r.key,
                value=r.value,
                headers=list(r.headers),
                partition=r.partition,
                timestamp_ms=r.timestamp_ms,
            )
            for r in recs
        ]
        producer.flush(timeout=timeout_s)
        out = []
        for f in futures:
            md = f.get(timeout=10)
            out.append((md.partition, md.offset))
        return out
    finally:
        producer.close(timeout=10)


def kp_got(r: Any) -> Got:
    return Got(
        partition=r.partition,
        offset=r.offset,
        key=r.key,
        value=r.value,
        headers=norm_headers(r.headers),
        timestamp_ms=r.timestamp,
        create_time=r.timestamp_type == 0,
    )


def kp_consumer(bootstrap: str, **conf: Any) -> Any:
    from kafka import KafkaConsumer

    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "request_timeout_ms": 15000,
        "fetch_max_wait_ms": 100,
    }
    settings.update(conf)
    return KafkaConsumer(**settings)


def kp_consume(
    bootstrap: str,
    topic: str,
    counts: Mapping[int, int],
    *,
    start: Mapping[int, int] | None = None,
    timeout_s: float = 45.0,
    settle_s: float = 0.5,
    **conf: Any,
) -> list[Got]:
    """assign() + seek_to_beginning() (or seek to `start`), poll until counts reached."""
    from kafka import TopicPartition

    consumer = kp_consumer(bootstrap, **conf)
    try:
        tps = [TopicPartition(topic, p) for p in counts]
        consumer.assign(tps)
        if start is None:
            consumer.seek_to_beginning(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, start[tp.partition])
        got: list[Got] = []
        seen = {p: 0 for p in counts}
        deadline = time.monotonic() + timeout_s
        while any(seen[p] < n for p, n in counts.items()) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=2000).items():
                for r in records:
                    got.append(kp_got(r))
                    seen[tp.partition] += 1
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(kp_got(r) for r in records)
        return got
    finally:
        consumer.close()


# ---------------------------------------------------------------- aiokafka


async def aio_create_topic(
    bootstrap: str, topic: str, partitions: int, config: Mapping[str, str] | None = None
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await asyncio.wait_for(admin.start(), 20)
    try:
        resp = await asyncio.wait_for(
            admin.create_topics(
                [NewTopic(topic, partitions, 1, topic_configs=dict(config or {}))], timeout_ms=10000
            ),
            20,
        )
        errors = [(t[0], t[1]) for t in resp.topic_errors]
        assert errors == [(topic, 0)], resp
        described = await asyncio.wait_for(admin.describe_topics([topic]), 20)
        assert len(described) == 1 and described[0]["error_code"] == 0, described
        assert len(described[0]["partitions"]) == partitions, described
    finally:
        await admin.close()


async def aio_produce(
    bootstrap: str, topic: str, recs: Sequence[Rec], *, timeout_s: float = 60.0, **conf: Any
) -> list[tuple[int, int]]:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, request_timeout_ms=15000, **conf
    )
    await asyncio.wait_for(producer.start(), 20)
    try:

        async def run() -> list[tuple[int, int]]:
            futures = []
            for r in recs:
                futures.append(
                    await producer.send(
                        topic,
                        key=r.key,
                        value=r.value,
                        partition=r.partition,
                        timestamp_ms=r.timestamp_ms,
                        headers=list(r.headers),
                    )
                )
            mds = await asyncio.gather(*futures)
            # acks=0: aiokafka resolves each send with None (no response, no offsets).
            return [(-1, -1) if md is None else (md.partition, md.offset) for md in mds]

        return await asyncio.wait_for(run(), timeout_s)
    finally:
        await asyncio.wait_for(producer.stop(), 20)


def aio_got(r: Any) -> Got:
    return Got(
        partition=r.partition,
        offset=r.offset,
        key=r.key,
        value=r.value,
        headers=norm_headers(r.headers),
        timestamp_ms=r.timestamp,
        create_time=r.timestamp_type == 0,
    )


async def aio_consume(
    bootstrap: str,
    topic: str,
    counts: Mapping[int, int],
    *,
    start: Mapping[int, int] | None = None,
    timeout_s: float = 45.0,
    settle_s: float = 0.5,
    **conf: Any,
) -> list[Got]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "group_id": None,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "request_timeout_ms": 15000,
        "fetch_max_wait_ms": 100,
    }
    settings.update(conf)
    consumer = AIOKafkaConsumer(**settings)
    await asyncio.wait_for(consumer.start(), 20)
    try:
        tps = [TopicPartition(topic, p) for p in counts]
        consumer.assign(tps)
        if start is None:
            await asyncio.wait_for(consumer.seek_to_beginning(*tps), 20)
        else:
            for tp in tps:
                consumer.seek(tp, start[tp.partition])
        got: list[Got] = []
        seen = {p: 0 for p in counts}
        deadline = time.monotonic() + timeout_s
        while any(seen[p] < n for p, n in counts.items()) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=2000)
            for tp, records in batch.items():
                for r in records:
                    got.append(aio_got(r))
                    seen[tp.partition] += 1
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                got.extend(aio_got(r) for r in records)
        return got
    finally:
        await asyncio.wait_for(consumer.stop(), 20)


def run_async(coro: Any, timeout_s: float = 90.0) -> Any:
    """asyncio.run with an overall bound."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))
