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


def test_offsets_of_an_open_transaction_are_unstable_for_require_stable(broker):
    """OffsetFetch v7 require_stable (KIP-447; what Kafka Streams exactly_once_v2 and every
    read_committed Java consumer send): a partition whose offset a transaction has sent and
    not yet ended answers UNSTABLE_OFFSET_COMMIT (88), so the client retries instead of
    starting from the offset about to change; without require_stable, the committed one."""
    import trio

    from cluster.client.connection import BrokerConnection
    from cluster.protocol.api_keys import ApiKey

    topic, group = "stable-in", "stable-app"
    ck_create_topic(broker.bootstrap, topic, 2)
    meta = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    p = txn_producer(broker.bootstrap, "stable-1")

    async def fetch(version: int, require_stable: bool) -> dict[int, tuple[int, int]]:
        host, port = broker.bootstrap.split(":")
        conn = await BrokerConnection(host, int(port), client_id="stable").connect()
        try:
            body = {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0, 1]}]}
            if version >= 7:
                body["require_stable"] = require_stable
            resp = await conn.request(ApiKey.OFFSET_FETCH, body, version=version)
        finally:
            await conn.aclose()
        assert resp.error_code == 0
        return {int(q.partition_index): (int(q.error_code), int(q.committed_offset)) for q in resp.topics[0].partitions}

    p.begin_transaction()
    p.produce(topic, value=b"x", partition=0)
    p.send_offsets_to_transaction([TopicPartition(topic, 0, 7)], meta.consumer_group_metadata(), 30)
    assert trio.run(fetch, 7, True) == {0: (88, -1), 1: (0, -1)}
    assert trio.run(fetch, 7, False) == trio.run(fetch, 5, False) == {0: (0, -1), 1: (0, -1)}
    p.commit_transaction(30)
    assert trio.run(fetch, 7, True) == {0: (0, 7), 1: (0, -1)}
    meta.close()


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


def test_kafka_python_transactional_producer_commit_and_abort(broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    topic = "txn-kp"
    ck_create_topic(broker.bootstrap, topic, 1)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-1")
    p.init_transactions()
    p.begin_transaction()
    for i in range(5):
        p.send(topic, f"kp-c{i}".encode(), partition=0)
    p.commit_transaction()
    p.begin_transaction()
    for i in range(3):
        p.send(topic, f"kp-a{i}".encode(), partition=0)
    p.flush()
    p.abort_transaction()
    p.close()
    for isolation, want in (("read_committed", [f"kp-c{i}" for i in range(5)]),
                            ("read_uncommitted", [f"kp-c{i}" for i in range(5)] + [f"kp-a{i}" for i in range(3)])):
        c = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level=isolation,
                          auto_offset_reset="earliest", enable_auto_commit=False, consumer_timeout_ms=3000)
        c.assign([KTP(topic, 0)])
        c.seek(KTP(topic, 0), 0)
        assert [m.value.decode() for m in c] == want, isolation
        c.close()


def test_aiokafka_transactional_producer_commit_and_abort(broker):
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = "txn-aio"
    ck_create_topic(broker.bootstrap, topic, 1)

    async def main() -> tuple[list[bytes], list[bytes]]:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-1")
        await p.start()
        try:
            async with p.transaction():
                for i in range(4):
                    await p.send(topic, f"aio-c{i}".encode(), partition=0)
            await p.begin_transaction()
            for i in range(2):
                await p.send(topic, f"aio-a{i}".encode(), partition=0)
            await p.abort_transaction()
        finally:
            await p.stop()
        out = []
        for isolation in ("read_committed", "read_uncommitted"):
            c = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, isolation_level=isolation,
                                 auto_offset_reset="earliest", enable_auto_commit=False)
            await c.start()
            try:
                got: list[bytes] = []
                while True:
                    batch = await c.getmany(timeout_ms=2000)
                    if not batch:
                        break
                    got += [m.value for ms in batch.values() for m in ms]
            finally:
                await c.stop()
            out.append(got)
        return out[0], out[1]

    committed, uncommitted = asyncio.run(main())
    assert committed == [f"aio-c{i}".encode() for i in range(4)]
    assert uncommitted == [f"aio-c{i}".encode() for i in range(4)] + [f"aio-a{i}".encode() for i in range(2)]


