"""The producer's sans-IO accumulator: batching by size and linger, buffer.memory,
idempotent sequences, retries in sequence order, producer id resets."""

from __future__ import annotations

import pytest

from cluster.client.accumulator import BATCH_FULL, NEW_BATCH, BufferFull, RecordAccumulator
from cluster.protocol.records import decode_batch

V = b"v" * 100


def make(**kw: object) -> RecordAccumulator:
    args = dict(batch_size=1000, buffer_memory=1 << 20, linger_s=0.005, max_in_flight=5, idempotent=True)
    args.update(kw)
    acc = RecordAccumulator(**args)  # type: ignore[arg-type]
    acc.producer_id, acc.producer_epoch = 7, 0
    return acc


def test_records_fill_batches_up_to_batch_size_and_encode_exactly() -> None:
    acc = make()
    outcomes = [acc.append("t", 0, 1000 + i, None if i % 2 else b"k%d" % i, V, [("h", b"x")] if i == 3 else [],
                           None, 0.0) for i in range(20)]
    assert outcomes[0] == NEW_BATCH
    assert outcomes.count(BATCH_FULL) >= 1
    batches = list(acc.partitions[("t", 0)].queue)
    assert all(len(b.body) <= 1000 for b in batches)
    assert sum(b.count for b in batches) == 20
    # Encoded batches decode back to exactly the records, offsets relative to the batch.
    seen = []
    for b in batches:
        header, records = decode_batch(b.encode(0))
        assert header.records_count == b.count and header.producer_id == -1
        seen += [(r.timestamp, r.key, r.value, r.headers) for r in records]
    assert seen == [(1000 + i, None if i % 2 else b"k%d" % i, V, (("h", b"x"),) if i == 3 else ())
                    for i in range(20)]


def test_linger_decides_when_an_open_batch_is_sendable() -> None:
    acc = make()
    acc.append("t", 0, 1, None, V, [], None, 10.0)
    assert acc.sendable(("t", 0), 10.001) is None
    assert acc.next_deadline_s(10.001) == pytest.approx(10.005)
    assert acc.sendable(("t", 0), 10.005) is not None
    acc.flushing = 1
    assert acc.sendable(("t", 0), 10.0) is not None


def test_buffer_memory_is_a_hard_limit_and_completion_releases_it() -> None:
    acc = make(buffer_memory=4096, batch_size=100_000)
    with pytest.raises(BufferFull, match="buffer.memory"):
        for i in range(1000):
            acc.append("t", 0, i, None, V, [], None, 0.0)
    held = acc.buffered_bytes
    assert 4096 <= held < 4096 + 200
    acc.flushing = 1
    batch = acc.drain(("t", 0))
    acc.completed(batch)
    assert acc.buffered_bytes == 0 and acc.incomplete == 0


def test_sequences_are_assigned_at_drain_and_kept_across_retries_in_order() -> None:
    acc = make(batch_size=250)
    for i in range(6):
        acc.append("t", 0, i, None, V, [], None, 0.0)  # two records per batch
    acc.flushing = 1
    tp = ("t", 0)
    b1, b2, b3 = acc.drain(tp), acc.drain(tp), acc.drain(tp)
    assert [(b.base_sequence, b.count) for b in (b1, b2, b3)] == [(0, 2), (2, 2), (4, 2)]
    assert decode_batch(b2.encode(0))[0].base_sequence == 2
    # b1 fails retriably; b2 and b3 come back out of order and are requeued behind it.
    acc.requeue(b3, 0.0)
    acc.requeue(b1, 0.0)
    assert acc.earlier_in_doubt(b2)
    acc.requeue(b2, 0.0)
    assert [b.base_sequence for b in acc.partitions[tp].queue] == [0, 2, 4]
    # Retries go one at a time.
    first = acc.drain(tp)
    assert first is b1 and acc.sendable(tp, 0.0) is None
    acc.completed(first)
    assert acc.drain(tp) is b2
    # A new record never joins a batch that already has a sequence.
    acc.append("t", 0, 9, None, V, [], None, 0.0)
    assert acc.partitions[tp].queue[-1].base_sequence == -1


def test_producer_id_reset_renumbers_unsent_batches_from_zero() -> None:
    acc = make(batch_size=250)
    for i in range(4):
        acc.append("t", 0, i, None, V, [], None, 0.0)
    acc.flushing = 1
    tp = ("t", 0)
    b1 = acc.drain(tp)
    acc.requeue(b1, 0.0)
    acc.reset_producer_id(8, 0)
    again = acc.drain(tp)
    assert again is b1 and (again.producer_id, again.base_sequence) == (8, 0)
    header, _ = decode_batch(again.encode(0))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (8, 0, 0)
    assert acc.drain(tp).base_sequence == 2


def test_in_flight_limit_per_partition() -> None:
    acc = make(batch_size=120, max_in_flight=2)
    for i in range(5):
        acc.append("t", 0, i, None, V, [], None, 0.0)
    acc.flushing = 1
    acc.drain(("t", 0))
    acc.drain(("t", 0))
    assert acc.sendable(("t", 0), 0.0) is None


def test_expired_batches_leave_the_queue() -> None:
    acc = make()
    acc.append("t", 0, 1, None, V, [], None, 0.0)
    assert acc.expired(119.0, 120.0) == []
    (batch,) = acc.expired(120.0, 120.0)
    assert batch.count == 1 and not acc.partitions[("t", 0)].queue
