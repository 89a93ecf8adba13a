"""Our trio consumer (cluster/client/consumer.py, group.py) against a real broker process,
next to real clients.

- records written by confluent-kafka and kafka-python under every codec are read back
  exactly (keys, values, headers, timestamps, offsets);
- a group mixing our consumer with a librdkafka one gets exactly the range / roundrobin
  split whichever member leads, and consumes every record once;
- two of ours split a topic; one leaves and the other resumes from the committed offsets;
- positions: seek, seek_to_beginning/end, seek_to_timestamp, auto.offset.reset, commits;
- failure: an unreachable bootstrap, a topic created after subscribe().

One broker (group.initial.rebalance.delay.ms=300) serves the whole module; every test
uses its own topics and groups. Every wait is bounded (trio.fail_after / deadlines) and
every check is exact.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import pytest
import trio

from cluster.client.admin import Admin
from cluster.client.consumer import Consumer, FetchedChunk, OffsetOutOfRange, TopicIdChanged
from cluster.client.group import FencedInstanceId
from cluster.client.producer import Producer
from cluster.protocol.records import Record
from tests.harness import BrokerProcess, free_port
from tests.interop.clients import ck_create_topic, ck_produce, kp_produce
from tests.interop.common import (
    BASE_TS_MS,
    CODECS,
    Got,
    Rec,
    assert_disk_codec,
    assert_exact,
    expected_counts,
    make_records,
    norm_headers,
    read_disk_batches,
)
from tests.interop.test_groups import (
    GROUP_OVERRIDES,
    HEARTBEAT_MS,
    SESSION_MS,
    CkGroup,
    assert_exactly_once,
    create_topic,
    end_offsets,
    produce,
)

pytestmark = pytest.mark.timeout(120)

TopicPartition = tuple[str, int]


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module (starting one per test would eat the time budget)."""
    overrides: dict[str, Any] = dict(GROUP_OVERRIDES)
    proc = BrokerProcess(tmp_path_factory.mktemp("client-consumer") / "broker", **overrides).start()
    yield proc
    proc.stop()


def ours_conf(bootstrap: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": SESSION_MS,
        "heartbeat.interval.ms": HEARTBEAT_MS,
        "fetch.max.wait.ms": 100,
    }
    conf.update(extra)
    return conf


def run(main: Callable[[], Awaitable[Any]], timeout_s: float = 60.0) -> Any:
    """trio.run with an overall bound, so a hang fails the test instead of the timeout plugin."""

    async def bounded() -> Any:
        with trio.fail_after(timeout_s):
            return await main()

    return trio.run(bounded)


async def poll_until(pred: Callable[[], object], timeout_s: float, what: str) -> float:
    """Wait (inside trio, so the consumers keep running) until pred(); return seconds taken."""
    start = trio.current_time()
    with trio.move_on_after(timeout_s):
        while not pred():
            await trio.sleep(0.02)
        return trio.current_time() - start
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def read_until(c: Consumer, want: Mapping[TopicPartition, int], timeout_s: float = 20.0,
                     extra_check_s: float = 0.3) -> dict[TopicPartition, list[Record]]:
    """getmany until every partition in `want` delivered that many records, then once more for
    `extra_check_s` to catch anything beyond (duplicates, records of other partitions)."""
    got: dict[TopicPartition, list[Record]] = {}
    with trio.move_on_after(timeout_s):
        while any(len(got.get(tp, [])) < n for tp, n in want.items()):
            for tp, recs in (await c.getmany(timeout_s=0.5)).items():
                got.setdefault(tp, []).extend(recs)
    if extra_check_s:
        for tp, recs in (await c.getmany(timeout_s=extra_check_s)).items():
            got.setdefault(tp, []).extend(recs)
    return got


def offsets(recs: list[Record]) -> list[int]:
    return [r.offset for r in recs]


def known_position(c: Consumer, tp: TopicPartition) -> int:
    position = c.position(tp)
    assert position is not None, f"no position for {tp}"
    return position


# ------------------------------------------------------------------ 1. other clients' records


