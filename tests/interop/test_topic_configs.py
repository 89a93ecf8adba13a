"""Topic-level configs that change what clients see: size-based retention,
LogAppendTime, broker-side compression.type, max.message.bytes."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tests.interop.clients import ck_consume, ck_create_topic, ck_produce, ck_watermarks
from tests.interop.common import (
    CODEC_IDS,
    Rec,
    assert_exact,
    expected_counts,
    make_records,
    read_disk_batches,
    segment_files,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)


def test_size_based_retention(broker_factory):
    """retention.bytes: oldest segments go while the partition would still hold at least
    retention.bytes without them (Kafka's rule), so afterwards
    retention.bytes <= size < retention.bytes + size(first remaining segment)."""
    broker = broker_factory(**{"log.retention.check.interval.ms": 500})
    bs, topic = broker.bootstrap, "tc-ret-bytes"
    ck_create_topic(bs, topic, 1, {"retention.bytes": "30000", "segment.bytes": "10000"})
    recs = [Rec(0, b"k", f"{i:05d}".encode() + b"s" * 100, (), int(time.time() * 1000))
            for i in range(1000)]
    ck_produce(bs, topic, recs, {"linger.ms": 0}, flush_every=20)

    def settled():
        low = ck_watermarks(bs, topic, 1)[0][0]
        segs = segment_files(broker.data_dir, topic, 0)
        sizes = [p.stat().st_size for p in segs]
        total = sum(sizes)
        if low > 0 and 30000 <= total < 30000 + sizes[0]:
            return low, segs, total
        return None

    low, segs, total = wait_until(settled, 20, what="size-based retention to settle")
    assert int(segs[0].name[:20]) == low
    assert ck_watermarks(bs, topic, 1) == {0: (low, 1000)}
    got = ck_consume(bs, topic, {0: 1000 - low}, start=0)
    assert_exact(recs[low:], got, partitions=1, start_offsets={0: low})


def test_log_append_time(broker):
    topic = "tc-log-append"
    ck_create_topic(broker.bootstrap, topic, 2, {"message.timestamp.type": "LogAppendTime"})
    recs = make_records(2000, 2, "lat")
    before = int(time.time() * 1000)
    ck_produce(broker.bootstrap, topic, recs, {"compression.type": "lz4"})
    after = int(time.time() * 1000)
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs))
    assert len(got) == len(recs)
    for g in got:
        assert not g.create_time, f"record at {g.partition}/{g.offset} is not LogAppendTime"
        assert before - 1000 <= g.timestamp_ms <= after + 1000, (g.timestamp_ms, before, after)
    # Everything else is unchanged: swap in the broker's timestamps and compare exactly.
    by_po = {(g.partition, g.offset): g.timestamp_ms for g in got}
    fixed = []
    seen: dict[int, int] = {}
    for r in recs:
        off = seen.get(r.partition, 0)
        seen[r.partition] = off + 1
        fixed.append(Rec(r.partition, r.key, r.value, r.headers, by_po[(r.partition, off)]))
    relabeled = [dataclasses.replace(g, create_time=True) for g in got]
    assert_exact(fixed, relabeled, partitions=2)
    for p in range(2):
        for b in read_disk_batches(broker.data_dir, topic, p):
            assert b.attributes & 0x08, f"batch at {b.base_offset} lacks the LogAppendTime bit"


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_broker_side_compression_type(broker, codec):
    """compression.type=<codec> on the topic: batches are stored (and served) in that
    codec whatever the producer sent; records are unchanged."""
    topic = f"tc-compress-{codec}"
    ck_create_topic(broker.bootstrap, topic, 2, {"compression.type": codec})
    recs = make_records(3000, 2, f"bc-{codec}")
    delivered = ck_produce(broker.bootstrap, topic, recs, {"compression.type": "snappy"})
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=2, delivered=delivered)
    for p in range(2):
        codecs = {b.codec for b in read_disk_batches(broker.data_dir, topic, p)}
        assert codecs == {CODEC_IDS[codec]}, (p, codecs)


def test_max_message_bytes_rejects_large_batch(broker):
    from confluent_kafka import KafkaError, Producer

    topic = "tc-max-bytes"
    ck_create_topic(broker.bootstrap, topic, 1, {"max.message.bytes": "2000"})
    errors: list = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 10000,
                         "linger.ms": 0})
    producer.produce(topic, key=b"big", value=b"z" * 5000, partition=0,
                     on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(20) == 0
    assert len(errors) == 1 and errors[0] is not None, errors
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE, errors[0]
    # Small records still go through.
    small = [Rec(0, b"k", b"v" * 100, (), 1_700_000_000_000 + i) for i in range(5)]
    assert ck_produce(broker.bootstrap, topic, small, {"linger.ms": 0}, flush_every=1) == [
        (0, i) for i in range(5)
    ]
    assert ck_watermarks(broker.bootstrap, topic, 1) == {0: (0, 5)}
