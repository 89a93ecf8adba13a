"""Share sessions (KIP-932), sans-IO: the partitions a share consumer fetches from one broker,
keyed by (group id, member id), and the session epoch ShareFetch and ShareAcknowledge share.

ShareFetch with epoch 0 opens a session (dropping the member's previous one, whose acquired
records the shell releases), naming its partitions; epoch N > 0 must be the session's next
epoch (else INVALID_SHARE_SESSION_EPOCH; SHARE_SESSION_NOT_FOUND without a session), adds the
request's partitions, forgets its ForgottenTopicsData, and the session's next epoch becomes
N + 1 (INT32_MAX wraps to 1); epoch -1 closes it. ShareAcknowledge follows the same rules but
cannot open a session (epoch 0: INVALID_SHARE_SESSION_EPOCH) nor change its partitions. A
broker holds at most `group.share.max.share.sessions` sessions (SHARE_SESSION_LIMIT_REACHED),
and a connection that closes takes its sessions with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cluster.protocol.errors import ErrorCode

MAX_SHARE_SESSIONS_DEFAULT = 2_000  # group.share.max.share.sessions
INT32_MAX = 2**31 - 1
SESSION_PARTITIONS_MAX = 100_000

SharePartitionKey = tuple[str, int]
"""(topic id, partition)."""


@dataclass
class ShareSession:
    group_id: str
    member_id: str
    connection: object
    next_epoch: int = 1
    partitions: set[SharePartitionKey] = field(default_factory=set)


@dataclass(frozen=True)
class SessionUpdate:
    """What a request did to the sessions: the session to serve (None: an error or a close),
    the error, and the partitions whose records `member_id` holds must be released (a
    session closed, or replaced by a new one)."""

    session: ShareSession | None
    error: ErrorCode = ErrorCode.none
    released: tuple[tuple[str, str, frozenset[SharePartitionKey]], ...] = ()
    """(group id, member id, partitions) to release."""


@dataclass
class ShareSessionCache:
    max_sessions: int = MAX_SHARE_SESSIONS_DEFAULT
    _sessions: dict[tuple[str, str], ShareSession] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, group_id: str, member_id: str) -> ShareSession | None:
        return self._sessions.get((group_id, member_id))

    def fetch(self, group_id: str, member_id: str, epoch: int, connection: object,
              add: Iterable[SharePartitionKey] = (), forget: Iterable[SharePartitionKey] = ()) -> SessionUpdate:
        """A ShareFetch's session step."""
        key = (group_id, member_id)
        if epoch == 0:
            released = self._drop(key)
            if len(self._sessions) >= self.max_sessions:
                return SessionUpdate(None, ErrorCode.share_session_limit_reached, released)
            wanted = set(add)
            if len(wanted) > SESSION_PARTITIONS_MAX:
                return SessionUpdate(None, ErrorCode.invalid_request, released)
            session = self._sessions[key] = ShareSession(group_id, member_id, connection, 1, wanted)
            return SessionUpdate(session, ErrorCode.none, released)
        return self._step(key, epoch, add, forget)

    def acknowledge(self, group_id: str, member_id: str, epoch: int) -> SessionUpdate:
        """A ShareAcknowledge's session step."""
        if epoch == 0:
            return SessionUpdate(None, ErrorCode.invalid_share_session_epoch)
        return self._step((group_id, member_id), epoch, (), ())

    def _step(self, key: tuple[str, str], epoch: int, add: Iterable[SharePartitionKey],
              forget: Iterable[SharePartitionKey]) -> SessionUpdate:
        session = self._sessions.get(key)
        if session is None:
            return SessionUpdate(None, ErrorCode.share_session_not_found)
        if epoch == -1:
            return SessionUpdate(session, ErrorCode.none, self._drop(key))
        if epoch != session.next_epoch:
            return SessionUpdate(None, ErrorCode.invalid_share_session_epoch)
        grown = (session.partitions | set(add)) - set(forget)
        if len(grown) > SESSION_PARTITIONS_MAX:
            return SessionUpdate(None, ErrorCode.invalid_request)
        session.partitions = grown
        session.next_epoch = 1 if epoch == INT32_MAX else epoch + 1
        return SessionUpdate(session)

    def _drop(self, key: tuple[str, str]) -> tuple[tuple[str, str, frozenset[SharePartitionKey]], ...]:
        session = self._sessions.pop(key, None)
        if session is None:
            return ()
        return ((session.group_id, session.member_id, frozenset(session.partitions)),)

    def in_use(self, group_id: str, key: SharePartitionKey) -> bool:
        """Whether some session of the group fetches from the partition (a walk over the
        sessions, at most `max_sessions`: done when a session ends, not per request)."""
        return any(s.group_id == group_id and key in s.partitions for s in self._sessions.values())

    def connection_closed(self, connection: object) -> list[tuple[str, str, frozenset[SharePartitionKey]]]:
        """The sessions opened on a closed connection, removed: their members' records to release."""
        gone = [key for key, s in self._sessions.items() if s.connection is connection]
        return [r for key in gone for r in self._drop(key)]
