"""kafka-python against a standalone broker: admin create, produce under every codec it
supports (gzip built in; snappy, lz4, zstd via python-snappy, lz4, zstandard), consume
with assign + seek_to_beginning (no group)."""

from __future__ import annotations

import pytest

from tests.interop.clients import (
    ck_partition_count,
    ck_watermarks,
    kp_consume,
    kp_create_topic,
    kp_produce,
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
KP_CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def test_all_codecs_available():
    """The test extra installs every codec library kafka-python can use."""
    from kafka import codec

    assert codec.has_gzip() and codec.has_snappy() and codec.has_lz4() and codec.has_zstd()


@pytest.mark.parametrize("codec", KP_CODECS, ids=lambda c: c or "none")
def test_produce_consume_exact_per_codec(broker, codec):
    name = codec or "none"
    topic = f"kp-{name}"
    kp_create_topic(broker.bootstrap, topic, PARTITIONS)
    # kafka-python 3.x is idempotent by default (InitProducerId + sequences).
    recs = make_records(N, PARTITIONS, f"kp-{name}", null_header_values=False)
    delivered = kp_produce(broker.bootstrap, topic, recs, compression_type=codec, acks="all")
    got = kp_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)
    assert_disk_codec(broker.data_dir, topic, PARTITIONS, name)


@pytest.mark.parametrize("acks", [0, 1])
def test_non_idempotent_acks(broker, acks):
    topic = f"kp-acks{acks}"
    kp_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(2000, PARTITIONS, f"kp-acks{acks}", null_header_values=False)
    delivered = kp_produce(
        broker.bootstrap, topic, recs, acks=acks, enable_idempotence=False,
        compression_type="gzip", max_in_flight_requests_per_connection=1,
    )
    if acks == 0:
        delivered = None  # no response: kafka-python synthesises metadata, nothing to check
    got = kp_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)


def test_idempotent_producer_exactly_once(broker):
    topic = "kp-idempotent"
    kp_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(N, PARTITIONS, "kp-idem", null_header_values=False)
    delivered = kp_produce(
        broker.bootstrap, topic, recs, enable_idempotence=True, acks="all",
        compression_type="lz4", batch_size=4096,
    )
    counts = expected_counts(recs)
    got = kp_consume(broker.bootstrap, topic, counts)
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)
    pids = set()
    for p in range(PARTITIONS):
        seq = 0
        for b in read_disk_batches(broker.data_dir, topic, p):
            pids.add((b.producer_id, b.producer_epoch))
            assert b.base_sequence == seq, (p, b)
            seq += b.records_count
        assert seq == counts[p]
    assert len(pids) == 1 and next(iter(pids))[0] >= 0, pids


def test_auto_create_topic_on_produce(broker_factory):
    broker = broker_factory(**{"num.partitions": 3})
    topic = "kp-auto-created"
    recs = make_records(2000, 3, "kp-auto", explicit_partition=False, null_header_values=False)
    kp_produce(broker.bootstrap, topic, recs, compression_type="zstd")
    assert ck_partition_count(broker.bootstrap, topic) == 3
    marks = ck_watermarks(broker.bootstrap, topic, 3)
    assert sum(hi for _, hi in marks.values()) == len(recs), marks
    got = kp_consume(broker.bootstrap, topic, {p: hi for p, (_, hi) in marks.items()})
    key_part = assert_exact_client_partitioned(recs, got, partitions=3)
    assert set(key_part.values()) == {0, 1, 2}


