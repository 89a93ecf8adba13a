"""Log.append_as_follower and Log.truncate_to: what a follower replica does with its log."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.protocol.record_batch import InvalidRecordBatch
from cluster.storage.log import Log, NotEnoughReplicas, OutOfOrderSequence
from tests.batches import values_batch
from tests.unit.test_log import NOW, cfg, crash, read_all, reopen, state_of, value

SEGMENT_BYTES = 600


def leader_log(tmp_path: Path, batches: int, epochs: list[int]) -> Log:
    """A leader log of `batches` 3-record batches; batch i is written in epochs[i]."""
    lg = Log.create(tmp_path / "leader" / "t-0", "t", 0, cfg(segment_bytes=SEGMENT_BYTES), NOW)
    for i in range(batches):
        lg.append_as_leader(values_batch([value(lg.log_end_offset + j) for j in range(3)]),
                            leader_epoch=epochs[i], now_ms=NOW)
    return lg


def replicate(leader: Log, follower: Log, max_bytes: int = 500) -> None:
    while follower.log_end_offset < leader.log_end_offset:
        chunk = leader.read(follower.log_end_offset, max_bytes, leader.log_end_offset, min_one_batch=True)
        follower.append_as_follower(chunk, now_ms=NOW)


def segment_bytes(lg: Log) -> bytes:
    return b"".join(s.log_path.read_bytes() for s in lg.segments)


def test_follower_copy_is_byte_identical_with_the_same_epochs(tmp_path: Path) -> None:
    leader = leader_log(tmp_path, 12, [0] * 4 + [1] * 4 + [3] * 4)
    follower = Log.create(tmp_path / "t-0", "t", 0, cfg(segment_bytes=SEGMENT_BYTES), NOW)
    replicate(leader, follower)
    assert follower.log_end_offset == leader.log_end_offset == 36
    assert segment_bytes(follower) == segment_bytes(leader)
    assert read_all(follower) == read_all(leader)
    assert follower.leader_epochs.entries == leader.leader_epochs.entries == [(0, 0), (1, 12), (3, 24)]
    assert len(follower.segments) > 1


def test_follower_takes_a_gap_and_rejects_an_overlap_and_a_corrupt_batch(tmp_path: Path) -> None:
    # Kafka's followers take gaps (compaction, a mirror topic's copy of a gapped source);
    # a batch that starts below the log end, or a corrupt one, is refused.
    leader = leader_log(tmp_path, 3, [0, 0, 0])
    follower = Log.create(tmp_path / "t-0", "t", 0, cfg(), NOW)
    first = bytearray(leader.read(0, 10, leader.log_end_offset, min_one_batch=True))
    first[-1] ^= 0xFF
    with pytest.raises(InvalidRecordBatch):
        follower.append_as_follower(bytes(first), now_ms=NOW)
    assert follower.log_end_offset == 0 and follower.active_segment.size_bytes == 0
    third = leader.read(6, 1000, leader.log_end_offset, min_one_batch=True)
    assert follower.append_as_follower(third, now_ms=NOW) == 9
    assert follower.log_end_offset == 9 and follower.read(0, 1000, 9, min_one_batch=True) == third
    second = leader.read(3, 1000, 6, min_one_batch=True)
    with pytest.raises(InvalidRecordBatch, match="starts at offset 3, the log ends at 9"):
        follower.append_as_follower(second, now_ms=NOW)
    assert follower.log_end_offset == 9


@pytest.mark.parametrize("cut", [0, 1, 3, 14, 15, 16, 24, 35])
def test_truncate_to_cuts_at_the_batch_holding_the_offset(tmp_path: Path, cut: int) -> None:
    leader = leader_log(tmp_path, 12, [0] * 4 + [1] * 4 + [3] * 4)
    follower = Log.create(tmp_path / "t-0", "t", 0, cfg(segment_bytes=SEGMENT_BYTES), NOW)
    replicate(leader, follower)
    end = follower.truncate_to(cut, NOW)
    expected_end = cut - cut % 3  # batches hold 3 records: the one holding `cut` goes
    assert end == follower.log_end_offset == expected_end
    assert [r[0] for r in read_all(follower)] == list(range(expected_end))
    assert follower.leader_epochs.entries == [(e, o) for e, o in [(0, 0), (1, 12), (3, 24)] if o < expected_end]
    # The log goes on from the cut: the leader's history is fetched again and matches.
    replicate(leader, follower)
    assert segment_bytes(follower) == segment_bytes(leader)
    # And the truncation survives a crash and recovery.
    crash(follower)
    again = reopen(tmp_path, cfg(segment_bytes=SEGMENT_BYTES), recovery_point=0)
    assert state_of(again)["end"] == 36 and read_all(again) == read_all(leader)


def test_truncate_then_diverging_history_survives_restart(tmp_path: Path) -> None:
    follower = Log.create(tmp_path / "t-0", "t", 0, cfg(segment_bytes=SEGMENT_BYTES), NOW)
    for _ in range(10):
        follower.append_as_leader(values_batch([value(follower.log_end_offset + j) for j in range(3)]),
                                  leader_epoch=0, now_ms=NOW)
    follower.truncate_to(9, NOW)
    follower.append_as_leader(values_batch([b"new"]), leader_epoch=2, now_ms=NOW)
    assert follower.log_end_offset == 10
    assert follower.leader_epochs.entries == [(0, 0), (2, 9)]
    crash(follower)
    again = reopen(tmp_path, cfg(segment_bytes=SEGMENT_BYTES), recovery_point=0)
    assert [(o, v) for o, _, v in read_all(again)] == [(i, value(i)) for i in range(9)] + [(9, b"new")]
    assert again.leader_epochs.entries == [(0, 0), (2, 9)]


def test_truncate_drops_producer_state_past_the_cut(tmp_path: Path) -> None:
    lg = Log.create(tmp_path / "t-0", "t", 0, cfg(), NOW)
    for seq in range(3):
        lg.append_as_leader(values_batch([value(seq)], producer_id=7, producer_epoch=0, base_sequence=seq),
                            leader_epoch=0, now_ms=NOW)
    lg.truncate_to(2, NOW)
    # Sequence 2 was cut away: the producer may (and must) send it again.
    result = lg.append_as_leader(values_batch([value(2)], producer_id=7, producer_epoch=0, base_sequence=2),
                                 leader_epoch=0, now_ms=NOW)
    assert (result.base_offset, result.duplicate) == (2, False)


def test_truncate_fully_and_start_at_the_leaders_log_start(tmp_path: Path) -> None:
    """A follower whose log lies wholly below the leader's log start (retention ran while it
    was away) starts over empty there, then copies the leader byte for byte from that offset."""
    follower = Log.create(tmp_path / "t-0", "t", 0, cfg(segment_bytes=SEGMENT_BYTES), NOW)
    for seq in range(4):
        follower.append_as_leader(values_batch([value(seq)], producer_id=7, producer_epoch=0, base_sequence=seq),
                                  leader_epoch=0, now_ms=NOW)
    follower.take_producer_snapshot()
    follower.truncate_fully_and_start_at(30, NOW)
    assert (follower.log_start_offset, follower.log_end_offset, len(follower.segments)) == (30, 30, 1)
    assert follower.leader_epochs.entries == [] and list(follower.dir.glob("*.snapshot")) == []
    assert follower.producer_state.to_snapshot() == Log.create(tmp_path / "e-0", "e", 0, cfg(), NOW).producer_state.to_snapshot()
    leader = leader_log(tmp_path, 14, [0] * 10 + [2] * 4)  # offsets 0..41
    replicate(leader, follower)
    assert follower.log_end_offset == 42
    assert [(o, v) for o, _, v in read_all(follower)] == [(i, value(i)) for i in range(30, 42)]
    assert follower.leader_epochs.entries == [(2, 30)]
    crash(follower)
    again = reopen(tmp_path, cfg(segment_bytes=SEGMENT_BYTES), recovery_point=0)
    assert (again.log_start_offset, again.log_end_offset) == (30, 42)
    assert again.leader_epochs.entries == [(2, 30)]


def test_a_retried_batch_gets_its_offsets_even_when_the_isr_is_too_small(tmp_path: Path) -> None:
    """acks=all with the ISR below min.insync.replicas: new batches are refused
    (NOT_ENOUGH_REPLICAS, "not written"), but the retry of a batch already in the log is
    answered as the duplicate it is. Refusing it would tell an idempotent producer that the
    batch was never written; librdkafka then resends it under a bumped epoch: a duplicate."""
    lg = Log.create(tmp_path / "t-0", "t", 0, cfg(), NOW)
    first = values_batch([value(0), value(1)], producer_id=7, producer_epoch=0, base_sequence=0)
    assert lg.append_as_leader(first, leader_epoch=0, now_ms=NOW).base_offset == 0
    again = lg.append_as_leader(first, leader_epoch=0, now_ms=NOW, enough_replicas=False)
    assert (again.base_offset, again.duplicate) == (0, True)
    nxt = values_batch([value(2)], producer_id=7, producer_epoch=0, base_sequence=2)
    with pytest.raises(NotEnoughReplicas):
        lg.append_as_leader(nxt, leader_epoch=0, now_ms=NOW, enough_replicas=False)
    with pytest.raises(NotEnoughReplicas):
        lg.append_as_leader(values_batch([b"plain"]), leader_epoch=0, now_ms=NOW, enough_replicas=False)
    assert lg.log_end_offset == 2
    assert lg.append_as_leader(nxt, leader_epoch=0, now_ms=NOW).base_offset == 2


def test_too_few_replicas_is_reported_before_a_sequence_gap(tmp_path: Path) -> None:
    """A pipelined producer: its request for sequence 2 was refused (NOT_ENOUGH_REPLICAS), so
    the request behind it (sequence 3) has a gap; while the ISR is short it must get the same
    NOT_ENOUGH_REPLICAS, as from Kafka, not OUT_OF_ORDER_SEQUENCE (librdkafka bumps its epoch
    on that and renumbers other partitions' unacknowledged batches)."""
    lg = Log.create(tmp_path / "t-0", "t", 0, cfg(), NOW)
    lg.append_as_leader(values_batch([value(0), value(1)], producer_id=7, producer_epoch=0, base_sequence=0),
                        leader_epoch=0, now_ms=NOW)
    behind = values_batch([value(3)], producer_id=7, producer_epoch=0, base_sequence=3)
    with pytest.raises(NotEnoughReplicas):
        lg.append_as_leader(behind, leader_epoch=0, now_ms=NOW, enough_replicas=False)
    with pytest.raises(OutOfOrderSequence):
        lg.append_as_leader(behind, leader_epoch=0, now_ms=NOW)


def test_follower_takes_a_batch_compaction_shortened(tmp_path: Path) -> None:
    # The cleaner keeps a batch's offset span when it drops records from it: one record
    # left of five is a batch a producer could not send, but a leader's log holds it.
    from cluster.protocol.records import Record, encode_batch

    shortened = encode_batch([Record(3, NOW, b"k", b"v", ())], base_offset=0, last_offset_delta=4)
    follower = Log.create(tmp_path / "t-0", "t", 0, cfg(), NOW)
    assert follower.append_as_follower(shortened, now_ms=NOW) == 5
    assert follower.read(0, 1000, 5, min_one_batch=True) == shortened


def test_leader_epochs_are_written_with_the_flush_and_rebuilt_above_the_recovery_point(tmp_path: Path) -> None:
    """A new epoch is not written at once (10,000 of them held the event loop up for
    seconds): the flush writes it before the recovery point moves past it, close writes it,
    and a crash before either loses nothing, because recovery rebuilds the epochs above the
    recovery point from the batches."""
    path = tmp_path / "leader" / "t-0" / "leader-epoch-checkpoint"
    lg = leader_log(tmp_path, 6, [0, 0, 2, 2, 5, 5])
    assert lg.leader_epochs.entries == [(0, 0), (2, 6), (5, 12)]
    assert lg.leader_epochs.dirty and not path.exists()
    lg.flush_segments(9)
    assert path.read_text() == "0\n3\n0 0\n2 6\n5 12\n" and not lg.leader_epochs.dirty
    lg.mark_flushed(9, NOW)
    lg.leader_epochs.assign(7, lg.log_end_offset)  # became leader again: not written yet
    assert path.read_text() == "0\n3\n0 0\n2 6\n5 12\n"
    crash(lg)
    again = Log.open(tmp_path / "leader" / "t-0", "t", 0, cfg(segment_bytes=SEGMENT_BYTES),
                     recovery_point=lg.recovery_point, clean_state=None, now_ms=NOW)
    assert again.leader_epochs.entries == [(0, 0), (2, 6), (5, 12)]  # epoch 7 wrote no batch
    again.leader_epochs.assign(7, again.log_end_offset)
    again.close()
    assert path.read_text() == "0\n4\n0 0\n2 6\n5 12\n7 18\n"


def test_a_leader_epoch_write_never_puts_older_entries_over_newer(tmp_path: Path) -> None:
    """The flush (a worker thread) and a truncation (the event loop) both write the file:
    each write takes its snapshot under the file's lock, and a write of what is already
    written is skipped, so the last write is the newest list whichever thread ran last."""
    lg = leader_log(tmp_path, 4, [0, 0, 1, 1])
    cache = lg.leader_epochs
    cache.write(fsync=False)
    assert cache.path.read_text() == "0\n2\n0 0\n1 6\n"
    cache.truncate_from_end(6)  # a truncation writes at once
    assert cache.path.read_text() == "0\n1\n0 0\n"
    cache.path.write_text("stale")
    cache.write(fsync=False)  # nothing changed since the last write: not written again
    assert cache.path.read_text() == "stale"
    cache.write(fsync=True)  # written but not yet synced: the flush writes and syncs it
    assert cache.path.read_text() == "0\n1\n0 0\n"
