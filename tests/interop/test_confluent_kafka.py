"""confluent-kafka (librdkafka) against a standalone broker: admin, produce under every
codec, idempotence, acks levels, auto-create, describe/delete."""

from __future__ import annotations

import pytest

from tests.interop.clients import (
    ck_admin,
    ck_consume,
    ck_create_topic,
    ck_partition_count,
    ck_produce,
    ck_watermarks,
)
from tests.interop.common import (
    CODECS,
    Rec,
    assert_disk_codec,
    assert_exact,
    assert_exact_client_partitioned,
    expected_counts,
    make_records,
    partition_dir,
    read_disk_batches,
    wait_until,
)

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 3
N = 10_000


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_exact_per_codec(broker, codec):
    topic = f"ck-{codec}"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(N, PARTITIONS, f"ck-{codec}")
    delivered = ck_produce(broker.bootstrap, topic, recs, {"compression.type": codec})

    counts = expected_counts(recs)
    got = ck_consume(broker.bootstrap, topic, counts)
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)

    # The broker stores batches as the producer compressed them (batches stay bytes):
    # every batch on disk carries the codec librdkafka used, and the offsets line up.
    assert_disk_codec(broker.data_dir, topic, PARTITIONS, codec)
    for p in range(PARTITIONS):
        batches = read_disk_batches(broker.data_dir, topic, p)
        assert batches[0].base_offset == 0
        for a, b in zip(batches, batches[1:], strict=False):
            assert b.base_offset == a.base_offset + a.last_offset_delta + 1
        assert sum(b.records_count for b in batches) == counts[p]


def test_watermarks_after_produce(broker):
    topic = "ck-watermarks"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(3000, PARTITIONS, "wm")
    ck_produce(broker.bootstrap, topic, recs, {"compression.type": "lz4"})
    counts = expected_counts(recs)
    assert ck_watermarks(broker.bootstrap, topic, PARTITIONS) == {
        p: (0, counts[p]) for p in range(PARTITIONS)
    }


def test_idempotent_producer_exactly_once(broker):
    topic = "ck-idempotent"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(N, PARTITIONS, "idem")
    delivered = ck_produce(
        broker.bootstrap,
        topic,
        recs,
        {
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "zstd",
            "max.in.flight.requests.per.connection": 5,
            "batch.num.messages": 200,  # many batches -> many sequence numbers
        },
    )
    counts = expected_counts(recs)
    got = ck_consume(broker.bootstrap, topic, counts)
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)

    # Every batch on disk carries one producer id/epoch and sequences chain without gaps.
    pids = set()
    for p in range(PARTITIONS):
        batches = read_disk_batches(broker.data_dir, topic, p)
        pids |= {(b.producer_id, b.producer_epoch) for b in batches}
        seq = 0
        for b in batches:
            assert b.base_sequence == seq, f"{topic}-{p}: batch at {b.base_offset} has seq {b.base_sequence}, want {seq}"
            seq += b.records_count
        assert seq == counts[p]
    assert len(pids) == 1, pids
    (pid, epoch), = pids
    assert pid >= 0 and epoch >= 0


def test_idempotent_producer_across_broker_restart(broker):
    """The broker restarts in the middle of an idempotent stream: librdkafka reconnects and
    continues its sequence; the broker rebuilt producer state from the log, so nothing is
    lost or duplicated and the producer does not hit a fatal error."""
    from confluent_kafka import Producer

    topic = "ck-idem-restart"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(6000, PARTITIONS, "idem-restart")
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 45000,
            "socket.timeout.ms": 10000,
        }
    )
    errors: list = []
    delivered: list = [None] * len(recs)

    def report(i):
        def cb(err, msg):
            if err is not None:
                errors.append((i, err))
            else:
                delivered[i] = (msg.partition(), msg.offset())

        return cb

    def send(lo, hi):
        for i in range(lo, hi):
            r = recs[i]
            producer.produce(topic, key=r.key, value=r.value, headers=list(r.headers) or None,
                             partition=r.partition, timestamp=r.timestamp_ms, on_delivery=report(i))
        assert producer.flush(40) == 0

    send(0, 3000)
    broker.restart()
    send(3000, 6000)
    assert not errors, errors[:5]
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)


