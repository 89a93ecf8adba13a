"""The `dcmirror` source's executor side (plan_ranges, read_range: no Spark needed) on a topic
written by a librdkafka transactional producer: read_committed by default, so a range ends
at the last stable offset and holds committed records only, in order; with
kafka.isolation.level=read_uncommitted it ends at the high watermark and holds everything
(as Spark's Kafka source with that option)."""

from __future__ import annotations

from typing import Any

import pytest

from spark_aggregate.options import parse_options
from spark_aggregate.ranges import OffsetRange
from spark_aggregate.source import plan_ranges, read_range
from tests.cluster_helpers import wait_until
from tests.interop.clients import ck_create_topic
from tests.interop.test_transactions import txn_producer

pytestmark = pytest.mark.timeout(120)

TOPIC = "txn-load"


def values_read(bootstrap: str, **extra: str) -> tuple[list[tuple[int, int]], list[bytes]]:
    options = parse_options({"bootstrap.servers": bootstrap, "subscribe": TOPIC, **extra})
    ranges = plan_ranges(options)
    values: list[bytes] = []
    for r in ranges:
        for batch in read_range(options, r):
            values += batch.column("value").to_pylist()
    return [(r.start, r.end) for r in ranges], values


def test_the_source_reads_committed_transactions_only(broker: Any) -> None:
    ck_create_topic(broker.bootstrap, TOPIC, 1)
    p = txn_producer(broker.bootstrap, "loader-txn")
    committed: list[bytes] = []
    for n, (count, commit) in enumerate([(10, True), (5, False), (3, True), (7, False), (2, True)]):
        p.begin_transaction()
        for i in range(count):
            value = b"t%d-%d" % (n, i)
            p.produce(TOPIC, value=value, partition=0)
            if commit:
                committed.append(value)
        p.flush(30)  # abort_transaction purges what is not sent yet
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    # 27 records and 5 markers, then a transaction left open: its 4 records sit above the LSO.
    p.begin_transaction()
    for i in range(4):
        p.produce(TOPIC, value=b"open-%d" % i, partition=0)
    p.flush(30)

    # commit_transaction returns once the coordinator decided; the markers follow (as in Kafka).
    wait_until(lambda: plan_ranges(parse_options({"bootstrap.servers": broker.bootstrap, "subscribe": TOPIC}))
               == [OffsetRange(TOPIC, 0, 0, 32)], 10, "the last stable offset at the open transaction")
    ranges, values = values_read(broker.bootstrap)
    assert ranges == [(0, 32)], "read_committed ranges end at the last stable offset (before the open transaction)"
    assert values == committed  # 15 records, in order: no aborted record, no marker

    ranges, values = values_read(broker.bootstrap, **{"kafka.isolation.level": "read_uncommitted"})
    assert ranges == [(0, 36)]
    assert len(values) == 27 + 4 and values[-4:] == [b"open-%d" % i for i in range(4)]

    p.commit_transaction(30)
    wait_until(lambda: values_read(broker.bootstrap)[0] == [(0, 37)], 10, "the open transaction's commit marker")
    ranges, values = values_read(broker.bootstrap)
    assert ranges == [(0, 37)]
    assert values == committed + [b"open-%d" % i for i in range(4)]
