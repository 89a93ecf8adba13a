"""Our trio producer (cluster/client/producer.py) against a real broker process, read back
by real clients (confluent-kafka, kafka-python): every codec, acks 0/1/all, the key
partitioner against librdkafka's, delivery callbacks and futures, errors and buffer.memory.

Every check is exact: each record is found at the (partition, offset) its RecordMetadata
reported, with its key, value, headers (in order, duplicates and null values kept) and
timestamp; offsets are contiguous from 0 in produce order per partition.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

import pytest
import trio
import trio.testing
from confluent_kafka import Producer as CkProducer

from cluster.client.config import InvalidConfig, producer_config
from cluster.client.connection import KafkaConnectionError
from cluster.client.errors import KafkaError, KafkaTimeoutError
from cluster.client.metadata import ClientCluster
from cluster.client.producer import BufferFull, DeliveryFuture, Producer, RecordMetadata
from cluster.protocol.api_keys import ApiKey
from cluster.protocol.errors import ErrorCode
from tests.harness import BrokerProcess, free_port
from tests.interop.clients import ck_consume, ck_create_topic, kp_consume
from tests.interop.common import BASE_TS_MS, CODECS, Got, Rec, assert_disk_codec

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
PARTITIONS = 4


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole module (every test writes its own topics): a broker per test
    would double the module's runtime."""
    proc = BrokerProcess(tmp_path_factory.mktemp("client-producer") / "broker").start()
    yield proc
    proc.stop()


def run(main: Callable[[], Awaitable[T]], timeout_s: float = 60.0) -> T:
    """trio.run with an overall bound, so a hung producer fails the test instead of the timeout plugin."""
    async def bounded() -> T:
        with trio.fail_after(timeout_s):
            return await main()
    return trio.run(bounded)


def shaped_records(n: int, tag: str) -> list[Rec]:
    """Records of every shape the protocol allows, in a fixed order: null and empty keys,
    null and empty values, no headers / several / repeated names / null and empty values /
    non-ASCII names, timestamps that sometimes step back inside a batch, a few 20 KB values
    (batches of different sizes). Values are compressible text plus a little noise."""
    recs = []
    for i in range(n):
        key: bytes | None = f"user-{i % 37:02d}".encode()
        if i % 9 == 4:
            key = None  # sticky partition
        elif i % 50 == 17:
            key = b""  # hashed like any key, not null
        value: bytes | None
        if i % 61 == 60:
            value = None
        elif i % 43 == 21:
            value = b""
        elif i % 250 == 125:
            value = f"{tag} big {i:05d} ".encode() * 1000
        else:
            value = f"{tag} record {i:05d} ".encode() * (1 + i % 5) + random.Random(i).randbytes(i % 23)
        headers: list[tuple[str, bytes | None]] = []
        if i % 4:
            headers.append(("idx", str(i).encode()))
        if i % 3 == 0:
            headers += [("dup", b"first"), ("dup", b"second"), ("dup", b"")]
        if i % 5 == 0:
            headers.append(("null", None))
        if i % 7 == 0:
            headers.append(("ключ", "значение".encode()))
        ts = BASE_TS_MS + i * 10 - (35 if i % 13 == 0 and i else 0)
        recs.append(Rec(None, key, value, tuple(headers), ts))
    return recs


async def send_all(p: Producer, topic: str, recs: Sequence[Rec]) -> list[RecordMetadata]:
    """send() every record in order, flush, and return each one's RecordMetadata."""
    futures = [await p.send(topic, r.value, r.key, partition=r.partition, timestamp_ms=r.timestamp_ms,
                            headers=list(r.headers)) for r in recs]
    await p.flush()
    return [await f.wait() for f in futures]


def partition_counts(metas: Sequence[RecordMetadata]) -> dict[int, int]:
    counts = Counter(m.partition for m in metas)
    return {p: counts.get(p, 0) for p in range(PARTITIONS)}