def test_our_consumer_reads_committed_only(broker):
    """The project's trio consumer (mirror sources) with isolation.level=read_committed."""
    import trio

    from cluster.client.consumer import Consumer as TrioConsumer

    topic = "txn-ours"
    ck_create_topic(broker.bootstrap, topic, 1)
    p = txn_producer(broker.bootstrap, "ours-1")
    for n, commit in ((3, True), (4, False), (2, True)):
        p.begin_transaction()
        for i in range(n):
            p.produce(topic, value=f"{'c' if commit else 'a'}{i}".encode(), partition=0)
        p.commit_transaction(30) if commit else (p.flush(10), p.abort_transaction(30))

    async def read(isolation: str) -> tuple[list[bytes], int | None]:
        async with TrioConsumer({"bootstrap.servers": broker.bootstrap, "isolation.level": isolation,
                                 "group.id": f"g-{isolation}", "enable.auto.commit": False,
                                 "auto.offset.reset": "earliest"}) as c:
            c.assign([(topic, 0)])
            got: list[bytes] = []
            with trio.move_on_after(8):
                while True:
                    batch = await c.getmany(timeout_s=1.0)
                    got += [r.value for rs in batch.values() for r in rs]
                    if c.position((topic, 0)) == 12:  # 9 records and 3 markers
                        break
            return got, c.position((topic, 0))

    committed, position = trio.run(read, "read_committed")
    assert committed == [b"c0", b"c1", b"c2", b"c0", b"c1"]
    assert position == 12  # past the last marker
    uncommitted, _ = trio.run(read, "read_uncommitted")
    assert len(uncommitted) == 9


def test_transactions_cli_lists_describes_and_aborts(broker):
    import subprocess
    import sys

    topic = "txn-cli"
    ck_create_topic(broker.bootstrap, topic, 1)
    p = txn_producer(broker.bootstrap, "cli-1")
    p.begin_transaction()
    p.produce(topic, value=b"stuck", partition=0)
    p.flush(10)

    def cli(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "deploy.cli", "transactions", *args, "--bootstrap",
                              broker.bootstrap], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert "cli-1" in cli("list") and "Ongoing" in cli("list")
    described = cli("describe", "--transactional-id", "cli-1")
    assert "Ongoing" in described and f"{topic}-0" in described
    assert "aborted" in cli("abort", "--transactional-id", "cli-1")
    # Aborted, then re-initialized under a bumped epoch (as a new producer instance would):
    # idle. (describe of an idle id: kio cannot read the -1 start time Kafka sends.)
    assert "Ongoing" not in cli("list") and "Empty" in cli("list")
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(10)
    assert [v for _, _, v in read_all(broker.bootstrap, topic, 1, "read_committed", expect=1)] == [b"after"]
    with pytest.raises(KafkaException):
        p.commit_transaction(10)  # fenced


@pytest.mark.parametrize("how", ["kill-9", "clean"])
def test_open_transaction_survives_a_broker_restart(broker, how):
    """An open transaction across a restart (kill -9: recovery replays the log; clean: the
    producer snapshot): read_committed stays behind it, the coordinator still knows it, and
    committing it afterwards makes it visible — in order, once."""
    topic = "txn-restart"
    ck_create_topic(broker.bootstrap, topic, 1)
    p = txn_producer(broker.bootstrap, "restart-1")
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=f"t{i}".encode(), partition=0)
    p.flush(10)
    if how == "kill-9":
        broker.kill9()
        broker.start()
    else:
        broker.restart()
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(30)
    assert read_all(broker.bootstrap, topic, 1, "read_committed", idle_s=2) == []
    p.commit_transaction(60)
    got = [v for _, _, v in read_all(broker.bootstrap, topic, 1, "read_committed", expect=6)]
    assert got == [f"t{i}".encode() for i in range(5)] + [b"after"]
