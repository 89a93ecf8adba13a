"""Incremental fetch sessions (KIP-227), both ends, sans-IO.

A fetcher that follows many partitions — a follower (every partition a leader broker leads
for it, with `__consumer_offsets` dozens) or a consumer of thousands — sees only a few of
them change between two fetches. In a session the fetcher lists only the partitions whose
fetch position changed and the leader answers only the partitions with something new
(records, a moved high watermark or log start, an error); the rest are remembered on both
sides.

Protocol, as Kafka (FetchRequest v7+, its FetchMetadata):

  session id | epoch | meaning
  0          | -1    | sessionless: a full fetch, nothing kept (librdkafka sends this)
  0          | 0     | a full fetch that opens a session (the answer carries its id)
  id         | 0     | close session id, then as (0, 0)
  id         | -1    | close session id, then sessionless
  id         | n > 0 | incremental: `topics` lists changes, `forgotten_topics_data` removals

An unknown session gets FETCH_SESSION_ID_NOT_FOUND, a wrong epoch INVALID_FETCH_SESSION_EPOCH
(the session is closed: guessing epochs gets nowhere), a session opened by topic names used
with topic ids (or back) FETCH_SESSION_TOPIC_ID_ERROR; the fetcher then opens a new one.

The cache is bounded (max.incremental.fetch.session.cache.slots) and evicts as Kafka's
FetchSessionCacheShard: when full, a new session takes the place of one unused for
EVICTION_MS, else of the least valuable one it outranks — (privileged, size): a follower's
session outranks any consumer's, a bigger one a smaller one — among sessions older than
EVICTION_MS (a follower may also evict a younger consumer session). If none, the fetch is
answered sessionless (session id 0) and the fetcher goes on with full fetches. A consumer
session belongs to the principal that opened it; another principal's use of its id is
FETCH_SESSION_ID_NOT_FOUND (Kafka does not check; ids are 31-bit random numbers). A follower
has one session per leader: opening one closes its others.

The partitions cached are bounded too (Kafka bounds only the sessions): a fetch may name
partitions that do not exist (FetchRequest v7-12 names topics), and incremental fetches add
to a session request by request. A fetch that would take the cache past MAX_PARTITIONS_CACHED
closes its session and is answered sessionless; the fetcher goes on with full fetches, each
bounded by the request size.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.protocol.errors import ErrorCode

# (topic, partition): the topic's name, or its id (str) in a session of FetchRequest v13+.
Key = tuple[str, int]

# Kafka's KafkaBroker.MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS: a session unused this long
# may be evicted by any new one; younger ones only by a follower's or a bigger one.
EVICTION_MS = 120_000
# Partitions all sessions may hold together (~200 bytes each): 100 consumers of 10,000.
MAX_PARTITIONS_CACHED = 1_000_000

SESSIONLESS_EPOCH = -1  # Kafka's FetchMetadata.FINAL_EPOCH
OPEN_EPOCH = 0  # FetchMetadata.INITIAL_EPOCH


class SessionPartition(NamedTuple):
    """What a fetch asks of one partition (the fields _read_partition reads)."""

    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int
    log_start_offset: int


@dataclass
class FetchSession:
    session_id: int
    owner: Hashable  # ("replica", broker id) or ("principal", name)
    privileged: bool  # a follower's
    by_topic_id: bool  # opened by FetchRequest v13+: partitions keyed by topic id
    created_ms: int
    last_used_ms: int
    next_epoch: int = 1
    # In the order they are read: a partition that was answered moves to the end, so a
    # response that fills max_bytes is not always filled by the same partitions (Kafka's).
    partitions: dict[Key, SessionPartition] = field(default_factory=dict)
    # Per partition, the (high watermark, log start) last sent: unchanged ones are left out.
    sent: dict[Key, tuple[int, int]] = field(default_factory=dict)

    def include(self, key: Key, response: dict[str, Any], full: bool) -> bool:
        """Should this partition's answer go out? Remembers what was sent. A partition with
        an error is always sent, and sent again when the error is gone."""
        error = response["error_code"] != ErrorCode.none
        state = (-1, -1) if error else (response["high_watermark"], response["log_start_offset"])
        changed = full or error or bool(response["records"]) or self.sent.get(key) != state \
            or response.get("preferred_read_replica", -1) >= 0
        if changed:
            self.sent[key] = state
        return changed

    def answered(self, keys: Iterable[Key]) -> None:
        """These partitions went out: read them last next time."""
        for key in keys:
            found = self.partitions.pop(key, None)
            if found is not None:
                self.partitions[key] = found

    def resend(self) -> None:
        """The answer was dropped (a throttled fetch): send every partition's state again."""
        self.sent.clear()


