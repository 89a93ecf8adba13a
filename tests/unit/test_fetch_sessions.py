"""Incremental fetch sessions (KIP-227): the leader's cache and the follower's bookkeeping."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

from cluster.protocol.errors import ErrorCode
from cluster.protocol.fetch_session import FetcherSession
from cluster.replication.fetch_sessions import FetchSessionCache


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
    # Full of young sessions of the same rank: the third follower goes on sessionless.
    assert cache.open(request(0, 0, {}), replica_id=3) == (None, True, ErrorCode.none)
    assert len(cache) == 2 and cache.evictions == 0
    assert first is not None
    assert cache.open(request(first.session_id, 1, {}), replica_id=1)[2] == ErrorCode.fetch_session_id_not_found
    assert FetchSessionCache(max_sessions=0).open(request(0, 0, {}), replica_id=1) == (None, True, ErrorCode.none)


def consumer(cache: FetchSessionCache, req: Any, who: str = "User:alice", now_ms: int = 0,
             by_topic_id: bool = False) -> tuple[Any, bool, int]:
    return cache.open(req, owner=("principal", who), privileged=False, by_topic_id=by_topic_id, now_ms=now_ms)


def test_consumer_sessions_belong_to_their_principal_and_close_on_request() -> None:
    cache = FetchSessionCache(rng=random.Random(4))
    one, full, _ = consumer(cache, request(0, 0, {("t", 0): 0}))
    two, _, _ = consumer(cache, request(0, 0, {("t", 1): 0}))  # the same principal: a second session
    assert one is not None and two is not None and full and len(cache) == 2 and not one.privileged
    assert consumer(cache, request(one.session_id, 1, {}), who="User:mallory")[2] == ErrorCode.fetch_session_id_not_found
    again, full, error = consumer(cache, request(one.session_id, 1, {}))
    assert again is one and not full and error == ErrorCode.none
    # Epoch -1 closes the session and answers sessionless; (0, -1) is sessionless from the start.
    assert consumer(cache, request(one.session_id, -1, {("t", 0): 0})) == (None, True, ErrorCode.none)
    assert cache.get(one.session_id) is None and len(cache) == 1
    assert consumer(cache, request(0, -1, {("t", 0): 0})) == (None, True, ErrorCode.none) and len(cache) == 1
    # Epoch 0 with an id closes that session and opens another; another principal cannot close it.
    assert consumer(cache, request(two.session_id, 0, {}), who="User:mallory")[0] is not None
    assert cache.get(two.session_id) is two
    three, _, _ = consumer(cache, request(two.session_id, 0, {("t", 1): 4}))
    assert three is not None and three is not two and cache.get(two.session_id) is None


def test_sessions_by_topic_id_forget_by_id_and_refuse_names() -> None:
    cache = FetchSessionCache(rng=random.Random(5))
    tid = "9f3c0000-0000-0000-0000-000000000001"
    req = request(0, 0, {})
    req.topics = [SimpleNamespace(topic_id=tid, partitions=[
        SimpleNamespace(partition=i, fetch_offset=0, partition_max_bytes=1024) for i in (0, 1)])]
    session, _, _ = consumer(cache, req, by_topic_id=True)
    assert session is not None and list(session.partitions) == [(tid, 0), (tid, 1)]
    forget = request(session.session_id, 1, {})
    forget.forgotten_topics_data = [SimpleNamespace(topic_id=tid, partitions=[0])]
    consumer(cache, forget, by_topic_id=True)
    assert list(session.partitions) == [(tid, 1)]
    # A session opened by ids used by names (a client that changed versions) is an error.
    assert consumer(cache, request(session.session_id, 2, {}))[2] == ErrorCode.fetch_session_topic_id_error


def test_answered_partitions_are_read_last_and_errors_are_sent_again() -> None:
    cache = FetchSessionCache(rng=random.Random(6))
    session, full, _ = consumer(cache, request(0, 0, {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}))
    assert session is not None
    session.answered([("t", 0)])
    assert list(session.partitions) == [("t", 1), ("t", 2), ("t", 0)]
    assert session.include(("t", 1), answer(5), full)
    assert session.include(("t", 1), answer(-1, error=ErrorCode.topic_authorization_failed), False)
    assert session.include(("t", 1), answer(5), False)  # allowed again: sent though unchanged since
    assert not session.include(("t", 1), answer(5), False)
    session.resend()  # a throttled answer was dropped
    assert session.include(("t", 1), answer(5), False)


def test_eviction_follows_kafkas_ranks() -> None:
    """Kafka's FetchSessionCacheShard.tryEvict: stale first; else a follower outranks a
    consumer, a bigger session a smaller one older than the eviction time."""
    cache = FetchSessionCache(max_sessions=2, rng=random.Random(7), eviction_ms=1000)
    small, _, _ = consumer(cache, request(0, 0, {("t", 0): 0}), now_ms=0)
    big, _, _ = consumer(cache, request(0, 0, {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}), now_ms=0)
    assert small is not None and big is not None
    # Young sessions: a bigger consumer session cannot take a place; a follower's can.
    bigger = request(0, 0, {("u", i): 0 for i in range(5)})
    assert consumer(cache, bigger, now_ms=500) == (None, True, ErrorCode.none)
    follower, _, _ = cache.open(request(0, 0, {("t", 0): 0}), replica_id=1, now_ms=500)
    assert follower is not None and cache.get(small.session_id) is None and cache.evictions == 1
    # Older than the eviction time but in use: a bigger session evicts the smallest consumer one,
    # never the follower's; one of the same size does not.
    consumer(cache, request(big.session_id, 1, {}), now_ms=1400)
    cache.open(request(follower.session_id, 1, {}), replica_id=1, now_ms=1400)
    assert consumer(cache, request(0, 0, {("u", i): 0 for i in range(3)}), now_ms=1600)[0] is None
    assert consumer(cache, bigger, now_ms=1600)[0] is not None
    assert cache.get(big.session_id) is None and cache.get(follower.session_id) is follower
    # Unused for longer than the eviction time: any new session takes its place.
    late, _, _ = consumer(cache, request(0, 0, {}), now_ms=3000)
    assert late is not None and cache.get(follower.session_id) is None and cache.evictions == 3


def test_the_follower_lists_only_what_changed() -> None:
    fs = FetcherSession()
    wanted = {("t", 0): (5, 0, 3, 1024), ("t", 1): (7, 0, 3, 1024)}
    assert fs.build(wanted) == (0, 0, [("t", 0), ("t", 1)], [])
    fs.sent_ok(77, wanted, [("t", 0), ("t", 1)], [])
    wanted2 = {("t", 0): (9, 0, 3, 1024), ("t", 2): (0, 0, 3, 1024)}
    assert fs.build(wanted2) == (77, 1, [("t", 0), ("t", 2)], [("t", 1)])
    fs.sent_ok(77, wanted2, [("t", 0), ("t", 2)], [("t", 1)])
    assert fs.build(wanted2) == (77, 2, [], [])
    fs.sent_ok(0, wanted2, [], [])  # a leader without sessions: every fetch stays full
    assert fs.build(wanted2) == (0, 0, [("t", 0), ("t", 2)], [])


def test_the_partitions_cached_are_bounded_too() -> None:
    """A consumer may name topics that do not exist (v7-12) and add to its session fetch by
    fetch: past the cache's partition bound the session closes and the fetch is answered
    sessionless, so memory stays bounded whatever the client sends."""
    cache = FetchSessionCache(rng=random.Random(9), max_partitions=5)
    other, _, _ = cache.open(request(0, 0, {("t", 0): 0, ("t", 1): 0}), owner="alice", privileged=False)
    grown, _, _ = cache.open(request(0, 0, {("no-such", i): 0 for i in range(3)}), owner="mallory",
                             privileged=False)
    assert other is not None and grown is not None and cache.partitions_cached == 5
    session, full, error = cache.open(request(grown.session_id, 1, {("no-such", 3): 0}), owner="mallory",
                                      privileged=False)
    assert (session, full, error) == (None, True, ErrorCode.none)  # answered sessionless
    assert cache.partitions_cached == 2 and cache.get(grown.session_id) is None
    assert cache.open(request(grown.session_id, 2, {}), owner="mallory",
                      privileged=False)[2] == ErrorCode.fetch_session_id_not_found
    # A full fetch too big to cache opens no session; what fits still does.
    assert cache.open(request(0, 0, {("no-such", i): 0 for i in range(4)}), owner="mallory",
                      privileged=False) == (None, True, ErrorCode.none)
    again, _, _ = cache.open(request(other.session_id, 1, {("t", 2): 0}), owner="alice", privileged=False)
    assert again is other and len(other.partitions) == 3
