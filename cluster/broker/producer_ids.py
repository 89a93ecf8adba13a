"""Producer ids for InitProducerId, unique across restarts (blocks reserved on disk)."""

from __future__ import annotations

from pathlib import Path

from cluster.storage.checkpoint import write_atomic

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._next = 0
        self._block_end = 0

    def load(self) -> None:
        if self.path.exists():
            text = self.path.read_text().strip()
            try:
                self._next = int(text)
            except ValueError:
                raise ValueError(f"{self.path} is corrupt ({text[:40]!r}); it holds the next producer id block") from None
        # Ids below the reserved mark may have been handed out before a crash: skip them all.
        self._block_end = self._next

    def next_id(self) -> int:
        if self._next >= self._block_end:
            self._block_end = self._next + BLOCK_SIZE
            write_atomic(self.path, str(self._block_end).encode())
        pid = self._next
        self._next += 1
        return pid