N_INTEROP = 1000
P_INTEROP = 3


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("producer", ["confluent", "kafka-python"])
def test_records_from_other_clients_read_exactly(mbroker: BrokerProcess, producer: str, codec: str) -> None:
    """Null/empty keys and values, duplicate and null-valued headers, explicit (partly
    decreasing) timestamps: our consumer in assign mode reads every record exactly as written,
    at the offsets the producer's delivery reports gave. Every partition holds several
    batches, and a small max.partition.fetch.bytes makes the consumer take several fetches."""
    bs = mbroker.bootstrap
    topic = f"in-{producer}-{codec}"
    ck_create_topic(bs, topic, P_INTEROP)
    if producer == "confluent":
        recs = make_records(N_INTEROP, P_INTEROP, topic)
        delivered = ck_produce(bs, topic, recs, {"compression.type": codec}, flush_every=100)
    else:
        # kafka-python refuses null header values ("All headers items must be (str, bytes) tuples").
        recs = make_records(N_INTEROP, P_INTEROP, topic, null_header_values=False)
        delivered = kp_produce(bs, topic, recs, compression_type=None if codec == "none" else codec)
    assert_disk_codec(mbroker.data_dir, topic, P_INTEROP, codec)  # the batches really are compressed
    assert all(len(read_disk_batches(mbroker.data_dir, topic, p)) > 1 for p in range(P_INTEROP))
    counts = expected_counts(recs)

    async def main() -> list[Got]:
        async with Consumer(ours_conf(bs, **{"max.partition.fetch.bytes": 4096})) as c:
            c.assign([(topic, p) for p in range(P_INTEROP)])
            got = await read_until(c, {(topic, p): n for p, n in counts.items()})
            for p, n in counts.items():
                assert c.position((topic, p)) == n
                assert c.highwater((topic, p)) == n
        # Record carries no timestamp type; create_time=True is not checked by this test.
        return [Got(p, r.offset, r.key, r.value, norm_headers(r.headers), r.timestamp, True)
                for (_t, p), rs in got.items() for r in rs]

    got = run(main)
    assert_exact(recs, got, partitions=P_INTEROP, delivered=delivered)


# ------------------------------------------------------------------ 2. a mixed group


MIXED_PARTITIONS = 6
MIXED_N = 600

# Member ids are "<client.id>-<uuid>" and both assignors order members by member id. The
# CkGroup member's client.id is "<group>-c0", so ours sorts first with "<group>-a", last with
# "<group>-z". The leader (the first to join) is always the one sorting last, so a leader
# that favoured itself would show.
EXPECTED_SPLIT = {
    # (strategy, ours sorts first) -> (ours, confluent)
    ("range", True): ([0, 1, 2], [3, 4, 5]),
    ("range", False): ([3, 4, 5], [0, 1, 2]),
    ("roundrobin", True): ([0, 2, 4], [1, 3, 5]),
    ("roundrobin", False): ([1, 3, 5], [0, 2, 4]),
}


@pytest.mark.parametrize("leader", ["ours", "confluent"])
@pytest.mark.parametrize("strategy", ["range", "roundrobin"])
def test_mixed_group_with_confluent(mbroker: BrokerProcess, strategy: str, leader: str) -> None:
    """One of ours and one librdkafka consumer (a thread), both `strategy`, on a 6-partition
    topic holding 600 known records. The first to join leads; the leader sorts last. Neither
    consumes before the group has settled (ours does not poll, the librdkafka one pauses its
    partitions), then each commits every batch: the split is exactly the assignor's, every
    record is consumed once, and the group's committed offsets end at the log ends."""
    bs = mbroker.bootstrap
    topic = group = f"mixed-{strategy}-{leader}"
    create_topic(bs, topic, MIXED_PARTITIONS)
    delivered = produce(bs, topic, MIXED_N, MIXED_PARTITIONS, topic)
    ours_first_in_order = leader == "confluent"
    want_ours, want_ck = EXPECTED_SPLIT[(strategy, ours_first_in_order)]
    ck = CkGroup(bs, topic, group, 1, **{"partition.assignment.strategy": strategy})
    all_tps = {(topic, p) for p in range(MIXED_PARTITIONS)}
    got_ours: list[tuple[int, int, Any]] = []
    leader_flag: list[bool] = []

    def ck_latest() -> list[int] | None:
        return ck.latest_assignments()[0]

    async def main() -> None:
        conf = ours_conf(bs, **{"group.id": group, "partition.assignment.strategy": strategy,
                                "client.id": f"{group}-{'a' if ours_first_in_order else 'z'}"})
        async with Consumer(conf) as c:
            try:
                if leader == "ours":
                    c.subscribe([topic])
                    await poll_until(lambda: c.assignment() == all_tps and c.group.stable.is_set(), 20,
                                     f"ours alone holding all partitions (has {c.assignment()})")
                    ck.start()
                else:
                    ck.start()
                    await poll_until(lambda: ck_latest() == list(range(MIXED_PARTITIONS)), 20,
                                     f"confluent alone holding all partitions (has {ck_latest()})")
                    c.subscribe([topic])

                def settled() -> bool:
                    mine = sorted(p for _, p in c.assignment())
                    theirs = ck_latest()
                    return (c.group.stable.is_set() and bool(mine) and bool(theirs) and theirs is not None
                            and not set(mine) & set(theirs)
                            and sorted(mine + theirs) == list(range(MIXED_PARTITIONS)))

                await poll_until(settled, 30, f"a split of the partitions (ours {sorted(c.assignment())}, "
                                              f"confluent {ck_latest()})")
                leader_flag.append(c.group.leader)
                ck.release()
                tps = sorted(all_tps)
                ends = end_offsets(delivered, MIXED_PARTITIONS)

                async def all_committed() -> bool:
                    committed = await c.committed(tps)
                    return all(committed[(topic, p)] == ends[p] for p in range(MIXED_PARTITIONS))

                with trio.move_on_after(30):
                    while len(got_ours) + ck.consumed() < MIXED_N or not await all_committed():
                        batches = await c.getmany(timeout_s=0.2)
                        for (_t, p), recs in batches.items():
                            got_ours.extend((p, r.offset, r.value) for r in recs)
                        if batches:
                            await c.commit({tp: recs[-1].offset + 1 for tp, recs in batches.items()})
                assert await all_committed(), f"committed {await c.committed(tps)}, log ends {ends}"
                assert sorted(p for _, p in c.assignment()) == want_ours
            finally:
                if any(t.is_alive() for t in ck.threads):
                    await trio.to_thread.run_sync(ck.finish)

    run(main, 90)
    ck.assert_clean()
    member = ck.members[0]
    assert leader_flag == [leader == "ours"], "the first member to join should lead the group"
    assert member.assigns[-1] == want_ck, f"confluent assignments {member.assigns}, wanted {want_ck} last"
    assert {p for p, _, _ in got_ours} == set(want_ours)
    assert {p for p, _, _ in member.got} == set(want_ck)
    assert_exactly_once(got_ours + member.got, delivered)


