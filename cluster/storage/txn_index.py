"""Transaction markers and the aborted-transaction index of a segment (Kafka's `.txnindex`).

A transaction's end on a partition is a control batch with one record (Kafka's
EndTransactionMarker): key = version int16, type int16 (0 ABORT, 1 COMMIT); value =
version int16, coordinator epoch int32. Every aborted transaction whose marker lies in a
segment gets an entry in that segment's `.txnindex`, in Kafka's layout: version int16,
producer id int64, first offset int64, last offset int64 (the marker), last stable offset
int64 — 34 bytes each, in marker order. read_committed fetches answer with the entries
that overlap what they return, so clients can drop the aborted records.

The index is derived data: the log rebuilds it from the markers it replays on recovery.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from cluster.protocol.record_batch import CONTROL_MASK, TRANSACTIONAL_MASK
from cluster.protocol.records import Record, decode_batch, encode_batch

ABORT = 0
COMMIT = 1
_MARKER_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")
_ENTRY = struct.Struct(">hqqqq")
ENTRY_BYTES = _ENTRY.size  # 34
_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def marker_batch(*, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """A control batch ending `producer_id`'s transaction (offsets assigned on append)."""
    record = Record(0, timestamp_ms, _MARKER_KEY.pack(0, COMMIT if commit else ABORT),
                    _MARKER_VALUE.pack(0, coordinator_epoch), ())
    return encode_batch([record], producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=-1,
                        attributes_extra=TRANSACTIONAL_MASK | CONTROL_MASK)


class Marker(NamedTuple):
    """A transaction marker: ABORT or COMMIT, and the epoch of the coordinator that wrote it."""

    kind: int
    coordinator_epoch: int


def read_marker(batch: bytes | memoryview, pos: int = 0) -> Marker | None:
    """The marker of a control batch; None for anything else. A value too short to hold the
    coordinator epoch reads as -1."""
    if not isinstance(batch, bytes):
        batch = bytes(batch[pos:])  # a view of one batch (follower appends); never a whole chunk copy
        pos = 0
    _, records = decode_batch(batch, pos)
    if not records or records[0].key is None or len(records[0].key) < _MARKER_KEY.size:
        return None
    version, kind = _MARKER_KEY.unpack_from(records[0].key)
    if kind not in (ABORT, COMMIT) or version < 0:
        return None
    value = records[0].value
    epoch = _MARKER_VALUE.unpack_from(value)[1] if value is not None and len(value) >= _MARKER_VALUE.size else -1
    return Marker(kind, epoch)


def marker_type(batch: bytes | memoryview, pos: int = 0) -> int | None:
    """ABORT or COMMIT for a control batch's marker; None for anything else."""
    marker = read_marker(batch, pos)
    return None if marker is None else marker.kind


class TransactionIndex:
    """The aborted transactions whose marker is in one segment; entries kept in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []

    def load(self) -> None:
        self.entries = []
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        usable = len(data) - len(data) % ENTRY_BYTES  # a torn last entry is rebuilt by replay
        for pos in range(0, usable, ENTRY_BYTES):
            version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
            if version != _VERSION or (self.entries and last <= self.entries[-1].last_offset):
                break
            self.entries.append(AbortedTxn(pid, first, last, lso))
        if usable != len(data) or len(self.entries) * ENTRY_BYTES != usable:
            self._rewrite()

    def append(self, entry: AbortedTxn) -> None:
        """Add an entry; one at or below the last entry's marker is already there (replay)."""
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, _ENTRY.pack(_VERSION, entry.producer_id, entry.first_offset, entry.last_offset,
                                     entry.last_stable_offset))
        finally:
            os.close(fd)
        self.entries.append(entry)

    def truncate_from(self, offset: int) -> None:
        """Drop entries whose marker is at or after `offset` (the log was cut there)."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def collect(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions with data in [fetch_offset, upper_offset)."""
        return [e for e in self.entries if e.last_offset >= fetch_offset and e.first_offset < upper_offset]

    def _rewrite(self) -> None:
        if not self.entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".txnindex.tmp")
        tmp.write_bytes(b"".join(_ENTRY.pack(_VERSION, e.producer_id, e.first_offset, e.last_offset,
                                             e.last_stable_offset) for e in self.entries))
        os.replace(tmp, self.path)

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
        self.entries = []
