"""Incremental fetch sessions (KIP-227) for follower fetches, both ends, sans-IO.

A follower follows every partition a leader broker leads for it (with `__consumer_offsets`,
dozens), but between two fetches usually only a few change. In a session the follower lists
only the partitions whose fetch position changed and the leader answers only the partitions
with something new (records, a moved high watermark or log start, an error); the rest are
remembered on both sides. Only follower fetches (replica_id ≥ 0) get sessions: consumers are
answered sessionless (session id 0), which every Kafka client accepts.

Protocol, as Kafka: session_epoch 0 opens a session (a full fetch; the answer carries the new
session id); then epochs 1, 2, … each list changes (`topics`) and removals
(`forgotten_topics_data`); an unknown session gets FETCH_SESSION_ID_NOT_FOUND, a wrong epoch
INVALID_FETCH_SESSION_EPOCH, and the follower opens a new one.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.protocol.errors import ErrorCode

Key = tuple[str, int]


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
    replica_id: int
    next_epoch: int = 1
    partitions: dict[Key, SessionPartition] = field(default_factory=dict)
    # Per partition, the (high watermark, log start) last sent: unchanged ones are left out.
    sent: dict[Key, tuple[int, int]] = field(default_factory=dict)

    def include(self, key: Key, response: dict[str, Any], full: bool) -> bool:
        """Should this partition's answer go out? Remembers what was sent."""
        state = (response["high_watermark"], response["log_start_offset"])
        changed = full or response["error_code"] != ErrorCode.none or bool(response["records"]) \
            or self.sent.get(key) != state
        if changed:
            self.sent[key] = state
        return changed


class FetchSessionCache:
    """The leader's sessions, bounded (least recently used evicted first); one per follower."""

    def __init__(self, max_sessions: int = 1000, rng: random.Random | None = None) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self._rng = rng or random.Random()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, req: Any, replica_id: int) -> tuple[FetchSession | None, bool, int]:
        """(session, is_full, error) for a follower fetch with session fields set; the
        session's partitions are updated from the request."""
        if self.max_sessions <= 0:
            return None, True, ErrorCode.none  # sessions disabled: answer sessionless
        if req.session_epoch == 0:
            self._sessions.pop(req.session_id, None)
            for sid in [s for s, sess in self._sessions.items() if sess.replica_id == replica_id]:
                del self._sessions[sid]  # one fetcher per follower and leader: the old one is gone
            while len(self._sessions) >= self.max_sessions:
                self._sessions.popitem(last=False)
            session_id = self._rng.randrange(1, 1 << 31)
            while session_id in self._sessions:
                session_id = self._rng.randrange(1, 1 << 31)
            session = self._sessions[session_id] = FetchSession(session_id, replica_id)
            full = True
        else:
            found = self._sessions.get(req.session_id)
            if found is None or found.replica_id != replica_id:
                return None, False, ErrorCode.fetch_session_id_not_found
            if req.session_epoch != found.next_epoch:
                del self._sessions[req.session_id]
                return None, False, ErrorCode.invalid_fetch_session_epoch
            session = found
            self._sessions.move_to_end(req.session_id)
            full = False
            for t in req.forgotten_topics_data or ():
                for p in t.partitions:
                    session.partitions.pop((t.topic, p), None)
                    session.sent.pop((t.topic, p), None)
        for t in req.topics:
            for fp in t.partitions:
                session.partitions[(t.topic, fp.partition)] = SessionPartition(
                    fp.partition, fp.fetch_offset, fp.partition_max_bytes, getattr(fp, "current_leader_epoch", -1),
                    getattr(fp, "log_start_offset", -1))
        session.next_epoch = 1 if full else session.next_epoch + 1
        return session, full, ErrorCode.none


@dataclass
class FollowerSession:
    """The follower's end: what the leader remembers of each partition."""

    session_id: int = 0
    next_epoch: int = 0  # 0: the next fetch opens a session
    sent: dict[Key, tuple[int, int, int, int]] = field(default_factory=dict)

    def build(self, wanted: dict[Key, tuple[int, int, int, int]]) -> tuple[int, int, list[Key], list[Key]]:
        """(session_id, session_epoch, partitions to list, partitions to forget) for a fetch of
        `wanted` (key → (fetch offset, log start, leader epoch, max bytes))."""
        if self.next_epoch == 0:
            return self.session_id, 0, list(wanted), []
        changed = [k for k, v in wanted.items() if self.sent.get(k) != v]
        forgotten = [k for k in self.sent if k not in wanted]
        return self.session_id, self.next_epoch, changed, forgotten

    def sent_ok(self, session_id: int, wanted: dict[Key, tuple[int, int, int, int]], listed: list[Key],
                forgotten: list[Key]) -> None:
        """The leader accepted the fetch."""
        if session_id == 0:
            # The leader keeps no session: every fetch stays full.
            self.session_id, self.next_epoch, self.sent = 0, 0, {}
            return
        if self.next_epoch == 0:
            self.sent = {}
        self.session_id = session_id
        self.next_epoch += 1
        for k in forgotten:
            self.sent.pop(k, None)
        for k in listed:
            self.sent[k] = wanted[k]

    def reset(self) -> None:
        self.session_id, self.next_epoch, self.sent = 0, 0, {}