# ------------------------------------------------------------------ 3. two of ours, one leaves


@pytest.mark.parametrize("auto_commit", [False, True], ids=["explicit-commits", "auto-commit"])
def test_two_consumers_split_then_one_leaves(mbroker: BrokerProcess, auto_commit: bool) -> None:
    """Two of ours split 4 partitions (range: a 0-1, b 2-3). Each consumes part of its share,
    committing every batch; `a` also takes one batch it does not commit (the tail), then
    closes (LeaveGroup). `b` takes over all 4 partitions and resumes each exactly at its
    committed offset: the only records seen twice are a's uncommitted tail (none with
    enable.auto.commit, where leaving commits the position first), and none is lost."""
    bs = mbroker.bootstrap
    topic = group = f"pair-{'auto' if auto_commit else 'explicit'}"
    partitions, n = 4, 400
    create_topic(bs, topic, partitions)
    delivered: dict[tuple[int, int], bytes] = {}
    for round_ in range(4):  # one batch of 25 per partition per round: chunks of 25 to consume
        delivered |= produce(bs, topic, n // 4, partitions, f"{topic}-r{round_}")
    all_tps = {(topic, p) for p in range(partitions)}
    seen: list[tuple[int, int, Any]] = []  # everything either consumer got, in order
    tail: list[tuple[int, int]] = []
    resumed_at: dict[int, int] = {}
    expected_resume: dict[int, int] = {}
    close_s: list[float] = []

    async def take(c: Consumer, batches: dict[TopicPartition, list[Record]], commit: bool) -> None:
        for (_t, p), recs in batches.items():
            seen.extend((p, r.offset, r.value) for r in recs)
        if commit and batches:
            await c.commit({tp: recs[-1].offset + 1 for tp, recs in batches.items()})

    async def consume_some(c: Consumer, at_least: int) -> None:
        """Small batches, each committed, until every assigned partition gave `at_least`."""
        count: Counter[TopicPartition] = Counter()
        while any(count[tp] < at_least for tp in c.assignment()):
            batches = await c.getmany(timeout_s=1.0, max_records=15)
            count.update({tp: len(recs) for tp, recs in batches.items()})
            await take(c, batches, commit=True)

    async def main() -> None:
        conf = ours_conf(bs, **{"group.id": group, "partition.assignment.strategy": "range",
                                "enable.auto.commit": auto_commit})
        async with Consumer({**conf, "client.id": f"{group}-b"}) as b:
            async with Consumer({**conf, "client.id": f"{group}-a"}) as a:
                a.subscribe([topic])
                await poll_until(lambda: a.assignment() == all_tps, 20, "a alone holding all partitions")
                b.subscribe([topic])
                await poll_until(lambda: a.group.stable.is_set() and b.group.stable.is_set()
                                 and a.assignment() | b.assignment() == all_tps and a.assignment()
                                 and b.assignment() and not a.assignment() & b.assignment(), 30,
                                 f"a split (a {sorted(a.assignment())}, b {sorted(b.assignment())})")
                assert sorted(a.assignment()) == [(topic, 0), (topic, 1)]
                assert sorted(b.assignment()) == [(topic, 2), (topic, 3)]
                await consume_some(a, 30)
                await consume_some(b, 30)
                a_positions = {p: known_position(a, (topic, p)) for p in (0, 1)}
                a_committed = await a.committed([(topic, 0), (topic, 1)])
                assert {p: a_committed[(topic, p)] for p in (0, 1)} == a_positions
                batch = await a.getmany(timeout_s=5.0, max_records=7)
                assert sum(len(v) for v in batch.values()) == 7
                await take(a, batch, commit=False)
                tail.extend((p, r.offset) for (_t, p), recs in batch.items() for r in recs)
                for p in (0, 1):
                    expected_resume[p] = known_position(a, (topic, p)) if auto_commit else a_positions[p]
                for p in (2, 3):
                    expected_resume[p] = known_position(b, (topic, p))
                started = time.monotonic()
            close_s.append(time.monotonic() - started)
            await poll_until(lambda: b.assignment() == all_tps and b.group.stable.is_set(), 20,
                             f"b taking over all partitions (has {sorted(b.assignment())})")
            committed = await b.committed(sorted(all_tps))
            assert {p: committed[(topic, p)] for p in range(partitions)} == expected_resume
            ends = end_offsets(delivered, partitions)
            want = {(topic, p): ends[p] - expected_resume[p] for p in range(partitions)}
            got = await read_until(b, want)
            for (_t, p), recs in got.items():
                assert offsets(recs) == list(range(expected_resume[p], ends[p])), f"partition {p}"
                resumed_at[p] = recs[0].offset
                seen.extend((p, r.offset, r.value) for r in recs)

    run(main, 60)
    assert close_s[0] < 5.0, f"close() took {close_s[0]:.1f}s"
    counts = Counter((p, o) for p, o, _ in seen)
    twice = sorted(k for k, v in counts.items() if v > 1)
    assert all(v <= 2 for v in counts.values())
    assert twice == ([] if auto_commit else sorted(tail)), f"seen twice {twice}, uncommitted tail {sorted(tail)}"
    assert set(counts) == set(delivered), "records lost"
    assert all(delivered[(p, o)] == v for p, o, v in seen)
    ends = end_offsets(delivered, partitions)
    assert resumed_at == {p: o for p, o in expected_resume.items() if o < ends[p]}
    assert len(tail) == 7 and {p for p, _ in tail} <= {0, 1}


# ------------------------------------------------------------------ 4. positions and commits


POS_PER_PARTITION = 100


def pos_ts(p: int, i: int) -> int:
    return BASE_TS_MS + p * 100_000 + i * 10


def pos_records(topic: str, bs: str) -> dict[TopicPartition, int]:
    """100 records per partition of a 2-partition topic, timestamps rising 10 ms per offset;
    lz4 with a flush every 25 records per partition, so seeks land inside compressed batches."""
    ck_create_topic(bs, topic, 2)
    recs = [Rec(p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), (), pos_ts(p, i))
            for i in range(POS_PER_PARTITION) for p in (0, 1)]
    delivered = ck_produce(bs, topic, recs, {"compression.type": "lz4", "linger.ms": 50}, flush_every=50)
    assert delivered == [(p, i) for i in range(POS_PER_PARTITION) for p in (0, 1)]
    return {(topic, 0): POS_PER_PARTITION, (topic, 1): POS_PER_PARTITION}


