"""ListOffsets by timestamp: the answer is the first offset whose timestamp is >= the
target (in log order), or "none" (-1 / None) past the last record."""

from __future__ import annotations

import pytest

from tests.interop.clients import (
    ck_admin,
    ck_consumer,
    ck_create_topic,
    ck_produce,
    kp_consumer,
    run_async,
)
from tests.interop.common import BASE_TS_MS, Rec

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 2
N = 3000  # per partition
STEP_MS = 10


def ts_of(p: int, i: int) -> int:
    # Partition 1 is shifted so the two partitions answer differently for one target.
    return BASE_TS_MS + p * 5 + i * STEP_MS


def produce_timeline(bootstrap: str, topic: str) -> None:
    # Small segments and small batches: the lookup has to cross segment and batch
    # boundaries (and their time indexes).
    ck_create_topic(bootstrap, topic, PARTITIONS, {"segment.bytes": "20000"})
    recs = [Rec(p, f"k{i}".encode(), f"v{p}-{i}".encode() + b"." * 60, (), ts_of(p, i))
            for i in range(N) for p in range(PARTITIONS)]
    delivered = ck_produce(bootstrap, topic, recs, {"linger.ms": 0, "compression.type": "lz4"},
                           flush_every=50)
    assert sorted(delivered) == [(p, i) for p in range(PARTITIONS) for i in range(N)]


def expected_offset(p: int, target: int) -> int:
    """First offset with timestamp >= target, -1 if none."""
    for i in range(N):
        if ts_of(p, i) >= target:
            return i
    return -1


TARGETS = [
    BASE_TS_MS - 1_000_000,          # before everything -> 0
    BASE_TS_MS,                      # exactly the first record of partition 0
    BASE_TS_MS + 1,                  # between records
    BASE_TS_MS + 5,                  # exactly partition 1's first record
    BASE_TS_MS + 499 * STEP_MS,      # inside a batch
    BASE_TS_MS + 500 * STEP_MS,      # a batch boundary (50 per batch)
    BASE_TS_MS + 1234 * STEP_MS + 3,
    BASE_TS_MS + (N - 1) * STEP_MS,  # last record of partition 0
    BASE_TS_MS + (N - 1) * STEP_MS + 5,   # last record of partition 1 only
    BASE_TS_MS + N * STEP_MS + 100,  # after everything -> none
]


def test_offsets_for_times_confluent(broker):
    from confluent_kafka import TopicPartition

    topic = "lo-ck"
    produce_timeline(broker.bootstrap, topic)
    consumer = ck_consumer(broker.bootstrap)
    try:
        for target in TARGETS:
            res = consumer.offsets_for_times(
                [TopicPartition(topic, p, target) for p in range(PARTITIONS)], timeout=10
            )
            got = {tp.partition: tp.offset for tp in res}
            for tp in res:
                assert tp.error is None, tp
            want = {p: expected_offset(p, target) for p in range(PARTITIONS)}
            assert got == want, f"target {target}: got {got}, want {want}"
    finally:
        consumer.close()


def test_list_offsets_admin_specs(broker):
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    topic = "lo-admin"
    produce_timeline(broker.bootstrap, topic)
    admin = ck_admin(broker.bootstrap)
    for spec, want in [
        (OffsetSpec.earliest(), {p: 0 for p in range(PARTITIONS)}),
        (OffsetSpec.latest(), {p: N for p in range(PARTITIONS)}),
        (OffsetSpec.for_timestamp(BASE_TS_MS + 777 * STEP_MS + 1),
         {p: expected_offset(p, BASE_TS_MS + 777 * STEP_MS + 1) for p in range(PARTITIONS)}),
    ]:
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in range(PARTITIONS)},
                                     request_timeout=15)
        got = {tp.partition: fut.result(timeout=20).offset for tp, fut in futures.items()}
        assert got == want, (spec, got, want)
    # The timestamp that goes with a by-time answer is the record's own timestamp.
    target = BASE_TS_MS + 777 * STEP_MS + 1
    futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.for_timestamp(target)},
                                 request_timeout=15)
    info = futures[TopicPartition(topic, 0)].result(timeout=20)
    assert info.timestamp == ts_of(0, expected_offset(0, target))