def assert_offsets_in_produce_order(metas: Sequence[RecordMetadata], topic: str) -> None:
    """Per partition, the reported offsets are 0, 1, 2, ... in produce order."""
    by_p: dict[int, list[int]] = defaultdict(list)
    for m in metas:
        assert m.topic == topic, m
        by_p[m.partition].append(m.offset)
    for p, offsets in by_p.items():
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets in produce order {offsets[:20]}..."


def assert_read_back(recs: Sequence[Rec], metas: Sequence[RecordMetadata], got: Sequence[Got], who: str) -> None:
    """`got` holds exactly the produced records, each at the position its RecordMetadata named."""
    expected = {(m.partition, m.offset): (i, r) for i, (r, m) in enumerate(zip(recs, metas, strict=True))}
    assert len(expected) == len(recs), "two records reported at the same (partition, offset)"
    by_pos = {(g.partition, g.offset): g for g in got}
    assert len(by_pos) == len(got), f"{who}: a (partition, offset) was read twice"
    assert set(by_pos) == set(expected), (
        f"{who}: read {len(got)} records, expected {len(recs)}; missing {sorted(set(expected) - set(by_pos))[:5]}, "
        f"unexpected {sorted(set(by_pos) - set(expected))[:5]}")
    for pos, (i, r) in sorted(expected.items()):
        g = by_pos[pos]
        have = (g.key, g.value, g.headers, g.timestamp_ms, g.create_time)
        want = (r.key, r.value, r.headers, r.timestamp_ms, True)
        assert have == want, f"{who}: record #{i} at {pos}:\n  expected {want!r:.500}\n  got      {have!r:.500}"


# ---------------------------------------------------------------------------- codecs


@pytest.mark.parametrize("codec", CODECS)
def test_every_shape_of_record_read_back_by_librdkafka_and_kafka_python(broker: BrokerProcess, codec: str) -> None:
    topic = f"ours-{codec}"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    recs = shaped_records(1500, codec)

    async def main() -> list[RecordMetadata]:
        # batch.size 16 KiB: many batches per partition, several in flight at once.
        async with Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec,
                             "linger.ms": 5, "batch.size": 16384}) as p:
            return await send_all(p, topic, recs)

    metas = run(main)
    assert_offsets_in_produce_order(metas, topic)
    assert [m.timestamp for m in metas] == [r.timestamp_ms for r in recs]
    counts = partition_counts(metas)
    assert all(counts.values()), counts
    assert_read_back(recs, metas, ck_consume(broker.bootstrap, topic, counts, timeout_s=20), "confluent-kafka")
    assert_read_back(recs, metas, kp_consume(broker.bootstrap, topic, counts, timeout_s=20), "kafka-python")
    assert_disk_codec(broker.data_dir, topic, PARTITIONS, codec)


