"""The fetcher's end of an incremental fetch session (KIP-227), sans-IO: a follower's
replica fetcher (cluster/replication/fetcher.py) and a consumer (cluster/client/consumer.py)
list only the partitions whose fetch position changed since the leader last heard of them,
and tell it which to forget. The leader's end, and the protocol table, are in
cluster/replication/fetch_sessions.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# (topic, partition)
Key = tuple[str, int]


@dataclass
class FetcherSession:
    """The fetcher's end (a follower's, a consumer's): what the leader remembers of each
    partition — what was last listed for it (a follower: fetch offset, log start, leader
    epoch, max bytes; a consumer: fetch offset, max bytes)."""

    session_id: int = 0
    next_epoch: int = 0  # 0: the next fetch opens a session
    sent: dict[Key, tuple[int, ...]] = field(default_factory=dict)
    by_id: bool = False  # listed by topic id (FetchRequest v13+), kept across reset()

    def build(self, wanted: Mapping[Key, tuple[int, ...]]) -> tuple[int, int, list[Key], list[Key]]:
        """(session_id, session_epoch, partitions to list, partitions to forget) for a fetch of
        `wanted` (key → what is listed for it)."""
        if self.next_epoch == 0:
            return self.session_id, 0, list(wanted), []
        changed = [k for k, v in wanted.items() if self.sent.get(k) != v]
        forgotten = [k for k in self.sent if k not in wanted]
        return self.session_id, self.next_epoch, changed, forgotten

    def sent_ok(self, session_id: int, wanted: Mapping[Key, tuple[int, ...]], listed: list[Key],
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