def test_offsets_for_times_non_monotonic(broker):
    """Timestamps that go back in time: still the first offset (in log order) whose
    timestamp is >= target."""
    from confluent_kafka import TopicPartition

    topic = "lo-nonmono"
    ck_create_topic(broker.bootstrap, topic, 1)
    stamps = [100, 300, 200, 400, 150, 500, 450]
    recs = [Rec(0, None, f"v{i}".encode(), (), BASE_TS_MS + t) for i, t in enumerate(stamps)]
    # One batch per record here, all records in one batch below: both answer alike.
    ck_produce(broker.bootstrap, topic, recs, {"linger.ms": 0}, flush_every=1)
    consumer = ck_consumer(broker.bootstrap)
    try:
        for target, want in [(50, 0), (100, 0), (101, 1), (250, 1), (300, 1), (301, 3),
                             (420, 5), (500, 5), (501, -1)]:
            (tp,) = consumer.offsets_for_times([TopicPartition(topic, 0, BASE_TS_MS + target)],
                                               timeout=10)
            assert tp.offset == want, f"target +{target}: got {tp.offset}, want {want}"
    finally:
        consumer.close()

    topic2 = "lo-nonmono-onebatch"
    ck_create_topic(broker.bootstrap, topic2, 1)
    ck_produce(broker.bootstrap, topic2, recs, {"linger.ms": 200})
    consumer = ck_consumer(broker.bootstrap)
    try:
        for target, want in [(50, 0), (101, 1), (250, 1), (301, 3), (420, 5), (501, -1)]:
            (tp,) = consumer.offsets_for_times([TopicPartition(topic2, 0, BASE_TS_MS + target)],
                                               timeout=10)
            assert tp.offset == want, f"one batch, target +{target}: got {tp.offset}, want {want}"
    finally:
        consumer.close()


def test_offsets_for_times_kafka_python(broker):
    from kafka import TopicPartition

    topic = "lo-kp"
    produce_timeline(broker.bootstrap, topic)
    consumer = kp_consumer(broker.bootstrap)
    try:
        for target in TARGETS:
            tps = {TopicPartition(topic, p): target for p in range(PARTITIONS)}
            res = consumer.offsets_for_times(tps, timeout_ms=10000)
            for tp in tps:
                want = expected_offset(tp.partition, target)
                if want < 0:
                    assert res[tp] is None, (target, tp, res[tp])
                else:
                    assert res[tp] is not None, (target, tp)
                    assert res[tp].offset == want, (target, tp, res[tp])
                    assert res[tp].timestamp == ts_of(tp.partition, want), (target, tp, res[tp])
    finally:
        consumer.close()


def test_offsets_for_times_aiokafka(broker):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topic = "lo-aio"
    produce_timeline(broker.bootstrap, topic)

    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                    enable_auto_commit=False, request_timeout_ms=15000)
        await consumer.start()
        try:
            out = {}
            for target in TARGETS:
                tps = {TopicPartition(topic, p): target for p in range(PARTITIONS)}
                out[target] = await consumer.offsets_for_times(tps)
            return out
        finally:
            await consumer.stop()

    results = run_async(scenario())
    for target, res in results.items():
        for tp, val in res.items():
            want = expected_offset(tp.partition, target)
            if want < 0:
                assert val is None, (target, tp, val)
            else:
                assert val is not None and val.offset == want, (target, tp, val)
                assert val.timestamp == ts_of(tp.partition, want)


def test_offsets_for_times_survive_restart_and_empty_partition(broker):
    """The time index answers the same after a restart; an empty partition answers -1."""
    from confluent_kafka import TopicPartition

    topic = "lo-restart"
    produce_timeline(broker.bootstrap, topic)
    ck_create_topic(broker.bootstrap, "lo-empty", 1)

    def answers():
        consumer = ck_consumer(broker.bootstrap)
        try:
            out = {}
            for target in TARGETS:
                res = consumer.offsets_for_times(
                    [TopicPartition(topic, p, target) for p in range(PARTITIONS)], timeout=10)
                out[target] = {tp.partition: tp.offset for tp in res}
            (empty,) = consumer.offsets_for_times([TopicPartition("lo-empty", 0, BASE_TS_MS)],
                                                  timeout=10)
            return out, empty.offset
        finally:
            consumer.close()

    want = {t: {p: expected_offset(p, t) for p in range(PARTITIONS)} for t in TARGETS}
    assert answers() == (want, -1)
    broker.restart()
    assert answers() == (want, -1)
