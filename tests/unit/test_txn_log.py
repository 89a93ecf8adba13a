"""Transactions in one partition's log: markers, the last stable offset, the aborted
transaction index on disk (rebuilt on recovery, cut on truncation, removed with its
segment), and epoch fencing by a marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.protocol.record_batch import TRANSACTIONAL_MASK, iter_headers
from cluster.storage.log import Log, ProducerFenced
from cluster.storage.txn_index import ENTRY_BYTES, AbortedTxn
from tests.batches import values_batch
from tests.unit.test_log import NOW, append, cfg, crash, new_log, reopen


def txn_batch(pid: int, seq: int, *values: bytes, epoch: int = 0) -> bytes:
    return values_batch(list(values), producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                        attributes=TRANSACTIONAL_MASK)


def marker(lg: Log, pid: int, *, commit: bool, epoch: int = 0) -> int:
    return lg.append_marker(producer_id=pid, producer_epoch=epoch, commit=commit, coordinator_epoch=0,
                            leader_epoch=0, now_ms=NOW).base_offset


def test_lso_waits_for_the_first_open_transaction_and_for_its_marker_to_replicate(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    append(lg, values_batch([b"plain"]))  # 0
    append(lg, txn_batch(7, 0, b"a", b"b"))  # 1-2
    append(lg, txn_batch(8, 0, b"x"))  # 3
    assert lg.last_stable_offset(lg.log_end_offset) == 1
    commit_at = marker(lg, 7, commit=True)  # 4
    assert commit_at == 4
    # Pid 7's marker is not replicated yet (high watermark 4): still unstable.
    assert lg.last_stable_offset(4) == 1
    assert lg.last_stable_offset(5) == 3  # pid 8 still open
    abort_at = marker(lg, 8, commit=False)  # 5
    assert lg.last_stable_offset(6) == 6
    assert lg.collect_aborted(0, 6) == [AbortedTxn(8, 3, abort_at, 6)]
    assert lg.collect_aborted(4, 6) == [AbortedTxn(8, 3, abort_at, 6)]  # its marker is later
    assert lg.collect_aborted(6, 7) == []
    assert lg.collect_aborted(0, 3) == []  # upper bound before the aborted data


def test_aborted_index_survives_a_crash_and_is_rebuilt_when_missing(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    append(lg, txn_batch(7, 0, b"a"))
    marker(lg, 7, commit=False)
    append(lg, txn_batch(7, 1, b"b"))
    marker(lg, 7, commit=True)
    append(lg, txn_batch(9, 0, b"c"))  # left open by the crash
    index = lg.active_segment.txn_index.path
    assert index.stat().st_size == ENTRY_BYTES
    crash(lg)
    lg = reopen(tmp_path, cfg(), recovery_point=0)
    assert lg.collect_aborted(0, 10) == [AbortedTxn(7, 0, 1, 2)]
    assert lg.last_stable_offset(lg.log_end_offset) == 4  # pid 9's transaction is still open
    crash(lg)
    index.unlink()
    lg = reopen(tmp_path, cfg(), recovery_point=0)
    assert lg.collect_aborted(0, 10) == [AbortedTxn(7, 0, 1, 2)]
    assert index.stat().st_size == ENTRY_BYTES


def test_clean_restart_keeps_open_transactions_in_the_snapshot(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    append(lg, txn_batch(7, 0, b"a"))
    state = lg.close()
    lg = reopen(tmp_path, cfg(), recovery_point=state["log_end_offset"], clean_state=state)
    assert lg.last_stable_offset(1) == 0
    marker(lg, 7, commit=False)
    assert lg.last_stable_offset(2) == 2
    assert lg.collect_aborted(0, 2) == [AbortedTxn(7, 0, 1, 2)]


def test_truncation_drops_index_entries_past_the_cut(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    append(lg, txn_batch(7, 0, b"a"))
    marker(lg, 7, commit=False)  # 1
    append(lg, txn_batch(7, 1, b"b"))  # 2
    marker(lg, 7, commit=False)  # 3
    assert len(lg.collect_aborted(0, 10)) == 2
    lg.truncate_to(3, NOW)
    assert lg.collect_aborted(0, 10) == [AbortedTxn(7, 0, 1, 2)]
    assert lg.last_stable_offset(3) == 2  # the second transaction is open again


def test_retention_removes_the_index_with_its_segment(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg(retention_ms=1000))
    append(lg, txn_batch(7, 0, b"a"))
    marker(lg, 7, commit=False)
    index = lg.active_segment.txn_index.path
    lg.roll(NOW)
    assert index.exists()
    assert lg.delete_old_segments(NOW + 10_000) == 1
    assert not index.exists()
    assert lg.collect_aborted(0, 10) == []


def test_a_marker_with_a_newer_epoch_fences_the_older_one(tmp_path: Path) -> None:
    lg = new_log(tmp_path, cfg())
    append(lg, values_batch([b"a"], producer_id=5, producer_epoch=3, base_sequence=0))
    marker(lg, 5, commit=False, epoch=4)  # no transaction open: only the fence
    assert lg.collect_aborted(0, 10) == []
    with pytest.raises(ProducerFenced):
        append(lg, values_batch([b"b"], producer_id=5, producer_epoch=3, base_sequence=1))
    with pytest.raises(ProducerFenced):
        marker(lg, 5, commit=True, epoch=3)
    # The new epoch starts at sequence 0.
    assert append(lg, values_batch([b"c"], producer_id=5, producer_epoch=4, base_sequence=0)).base_offset == 2
    headers = [h for _, h in iter_headers(lg.read(0, 1 << 20, lg.log_end_offset, min_one_batch=True))]
    assert [h.is_control for h in headers] == [False, True, False]


def test_followers_copy_markers_and_build_the_same_index(tmp_path: Path) -> None:
    leader = new_log(tmp_path / "l", cfg())
    append(leader, txn_batch(7, 0, b"a", b"b"))
    marker(leader, 7, commit=False)
    follower = new_log(tmp_path / "f", cfg())
    follower.append_as_follower(leader.read(0, 1 << 20, leader.log_end_offset, min_one_batch=True), now_ms=NOW)
    assert follower.collect_aborted(0, 10) == leader.collect_aborted(0, 10) == [AbortedTxn(7, 0, 2, 3)]


def test_producers_may_not_write_control_batches(tmp_path: Path) -> None:
    from cluster.storage.log import InvalidRecordBatch
    from cluster.storage.txn_index import marker_batch

    lg = new_log(tmp_path, cfg())
    with pytest.raises(InvalidRecordBatch):
        append(lg, marker_batch(producer_id=1, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp_ms=NOW))
    assert lg.log_end_offset == 0


def test_a_producer_keeps_the_coordinator_epoch_of_its_last_marker(tmp_path: Path) -> None:
    """DescribeProducers' coordinator_epoch (kafka-transactions describe-producers): -1 before
    any marker, then the epoch the last marker carries, on the leader and on a follower that
    copied it, after a clean restart (the snapshot) and after a crash (replayed from the log)."""
    lg = new_log(tmp_path / "l", cfg())
    append(lg, txn_batch(7, 0, b"a"))
    assert lg.producer_state.producers[7].coordinator_epoch == -1
    lg.append_marker(producer_id=7, producer_epoch=0, commit=True, coordinator_epoch=3, leader_epoch=0, now_ms=NOW)
    assert lg.producer_state.producers[7].coordinator_epoch == 3
    follower = new_log(tmp_path / "f", cfg())
    follower.append_as_follower(lg.read(0, 1 << 20, lg.log_end_offset, min_one_batch=True), now_ms=NOW)
    assert follower.producer_state.producers[7].coordinator_epoch == 3
    state = lg.close()
    lg = reopen(tmp_path / "l", cfg(), recovery_point=state["log_end_offset"], clean_state=state)
    assert lg.producer_state.producers[7].coordinator_epoch == 3
    crash(lg)
    for snapshot in (tmp_path / "l").rglob("*.snapshot"):
        snapshot.unlink()
    lg = reopen(tmp_path / "l", cfg(), recovery_point=0)
    assert lg.producer_state.producers[7].coordinator_epoch == 3