def test_positions_seeks_and_commits(mbroker: BrokerProcess) -> None:
    """One consumer in assign mode with a group.id: where each seek puts the next record,
    commit / commit_async / committed, then a second consumer resuming at the commits."""
    bs = mbroker.bootstrap
    topic = group = "positions"
    pos_records(topic, bs)
    tp0, tp1 = (topic, 0), (topic, 1)
    full = {tp0: 100, tp1: 100}
    callbacks: list[Exception | None] = []

    async def main() -> None:
        conf = ours_conf(bs, **{"group.id": group})
        async with Consumer(conf) as c:
            c.assign([tp0, tp1])
            assert await c.committed([tp0, tp1]) == {tp0: None, tp1: None}
            # nothing committed, earliest: from offset 0, values in order
            got = await read_until(c, full)
            for p, tp in enumerate((tp0, tp1)):
                assert offsets(got[tp]) == list(range(100))
                assert [r.value for r in got[tp]] == [f"v{p}-{i}".encode() for i in range(100)]
                assert [r.timestamp for r in got[tp]] == [pos_ts(p, i) for i in range(100)]
                assert c.position(tp) == 100

            # seek into the middle of a compressed batch; buffered records are dropped
            c.seek(tp0, 37)
            assert c.position(tp0) == 37
            got = await read_until(c, {tp0: 63})
            assert list(got) == [tp0] and offsets(got[tp0]) == list(range(37, 100))

            # getone after a seek
            c.seek(tp1, 98)
            one = await c.getone(10)
            assert one is not None and (one.topic, one.partition, one.offset, one.value) == (topic, 1, 98, b"v1-98")
            assert one.timestamp == pos_ts(1, 98) and one.key == b"k1-98" and one.headers == ()
            two = await c.getone(10)
            assert two is not None and (two.partition, two.offset) == (1, 99)
            assert await c.getone(0.3) is None

            c.seek_to_beginning()
            got = await read_until(c, full)
            assert {tp: offsets(rs) for tp, rs in got.items()} == {tp0: list(range(100)), tp1: list(range(100))}

            c.seek_to_end()
            await poll_until(lambda: c.position(tp0) == 100 and c.position(tp1) == 100, 10, "positions at the end")
            assert await c.getmany(timeout_s=0.3) == {}
            async with Producer({"bootstrap.servers": bs}) as producer:
                mds = [await producer.send_and_wait(topic, f"new-{i}".encode(), partition=0,
                                                    timestamp_ms=BASE_TS_MS + 10_000_000 + i) for i in range(3)]
            assert [m.offset for m in mds] == [100, 101, 102]
            got = await read_until(c, {tp0: 3})
            assert list(got) == [tp0] and offsets(got[tp0]) == [100, 101, 102]
            assert [r.value for r in got[tp0]] == [b"new-0", b"new-1", b"new-2"]

            # seek_to_timestamp: the first offset at or after the time; past the last: the end
            await c.seek_to_timestamp({tp0: pos_ts(0, 40) + 5, tp1: pos_ts(1, 99)})
            assert c.position(tp0) == 41 and c.position(tp1) == 99
            got = await read_until(c, {tp0: 62, tp1: 1})
            assert offsets(got[tp0]) == list(range(41, 103)) and offsets(got[tp1]) == [99]
            await c.seek_to_timestamp({tp0: pos_ts(0, 20), tp1: BASE_TS_MS + 20_000_000})
            await poll_until(lambda: c.position(tp1) == 100, 10, "tp1 at the end")
            got = await read_until(c, {tp0: 83})
            assert list(got) == [tp0] and offsets(got[tp0]) == list(range(20, 103))

            # commits: explicit, async with callback, and the positions
            await c.commit({tp0: 50, tp1: 60})
            assert await c.committed([tp0, tp1]) == {tp0: 50, tp1: 60}
            c.commit_async({tp0: 55}, on_done=callbacks.append)
            await poll_until(lambda: callbacks, 10, "the commit_async callback")
            assert callbacks == [None]
            assert await c.committed([tp0, tp1]) == {tp0: 55, tp1: 60}
            c.seek(tp0, 70)
            c.seek(tp1, 80)
            await c.commit()
            assert await c.committed([tp0, tp1]) == {tp0: 70, tp1: 80}
            c.commit_async(on_done=callbacks.append)
            await poll_until(lambda: len(callbacks) == 2, 10, "the second commit_async callback")
            assert callbacks == [None, None]

        # a new consumer of the group resumes at exactly the committed offsets
        async with Consumer(conf) as c2:
            c2.assign([tp0, tp1])
            got = await read_until(c2, {tp0: 33, tp1: 20})
            assert offsets(got[tp0]) == list(range(70, 103)) and offsets(got[tp1]) == list(range(80, 100))

    run(main, 60)


