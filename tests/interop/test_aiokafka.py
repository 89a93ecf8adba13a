"""aiokafka against a standalone broker: admin create, produce under every codec
(cramjam backs snappy/lz4/zstd), idempotence, auto-create, consume with assign (no group)."""

from __future__ import annotations

import pytest

from tests.interop.clients import (
    aio_consume,
    aio_create_topic,
    aio_produce,
    ck_partition_count,
    ck_watermarks,
    run_async,
)
from tests.interop.common import (
    assert_disk_codec,
    assert_exact,
    assert_exact_client_partitioned,
    expected_counts,
    make_records,
    read_disk_batches,
)

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 3
N = 10_000
AIO_CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("codec", AIO_CODECS, ids=lambda c: c or "none")
def test_produce_consume_exact_per_codec(broker, codec):
    name = codec or "none"
    topic = f"aio-{name}"
    recs = make_records(N, PARTITIONS, f"aio-{name}", null_header_values=False)

    async def scenario():
        await aio_create_topic(broker.bootstrap, topic, PARTITIONS)
        delivered = await aio_produce(broker.bootstrap, topic, recs, compression_type=codec)
        got = await aio_consume(broker.bootstrap, topic, expected_counts(recs))
        return delivered, got

    delivered, got = run_async(scenario())
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)
    assert_disk_codec(broker.data_dir, topic, PARTITIONS, name)


def test_idempotent_producer_exactly_once(broker):
    topic = "aio-idempotent"
    recs = make_records(N, PARTITIONS, "aio-idem", null_header_values=False)

    async def scenario():
        await aio_create_topic(broker.bootstrap, topic, PARTITIONS)
        delivered = await aio_produce(
            broker.bootstrap, topic, recs, enable_idempotence=True, acks="all",
            compression_type="gzip", max_batch_size=4096,
        )
        got = await aio_consume(broker.bootstrap, topic, expected_counts(recs))
        return delivered, got

    delivered, got = run_async(scenario())
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)
    counts = expected_counts(recs)
    pids = set()
    for p in range(PARTITIONS):
        seq = 0
        for b in read_disk_batches(broker.data_dir, topic, p):
            pids.add((b.producer_id, b.producer_epoch))
            assert b.base_sequence == seq, (p, b)
            seq += b.records_count
        assert seq == counts[p]
    assert len(pids) == 1 and next(iter(pids))[0] >= 0, pids


@pytest.mark.parametrize("acks", [0, 1])
def test_acks_levels(broker, acks):
    topic = f"aio-acks{acks}"
    recs = make_records(2000, PARTITIONS, topic, null_header_values=False)

    async def scenario():
        await aio_create_topic(broker.bootstrap, topic, PARTITIONS)
        delivered = await aio_produce(broker.bootstrap, topic, recs, acks=acks, compression_type="lz4")
        got = await aio_consume(broker.bootstrap, topic, expected_counts(recs))
        return delivered, got

    delivered, got = run_async(scenario())
    if acks == 0:
        assert all(d == (-1, -1) for d in delivered), delivered[:3]
        delivered = None
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)


def test_auto_create_topic_on_produce(broker_factory):
    broker = broker_factory(**{"num.partitions": 3})
    topic = "aio-auto-created"
    recs = make_records(2000, 3, "aio-auto", explicit_partition=False, null_header_values=False)
    run_async(aio_produce(broker.bootstrap, topic, recs, compression_type="snappy"))
    assert ck_partition_count(broker.bootstrap, topic) == 3
    marks = ck_watermarks(broker.bootstrap, topic, 3)
    assert sum(hi for _, hi in marks.values()) == len(recs), marks
    got = run_async(aio_consume(broker.bootstrap, topic, {p: hi for p, (_, hi) in marks.items()}))
    key_part = assert_exact_client_partitioned(recs, got, partitions=3)
    assert set(key_part.values()) == {0, 1, 2}