@pytest.mark.parametrize("acks", [0, 1, -1])
def test_acks_levels(broker, acks):
    topic = {0: "ck-acks0", 1: "ck-acks1", -1: "ck-acksall"}[acks]
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(2000, PARTITIONS, f"acks{acks}")
    delivered = ck_produce(broker.bootstrap, topic, recs, {"acks": acks, "compression.type": "gzip"})
    if acks == 0:
        # No response, so librdkafka cannot know the offsets.
        assert all(off is None or off < 0 for _, off in delivered), delivered[:3]
        delivered = None
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)


def test_auto_create_topic_on_produce(broker_factory):
    broker = broker_factory(**{"num.partitions": 3, "auto.create.topics.enable": True})
    topic = "ck-auto-created"
    md = ck_admin(broker.bootstrap).list_topics(timeout=10)
    assert topic not in md.topics
    recs = make_records(3000, 3, "auto", explicit_partition=False)
    ck_produce(broker.bootstrap, topic, recs, {"compression.type": "snappy"})
    assert ck_partition_count(broker.bootstrap, topic) == 3
    marks = ck_watermarks(broker.bootstrap, topic, 3)
    assert all(lo == 0 for lo, _ in marks.values()), marks
    assert sum(hi for _, hi in marks.values()) == len(recs), marks
    got = ck_consume(broker.bootstrap, topic, {p: hi for p, (_, hi) in marks.items()})
    key_part = assert_exact_client_partitioned(recs, got, partitions=3)
    # librdkafka's default partitioner spread 31 keys over all 3 partitions.
    assert set(key_part.values()) == {0, 1, 2}


def test_auto_create_disabled(broker_factory):
    from confluent_kafka import KafkaError, Producer

    broker = broker_factory(**{"auto.create.topics.enable": False})
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.timeout.ms": 3000})
    errors: list = []
    producer.produce("ck-never-created", value=b"x", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(15) == 0
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._MSG_TIMED_OUT), errors[0]
    md = ck_admin(broker.bootstrap).list_topics(timeout=10)
    assert "ck-never-created" not in md.topics


