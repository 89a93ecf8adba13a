"""A share partition (KIP-932, Kafka 4.2's queues): which records of one topic partition a
share group has delivered, to whom, and with what outcome (sans-IO: no clock, no log, no
network; the broker's shell feeds it fetched offsets, acknowledgements and the time).

Records from the share-partition start offset (SPSO) to the end offset (SPEO, exclusive) are
*in flight*, each in one state:

    AVAILABLE     may be acquired (never delivered yet, or released, or its lock timed out)
    ACQUIRED      delivered to one member, locked for `lock_duration_ms`
    ACKNOWLEDGED  accepted: done
    ARCHIVED      rejected, delivered `delivery_count_limit` times without success, a gap
                  (an offset without a record: compaction, transaction markers) or an aborted
                  transaction's record (read_committed): never delivered again

Every acquisition counts a delivery. An acquired record goes back to AVAILABLE when its member
releases it, its lock times out or its member leaves, unless it has been delivered
`delivery_count_limit` times: then it is ARCHIVED. No record is ever ACQUIRED by two members at
once, and none leaves the in-flight window before it is ACKNOWLEDGED or ARCHIVED: the SPSO
moves only over those (or past offsets retention deleted from the log).

The three limits (`lock_duration_ms`, `delivery_count_limit`, `max_in_flight`) are the share
group's configs and may change while the share partition is loaded (`configure`): as Kafka
reads them at every use, a new value applies to what comes next (a lock taken or renewed, a
record released or timed out, an acquisition), never to a lock already running. One
difference: a record that waits AVAILABLE with as many deliveries as a lowered limit allows is
archived when next reached, not delivered once more (Kafka archives it only at its next
release), so no record is ever delivered more often than the limit in force.

What is kept durable (the share coordinator's state, `snapshot`/`restore`) is the SPSO and
the in-flight records that are not plain AVAILABLE-and-never-delivered; an ACQUIRED record is
kept as AVAILABLE with its delivery count, as Kafka's share coordinator keeps it: after a
broker failure its lock is void and it is delivered again, unless that was its last delivery
(then it is archived, as when its lock times out).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from cluster.protocol.errors import ErrorCode

LOCK_DURATION_MS_DEFAULT = 30_000  # group.share.record.lock.duration.ms
DELIVERY_COUNT_LIMIT_DEFAULT = 5  # group.share.delivery.count.limit
MAX_IN_FLIGHT_DEFAULT = 2_000  # group.share.partition.max.record.locks
ACQUIRE_RECORDS_MAX = 10_000  # records one acquisition takes at most, whatever the fetch asks


class RecordState(IntEnum):
    """A record's state, numbered as in Kafka's share-group state records."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AcknowledgeType(IntEnum):
    """ShareFetch/ShareAcknowledge acknowledgement types (KIP-932; RENEW from KIP-1222)."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


@dataclass(frozen=True)
class AcquiredRecords:
    """ShareFetch's AcquiredRecords: offsets [first, last] delivered `delivery_count` times."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class StateBatch:
    """A run of in-flight records with one state and delivery count, as kept durable."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int


@dataclass(frozen=True)
class ShareState:
    """What the share coordinator keeps of a share partition."""

    start_offset: int
    state_epoch: int
    batches: tuple[StateBatch, ...] = ()


@dataclass(slots=True)
class _Run:
    """In-flight records [first, last] in one state: the same delivery count and, while
    ACQUIRED, the same member and lock deadline (Kafka's InFlightBatch, split per offset
    only where an acknowledgement or a lock splits it)."""

    first: int
    last: int
    state: RecordState = RecordState.AVAILABLE
    delivery_count: int = 0
    member_id: str | None = None
    lock_deadline_ms: int = 0

    def same(self, other: _Run) -> bool:
        return (self.state, self.delivery_count, self.member_id, self.lock_deadline_ms) == (
            other.state, other.delivery_count, other.member_id, other.lock_deadline_ms)


class _Acquisition:
    """One acquisition's progress: the limit and the batch it ends in (see `acquire`)."""

    __slots__ = ("limit", "taken", "batch_ends", "batch_last", "runs")

    def __init__(self, limit: int, batch_ends: Sequence[int]) -> None:
        self.limit = limit
        self.taken = 0
        self.batch_ends = batch_ends
        self.batch_last = -1  # batch_optimized: the limit was reached in the batch ending here
        self.runs: list[AcquiredRecords] = []

    def last_allowed(self, offset: int, hi: int, acquiring: bool) -> int:
        """The last offset of [offset, hi] this acquisition may still pass (acquire, or
        archive), offset - 1 when none: until the limit, then to the end of the log batch
        where it was reached (never past ACQUIRE_RECORDS_MAX acquired)."""
        if self.taken < self.limit:
            return min(hi, offset + self.limit - self.taken - 1) if acquiring else hi
        if offset > self.batch_last or self.taken >= ACQUIRE_RECORDS_MAX:
            return offset - 1
        hi = min(hi, self.batch_last)
        return min(hi, offset + ACQUIRE_RECORDS_MAX - self.taken - 1) if acquiring else hi

    def took(self, first: int, last: int, delivery_count: int) -> None:
        before = self.taken
        self.taken += last - first + 1
        previous = self.runs[-1] if self.runs else None
        if previous is not None and previous.last_offset == first - 1 and previous.delivery_count == delivery_count:
            self.runs[-1] = AcquiredRecords(previous.first_offset, last, delivery_count)
        else:
            self.runs.append(AcquiredRecords(first, last, delivery_count))
        if before < self.limit <= self.taken and self.batch_ends:
            reached = first + (self.limit - before) - 1  # the offset where the limit was reached
            at = bisect_left(self.batch_ends, reached)
            self.batch_last = self.batch_ends[at] if at < len(self.batch_ends) else reached


