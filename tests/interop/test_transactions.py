"""Kafka transactions against real brokers, with real clients (librdkafka through
confluent-kafka; kafka-python and aiokafka below): commit and abort, read_committed and
read_uncommitted readers, zombie fencing, offsets sent to the transaction, timeouts,
`dcmirror transactions`, and state that survives restarts."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.interop.clients import ck_create_topic

pytestmark = pytest.mark.timeout(180)


def txn_producer(bootstrap: str, txn_id: str, **extra: object) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **extra})
    p.init_transactions(30)
    return p


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, *, expect: int | None = None,
             idle_s: float = 3.0) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of everything a fresh consumer reads, in order per partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{uuid.uuid4().hex[:8]}",
                  "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + 60
    last = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                if (expect is None or len(out) >= expect) and time.monotonic() - last > idle_s:
                    break
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(m.error())
            out.append((m.partition(), m.offset(), m.value()))
            last = time.monotonic()
    finally:
        c.close()
    return out


def test_commit_and_abort_read_committed_and_uncommitted(broker):
    topic = "txn-basic"
    ck_create_topic(broker.bootstrap, topic, 2)
    p = txn_producer(broker.bootstrap, "app-1")
    p.begin_transaction()
    for i in range(10):
        p.produce(topic, value=f"c1-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(7):
        p.produce(topic, value=f"a1-{i}".encode(), partition=i % 2)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"c2-{i}".encode(), partition=i % 2)
    p.commit_transaction(30)

    committed = read_all(broker.bootstrap, topic, 2, "read_committed", expect=15)
    values = [v.decode() for _, _, v in sorted(committed)]
    expected = sorted([f"c1-{i}" for i in range(10)] + [f"c2-{i}" for i in range(5)],
                      key=lambda s: (int(s.split("-")[1]) % 2, s[:2], int(s.split("-")[1])))
    assert len(committed) == 15
    assert values == expected
    uncommitted = read_all(broker.bootstrap, topic, 2, "read_uncommitted", expect=22)
    assert sorted(v.decode() for _, _, v in uncommitted) == sorted(
        [f"c1-{i}" for i in range(10)] + [f"a1-{i}" for i in range(7)] + [f"c2-{i}" for i in range(5)])
    # Offsets: 10 + 7 data, 3 markers per partition pair...; the end offset counts markers too.
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "wm", "isolation.level": "read_committed"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.close()
    assert (lo, hi) == (0, 5 + 4 + 3 + 3)  # 5 c1, 4 a1, 3 c2 records and 3 markers on partition 0


def test_open_transaction_holds_read_committed_back(broker):
    topic = "txn-open"
    ck_create_topic(broker.bootstrap, topic, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, value=b"before", partition=0)
    plain.flush(10)
    p = txn_producer(broker.bootstrap, "app-open")
    p.begin_transaction()
    p.produce(topic, value=b"inside", partition=0)
    p.flush(10)
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(10)
    assert [v for _, _, v in read_all(broker.bootstrap, topic, 1, "read_committed", idle_s=2)] == [b"before"]
    assert [v for _, _, v in read_all(broker.bootstrap, topic, 1, "read_uncommitted", expect=3)] == [
        b"before", b"inside", b"after"]
    p.commit_transaction(30)
    assert [v for _, _, v in read_all(broker.bootstrap, topic, 1, "read_committed", expect=3)] == [
        b"before", b"inside", b"after"]


def test_a_second_producer_with_the_same_id_fences_the_first(broker):
    topic = "txn-zombie"
    ck_create_topic(broker.bootstrap, topic, 1)
    old = txn_producer(broker.bootstrap, "app-z")
    old.begin_transaction()
    old.produce(topic, value=b"zombie-1", partition=0)
    old.flush(10)
    new = txn_producer(broker.bootstrap, "app-z")  # aborts the open transaction, bumps the epoch
    new.begin_transaction()
    new.produce(topic, value=b"new-1", partition=0)
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as info:
        old.produce(topic, value=b"zombie-2", partition=0)
        old.commit_transaction(10)
    assert info.value.args[0].fatal() or info.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    assert [v for _, _, v in read_all(broker.bootstrap, topic, 1, "read_committed", expect=1)] == [b"new-1"]


def test_consume_transform_produce_commits_offsets_with_the_output(broker):
    src, dst = "ctp-in", "ctp-out"
    ck_create_topic(broker.bootstrap, src, 1)
    ck_create_topic(broker.bootstrap, dst, 1)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        plain.produce(src, value=f"v{i}".encode(), partition=0)
    plain.flush(10)
    group = "ctp-app"
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.assign([TopicPartition(src, 0)])
    p = txn_producer(broker.bootstrap, "ctp-1")
    # First 10 records: committed with their offsets. Next 5: aborted (offsets not moved).
    for n, commit in ((10, True), (5, False)):
        p.begin_transaction()
        got = 0
        last = None
        while got < n:
            m = c.poll(5)
            assert m is not None and not m.error()
            p.produce(dst, value=m.value().upper(), partition=0)
            last = m
            got += 1
        assert last is not None
        p.send_offsets_to_transaction([TopicPartition(src, 0, last.offset() + 1)], c.consumer_group_metadata(), 30)
        if commit:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    c.close()
    check = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    (tp,) = check.committed([TopicPartition(src, 0)], timeout=10)
    check.close()
    assert tp.offset == 10
    assert [v for _, _, v in read_all(broker.bootstrap, dst, 1, "read_committed", expect=10)] == [
        f"V{i}".encode() for i in range(10)]


def test_transactions_time_out_and_abort_by_themselves(broker_factory):
    b = broker_factory(**{"transaction.abort.timed.out.transaction.cleanup.interval.ms": 200})
    topic = "txn-timeout"
    ck_create_topic(b.bootstrap, topic, 1)
    p = txn_producer(b.bootstrap, "app-slow", **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    p.produce(topic, value=b"never", partition=0)
    p.flush(10)
    plain = Producer({"bootstrap.servers": b.bootstrap})
    plain.produce(topic, value=b"later", partition=0)
    plain.flush(10)
    time.sleep(4)
    # The broker aborted it: read_committed readers move past it.
    assert [v for _, _, v in read_all(b.bootstrap, topic, 1, "read_committed", expect=1)] == [b"later"]
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