def test_consumer_seek_to_middle_and_end_offsets(broker):
    from kafka import TopicPartition

    from tests.interop.clients import kp_consumer

    topic = "kp-seek"
    kp_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(3000, PARTITIONS, "kp-seek", null_header_values=False)
    kp_produce(broker.bootstrap, topic, recs, compression_type="snappy")
    counts = expected_counts(recs)

    consumer = kp_consumer(broker.bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        assert consumer.beginning_offsets(tps, timeout_ms=10000) == {tp: 0 for tp in tps}
        assert consumer.end_offsets(tps, timeout_ms=10000) == {tp: counts[tp.partition] for tp in tps}
    finally:
        consumer.close()

    # Start in the middle of a (compressed) batch: records before the seek offset must
    # not be returned even though the broker returns the whole batch.
    start = {p: 333 + p for p in range(PARTITIONS)}
    got = kp_consume(broker.bootstrap, topic, {p: counts[p] - start[p] for p in range(PARTITIONS)},
                     start=start)
    by_p: dict[int, list] = {p: [r for r in recs if r.partition == p] for p in range(PARTITIONS)}
    tail = [r for p in range(PARTITIONS) for r in by_p[p][start[p]:]]
    assert_exact(tail, got, partitions=PARTITIONS, start_offsets=start)


def test_fetch_sessions_through_a_full_cache_and_a_broker_restart(tmp_path):
    """kafka-python 3 consumes in incremental fetch sessions (KIP-227). With one session slot
    two consumers of 20 partitions each get every record: the first keeps its session, the
    second goes on with full fetches (the cache refuses a session of the same rank, as
    Kafka's). A broker restart loses the session: the consumer's next incremental fetch is
    FETCH_SESSION_ID_NOT_FOUND, it opens a new one and reads what came after, once each."""
    import time

    from confluent_kafka import Producer
    from kafka import KafkaConsumer, TopicPartition

    from tests.cluster_helpers import create_topic
    from tests.harness import BrokerProcess, free_port
    from tests.ops.common import scrape, value

    http = free_port()
    broker = BrokerProcess(tmp_path / "broker", admin_http_listener=f"127.0.0.1:{http}",
                           max_incremental_fetch_session_cache_slots=1).start()
    topic, partitions = "kp-sessions", 20
    consumers = []

    def produce(start: int, count: int) -> None:
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "log_level": 2})
        for i in range(start, start + count):
            p.produce(topic, value=b"v%d " % i + b"." * 200, partition=i % partitions)  # 5 per 1 KiB fetch
        assert p.flush(30) == 0

    def read(c: KafkaConsumer, got: dict[int, list[int]], total: int) -> None:
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < total:
            assert time.monotonic() < deadline, f"read {sum(map(len, got.values()))} of {total}"
            for tp, msgs in c.poll(timeout_ms=200).items():
                got[tp.partition] += [int(m.value[1:].split()[0]) for m in msgs]

    try:
        create_topic(broker.bootstrap, topic, partitions, 1)
        produce(0, 400)
        tps = [TopicPartition(topic, q) for q in range(partitions)]
        seen: list[dict[int, list[int]]] = []
        for _ in range(2):
            c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=100,
                              max_partition_fetch_bytes=1024, request_timeout_ms=15000)
            c.assign(tps)
            c.seek_to_beginning(*tps)
            consumers.append(c)
            seen.append({q: [] for q in range(partitions)})
        for c, got in zip(consumers, seen, strict=True):
            read(c, got, 400)
        samples = scrape(f"http://127.0.0.1:{http}")
        assert value(samples, "dcmirror_broker_fetch_sessions") == 1
        assert value(samples, "dcmirror_broker_fetch_requests_total", fetcher="consumer", session="incremental") > 0
        # The second consumer asks for a session in every fetch and is answered sessionless.
        assert value(samples, "dcmirror_broker_fetch_requests_total", fetcher="consumer", session="none") >= 4

        broker.stop()
        broker.start()
        produce(400, 400)
        for c, got in zip(consumers, seen, strict=True):
            read(c, got, 800)
        time.sleep(0.5)
        for c, got in zip(consumers, seen, strict=True):
            for tp, msgs in c.poll(timeout_ms=300).items():
                got[tp.partition] += [int(m.value[1:].split()[0]) for m in msgs]
            assert got == {q: list(range(q, 800, partitions)) for q in range(partitions)}, "each record once, in order"
        samples = scrape(f"http://127.0.0.1:{http}")
        assert value(samples, "dcmirror_broker_fetch_sessions") == 1
        assert value(samples, "dcmirror_broker_fetch_requests_total", fetcher="consumer", session="incremental") > 0
    finally:
        for c in consumers:
            c.close()
        broker.stop()
