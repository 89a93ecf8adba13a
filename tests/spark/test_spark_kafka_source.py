"""Spark's own Kafka source (spark-sql-kafka-0-10 4.0.0 with its kafka-clients, from `make
peers`) as a client of a dcmirror broker, row for row against our `dcmirror` data source.

One broker and one Spark session (with spark.jars = the spark-kafka peers) for the module.
The topics hold what a Kafka source meets in practice:
- `plain` (3 partitions): null and empty keys and values, headers (none, several, repeated
  keys, null and empty values), CreateTime timestamps, batches in every codec (none, gzip,
  snappy, lz4, zstd), one record larger than Spark's consumer's max.partition.fetch.bytes
  (the broker still hands it out whole);
- `appended`: message.timestamp.type=LogAppendTime (the broker's time, timestampType 1);
- `compacted`: cleanup.policy=compact with tiny segments, read after the cleaner made holes
  in its offsets (tombstones included);
- `txn` (2 partitions): two transactional producers interleaved with an idempotent one,
  committed and aborted transactions, and one left open at the end.

Each read runs through both sources with the same options (kafka.isolation.level given to
both: the two sources' defaults differ; once with minPartitions, so ranges start in the
middle of batches, transactions and holes) and the sorted rows (topic, partition, offset, key,
value, timestamp, timestampType, headers) must be equal. read_committed is also checked
against what was produced: committed records only, ending at the open transaction's first
offset (the last stable offset). A read starting inside an aborted transaction must leave
out its remaining records too (the broker names transactions that began before the fetch
offset in Fetch's aborted_transactions, as Kafka's transaction index does).

Where the two sources differ legitimately (normalized before comparing, see SOURCE_DIFFERENCES):
- headers of a record that has none: Spark's source gives NULL, ours an empty array. The
  warehouse's headers column has held [] for such records since the first load; a NULL
  from the source would change what loads write into existing tables.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_aggregate.session import stop_session
from spark_aggregate.source import register
from tests.harness import BrokerProcess
from tests.peers.fetch import set_dir

# A SparkSession inside a pytest-xdist worker fails its accumulator handshake: make test runs
# these files in a plain pytest (see tests/spark/test_source.py).
pytestmark = [pytest.mark.timeout(300), pytest.mark.spark_session]

# CreateTime an hour ago: inside every retention.ms here (a broker deletes older segments at
# its first retention pass, which Kafka runs 30 s after it starts).
TS0 = (int(time.time()) - 3600) * 1000
TOPICS = {"plain": 3, "appended": 1, "compacted": 1, "txn": 2}
SOURCE_DIFFERENCES = {
    "headers": "a record without headers: NULL from Spark's source, [] from ours (the warehouse's column "
               "has always held [] for them)",
}
Row = tuple[Any, ...]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path_factory.mktemp("spark-kafka-broker") / "broker", log_cleaner_backoff_ms=100).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A plain local session (no warehouse: a Hive-enabled one starts some 25 s slower on a
    busy 2-core machine) with the spark-kafka jars and our source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers import the project (as start_session)
    from pyspark.sql import SparkSession

    jars = ",".join(str(j) for j in sorted(set_dir("spark-kafka").glob("*.jar")))
    session = (SparkSession.builder.master("local[2]").appName("tests/spark/test_spark_kafka_source.py")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC").config("spark.driver.memory", "1g")
               .config("spark.jars", jars).getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    stop_session(session)


class Topics:
    """What was produced into `txn`: the values of committed (and non-transactional), aborted
    and still open transactions, and where a read can start inside an aborted one."""

    def __init__(self) -> None:
        self.committed_txn_values: set[bytes] = set()
        self.aborted_txn_values: set[bytes] = set()
        self.open_txn_values: set[bytes] = set()
        self.inside_aborted: dict[int, int] = {}  # txn partition -> an offset in the middle of an aborted transaction


@pytest.fixture(scope="module")
def topics(broker: BrokerProcess) -> Iterator[Topics]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    configs = {"plain": {"max.message.bytes": str(4 << 20)},
               "appended": {"message.timestamp.type": "LogAppendTime"},
               "compacted": {"cleanup.policy": "compact", "segment.bytes": "1024", "min.cleanable.dirty.ratio": "0.01"}}
    for future in admin.create_topics([NewTopic(t, n, 1, config=configs.get(t, {})) for t, n in TOPICS.items()]).values():
        future.result(30)
    made = Topics()
    produce_plain(broker.bootstrap)
    produce_appended(broker.bootstrap)
    produce_compacted(broker.bootstrap)
    produce_txn(broker.bootstrap, made)
    wait_compacted(broker.bootstrap)
    yield made


def _producer(bootstrap: str, **extra: object) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, **extra})


def _flush(p: Producer, what: str) -> None:
    assert p.flush(30) == 0, f"{what}: records still unacknowledged after 30 s"


HEADER_SETS: list[list[tuple[str, str | bytes | None]] | None] = [
    None, [("a", b"1")], [("dup", b"x"), ("dup", b"y"), ("nullv", None)], [("empty", b"")], [("u\u00e9", b"\x00\xff")],
]


LARGE_VALUE = bytes(range(256)) * 6144  # 1.5 MiB: over the Java consumer's 1 MiB max.partition.fetch.bytes
PLAIN_RECORDS = 201


def produce_plain(bootstrap: str) -> None:
    n = 0
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        p = _producer(bootstrap, **{"compression.type": codec, "enable.idempotence": codec != "none"})
        for _ in range(40):
            key = None if n % 5 == 0 else b"" if n % 13 == 0 else b"k%d" % n
            value = None if n % 7 == 0 else b"" if n % 11 == 0 else b"%s-%d " % (codec.encode(), n) * (1 + n % 4)
            p.produce("plain", value=value, key=key, partition=n % 3, timestamp=TS0 + n * 1000,
                      headers=HEADER_SETS[n % len(HEADER_SETS)])
            n += 1
        _flush(p, f"plain ({codec})")
    p = _producer(bootstrap, **{"message.max.bytes": 8 << 20})
    p.produce("plain", value=LARGE_VALUE, key=b"large", partition=n % 3, timestamp=TS0 + n * 1000)
    _flush(p, "plain (large)")


def produce_appended(bootstrap: str) -> None:
    p = _producer(bootstrap)
    for n in range(12):
        p.produce("appended", value=b"a%d" % n, key=b"k%d" % n, timestamp=TS0 + n)  # the broker's time replaces it
        if n % 4 == 3:
            _flush(p, "appended")  # several batches, several append times


def produce_compacted(bootstrap: str) -> None:
    p = _producer(bootstrap, **{"enable.idempotence": True})
    for n in range(120):
        key = b"key-%d" % (n % 9)
        value = None if n % 17 == 16 else b"value-%d" % n  # tombstones among them
        p.produce("compacted", value=value, key=key, timestamp=TS0 + n, headers=[("n", b"%d" % n)])
        if n % 6 == 5:
            _flush(p, "compacted")  # small batches: many 1 KiB segments, most of them cleanable


def wait_compacted(bootstrap: str, timeout_s: float = 60.0) -> None:
    """Until the cleaner removed records of `compacted` (fewer records than offsets)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records, end = count_records(bootstrap, "compacted", 0)
        if records < end:
            return
        assert time.monotonic() < deadline, f"compacted: {records} records of {end} offsets after {timeout_s:.0f} s"
        time.sleep(0.2)