def test_auto_offset_reset_latest(mbroker: BrokerProcess) -> None:
    """No committed offset, latest: only records written after the position was looked up."""
    bs = mbroker.bootstrap
    topic = "reset-latest"
    pos_records(topic, bs)
    tp0, tp1 = (topic, 0), (topic, 1)

    async def main() -> None:
        async with Consumer(ours_conf(bs, **{"group.id": topic, "auto.offset.reset": "latest"})) as c:
            c.assign([tp0, tp1])
            await poll_until(lambda: c.position(tp0) is not None and c.position(tp1) is not None, 10,
                             "positions looked up")
            assert (c.position(tp0), c.position(tp1)) == (100, 100)
            assert await c.getmany(timeout_s=0.3) == {}
            async with Producer({"bootstrap.servers": bs}) as producer:
                for i in range(2):
                    await producer.send_and_wait(topic, f"late-{i}".encode(), partition=1)
            got = await read_until(c, {tp1: 2})
            assert list(got) == [tp1] and offsets(got[tp1]) == [100, 101]
            assert [r.value for r in got[tp1]] == [b"late-0", b"late-1"]

    run(main, 30)


async def collect_errors(c: Consumer, n: int, timeout_s: float = 10.0) -> list[OffsetOutOfRange]:
    errors: list[OffsetOutOfRange] = []
    with trio.move_on_after(timeout_s):
        while len(errors) < n:
            try:
                got = await c.getmany(timeout_s=0.5)
            except OffsetOutOfRange as exc:
                errors.append(exc)
                continue
            assert got == {}, f"records despite auto.offset.reset=none: {got}"
    return errors


def test_auto_offset_reset_none_raises(mbroker: BrokerProcess) -> None:
    """auto.offset.reset=none: a partition without a committed offset, and one whose committed
    offset is past the log end, each make getmany raise OffsetOutOfRange (once each)."""
    bs = mbroker.bootstrap
    topic = group = "reset-none"
    pos_records(topic, bs)
    tp0, tp1 = (topic, 0), (topic, 1)

    async def main() -> None:
        async with Consumer(ours_conf(bs, **{"group.id": group})) as setter:
            await setter.commit({tp0: 10_000})
        async with Consumer(ours_conf(bs, **{"group.id": group, "auto.offset.reset": "none"})) as c:
            c.assign([tp0, tp1])
            errors = await collect_errors(c, 2)
            assert len(errors) == 2, errors
            text = " | ".join(str(e) for e in errors)
            assert f"{topic}-0" in text and f"{topic}-1" in text, text
            assert await collect_errors(c, 1, timeout_s=1.0) == [], "an error was raised twice"

    run(main, 30)


def test_seek_after_offset_out_of_range_resumes(mbroker: BrokerProcess) -> None:
    bs = mbroker.bootstrap
    topic = group = "reset-none-seek"
    pos_records(topic, bs)
    tp0 = (topic, 0)

    async def main() -> None:
        async with Consumer(ours_conf(bs, **{"group.id": group, "auto.offset.reset": "none"})) as c:
            c.assign([tp0])
            assert len(await collect_errors(c, 1)) == 1
            c.seek(tp0, 5)
            got = await read_until(c, {tp0: 95}, timeout_s=5.0)
            assert offsets(got.get(tp0, [])) == list(range(5, 100))

    run(main, 30)


