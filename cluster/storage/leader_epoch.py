"""LeaderEpochFileCache: which leader epoch started at which offset (KIP-101)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from cluster.protocol.sentinels import UNDEFINED_EPOCH, UNDEFINED_OFFSET
from cluster.storage.checkpoint import write_atomic

log = logging.getLogger(__name__)


class LeaderEpochCache:
    """Ordered (epoch, start_offset) entries, persisted to `leader-epoch-checkpoint`.

    A new epoch (`assign`) is written later, not at once (Kafka's KAFKA-15046 took the
    write off the request path too): becoming leader of 10,000 partitions wrote 10,000 files
    in the event loop, ~10 s during which the broker missed its heartbeats. `write` runs in a
    worker thread (the replica manager's after a reconcile, the log flush before the recovery
    point moves, close): what lies below the recovery point is in the file by the time the
    recovery point says so, and recovery rebuilds what lies above it from the batches. A
    truncation writes at once (`persist`). Writes from two threads never put an older list
    over a newer one: each write takes its snapshot under the file's lock.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[tuple[int, int]] = []
        self._version = 0  # bumped on every change of `entries`
        self._written_version = 0
        self._synced_version = 0
        self._lock = threading.Lock()

    @property
    def dirty(self) -> bool:
        return self._written_version != self._version

    def load(self) -> None:
        self.entries = []
        self._version = self._written_version = self._synced_version = 0
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

    def replace_entries(self, entries: list[tuple[int, int]]) -> None:
        self.entries = entries
        self._version += 1

    def mark_written(self) -> None:
        """The file holds the entries as they are (loaded, then rebuilt the same)."""
        self._written_version = self._synced_version = self._version

    def persist(self) -> None:
        """Write the entries now (a truncation, recovery)."""
        self._version += 1
        self.write(fsync=False)

    def write(self, *, fsync: bool) -> None:
        """Write the entries if they changed since the last write (and fsync them if asked
        and not yet synced); safe from a worker thread beside the event loop's changes."""
        with self._lock:
            version, entries = self._version, list(self.entries)
            if version == self._written_version and (not fsync or version == self._synced_version):
                return
            body = f"0\n{len(entries)}\n" + "".join(f"{e} {o}\n" for e, o in entries)
            try:
                write_atomic(self.path, body.encode(), fsync=fsync)
            except FileNotFoundError:
                if self.path.parent.exists():
                    raise
                return  # the log was deleted meanwhile
            self._written_version = version
            if fsync:
                self._synced_version = version

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

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`, if it is newer than the latest (written
        with the next `write`)."""
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        self.entries = [*self.entries, (epoch, start_offset)]
        self._version += 1
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

    def truncate_from_end(self, end_offset: int, *, persist: bool = True) -> None:
        """Drop epochs that start at or after `end_offset` (the log was cut there); written at
        once unless `persist` is false (recovery: see Log._load)."""
        kept = [(e, o) for e, o in self.entries if o < end_offset]
        if kept != self.entries:
            self.replace_entries(kept)
            if persist:
                self.write(fsync=False)