@dataclass
class SharePartition:
    """One share group's view of one topic partition (see the module's docstring). The
    in-flight window [start_offset, end_offset) is held as runs (`_Run`), ascending and
    contiguous: every offset of the window is in exactly one run."""

    start_offset: int
    lock_duration_ms: int = LOCK_DURATION_MS_DEFAULT
    delivery_count_limit: int = DELIVERY_COUNT_LIMIT_DEFAULT
    max_in_flight: int = MAX_IN_FLIGHT_DEFAULT
    state_epoch: int = 0
    _runs: list[_Run] = field(default_factory=list)
    _end_offset: int = -1
    # Below this offset (and at or above the start) no in-flight record is AVAILABLE: where
    # fetch_offset() starts looking. Lowered when a record becomes AVAILABLE again.
    _available_from: int = 0
    # (lock deadline, first offset) of acquired runs, a heap; entries whose run was settled,
    # released, renewed or split since are stale and dropped when they reach the top (or
    # when stale ones outnumber the live ones: the heap is rebuilt).
    _locks: list[tuple[int, int]] = field(default_factory=list)
    _acquired_runs: int = 0  # runs ACQUIRED now

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

    # ---- runs ----------------------------------------------------------------------------

    def _index(self, offset: int) -> int:
        """The index of the run holding `offset` (in the window)."""
        return bisect_right(self._runs, offset, key=_first) - 1

    def _split(self, offset: int) -> int:
        """A run boundary at `offset` (start < offset < end, or at either edge): the index of
        the run that begins there (len(runs) at the end)."""
        runs = self._runs
        if offset >= self._end_offset:
            return len(runs)
        at = self._index(offset)
        if at < 0:
            return 0
        run = runs[at]
        if run.first == offset:
            return at
        tail = _Run(offset, run.last, run.state, run.delivery_count, run.member_id, run.lock_deadline_ms)
        run.last = offset - 1
        runs.insert(at + 1, tail)
        if tail.state == RecordState.ACQUIRED:
            self._acquired_runs += 1
            self._lock(tail.lock_deadline_ms, offset)
        return at + 1

    def _span(self, first: int, last: int) -> tuple[int, int]:
        """Runs exactly covering [first, last] (within the window): (from index, to index exclusive)."""
        lo = self._split(first)
        hi = self._split(last + 1)
        return lo, hi

    def _join(self, lo: int, hi: int) -> None:
        """Neighbouring runs in [lo - 1, hi] that are alike become one."""
        runs = self._runs
        i = max(1, lo)
        end = min(hi + 1, len(runs))
        while i < end:
            a, b = runs[i - 1], runs[i]
            if a.last + 1 == b.first and a.same(b):
                a.last = b.last
                del runs[i]
                end -= 1
                if b.state == RecordState.ACQUIRED:
                    self._acquired_runs -= 1  # its lock entry names b.first: stale now (a's holds)
            else:
                i += 1

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
        offset = max(self.start_offset, self._available_from)
        if offset < self._end_offset:
            runs = self._runs
            for i in range(self._index(offset), len(runs)):
                if runs[i].state == RecordState.AVAILABLE:
                    self._available_from = max(offset, runs[i].first)
                    return self._available_from
        self._available_from = self._end_offset
        return self._end_offset if self.in_flight() < self.max_in_flight else None

    def acquire(self, member_id: str, offsets: Iterable[int], now_ms: int, max_records: int,
                *, skipped: Iterable[int] = (), batch_ends: Sequence[int] = ()) -> list[AcquiredRecords]:
        """`acquire_ranges` of the record offsets a fetch read (ascending) and the skipped
        ones (an offset in both is skipped)."""
        skip = set(skipped)
        return self.acquire_ranges(member_id, _ranges(offsets, skip), now_ms, max_records,
                                   skipped=_ranges(sorted(skip), set()), batch_ends=batch_ends)

    def acquire_ranges(self, member_id: str, ranges: Sequence[tuple[int, int]], now_ms: int, max_records: int,
                       *, skipped: Sequence[tuple[int, int]] = (),
                       batch_ends: Sequence[int] = ()) -> list[AcquiredRecords]:
        """Acquire for `member_id` the records in `ranges` (ascending, disjoint [first, last]:
        the records a fetch read, from fetch_offset() on) that are AVAILABLE, or new ones beyond
        the SPEO while the in-flight window has room, at most `max_records` (ShareAcquireMode
        record_limit). With `batch_ends` (the last offsets of the log batches read, ascending:
        batch_optimized, Kafka's default) an acquisition that reaches `max_records` goes on to
        the end of the log batch holding its last record, so whole batches are acquired, still
        within the in-flight window and ACQUIRE_RECORDS_MAX. `skipped`: ranges of the read
        (disjoint from `ranges`) that are no records to deliver (transaction markers, an
        aborted transaction's records under read_committed): archived as they are passed.
        Answers the acquired ranges (runs of consecutive offsets with one delivery count)."""
        job = _Acquisition(min(max(0, max_records), ACQUIRE_RECORDS_MAX), batch_ends)
        deadline = now_ms + self.lock_duration_ms
        for first, last, skip in _merged(ranges, skipped):
            if not self._pass(member_id, job, max(first, self.start_offset), last, skip, deadline):
                break
        self._advance()
        return job.runs

    def _pass(self, member_id: str, job: _Acquisition, first: int, last: int, skip: bool, deadline: int) -> bool:
        """The acquisition passes over [first, last]: False when it stops there."""
        offset = first
        while offset <= last:
            if offset < self._end_offset:
                at = self._index(offset)
                run = self._runs[at]
                hi = min(last, run.last)
                if run.state != RecordState.AVAILABLE:
                    offset = hi + 1
                    if job.taken >= job.limit and (offset - 1 > job.batch_last or job.taken >= ACQUIRE_RECORDS_MAX):
                        return False  # passing over them needed the acquisition not to have stopped
                    continue
                acquiring = not skip and run.delivery_count < self.delivery_count_limit
                hi = job.last_allowed(offset, hi, acquiring)
                if hi < offset:
                    return False
                lo_i, hi_i = self._span(offset, hi)
                for r in self._runs[lo_i:hi_i]:
                    self._take(member_id, job, r, acquiring, deadline)
                self._join(lo_i, hi_i)
                offset = hi + 1
                continue
            # beyond the SPEO: new records, while the in-flight window has room
            if self.in_flight() >= self.max_in_flight:
                return False
            hi = job.last_allowed(offset, last, not skip)
            if hi < offset:
                return False
            hi = min(hi, max(offset, self.start_offset + self.max_in_flight - 1))
            if offset > self._end_offset:  # offsets the log does not hold
                self._append(_Run(self._end_offset, offset - 1, RecordState.ARCHIVED))
            run = _Run(offset, hi)
            self._append(run)
            self._take(member_id, job, run, not skip, deadline)
            self._join(len(self._runs) - 2, len(self._runs) - 1)
            offset = hi + 1
        return True

    def _append(self, run: _Run) -> None:
        self._runs.append(run)
        self._end_offset = run.last + 1

    def _take(self, member_id: str, job: _Acquisition, run: _Run, acquiring: bool, deadline: int) -> None:
        if not acquiring:
            run.state = RecordState.ARCHIVED  # not a record, or the limit was lowered since
            return
        run.state = RecordState.ACQUIRED
        run.delivery_count += 1
        run.member_id = member_id
        run.lock_deadline_ms = deadline
        self._acquired_runs += 1
        self._lock(deadline, run.first)
        job.took(run.first, run.last, run.delivery_count)

    # ---- locks -------------------------------------------------------------------------

    def _lock(self, deadline_ms: int, offset: int) -> None:
        heapq.heappush(self._locks, (deadline_ms, offset))
        if len(self._locks) > 2 * self._acquired_runs + 64:  # mostly stale: keep only the live ones
            self._locks = [(r.lock_deadline_ms, r.first) for r in self._runs if r.state == RecordState.ACQUIRED]
            heapq.heapify(self._locks)

    def _first_lock(self) -> _Run | None:
        """The acquired run whose lock runs out first; stale entries dropped."""
        locks, runs = self._locks, self._runs
        while locks:
            deadline, offset = locks[0]
            if self.start_offset <= offset < self._end_offset:
                run = runs[self._index(offset)]
                if run.first == offset and run.state == RecordState.ACQUIRED and run.lock_deadline_ms == deadline:
                    return run
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
        plan: list[tuple[int, int, AcknowledgeType]] = []
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
            for lo, hi, kind in _kind_runs(max(first, self.start_offset), last, first, kinds):
                offset = lo
                while offset <= hi:
                    run = self._runs[self._index(offset)]
                    if run.state != RecordState.ACQUIRED or run.member_id != member_id:
                        return ErrorCode.invalid_record_state
                    if kind == AcknowledgeType.RENEW and not renew_enabled:
                        return ErrorCode.invalid_record_state
                    offset = run.last + 1
                plan.append((lo, hi, kind))
        for lo, hi, kind in plan:
            lo_i, hi_i = self._span(lo, hi)
            for run in self._runs[lo_i:hi_i]:
                if kind == AcknowledgeType.ACCEPT:
                    self._settle(run, RecordState.ACKNOWLEDGED)
                elif kind in (AcknowledgeType.REJECT, AcknowledgeType.GAP):
                    self._settle(run, RecordState.ARCHIVED)
                elif kind == AcknowledgeType.RELEASE:
                    self._release(run)
                else:  # RENEW: the lock starts again
                    run.lock_deadline_ms = now_ms + self.lock_duration_ms
                    self._lock(run.lock_deadline_ms, run.first)
            self._join(lo_i, hi_i)
        self._advance()
        return ErrorCode.none

    def _settle(self, run: _Run, state: RecordState) -> None:
        """An acquired run's delivery ends in `state`."""
        run.state, run.member_id, run.lock_deadline_ms = state, None, 0
        self._acquired_runs -= 1

    def _release(self, run: _Run) -> None:
        final = run.delivery_count >= self.delivery_count_limit
        self._settle(run, RecordState.ARCHIVED if final else RecordState.AVAILABLE)
        if not final and run.first < self._available_from:
            self._available_from = run.first

    # ---- time and membership -----------------------------------------------------------

    def expire_locks(self, now_ms: int) -> int:
        """Release the acquired records whose lock has run out; how many."""
        expired = 0
        while (run := self._first_lock()) is not None and run.lock_deadline_ms <= now_ms:
            heapq.heappop(self._locks)
            self._release(run)
            expired += run.last - run.first + 1
        if expired:
            self._join(0, len(self._runs))
            self._advance()
        return expired

    def next_lock_deadline_ms(self) -> int | None:
        """When expire_locks next has work, None while nothing is acquired."""
        run = self._first_lock()
        return None if run is None else run.lock_deadline_ms

    def release_member(self, member_id: str) -> int:
        """A member left or was fenced: its acquired records are released; how many."""
        released = 0
        for run in self._runs:
            if run.state == RecordState.ACQUIRED and run.member_id == member_id:
                self._release(run)
                released += run.last - run.first + 1
        if released:
            self._join(0, len(self._runs))
            self._advance()
        return released

    def acquired_by(self, member_id: str) -> list[int]:
        return [o for r in self._runs if r.state == RecordState.ACQUIRED and r.member_id == member_id
                for o in range(r.first, r.last + 1)]

    def state_of(self, offset: int) -> tuple[RecordState, int] | None:
        """(state, delivery count) of an in-flight offset (a never-fetched one is AVAILABLE, 0);
        None outside the window (below it: settled and gone; above: not read yet)."""
        if not self.start_offset <= offset < self._end_offset:
            return None
        run = self._runs[self._index(offset)]
        return run.state, run.delivery_count

    def move_log_start(self, log_start_offset: int) -> None:
        """Retention (or DeleteRecords) removed the records below `log_start_offset`: the
        window starts there at least (those records cannot be delivered any more)."""
        if log_start_offset <= self.start_offset:
            return
        at = self._split(min(log_start_offset, self._end_offset))
        for run in self._runs[:at]:
            if run.state == RecordState.ACQUIRED:
                self._acquired_runs -= 1
        del self._runs[:at]
        self.start_offset = log_start_offset
        self._end_offset = max(self._end_offset, log_start_offset)
        self._advance()

    def reset(self, start_offset: int) -> None:
        """AlterShareGroupOffsets (the group empty): the window starts over at `start_offset`."""
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} is negative")
        self._runs.clear()
        self._locks, self._acquired_runs = [], 0
        self.start_offset = self._end_offset = self._available_from = start_offset
        self.state_epoch += 1

    def _advance(self) -> None:
        """The SPSO moves over settled records (acknowledged or archived)."""
        runs = self._runs
        n = 0
        while n < len(runs) and runs[n].state in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED):
            n += 1
        if n:
            self.start_offset = runs[n - 1].last + 1
            del runs[:n]

    # ---- durable state -----------------------------------------------------------------

    def snapshot(self) -> ShareState:
        """The share partition as the share coordinator keeps it: ACQUIRED as AVAILABLE (a
        lock does not survive), runs of one state and delivery count joined, never-delivered
        available records left out."""
        batches: list[StateBatch] = []
        for run in self._runs:
            if run.state == RecordState.AVAILABLE and run.delivery_count == 0:
                continue
            state = RecordState.AVAILABLE if run.state == RecordState.ACQUIRED else run.state
            last = batches[-1] if batches else None
            if last is not None and last.last_offset == run.first - 1 and (last.state, last.delivery_count) == (
                    state, run.delivery_count):
                batches[-1] = StateBatch(last.first_offset, run.last, state, run.delivery_count)
            else:
                batches.append(StateBatch(run.first, run.last, state, run.delivery_count))
        return ShareState(self.start_offset, self.state_epoch, tuple(batches))

    @classmethod
    def restore(cls, state: ShareState, *, lock_duration_ms: int = LOCK_DURATION_MS_DEFAULT,
                delivery_count_limit: int = DELIVERY_COUNT_LIMIT_DEFAULT,
                max_in_flight: int = MAX_IN_FLIGHT_DEFAULT) -> SharePartition:
        """The share partition a snapshot kept (a new leader, a broker restarted)."""
        part = cls(state.start_offset, lock_duration_ms, delivery_count_limit, max_in_flight, state.state_epoch)
        for batch in state.batches:
            if batch.first_offset < part._end_offset or batch.last_offset < batch.first_offset:
                raise ValueError(f"state batch [{batch.first_offset}, {batch.last_offset}] is outside the share "
                                 f"partition starting at {state.start_offset} or overlaps the one before")
            kind = RecordState.AVAILABLE if batch.state == RecordState.ACQUIRED else batch.state
            if kind == RecordState.AVAILABLE and batch.delivery_count >= delivery_count_limit:
                kind = RecordState.ARCHIVED  # its last delivery ended with the failure: as a lock timing out
            if batch.first_offset > part._end_offset:  # never delivered
                part._append(_Run(part._end_offset, batch.first_offset - 1))
            part._append(_Run(batch.first_offset, batch.last_offset, kind, batch.delivery_count))
        part._join(0, len(part._runs))
        part._advance()
        return part


