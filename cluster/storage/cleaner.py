"""Log compaction (Kafka's LogCleaner) for topics with cleanup.policy=compact.

Two phases so produce and fetch never wait on it:
- `prepare_clean` (a worker thread): map every key in the dirty section (from the cleaner
  checkpoint to the active segment) to its latest offset, then rewrite the inactive
  segments into `<base>.log.cleaned` files keeping, per key, only the latest record;
  tombstones older than delete.retention.ms go too. Offsets are kept (gaps allowed).
- `commit_clean` (the trio thread, fast): check the segments are still the ones cleaned,
  rename `.cleaned` → `.swap`, delete the old files, rename `.swap` → `.log`.
A crash between the two renames is finished by `Log` at load (swap.py).

Which logs and segments (Kafka's LogCleanerManager): a log is cleaned when its dirty ratio
reaches min.cleanable.dirty.ratio, or whatever the ratio once the first record of a dirty
segment is older than max.compaction.lag.ms; segments from the first dirty one holding a
record newer than min.compaction.lag.ms on stay dirty.
Transactions (Kafka's rules): nothing at or above the first offset of an open transaction is
cleaned; the batches of aborted transactions (found through the `.txnindex` files) give no
key to the map and are removed; a marker goes once no batch of its transaction is left in
the log and it is older than delete.retention.ms (an ABORT marker whose batches this pass
removes stays until the next). Cleaned segments need no `.txnindex`: no aborted batch is
left in them.
Reads are paced by `log.cleaner.io.max.bytes.per.second`; the key map is bounded by
`log.cleaner.dedupe.buffer.size` (24 bytes per entry, as Kafka counts).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cluster.protocol.record_batch import (
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    InvalidRecordBatch,
)
from cluster.protocol.records import Record, decode_batch, encode_batch
from cluster.storage.checkpoint import write_atomic
from cluster.storage.log import Log
from cluster.storage.segment import LogSegment, segment_name
from cluster.storage.txn_index import ABORT, COMMIT, AbortedTxn, marker_type

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
_MAP_ENTRY_BYTES = 24


@dataclass
class CleanerConfig:
    dedupe_buffer_bytes: int = 134_217_728  # log.cleaner.dedupe.buffer.size
    io_max_bytes_per_second: float = float("inf")  # log.cleaner.io.max.bytes.per.second


@dataclass
class CleanedGroup:
    """Consecutive old segments replaced by one cleaned file."""

    inputs: list[LogSegment]
    path: Path
    size_bytes: int


@dataclass
class CleaningTask:
    log: Log
    end_offset: int  # everything below is cleaned after commit
    groups: list[CleanedGroup] = field(default_factory=list)
    bytes_read: int = 0
    records_kept: int = 0
    records_removed: int = 0
    markers_removed: int = 0

    def discard(self) -> None:
        for g in self.groups:
            g.path.unlink(missing_ok=True)


class TransactionFilter:
    """Which batches of a compacted range belong to aborted transactions, and which markers
    may go (sans-IO; fed every batch in offset order, as Kafka's CleanedTransactionMetadata)."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda a: a.first_offset)
        self._aborting: dict[int, bool] = {}  # producer id -> a batch of its aborted txn was read
        self._committing: set[int] = set()  # producer ids with a batch read since their last marker

    def _reach(self, last_offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= last_offset:
            self._aborting.setdefault(self._pending.pop(0).producer_id, False)

    def keep_data(self, header: BatchHeader) -> bool:
        """False for a batch of an aborted transaction."""
        self._reach(header.next_offset - 1)
        if not header.is_transactional:
            return True
        if header.producer_id in self._aborting:
            self._aborting[header.producer_id] = True
            return False
        self._committing.add(header.producer_id)
        return True

    def marker_removable(self, header: BatchHeader, kind: int | None) -> bool:
        """A control batch may go: no batch of its transaction is left in the log."""
        self._reach(header.next_offset - 1)
        pid = header.producer_id
        if kind == ABORT:
            return not self._aborting.pop(pid, False)
        if kind == COMMIT:
            seen = pid in self._committing
            self._committing.discard(pid)
            return not seen
        return False


class _Throttle:
    def __init__(self, bytes_per_second: float, sleep: Callable[[float], None]) -> None:
        self.rate = bytes_per_second
        self.sleep = sleep
        self.start = time.monotonic()
        self.done = 0

    def consumed(self, n: int) -> None:
        self.done += n
        if self.rate == float("inf"):
            return
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            self.sleep(ahead)


def read_checkpoint(lg: Log) -> int:
    path = lg.dir / CLEANER_CHECKPOINT
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return 0


def _batches(seg: LogSegment, throttle: _Throttle) -> list[tuple[int, BatchHeader, bytes]]:
    """Whole batches of an inactive segment as (position, header, bytes), read at the paced rate."""
    out = []
    for pos, header in seg.scan_headers(0):
        raw = seg.read(pos, header.size_bytes)
        throttle.consumed(len(raw))
        out.append((pos, header, raw))
    return out


def cleanable_ratio(lg: Log, first_dirty: int) -> float:
    inactive = lg.segments[:-1]
    total = sum(s.size_bytes for s in inactive)
    if total == 0:
        return 0.0
    dirty = sum(s.size_bytes for s in inactive if s.next_offset > first_dirty)
    return dirty / total


def cleanable_segments(lg: Log, first_dirty: int, now_ms: int, first_unstable_offset: int | None) -> list[LogSegment]:
    """The inactive segments compaction may rewrite (Kafka's firstUncleanableDirtyOffset):
    those below the first open transaction and before the first dirty segment holding a
    record newer than min.compaction.lag.ms."""
    out = []
    min_lag_ms = lg.config.min_compaction_lag_ms
    for s in lg.segments[:-1]:
        if first_unstable_offset is not None and s.next_offset > first_unstable_offset:
            break
        if min_lag_ms > 0 and s.next_offset > first_dirty and s.max_timestamp > now_ms - min_lag_ms:
            break
        out.append(s)
    return out


def compaction_delay_ms(lg: Log, segments: list[LogSegment], first_dirty: int, now_ms: int) -> int:
    """How long past max.compaction.lag.ms the oldest dirty record is (Kafka's
    maxCompactionDelay, from the first batch of each dirty segment); above 0, the log is
    cleaned whatever its dirty ratio."""
    first_batch_ms = [h.max_timestamp for s in segments if s.next_offset > first_dirty
                      for _, h in itertools.islice(s.scan_headers(0), 1) if h.max_timestamp > 0]
    clean_until_ms = now_ms - lg.config.max_compaction_lag_ms
    return max(0, clean_until_ms - min(first_batch_ms)) if first_batch_ms else 0


def prepare_clean(
    lg: Log, now_ms: int, config: CleanerConfig, *, sleep: Callable[[float], None] = time.sleep,
    first_unstable_offset: int | None = None,
) -> CleaningTask | None:
    """Build cleaned copies of the inactive segments below `first_unstable_offset` (the
    first offset of an open transaction, taken by the caller in the log's thread); None
    when nothing is worth cleaning."""
    first_dirty = max(read_checkpoint(lg), lg.log_start_offset)
    segments = cleanable_segments(lg, first_dirty, now_ms, first_unstable_offset)
    if not segments or first_dirty >= segments[-1].next_offset:
        return None
    if (cleanable_ratio(lg, first_dirty) < lg.config.min_cleanable_dirty_ratio
            and compaction_delay_ms(lg, segments, first_dirty, now_ms) == 0):
        return None
    throttle = _Throttle(config.io_max_bytes_per_second, sleep)
    max_keys = max(1, config.dedupe_buffer_bytes // _MAP_ENTRY_BYTES)
    offset_map: dict[bytes, int] = {}
    end_offset = first_dirty
    full = False
    dirty = TransactionFilter(lg.collect_aborted(first_dirty, segments[-1].next_offset))
    for seg in segments:
        if seg.next_offset <= first_dirty:
            continue
        for _, header, raw in _batches(seg, throttle):
            if header.next_offset <= first_dirty or header.is_control or not dirty.keep_data(header):
                continue  # markers and aborted batches give no key
            records = _decode_or_none(raw, lg.name)
            if records is None:
                end_offset = header.next_offset
                continue
            new_keys = sum(1 for r in records if r.key is not None and r.key not in offset_map)
            if len(offset_map) + new_keys > max_keys:
                full = True
                break
            for r in records:
                if r.key is not None:
                    offset_map[r.key] = r.offset
            end_offset = header.next_offset
        if full:
            break
    if end_offset <= first_dirty:
        return None
    task = CleaningTask(lg, end_offset, bytes_read=throttle.done)
    delete_horizon_ms = now_ms - int(lg.config["delete.retention.ms"])
    segment_bytes = lg.config.segment_bytes
    group: list[LogSegment] = []
    group_bytes = 0
    eligible = [s for s in segments if s.next_offset <= end_offset]
    txns = TransactionFilter(lg.collect_aborted(eligible[0].base_offset, end_offset) if eligible else [])
    for seg in eligible:
        if group and (group_bytes + seg.size_bytes > segment_bytes
                      or seg.next_offset - group[0].base_offset > 2**31):
            task.groups.append(_write_group(lg, group, offset_map, delete_horizon_ms, throttle, task, txns))
            group, group_bytes = [], 0
        group.append(seg)
        group_bytes += seg.size_bytes
    if group:
        task.groups.append(_write_group(lg, group, offset_map, delete_horizon_ms, throttle, task, txns))
    task.bytes_read = throttle.done
    return task


def _write_group(
    lg: Log, group: list[LogSegment], offset_map: dict[bytes, int], delete_horizon_ms: int,
    throttle: _Throttle, task: CleaningTask, txns: TransactionFilter,
) -> CleanedGroup:
    # The name carries the offsets the group covers, so a crash mid-swap can be finished
    # even when the group's last records were all compacted away.
    path = lg.dir / f"{segment_name(group[0].base_offset)}.{segment_name(group[-1].next_offset)}.log.cleaned"
    written = 0
    with open(path, "wb") as out:
        for seg in group:
            for _, header, raw in _batches(seg, throttle):
                if header.is_control:
                    if txns.marker_removable(header, _marker_or_none(raw)) and header.max_timestamp < delete_horizon_ms:
                        task.markers_removed += 1
                        continue
                    out.write(raw)
                    written += len(raw)
                    continue
                if not txns.keep_data(header):
                    task.records_removed += header.records_count  # an aborted transaction's batch
                    continue
                records = _decode_or_none(raw, lg.name)
                if records is None:
                    out.write(raw)  # control batches, and batches that do not decode, stay as they are
                    written += len(raw)
                    continue
                kept = []
                for r in records:
                    latest = offset_map.get(r.key) if r.key is not None else None
                    if latest is not None and latest > r.offset:
                        continue  # superseded by a newer value
                    if r.value is None and r.timestamp < delete_horizon_ms:
                        continue  # an old tombstone
                    kept.append(r)
                task.records_kept += len(kept)
                task.records_removed += len(records) - len(kept)
                if not kept:
                    continue
                if len(kept) == len(records):
                    data = raw
                else:
                    data = encode_batch(
                        kept, base_offset=header.base_offset, last_offset_delta=header.last_offset_delta,
                        producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                        base_sequence=header.base_sequence, partition_leader_epoch=header.partition_leader_epoch,
                        compression=header.compression,
                        # still transactional (a marker stays while its batches do), same timestamp type
                        attributes_extra=header.attributes & (TRANSACTIONAL_MASK | TIMESTAMP_TYPE_MASK),
                        max_timestamp=header.max_timestamp if header.attributes & TIMESTAMP_TYPE_MASK else None,
                    )
                out.write(data)
                written += len(data)
        out.flush()
        os.fsync(out.fileno())
    return CleanedGroup(group, path, written)


def _marker_or_none(raw: bytes) -> int | None:
    try:
        return marker_type(raw)
    except InvalidRecordBatch:
        return None  # kept as it is


def _decode_or_none(raw: bytes, name: str) -> list[Record] | None:
    try:
        return decode_batch(raw)[1]
    except InvalidRecordBatch as exc:
        log.warning("compaction of %s keeps a batch that does not decode: %s", name, exc)
        return None


def commit_clean(task: CleaningTask, now_ms: int) -> bool:
    """Swap the cleaned files in; False (and nothing changed) if the log moved on meanwhile."""
    lg = task.log
    current = {id(s) for s in lg.segments[:-1]}
    if any(id(s) not in current for g in task.groups for s in g.inputs):
        task.discard()
        return False
    for g in task.groups:
        base = g.inputs[0].base_offset
        swap = g.path.with_name(g.path.name.replace(".log.cleaned", ".log.swap"))
        os.replace(g.path, swap)
        first = lg.segments.index(g.inputs[0])
        for seg in g.inputs:
            seg.delete()
        final = lg.dir / (segment_name(base) + ".log")
        os.replace(swap, final)
        new = LogSegment(lg.dir, base, index_interval_bytes=lg.config.index_interval_bytes,
                         index_max_entries=lg.config.index_max_entries, created_ms=g.inputs[-1].created_ms)
        new.open_existing()
        new.rebuild_indexes()
        if new.size_bytes == 0:
            new.next_offset = g.inputs[-1].next_offset
        lg.segments[first : first + len(g.inputs)] = [new]
    lg.rebuild_bases()
    write_atomic(lg.dir / CLEANER_CHECKPOINT, str(task.end_offset).encode(), fsync=False)
    log.info(
        "cleaned %s up to offset %d: %d segment(s) into %d, kept %d record(s), removed %d and %d marker(s), "
        "read %d bytes", lg.name, task.end_offset, sum(len(g.inputs) for g in task.groups), len(task.groups),
        task.records_kept, task.records_removed, task.markers_removed, task.bytes_read,
    )
    return True
