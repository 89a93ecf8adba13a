"""Incremental fetch sessions (KIP-227): the leader's cache and the follower's bookkeeping."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from cluster.protocol.errors import ErrorCode
from cluster.replication.fetch_sessions import FetchSessionCache, FollowerSession


def request(session_id: int, epoch: int, listed: dict[tuple[str, int], int],
            forgotten: list[tuple[str, int]] = ()) -> Any:  # type: ignore[assignment]
    topics: dict[str, list[Any]] = {}
    for (topic, index), offset in listed.items():
        topics.setdefault(topic, []).append(SimpleNamespace(partition=index, fetch_offset=offset,
                                                            partition_max_bytes=1024, current_leader_epoch=3))
    gone: dict[str, list[int]] = {}
    for topic, index in forgotten:
        gone.setdefault(topic, []).append(index)
    return SimpleNamespace(session_id=session_id, session_epoch=epoch,
                           topics=[SimpleNamespace(topic=t, partitions=ps) for t, ps in topics.items()],
                           forgotten_topics_data=[SimpleNamespace(topic=t, partitions=ps) for t, ps in gone.items()])


def answer(hw: int, records: bytes = b"", error: int = ErrorCode.none) -> dict[str, Any]:
    return {"high_watermark": hw, "log_start_offset": 0, "records": records, "error_code": error}


def test_a_session_remembers_partitions_and_answers_only_changes() -> None:
    cache = FetchSessionCache(rng=random.Random(1))
    session, full, error = cache.open(request(0, 0, {("t", 0): 5, ("t", 1): 7, ("u", 0): 0}), replica_id=2)
    assert session is not None and full and error == ErrorCode.none and session.session_id > 0
    assert all(session.include(k, answer(5), full) for k in session.partitions)  # full: all go out
    # Epoch 1 lists only t-0 (new offset) and forgets u-0; t-1 is remembered as it was.
    again, full, error = cache.open(request(session.session_id, 1, {("t", 0): 9}, [("u", 0)]), replica_id=2)
    assert again is session and not full and error == ErrorCode.none
    assert {k: p.fetch_offset for k, p in session.partitions.items()} == {("t", 0): 9, ("t", 1): 7}
    assert not session.include(("t", 1), answer(5), full)  # nothing new
    assert session.include(("t", 1), answer(6), full)  # the high watermark moved
    assert session.include(("t", 0), answer(6, b"batch"), full)  # records
    assert session.include(("t", 0), answer(6, error=ErrorCode.not_leader_or_follower), full)


def test_wrong_epoch_unknown_session_and_other_replica_are_refused() -> None:
    cache = FetchSessionCache(rng=random.Random(2))
    session, _, _ = cache.open(request(0, 0, {("t", 0): 0}), replica_id=2)
    assert session is not None
    assert cache.open(request(session.session_id, 1, {}), replica_id=3)[2] == ErrorCode.fetch_session_id_not_found
    assert cache.open(request(session.session_id, 5, {}), replica_id=2)[2] == ErrorCode.invalid_fetch_session_epoch
    # A wrong epoch closes the session: the follower must open a new one.
    assert cache.open(request(session.session_id, 1, {}), replica_id=2)[2] == ErrorCode.fetch_session_id_not_found
    assert cache.open(request(12345, 1, {}), replica_id=2)[2] == ErrorCode.fetch_session_id_not_found


def test_the_cache_is_bounded_and_keeps_one_session_per_follower() -> None:
    cache = FetchSessionCache(max_sessions=2, rng=random.Random(3))
    first, _, _ = cache.open(request(0, 0, {}), replica_id=1)
    cache.open(request(0, 0, {}), replica_id=1)  # the same follower opening again replaces it
    assert len(cache) == 1
    cache.open(request(0, 0, {}), replica_id=2)
    cache.open(request(0, 0, {}), replica_id=3)  # evicts the least recently used
    assert len(cache) == 2
    assert first is not None
    assert cache.open(request(first.session_id, 1, {}), replica_id=1)[2] == ErrorCode.fetch_session_id_not_found
    assert FetchSessionCache(max_sessions=0).open(request(0, 0, {}), replica_id=1) == (None, True, ErrorCode.none)


def test_the_follower_lists_only_what_changed() -> None:
    fs = FollowerSession()
    wanted = {("t", 0): (5, 0, 3, 1024), ("t", 1): (7, 0, 3, 1024)}
    assert fs.build(wanted) == (0, 0, [("t", 0), ("t", 1)], [])
    fs.sent_ok(77, wanted, [("t", 0), ("t", 1)], [])
    wanted2 = {("t", 0): (9, 0, 3, 1024), ("t", 2): (0, 0, 3, 1024)}
    assert fs.build(wanted2) == (77, 1, [("t", 0), ("t", 2)], [("t", 1)])
    fs.sent_ok(77, wanted2, [("t", 0), ("t", 2)], [("t", 1)])
    assert fs.build(wanted2) == (77, 2, [], [])
    fs.sent_ok(0, wanted2, [], [])  # a leader without sessions: every fetch stays full
    assert fs.build(wanted2) == (0, 0, [("t", 0), ("t", 2)], [])