async def write_values(bs: str, topic: str, values: list[bytes]) -> None:
    async with Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 2}) as p:
        for v in values:
            await p.send(topic, v, partition=0)
        await p.flush(20)


async def recreate(bs: str, topic: str, values: list[bytes]) -> Any:
    """Delete `topic`, create it again (1 partition), write `values`; its new topic id."""
    async with Admin(bs) as admin:
        await admin.delete_topic(topic)
        with trio.fail_after(20):
            while True:
                try:
                    await admin.create_topic(topic, 1, 1, {})
                    break
                except Exception:  # noqa: BLE001 - still being deleted: TOPIC_ALREADY_EXISTS
                    await trio.sleep(0.1)
        await write_values(bs, topic, values)
        (desc,) = await admin.describe_topic_partitions([topic])
        return desc["topic_id"]


async def chunks_until(c: Consumer, n: int, timeout_s: float = 10.0) -> list[FetchedChunk]:
    got: list[FetchedChunk] = []
    with trio.move_on_after(timeout_s):
        while sum(len(ch.records) for ch in got) < n:
            got += await c.getmany_chunks(timeout_s=0.5)
    return got


@pytest.mark.parametrize("reset", ["none", "earliest"])
def test_a_topic_created_again_is_never_read_from_the_old_position(mbroker: BrokerProcess, reset: str) -> None:
    """KIP-516: the consumer's position belongs to the topic id it was set in, and its fetches
    name that id (Fetch v13). The topic is deleted and created again with more records than
    the old position (offsets from 0): with auto.offset.reset=none getmany raises
    TopicIdChanged (old and new id) and hands out nothing until a seek; with earliest the new
    incarnation is read from offset 0. Either way no record of the new topic arrives as if it
    followed the old position: the partition is paused while the topic is created again, so
    the consumer's metadata still names the old one when it fetches again, and a fetch by
    name delivers offsets 100..149 of the new topic. Chunks carry their topic id and leader
    epochs."""
    bs = mbroker.bootstrap
    topic = f"incarnations-{reset}"
    tp = (topic, 0)

    async def main() -> None:
        async with Admin(bs) as admin:
            await admin.create_topic(topic, 1, 1, {})
            (desc,) = await admin.describe_topic_partitions([topic])
            old_id = desc["topic_id"]
        await write_values(bs, topic, [b"old-%d" % i for i in range(100)])
        async with Consumer(ours_conf(bs, **{"auto.offset.reset": reset})) as c:
            c.assign([tp])
            c.seek(tp, 0)
            first = await chunks_until(c, 100)
            assert [r.value for ch in first for r in ch.records] == [b"old-%d" % i for i in range(100)]
            assert {ch.topic_id for ch in first} == {old_id}, [ch.topic_id for ch in first]
            assert all(ch.leader_epochs and ch.leader_epochs[0] == (ch.records[0].offset, 0) for ch in first)
            # Paused meanwhile, so the consumer's metadata still names the old topic when it
            # fetches again: only the topic id in the fetch can tell the incarnations apart.
            c.pause(tp)
            new_id = await recreate(bs, topic, [b"new-%d" % i for i in range(150)])
            assert new_id != old_id
            c.resume(tp)
            got: list[FetchedChunk] = []
            errors: list[TopicIdChanged] = []
            with trio.move_on_after(15):
                while sum(len(ch.records) for ch in got) < 150 and not errors:
                    try:
                        got += await c.getmany_chunks(timeout_s=0.5)
                    except TopicIdChanged as exc:
                        errors.append(exc)
            if reset == "none":
                assert got == [], f"records of the new topic before a seek: {got[:2]}"
                assert len(errors) == 1 and errors[0].tp == tp, errors
                assert (errors[0].old_id, errors[0].new_id) == (old_id, new_id)
                c.seek(tp, 0, topic_id=new_id)
                got = await chunks_until(c, 150)
            assert [r.value for ch in got for r in ch.records] == [b"new-%d" % i for i in range(150)]
            assert [r.offset for ch in got for r in ch.records] == list(range(150))
            assert {ch.topic_id for ch in got} == {new_id}

    run(main, 60)


def test_seek_past_end_resets_to_earliest(mbroker: BrokerProcess) -> None:
    """A fetch position past the log end with auto.offset.reset=earliest: back to the log start."""
    bs = mbroker.bootstrap
    topic = "seek-past-end"
    pos_records(topic, bs)
    tp1 = (topic, 1)

    async def main() -> None:
        async with Consumer(ours_conf(bs)) as c:
            c.assign([tp1])
            got = await read_until(c, {tp1: 100}, extra_check_s=0)
            assert offsets(got[tp1]) == list(range(100))
            c.seek(tp1, 10_000)
            got = await read_until(c, {tp1: 100}, timeout_s=5.0)
            assert offsets(got.get(tp1, [])) == list(range(100))

    run(main, 30)


