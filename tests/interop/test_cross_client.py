"""Records written by one client are read identically by the others (the broker hands out
producer batches untouched, so every client must decode every other client's batches)."""

from __future__ import annotations

import pytest

from tests.interop.clients import (
    aio_consume,
    aio_produce,
    ck_consume,
    ck_create_topic,
    ck_produce,
    kp_consume,
    kp_produce,
    run_async,
)
from tests.interop.common import CODECS, assert_exact, expected_counts, make_records

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 3


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_records_read_identically_by_all_clients(broker, codec):
    topic = f"x-ck-{codec}"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(4000, PARTITIONS, f"x-{codec}")  # includes null header values, tombstones
    delivered = ck_produce(broker.bootstrap, topic, recs, {"compression.type": codec})
    counts = expected_counts(recs)

    by_ck = ck_consume(broker.bootstrap, topic, counts)
    by_kp = kp_consume(broker.bootstrap, topic, counts)
    by_aio = run_async(aio_consume(broker.bootstrap, topic, counts))

    for got in (by_ck, by_kp, by_aio):
        assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)

    def canon(gs):
        return sorted(gs, key=lambda g: (g.partition, g.offset))

    assert canon(by_ck) == canon(by_kp) == canon(by_aio)


def test_python_clients_records_read_by_confluent(broker):
    """kafka-python (gzip) and aiokafka (lz4) interleave into one topic; librdkafka reads
    every batch of both."""
    topic = "x-py-to-ck"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    first = make_records(2000, PARTITIONS, "kp", null_header_values=False)
    second = make_records(2000, PARTITIONS, "aio", null_header_values=False,
                          base_ts_ms=1_800_000_000_000)
    kp_produce(broker.bootstrap, topic, first, compression_type="gzip")
    run_async(aio_produce(broker.bootstrap, topic, second, compression_type="lz4"))
    recs = first + second
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=PARTITIONS)
