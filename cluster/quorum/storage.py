"""Durable state of a quorum voter: `quorum-state`, the metadata log and its snapshot.

`sync(state)` makes the disk match a RaftNode's DurableState (the driver calls it before
sending the node's messages): vote and epoch are rewritten atomically, log entries are
appended (or the file cut back where the node truncated), then fsynced. Each log record
is `length u32 | crc32c u32 | offset i64 | epoch i32 | data` (the CRC covers offset on);
a torn or corrupt tail is cut at load, and records the snapshot already covers are skipped,
so a crash between writing a snapshot and rewriting the log loses nothing.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import orjson
from crc32c import crc32c

from cluster.quorum.raft import NO_LEADER, DurableState, Entry, Snapshot
from cluster.storage.checkpoint import write_atomic

log = logging.getLogger(__name__)

STATE_FILE = "quorum-state"
LOG_FILE = "metadata.log"
SNAPSHOT_FILE = "metadata.snapshot"
_RECORD = struct.Struct(">IIqi")
MAX_ENTRY_BYTES = 8 << 20


class QuorumStorage:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self._fd = -1
        self._stored: list[Entry] = []  # what the log file holds, in order
        self._positions: list[int] = []  # file position of each stored entry
        self._size = 0
        self._epoch = -1
        self._voted_for = NO_LEADER
        self._log_start = 0
        self._snapshot: Snapshot | None = None

    # ---- load --------------------------------------------------------------------------

    def load(self) -> DurableState:
        self.dir.mkdir(parents=True, exist_ok=True)
        state = DurableState()
        path = self.dir / STATE_FILE
        if path.exists():
            doc = orjson.loads(path.read_bytes())
            state.epoch = int(doc["epoch"])
            state.voted_for = int(doc["voted_for"])
            state.log_start_offset = int(doc["log_start_offset"])
        snap_path = self.dir / SNAPSHOT_FILE
        if snap_path.exists():
            raw = snap_path.read_bytes()
            end_offset, last_epoch, crc = struct.unpack_from(">qiI", raw, 0)
            data = raw[16:]
            if crc32c(data) != crc:
                raise ValueError(f"{snap_path} is corrupt (CRC mismatch); restore it from another voter")
            state.snapshot = Snapshot(end_offset, last_epoch, data)
            state.log_start_offset = max(state.log_start_offset, end_offset)
        self._fd = os.open(self.dir / LOG_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        raw = os.pread(self._fd, size, 0)
        pos = 0
        kept_from = 0
        while pos + _RECORD.size <= size:
            length, crc, offset, epoch = _RECORD.unpack_from(raw, pos)
            end = pos + _RECORD.size + length
            if length > MAX_ENTRY_BYTES or end > size or crc32c(raw[pos + 8 : end]) != crc:
                break
            expected = state.log_start_offset + len(state.entries)
            if offset < state.log_start_offset:
                kept_from = end  # folded into the snapshot
            elif offset != expected:
                break
            else:
                state.entries.append(Entry(epoch, bytes(raw[pos + _RECORD.size : end])))
                self._positions.append(pos)
            pos = end
        if pos != size:
            log.warning("metadata log: cut %d torn or corrupt byte(s) after %d entries", size - pos, len(state.entries))
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        self._size = pos
        self._stored = list(state.entries)
        if kept_from:
            self._rewrite(state.entries, state.log_start_offset)
        self._epoch, self._voted_for, self._log_start = state.epoch, state.voted_for, state.log_start_offset
        self._snapshot = state.snapshot
        return state

    # ---- sync --------------------------------------------------------------------------

    def sync(self, state: DurableState) -> None:
        """Make the files hold `state` durably (fsync before returning)."""
        if state.snapshot is not self._snapshot and state.snapshot is not None:
            snap = state.snapshot
            body = struct.pack(">qiI", snap.end_offset, snap.last_epoch, crc32c(snap.data)) + snap.data
            write_atomic(self.dir / SNAPSHOT_FILE, body)
            self._snapshot = snap
        if state.log_start_offset != self._log_start:
            # Entries below the new start are in the snapshot: rewrite the log without them.
            self._rewrite(state.entries, state.log_start_offset)
        else:
            first_diff = 0
            n = min(len(self._stored), len(state.entries))
            while first_diff < n and self._stored[first_diff] is state.entries[first_diff]:
                first_diff += 1
            if first_diff < len(self._stored):
                cut = self._positions[first_diff]
                os.ftruncate(self._fd, cut)
                del self._stored[first_diff:]
                del self._positions[first_diff:]
                self._size = cut
            self._append(state.entries[first_diff:], state.log_start_offset + first_diff)
        if (state.epoch, state.voted_for, state.log_start_offset) != (self._epoch, self._voted_for, self._log_start):
            write_atomic(self.dir / STATE_FILE, orjson.dumps({
                "epoch": state.epoch, "voted_for": state.voted_for, "log_start_offset": state.log_start_offset,
            }))
            self._epoch, self._voted_for, self._log_start = state.epoch, state.voted_for, state.log_start_offset

    def _append(self, entries: list[Entry], first_offset: int) -> None:
        if not entries:
            return
        out = bytearray()
        for i, e in enumerate(entries):
            if len(e.data) > MAX_ENTRY_BYTES:
                raise ValueError(f"metadata entry of {len(e.data)} bytes exceeds {MAX_ENTRY_BYTES}")
            body = struct.pack(">qi", first_offset + i, e.epoch) + e.data
            self._positions.append(self._size + len(out))
            out += struct.pack(">II", len(e.data), crc32c(body)) + body
            self._stored.append(e)
        os.pwrite(self._fd, bytes(out), self._size)
        self._size += len(out)
        os.fsync(self._fd)

    def _rewrite(self, entries: list[Entry], first_offset: int) -> None:
        tmp = self.dir / (LOG_FILE + ".tmp")
        old_fd = self._fd
        self._fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self._stored, self._positions, self._size = [], [], 0
        self._append(list(entries), first_offset)
        os.fsync(self._fd)
        os.replace(tmp, self.dir / LOG_FILE)
        os.close(old_fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