class FetchSessionCache:
    """The leader's sessions, bounded."""

    def __init__(self, max_sessions: int = 1000, rng: random.Random | None = None,
                 eviction_ms: int = EVICTION_MS, max_partitions: int = MAX_PARTITIONS_CACHED) -> None:
        self.max_sessions = max_sessions
        self.eviction_ms = eviction_ms
        self.max_partitions = max_partitions
        # Least recently used first.
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._rng = rng or random.Random()
        self.evictions = 0  # Kafka's IncrementalFetchSessionEvictionsPerSec, as a total

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def partitions_cached(self) -> int:
        """Kafka's NumIncrementalFetchPartitionsCached."""
        return sum(len(s.partitions) for s in self._sessions.values())

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def open(self, req: Any, replica_id: int | None = None, *, owner: Hashable | None = None,
             privileged: bool | None = None, by_topic_id: bool = False,
             now_ms: int = 0) -> tuple[FetchSession | None, bool, int]:
        """(session, is_full, error) for a fetch with session fields (v7+); the session's
        partitions are updated from the request. None with no error: answer sessionless.
        `replica_id` alone: a follower's fetch (owner and privilege from it)."""
        if owner is None:
            assert replica_id is not None
            owner = ("replica", replica_id)
        if privileged is None:
            privileged = replica_id is not None and replica_id >= 0
        session_id, epoch = req.session_id, req.session_epoch
        if epoch in (OPEN_EPOCH, SESSIONLESS_EPOCH):
            closing = self._sessions.get(session_id)
            if closing is not None and closing.owner == owner:
                del self._sessions[session_id]
            if epoch == SESSIONLESS_EPOCH or self.max_sessions <= 0:
                return None, True, ErrorCode.none
            if privileged:
                for sid in [s for s, sess in self._sessions.items() if sess.owner == owner]:
                    del self._sessions[sid]  # one fetcher per follower and leader: the old one is gone
            size = sum(len(t.partitions) for t in req.topics)
            if len(self._sessions) >= self.max_sessions and not self._evict_for(privileged, size, now_ms):
                return None, True, ErrorCode.none
            session_id = self._rng.randrange(1, 1 << 31)
            while session_id in self._sessions:
                session_id = self._rng.randrange(1, 1 << 31)
            session = self._sessions[session_id] = FetchSession(session_id, owner, privileged, by_topic_id,
                                                                now_ms, now_ms)
            full = True
        else:
            found = self._sessions.get(session_id)
            if found is None or found.owner != owner or epoch < 0:
                return None, False, ErrorCode.fetch_session_id_not_found
            if epoch != found.next_epoch:
                del self._sessions[session_id]
                return None, False, ErrorCode.invalid_fetch_session_epoch
            if found.by_topic_id != by_topic_id:
                del self._sessions[session_id]
                return None, False, ErrorCode.fetch_session_topic_id_error
            session = found
            self._sessions.move_to_end(session_id)
            session.last_used_ms = now_ms
            full = False
            for t in req.forgotten_topics_data or ():
                topic = str(t.topic_id) if by_topic_id else t.topic
                for p in t.partitions:
                    session.partitions.pop((topic, p), None)
                    session.sent.pop((topic, p), None)
        before = len(session.partitions)
        for t in req.topics:
            topic = str(t.topic_id) if by_topic_id else t.topic
            for fp in t.partitions:
                key = (topic, fp.partition)
                session.partitions.pop(key, None)  # a changed partition is read last, as a new one
                session.partitions[key] = SessionPartition(
                    fp.partition, fp.fetch_offset, fp.partition_max_bytes, getattr(fp, "current_leader_epoch", -1),
                    getattr(fp, "log_start_offset", -1))
        if len(session.partitions) > before and self.partitions_cached > self.max_partitions:
            del self._sessions[session.session_id]  # too many partitions cached: go on sessionless
            return None, True, ErrorCode.none
        session.next_epoch = 1 if full else session.next_epoch + 1
        return session, full, ErrorCode.none

    def _evict_for(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Make room for a new session (privileged, size), as Kafka's tryEvict: the least
        recently used session if it is stale, else the least valuable evictable one the new
        session outranks. False: no room."""
        oldest = next(iter(self._sessions.values()), None)
        if oldest is None:
            return False
        if now_ms - oldest.last_used_ms > self.eviction_ms:
            victim = oldest
        else:
            evictable = [s for s in self._sessions.values()
                         if now_ms - s.created_ms > self.eviction_ms or (privileged and not s.privileged)]
            if not evictable:
                return False
            victim = min(evictable, key=lambda s: (s.privileged, len(s.partitions), s.session_id))
            if (privileged, size) <= (victim.privileged, len(victim.partitions)):
                return False
        del self._sessions[victim.session_id]
        self.evictions += 1
        return True
