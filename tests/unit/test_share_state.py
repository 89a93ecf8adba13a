"""`__share_group_state` records (cluster/groups/share_state_records.py) and the share
coordinator's decisions (cluster/groups/share_coordinator.py): the codec's limits and
checks, replay, the merge of a write over the stored state, and fencing by leader epoch and
state epoch; a share partition's snapshot written, replayed and restored keeps what it
settled."""

from __future__ import annotations

import random

import orjson
import pytest

from cluster.groups.share_coordinator import ShareCoordinator, StateRecord
from cluster.groups.share_partition import RecordState, SharePartition, ShareState, StateBatch
from cluster.groups.share_state_records import (
    STATE_BATCHES_MAX,
    UNINITIALIZED,
    VALUE_BYTES_MAX,
    ShareKey,
    ShareStateValue,
    StateRecordError,
    decode_key,
    decode_value,
    delivery_complete_count,
    encode_key,
    encode_value,
    merge_batches,
    replay,
    state_partition_for,
)
from cluster.protocol.errors import ErrorCode

KEY = ShareKey("g", "5c1c8a5e-7b8e-4d1f-9d0a-0c7a9c1e2f30", 3)
A, ACK, ARC = RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED


def value(start: int, *batches: tuple[int, int, RecordState, int], state_epoch: int = 0,
          leader_epoch: int = 1) -> ShareStateValue:
    return ShareStateValue(state_epoch, leader_epoch, start, tuple(StateBatch(*b) for b in batches))


def test_key_and_value_round_trip() -> None:
    v = value(10, (10, 12, ACK, 1), (14, 14, A, 2), (15, 20, ARC, 5), state_epoch=2, leader_epoch=7)
    assert decode_key(encode_key(KEY)) == KEY
    assert decode_value(encode_value(v)) == v
    assert KEY.coordinator_key() == f"g:{KEY.topic_id}:3"
    assert 0 <= state_partition_for(KEY, 50) < 50


def test_a_key_of_another_kind_is_not_a_share_key() -> None:
    assert decode_key(orjson.dumps({"v": 1, "type": "offset", "group": "g"})) is None
    assert decode_key(orjson.dumps({"v": 2, "type": "share"})) is None


@pytest.mark.parametrize("doc", [
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": 5, "batches": [[4, 6, 2, 1]]},  # below the start
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "batches": [[3, 6, 2, 1], [5, 7, 2, 1]]},  # overlap
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "batches": [[6, 3, 2, 1]]},  # last before first
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "batches": [[0, 3, 1, 1]]},  # ACQUIRED is never kept
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "batches": [[0, 3, 3, 1]]},  # no such state
    {"state_epoch": -1, "leader_epoch": 0, "start_offset": 0, "batches": []},
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": -1, "batches": [[0, 0, 2, 1]]},  # uninitialized
    {"state_epoch": 0, "leader_epoch": 0, "start_offset": 0, "batches": [[0, 0, 2]]},
    {"state_epoch": "0", "leader_epoch": 0, "start_offset": 0, "batches": []},
    [1, 2, 3],
])
def test_a_value_that_breaks_the_format_is_refused(doc: object) -> None:
    with pytest.raises(StateRecordError):
        decode_value(orjson.dumps(doc))


def test_sizes_and_counts_are_checked_before_anything_is_built() -> None:
    with pytest.raises(StateRecordError, match="bytes"):
        decode_value(b" " * (VALUE_BYTES_MAX + 1))
    too_many = {"state_epoch": 0, "leader_epoch": 0, "start_offset": 0,
                "batches": [[2 * i, 2 * i, 2, 1] for i in range(STATE_BATCHES_MAX + 1)]}
    with pytest.raises(StateRecordError, match="at most"):
        decode_value(orjson.dumps(too_many))
    with pytest.raises(StateRecordError):  # nor is it written
        encode_value(value(0, *[(2 * i, 2 * i, ACK, 1) for i in range(STATE_BATCHES_MAX + 1)]))


def test_replay_keeps_the_last_value_and_a_tombstone_deletes() -> None:
    other = ShareKey("h", KEY.topic_id, 0)
    records: list[tuple[bytes | None, bytes | None]] = [
        (encode_key(KEY), encode_value(value(0))),
        (encode_key(other), encode_value(value(4))),
        (encode_key(KEY), encode_value(value(7, (8, 9, ACK, 1)))),
        (orjson.dumps({"v": 1, "type": "offset", "group": "g"}), b"{}"),  # not ours: skipped
        (encode_key(other), None),
    ]
    assert replay(records) == {KEY: value(7, (8, 9, ACK, 1))}


def test_merge_lets_the_write_win_and_drops_what_is_below_the_start() -> None:
    old = tuple(StateBatch(*b) for b in [(0, 9, A, 1), (12, 15, ACK, 1)])
    new = tuple(StateBatch(*b) for b in [(3, 4, ACK, 1), (9, 13, ARC, 2)])
    assert merge_batches(old, new, 2) == tuple(StateBatch(*b) for b in [
        (2, 2, A, 1), (3, 4, ACK, 1), (5, 8, A, 1), (9, 13, ARC, 2), (14, 15, ACK, 1)])
    # touching runs of one state and count join
    assert merge_batches((StateBatch(0, 3, ACK, 1),), (StateBatch(4, 6, ACK, 1),), 0) == (StateBatch(0, 6, ACK, 1),)