def _first(run: _Run) -> int:
    return run.first


def _ranges(offsets: Iterable[int], skip: set[int]) -> list[tuple[int, int]]:
    """Ascending offsets (those in `skip` left out, repeats ignored) as [first, last] ranges."""
    if isinstance(offsets, range) and offsets.step == 1 and not skip:
        return [(offsets.start, offsets.stop - 1)] if len(offsets) else []
    out: list[tuple[int, int]] = []
    previous = -1
    for offset in offsets:
        if offset <= previous or offset in skip:
            continue
        previous = offset
        if out and out[-1][1] == offset - 1:
            out[-1] = (out[-1][0], offset)
        else:
            out.append((offset, offset))
    return out


def _merged(ranges: Sequence[tuple[int, int]], skipped: Sequence[tuple[int, int]]) -> Iterator[tuple[int, int, bool]]:
    """Both kinds of ranges in offset order: (first, last, skipped)."""
    if not skipped:
        return ((first, last, False) for first, last in ranges)
    return heapq.merge(((a, b, False) for a, b in ranges), ((a, b, True) for a, b in skipped))


def _kind_runs(lo: int, hi: int, first: int, kinds: Sequence[AcknowledgeType]) -> Iterator[
        tuple[int, int, AcknowledgeType]]:
    """[lo, hi] of an acknowledgement batch starting at `first`, as runs of one type."""
    if lo > hi:
        return
    if len(kinds) == 1:
        yield lo, hi, kinds[0]
        return
    start = lo
    for offset in range(lo + 1, hi + 2):
        if offset > hi or kinds[offset - first] != kinds[start - first]:
            yield start, offset - 1, kinds[start - first]
            start = offset