# ---------------------------------------------------------------------------- acks


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_acks_exact_counts_and_order_per_partition(broker: BrokerProcess, acks: str) -> None:
    topic = f"acks-{acks}"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    n = 4000
    recs = [Rec(i % PARTITIONS, None, f"{i}".encode(), (), BASE_TS_MS + i) for i in range(n)]
    config = {"bootstrap.servers": broker.bootstrap, "acks": acks, "linger.ms": 2, "batch.size": 4096}
    if acks != "all":
        config["enable.idempotence"] = False

    async def main() -> list[RecordMetadata]:
        async with Producer(config) as p:
            return await send_all(p, topic, recs)

    metas = run(main)
    assert [m.partition for m in metas] == [r.partition for r in recs]
    if acks == "0":
        assert {m.offset for m in metas} == {-1}, "acks=0: the broker says nothing, so no offsets"
    else:
        assert_offsets_in_produce_order(metas, topic)
    counts = {p: n // PARTITIONS for p in range(PARTITIONS)}
    got = ck_consume(broker.bootstrap, topic, counts, timeout_s=20)
    by_p: dict[int, list[tuple[int, bytes | None]]] = defaultdict(list)
    for g in got:
        by_p[g.partition].append((g.offset, g.value))
    for p in range(PARTITIONS):
        want = [(k, f"{i}".encode()) for k, i in enumerate(range(p, n, PARTITIONS))]
        assert by_p[p] == want, f"partition {p}: {len(by_p[p])} records, first differences " \
                                f"{[(a, b) for a, b in zip(by_p[p], want, strict=False) if a != b][:3]}"


# ---------------------------------------------------------------------------- partitioner


def test_ten_thousand_keys_land_where_librdkafka_murmur2_random_puts_them(broker: BrokerProcess) -> None:
    partitions = 12
    ck_create_topic(broker.bootstrap, "keys-ours", partitions)
    ck_create_topic(broker.bootstrap, "keys-librdkafka", partitions)
    rng = random.Random(20261121)
    keys = [b""]
    seen = {b""}
    while len(keys) < 10_000:
        key = rng.randbytes(rng.randrange(1, 40)) if len(keys) % 2 else f"order-{rng.randrange(10**9)}".encode()
        if key not in seen:
            seen.add(key)
            keys.append(key)

    ours: dict[bytes, int] = {}
    errors: list[Exception] = []

    def placed(key: bytes, md: RecordMetadata | None, err: Exception | None) -> None:
        if err is not None:
            errors.append(err)
        else:
            assert md is not None
            ours[key] = md.partition

    async def main() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20}) as p:
            for key in keys:  # produce() before the topic's metadata is known: held, then partitioned
                p.produce("keys-ours", b"v", key=key, on_delivery=functools.partial(placed, key))

    run(main)
    assert not errors, errors[:5]

    theirs: dict[bytes, int] = {}

    def delivered(err: object, msg: Any) -> None:
        assert err is None, err
        theirs[msg.key()] = msg.partition()

    ck = CkProducer({"bootstrap.servers": broker.bootstrap, "partitioner": "murmur2_random", "linger.ms": 20})
    for key in keys:
        ck.produce("keys-librdkafka", key=key, value=b"v", on_delivery=delivered)
        ck.poll(0)
    assert ck.flush(30) == 0
    assert len(ours) == len(theirs) == len(keys)
    differ = [(k, ours[k], theirs[k]) for k in keys if ours[k] != theirs[k]]
    assert not differ, f"{len(differ)} keys placed differently (key, ours, librdkafka), e.g. {differ[:5]}"
    assert len(set(ours.values())) == partitions
    # And the records really are where the delivery reports said.
    counts = Counter(ours.values())
    got = ck_consume(broker.bootstrap, "keys-ours", {p: counts[p] for p in range(partitions)}, timeout_s=20)
    assert len(got) == len(keys)
    assert {g.key: g.partition for g in got} == ours


# ---------------------------------------------------------------------------- delivery reports


