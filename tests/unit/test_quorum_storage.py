"""Durable quorum state (cluster/quorum/storage.py): round trips, torn tails, snapshots."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from cluster.quorum.raft import DurableState, Entry, RaftConfig, RaftNode, Role, Snapshot
from cluster.quorum.storage import LOG_FILE, SNAPSHOT_FILE, QuorumStorage


def entries(epoch: int, n: int, tag: str = "e") -> list[Entry]:
    return [Entry(epoch, f"{tag}-{epoch}-{i}".encode()) for i in range(n)]


def reload(d: Path) -> DurableState:
    store = QuorumStorage(d)
    try:
        return store.load()
    finally:
        store.close()


def test_round_trip_of_appends_truncation_and_votes(tmp_path: Path) -> None:
    store = QuorumStorage(tmp_path)
    state = store.load()
    assert (state.epoch, state.voted_for, state.entries) == (0, -1, [])
    state.epoch, state.voted_for = 3, 2
    state.entries.extend(entries(1, 5) + entries(3, 4))
    store.sync(state)
    got = reload(tmp_path)
    assert (got.epoch, got.voted_for, got.entries) == (3, 2, state.entries)
    # Truncate to 6 entries and append others of a later epoch in the same step.
    del state.entries[6:]
    state.entries.extend(entries(4, 3, "new"))
    state.epoch, state.voted_for = 4, -1
    store.sync(state)
    store.close()
    got = reload(tmp_path)
    assert got.entries == entries(1, 5) + entries(3, 1) + entries(4, 3, "new")
    assert (got.epoch, got.voted_for) == (4, -1)


@pytest.mark.parametrize("damage", ["cut", "flip", "garbage"])
def test_torn_or_corrupt_tail_is_cut_at_load(tmp_path: Path, damage: str) -> None:
    store = QuorumStorage(tmp_path)
    state = store.load()
    state.entries.extend(entries(1, 10))
    store.sync(state)
    store.close()
    path = tmp_path / LOG_FILE
    raw = bytearray(path.read_bytes())
    if damage == "cut":
        raw = raw[:-3]
    elif damage == "flip":
        raw[-2] ^= 0xFF
    else:
        raw += b"\x00\x00\x00\x05garbage"
    path.write_bytes(bytes(raw))
    got = reload(tmp_path)
    expected = entries(1, 9) if damage in ("cut", "flip") else entries(1, 10)
    assert got.entries == expected
    # The cut is durable: a second load reads the same and the file holds only whole records.
    assert reload(tmp_path).entries == expected


def test_snapshot_drops_the_log_prefix(tmp_path: Path) -> None:
    store = QuorumStorage(tmp_path)
    state = store.load()
    state.entries.extend(entries(1, 10))
    store.sync(state)
    size_before = (tmp_path / LOG_FILE).stat().st_size
    state.snapshot = Snapshot(7, 1, b"image-at-7")
    state.log_start_offset = 7
    state.entries = state.entries[7:]
    store.sync(state)
    store.close()
    assert (tmp_path / LOG_FILE).stat().st_size < size_before
    got = reload(tmp_path)
    assert got.log_start_offset == 7 and got.snapshot == Snapshot(7, 1, b"image-at-7")
    assert got.entries == entries(1, 10)[7:]


def test_crash_between_snapshot_and_log_rewrite_loses_nothing(tmp_path: Path) -> None:
    store = QuorumStorage(tmp_path)
    state = store.load()
    state.entries.extend(entries(2, 12))
    store.sync(state)
    store.close()
    log_before = (tmp_path / LOG_FILE).read_bytes()
    # Crash mid-snapshot: the snapshot file reached the disk, the log rewrite and the state
    # file did not (the same bytes sync() writes first).
    data = b"img"
    (tmp_path / SNAPSHOT_FILE).write_bytes(struct.pack(">qiI", 5, 2, crc32c(data)) + data)
    assert (tmp_path / LOG_FILE).read_bytes() == log_before
    got = reload(tmp_path)
    assert got.log_start_offset == 5 and got.snapshot == Snapshot(5, 2, b"img")
    assert got.entries == entries(2, 12)[5:]
    # The load finished the job: the log no longer holds the folded entries.
    assert len((tmp_path / LOG_FILE).read_bytes()) < len(log_before)
    assert reload(tmp_path).entries == entries(2, 12)[5:]


def test_a_voter_restarts_from_disk_with_its_log_and_vote(tmp_path: Path) -> None:
    store = QuorumStorage(tmp_path)
    node = RaftNode(1, [1], store.load(), RaftConfig(), random.Random(7), 0)
    node.tick(node.next_deadline_ms())  # a single voter elects itself
    assert node.role is Role.LEADER
    for i in range(50):
        node.propose(f"record-{i}".encode(), 10 + i)
        if node.dirty:
            store.sync(node.durable_state())
    store.close()
    restarted = RaftNode(1, [1], reload(tmp_path), RaftConfig(), random.Random(8), 1000)
    assert restarted.epoch == node.epoch and restarted.state.voted_for == 1
    assert restarted.state.entries == node.state.entries and restarted.log_end_offset == 51
