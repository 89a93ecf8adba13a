"""Our idempotent acks=all producer (cluster/client/producer.py) across leader failures: 3
brokers, RF 3, min.insync.replicas 2, unique sequential values (value i to partition i % 6)
while a seeded schedule kill -9's the leader of a partition and restarts it, once or twice.

Afterwards confluent-kafka reads every partition: exactly the values sent, each once, in
send order, every one at the offset its RecordMetadata reported (retries that the broker had
already written must come back as duplicates with their first offset, not as second copies).
A second test runs our group consumer through the same faults: it ends with every record of
the log and never skips ahead. Replay a schedule with DCMIRROR_FAULT_SEED=<the printed seed>.
"""

from __future__ import annotations

import functools
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import trio

from cluster.client.accumulator import BufferFull, RecordMetadata
from cluster.client.consumer import Consumer
from cluster.client.producer import Producer
from tests.cluster_helpers import (
    PartitionView,
    create_topic,
    fast_teardown,
    metadata,
    partitions_of,
    topic_ready,
    wait_until,
)
from tests.fault_workload import Acked, fault_rng, read_all, wait_fully_replicated
from tests.harness import ClusterProcesses

TOPIC = "client-ledger"
PARTITIONS = 6
RF = 3
MIN_RECORDS = 60_000
RATE_PER_S = 3000.0
AFTER_LAST_FAULT_RECORDS = 3000  # keep writing this long after the last restart: the new leaders get load too


@pytest.fixture
def clusters(cluster_factory: Callable[..., ClusterProcesses]) -> Iterator[Callable[..., ClusterProcesses]]:
    yield from fast_teardown(cluster_factory)


def leaders(cluster: ClusterProcesses) -> dict[int, PartitionView]:
    return partitions_of(metadata(cluster.bootstrap_of(*cluster.alive()), TOPIC), TOPIC)


