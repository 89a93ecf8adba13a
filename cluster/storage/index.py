"""Sparse per-segment indexes: offset → file position, and timestamp → offset.

Entries live in memory (two parallel arrays, searched with bisect) and are appended to
the index file as they are made. Offsets are stored relative to the segment's base
offset, as Kafka does. A file that fails the sanity check is rebuilt from the log.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from array import array
from collections import OrderedDict
from pathlib import Path

_OFFSET_ENTRY = struct.Struct(">II")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qI")  # timestamp ms, relative offset


class CorruptIndex(ValueError):
    """An index file whose contents do not fit its segment; the segment rebuilds it."""


INDEX_DESCRIPTORS_MAX = 2048
"""Index files (offset and time) of a process with an open descriptor at once; writing to
another closes the least recently written one."""

_open_lock = threading.Lock()
_open_files: OrderedDict[int, _IndexFile] = OrderedDict()  # least recently written first


class _IndexFile:
    """The file under an index: entries appended as they are made, fsync, close. Its
    descriptor is opened at the first write, and at most INDEX_DESCRIPTORS_MAX index files
    keep theirs: a broker of 10,000 partitions with index entries held three descriptors each
    (log, offset index, time index; Kafka one: its indexes are memory-mapped) and ran out of
    them (EMFILE at 20,000). A file whose descriptor was closed with unsynced entries is
    opened again for its fsync at the next flush."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._fd = -1
        self._unsynced = False  # written since the last fsync

    def open(self) -> None:
        """The file exists (created empty if it did not); the descriptor waits for a write."""
        if not self.path.exists():
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))

    def _writable(self) -> int:
        with _open_lock:
            if self._fd >= 0:
                _open_files.move_to_end(id(self))
                return self._fd
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            _open_files[id(self)] = self
            while len(_open_files) > INDEX_DESCRIPTORS_MAX:
                _, oldest = _open_files.popitem(last=False)
                oldest._close_descriptor()
            return self._fd

    def _close_descriptor(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _written(self) -> None:
        self._unsynced = True

    def _read_entries(self, entry_size: int) -> bytes:
        data = self.path.read_bytes() if self.path.exists() else b""
        if len(data) % entry_size:
            raise CorruptIndex(f"{self.path}: size {len(data)} is not a multiple of {entry_size}")
        return data

    def _truncate_file(self, entries: int, entry_size: int) -> None:
        os.ftruncate(self._writable(), entries * entry_size)
        self._written()

    def flush(self) -> None:
        """fsync what was written (runs in a flush thread while the event loop appends)."""
        if not self._unsynced:
            return
        self._unsynced = False
        # A descriptor of our own: the shared one may be closed meanwhile (more index files
        # written than kept open) and its number given to another file.
        with _open_lock:
            fd = os.dup(self._fd) if self._fd >= 0 else -1
        if fd < 0:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                return  # deleted meanwhile
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        with _open_lock:
            _open_files.pop(id(self), None)
            self._close_descriptor()


class OffsetIndex(_IndexFile):
    """Maps the last offset of an indexed batch to the file position where it starts."""

    entry_size = _OFFSET_ENTRY.size

    def __init__(self, path: Path, base_offset: int, max_entries: int) -> None:
        super().__init__(path, base_offset)
        self.max_entries = max_entries
        self._offsets = array("I")
        self._positions = array("I")

    def load(self, log_size_bytes: int) -> None:
        """Read the file and check it against the segment; raises CorruptIndex."""
        data = self._read_entries(self.entry_size)
        last_offset = -1
        last_position = -1
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            if rel <= last_offset and last_offset >= 0 or pos <= last_position or pos >= log_size_bytes:
                raise CorruptIndex(f"{self.path}: entry ({rel}, {pos}) out of order or past the log")
            self._offsets.append(rel)
            self._positions.append(pos)
            last_offset, last_position = rel, pos

    def reset(self) -> None:
        self._offsets = array("I")
        self._positions = array("I")
        self._truncate_file(0, self.entry_size)

    @property
    def is_full(self) -> bool:
        return len(self._offsets) >= self.max_entries

    @property
    def entries(self) -> int:
        return len(self._offsets)

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        assert not self._offsets or rel > self._offsets[-1], "offset index must grow"
        self._offsets.append(rel)
        self._positions.append(position)
        os.write(self._writable(), _OFFSET_ENTRY.pack(rel, position))
        self._written()

    def lookup(self, offset: int) -> int:
        """Position of the last indexed batch whose last offset is ≤ offset (0 if none)."""
        i = bisect.bisect_right(self._offsets, offset - self.base_offset) - 1
        return self._positions[i] if i >= 0 else 0

    def truncate_to_position(self, position: int) -> None:
        """Drop entries at or past `position` (log truncation)."""
        keep = bisect.bisect_left(self._positions, position)
        del self._offsets[keep:]
        del self._positions[keep:]
        self._truncate_file(keep, self.entry_size)


class TimeIndex(_IndexFile):
    """Maps a max timestamp seen so far to the offset of the batch that carried it."""

    entry_size = _TIME_ENTRY.size

    def __init__(self, path: Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._timestamps = array("q")
        self._offsets = array("I")

    def load(self, next_offset_max: int) -> None:
        data = self._read_entries(self.entry_size)
        last_ts = None
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            if (last_ts is not None and ts <= last_ts) or self.base_offset + rel >= next_offset_max:
                raise CorruptIndex(f"{self.path}: entry ({ts}, {rel}) out of order or past the log")
            self._timestamps.append(ts)
            self._offsets.append(rel)
            last_ts = ts

    def reset(self) -> None:
        self._timestamps = array("q")
        self._offsets = array("I")
        self._truncate_file(0, self.entry_size)

    @property
    def last_timestamp(self) -> int:
        return self._timestamps[-1] if self._timestamps else -1

    @property
    def last_offset(self) -> int:
        return self.base_offset + self._offsets[-1] if self._offsets else self.base_offset

    def maybe_append(self, timestamp: int, offset: int) -> None:
        if timestamp > self.last_timestamp:
            self._timestamps.append(timestamp)
            self._offsets.append(offset - self.base_offset)
            os.write(self._writable(), _TIME_ENTRY.pack(timestamp, offset - self.base_offset))
            self._written()

    def lookup(self, timestamp: int) -> int:
        """Offset of the last entry whose timestamp is ≤ the target (base offset if none)."""
        i = bisect.bisect_right(self._timestamps, timestamp) - 1
        return self.base_offset + self._offsets[i] if i >= 0 else self.base_offset