def count_records(bootstrap: str, topic: str, partition: int) -> tuple[int, int]:
    """(records a consumer reads up to the end offset, the end offset)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-kafka-count", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    try:
        end = c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
        c.assign([TopicPartition(topic, partition, 0)])
        seen = 0
        while True:
            msg = c.poll(10)
            assert msg is not None, f"reading {topic}-{partition}: nothing within 10 s"
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                return seen, end
            seen += 1
    finally:
        c.close()


def produce_txn(bootstrap: str, made: Topics) -> None:
    """Interleaved on both partitions: an idempotent producer, tx1 and tx2; tx2's first
    transaction aborts after the others wrote between its records; a transaction stays open."""
    plain = _producer(bootstrap, **{"enable.idempotence": True})
    tx1 = _producer(bootstrap, **{"transactional.id": "spark-tx1"})
    tx2 = _producer(bootstrap, **{"transactional.id": "spark-tx2"})
    tx1.init_transactions(30)
    tx2.init_transactions(30)
    counter = iter(range(10_000))

    def send(p: Producer, tag: str, count: int, into: set[bytes] | None) -> None:
        for _ in range(count):
            n = next(counter)
            value = b"%s-%d" % (tag.encode(), n)
            p.produce("txn", value=value, key=b"k%d" % (n % 5), partition=n % 2, timestamp=TS0 + n,
                      headers=[("from", tag.encode())])
            if into is not None:
                into.add(value)
        _flush(p, tag)

    send(plain, "plain", 4, made.committed_txn_values)
    tx1.begin_transaction()
    tx2.begin_transaction()
    send(tx1, "tx1", 5, made.committed_txn_values)
    send(tx2, "tx2", 4, made.aborted_txn_values)
    send(plain, "plain", 2, made.committed_txn_values)
    send(tx2, "tx2", 4, made.aborted_txn_values)
    tx1.commit_transaction(30)
    tx2.abort_transaction(30)
    tx1.begin_transaction()
    send(tx1, "tx1", 3, made.aborted_txn_values)
    tx1.abort_transaction(30)
    tx2.begin_transaction()
    send(tx2, "tx2", 3, made.committed_txn_values)
    tx2.commit_transaction(30)
    send(plain, "plain", 3, made.committed_txn_values)
    tx1.begin_transaction()
    send(tx1, "tx1", 4, made.open_txn_values)  # left open: the last stable offset stays at its first record
    # An offset inside tx2's aborted transaction, after its first record, on each partition.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "spark-kafka-txn", "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted"})
    try:
        for p in range(2):
            c.assign([TopicPartition("txn", p, 0)])
            offsets: list[int] = []
            while len(offsets) < 3:
                msg = c.poll(10)
                assert msg is not None and msg.error() is None, f"reading txn-{p}: {msg and msg.error()}"
                value = msg.value()
                if value is not None and value.startswith(b"tx2-") and value in made.aborted_txn_values:
                    offset = msg.offset()
                    assert offset is not None
                    offsets.append(offset)
            made.inside_aborted[p] = offsets[1]
    finally:
        c.close()


# ---- reading through both sources ----

def read(spark: Any, source: str, bootstrap: str, **options: Any) -> list[Row]:
    """Sorted rows (topic, partition, offset, key, value, timestamp, timestampType, headers
    as they came: NULL or a list)."""
    reader = spark.read.format(source).option("kafka.bootstrap.servers", bootstrap).option("includeHeaders", "true")
    for key, value in options.items():
        reader = reader.option(key, value if isinstance(value, str) else orjson.dumps(value).decode())
    rows = []
    for r in reader.load().collect():
        headers = None if r["headers"] is None else [(h["key"], _bytes(h["value"])) for h in r["headers"]]
        rows.append((r["topic"], r["partition"], r["offset"], _bytes(r["key"]), _bytes(r["value"]), r["timestamp"],
                     r["timestampType"], headers))
    return sorted(rows, key=lambda row: row[:3])


def millis(ts: Any) -> int:
    return round(ts.timestamp() * 1000)


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def both(spark: Any, bootstrap: str, **options: Any) -> list[Row]:
    """The rows of Spark's Kafka source, asserted equal to ours with the same options, once
    SOURCE_DIFFERENCES are normalized (each is asserted to still be there: a difference fixed
    in either source must leave the table)."""
    theirs = read(spark, "kafka", bootstrap, **options)
    ours = read(spark, "dcmirror", bootstrap, **options)
    no_headers = [(t[7], o[7]) for t, o in zip(theirs, ours, strict=False) if t[:7] == o[:7] and not o[7]]
    assert all(pair == (None, []) for pair in no_headers), f"SOURCE_DIFFERENCES['headers']: {no_headers[:3]}"
    theirs = [(*r[:7], r[7] or []) for r in theirs]
    if theirs != ours:
        differing = [(t, o) for t, o in zip(theirs, ours, strict=False) if t != o][:5]
        raise AssertionError(f"{options}: Spark's Kafka source read {len(theirs)} rows, dcmirror's {len(ours)}; "
                             f"first differing rows (Spark's, ours): {differing}")
    return theirs


@pytest.mark.parametrize(("isolation", "min_partitions"),
                         [("read_committed", None), ("read_uncommitted", None), ("read_committed", "23")])
def test_the_same_rows_as_our_source(spark: Any, broker: BrokerProcess, topics: Topics, isolation: str,
                                     min_partitions: str | None) -> None:
    split = {"minPartitions": min_partitions} if min_partitions else {}
    rows = both(spark, broker.bootstrap, subscribe=",".join(TOPICS), **{"kafka.isolation.level": isolation}, **split)
    by_topic: dict[str, list[Row]] = {t: [r for r in rows if r[0] == t] for t in TOPICS}

    assert len(by_topic["plain"]) == PLAIN_RECORDS
    assert {r[6] for r in by_topic["plain"]} == {0}
    assert sorted(millis(r[5]) for r in by_topic["plain"]) == [TS0 + n * 1000 for n in range(PLAIN_RECORDS)]
    assert [r[4] for r in by_topic["plain"] if r[3] == b"large"] == [LARGE_VALUE]
    assert any(r[7] == [] for r in by_topic["plain"])  # so both() saw SOURCE_DIFFERENCES["headers"] still there
    assert {r[6] for r in by_topic["appended"]} == {1}  # LogAppendTime: the broker's clock
    assert all(millis(r[5]) > TS0 + 3_000_000 for r in by_topic["appended"])
    compacted_records, compacted_end = count_records(broker.bootstrap, "compacted", 0)
    assert len(by_topic["compacted"]) == compacted_records < compacted_end  # read across the cleaner's holes

    txn_values = {r[4] for r in by_topic["txn"]}
    if isolation == "read_committed":
        assert txn_values == topics.committed_txn_values  # nothing aborted, nothing of the open transaction
    else:
        assert txn_values == topics.committed_txn_values | topics.aborted_txn_values | topics.open_txn_values


def test_a_read_starting_inside_an_aborted_transaction(spark: Any, broker: BrokerProcess, topics: Topics) -> None:
    starting = {"txn": {str(p): o for p, o in topics.inside_aborted.items()}}
    rows = both(spark, broker.bootstrap, assign={"txn": [0, 1]}, startingOffsets=starting,
                **{"kafka.isolation.level": "read_committed"})
    assert rows and all(r[2] >= topics.inside_aborted[r[1]] for r in rows)
    assert not {r[4] for r in rows} & topics.aborted_txn_values
    assert {r[4] for r in rows} <= topics.committed_txn_values