class Writer:
    """Paced produce() of values 0, 1, 2, ... (value i to partition i % PARTITIONS); every
    delivery report is kept. Writes at least MIN_RECORDS and goes on until `stop_after` is set."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.sent = 0
        self.acked: list[Acked] = []
        self.errors: Counter[str] = Counter()
        self.reports = 0
        self.stop_after: int | None = None  # total to write, once the fault schedule is over
        self._progress = trio.Event()

    def _delivered(self, value: int, md: RecordMetadata | None, err: Exception | None) -> None:
        self.reports += 1
        if err is not None:
            self.errors[f"{type(err).__name__}: {err}"[:200]] += 1
        else:
            assert md is not None
            self.acked.append(Acked(md.partition, md.offset, value))
        self._progress.set()
        self._progress = trio.Event()

    async def wait_acked(self, count: int, timeout_s: float = 60.0) -> None:
        with trio.fail_after(timeout_s):
            while len(self.acked) < count:
                await self._progress.wait()

    async def run(self) -> None:
        start = trio.current_time()
        while self.stop_after is None or self.sent < max(self.stop_after, MIN_RECORDS):
            due = int((trio.current_time() - start) * RATE_PER_S)
            while self.sent < due:
                i = self.sent
                try:
                    self.producer.produce(TOPIC, str(i).encode(), partition=i % PARTITIONS,
                                          on_delivery=functools.partial(self._delivered, i))
                except BufferFull:
                    break  # the sender catches up; produce() never blocks
                self.sent += 1
            await trio.sleep(0.005)
        await self.producer.flush()


async def bounce_leaders(cluster: ClusterProcesses, writer: Writer, bounces: int,
                        rng: random.Random) -> None:
    """kill -9 the leader of a seeded partition, restart it after a seeded pause; between
    bounces wait for whole ISRs and fresh acknowledgements."""
    for bounce in range(bounces):
        await writer.wait_acked(len(writer.acked) + rng.randrange(3000, 8000))
        partition = rng.randrange(PARTITIONS)
        victim = (await trio.to_thread.run_sync(leaders, cluster))[partition].leader
        await trio.sleep(rng.uniform(0.0, 1.0))
        await trio.to_thread.run_sync(cluster[victim].kill9)
        print(f"bounce {bounce + 1}: kill -9 broker {victim} (leader of {TOPIC}-{partition}) "
              f"after {writer.sent} sent, {len(writer.acked)} acknowledged", flush=True)
        await trio.sleep(rng.uniform(0.5, 3.0))
        await trio.to_thread.run_sync(cluster[victim].restart)
        await trio.to_thread.run_sync(wait_fully_replicated, cluster, TOPIC, PARTITIONS, RF)
        print(f"bounce {bounce + 1}: broker {victim} back, ISRs whole; {writer.sent} sent, "
              f"{len(writer.acked)} acknowledged", flush=True)
    writer.stop_after = writer.sent + AFTER_LAST_FAULT_RECORDS


def check_exactly_once(cluster: ClusterProcesses, writer: Writer) -> None:
    """Every partition holds exactly its values in send order at offsets 0..n-1, each at the
    offset its delivery report named; diagnostics first so a failure says what kind it is."""
    data = read_all(cluster.bootstrap, TOPIC, PARTITIONS)
    seen = Counter(v for rows in data.values() for _, v in rows)
    at = {v: (p, off) for p, rows in data.items() for off, v in rows}
    duplicates = sorted(v for v, n in seen.items() if n > 1)
    lost = [a for a in writer.acked if a.value not in at]
    wrong_offset = [(a, at[a.value]) for a in writer.acked if a.value in at and at[a.value] != (a.partition, a.offset)]
    out_of_order = [(p, off) for p, rows in data.items()
                    for (off, v), (_, prev) in zip(rows[1:], rows, strict=False) if v <= prev]
    consumed = sum(seen.values())
    print(f"sent {writer.sent}, acknowledged {len(writer.acked)}, consumed {consumed}, delivery errors "
          f"{dict(writer.errors)}, producer metrics {writer.producer.metrics}", flush=True)
    problems = []
    if duplicates:
        problems.append(f"{len(duplicates)} values written twice, e.g. {duplicates[:5]}")
    if lost:
        problems.append(f"{len(lost)} acknowledged values lost, e.g. {lost[:5]}")
    if wrong_offset:
        problems.append(f"{len(wrong_offset)} values at another offset than reported, e.g. {wrong_offset[:5]}")
    if out_of_order:
        problems.append(f"{len(out_of_order)} values out of send order, e.g. {out_of_order[:5]}")
    if writer.errors or len(writer.acked) != writer.sent:
        problems.append(f"{writer.sent - len(writer.acked)} sends not acknowledged: {dict(writer.errors)}")
    assert not problems, "; ".join(problems)
    for p, rows in data.items():
        want = list(enumerate(range(p, writer.sent, PARTITIONS)))
        assert rows == want, f"partition {p}: {len(rows)} records, expected {len(want)} at offsets 0.."


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_idempotent_producer_writes_each_record_once_across_leader_kill9(
        clusters: Callable[..., ClusterProcesses]) -> None:
    rng = fault_rng("client idempotence")
    bounces = rng.choice([1, 2])
    cluster = clusters(3, min_insync_replicas=2)
    create_topic(cluster.bootstrap, TOPIC, PARTITIONS, RF)
    wait_until(lambda: topic_ready(cluster, TOPIC, PARTITIONS, RF), 30,
               f"{TOPIC}: {PARTITIONS} partitions, RF {RF}, full ISRs", cluster)
    started_s = time.monotonic()

    async def main() -> Writer:
        async with Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5, "request.timeout.ms": 10_000,
                             "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500}) as p:
            writer = Writer(p)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.run)
                await bounce_leaders(cluster, writer, bounces, rng)
            return writer

    async def bounded() -> Writer:
        with trio.fail_after(180):
            return await main()

    writer = trio.run(bounded)
    print(f"{bounces} bounce(s); writing took {time.monotonic() - started_s:.1f} s", flush=True)
    assert writer.reports == writer.sent, f"{writer.sent - writer.reports} records got no delivery report"
    wait_fully_replicated(cluster, TOPIC, PARTITIONS, RF)
    check_exactly_once(cluster, writer)


class Reader:
    """Our consumer in a group (auto commit) reading TOPIC while brokers die: every record's
    (partition, offset, value) in delivery order."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.got: dict[int, list[tuple[int, int]]] = {p: [] for p in range(PARTITIONS)}
        self.done = trio.Event()

    async def run(self, until: Callable[[], int | None]) -> None:
        async with Consumer({"bootstrap.servers": self.bootstrap, "group.id": "client-failover",
                             "auto.offset.reset": "earliest", "auto.commit.interval.ms": 1000,
                             "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                             "request.timeout.ms": 10_000, "socket.connection.setup.timeout.ms": 3000,
                             "reconnect.backoff.max.ms": 500, "metadata.max.age.ms": 2000}) as c:
            c.subscribe([TOPIC])
            while True:
                for (_, p), records in (await c.getmany(timeout_s=0.5)).items():
                    self.got[p].extend((r.offset, int(r.value or b"-1")) for r in records)
                total = until()
                if total is not None and len({(p, o) for p, rows in self.got.items() for o, _ in rows}) >= total:
                    return


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_consumer_group_reads_everything_across_leader_kill9(clusters: Callable[..., ClusterProcesses]) -> None:
    """Our group consumer reads while leaders (and so group coordinators) are killed: it ends
    with every record of the log, each with the log's value, and never skips ahead — a
    rewind after a coordinator change replays from the last commit, a gap would be loss."""
    rng = fault_rng("client consumer failover")
    cluster = clusters(3, min_insync_replicas=2)
    create_topic(cluster.bootstrap, TOPIC, PARTITIONS, RF)
    wait_until(lambda: topic_ready(cluster, TOPIC, PARTITIONS, RF), 30,
               f"{TOPIC}: {PARTITIONS} partitions, RF {RF}, full ISRs", cluster)

    async def main() -> tuple[Writer, Reader]:
        async with Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "request.timeout.ms": 10_000,
                             "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500}) as p:
            writer = Writer(p)
            reader = Reader(cluster.bootstrap)
            finished: list[int] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader.run, lambda: finished[0] if finished else None)

                async def write_then_mark() -> None:
                    await writer.run()
                    finished.append(writer.sent)

                nursery.start_soon(write_then_mark)
                await bounce_leaders(cluster, writer, 2, rng)
            return writer, reader

    async def bounded() -> tuple[Writer, Reader]:
        with trio.fail_after(200):
            return await main()

    writer, reader = trio.run(bounded)
    wait_fully_replicated(cluster, TOPIC, PARTITIONS, RF)
    check_exactly_once(cluster, writer)
    log = read_all(cluster.bootstrap, TOPIC, PARTITIONS)
    replayed = 0
    for p, rows in reader.got.items():
        assert dict(rows) == dict(log[p]), f"partition {p}: the consumer saw other records than the log holds"
        assert sorted(dict(rows)) == [o for o, _ in log[p]], f"partition {p}: records missing"
        for (prev, _), (off, _) in zip(rows, rows[1:], strict=False):
            assert off <= prev + 1, f"partition {p}: skipped from offset {prev} to {off}"
            replayed += off <= prev
    print(f"consumer: {sum(map(len, reader.got.values()))} records delivered, {replayed} rewinds", flush=True)