def test_admin_create_describe_delete(broker):
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import ConfigResource, ConfigSource, NewTopic

    admin = ck_admin(broker.bootstrap)
    topic = "ck-admin"
    ck_create_topic(broker.bootstrap, topic, 4, {"retention.ms": "123456", "segment.bytes": "1048576"})

    # Creating it again: TOPIC_ALREADY_EXISTS.
    fut = admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)],
                              request_timeout=15)[topic]
    with pytest.raises(KafkaException) as excinfo:
        fut.result(timeout=20)
    assert excinfo.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    # Zero partitions: INVALID_PARTITIONS.
    with pytest.raises((KafkaException, ValueError)) as excinfo:
        admin.create_topics([NewTopic("ck-zero", num_partitions=0, replication_factor=1)],
                            request_timeout=15)["ck-zero"].result(timeout=20)
    if isinstance(excinfo.value, KafkaException):
        assert excinfo.value.args[0].code() == KafkaError.INVALID_PARTITIONS

    # DescribeConfigs shows the overrides as topic configs.
    res = ConfigResource("topic", topic)
    configs = admin.describe_configs([res], request_timeout=15)[res].result(timeout=20)
    assert configs["retention.ms"].value == "123456"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].value == "1048576"
    assert configs["segment.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value

    # Produce something, delete, and the topic is gone from metadata.
    ck_produce(broker.bootstrap, topic, make_records(100, 4, "adm"))
    admin.delete_topics([topic], operation_timeout=10, request_timeout=15)[topic].result(timeout=20)
    wait_until(lambda: topic not in ck_admin(broker.bootstrap).list_topics(timeout=5).topics,
               15, what=f"{topic} to disappear from metadata")
    # Its partition directories leave the data dir (Kafka renames them aside, then deletes).
    wait_until(lambda: not any(partition_dir(broker.data_dir, topic, p).exists() for p in range(4)),
               15, what=f"{topic} partition directories to go")

    # Recreate with the same name: empty again.
    ck_create_topic(broker.bootstrap, topic, 2)
    assert ck_watermarks(broker.bootstrap, topic, 2) == {0: (0, 0), 1: (0, 0)}


def test_describe_broker_configs(broker_factory):
    from confluent_kafka.admin import ConfigResource

    broker = broker_factory(**{"num.partitions": 5, "log.retention.ms": 987654})
    admin = ck_admin(broker.bootstrap)
    res = ConfigResource("broker", "1")
    configs = admin.describe_configs([res], request_timeout=15)[res].result(timeout=20)
    assert configs["num.partitions"].value == "5"
    assert configs["log.retention.ms"].value == "987654"


def test_concurrent_producers_interleave_exactly(broker):
    """Four producers write the same partitions at once; every record lands exactly
    once, offsets stay contiguous, and each producer's records keep their order."""
    import threading

    topic = "ck-concurrent"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    per_producer = {w: make_records(2500, PARTITIONS, f"w{w}") for w in range(4)}
    results: dict[int, object] = {}

    def run(w: int) -> None:
        try:
            results[w] = ck_produce(broker.bootstrap, topic, per_producer[w],
                                    {"compression.type": CODECS[w + 1], "linger.ms": 2})
        except BaseException as exc:  # surfaced below
            results[w] = exc

    threads = [threading.Thread(target=run, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for w in range(4):
        assert isinstance(results.get(w), list), f"producer {w}: {results.get(w)!r}"

    counts = {p: sum(expected_counts(recs)[p] for recs in per_producer.values()) for p in range(PARTITIONS)}
    got = ck_consume(broker.bootstrap, topic, counts)
    assert len(got) == 10_000
    for p in range(PARTITIONS):
        mine = [g for g in got if g.partition == p]
        assert [g.offset for g in mine] == list(range(counts[p]))
    for w, recs in per_producer.items():
        delivered = results[w]
        offsets: dict[tuple[int, int], object] = {}
        for r, (p, off) in zip(recs, delivered, strict=True):
            assert p == r.partition
            offsets[(p, off)] = r
        seen = [(g.partition, g.offset) for g in got if (g.partition, g.offset) in offsets]
        assert len(seen) == len(recs), f"producer {w}: {len(seen)} of {len(recs)} records found"
        for g in got:
            r = offsets.get((g.partition, g.offset))
            if r is not None:
                assert (g.key, g.value, g.headers, g.timestamp_ms) == (r.key, r.value, r.headers, r.timestamp_ms)
        for p in range(PARTITIONS):
            offs = [off for (pp, off) in delivered if pp == p]
            assert offs == sorted(offs), f"producer {w} partition {p}: order not kept"


def test_consumer_tails_new_records_via_long_poll(broker):
    """A consumer parked at the log end (long-polling Fetch) receives records produced
    afterwards, promptly and exactly."""
    import threading
    import time

    from confluent_kafka import OFFSET_END, TopicPartition

    from tests.interop.clients import ck_consumer, ck_got

    topic = "ck-tail"
    ck_create_topic(broker.bootstrap, topic, 1)
    ck_produce(broker.bootstrap, topic, make_records(50, 1, "before"))
    consumer = ck_consumer(broker.bootstrap, {"fetch.wait.max.ms": 500})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_END)])
        assert consumer.consume(num_messages=100, timeout=1.5) == []  # nothing new yet
        later = make_records(200, 1, "after")
        producer = threading.Thread(target=ck_produce, args=(broker.bootstrap, topic, later))
        producer.start()
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 200 and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                assert not msg.error(), msg.error()
                got.append(ck_got(msg))
        producer.join(30)
        got += [ck_got(m) for m in consumer.consume(num_messages=500, timeout=0.5)]
    finally:
        consumer.close()
    assert_exact(later, got, partitions=1, start_offsets={0: 50})