def test_merge_matches_offset_by_offset_overwriting() -> None:
    rng = random.Random(44)
    for _ in range(300):
        def runs() -> tuple[StateBatch, ...]:
            out, at = [], rng.randrange(5)
            for _ in range(rng.randrange(5)):
                length = rng.randrange(1, 5)
                out.append(StateBatch(at, at + length - 1, rng.choice([A, ACK, ARC]), rng.randrange(1, 3)))
                at += length + rng.randrange(3)
            return tuple(out)
        old, new, start = runs(), runs(), rng.randrange(6)
        model: dict[int, tuple[RecordState, int]] = {}
        for b in (*old, *new):
            for o in range(b.first_offset, b.last_offset + 1):
                model[o] = (b.state, b.delivery_count)
        got = {o: (b.state, b.delivery_count) for b in merge_batches(old, new, start)
               for o in range(b.first_offset, b.last_offset + 1)}
        assert got == {o: s for o, s in model.items() if o >= start}


# ---- the coordinator ---------------------------------------------------------------------

def applied(c: ShareCoordinator, record: StateRecord | None) -> None:
    assert record is not None
    c.applied(record)


def test_a_read_of_an_unknown_share_partition_answers_it_unstarted_and_records_the_leader_epoch() -> None:
    c = ShareCoordinator()
    d = c.read(KEY, 4)
    assert d.error == ErrorCode.none and d.state == ShareStateValue(0, 4, UNINITIALIZED)
    applied(c, d.record)
    assert c.read(KEY, 4).record is None  # nothing new to record
    assert c.read(KEY, 3).error == ErrorCode.fenced_leader_epoch


def test_a_write_from_an_older_leader_is_fenced_after_its_successor_read() -> None:
    c = ShareCoordinator()
    applied(c, c.write(KEY, 0, 4, 10, (StateBatch(10, 11, ACK, 1),)).record)
    applied(c, c.read(KEY, 5).record)  # the new leader reads: epoch 5 recorded
    old = c.write(KEY, 0, 4, 12, ())
    assert old.error == ErrorCode.fenced_leader_epoch and old.record is None
    d = c.write(KEY, 0, 5, 12, (StateBatch(13, 13, ARC, 5),))
    assert d.error == ErrorCode.none
    applied(c, d.record)
    assert c.states[KEY] == value(12, (13, 13, ARC, 5), leader_epoch=5)


def test_state_epoch_fences_writes_and_initializations_from_before_a_reset() -> None:
    c = ShareCoordinator()
    applied(c, c.initialize(KEY, 3, 100).record)
    assert c.write(KEY, 2, 0, 101, ()).error == ErrorCode.fenced_state_epoch
    assert c.initialize(KEY, 2, 0).error == ErrorCode.fenced_state_epoch
    d = c.write(KEY, 3, 0, -1, (StateBatch(100, 100, ACK, 1),))  # -1: the start offset stays
    applied(c, d.record)
    assert c.states[KEY] == value(100, (100, 100, ACK, 1), state_epoch=3, leader_epoch=0)
    summary = c.summary(KEY, 0)
    assert summary.state == ShareStateValue(3, 0, 100, (StateBatch(100, 100, ACK, 1),))
    assert delivery_complete_count(summary.state) == 1
    assert c.summary(KEY._replace(partition=9), 0).state is None  # never initialized: no state
    applied(c, c.read(KEY, 4).record)
    assert c.summary(KEY, 3).error == ErrorCode.fenced_leader_epoch
    assert c.summary(KEY, -1).state.start_offset == 100  # type: ignore[union-attr]  # the group coordinator's


def test_a_write_that_breaks_the_format_or_starts_nowhere_is_invalid() -> None:
    c = ShareCoordinator()
    assert c.write(KEY, 0, 0, -1, ()).error == ErrorCode.invalid_request  # never started
    assert c.write(KEY, 0, 0, 5, (StateBatch(3, 2, ACK, 1),)).error == ErrorCode.invalid_request
    assert c.write(KEY, 0, 0, 5, (StateBatch(6, 7, ACK, 1), StateBatch(7, 8, ACK, 1))).error == \
        ErrorCode.invalid_request


def test_delete_writes_a_tombstone_and_unload_forgets() -> None:
    c = ShareCoordinator()
    assert c.delete(KEY).record is None
    applied(c, c.write(KEY, 0, 0, 1, ()).record)
    d = c.delete(KEY)
    assert d.record == StateRecord(KEY, None)
    applied(c, d.record)
    assert KEY not in c.states
    applied(c, c.write(KEY, 0, 0, 1, ()).record)
    assert c.unload(lambda k: k.group_id == "g") == 1 and not c.states


def test_a_snapshot_through_the_coordinator_and_the_log_restores_what_was_settled() -> None:
    """The path a leader change takes: snapshot → write → record → replay → read → restore."""
    sp = SharePartition(0, delivery_count_limit=2)
    got = sp.acquire("m", range(6), 0, 10)
    assert got and sp.acknowledge("m", [(0, 1, [1]), (2, 2, [2]), (3, 3, [3])], 0) == ErrorCode.none
    c = ShareCoordinator()
    snap = sp.snapshot()
    d = c.write(KEY, snap.state_epoch, 1, snap.start_offset, snap.batches)
    assert d.record is not None and d.record.value is not None
    log = [(encode_key(d.record.key), encode_value(d.record.value))]
    new = ShareCoordinator()
    new.load(replay(log))
    state = new.read(KEY, 2).state
    assert state is not None
    restored = SharePartition.restore(ShareState(state.start_offset, state.state_epoch, state.batches),
                                      delivery_count_limit=2)
    assert restored.start_offset == 2  # 0 and 1 accepted: gone for good
    again = restored.acquire("n", range(2, 6), 0, 10)
    offsets = {o for r in again for o in range(r.first_offset, r.last_offset + 1)}
    assert offsets == {2, 4, 5}  # released and still-held ones again; the rejected 3 never
    assert {r.delivery_count for r in again} == {2}