@pytest.mark.timeout(240)
def test_an_assigned_consumer_follows_a_dead_leader_to_the_next_one(
        clusters: Callable[..., ClusterProcesses]) -> None:
    """Our consumer with assign() (no group to rebalance it) and the default
    metadata.max.age.ms (5 min) reads a partition whose leader is killed -9 and stays dead:
    the records the next leader takes arrive as they are written. The regression: the fetcher
    of the dead broker refreshed the metadata itself, saw the new leader and ended, and no
    fetcher was started for the new leader until metadata.max.age.ms had passed."""
    cluster = clusters(3, min_insync_replicas=2)
    topic = "follow"
    create_topic(cluster.bootstrap, topic, 1, RF)
    wait_until(lambda: topic_ready(cluster, topic, 1, RF), 30, f"{topic}: RF {RF}, full ISR", cluster)

    async def main() -> tuple[int, list[int]]:
        got: list[int] = []
        async with Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5, "request.timeout.ms": 10_000,
                             "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500}) as p, \
                Consumer({"bootstrap.servers": cluster.bootstrap, "auto.offset.reset": "earliest",
                          "enable.auto.commit": False, "request.timeout.ms": 10_000,
                          "socket.connection.setup.timeout.ms": 3000, "reconnect.backoff.max.ms": 500}) as c:
            c.assign([(topic, 0)])

            async def read_until(count: int) -> None:
                while len(got) < count:
                    for records in (await c.getmany(timeout_s=0.5)).values():
                        got.extend(r.offset for r in records)

            for i in range(100):
                p.produce(topic, str(i).encode(), partition=0)
            await p.flush()
            with trio.fail_after(30):
                await read_until(100)
            victim = (await trio.to_thread.run_sync(leaders, cluster))[0].leader
            await trio.to_thread.run_sync(cluster[victim].kill9)
            for i in range(100, 200):
                p.produce(topic, str(i).encode(), partition=0)
            await p.flush()
            # The new leader took them; the consumer must follow well before metadata.max.age.ms.
            with trio.fail_after(60):
                await read_until(200)
            return victim, got

    victim, got = trio.run(main)
    print(f"leader {victim} killed; the consumer read {len(got)} records", flush=True)
    assert got == list(range(200)), f"offsets read: {got[:5]}..{got[-5:]} ({len(got)})"
