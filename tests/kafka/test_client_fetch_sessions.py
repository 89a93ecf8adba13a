"""dcmirror's consumer in incremental fetch sessions (KIP-227), against Apache Kafka 4.3.1 and
against a dcmirror broker, the same steps on both: the consumer (the mirror worker's) opens a
session with its first full fetch, then lists only partitions whose position moved — an idle
fetch lists none — forgets paused partitions and lists them again on resume, and after the
broker refuses its session (a wrong epoch, as after an eviction) opens a new one. Every record
is read exactly once, in order, whatever the session did."""

from __future__ import annotations

import pytest
import trio
from confluent_kafka import Producer

from cluster.client.admin import Admin
from cluster.client.consumer import Consumer

pytestmark = [pytest.mark.timeout(180), pytest.mark.heavy]  # a Kafka JVM

PARTITIONS = 60
TopicPartition = tuple[str, int]


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], tag: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for p, n in per_partition.items():
        for i in range(n):
            producer.produce(topic, value=f"{tag}-{p}-{i}".encode(), partition=p)
    assert producer.flush(60) == 0


async def read_exactly(c: Consumer, want: dict[TopicPartition, list[int]],
                       got_all: dict[TopicPartition, list[int]], timeout_s: float = 60) -> None:
    """getmany until every partition of `want` gave exactly those offsets, in order."""
    got: dict[TopicPartition, list[int]] = {}
    with trio.move_on_after(timeout_s):
        while any(len(got.get(tp, [])) < len(offs) for tp, offs in want.items()):
            for tp, recs in (await c.getmany(timeout_s=0.5)).items():
                got.setdefault(tp, []).extend(r.offset for r in recs)
    for tp, recs in (await c.getmany(timeout_s=0.3)).items():  # nothing more may come
        got.setdefault(tp, []).extend(r.offset for r in recs)
    for tp, offs in got.items():
        got_all.setdefault(tp, []).extend(offs)
    assert got == {tp: offs for tp, offs in want.items() if offs}, "records read other than exactly once"


async def answers(c: Consumer, count: int) -> None:
    """Until `count` more fetch answers came (bounded by progress, not time)."""
    fetches = c.metrics["fetches"]
    with trio.fail_after(60):
        while c.metrics["fetches"] < fetches + count:
            await c.getmany(timeout_s=0.05)


async def fetches_while(c: Consumer, count: int, what: str) -> tuple[int, int]:
    """(fetches, partitions listed) over `count` fetch answers, after the answers of the
    fetches already sent (one may list a position moved by the records just read)."""
    await answers(c, 2)
    fetches, listed = c.metrics["fetches"], c.metrics["fetch_partitions_listed"]
    await answers(c, count)
    return c.metrics["fetches"] - fetches, c.metrics["fetch_partitions_listed"] - listed


@pytest.mark.parametrize("broker", ["kafka", "dcmirror_broker"])
def test_consumer_fetch_session_lists_only_what_moved(broker: str, request: pytest.FixtureRequest) -> None:
    bootstrap = request.getfixturevalue(broker).bootstrap
    topic = f"sessions-{broker}"
    tps = [(topic, p) for p in range(PARTITIONS)]
    ends = dict.fromkeys(range(PARTITIONS), 0)
    got_all: dict[TopicPartition, list[int]] = {}

    def write(per_partition: dict[int, int], tag: str) -> dict[TopicPartition, list[int]]:
        produce(bootstrap, topic, per_partition, tag)
        want = {}
        for p, n in per_partition.items():
            want[(topic, p)] = list(range(ends[p], ends[p] + n))
            ends[p] += n
        return want

    async def main() -> None:
        async with Admin(bootstrap) as admin:
            await admin.create_topic(topic, PARTITIONS, 1)
        want = await trio.to_thread.run_sync(write, dict.fromkeys(range(PARTITIONS), 5), "a")
        async with Consumer({"bootstrap.servers": bootstrap, "fetch.max.wait.ms": 100,
                             "enable.auto.commit": False}) as c:
            c.assign(tps)
            for tp in tps:
                c.seek(tp, 0)
            await read_exactly(c, want, got_all)
            sessions = [s for s in c._sessions.values() if s.session_id]
            assert len(sessions) == 1, f"no fetch session opened: {c._sessions}"
            opened = sessions[0].session_id

            fetches, listed = await fetches_while(c, 10, "idle")
            print(f"{broker}: idle, {fetches} fetches listed {listed} partitions", flush=True)
            assert listed == 0, f"idle incremental fetches listed {listed} partitions"

            want = await trio.to_thread.run_sync(write, {7: 3}, "b")
            before = c.metrics["fetch_partitions_listed"], c.metrics["fetches"]
            await read_exactly(c, want, got_all)
            fetches, listed = await fetches_while(c, 3, "after")
            listed_total = c.metrics["fetch_partitions_listed"] - before[0]
            fetches_total = c.metrics["fetches"] - before[1]
            print(f"{broker}: one partition moved, {fetches_total} fetches listed {listed_total}", flush=True)
            assert listed_total <= fetches_total and listed == 0  # partition 7, once per new position

            paused = tps[:30]
            c.pause(*paused)
            want = await trio.to_thread.run_sync(write, dict.fromkeys(range(PARTITIONS), 2), "c")
            await read_exactly(c, {tp: offs for tp, offs in want.items() if tp not in paused}, got_all)
            await answers(c, 2)  # the fetch in flight at the pause still named them; the next forgets them
            assert not any(tp in got_all and got_all[tp][-1] >= 5 and tp[1] != 7 for tp in paused)
            assert sessions[0].sent.keys() == set(tps[30:]), "paused partitions were not forgotten"
            c.resume(*paused)
            await read_exactly(c, {tp: offs for tp, offs in want.items() if tp in paused}, got_all)
            assert sessions[0].session_id == opened, "the session was not kept"

            for s in c._sessions.values():
                s.next_epoch += 3  # as after an eviction: the broker refuses the session
            want = await trio.to_thread.run_sync(write, dict.fromkeys(range(PARTITIONS), 1), "d")
            await read_exactly(c, want, got_all)
            renewed = [s for s in c._sessions.values() if s.session_id]
            assert len(renewed) == 1 and renewed[0].session_id != opened, "no new session after the refusal"
            fetches, listed = await fetches_while(c, 5, "idle again")
            assert listed == 0
        assert got_all == {(topic, p): list(range(ends[p])) for p in range(PARTITIONS)}

    trio.run(main)
