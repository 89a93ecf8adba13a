"""LeaderEpochFileCache: which leader epoch started at which offset (KIP-101)."""

from __future__ import annotations

import logging
from pathlib import Path

from cluster.protocol.sentinels import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from cluster.storage.checkpoint import write_atomic

log = logging.getLogger(__name__)


class LeaderEpochCache:
    """Ordered (epoch, start_offset) entries, persisted to `leader-epoch-checkpoint`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[tuple[int, int]] = []

    def load(self) -> None:
        self.entries = []
        if not self.path.exists():
            return
        try:
            lines = self.path.read_text().split()
            version, count = int(lines[0]), int(lines[1])
            if version != 0 or len(lines) != 2 + 2 * count:
                raise ValueError("bad header")
            for i in range(count):
                self.entries.append((int(lines[2 + 2 * i]), int(lines[3 + 2 * i])))
        except (ValueError, IndexError) as exc:
            log.warning("ignoring corrupt %s (%s); rebuilding from batches", self.path, exc)
            self.entries = []

    def persist(self) -> None:
        body = f"0\n{len(self.entries)}\n" + "".join(f"{e} {o}\n" for e, o in self.entries)
        write_atomic(self.path, body.encode(), fsync=False)

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else UNDEFINED_EPOCH

    def start_offset_of(self, epoch: int) -> int:
        """Where `epoch` started in this log (-1: not an epoch of this log)."""
        for e, start in reversed(self.entries):
            if e == epoch:
                return start
            if e < epoch:
                break
        return UNDEFINED_OFFSET

    def assign(self, epoch: int, start_offset: int, *, persist: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset`, if it is newer than the latest."""
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        self.entries.append((epoch, start_offset))
        if persist:
            self.persist()
        return True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest epoch ≤ requested, its end offset) as OffsetForLeaderEpoch answers."""
        if not self.entries or epoch < self.entries[0][0]:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch >= self.entries[-1][0]:
            return self.entries[-1][0], log_end_offset
        found = UNDEFINED_EPOCH
        for i, (e, _) in enumerate(self.entries):
            if e > epoch:
                return found, self.entries[i][1]
            found = e
        return self.entries[-1][0], log_end_offset

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop epochs that start at or after `end_offset` (the log was cut there)."""
        kept = [(e, o) for e, o in self.entries if o < end_offset]
        if kept != self.entries:
            self.entries = kept
            self.persist()
