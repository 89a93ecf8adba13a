"""Share sessions (cluster/groups/share_session.py): epochs as Kafka's share session cache
checks them for ShareFetch and ShareAcknowledge, partitions added and forgotten, the limit,
and the records to release when a session closes, is replaced or loses its connection."""

from __future__ import annotations

from cluster.groups.share_session import INT32_MAX, ShareSessionCache
from cluster.protocol.errors import ErrorCode

T = "AAAAAAAAAAAAAAAAAAAAAQ"


def test_a_session_opens_steps_and_closes() -> None:
    cache = ShareSessionCache()
    conn = object()
    assert cache.fetch("g", "m", 1, conn).error == ErrorCode.share_session_not_found
    opened = cache.fetch("g", "m", 0, conn, add=[(T, 0), (T, 1)])
    assert opened.error == ErrorCode.none and opened.session is not None and opened.released == ()
    assert opened.session.partitions == {(T, 0), (T, 1)} and opened.session.next_epoch == 1
    assert cache.fetch("g", "m", 2, conn).error == ErrorCode.invalid_share_session_epoch
    step = cache.fetch("g", "m", 1, conn, add=[(T, 2)], forget=[(T, 0)])
    assert step.session is not None and step.session.partitions == {(T, 1), (T, 2)} and step.session.next_epoch == 2
    assert cache.acknowledge("g", "m", 0).error == ErrorCode.invalid_share_session_epoch  # cannot open one
    assert cache.acknowledge("g", "m", 2).session is not None  # the epoch is shared with ShareFetch
    assert cache.fetch("g", "m", 2, conn).error == ErrorCode.invalid_share_session_epoch
    closed = cache.acknowledge("g", "m", -1)
    assert closed.error == ErrorCode.none and closed.released == (("g", "m", frozenset({(T, 1), (T, 2)})),)
    assert cache.get("g", "m") is None and cache.acknowledge("g", "m", -1).error == ErrorCode.share_session_not_found


def test_a_new_session_replaces_the_old_one_and_releases_its_records() -> None:
    cache = ShareSessionCache()
    cache.fetch("g", "m", 0, object(), add=[(T, 0)])
    again = cache.fetch("g", "m", 0, object(), add=[(T, 3)])
    assert again.released == (("g", "m", frozenset({(T, 0)})),)
    assert again.session is not None and again.session.partitions == {(T, 3)}


def test_the_limit_the_epoch_wrap_and_closed_connections() -> None:
    cache = ShareSessionCache(max_sessions=2)
    a, b = object(), object()
    cache.fetch("g", "m1", 0, a, add=[(T, 0)])
    cache.fetch("g", "m2", 0, b, add=[(T, 1)])
    assert cache.fetch("g", "m3", 0, a).error == ErrorCode.share_session_limit_reached
    session = cache.get("g", "m1")
    assert session is not None
    session.next_epoch = INT32_MAX
    assert cache.fetch("g", "m1", INT32_MAX, a).session is not None and session.next_epoch == 1
    assert cache.connection_closed(a) == [("g", "m1", frozenset({(T, 0)}))]
    assert len(cache) == 1 and cache.get("g", "m2") is not None
