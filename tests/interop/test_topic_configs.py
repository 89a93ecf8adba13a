"""Topic-level configs that change what clients see: size-based retention,
LogAppendTime, broker-side compression.type, max.message.bytes."""

from __future__ import annotations

import dataclasses
import time

import pytest

from tests.interop.clients import ck_admin, ck_consume, ck_create_topic, ck_produce, ck_watermarks
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
from tests.unit.test_topic_config import VALID

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
        try:
            sizes = [p.stat().st_size for p in segs]
        except FileNotFoundError:
            return None  # retention deleted a segment between the listing and its stat: not settled yet
        total = sum(sizes)
        if low > 0 and 30000 <= total < 30000 + sizes[0]:
            return low, segs, total
        return None

    # Retention checks run every 500 ms; a loaded machine delays them, never stops them.
    low, segs, total = wait_until(settled, 90, what="size-based retention to settle")
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


# ---------------------------------------------------------------- Kafka 3.9's topic configs, through real admin clients

# A valid, non-default value of every Kafka 3.9 topic config, and how DescribeConfigs shows it:
# the unit tests' table, with a segment size and min.insync.replicas a one-broker topic can live with.
EVERY_CONFIG = {**VALID, "segment.bytes": ("1048576", "1048576"), "min.insync.replicas": ("1", "1")}

# Refused with INVALID_CONFIG (40) and Kafka 3.9's message.
BAD_CONFIGS = [
    ("cleanup.policy", "bogus",
     "Invalid value bogus for configuration cleanup.policy: String must be one of: compact, delete"),
    ("min.insync.replicas", "0", "Invalid value 0 for configuration min.insync.replicas: Value must be at least 1"),
    ("max.compaction.lag.ms", "0",
     "Invalid value 0 for configuration max.compaction.lag.ms: Value must be at least 1"),
    ("min.cleanable.dirty.ratio", "1.5",
     "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no more than 1"),
    ("message.format.version", "4.0",
     "Invalid value 4.0 for configuration message.format.version: Version 4.0 is not a valid version"),
    ("preallocate", "yes",
     "Invalid value yes for configuration preallocate: Expected value to be either true or false"),
    ("segment.bytes", "2147483648",
     "Invalid value 2147483648 for configuration segment.bytes: Not a number of type INT"),
    ("no.such.config", "1", "Unknown topic config name: no.such.config"),
]

TOPIC_SOURCE, DEFAULT_SOURCE = 1, 5  # DescribeConfigs config sources


def ck_described(bootstrap: str, topic: str) -> dict[str, tuple[str, int]]:
    """Every config of a topic as (value, source) from confluent-kafka's describe_configs."""
    from confluent_kafka.admin import ConfigResource

    admin = ck_admin(bootstrap)  # kept until the answer is in: the futures fail once it is gone
    (future,) = admin.describe_configs([ConfigResource("topic", topic)], request_timeout=15).values()
    return {name: (entry.value, int(entry.source)) for name, entry in future.result(timeout=20).items()}


def ck_create_error(bootstrap: str, topic: str, config: dict[str, str]):
    from confluent_kafka.admin import NewTopic

    admin = ck_admin(bootstrap)
    (future,) = admin.create_topics([NewTopic(topic, 1, 1, config=config)], request_timeout=15).values()
    with pytest.raises(Exception) as info:
        future.result(timeout=20)
    return info.value.args[0]


def ck_incremental(bootstrap: str, topic: str, *ops: tuple[str, str | None, object]):
    """IncrementalAlterConfigs (name, value, AlterConfigOpType): None, or the KafkaError."""
    from confluent_kafka.admin import ConfigEntry, ConfigResource

    entries = [ConfigEntry(name, value, incremental_operation=op) for name, value, op in ops]
    admin = ck_admin(bootstrap)
    (future,) = admin.incremental_alter_configs(
        [ConfigResource("topic", topic, incremental_configs=entries)], request_timeout=15).values()
    try:
        future.result(timeout=20)
    except Exception as exc:
        return exc.args[0]
    return None


def _outcome(topic: dict) -> dict:
    return {k: topic[k] for k in ("name", "error_code", "error_message")}


def test_every_kafka_topic_config_is_accepted_at_create_and_described(broker):
    """confluent-kafka and kafka-python create topics with every Kafka 3.9 topic config set;
    DescribeConfigs shows each value (Kafka's rendering) as a topic override."""
    from kafka.admin import KafkaAdminClient, NewTopic

    bs = broker.bootstrap
    given = {name: value for name, (value, _) in EVERY_CONFIG.items()}
    want = {name: (shown, TOPIC_SOURCE) for name, (_, shown) in EVERY_CONFIG.items()}
    ck_create_topic(bs, "tc-every-ck", 1, given)
    assert ck_described(bs, "tc-every-ck") == want

    admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=15000)
    try:
        response = admin.create_topics([NewTopic("tc-every-kp", 1, 1, topic_configs=given)], timeout_ms=10000)
    finally:
        admin.close()
    # (CreateTopics v5+ also hands back the configs, and v7 the topic id: not compared here)
    assert [_outcome(t) for t in response["topics"]] == [{"name": "tc-every-kp", "error_code": 0, "error_message": None}]
    assert ck_described(bs, "tc-every-kp") == want


