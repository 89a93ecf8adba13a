"""mirror/tail.py's `_many` functions (a claim of thousands of partitions asks each leader once
per step) answer what the one-partition functions answer, partition by partition, on a real
broker: idempotent writers, a transaction left open, fence markers,
mirrored records of several source partitions, empty partitions, answers cut at the response
size (asked again), a partition that does not exist (in `failed`, the others answered)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cluster.client.admin import Admin
from cluster.protocol.errors import ErrorCode
from mirror import provenance, tail

PARTITIONS = 24
SOURCE = "east"


def _mirrored_headers(source_partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [(provenance.SOURCE_CLUSTER, SOURCE.encode()), (provenance.SOURCE_PARTITION, str(source_partition).encode()),
            (provenance.SOURCE_OFFSET, str(offset).encode()), (provenance.SOURCE_LEADER_EPOCH, b"0"),
            (provenance.PATH, SOURCE.encode())]


def _load(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic("tails", PARTITIONS, 1)]).values():
        f.result()
    # Partitions 0..7: an idempotent writer, records mirrored from source partition p (and, on
    # even ones, a later record of another source partition); 8..11: big records (answers cut);
    # 12..15: a transaction left open; 16..23: empty.
    idem = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for p in range(8):
        for i in range(30 * (p + 1)):
            idem.produce("tails", b"v", partition=p, headers=_mirrored_headers(p, i))
        if p % 2 == 0:
            idem.produce("tails", b"w", partition=p, headers=_mirrored_headers(p + 100, 7))
    for p in range(8, 12):
        for i in range(3):
            idem.produce("tails", b"x" * 600_000, partition=p, headers=_mirrored_headers(p, i))
    idem.flush(30)
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tail-open", "linger.ms": 5})
    txn.init_transactions(30)
    txn.begin_transaction()
    for p in range(12, 16):
        txn.produce("tails", b"t", partition=p, headers=_mirrored_headers(p, 0))
    txn.flush(30)  # never committed: its writer holds the last stable offset back


async def _compare(bootstrap: str) -> None:
    async with Admin(bootstrap) as admin:
        cluster = admin.cluster
        await cluster.refresh({"tails"})
        tps = [("tails", p) for p in range(PARTITIONS)]
        failed: tail.Failed = {}
        offs = await tail.offsets_many(cluster, [*tps, ("tails", PARTITIONS)], failed)
        assert set(failed) == {("tails", PARTITIONS)}, failed
        assert failed[("tails", PARTITIONS)].code == ErrorCode.unknown_topic_or_partition
        assert offs == {tp: await tail.offsets(cluster, *tp) for tp in tps}
        assert [offs[("tails", p)][1] for p in range(8)] == [30 * (p + 1) + (p % 2 == 0) for p in range(8)]

        writers = await tail.last_writers(cluster, offs, failed)
        assert writers == {tp: await tail.last_writer(cluster, *tp) for tp in tps}
        assert all(writers[("tails", p)] is not None for p in range(16))
        assert all(writers[("tails", p)] is None for p in range(16, PARTITIONS))
        assert writers[("tails", 12)] != writers[("tails", 0)]  # the open transaction's writer

        at = {tp: offs[tp][0] for tp in tps}
        whole = await tail.fetch_many(cluster, at, failed)
        one = {tp: await tail.fetch(cluster, *tp, at[tp]) for tp in tps}
        # An answer cut at its size holds a prefix of what the partition alone gives, never nothing.
        for tp in tps:
            alone = [b.header for b in one[tp].batches]
            got = [b.header for b in whole[tp].batches]
            assert got == alone[:len(got)] and bool(got) == bool(alone), tp
        assert any(len(whole[tp].batches) < len(one[tp].batches) for tp in tps)  # some were cut
        ranges = {tp: (offs[tp][0], offs[tp][1]) for tp in tps}
        records = await tail.fetch_ranges(cluster, ranges, failed)
        assert {tp: [r.offset for r in rs] for tp, rs in records.items()} == \
            {tp: list(range(*ranges[tp])) for tp in tps}

        asks = {tp: (offs[tp][0], offs[tp][1], tp[1]) for tp in tps}
        many = await tail.last_mirrored_many(cluster, asks, SOURCE, failed)
        singly = {tp: await tail.last_mirrored(cluster, *tp, offs[tp][1], SOURCE, tp[1]) for tp in tps}
        assert many == singly
        assert [many[("tails", p)][0].offset for p in range(8)] == [30 * (p + 1) - 1 for p in range(8)]  # type: ignore[union-attr]
        assert all(many[("tails", p)][0].offset == 0 for p in range(12, 16))  # type: ignore[union-attr]
        assert all(many[("tails", p)][0] is None for p in range(16, PARTITIONS))

        epochs = await tail.end_offsets_for_epochs(cluster, {tp: 0 for tp in tps}, failed)
        assert epochs == {tp: await tail.end_offset_for_epoch(cluster, *tp, 0) for tp in tps}

        # Fencing the open transaction's writer on its partitions ends it with a marker.
        fencing = {("tails", p): (writers[("tails", p)][0], writers[("tails", p)][1] + 1)  # type: ignore[index]
                   for p in range(12, 16)}
        assert await tail.abort_markers(cluster, fencing, failed) == {tp: True for tp in fencing}
        after = await tail.offsets_many(cluster, list(fencing), failed)
        assert all(after[tp][1] == offs[tp][1] + 1 for tp in fencing), (offs, after)
        assert set(failed) == {("tails", PARTITIONS)}


def test_many_partitions_at_once_answer_as_each_alone(broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _load(broker.bootstrap)
    # An answer may carry only a little more than one partition's worth: most are cut and asked again.
    monkeypatch.setattr(tail, "TAIL_FETCH_RESPONSE_BYTES", tail.TAIL_FETCH_BYTES + 700_000)
    trio.run(_compare, broker.bootstrap)