def test_commit_does_not_wait_for_the_fetch_long_poll(mbroker: BrokerProcess) -> None:
    """Caught up, the fetcher keeps a Fetch parked at the broker for fetch.max.wait.ms (1 s
    here); a commit meanwhile should take a loopback round trip, not the rest of that wait."""
    bs = mbroker.bootstrap
    topic = group = "commit-latency"
    pos_records(topic, bs)
    tp0, tp1 = (topic, 0), (topic, 1)
    took: list[float] = []

    async def main() -> None:
        async with Consumer(ours_conf(bs, **{"group.id": group, "fetch.max.wait.ms": 1000})) as c:
            c.assign([tp0, tp1])
            await read_until(c, {tp0: 100, tp1: 100}, extra_check_s=0)
            for i in range(3):
                start = time.monotonic()
                await c.commit({tp0: 10 + i, tp1: 20 + i})
                took.append(time.monotonic() - start)
            assert await c.committed([tp0, tp1]) == {tp0: 12, tp1: 22}

    run(main, 30)
    assert max(took) < 0.3, f"commits took {[round(t, 3) for t in took]} s"


def test_fetch_lanes_split_a_brokers_partitions_over_connections_and_keep_each_in_order(
        mbroker: BrokerProcess) -> None:
    """fetch_lanes=3 (a flow's num.replica.fetchers): the six partitions one broker leads are
    fetched over three connections, each with its own Fetch in flight, decoded and raw; every
    record arrives once and in offset order per partition, and a seek still lands."""
    bs = mbroker.bootstrap
    topic = "fetch-lanes"
    ck_create_topic(bs, topic, 6)
    recs = [Rec(p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), (), BASE_TS_MS + i)
            for i in range(300) for p in range(6)]
    ck_produce(bs, topic, recs, {"linger.ms": 5}, flush_every=600)
    tps = [(topic, p) for p in range(6)]

    async def main() -> None:
        async with Consumer(ours_conf(bs, **{"max.partition.fetch.bytes": 2048}), fetch_lanes=3) as c:
            c.assign(tps)
            got = await read_until(c, {tp: 300 for tp in tps})
            assert {tp: offsets(got[tp]) for tp in tps} == {tp: list(range(300)) for tp in tps}
            assert [r.value for r in got[(topic, 4)]] == [f"v4-{i}".encode() for i in range(300)]
            lanes = {lane for node, lane in c.cluster.open_lanes() if node >= 0}
            assert lanes == {"data", "fetch-1", "fetch-2"}, lanes
            c.seek((topic, 2), 250)
            again = await read_until(c, {(topic, 2): 50})
            assert {tp: offsets(r) for tp, r in again.items()} == {(topic, 2): list(range(250, 300))}
        async with Consumer(ours_conf(bs, **{"max.partition.fetch.bytes": 2048}), raw_batches=True,
                            fetch_lanes=3) as raw:
            raw.assign(tps)
            ends: dict[TopicPartition, int] = {tp: 0 for tp in tps}
            with trio.move_on_after(20):
                while any(end < 300 for end in ends.values()):
                    for chunk in await raw.getmany_raw(timeout_s=0.5):
                        assert chunk.fetch_offset == ends[chunk.tp], (chunk.tp, chunk.fetch_offset, ends[chunk.tp])
                        ends[chunk.tp] = chunk.next_offset
            assert ends == {tp: 300 for tp in tps}
            assert {lane for node, lane in raw.cluster.open_lanes() if node >= 0} == {"data", "fetch-1", "fetch-2"}

    run(main, 60)


# ------------------------------------------------------------------ 5. failures


@pytest.mark.parametrize("mode", ["assign", "subscribe"])
def test_unreachable_bootstrap_returns_nothing_and_closes_promptly(mode: str) -> None:
    """Nothing listens on the bootstrap port: getmany waits its timeout and returns nothing,
    and close() returns at once (no LeaveGroup to send, no request to wait for)."""
    bs = f"127.0.0.1:{free_port()}"
    timings: dict[str, float] = {}

    async def main() -> None:
        conf = ours_conf(bs, **{"group.id": "nowhere", "request.timeout.ms": 30000})
        c = Consumer(conf)
        await c.__aenter__()
        try:
            if mode == "assign":
                c.assign([("t", 0), ("t", 1)])
            else:
                c.subscribe(["t"])
            for _ in range(3):
                start = time.monotonic()
                assert await c.getmany(timeout_s=1.0) == {}
                timings.setdefault("getmany", 0.0)
                timings["getmany"] = max(timings["getmany"], time.monotonic() - start)
            assert c.assignment() == ({("t", 0), ("t", 1)} if mode == "assign" else set())
        finally:
            start = time.monotonic()
            await c.close()
            timings["close"] = time.monotonic() - start

    run(main, 30)
    assert 0.95 <= timings["getmany"] < 2.0, timings
    assert timings["close"] < 1.0, timings


