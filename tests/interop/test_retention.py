"""Time-based retention seen from real clients and from disk.

Records carry explicit create times: "old" ones an hour in the past (expired as soon as
their segment is closed, since retention compares a segment's largest timestamp with
now) and "new" ones ten minutes in the future (never expire during the test). That makes
the outcome independent of how fast the test machine is.
"""

from __future__ import annotations

import time

import pytest

from tests.interop.clients import (
    ck_consume,
    ck_consumer,
    ck_create_topic,
    ck_produce,
    ck_watermarks,
    kp_consumer,
)
from tests.interop.common import (
    Rec,
    assert_exact,
    partition_dir,
    segment_files,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

TOPIC_CONFIG = {"retention.ms": "2000", "segment.bytes": "10000", "segment.ms": "1000"}


def records(n: int, first_index: int, ts_ms: int, tag: str) -> list[Rec]:
    return [
        Rec(0, f"k{i % 7}".encode(), f"{tag}-{i:05d}-".encode() + b"r" * 90,
            (("i", str(i).encode()),), ts_ms + i)
        for i in range(first_index, first_index + n)
    ]


def low_watermark(bootstrap: str, topic: str) -> int:
    return ck_watermarks(bootstrap, topic, 1)[0][0]


def wait_stable_low(bootstrap: str, topic: str, stable_s: float = 2.0, timeout_s: float = 20.0) -> int:
    """Wait until the low watermark moved above 0 and then stayed put for stable_s."""
    wait_until(lambda: low_watermark(bootstrap, topic) > 0, timeout_s,
               what=f"{topic}: log start offset to move above 0 (retention)")
    deadline = time.monotonic() + timeout_s
    last, since = low_watermark(bootstrap, topic), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = low_watermark(bootstrap, topic)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= stable_s:
            return now
    raise AssertionError(f"{topic}: low watermark never settled (last {last})")


def disk_base_offsets(data_dir, topic: str, suffix: str) -> list[int]:
    return [int(p.name[:20]) for p in segment_files(data_dir, topic, 0, suffix)]


def first_consumer_error(bootstrap: str, topic: str, offset: int, timeout_s: float = 15.0):
    """Assign at `offset` with auto.offset.reset=error; return the first error or message."""
    from confluent_kafka import TopicPartition

    consumer = ck_consumer(bootstrap, {"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                return msg.error()
            return ("message at offset", msg.offset())
        return None
    finally:
        consumer.close()


def test_retention_deletes_expired_segments(broker_factory):
    broker = broker_factory(**{"log.retention.check.interval.ms": 500})
    bs, topic = broker.bootstrap, "ret-time"
    ck_create_topic(bs, topic, 1, TOPIC_CONFIG)
    now_ms = int(time.time() * 1000)
    old = records(1000, 0, now_ms - 3_600_000, "old")
    new = records(100, 1000, now_ms + 600_000, "new")
    # 20 records (~2.5 KB) per batch: ~4 batches per 10 KB segment, many segments.
    ck_produce(bs, topic, old, {"linger.ms": 0}, flush_every=20)
    ck_produce(bs, topic, new, {"linger.ms": 0}, flush_every=20)

    low = wait_stable_low(bs, topic)
    assert 0 < low <= 1000, f"log start offset {low}: must have moved past expired data but kept new records"
    assert ck_watermarks(bs, topic, 1) == {0: (low, 1100)}

    # On disk: the first remaining segment starts at the log start offset; every segment
    # (and its indexes) below it is gone.
    logs = disk_base_offsets(broker.data_dir, topic, ".log")
    assert logs and logs[0] == low, f"segments on disk {logs}, log start offset {low}"
    for suffix in (".index", ".timeindex"):
        bases = disk_base_offsets(broker.data_dir, topic, suffix)
        assert all(b >= low for b in bases), f"stale {suffix} files below {low}: {bases}"
    assert not any(p.name.startswith("00000000000000000000.")
                   for p in partition_dir(broker.data_dir, topic, 0).iterdir()
                   if not p.name.endswith(".deleted")), "segment 0 still on disk"

    # auto.offset.reset=earliest from offset 0: reset to the new log start, then exact data.
    got = ck_consume(bs, topic, {0: 1100 - low}, start=0)
    assert got and got[0].offset == low
    assert_exact((old + new)[low:], got, partitions=1, start_offsets={0: low})

    # auto.offset.reset=error: OFFSET_OUT_OF_RANGE surfaces as a consumer error.
    from confluent_kafka import KafkaError

    err = first_consumer_error(bs, topic, 0)
    assert isinstance(err, KafkaError), f"expected an offset-out-of-range error, got {err!r}"
    assert err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET), err
    assert "out of range" in err.str().lower(), err

    # Same through kafka-python with auto_offset_reset='none'.
    import kafka.errors
    from kafka import TopicPartition

    consumer = kp_consumer(bs, auto_offset_reset="none")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(kafka.errors.OffsetOutOfRangeError):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=500)
    finally:
        consumer.close()

    # An offset inside the retained range still reads fine.
    got = ck_consume(bs, topic, {0: 1100 - (low + 5)}, start=low + 5,
                     conf={"auto.offset.reset": "error"})
    assert_exact((old + new)[low + 5:], got, partitions=1, start_offsets={0: low + 5})


def test_retention_expires_whole_log_including_active_segment(broker_factory):
    """Kafka semantics: when every record of the log is past retention, the active
    segment is rolled and deleted too, so log start == log end; new records then start
    at that offset."""
    broker = broker_factory(**{"log.retention.check.interval.ms": 500})
    bs, topic = broker.bootstrap, "ret-all"
    ck_create_topic(bs, topic, 1, TOPIC_CONFIG)
    now_ms = int(time.time() * 1000)
    old = records(500, 0, now_ms - 3_600_000, "old")
    ck_produce(bs, topic, old, {"linger.ms": 0}, flush_every=25)
    wait_until(lambda: ck_watermarks(bs, topic, 1) == {0: (500, 500)}, 20,
               what=f"{topic}: whole log expired, watermarks (500, 500)")
    logs = disk_base_offsets(broker.data_dir, topic, ".log")
    assert all(b >= 500 for b in logs), logs

    new = records(50, 500, now_ms + 600_000, "new")
    delivered = ck_produce(bs, topic, new)
    assert delivered == [(0, 500 + i) for i in range(50)]
    got = ck_consume(bs, topic, {0: 50}, start=0)
    assert_exact(new, got, partitions=1, start_offsets={0: 500})


def test_broker_level_retention_for_auto_created_topic(broker_factory):
    broker = broker_factory(**{
        "log.retention.check.interval.ms": 500,
        "log.retention.ms": 2000,
        "log.segment.bytes": 10000,
        "num.partitions": 1,
    })
    bs, topic = broker.bootstrap, "ret-broker-default"
    now_ms = int(time.time() * 1000)
    old = records(600, 0, now_ms - 3_600_000, "old")
    new = records(60, 600, now_ms + 600_000, "new")
    ck_produce(bs, topic, old, {"linger.ms": 0}, flush_every=20)  # auto-creates the topic
    ck_produce(bs, topic, new, {"linger.ms": 0}, flush_every=20)
    low = wait_stable_low(bs, topic)
    assert 0 < low <= 600
    logs = disk_base_offsets(broker.data_dir, topic, ".log")
    assert logs and logs[0] == low, (logs, low)
    got = ck_consume(bs, topic, {0: 660 - low}, start=0)
    assert_exact((old + new)[low:], got, partitions=1, start_offsets={0: low})


def test_unexpired_data_is_kept(broker_factory):
    """Records newer than retention.ms stay, even with many closed segments."""
    broker = broker_factory(**{"log.retention.check.interval.ms": 500})
    bs, topic = broker.bootstrap, "ret-keep"
    ck_create_topic(bs, topic, 1, {"retention.ms": "600000", "segment.bytes": "10000"})
    now_ms = int(time.time() * 1000)
    recs = records(500, 0, now_ms, "fresh")
    ck_produce(bs, topic, recs, {"linger.ms": 0}, flush_every=20)
    logs = disk_base_offsets(broker.data_dir, topic, ".log")
    assert len(logs) > 3, f"expected several segments with segment.bytes=10000, got {logs}"
    time.sleep(2.0)  # four retention checks
    assert ck_watermarks(bs, topic, 1) == {0: (0, 500)}
    assert disk_base_offsets(broker.data_dir, topic, ".log") == logs
    got = ck_consume(bs, topic, {0: 500})
    assert_exact(recs, got, partitions=1)
