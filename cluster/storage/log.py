"""Log: one partition's segments, offsets, producer state and leader epochs (Kafka's UnifiedLog).

File I/O is synchronous (page cache writes are fast); fsync is requested through
`flush_requests` and done by the trio shell in a worker thread.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from cluster.protocol.record_batch import (
    BatchHeader,
    InvalidRecordBatch,
    iter_headers,
    patched_prefix,
    scan_batches,
    split_batches,
)
from cluster.protocol.records import decode_batch, rewrite_batch
from cluster.storage.checkpoint import write_atomic
from cluster.storage.config import LogConfig
from cluster.storage.leader_epoch import LeaderEpochCache
from cluster.storage.producer_state import CompletedTxn, ProducerStateManager, SequenceVerdict
from cluster.storage.segment import LogSegment, RecoveryResult, segment_name
from cluster.storage.swap import complete_swaps
from cluster.storage.txn_index import (
    ABORT,
    COMMIT,
    AbortedTxn,
    Marker,
    marker_batch,
    marker_type,
    read_marker,
)

log = logging.getLogger(__name__)

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_MAX_RELATIVE_OFFSET = 2**32 - 1
_SNAPSHOTS_KEPT = 2
_REPLAY_READ_BYTES = 4 << 20
KeyValue = tuple[bytes | None, bytes | None]
_I32 = struct.Struct(">i")


class OffsetOutOfRange(Exception):
    def __init__(self, offset: int, log_start: int, log_end: int) -> None:
        super().__init__(f"offset {offset} is outside [{log_start}, {log_end}]")
        self.offset = offset


class RecordTooLarge(Exception):
    pass


class RejectedRecords(Exception):
    """KIP-467: records of a produce the topic refuses, each by its index in its batch; the
    whole produce is refused (INVALID_RECORD, or INVALID_TIMESTAMP for `timestamp`)."""

    def __init__(self, errors: list[tuple[int, str]], *, timestamp: bool = False) -> None:
        super().__init__(f"{len(errors)} record(s) rejected: {errors[0][1]}")
        self.errors = errors
        self.timestamp = timestamp


class ProducerFenced(Exception):
    """INVALID_PRODUCER_EPOCH."""


class OutOfOrderSequence(Exception):
    """OUT_OF_ORDER_SEQUENCE_NUMBER."""


class NotEnoughReplicas(Exception):
    """NOT_ENOUGH_REPLICAS: the caller said the ISR is below min.insync.replicas (acks=all)."""


class StorageError(Exception):
    """KAFKA_STORAGE_ERROR: the disk refused a write (full, I/O error); nothing was appended."""


class UnexpectedAppendOffset(InvalidRecordBatch):
    """Fetched batches that do not start at the follower's log end (Kafka's
    UnexpectedAppendOffsetException); carries the first batch's first and last offsets."""

    def __init__(self, message: str, first_offset: int, last_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.last_offset = last_offset


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    record_count: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class MirrorAppend:
    """What `Log.append_mirrored` did: the offsets of the batches it wrote (-1, -1: none),
    how far the log end moved, the batches skipped as already there, the new log end."""

    first_offset: int
    last_offset: int
    offsets_appended: int
    batches_skipped: int
    log_end_offset: int


@dataclass(slots=True)
class RecoveryReport:
    recovery_point: int
    segments_scanned: int
    bytes_scanned: int
    batches: int
    bytes_truncated: int
    segments_deleted: int
    producer_batches_replayed: int
    clean: bool
    reasons: list[str]


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    m = _PARTITION_DIR.match(name)
    if not m:
        return None
    return m.group("topic"), int(m.group("partition"))



def plan_mirrored_append(name: str, log_start_offset: int, log_end_offset: int,
                         batches: list[tuple[int, int]]) -> tuple[int, int | None]:
    """Which of a mirror append's batches ((base offset, last offset), in order) a mirror
    log takes: (the index of the first one kept, the offset an empty log must start at first
    or None). Batches wholly below the log end are skipped (the retry of an append already
    done); an empty log whose end is below the first batch starts at that batch (a mirror
    starts where its source's log starts, as a follower whose log lies below its leader's).
    A batch that straddles the log end means the two logs diverged: UnexpectedAppendOffset."""
    first_kept = next((i for i, (_, last) in enumerate(batches) if last >= log_end_offset), len(batches))
    if first_kept == len(batches):
        return first_kept, None
    base, last = batches[first_kept]
    empty = log_start_offset == log_end_offset
    if base < log_end_offset and not empty:
        raise UnexpectedAppendOffset(
            f"{name}: mirrored batch {base}-{last} straddles the log end offset {log_end_offset}: this log and its "
            f"source diverged below {log_end_offset}", base, last)
    return first_kept, (base if empty and base != log_end_offset else None)


def _fingerprint(header: BatchHeader | None) -> tuple[int, int, int] | None:
    """What a producer snapshot records of the batch the log ended with when it was taken:
    base offset, leader epoch, CRC (None: an empty log)."""
    return None if header is None else (header.base_offset, header.partition_leader_epoch, header.crc)


class Log:
    """Append-only commit log of one partition, on disk under `<dir>/<topic>-<partition>`."""

    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig) -> None:
        self.dir = directory
        self.topic = topic
        self.partition = partition
        self.config = config
        self.segments: list[LogSegment] = []
        self._bases: list[int] = []
        self.log_end_offset = 0
        # DeleteRecords moves the log start into a segment (Kafka's logStartOffset): records
        # below it are gone for readers, their segment stays until all of it is below.
        self._start_offset = 0
        self.recovery_point = 0
        self.producer_state = ProducerStateManager()
        self.leader_epochs = LeaderEpochCache(directory / "leader-epoch-checkpoint")
        self.unflushed_messages = 0
        self.last_flush_ms = 0
        # Called with the offset below which everything should be fsynced (roll, flush.messages).
        self.flush_requests: Callable[[Log, int], None] | None = None
        self.recovery_report: RecoveryReport | None = None

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        return max(self._start_offset, self.segments[0].base_offset)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    # ---- opening and recovery ----------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, topic: str, partition: int, config: LogConfig, now_ms: int, *,
               index_files: bool = True) -> Log:
        """A new empty log; without `index_files` its first segment's index files wait for
        `LogSegment.create_index_files`."""
        directory.mkdir(parents=True, exist_ok=False)
        lg = cls(directory, topic, partition, config)
        lg._add_segment(0, now_ms, create=True, index_files=index_files)
        lg.last_flush_ms = now_ms
        return lg

    @classmethod
    def open(
        cls,
        directory: Path,
        topic: str,
        partition: int,
        config: LogConfig,
        *,
        recovery_point: int,
        clean_state: dict[str, int] | None,
        now_ms: int,
        log_start_offset: int = 0,
    ) -> Log:
        """Load a partition; segments past the recovery point are validated unless clean.
        `log_start_offset` is the checkpointed start (DeleteRecords), kept within the log."""
        lg = cls(directory, topic, partition, config)
        lg._start_offset = log_start_offset
        lg._load(recovery_point, clean_state, now_ms)
        for seg in lg.segments:
            # Index entries rebuilt by recovery stay in the page cache (an index is checked
            # at load and rebuilt when it does not fit its log): their descriptors are not
            # kept, or recovering 10,000 partitions after kill -9 runs out of them (EMFILE).
            seg.release_index_files()
        lg.last_flush_ms = now_ms
        return lg

    def rebuild_bases(self) -> None:
        self._bases = [s.base_offset for s in self.segments]

    def _load(self, recovery_point: int, clean_state: dict[str, int] | None, now_ms: int) -> None:
        # One listing of the directory for all of this (a glob each cost ~0.2 ms of Python:
        # ten per partition made a quarter of loading 10,000 of them).
        names = os.listdir(self.dir)
        if any(n.endswith(".log.swap") for n in names):
            complete_swaps(self.dir)
            names = os.listdir(self.dir)
        kept = []
        for name in names:
            if name.endswith((".tmp", ".deleted", ".cleaned", ".swap")):
                (self.dir / name).unlink()
            else:
                kept.append(name)
        stems = {name: name.partition(".")[0] for name in kept}
        bases = sorted(int(stem) for name, stem in stems.items() if name == stem + ".log" and stem.isdigit())
        based = set(bases)
        for name, stem in stems.items():
            if name in (stem + ".index", stem + ".timeindex", stem + ".txnindex") and (
                    not stem.isdigit() or int(stem) not in based):
                (self.dir / name).unlink()  # an index without its log
        if not bases:
            self._add_segment(0, now_ms, create=True)
            self.recovery_report = RecoveryReport(0, 0, 0, 0, 0, 0, 0, True, [])
            return
        for base in bases:
            seg = self._add_segment(base, int(os.stat(self.dir / (segment_name(base) + ".log")).st_mtime * 1000), create=False)
            seg.open_existing()

        reasons: list[str] = []
        clean = clean_state is not None
        if clean_state is not None:
            # A clean shutdown recorded the active segment's size; anything else means the
            # files were touched while stopped, so that segment gets validated.
            if clean_state.get("active_segment_bytes") != self.active_segment.size_bytes or clean_state.get(
                "active_segment_base"
            ) != self.active_segment.base_offset:
                reasons.append("active segment changed after clean shutdown")
                clean = False
                recovery_point = min(recovery_point, self.active_segment.base_offset)
        self.leader_epochs.load()
        report = RecoveryReport(recovery_point, 0, 0, 0, 0, 0, 0, clean, reasons)
        epoch_entries_before = list(self.leader_epochs.entries)
        i = 0
        floor_epoch = -1  # the leader epoch of the last batch kept so far
        scanned_from: int | None = None

        def replay(header: BatchHeader) -> str | None:
            nonlocal floor_epoch
            epoch = header.partition_leader_epoch
            if 0 <= epoch < floor_epoch:
                return (f"batch at offset {header.base_offset} has leader epoch {epoch}, after a batch of "
                        f"epoch {floor_epoch}: left from before a truncation")
            floor_epoch = max(floor_epoch, epoch)
            self._replay_epoch(header)
            return None

        while i < len(self.segments):
            seg = self.segments[i]
            stale = self._stale_segment(self.segments[i - 1], seg, floor_epoch) if i else None
            if stale is not None:
                # A segment a truncation deleted, brought back because the deletion never
                # reached the disk before a crash: its batches are an older history than the
                # ones before it, which replaced them.
                report.reasons.append(f"segment {seg.base_offset} dropped: {stale}")
                seg.delete()
                del self.segments[i]
                del self._bases[i]
                report.segments_deleted += 1
                continue
            next_base = self.segments[i + 1].base_offset if i + 1 < len(self.segments) else None
            trusted = clean or (next_base is not None and next_base <= recovery_point)
            if trusted:
                seg.load_trusted(next_base)
                floor_epoch = max(floor_epoch, seg.last_leader_epoch)
                i += 1
                continue
            if scanned_from is None:
                # Which epoch started where, from here on, is what the batches say: an entry
                # the cache kept for offsets whose batches were lost or replaced would
                # contradict them.
                scanned_from = seg.base_offset
                self.leader_epochs.replace_entries([(e, o) for e, o in self.leader_epochs.entries if o < scanned_from])
            result: RecoveryResult = seg.recover(replay)
            report.segments_scanned += 1
            report.bytes_scanned += result.bytes_scanned
            report.batches += result.batches
            if result.truncated_bytes:
                report.bytes_truncated += result.truncated_bytes
                report.reasons.append(f"segment {seg.base_offset}: {result.reason}")
                # Everything after a torn batch is unreachable: drop later segments.
                for later in self.segments[i + 1 :]:
                    later.delete()
                    report.segments_deleted += 1
                del self.segments[i + 1 :]
                del self._bases[i + 1 :]
            i += 1
        # A segment emptied by truncation that is not the first is removed.
        while len(self.segments) > 1 and self.active_segment.size_bytes == 0 and self.active_segment.base_offset > self.segments[-2].next_offset:
            self.segments.pop().delete()
            self._bases.pop()
        self.log_end_offset = self.active_segment.next_offset
        self._start_offset = min(self._start_offset, self.log_end_offset)
        self.recovery_point = min(recovery_point, self.log_end_offset) if not clean else self.log_end_offset
        if self.leader_epochs.entries == epoch_entries_before:
            self.leader_epochs.mark_written()
        # Changed epochs are written later (the replica manager's writer, a flush, close):
        # what recovery rebuilt lies at or above where it scanned from, which the next load
        # rebuilds the same way from the same batches if it comes first.
        self.leader_epochs.truncate_from_end(self.log_end_offset, persist=False)
        report.producer_batches_replayed = self._rebuild_producer_state()
        self.recovery_report = report
        if not clean and (report.bytes_scanned or report.bytes_truncated or report.reasons):
            log.info(
                "recovered %s from recovery point %d: scanned %d bytes in %d segment(s), %d batches; "
                "truncated %d bytes, deleted %d segment(s)%s; log end offset %d",
                self.name, recovery_point, report.bytes_scanned, report.segments_scanned, report.batches,
                report.bytes_truncated, report.segments_deleted,
                (" (" + "; ".join(report.reasons) + ")") if report.reasons else "", self.log_end_offset,
            )

    @staticmethod
    def _stale_segment(before: LogSegment, seg: LogSegment, floor_epoch: int) -> str | None:
        """Why `seg` cannot follow `before` in one log (None: it can). A replica's offsets
        only grow and its batches' leader epochs never go back (KIP-101)."""
        if seg.base_offset < before.next_offset:
            return f"it starts at offset {seg.base_offset}, inside the segment before (which ends at {before.next_offset})"
        first = seg.first_leader_epoch()
        if first is not None and 0 <= first < floor_epoch:
            return f"its first batch has leader epoch {first}, below epoch {floor_epoch} of the batch before"
        return None

    def _replay_epoch(self, header: BatchHeader) -> None:
        self.leader_epochs.assign(header.partition_leader_epoch, header.base_offset)

    def _rebuild_producer_state(self) -> int:
        """Load the newest usable snapshot, then replay batch headers after it."""
        snapshots = sorted(
            (int(p.stem), p) for p in self.dir.glob("*.snapshot") if p.stem.isdigit()
        )
        start = self.log_start_offset
        self.producer_state = ProducerStateManager()
        for offset, path in reversed(snapshots):
            if offset > self.log_end_offset:
                path.unlink()
                continue
            try:
                tail = self.producer_state.load_snapshot(path.read_bytes())
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ignoring corrupt producer snapshot %s: %s", path, exc)
                path.unlink()
                continue
            if tail is not None and tail != _fingerprint(self._batch_ending_at(offset)):
                # Written for a history this log no longer has: a truncation deleted it, and
                # a crash before the deletion reached the disk brought it back. Its producers
                # would answer retries as duplicates of records that are not there.
                log.warning("ignoring producer snapshot %s: the log's batch before offset %d is not the one it "
                            "was taken after (another history of this log)", path, offset)
                path.unlink()
                self.producer_state = ProducerStateManager()
                continue
            start = max(offset, self.log_start_offset)
            break
        replayed = 0
        idx = max(0, bisect.bisect_right(self._bases, start) - 1)
        for seg in self.segments[idx:]:
            seg.txn_index.truncate_from(start)  # derived from the markers replayed below
        for seg in self.segments[idx:]:
            for pos, header in seg.scan_headers(seg.offset_index.lookup(start)):
                if header.base_offset >= start:
                    marker = read_marker(seg.read(pos, header.size_bytes)) if header.is_control else None
                    self._index_completed(seg, self.producer_state.record(header, marker))
                    replayed += 1
        return replayed

    def _batch_ending_at(self, offset: int) -> BatchHeader | None:
        """The header of the batch whose last offset is `offset` - 1 (None: no such batch)."""
        if offset <= self.log_start_offset or not self.segments:
            return None
        idx = max(0, bisect.bisect_right(self._bases, offset - 1) - 1)
        found = self.segments[idx].find_position(offset - 1)
        return found[1] if found is not None and found[1].next_offset == offset else None

    def _index_completed(self, seg: LogSegment, done: CompletedTxn | None) -> None:
        """An aborted transaction goes into the index of the segment holding its marker."""
        if done is None or not done.aborted:
            return
        stable = min(self.producer_state.ongoing.values(), default=done.last_offset + 1)
        seg.txn_index.append(AbortedTxn(done.producer_id, done.first_offset, done.last_offset, stable))

    def last_stable_offset(self, high_watermark: int) -> int:
        """Kafka's LSO: below it every transaction has ended and its marker is replicated."""
        first = self.producer_state.first_unstable_offset(high_watermark)
        return high_watermark if first is None else min(first, high_watermark)

    def first_open_transaction_offset(self) -> int | None:
        """Where the earliest open transaction starts (compaction stops below it)."""
        return min(self.producer_state.ongoing.values(), default=None)

    def collect_aborted(self, fetch_offset: int, upper_offset: int) -> list[AbortedTxn]:
        """Aborted transactions with records in [fetch_offset, upper_offset), for a
        read_committed fetch; their markers may lie in any later segment."""
        idx = max(0, bisect.bisect_right(self._bases, fetch_offset) - 1)
        out: list[AbortedTxn] = []
        for seg in self.segments[idx:]:
            out.extend(seg.txn_index.collect(fetch_offset, upper_offset))
        return out

    def _add_segment(self, base_offset: int, now_ms: int, *, create: bool, index_files: bool = True) -> LogSegment:
        seg = LogSegment(
            self.dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            index_max_entries=self.config.index_max_entries,
            created_ms=now_ms,
        )
        if create:
            seg.create(index_files=index_files)
        self.segments.append(seg)
        self._bases.append(base_offset)
        return seg

    # ---- append ------------------------------------------------------------------------

    def append_as_leader(self, payload: bytes, *, leader_epoch: int, now_ms: int,
                         enough_replicas: bool = True) -> AppendResult:
        """Validate, assign offsets and append the batches of one produce partition.

        `enough_replicas` False (acks=all with the ISR below min.insync.replicas) refuses the
        append with NotEnoughReplicas, but only after the duplicate check: a producer's retry
        of a batch already in the log gets that batch's offsets, never an error that says "not
        written" (an idempotent producer would then resend it under a new epoch, a duplicate).

        Raises InvalidRecordBatch, RecordTooLarge, ProducerFenced, OutOfOrderSequence,
        NotEnoughReplicas or StorageError; nothing is appended then.
        """
        batches = split_batches(payload)
        max_bytes = self.config.max_message_bytes
        for _, h in batches:
            if h.size_bytes > max_bytes:
                raise RecordTooLarge(f"record batch of {h.size_bytes} bytes exceeds max.message.bytes={max_bytes}")
            if h.is_control:
                raise InvalidRecordBatch("control batches are written by transaction coordinators, not producers")
            if h.is_transactional and not h.has_producer_id:
                raise InvalidRecordBatch("a transactional batch needs a producer id")
        self._check_records(payload, batches, now_ms)
        if len(batches) == 1 and batches[0][1].has_producer_id:
            check = self.producer_state.check(batches[0][1])
            if check.verdict is SequenceVerdict.DUPLICATE:
                dup = check.duplicate_of
                assert dup is not None
                # (Kafka answers a duplicate with the cached batch's timestamp as its append time)
                return AppendResult(dup.base_offset, dup.base_offset + dup.last_offset_delta, dup.max_timestamp,
                                    self.log_start_offset, dup.last_offset_delta + 1, duplicate=True)
            if not enough_replicas:
                # Before the sequence checks, as Kafka: when a pipelined producer's first
                # request is refused here, the ones behind it must be refused the same way,
                # not with OUT_OF_ORDER_SEQUENCE (librdkafka answers that with an epoch bump,
                # renumbering every partition's unacknowledged batches: duplicates).
                raise NotEnoughReplicas("the in-sync replicas are fewer than min.insync.replicas")
            if check.verdict is SequenceVerdict.INVALID_PRODUCER_EPOCH:
                raise ProducerFenced(check.message)
            if check.verdict is SequenceVerdict.OUT_OF_ORDER_SEQUENCE:
                raise OutOfOrderSequence(check.message)
        elif any(h.has_producer_id for _, h in batches):
            for _, h in batches:
                c = self.producer_state.check(h)
                if c.verdict is not SequenceVerdict.APPEND:
                    raise OutOfOrderSequence("idempotent batches must be produced one per partition request")
        if not enough_replicas:
            raise NotEnoughReplicas("the in-sync replicas are fewer than min.insync.replicas")

        append_time_ms = -1
        target_codec = self.config.target_compression
        if self.config.log_append_time or target_codec is not None:
            # Per-record work only where the topic's configs demand it.
            append_time_ms = now_ms if self.config.log_append_time else -1
            view0 = memoryview(payload)
            payload = b"".join(
                rewrite_batch(view0[pos : pos + h.size_bytes], compression=target_codec,
                              log_append_time_ms=now_ms if self.config.log_append_time else None)
                for pos, h in batches
            )
            batches = split_batches(payload, validate=False)
        return self._write_as_leader(payload, batches, leader_epoch, now_ms, append_time_ms)

    def _check_records(self, payload: bytes, batches: list[tuple[int, BatchHeader]], now_ms: int) -> None:
        """Kafka's per-record checks (LogValidator), only where the topic asks for them: a
        compacted topic takes no record without a key, and message.timestamp.before/after
        bound CreateTime timestamps. Raises RejectedRecords naming every refused record."""
        bounds = self.config.timestamp_bounds_ms
        compacted = self.config.compact_enabled
        if not compacted and bounds is None:
            return
        errors: list[tuple[int, str]] = []
        keyless = False
        for pos, _ in batches:
            _, records = decode_batch(payload, pos)
            for i, r in enumerate(records):
                if compacted and r.key is None:
                    keyless = True
                    errors.append((i, f"Compacted topic cannot accept message without key in topic partition {self.name}."))
                elif bounds is not None and not now_ms - bounds[0] <= r.timestamp <= now_ms + bounds[1]:
                    errors.append((i, f"Timestamp {r.timestamp} of message with offset {i} is out of range. The "
                                      f"timestamp should be within [{now_ms - bounds[0]}, {now_ms + bounds[1]}]"))
        if errors:
            raise RejectedRecords(errors, timestamp=not keyless)

    def _write_as_leader(self, payload: bytes, batches: list[tuple[int, BatchHeader]], leader_epoch: int,
                         now_ms: int, append_time_ms: int, marker: Marker | None = None) -> AppendResult:
        """Assign offsets from the log end, stamp the leader epoch, write, and record the
        batches (a transaction `marker` for a control batch)."""
        first_offset = self.log_end_offset
        last_offset = first_offset + sum(h.last_offset_delta + 1 for _, h in batches) - 1
        self._maybe_roll(len(payload), last_offset, now_ms)

        view = memoryview(payload)
        iovecs: list[bytes | memoryview] = []
        headers: list[BatchHeader] = []
        offset = first_offset
        for pos, h in batches:
            iovecs.append(patched_prefix(view[pos : pos + 17], offset, leader_epoch))
            iovecs.append(view[pos + 17 : pos + h.size_bytes])
            headers.append(replace(h, base_offset=offset, partition_leader_epoch=leader_epoch))
            offset += h.last_offset_delta + 1
        try:
            self.active_segment.append(iovecs, headers)
        except OSError as exc:
            raise StorageError(f"{self.name}: write failed: {exc.strerror}") from exc

        if leader_epoch >= 0 and leader_epoch > self.leader_epochs.latest_epoch:
            self.leader_epochs.assign(leader_epoch, first_offset)
        for h in headers:
            self._index_completed(self.active_segment, self.producer_state.record(h, marker))
        self.log_end_offset = offset
        count = offset - first_offset
        self.unflushed_messages += count
        if self.unflushed_messages >= self.config.flush_messages and self.flush_requests:
            self.flush_requests(self, self.log_end_offset)
        return AppendResult(first_offset, last_offset, append_time_ms, self.log_start_offset, count)

    def append_marker(self, *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      leader_epoch: int, now_ms: int) -> AppendResult:
        """Leader: end `producer_id`'s transaction on this partition with a control batch
        (WriteTxnMarkers). A marker of an epoch newer than the producer's fences the older
        epoch from then on. Raises ProducerFenced (an older epoch) or StorageError."""
        refused = self.producer_state.check_marker(producer_id, producer_epoch)
        if refused is not None:
            raise ProducerFenced(refused)
        payload = marker_batch(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                               coordinator_epoch=coordinator_epoch, timestamp_ms=now_ms)
        return self._write_as_leader(payload, split_batches(payload, validate=False), leader_epoch, now_ms, -1,
                                     marker=Marker(COMMIT if commit else ABORT, coordinator_epoch))

    def append_as_follower(self, payload: bytes, *, now_ms: int) -> int:
        """Append batches fetched from the leader as they are (offsets and epochs kept).

        Their offsets must increase and the first must start at or after the log end
        offset; gaps are allowed, as Kafka's followers allow them (compaction, and a mirror
        topic's copy of a source with gaps). CRCs are checked. Returns the number of offsets
        the log end moved. Raises InvalidRecordBatch or StorageError (nothing appended).
        """
        batches = split_batches(payload, from_producer=False)
        if not batches:
            return 0
        self._check_fetched_order(batches, "fetched", self.log_end_offset)
        view = memoryview(payload)
        return self._write_fetched([view[: batches[-1][0] + batches[-1][1].size_bytes]], batches, payload,
                                   None, now_ms)

    def append_mirrored(self, payload: bytes, *, leader_epoch: int, now_ms: int) -> MirrorAppend:
        """Leader of a mirror topic: append batches another cluster's leader wrote (a
        consumer's Fetch at read_uncommitted: data, transactional and control batches) at
        their own offsets, as a follower appends (KIP-1279's mirror topics, Confluent's
        cluster linking). Only the partition leader epoch (bytes 12-15, outside the CRC) is
        rewritten, to this cluster's `leader_epoch`: this cluster's replication and
        OffsetForLeaderEpoch answer from its own epochs. Producer state, the last stable
        offset and the aborted-transaction index are built from the copied batches and
        markers as a follower builds them.

        Offsets must increase; gaps stay gaps. Batches wholly below the log end are skipped
        (the retry of an append already done); an empty log whose end is below the first
        batch starts at that batch. A batch that straddles the log end means the two logs
        diverged: UnexpectedAppendOffset. Raises InvalidRecordBatch (CRC, structure, order)
        or StorageError; nothing is appended then.
        """
        batches = split_batches(payload, from_producer=False)
        self._check_fetched_order(batches, "mirrored", batches[0][1].base_offset)
        end = self.log_end_offset
        first_kept, start_at = plan_mirrored_append(self.name, self.log_start_offset, end,
                                                    [(h.base_offset, h.last_offset) for _, h in batches])
        kept = batches[first_kept:]
        skipped = first_kept
        if not kept:
            return MirrorAppend(-1, -1, 0, skipped, end)
        if start_at is not None:
            self.truncate_fully_and_start_at(start_at, now_ms)
        view = memoryview(payload)
        epoch = _I32.pack(leader_epoch)
        iovecs: list[bytes | memoryview] = []
        for pos, h in kept:
            iovecs += [view[pos : pos + 12], epoch, view[pos + 16 : pos + h.size_bytes]]
        first_offset = kept[0][1].base_offset
        moved = self._write_fetched(iovecs, kept, payload, leader_epoch, now_ms)
        return MirrorAppend(first_offset, kept[-1][1].last_offset, moved, skipped, self.log_end_offset)

    def _check_fetched_order(self, batches: list[tuple[int, BatchHeader]], what: str, expected: int) -> None:
        """Fetched batches follow each other, the first at or after `expected`: each starts
        after the one before ends."""
        for i, (_, h) in enumerate(batches):
            if h.base_offset < expected:
                first = batches[0][1]
                raise UnexpectedAppendOffset(
                    f"{self.name}: {what} batch starts at offset {h.base_offset}, "
                    + (f"the log ends at {expected}" if i == 0 else f"below the end {expected} of the one before"),
                    first.base_offset, first.last_offset)
            expected = h.next_offset

    def _write_fetched(self, iovecs: list[bytes | memoryview], batches: list[tuple[int, BatchHeader]],
                       payload: bytes, leader_epoch: int | None, now_ms: int) -> int:
        """Write whole fetched batches at their own offsets and record them (producer state,
        transactions, leader epochs: theirs, or `leader_epoch` when it replaces theirs)."""
        first_offset = self.log_end_offset
        last_offset = batches[-1][1].last_offset
        size = sum(h.size_bytes for _, h in batches)
        self._maybe_roll(size, last_offset, now_ms)
        headers = [h if leader_epoch is None else replace(h, partition_leader_epoch=leader_epoch)
                   for _, h in batches]
        try:
            self.active_segment.append(iovecs, headers)
        except OSError as exc:
            raise StorageError(f"{self.name}: write failed: {exc.strerror}") from exc
        view = memoryview(payload)
        for (pos, _), h in zip(batches, headers, strict=True):
            if h.partition_leader_epoch > self.leader_epochs.latest_epoch:
                self.leader_epochs.assign(h.partition_leader_epoch, h.base_offset)
            marker = read_marker(view[pos : pos + h.size_bytes]) if h.is_control else None
            self._index_completed(self.active_segment, self.producer_state.record(h, marker))
        self.log_end_offset = last_offset + 1
        count = self.log_end_offset - first_offset
        self.unflushed_messages += count
        if self.unflushed_messages >= self.config.flush_messages and self.flush_requests:
            self.flush_requests(self, self.log_end_offset)
        return count

    def promote_producers(self) -> tuple[int, list[int]]:
        """A mirror topic promoted: forget every producer of the source cluster (its ids are
        no ids of this cluster; see docs/design.md, "Mirror topics keep offsets"), carrying
        those with an open transaction until the marker that ends it. Returns (how many were
        forgotten, the carried producer ids)."""
        forgotten, carried = self.producer_state.promote()
        self.take_producer_snapshot()
        return forgotten, carried

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Cut the log back to `offset` (to the start of the batch holding it); the new log end.

        A follower does this where its log and the leader's diverge (KIP-101/279). Segments
        wholly past the cut are deleted; the segment holding it is cut and its indexes rebuilt;
        producer state and the leader-epoch cache follow.
        """
        if offset >= self.log_end_offset:
            return self.log_end_offset
        if offset <= self.log_start_offset:
            # Nothing below the cut survives: start over empty at the log start.
            start = self.log_start_offset
            for seg in self.segments:
                seg.delete()
            self.segments = []
            self._bases = []
            self._add_segment(start, now_ms, create=True)
            new_end = start
        else:
            while self.segments and self.segments[-1].base_offset >= offset:
                self.segments.pop().delete()
                self._bases.pop()
            seg = self.segments[-1]
            cut: int | None = None
            new_end = seg.base_offset
            for pos, header in seg.scan_headers(seg.offset_index.lookup(offset)):
                if header.next_offset > offset:
                    cut, new_end = pos, header.base_offset
                    break
                new_end = header.next_offset
            if cut is not None:
                seg.truncate_to_position(cut)
            seg.rebuild_indexes()
        self.log_end_offset = new_end
        self.recovery_point = min(self.recovery_point, new_end)
        self.leader_epochs.truncate_from_end(new_end)
        self._rebuild_producer_state()
        return new_end

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Drop every segment and start empty at `offset`: a follower whose whole log lies
        below the leader's log start (Kafka's truncateFullyAndStartAt)."""
        for seg in self.segments:
            seg.delete()
        self.segments = []
        self._bases = []
        self._add_segment(offset, now_ms, create=True)
        self._start_offset = offset
        self.log_end_offset = offset
        self.recovery_point = offset
        self.leader_epochs.replace_entries([])
        self.leader_epochs.persist()
        for snapshot in self.dir.glob("*.snapshot"):
            snapshot.unlink()
        self.producer_state = ProducerStateManager()

    def _maybe_roll(self, incoming_bytes: int, last_offset: int, now_ms: int) -> None:
        seg = self.active_segment
        if seg.size_bytes == 0:
            return
        if (
            seg.size_bytes + incoming_bytes > self.config.segment_bytes
            or now_ms - seg.created_ms >= self.config.max_segment_ms
            or seg.offset_index.is_full
            or last_offset - seg.base_offset > _MAX_RELATIVE_OFFSET
        ):
            self.roll(now_ms)

    def roll(self, now_ms: int) -> LogSegment:
        """Start a new active segment at the log end offset; the old one gets fsynced."""
        old = self.active_segment
        if old.size_bytes == 0:
            return old
        old.on_become_inactive()
        new = self._add_segment(self.log_end_offset, now_ms, create=True)
        self.take_producer_snapshot()
        if self.flush_requests:
            self.flush_requests(self, new.base_offset)
        return new

    def take_producer_snapshot(self) -> None:
        path = self.dir / f"{segment_name(self.log_end_offset)}.snapshot"
        tail = self._batch_ending_at(self.log_end_offset)
        write_atomic(path, self.producer_state.to_snapshot(_fingerprint(tail)), fsync=False)
        snapshots = sorted(self.dir.glob("*.snapshot"))
        for old in snapshots[:-_SNAPSHOTS_KEPT]:
            old.unlink(missing_ok=True)

    # ---- flush -------------------------------------------------------------------------

    def flush_segments(self, up_to_offset: int) -> None:
        """fsync every segment holding offsets below `up_to_offset`, and the leader epochs
        (runs in a worker thread; the recovery point moves once it returns)."""
        for seg in list(self.segments):
            if seg.base_offset < up_to_offset:
                try:
                    seg.flush()
                except OSError as exc:
                    if exc.errno != 9:  # EBADF: deleted meanwhile by retention
                        raise
        self.leader_epochs.write(fsync=True)

    def mark_flushed(self, up_to_offset: int, now_ms: int) -> None:
        if up_to_offset > self.recovery_point:
            self.recovery_point = min(up_to_offset, self.log_end_offset)
        self.unflushed_messages = 0 if up_to_offset >= self.log_end_offset else self.unflushed_messages
        self.last_flush_ms = now_ms

    # ---- read --------------------------------------------------------------------------

    def read(self, fetch_offset: int, max_bytes: int, max_offset: int, *, min_one_batch: bool) -> bytes:
        """Whole batches from the one containing `fetch_offset`, ending below `max_offset`.

        At most `max_bytes`, except that with `min_one_batch` the first batch is returned
        whole even if larger.
        """
        if fetch_offset < self.log_start_offset or fetch_offset > self.log_end_offset:
            raise OffsetOutOfRange(fetch_offset, self.log_start_offset, self.log_end_offset)
        if fetch_offset >= max_offset:
            return b""
        idx = bisect.bisect_right(self._bases, fetch_offset) - 1
        for seg in self.segments[idx:]:
            found = seg.find_position(fetch_offset)
            if found is None:
                continue
            pos, first = found
            if first.last_offset >= max_offset:
                return b""
            chunk = seg.read(pos, max_bytes)
            span = scan_batches(chunk, max_offset=max_offset)
            if span.count:
                return chunk if span.end == len(chunk) else chunk[:span.end]
            if min_one_batch:
                return seg.read(pos, first.size_bytes)
            return b""
        return b""

    def replay_records(self) -> tuple[list[KeyValue], dict[int, list[KeyValue]]]:
        """Every record's (key, value), log start to log end, in the order they took
        effect — for coordinators rebuilding state from an internal topic: a transaction's
        records at its COMMIT marker, an aborted one's never; and, per producer id, the
        records of transactions still open."""
        out: list[KeyValue] = []
        open_txns: dict[int, list[KeyValue]] = {}
        offset = self.log_start_offset
        while offset < self.log_end_offset:
            chunk = self.read(offset, _REPLAY_READ_BYTES, self.log_end_offset, min_one_batch=True)
            if not chunk:
                break
            for pos, header in iter_headers(chunk):
                offset = header.next_offset
                if header.is_control:
                    recs = open_txns.pop(header.producer_id, [])
                    if marker_type(chunk, pos) == COMMIT:
                        out.extend(recs)
                    continue
                _, decoded = decode_batch(chunk, pos)
                pairs = [(r.key, r.value) for r in decoded]
                if header.is_transactional:
                    open_txns.setdefault(header.producer_id, []).extend(pairs)
                else:
                    out.extend(pairs)
        return out, open_txns

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp ≥ target, or None."""
        for seg in self.segments:
            if seg.max_timestamp < timestamp_ms:
                continue
            found = seg.find_offset_by_timestamp(timestamp_ms)
            if found is None:
                continue
            pos, header = found
            try:
                _, records = decode_batch(seg.read(pos, header.size_bytes))
            except InvalidRecordBatch as exc:
                # CRC-valid but undecodable records (the produce path does not parse them):
                # answer with the batch, which is as close as the log can tell.
                log.warning("%s: batch at offset %d does not decode (%s)", self.name, header.base_offset, exc)
                return header.base_offset, header.max_timestamp
            for r in records:
                if r.timestamp >= timestamp_ms and r.offset >= self.log_start_offset:
                    return r.offset, r.timestamp
        return None

    def max_timestamp_offset(self) -> tuple[int, int]:
        """(offset, timestamp) of the first record with the largest timestamp (ListOffsets
        -3): the record itself, as Kafka since KAFKA-16310, not the end of its batch."""
        largest = max((seg.max_timestamp for seg in self.segments), default=-1)
        found = self.offset_for_timestamp(largest) if largest >= 0 else None
        return found if found is not None else (-1, -1)

    # ---- retention ---------------------------------------------------------------------

    def delete_old_segments(self, now_ms: int) -> int:
        """Apply retention.ms and retention.bytes; returns the number of segments deleted."""
        if not self.config.delete_enabled:
            return 0
        retention_ms = self.config.retention_ms
        retention_bytes = self.config.retention_bytes
        doomed = 0
        total = self.size_bytes
        for seg in self.segments:
            if seg.size_bytes == 0:
                break
            expired = retention_ms >= 0 and seg.max_timestamp >= 0 and now_ms - seg.max_timestamp > retention_ms
            oversize = retention_bytes >= 0 and total - seg.size_bytes >= retention_bytes
            if not (expired or oversize):
                break
            doomed += 1
            total -= seg.size_bytes
        if doomed == 0:
            return 0
        if doomed == len(self.segments):
            self.roll(now_ms)  # the active segment goes too: keep an empty one at the end
        for seg in self.segments[:doomed]:
            seg.delete()
        del self.segments[:doomed]
        del self._bases[:doomed]
        log.info("retention deleted %d segment(s) of %s; log start offset now %d", doomed, self.name, self.log_start_offset)
        return doomed

    def advance_log_start(self, offset: int) -> int:
        """DeleteRecords (on the leader, and on followers as the leader's log start reaches
        them): records below `offset` are gone for readers, and every segment wholly below it
        is deleted (the active segment stays, as in Kafka). Never moves back; `offset` is at
        most the log end. Returns the number of segments deleted."""
        if offset <= self.log_start_offset:
            return 0
        assert offset <= self.log_end_offset, (self.name, offset, self.log_end_offset)
        self._start_offset = offset
        doomed = 0
        while doomed + 1 < len(self.segments) and self.segments[doomed + 1].base_offset <= offset:
            doomed += 1
        for seg in self.segments[:doomed]:
            seg.delete()
        del self.segments[:doomed]
        del self._bases[:doomed]
        log.info("%s: log start offset now %d (%d segment(s) deleted)", self.name, offset, doomed)
        return doomed

    # ---- shutdown ----------------------------------------------------------------------

    def close(self) -> dict[str, int]:
        """Flush everything and return what a clean start will check."""
        self.active_segment.on_become_inactive()
        self.take_producer_snapshot()
        for seg in self.segments:
            seg.flush()
        self.leader_epochs.write(fsync=True)
        self.recovery_point = self.log_end_offset
        state = {
            "log_end_offset": self.log_end_offset,
            "active_segment_base": self.active_segment.base_offset,
            "active_segment_bytes": self.active_segment.size_bytes,
        }
        for seg in self.segments:
            seg.close()
        return state

    def delete(self) -> None:
        for seg in self.segments:
            seg.close()
        shutil.rmtree(self.dir, ignore_errors=True)


__all__ = [
    "AppendResult",
    "InvalidRecordBatch",
    "Log",
    "MirrorAppend",
    "NotEnoughReplicas",
    "OffsetOutOfRange",
    "OutOfOrderSequence",
    "ProducerFenced",
    "RecordTooLarge",
    "StorageError",
    "UnexpectedAppendOffset",
    "parse_partition_dir",
]