@pytest.mark.parametrize(("name", "value", "message"), BAD_CONFIGS, ids=[f"{n}={v}" for n, v, _ in BAD_CONFIGS])
def test_bad_topic_configs_are_refused_with_invalid_config(broker, name, value, message):
    """CreateTopics (both clients), AlterConfigs (kafka-python) and IncrementalAlterConfigs
    (confluent-kafka) refuse the value with INVALID_CONFIG and Kafka's message; nothing changes."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

    bs = broker.bootstrap
    error = ck_create_error(bs, "tc-bad-ck", {name: value})
    assert (error.code(), error.str()) == (KafkaError.INVALID_CONFIG, message)

    admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=15000)
    try:
        response = admin.create_topics([NewTopic("tc-bad-kp", 1, 1, topic_configs={name: value})],
                                       timeout_ms=10000, raise_errors=False)
        assert [_outcome(t) for t in response["topics"]] == [
            {"name": "tc-bad-kp", "error_code": 40, "error_message": message}]
        ck_create_topic(bs, "tc-bad-alter", 1, {"retention.ms": "60000"})
        before = ck_described(bs, "tc-bad-alter")
        result = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "tc-bad-alter", configs={name: value})],
                                     incremental=False, raise_on_unknown=False)
        assert result == {"topic": {"tc-bad-alter": f"[Error 40] InvalidConfigurationError: {message}"}}
    finally:
        admin.close()
    error = ck_incremental(bs, "tc-bad-alter", (name, value, AlterConfigOpType.SET))
    assert (error.code(), error.str()) == (KafkaError.INVALID_CONFIG, message)
    assert ck_described(bs, "tc-bad-alter") == before


def test_incremental_append_subtract_and_delete(broker):
    """APPEND adds the values a list config lacks (to Kafka's default when unset), SUBTRACT
    removes those given, DELETE goes back to the default; APPEND/SUBTRACT on a non-list
    config is INVALID_CONFIG. Through confluent-kafka and kafka-python."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AlterConfigOpType as Op
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    bs, topic = broker.bootstrap, "tc-append"
    ck_create_topic(bs, topic, 1, {"retention.ms": "60000"})

    def shown(name: str) -> tuple[str, int]:
        return ck_described(bs, topic)[name]

    assert shown("cleanup.policy") == ("delete", DEFAULT_SOURCE)
    assert ck_incremental(bs, topic, ("cleanup.policy", "compact", Op.APPEND)) is None
    assert shown("cleanup.policy") == ("delete,compact", TOPIC_SOURCE)
    assert ck_incremental(bs, topic, ("cleanup.policy", "compact,delete", Op.APPEND)) is None
    assert shown("cleanup.policy") == ("delete,compact", TOPIC_SOURCE)
    assert ck_incremental(bs, topic, ("cleanup.policy", "delete", Op.SUBTRACT)) is None
    assert shown("cleanup.policy") == ("compact", TOPIC_SOURCE)
    assert ck_incremental(bs, topic, ("follower.replication.throttled.replicas", "0:1,1:1", Op.APPEND),
                          ("leader.replication.throttled.replicas", "*", Op.APPEND)) is None
    assert ck_incremental(bs, topic, ("follower.replication.throttled.replicas", "0:1", Op.SUBTRACT)) is None
    described = ck_described(bs, topic)
    assert (described["follower.replication.throttled.replicas"], described["leader.replication.throttled.replicas"]) \
        == (("1:1", TOPIC_SOURCE), ("*", TOPIC_SOURCE))

    for op, verb in ((Op.APPEND, "APPEND"), (Op.SUBTRACT, "SUBTRACT")):
        error = ck_incremental(bs, topic, ("retention.ms", "5", op))
        assert (error.code(), error.str()) == (
            KafkaError.INVALID_CONFIG, f"Can't {verb} to key retention.ms because its type is not LIST.")
    assert shown("retention.ms") == ("60000", TOPIC_SOURCE)

    admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=15000)
    try:
        def alter(configs: dict) -> object:
            result = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)],
                                         incremental=True, raise_on_unknown=False)
            return result["topic"][topic]

        assert alter({"cleanup.policy": ("APPEND", "delete")}) == "OK"
        assert shown("cleanup.policy") == ("compact,delete", TOPIC_SOURCE)
        assert alter({"cleanup.policy": ("SUBTRACT", "compact")}) == "OK"
        assert shown("cleanup.policy") == ("delete", TOPIC_SOURCE)
        assert alter({"max.compaction.lag.ms": ("APPEND", "1000")}) == (
            "[Error 40] InvalidConfigurationError: Can't APPEND to key max.compaction.lag.ms because its type is "
            "not LIST.")
    finally:
        admin.close()

    assert ck_incremental(bs, topic, ("cleanup.policy", None, Op.DELETE), ("retention.ms", None, Op.DELETE)) is None
    described = ck_described(bs, topic)
    assert (described["cleanup.policy"], described["retention.ms"]) == (
        ("delete", DEFAULT_SOURCE), ("604800000", DEFAULT_SOURCE))