def test_tiny_fetch_sizes_still_progress(broker):
    """max.partition.fetch.bytes / fetch.max.bytes far below one batch: the broker must
    still return at least one whole batch per fetch (KIP-74), so consumers progress."""
    topic = "ck-tiny-fetch"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = make_records(3000, PARTITIONS, "tiny")
    ck_produce(broker.bootstrap, topic, recs, {"linger.ms": 50, "compression.type": "gzip"})
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs),
                     conf={"max.partition.fetch.bytes": 1, "fetch.max.bytes": 1024, "message.max.bytes": 1000,
                           "fetch.min.bytes": 1})
    assert_exact(recs, got, partitions=PARTITIONS)


def test_start_mid_batch_and_past_end(broker):
    """Assign inside a compressed batch: records before the offset are not delivered.
    Assign past the log end with auto.offset.reset=error: OFFSET_OUT_OF_RANGE."""
    import time

    from confluent_kafka import KafkaError, TopicPartition

    from tests.interop.clients import ck_consumer

    topic = "ck-midbatch"
    ck_create_topic(broker.bootstrap, topic, 1)
    recs = make_records(1000, 1, "mid")
    ck_produce(broker.bootstrap, topic, recs, {"linger.ms": 100, "compression.type": "zstd"})
    got = ck_consume(broker.bootstrap, topic, {0: 1000 - 417}, start=417)
    assert_exact(recs[417:], got, partitions=1, start_offsets={0: 417})

    # At exactly the log end: no error, nothing delivered.
    got = ck_consume(broker.bootstrap, topic, {0: 0}, start=1000, conf={"auto.offset.reset": "error"},
                     settle_s=1.5)
    assert got == []

    consumer = ck_consumer(broker.bootstrap, {"auto.offset.reset": "error"})
    try:
        consumer.assign([TopicPartition(topic, 0, 1010)])
        err = None
        deadline = time.monotonic() + 15
        while err is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error(), f"unexpected record at offset {msg.offset()}"
                err = msg.error()
    finally:
        consumer.close()
    assert err is not None, "no error for a fetch past the log end"
    assert err.code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET), err
    assert "out of range" in err.str().lower(), err


def test_data_survives_clean_restart(broker):
    topic = "ck-restart"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS, {"segment.bytes": "50000"})
    recs = make_records(5000, PARTITIONS, "restart")
    delivered = ck_produce(broker.bootstrap, topic, recs, {"compression.type": "snappy"})
    marks = ck_watermarks(broker.bootstrap, topic, PARTITIONS)
    broker.restart()
    assert ck_watermarks(broker.bootstrap, topic, PARTITIONS) == marks
    got = ck_consume(broker.bootstrap, topic, expected_counts(recs))
    assert_exact(recs, got, partitions=PARTITIONS, delivered=delivered)
    # And appends continue at the right offsets.
    more = make_records(300, PARTITIONS, "after-restart", base_ts_ms=1_750_000_000_000)
    delivered2 = ck_produce(broker.bootstrap, topic, more)
    counts = expected_counts(recs)
    for r, (p, off) in zip(more, delivered2, strict=True):
        assert p == r.partition and off >= counts[p]
    got = ck_consume(broker.bootstrap, topic, {p: counts[p] + expected_counts(more)[p] for p in range(PARTITIONS)})
    assert_exact(recs + more, got, partitions=PARTITIONS)


def test_large_records_near_max_message_bytes(broker):
    """Batches of ~0.9 MB, far above the consumer's max.partition.fetch.bytes, are still
    delivered whole, one per fetch (KIP-74)."""
    import random

    topic = "ck-large"
    ck_create_topic(broker.bootstrap, topic, 1)
    rnd = random.Random(7)
    recs = [Rec(0, f"big{i}".encode(), rnd.randbytes(900_000 - 1000 * i), (("n", str(i).encode()),),
                1_700_000_000_000 + i) for i in range(6)]
    delivered = ck_produce(broker.bootstrap, topic, recs, {"linger.ms": 0}, flush_every=1)
    assert delivered == [(0, i) for i in range(6)]
    got = ck_consume(broker.bootstrap, topic, {0: 6}, conf={"max.partition.fetch.bytes": 100_000})
    assert_exact(recs, got, partitions=1)