@pytest.mark.parametrize("how", ["topics", "pattern"])
def test_topic_created_after_subscribe_is_picked_up(mbroker: BrokerProcess, how: str) -> None:
    """subscribe() to a topic that does not exist yet: the consumer joins with nothing
    assigned and getmany returns nothing; once the topic exists (metadata.max.age.ms=1000)
    the member rejoins, gets every partition and reads every record from the start."""
    bs = mbroker.bootstrap
    topic = group = f"late-{how}"
    partitions = 3

    async def main() -> None:
        conf = ours_conf(bs, **{"group.id": group, "metadata.max.age.ms": 1000})
        async with Consumer(conf) as c:
            if how == "topics":
                c.subscribe([topic])
            else:
                c.subscribe(pattern=f"{topic}.*")
            await poll_until(lambda: c.group.stable.is_set(), 20, "joining the group")
            assert c.assignment() == set()
            assert await c.getmany(timeout_s=0.5) == {}
            await trio.to_thread.run_sync(create_topic, bs, topic, partitions)
            delivered = await trio.to_thread.run_sync(produce, bs, topic, 30, partitions, topic)
            waited = await poll_until(lambda: len(c.assignment()) == partitions, 15,
                                      f"the new topic assigned (has {c.assignment()})")
            got = await read_until(c, {(topic, p): 10 for p in range(partitions)})
            assert c.assignment() == {(topic, p) for p in range(partitions)}
            seen: list[tuple[int, int, Any]] = [(p, r.offset, r.value) for (_t, p), rs in got.items() for r in rs]
            assert_exactly_once(seen, delivered)
            assert waited < 5.0, f"picked up the new topic only after {waited:.1f}s"

    run(main, 40)


def test_static_members_come_back_without_a_rebalance_and_a_fenced_one_stops(mbroker: BrokerProcess) -> None:
    """Static membership (KIP-345), as the mirror workers use it (group.instance.id = the
    worker's name): a member that died without leaving comes back under its instance id and
    gets its partitions at once — long before its old session would expire — while the other
    member is neither revoked nor moved to a new generation. A second copy under the same
    instance id fences the first: its every poll raises FencedInstanceId and it never joins
    again (two copies taking the partitions from each other in turn would both stall)."""
    bs = mbroker.bootstrap
    topic = group = "static-members"
    partitions = 4
    create_topic(bs, topic, partitions)
    delivered = produce(bs, topic, 40, partitions, topic)
    all_tps = {(topic, p) for p in range(partitions)}
    revoked_b: list[list[TopicPartition]] = []

    async def on_revoke_b(tps: list[TopicPartition]) -> None:
        revoked_b.append(tps)

    async def no_goodbye() -> None:  # a member that is killed sends no LeaveGroup
        return None

    async def main() -> None:
        conf = ours_conf(bs, **{"group.id": group, "partition.assignment.strategy": "range",
                                "session.timeout.ms": 30_000})
        async with Consumer({**conf, "group.instance.id": "w1"}) as b:
            async with Consumer({**conf, "group.instance.id": "w0"}) as a:
                a.subscribe([topic])
                await poll_until(lambda: a.group.stable.is_set() and a.assignment() == all_tps, 20, "a alone")
                b.subscribe([topic], on_revoke=on_revoke_b)
                await poll_until(lambda: a.group.stable.is_set() and b.group.stable.is_set()
                                 and a.assignment() and b.assignment()
                                 and a.assignment() | b.assignment() == all_tps, 30, "a and b split")
                a_share, b_share, generation = a.assignment(), b.assignment(), b.group.generation
                revoked_b.clear()
                a.group.leave = no_goodbye  # type: ignore[method-assign]
            started = time.monotonic()
            async with Consumer({**conf, "group.instance.id": "w0"}) as again:
                again.subscribe([topic])
                await poll_until(lambda: again.group.stable.is_set(), 20, "w0 back")
                back_s = time.monotonic() - started
                assert again.assignment() == a_share and again.group.generation == generation
                got = await read_until(again, {tp: 10 for tp in a_share})
                assert sorted(got) == sorted(a_share) and all(offsets(r) == list(range(10)) for r in got.values())
                async with Consumer({**conf, "group.instance.id": "w0"}) as copy:
                    copy.subscribe([topic])
                    await poll_until(lambda: copy.group.stable.is_set(), 20, "the copy of w0 in the group")
                    for _ in range(2):  # fatal: every poll says so
                        with pytest.raises(FencedInstanceId, match="group.instance.id 'w0'"):
                            await again.getmany(timeout_s=5.0)
                    assert again.assignment() == set() and again.group.fenced is not None
                    assert copy.assignment() == a_share and copy.group.generation == generation
                    await trio.sleep(1.5)  # three heartbeats of each: the fenced one stays out
                    assert copy.group.stable.is_set() and copy.group.generation == generation
                    assert again.assignment() == set()
            assert b.assignment() == b_share and b.group.generation == generation and revoked_b == []
        assert back_s < 10.0, f"w0 came back after {back_s:.1f} s (its session: 30 s)"

    run(main, 60)
    assert len(delivered) == 40
