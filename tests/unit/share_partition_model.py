"""The per-record share partition that cluster/groups/share_partition.py replaced: every
in-flight offset its own object. Kept as the model the run-based one is checked against
(tests/unit/test_share_partition.py: the same seeded operations on both, every answer and
every offset's state compared). Slow and simple on purpose."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from cluster.groups.share_partition import (
    ACQUIRE_RECORDS_MAX,
    DELIVERY_COUNT_LIMIT_DEFAULT,
    LOCK_DURATION_MS_DEFAULT,
    MAX_IN_FLIGHT_DEFAULT,
    AcknowledgeType,
    AcquiredRecords,
    RecordState,
    ShareState,
    StateBatch,
)
from cluster.protocol.errors import ErrorCode


@dataclass
class _InFlight:
    state: RecordState = RecordState.AVAILABLE
    delivery_count: int = 0
    member_id: str | None = None
    lock_deadline_ms: int = 0


def _ascending(offsets: Iterable[int], skipped: set[int]) -> Iterator[int]:
    """The offsets a fetch read (ascending) with the skipped ones merged in, in order; lazily,
    so an acquisition that reaches its limit reads no further."""
    if not skipped:
        return iter(offsets)
    return heapq.merge(offsets, sorted(skipped))


@dataclass
class ModelSharePartition:
    """One share group's view of one topic partition, record by record."""

    start_offset: int
    lock_duration_ms: int = LOCK_DURATION_MS_DEFAULT
    delivery_count_limit: int = DELIVERY_COUNT_LIMIT_DEFAULT
    max_in_flight: int = MAX_IN_FLIGHT_DEFAULT
    state_epoch: int = 0
    _records: dict[int, _InFlight] = field(default_factory=dict)
    _end_offset: int = -1
    # Below this offset (and at or above the start) no in-flight record is AVAILABLE: where
    # fetch_offset() starts looking. Lowered when a record becomes AVAILABLE again.
    _available_from: int = 0
    # (lock deadline, offset) of acquired records, a heap; entries whose record was settled,
    # released or renewed since are stale and dropped when they reach the top (or when stale
    # ones outnumber the live ones: the heap is rebuilt).
    _locks: list[tuple[int, int]] = field(default_factory=list)
    _acquired: int = 0  # records ACQUIRED now

    def __post_init__(self) -> None:
        if self.start_offset < 0:
            raise ValueError(f"start offset {self.start_offset} is negative")
        self.configure(lock_duration_ms=self.lock_duration_ms, delivery_count_limit=self.delivery_count_limit,
                       max_in_flight=self.max_in_flight)
        if self._end_offset < self.start_offset:
            self._end_offset = self.start_offset
        self._available_from = self.start_offset

    def configure(self, *, lock_duration_ms: int, delivery_count_limit: int, max_in_flight: int) -> None:
        """The group's limits now (its configs changed, or not): they apply from the next lock
        taken or renewed, release, lock expiry and acquisition on. Locks already running keep
        their deadline; records in flight beyond a lowered `max_in_flight` stay (no new ones
        are acquired until the window is below it)."""
        if lock_duration_ms <= 0 or delivery_count_limit <= 0 or max_in_flight <= 0:
            raise ValueError(f"lock duration ({lock_duration_ms} ms), delivery count limit ({delivery_count_limit}) "
                             f"and in-flight records ({max_in_flight}) must be positive")
        self.lock_duration_ms = lock_duration_ms
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight = max_in_flight

    # ---- what a fetch reads ------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        """SPEO: the offset after the last record ever acquired (or archived as a gap)."""
        return self._end_offset

    def in_flight(self) -> int:
        return self._end_offset - self.start_offset

    def fetch_offset(self) -> int | None:
        """Where the next acquisition starts reading: the first AVAILABLE in-flight record, or
        the SPEO when none is and the in-flight window has room; None when it is full."""
        records, available = self._records, RecordState.AVAILABLE
        offset = max(self.start_offset, self._available_from)
        while offset < self._end_offset:
            got = records.get(offset)
            if got is None or got.state == available:
                break
            offset += 1
        self._available_from = offset
        if offset < self._end_offset:
            return offset
        return self._end_offset if self.in_flight() < self.max_in_flight else None

    def acquire(self, member_id: str, offsets: Iterable[int], now_ms: int, max_records: int,
                *, skipped: Iterable[int] = (), batch_ends: Sequence[int] = ()) -> list[AcquiredRecords]:
        """Acquire for `member_id` the records at `offsets` (ascending: the record offsets a
        fetch read, from fetch_offset() on) that are AVAILABLE, or new ones beyond the SPEO
        while the in-flight window has room, at most `max_records` (ShareAcquireMode
        record_limit). With `batch_ends` (the last offsets of the log batches read, ascending:
        batch_optimized, Kafka's default) an acquisition that reaches `max_records` goes on to
        the end of the log batch holding its last record, so whole batches are acquired, still
        within the in-flight window and ACQUIRE_RECORDS_MAX. `skipped`: offsets of the read
        range that are no records to deliver (transaction markers, an aborted transaction's
        records under read_committed): archived as they are passed. Answers the acquired
        ranges (runs of consecutive offsets with one delivery count)."""
        limit = min(max(0, max_records), ACQUIRE_RECORDS_MAX)
        skip = set(skipped)
        got: list[int] = []
        batch_last = -1  # batch_optimized: the limit was reached in the batch ending here
        deadline = now_ms + self.lock_duration_ms
        previous = -1
        for offset in _ascending(offsets, skip):
            if offset <= previous:
                continue  # named twice
            previous = offset
            if len(got) >= limit and (offset > batch_last or len(got) >= ACQUIRE_RECORDS_MAX):
                break
            if offset < self.start_offset:
                continue
            if offset >= self._end_offset:
                if self.in_flight() >= self.max_in_flight:
                    break
                for gap in range(self._end_offset, offset):  # offsets the log does not hold
                    self._records[gap] = _InFlight(RecordState.ARCHIVED)
                self._end_offset = offset + 1
                record = self._records[offset] = _InFlight()
            else:
                record = self._records.setdefault(offset, _InFlight())
                if record.state != RecordState.AVAILABLE:
                    continue
            if offset in skip or record.delivery_count >= self.delivery_count_limit:
                record.state = RecordState.ARCHIVED  # not a record, or the limit was lowered since
                continue
            record.state = RecordState.ACQUIRED
            record.delivery_count += 1
            record.member_id = member_id
            record.lock_deadline_ms = deadline
            self._acquired += 1
            self._lock(deadline, offset)
            got.append(offset)
            if len(got) == limit and batch_ends:
                at = bisect_left(batch_ends, offset)
                batch_last = batch_ends[at] if at < len(batch_ends) else offset
        self._advance()
        return self._runs(got)

    def _runs(self, offsets: Sequence[int]) -> list[AcquiredRecords]:
        out: list[AcquiredRecords] = []
        first = last = count = -1
        for offset in offsets:
            n = self._records[offset].delivery_count
            if offset == last + 1 and n == count:
                last = offset
                continue
            if first >= 0:
                out.append(AcquiredRecords(first, last, count))
            first = last = offset
            count = n
        if first >= 0:
            out.append(AcquiredRecords(first, last, count))
        return out

    # ---- locks -------------------------------------------------------------------------

    def _lock(self, deadline_ms: int, offset: int) -> None:
        heapq.heappush(self._locks, (deadline_ms, offset))
        if len(self._locks) > 2 * self._acquired + 64:  # mostly stale: keep only the live ones
            self._locks = [(r.lock_deadline_ms, o) for o, r in self._records.items()
                           if r.state == RecordState.ACQUIRED]
            heapq.heapify(self._locks)

    def _first_lock(self) -> tuple[int, int] | None:
        """The live lock that runs out first: (deadline, offset); stale entries dropped."""
        locks, records = self._locks, self._records
        while locks:
            deadline, offset = locks[0]
            record = records.get(offset)
            if record is not None and record.state == RecordState.ACQUIRED and record.lock_deadline_ms == deadline:
                return deadline, offset
            heapq.heappop(locks)
        return None

    # ---- acknowledgements --------------------------------------------------------------

    def acknowledge(self, member_id: str, batches: Sequence[tuple[int, int, Sequence[int]]],
                    now_ms: int, *, renew_allowed: bool = True, renew_enabled: bool = True) -> ErrorCode:
        """ShareAcknowledge's (or ShareFetch's) AcknowledgementBatches of one partition: (first
        offset, last offset, types: one for the whole range or one per offset), in ascending
        order. All of them or none, as Kafka checks them: INVALID_REQUEST for a malformed batch
        (last before first, out of order, no types or neither one nor one per offset, an
        unknown type, RENEW where the request version or flag does not allow it, a range past
        the end offset); INVALID_RECORD_STATE when an offset is not acquired by `member_id`
        (never delivered, already acknowledged, its lock timed out and taken by another), or
        a RENEW while the group disables it (`share.renew.acknowledge.enable=false`, as Kafka).
        Offsets below the start offset are skipped: already settled."""
        plan: list[tuple[int, AcknowledgeType]] = []
        previous_last = -1
        for first, last, types in batches:
            if last < first or first <= previous_last or not types \
                    or (len(types) != 1 and len(types) != last - first + 1):
                return ErrorCode.invalid_request
            previous_last = last
            if last >= self._end_offset:
                return ErrorCode.invalid_request
            kinds: list[AcknowledgeType] = []
            for raw in types:
                try:
                    kinds.append(AcknowledgeType(raw))
                except ValueError:
                    return ErrorCode.invalid_request
            if AcknowledgeType.RENEW in kinds and not renew_allowed:
                return ErrorCode.invalid_request
            records, acquired = self._records, RecordState.ACQUIRED
            for offset in range(max(first, self.start_offset), last + 1):
                kind = kinds[0] if len(kinds) == 1 else kinds[offset - first]
                record = records.get(offset)
                if record is None or record.state != acquired or record.member_id != member_id:
                    return ErrorCode.invalid_record_state
                if kind == AcknowledgeType.RENEW and not renew_enabled:
                    return ErrorCode.invalid_record_state
                plan.append((offset, kind))
        for offset, kind in plan:
            record = self._records[offset]
            if kind == AcknowledgeType.ACCEPT:
                self._settle(record, RecordState.ACKNOWLEDGED)
            elif kind in (AcknowledgeType.REJECT, AcknowledgeType.GAP):
                self._settle(record, RecordState.ARCHIVED)
            elif kind == AcknowledgeType.RELEASE:
                self._release(offset, record)
            else:  # RENEW: the lock starts again
                record.lock_deadline_ms = now_ms + self.lock_duration_ms
                self._lock(record.lock_deadline_ms, offset)
        self._advance()
        return ErrorCode.none

    def _settle(self, record: _InFlight, state: RecordState) -> None:
        """An acquired record's delivery ends in `state`."""
        record.state, record.member_id, record.lock_deadline_ms = state, None, 0
        self._acquired -= 1

    def _release(self, offset: int, record: _InFlight) -> None:
        final = record.delivery_count >= self.delivery_count_limit
        self._settle(record, RecordState.ARCHIVED if final else RecordState.AVAILABLE)
        if not final and offset < self._available_from:
            self._available_from = offset

    # ---- time and membership -----------------------------------------------------------

    def expire_locks(self, now_ms: int) -> int:
        """Release the acquired records whose lock has run out; how many."""
        expired = 0
        while (first := self._first_lock()) is not None and first[0] <= now_ms:
            heapq.heappop(self._locks)
            self._release(first[1], self._records[first[1]])
            expired += 1
        if expired:
            self._advance()
        return expired

    def next_lock_deadline_ms(self) -> int | None:
        """When expire_locks next has work, None while nothing is acquired."""
        first = self._first_lock()
        return None if first is None else first[0]

    def release_member(self, member_id: str) -> int:
        """A member left or was fenced: its acquired records are released; how many."""
        released = 0
        for offset, record in self._records.items():
            if record.state == RecordState.ACQUIRED and record.member_id == member_id:
                self._release(offset, record)
                released += 1
        if released:
            self._advance()
        return released

    def acquired_by(self, member_id: str) -> list[int]:
        return sorted(o for o, r in self._records.items()
                      if r.state == RecordState.ACQUIRED and r.member_id == member_id)

    def state_of(self, offset: int) -> tuple[RecordState, int] | None:
        """(state, delivery count) of an in-flight offset (a never-fetched one is AVAILABLE, 0);
        None outside the window (below it: settled and gone; above: not read yet)."""
        if not self.start_offset <= offset < self._end_offset:
            return None
        record = self._records.get(offset)
        return (RecordState.AVAILABLE, 0) if record is None else (record.state, record.delivery_count)

    def move_log_start(self, log_start_offset: int) -> None:
        """Retention (or DeleteRecords) removed the records below `log_start_offset`: the
        window starts there at least (those records cannot be delivered any more)."""
        if log_start_offset <= self.start_offset:
            return
        for offset in range(self.start_offset, min(log_start_offset, self._end_offset)):
            record = self._records.pop(offset, None)
            if record is not None and record.state == RecordState.ACQUIRED:
                self._acquired -= 1
        self.start_offset = log_start_offset
        self._end_offset = max(self._end_offset, log_start_offset)
        self._advance()

    def reset(self, start_offset: int) -> None:
        """AlterShareGroupOffsets (the group empty): the window starts over at `start_offset`."""
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} is negative")
        self._records.clear()
        self._locks, self._acquired = [], 0
        self.start_offset = self._end_offset = self._available_from = start_offset
        self.state_epoch += 1

    def _advance(self) -> None:
        """The SPSO moves over settled records (acknowledged or archived)."""
        while self.start_offset < self._end_offset:
            record = self._records.get(self.start_offset)
            if record is None or record.state not in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED):
                break
            del self._records[self.start_offset]
            self.start_offset += 1

    # ---- durable state -----------------------------------------------------------------

    def snapshot(self) -> ShareState:
        """The share partition as the share coordinator keeps it: ACQUIRED as AVAILABLE (a
        lock does not survive), runs of one state and delivery count joined, never-delivered
        available records left out."""
        batches: list[StateBatch] = []
        records, available, acquired = self._records, RecordState.AVAILABLE, RecordState.ACQUIRED
        first = last = -1
        run: tuple[RecordState, int] = (available, 0)
        for offset in range(self.start_offset, self._end_offset):
            record = records.get(offset)
            if record is None or (record.state == available and record.delivery_count == 0):
                continue
            kind = (available if record.state == acquired else record.state, record.delivery_count)
            if offset == last + 1 and kind == run:
                last = offset
                continue
            if first >= 0:
                batches.append(StateBatch(first, last, *run))
            first = last = offset
            run = kind
        if first >= 0:
            batches.append(StateBatch(first, last, *run))
        return ShareState(self.start_offset, self.state_epoch, tuple(batches))

    @classmethod
    def restore(cls, state: ShareState, *, lock_duration_ms: int = LOCK_DURATION_MS_DEFAULT,
                delivery_count_limit: int = DELIVERY_COUNT_LIMIT_DEFAULT,
                max_in_flight: int = MAX_IN_FLIGHT_DEFAULT) -> ModelSharePartition:
        """The share partition a snapshot kept (a new leader, a broker restarted)."""
        part = cls(state.start_offset, lock_duration_ms, delivery_count_limit, max_in_flight, state.state_epoch)
        for batch in state.batches:
            if batch.first_offset < state.start_offset or batch.last_offset < batch.first_offset:
                raise ValueError(f"state batch [{batch.first_offset}, {batch.last_offset}] is outside the share "
                                 f"partition starting at {state.start_offset}")
            kind = RecordState.AVAILABLE if batch.state == RecordState.ACQUIRED else batch.state
            if kind == RecordState.AVAILABLE and batch.delivery_count >= delivery_count_limit:
                kind = RecordState.ARCHIVED  # its last delivery ended with the failure: as a lock timing out
            for offset in range(batch.first_offset, batch.last_offset + 1):
                part._records[offset] = _InFlight(kind, batch.delivery_count)
            part._end_offset = max(part._end_offset, batch.last_offset + 1)
        part._advance()
        return part