def test_every_record_gets_exactly_one_delivery_report_with_its_real_offset(broker: BrokerProcess) -> None:
    """on_delivery callbacks, DeliveryFuture waiters given to produce(), and send() futures:
    one report per record, no errors, the offset it is read back at, and per partition the
    callbacks run in offset order (Kafka's guarantee for callbacks of one partition)."""
    topic = "reports"
    ck_create_topic(broker.bootstrap, topic, PARTITIONS)
    n = 6000
    reports: dict[int, list[tuple[RecordMetadata | None, Exception | None]]] = defaultdict(list)
    callback_order: dict[int, list[int]] = defaultdict(list)
    futures: dict[int, DeliveryFuture] = {}

    def report(i: int) -> Callable[[RecordMetadata | None, Exception | None], None]:
        def cb(md: RecordMetadata | None, err: Exception | None) -> None:
            reports[i].append((md, err))
            if md is not None:
                callback_order[md.partition].append(md.offset)
        return cb

    async def main() -> None:
        # Small batches and no linger: many produce requests in flight per partition.
        async with Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "batch.size": 2048}) as p:
            futures[0] = await p.send(topic, b"0", key=b"k0")  # the topic's metadata is known from here on
            for i in range(1, n):
                key, value = f"k{i % 97}".encode(), f"{i}".encode()
                if i % 3 == 0:
                    futures[i] = await p.send(topic, value, key)
                elif i % 3 == 1:
                    p.produce(topic, value, key, on_delivery=report(i))
                else:
                    futures[i] = DeliveryFuture()
                    p.produce(topic, value, key, on_delivery=futures[i])
                if i % 200 == 0:
                    await trio.sleep(0)
            await p.flush()
            for i, f in futures.items():
                assert f.done, f"record {i}: future not resolved after flush"
                reports[i].append((f.metadata, f.error))

    run(main)
    assert sorted(reports) == list(range(n)), f"{n - len(reports)} records got no report"
    twice = [i for i, rs in reports.items() if len(rs) != 1]
    assert not twice, f"records reported more than once: {twice[:10]}"
    errors = [(i, rs[0][1]) for i, rs in reports.items() if rs[0][1] is not None]
    assert not errors, errors[:5]
    reported = {i: (rs[0][0].partition, rs[0][0].offset) for i, rs in reports.items() if rs[0][0] is not None}
    counts = Counter(p for p, _ in reported.values())
    got = ck_consume(broker.bootstrap, topic, {p: counts[p] for p in range(PARTITIONS)}, timeout_s=20)
    actual = {int(g.value or b"-1"): (g.partition, g.offset) for g in got}
    assert len(got) == n and actual == reported
    for p, offsets in callback_order.items():
        assert offsets == sorted(offsets), f"partition {p}: callbacks ran out of offset order"


def test_records_produced_before_metadata_keep_their_order(broker: BrokerProcess) -> None:
    """produce() before the topic's metadata is known holds the records; a send() of the
    same key right after must still land behind them (one key, one partition, produce order)."""
    topic = "held-order"
    ck_create_topic(broker.bootstrap, topic, 1)

    async def main() -> list[RecordMetadata]:
        async with Producer({"bootstrap.servers": broker.bootstrap}) as p:
            first = [DeliveryFuture(), DeliveryFuture()]
            p.produce(topic, b"0", key=b"k", on_delivery=first[0])
            p.produce(topic, b"1", key=b"k", on_delivery=first[1])
            third = await p.send(topic, b"2", key=b"k")
            await p.flush()
            return [await f.wait() for f in (*first, third)]

    metas = run(main)
    got = ck_consume(broker.bootstrap, topic, {0: 3}, timeout_s=10)
    assert [g.value for g in got] == [b"0", b"1", b"2"]
    assert [m.offset for m in metas] == [0, 1, 2]


# ---------------------------------------------------------------------------- metadata while records wait


