"""LogSegment: one `.log` file of verbatim record batches plus its two sparse indexes."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cluster.protocol.record_batch import (
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    InvalidRecordBatch,
    iter_headers,
    read_header,
    validate_batch,
)
from cluster.storage.index import CorruptIndex, OffsetIndex, TimeIndex
from cluster.storage.txn_index import TransactionIndex

log = logging.getLogger(__name__)

_SCAN_CHUNK_BYTES = 1 << 20


def _iov_max() -> int:
    try:
        return max(16, int(os.sysconf("SC_IOV_MAX")))
    except (AttributeError, ValueError, OSError):
        return 1024


IOV_MAX = _iov_max()  # buffers one writev takes


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


@dataclass(slots=True)
class RecoveryResult:
    bytes_scanned: int
    batches: int
    truncated_bytes: int
    reason: str | None


class LogSegment:
    """Appends batches at the end of the file and finds them again through the indexes.

    `next_offset` is the offset after the last batch in this segment (its base offset
    while empty); the owning Log knows which segment is active.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        index_max_entries: int,
        created_ms: int,
    ) -> None:
        self.base_offset = base_offset
        stem = directory / segment_name(base_offset)
        self.log_path = stem.with_suffix(".log")
        self.offset_index = OffsetIndex(stem.with_suffix(".index"), base_offset, index_max_entries)
        self.time_index = TimeIndex(stem.with_suffix(".timeindex"), base_offset)
        self.txn_index = TransactionIndex(stem.with_suffix(".txnindex"))
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self.size_bytes = 0
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self._bytes_since_index_entry = 0
        self._indexes_missing = False
        self._fd = -1
        # The leader epoch of the last batch with one (-1: none known), as loaded or appended:
        # a replica's batches never go back to an older epoch (Log._load checks the next one).
        self.last_leader_epoch = -1

    # ---- lifecycle -------------------------------------------------------------------

    def create(self, *, index_files: bool = True) -> None:
        """A new empty segment; without `index_files` its (empty) index files are left to
        `create_index_files` (a new partition's first segment: made in a worker thread)."""
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self.offset_index.path.unlink(missing_ok=True)
        self.time_index.path.unlink(missing_ok=True)
        self.txn_index.delete()
        if index_files:
            self.create_index_files()

    def create_index_files(self) -> None:
        """The index files, empty, where missing (Kafka's layout: every segment has them; an
        entry written first creates its file too). Safe beside the event loop: a segment
        deleted meanwhile gets none (or an orphan the next load removes)."""
        if self.log_path.exists():
            self.offset_index.open()
            self.time_index.open()

    def open_existing(self) -> None:
        self._fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND)
        self.size_bytes = os.fstat(self._fd).st_size
        self._indexes_missing = not (self.offset_index.path.exists() and self.time_index.path.exists())
        self.offset_index.open()
        self.time_index.open()
        self.txn_index.load()

    def load_trusted(self, next_offset_hint: int | None) -> bool:
        """Load indexes of a segment below the recovery point. Returns False if they were rebuilt."""
        try:
            if self._indexes_missing and self.size_bytes:
                raise CorruptIndex(f"{self.log_path}: index files are missing")
            self.offset_index.load(self.size_bytes)
            last = self._last_batch_from_index()
            self.next_offset = last.next_offset if last else self.base_offset
            self.last_leader_epoch = last.partition_leader_epoch if last else -1
            if next_offset_hint is not None and self.next_offset > next_offset_hint:
                raise CorruptIndex(f"{self.log_path}: index points past the next segment")
            self.time_index.load(self.next_offset)
            self.max_timestamp = self.time_index.last_timestamp
            self.offset_of_max_timestamp = self.time_index.last_offset
            return True
        except (CorruptIndex, InvalidRecordBatch) as exc:
            log.warning("rebuilding indexes of %s: %s", self.log_path, exc)
            self.rebuild_indexes()
            return False

    def _last_batch_from_index(self) -> BatchHeader | None:
        """Walk headers from the last index entry to the end to find the last batch."""
        last = None
        for _, header in self.scan_headers(self.offset_index.lookup(1 << 62)):
            last = header
        if last is None and self.size_bytes:
            raise CorruptIndex(f"{self.log_path}: no batch found after the last index entry")
        return last

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the batch headers (no CRC check)."""
        self.offset_index.reset()
        self.time_index.reset()
        self._reset_tracking()
        for pos, header in self.scan_headers(0):
            self._track(pos, header)
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    def first_leader_epoch(self) -> int | None:
        """The leader epoch of the first batch (None: an empty or unreadable start)."""
        if self.size_bytes < BATCH_HEADER_SIZE:
            return None
        try:
            header = read_header(os.pread(self._fd, BATCH_HEADER_SIZE, 0))
        except (InvalidRecordBatch, ValueError):
            return None
        return header.partition_leader_epoch

    def recover(self, on_batch: Callable[[BatchHeader], str | None] | None = None) -> RecoveryResult:
        """Validate every batch (length, CRC) and truncate at the first bad one.

        Indexes are rebuilt as the scan goes. `on_batch` sees each valid header (producer
        state and leader epochs are rebuilt from it) and may refuse it: a reason, and the
        segment is cut before that batch as before a torn one.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self._reset_tracking()
        pos = 0
        batches = 0
        reason = None
        expected_offset = self.base_offset
        chunk = b""
        chunk_start = 0
        while pos < self.size_bytes:
            rel = pos - chunk_start
            if len(chunk) - rel < LOG_OVERHEAD:
                chunk = os.pread(self._fd, min(_SCAN_CHUNK_BYTES, self.size_bytes - pos), pos)
                chunk_start, rel = pos, 0
                if len(chunk) < LOG_OVERHEAD:
                    reason = f"{self.size_bytes - pos} trailing bytes are shorter than a batch header"
                    break
            header_len = int.from_bytes(chunk[rel + 8 : rel + 12], "big", signed=True)
            size = header_len + LOG_OVERHEAD
            if header_len < BATCH_HEADER_SIZE - LOG_OVERHEAD or pos + size > self.size_bytes:
                reason = f"batch at position {pos} declares {header_len} bytes past the end of the log"
                break
            if rel + size > len(chunk):
                chunk = os.pread(self._fd, max(size, min(_SCAN_CHUNK_BYTES, self.size_bytes - pos)), pos)
                chunk_start, rel = pos, 0
            try:
                header = validate_batch(chunk, rel, from_producer=False)
            except InvalidRecordBatch as exc:
                reason = f"batch at position {pos}: {exc}"
                break
            if header.base_offset < expected_offset:
                reason = f"batch at position {pos} has offset {header.base_offset} below {expected_offset}"
                break
            if on_batch is not None:
                refused = on_batch(header)
                if refused is not None:
                    reason = refused
                    break
            self._track(pos, header)
            expected_offset = header.next_offset
            pos += size
            batches += 1
        truncated = self.size_bytes - pos
        if truncated:
            self.truncate_to_position(pos)
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
        return RecoveryResult(bytes_scanned=pos, batches=batches, truncated_bytes=truncated, reason=reason)

    def flush(self) -> None:
        if self._fd < 0:
            return  # closed meanwhile (compaction or retention replaced it)
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()

    def on_become_inactive(self) -> None:
        """A rolled segment records its final max timestamp in the time index."""
        self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)

    def release_index_files(self) -> None:
        """Close the index files' descriptors; the next index write opens them again."""
        self.offset_index.close()
        self.time_index.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.offset_index.close()
        self.time_index.close()

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            path.unlink(missing_ok=True)
        self.txn_index.delete()

    # ---- append ----------------------------------------------------------------------

    def _reset_tracking(self) -> None:
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = self.base_offset
        self._bytes_since_index_entry = 0
        self.last_leader_epoch = -1

    def _track(self, position: int, header: BatchHeader) -> None:
        """Index bookkeeping for a batch now at `position` (its offsets already final)."""
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset
        if self._bytes_since_index_entry > self.index_interval_bytes:
            self.offset_index.append(header.last_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.size_bytes
        self.next_offset = header.next_offset
        if header.partition_leader_epoch >= 0:
            self.last_leader_epoch = header.partition_leader_epoch

    def append(self, iovecs: Sequence[bytes | memoryview], batches: Sequence[BatchHeader]) -> None:
        """Write already-patched batches (as iovecs) and index them.

        On a failed or short write the file is cut back so the segment holds whole batches only.
        """
        start = self.size_bytes
        try:
            # writev takes at most IOV_MAX buffers (EINVAL beyond: a follower or a mirror
            # appending thousands of one-record batches at once).
            for first in range(0, len(iovecs), IOV_MAX):
                part = iovecs[first:first + IOV_MAX]
                want = sum(len(v) for v in part)
                written = os.writev(self._fd, part)
                if written < want:
                    # A short writev: finish the remainder the slow way.
                    remainder = memoryview(b"".join(bytes(v) for v in part))[written:]
                    while remainder:
                        remainder = remainder[os.write(self._fd, remainder):]
        except OSError:
            os.ftruncate(self._fd, start)
            raise
        pos = start
        for header in batches:
            self._track(pos, header)
            pos += header.size_bytes
        self.size_bytes = pos

    # ---- read ------------------------------------------------------------------------

    def scan_headers(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        """Batch headers from `position` to the end of the file, read in chunks."""
        pos = position
        while pos < self.size_bytes:
            chunk = os.pread(self._fd, min(_SCAN_CHUNK_BYTES, self.size_bytes - pos), pos)
            advanced = False
            for rel, header in iter_headers(chunk):
                yield pos + rel, header
                advanced = True
                last_end = rel + header.size_bytes
            if advanced:
                pos += last_end
                continue
            # The next batch is larger than the chunk: read its header alone.
            if self.size_bytes - pos < BATCH_HEADER_SIZE:
                return
            header = read_header(os.pread(self._fd, BATCH_HEADER_SIZE, pos))
            if header.batch_length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
                return
            yield pos, header
            pos += header.size_bytes

    def find_position(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is ≥ offset."""
        for pos, header in self.scan_headers(self.offset_index.lookup(offset)):
            if header.last_offset >= offset:
                return pos, header
        return None

    def read(self, position: int, size_bytes: int) -> bytes:
        return os.pread(self._fd, min(size_bytes, self.size_bytes - position), position)

    def find_offset_by_timestamp(self, timestamp_ms: int) -> tuple[int, BatchHeader] | None:
        """First batch (position, header) whose max timestamp is ≥ the target."""
        start_offset = self.time_index.lookup(timestamp_ms)
        start_pos = self.offset_index.lookup(start_offset)
        for pos, header in self.scan_headers(start_pos):
            if header.max_timestamp >= timestamp_ms:
                return pos, header
        return None

    # ---- truncation ------------------------------------------------------------------

    def truncate_to_position(self, position: int) -> None:
        os.ftruncate(self._fd, position)
        self.size_bytes = position
        self.offset_index.truncate_to_position(position)