class MetadataGate:
    """Sees every Metadata request a client's ClientCluster sends (`asked`: the topics each
    named, None for all) and each refresh once its answer is applied (`applied`, `changed`);
    `hold()` keeps the next answer, once it is here (`held`), from being applied until the
    event it returns is set: a slow answer made deterministic."""

    def __init__(self, cluster: ClientCluster) -> None:
        self.cluster = cluster
        self.asked: list[list[str] | None] = []
        self.applied: list[list[str] | None] = []
        self.changed = trio.Event()
        self.held = trio.Event()  # set once a held answer has arrived
        self._hold: trio.Event | None = None
        real_any_connection, real_refresh = cluster.any_connection, cluster.refresh
        gate = self

        class Gated:
            def __init__(self, conn: Any) -> None:
                self._conn = conn

            def __getattr__(self, name: str) -> Any:
                return getattr(self._conn, name)

            async def request(self, api_key: int, body: Any, **kwargs: Any) -> Any:
                resp = await self._conn.request(api_key, body, **kwargs)
                if api_key == ApiKey.METADATA:
                    gate.asked.append(None if body["topics"] is None else [t["name"] for t in body["topics"]])
                    if gate._hold is not None:
                        release, gate._hold = gate._hold, None
                        gate.held.set()
                        await release.wait()
                return resp

        async def any_connection() -> Any:
            return Gated(await real_any_connection())

        async def refresh(topics: set[str] | None = None) -> Any:
            before = len(self.asked)
            meta = await real_refresh(topics)
            self.applied.append(self.asked[-1] if len(self.asked) > before else None)
            self.changed.set()
            self.changed = trio.Event()
            return meta

        cluster.any_connection = any_connection  # type: ignore[method-assign]
        cluster.refresh = refresh  # type: ignore[method-assign]

    def hold(self) -> trio.Event:
        """The next Metadata answer, once here, is applied only after the returned event is set."""
        self._hold = trio.Event()
        return self._hold

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait, refresh by refresh, until `condition()` holds (run() bounds the whole test)."""
        while not condition():
            await self.changed.wait()


def test_a_record_held_while_the_first_metadata_request_is_out_is_sent(broker: BrokerProcess) -> None:
    """The SyncProducer case (CI: a flush after `dcmirror up` timed out with "0 batches still
    unacknowledged"): the producer's first Metadata request goes out naming no topic; a record
    for an existing topic is produced before its answer arrives. The answer (without the
    topic) must not end the need for metadata: the topic is asked for next, the record sent."""
    topic = "held-during-refresh"
    ck_create_topic(broker.bootstrap, topic, 2)

    async def main() -> RecordMetadata:
        p = Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 60_000})
        gate = MetadataGate(p.cluster)
        release = gate.hold()
        async with p:
            await gate.held.wait()  # the first answer is here, not yet applied
            assert gate.asked == [[]], gate.asked
            future = DeliveryFuture()
            p.produce(topic, b"v", partition=1, on_delivery=future)
            release.set()
            await p.flush(20)
            assert any(names and topic in names for names in gate.asked), gate.asked
            return await future.wait()

    md = run(main)
    assert (md.topic, md.partition, md.offset) == (topic, 1, 0)


def test_a_record_for_a_topic_created_after_the_first_answer_is_sent(broker: BrokerProcess) -> None:
    """The first answer about the topic is UNKNOWN_TOPIC_OR_PARTITION (not created yet, or
    still being created): the producer asks again, with backoff, until the topic is there,
    not only when metadata.max.age.ms (5 minutes) has passed."""
    topic = "created-after-first-answer"

    async def main() -> RecordMetadata:
        p = Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 60_000})
        gate = MetadataGate(p.cluster)
        async with p:
            future = DeliveryFuture()
            p.produce(topic, b"v", partition=0, on_delivery=future)
            await gate.until(lambda: any(names and topic in names for names in gate.applied))
            info = p.cluster.metadata.topics.get(topic)
            assert info is not None and info.error_code == ErrorCode.unknown_topic_or_partition, info
            await trio.to_thread.run_sync(ck_create_topic, broker.bootstrap, topic, 1)
            await p.flush(20)
            return await future.wait()

    md = run(main)
    assert (md.topic, md.partition, md.offset) == (topic, 0, 0)


def test_a_flush_timeout_names_the_records_waiting_for_metadata(broker: BrokerProcess) -> None:
    """flush() also waits for records held for their topic's metadata: when it times out, it
    says how many per topic, for how long, and what the last Metadata answer said."""
    topic = "never-created"

    async def main() -> str:
        p = Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 60_000})
        gate = MetadataGate(p.cluster)
        async with p:
            for i in range(3):
                p.produce(topic, b"%d" % i, partition=0)
            await gate.until(lambda: any(names and topic in names for names in gate.applied))
            with pytest.raises(KafkaTimeoutError) as info:
                await p.flush(0.5)
            await p.close()
            return str(info.value)

    message = run(main)
    assert message.startswith("flush: 0 batches still unacknowledged after 0.5 s; 3 records wait for their "
                              "topic's metadata: 3 for 'never-created' for "), message
    assert "(last answered UNKNOWN_TOPIC_OR_PARTITION)" in message, message


def test_a_refresh_joining_one_in_flight_gets_its_own_topics(broker: BrokerProcess) -> None:
    """ClientCluster.refresh({t}) while another refresh is out that did not name t: it must
    not return that answer (without t) as its own; it asks for t after it."""
    topic = "joined-refresh"
    ck_create_topic(broker.bootstrap, topic, 3)

    async def main() -> None:
        cluster = ClientCluster(producer_config({"bootstrap.servers": broker.bootstrap}))
        gate = MetadataGate(cluster)
        release = gate.hold()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cluster.refresh)
                await gate.held.wait()  # the first request (no topics) is answered, not applied
                joined: list[int | None] = []

                async def join() -> None:
                    meta = await cluster.refresh({topic})
                    joined.append(meta.partition_count(topic))

                nursery.start_soon(join)
                await trio.testing.wait_all_tasks_blocked()
                release.set()
            assert joined == [3], (joined, gate.asked)
            assert gate.asked == [[], [topic]], gate.asked
        finally:
            await cluster.aclose()

    run(main)


# ---------------------------------------------------------------------------- errors


def test_send_to_a_missing_topic_times_out_after_max_block_ms(broker: BrokerProcess) -> None:
    async def main() -> tuple[Exception, float]:
        async with Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 2000}) as p:
            start = time.monotonic()
            with pytest.raises(KafkaTimeoutError) as info:
                await p.send("no-such-topic", b"v")
            return info.value, time.monotonic() - start

    error, elapsed_s = run(main)
    assert 1.9 <= elapsed_s < 3.0, elapsed_s
    assert "'no-such-topic'" in str(error), str(error)


def test_produce_to_a_missing_topic_reports_an_error_after_max_block_ms(broker: BrokerProcess) -> None:
    reports: list[tuple[float, RecordMetadata | None, Exception | None]] = []

    async def main() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 1500}) as p:
            start = time.monotonic()
            for i in range(3):
                p.produce("no-such-topic", b"%d" % i,
                          on_delivery=lambda md, err: reports.append((time.monotonic() - start, md, err)))

    run(main)
    assert len(reports) == 3
    for elapsed_s, md, err in reports:
        assert md is None and isinstance(err, KafkaError) and err.code == ErrorCode.unknown_topic_or_partition, err
        assert "'no-such-topic'" in str(err)
        assert 1.4 <= elapsed_s < 2.5, elapsed_s


def test_send_with_bootstrap_on_a_closed_port_fails_naming_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"

    async def main() -> tuple[Exception, float]:
        async with Producer({"bootstrap.servers": address, "max.block.ms": 2000}) as p:
            start = time.monotonic()
            with pytest.raises((KafkaTimeoutError, KafkaConnectionError)) as info:
                await p.send("t", b"v")
            return info.value, time.monotonic() - start

    error, elapsed_s = run(main, timeout_s=10)
    assert elapsed_s < 3.0, elapsed_s
    assert address in str(error), str(error)


@pytest.mark.parametrize("idempotence", [
    pytest.param(True),
    pytest.param(False),
], ids=["idempotent", "not-idempotent"])
def test_produce_with_bootstrap_on_a_closed_port_reports_the_address(idempotence: bool) -> None:
    """produce() never blocks, so an unreachable cluster must reach the caller through the
    delivery reports: within max.block.ms (held, keyless) and delivery.timeout.ms (explicit
    partition), naming the address."""
    address = f"127.0.0.1:{free_port()}"
    reports: dict[str, tuple[float, Exception | None]] = {}

    async def main() -> None:
        config = {"bootstrap.servers": address, "max.block.ms": 1000, "delivery.timeout.ms": 2000}
        if not idempotence:
            config |= {"enable.idempotence": False, "acks": "1"}
        async with Producer(config) as p:
            start = time.monotonic()
            p.produce("t", b"held", on_delivery=lambda md, err: reports.__setitem__("held", (time.monotonic() - start, err)))
            p.produce("t", b"p0", partition=0,
                      on_delivery=lambda md, err: reports.__setitem__("p0", (time.monotonic() - start, err)))
            with trio.move_on_after(3.5):
                await p.flush()
            # Checked inside the block: leaving it normally would flush again for delivery.timeout.ms.
            assert set(reports) == {"held", "p0"}, f"reports after 3.5 s: {reports}"
            for what, (elapsed_s, err) in reports.items():
                assert isinstance(err, KafkaTimeoutError | KafkaConnectionError), (what, err)
                assert address in str(err), (what, str(err))
                assert elapsed_s < 3.0, (what, elapsed_s)

    run(main, timeout_s=20)


def test_close_reports_records_still_waiting_for_metadata(broker: BrokerProcess) -> None:
    """Every record gets exactly one report, also when the producer closes while it still
    holds records waiting for their topic's metadata."""
    reports: list[tuple[RecordMetadata | None, Exception | None]] = []

    async def main() -> None:
        async with Producer({"bootstrap.servers": broker.bootstrap, "max.block.ms": 30_000}) as p:
            p.produce("no-such-topic", b"v", on_delivery=lambda md, err: reports.append((md, err)))
            await trio.sleep(0.2)
            await p.close()
            assert len(reports) == 1 and reports[0][0] is None and reports[0][1] is not None, reports

    run(main, timeout_s=10)


def test_a_value_larger_than_max_request_size_is_message_too_large(broker: BrokerProcess) -> None:
    ck_create_topic(broker.bootstrap, "large", 1)

    async def main() -> RecordMetadata:
        async with Producer({"bootstrap.servers": broker.bootstrap, "max.request.size": 100_000,
                             "batch.size": 16384}) as p:
            with pytest.raises(KafkaError) as info:
                fut = await p.send("large", b"x" * 100_001)
                await fut.wait()
            assert info.value.code == ErrorCode.message_too_large, info.value
            assert "max.request.size" in str(info.value)
            return await p.send_and_wait("large", b"small")  # the producer goes on working

    md = run(main)
    assert (md.partition, md.offset) == (0, 0)


@pytest.mark.parametrize("shape", ["key+value", "value+headers"])
def test_a_record_larger_than_max_request_size_is_message_too_large(broker: BrokerProcess, shape: str) -> None:
    topic = f"large-{shape.replace('+', '-')}"
    ck_create_topic(broker.bootstrap, topic, 1)
    key, headers = (b"k" * 60_000, []) if shape == "key+value" else (None, [("h", b"h" * 60_000)])

    async def main() -> Exception | RecordMetadata:
        async with Producer({"bootstrap.servers": broker.bootstrap, "max.request.size": 100_000,
                             "batch.size": 16384}) as p:
            try:
                return await p.send_and_wait(topic, b"v" * 60_000, key, headers=headers)
            except KafkaError as exc:
                return exc

    outcome = run(main)
    assert isinstance(outcome, KafkaError) and outcome.code == ErrorCode.message_too_large, (
        f"a {120_000}-byte record with max.request.size 100000: {outcome}")


def test_a_partition_the_topic_does_not_have_fails_at_once(broker: BrokerProcess) -> None:
    """A user error the producer can see from the metadata it has: fail now, naming the
    partition (Java's producer and librdkafka do), not after delivery.timeout.ms."""
    ck_create_topic(broker.bootstrap, "three", 3)

    async def main() -> tuple[BaseException | RecordMetadata, float]:
        async with Producer({"bootstrap.servers": broker.bootstrap, "delivery.timeout.ms": 3000}) as p:
            await p.send_and_wait("three", b"metadata known")
            start = time.monotonic()
            try:
                return await p.send_and_wait("three", b"v", partition=99), time.monotonic() - start
            except Exception as exc:  # whichever error, it must come at once
                return exc, time.monotonic() - start

    outcome, elapsed_s = run(main)
    assert isinstance(outcome, Exception) and "99" in str(outcome), outcome
    assert elapsed_s < 1.0, f"{elapsed_s:.1f} s: {outcome!r}"


@pytest.mark.parametrize(("config", "named"), [
    ({"linger.msec": 5}, ["'linger.msec'", "did you mean 'linger.ms'"]),
    ({"compresion.type": "zstd"}, ["'compresion.type'", "did you mean 'compression.type'"]),
    ({"bufer.memory": 1 << 20}, ["'bufer.memory'", "did you mean 'buffer.memory'"]),
    ({"compression.type": "brotli"}, ["compression.type", "brotli", "zstd"]),
    ({"linger.ms": "soon"}, ["linger.ms"]),
    ({"acks": "1"}, ["enable.idempotence", "acks=all"]),
])
def test_bad_config_is_refused_naming_the_key(config: dict[str, object], named: list[str]) -> None:
    with pytest.raises(InvalidConfig) as info:
        Producer({"bootstrap.servers": "127.0.0.1:9", **config})
    for words in named:
        assert words in str(info.value), str(info.value)


# ---------------------------------------------------------------------------- buffer.memory


def test_small_buffer_memory_produce_raises_buffer_full_and_send_waits(broker: BrokerProcess) -> None:
    topic = "small-buffer"
    ck_create_topic(broker.bootstrap, topic, 2)
    buffer_bytes = 64 * 1024
    value_bytes = 1000
    n_sent = 3000  # ~3 MB through a 64 KiB buffer

    async def main() -> tuple[int, list[RecordMetadata], list[RecordMetadata]]:
        async with Producer({"bootstrap.servers": broker.bootstrap, "buffer.memory": buffer_bytes,
                             "linger.ms": 5}) as p:
            await p.send_and_wait(topic, b"x" * value_bytes, partition=0)  # offset 0
            accepted: list[DeliveryFuture] = []
            with pytest.raises(BufferFull):
                for i in range(1000):  # produce() never waits: it fills the buffer, then refuses
                    accepted.append(DeliveryFuture())
                    p.produce(topic, b"p%04d" % i + b"x" * (value_bytes - 5), partition=0, on_delivery=accepted[-1])
            accepted.pop()  # the refused one
            await p.flush()
            first = [await f.wait() for f in accepted]
            futures = [await p.send(topic, b"s%04d" % i + b"x" * (value_bytes - 5), partition=i % 2)
                       for i in range(n_sent)]
            await p.flush()
            return len(accepted), first, [await f.wait() for f in futures]

    n_accepted, first, sent = run(main)
    # Refused only once the buffer really is (nearly) full.
    assert (n_accepted + 1) * (value_bytes + 100) > buffer_bytes >= n_accepted * value_bytes, n_accepted
    assert [(m.partition, m.offset) for m in first] == [(0, 1 + i) for i in range(n_accepted)]
    base = {0: 1 + n_accepted, 1: 0}
    want = []
    for i in range(n_sent):
        want.append((i % 2, base[i % 2]))
        base[i % 2] += 1
    assert [(m.partition, m.offset) for m in sent] == want
    got = ck_consume(broker.bootstrap, topic, {0: base[0], 1: base[1]}, timeout_s=20)
    values = {(g.partition, g.offset): g.value[:5] for g in got if g.value}
    assert len(got) == 1 + n_accepted + n_sent
    assert [values[(0, 1 + i)] for i in range(n_accepted)] == [b"p%04d" % i for i in range(n_accepted)]
    assert [values[pos] for pos in want] == [b"s%04d" % i for i in range(n_sent)]
