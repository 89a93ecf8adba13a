"""One replica of one partition on this broker, as a sans-IO object (Kafka's `Partition`).

It owns what replication decides for that replica and nothing else: the role the metadata
gives it (leader or follower, leader epoch, replicas, ISR), the high watermark, the
followers' fetch positions as the leader sees them, when the ISR should shrink or expand,
and how a follower reconciles its log with its leader's (truncation by leader epoch,
KIP-101/279, never at a bare high watermark). Decisions that need the network come back
as values (`AlterIsr`) for the trio shell (replica_manager.py) to carry out; time comes in
as `now_ms`. It holds its `Log` and calls it, but never a clock, a socket or trio.

High watermark rules (checked by the replication simulation in tests/):
- The leader's high watermark is the smallest log end offset among the ISR it acts on,
  and never moves backwards while it leads (it may only grow within a leader epoch).
- A follower's is what its leader last told it, capped by its own log end offset.
- The ISR the leader acts on for the high watermark is the *maximal* ISR (KIP-497): while
  an expansion it asked for is in flight, the new member already counts; a shrink counts
  only once the controller committed it. Otherwise the controller could elect a replica
  that lacks records the old leader had already exposed below its high watermark. An
  expansion whose outcome is not known (no answer, or an answer about an older partition
  epoch) keeps counting until metadata newer than the request shows what happened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from cluster.protocol.answer_writers import KeptPartitionAnswer
from cluster.protocol.errors import ErrorCode
from cluster.protocol.record_batch import InvalidRecordBatch
from cluster.protocol.sentinels import DEBUGGING_REPLICA_ID, NO_LEADER, UNDEFINED_EPOCH
from cluster.replication.replica_selector import ReplicaView, rack_aware_select
from cluster.storage.log import (
    AppendResult,
    Log,
    MirrorAppend,
    NotEnoughReplicas,
    OffsetOutOfRange,
    UnexpectedAppendOffset,
)
from cluster.storage.txn_index import AbortedTxn

# A leader whose ISR change was refused (say, the follower is still fenced) asks again no
# sooner than this; every follower fetch would otherwise repeat the request.
ISR_CHANGE_RETRY_BACKOFF_MS = 500


@dataclass(frozen=True, slots=True)
class PartitionRole:
    """What the metadata says about a partition: the part of it a replica acts on."""

    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    # KIP-966 strict min ISR (ELR on): the high watermark stands still while the ISR is
    # smaller than min.insync.replicas (capped by the replica count), so replicas that leave
    # then hold everything below it and stay eligible to lead.
    strict_min_isr: bool = False


@dataclass(frozen=True, slots=True)
class AlterIsr:
    """A leader's decision to change the ISR, for the shell to send to the controller
    (Kafka's AlterPartition). The epochs fence it if leadership moved meanwhile."""

    topic: str
    partition: int
    topic_id: str
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    reason: str


class IsrAnswer(Enum):
    """What the controller's answer to an AlterIsr says about it."""

    COMMITTED = "committed"  # the change is in the metadata (and was applied here)
    REFUSED = "refused"  # the controller did not make it (ineligible replica, bad request)
    STALE = "stale"  # it was about an older leader or partition epoch: newer metadata will tell
    UNKNOWN = "unknown"  # no answer (controller unreachable, timed out): it may or may not be in


# Controller error codes and what they mean for an AlterIsr.
ISR_ANSWERS: dict[int, IsrAnswer] = {
    ErrorCode.none: IsrAnswer.COMMITTED,
    ErrorCode.ineligible_replica: IsrAnswer.REFUSED,
    ErrorCode.invalid_request: IsrAnswer.REFUSED,
    ErrorCode.fenced_leader_epoch: IsrAnswer.STALE,
    ErrorCode.invalid_update_version: IsrAnswer.STALE,
    ErrorCode.not_leader_or_follower: IsrAnswer.STALE,
    ErrorCode.unknown_topic_or_partition: IsrAnswer.STALE,
    ErrorCode.stale_broker_epoch: IsrAnswer.STALE,
    ErrorCode.request_timed_out: IsrAnswer.UNKNOWN,  # proposed, not known to be committed
}


def isr_answer(error_code: int) -> IsrAnswer:
    """An error code the table does not know is treated as an unknown outcome (the change
    is sent again until the controller says something definite, or metadata settles it)."""
    return ISR_ANSWERS.get(error_code, IsrAnswer.UNKNOWN)


@dataclass(frozen=True, slots=True)
class RoleChange:
    """What applying the metadata changed, for the shell's bookkeeping and wake-ups."""

    became_leader: bool = False
    became_follower: bool = False
    epoch_changed: bool = False
    isr_shrunk: bool = False
    isr_expanded: bool = False
    high_watermark_moved: bool = False


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    """The leader's view of one follower fetch: did the high watermark move, and does the
    follower now belong in the ISR."""

    high_watermark_moved: bool
    alter_isr: AlterIsr | None
    log_start_moved: bool = False  # the follower reported a new log start (DeleteRecords waits on it)


class ReadResult(NamedTuple):
    """One partition's part of a Fetch answer, as the leader (or a replica the debugging
    consumer reads) gives it. A tuple: one is made per partition of every Fetch."""

    error: int
    records: bytes = b""
    high_watermark: int = -1
    log_start_offset: int = -1
    follower: FollowerFetch | None = None  # a follower's fetch: what it changed
    last_stable_offset: int = -1
    aborted: list[AbortedTxn] | None = None  # read_committed: aborted transactions in what it returns


@dataclass(slots=True)
class FollowerState:
    """What a follower replica knows about its fetching from one leader epoch."""

    leader_id: int
    leader_epoch: int
    needs_truncation: bool = True


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    """What a follower made of its leader's answer for one partition."""

    appended: int = 0  # offsets appended
    retry: bool = False  # an error: fetch again after a pause
    restarted_at: int | None = None  # its whole log lay below the leader's log start: now empty there
    problem: str | None = None  # why the fetched data did not fit (then truncation is redone)
    log_start_moved: bool = False  # the leader's log start moved this replica's on


@dataclass(frozen=True, slots=True)
class Truncation:
    """A follower cut its log back to where its leader's history and its own agree."""

    before: int
    after: int


@dataclass
class Partition:
    topic: str
    index: int
    log: Log
    topic_id: str = ""
    local_id: int = -1  # this broker's id
    is_leader: bool = False
    leader_id: int = NO_LEADER
    leader_epoch: int = -1
    partition_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    strict_min_isr: bool = False  # KIP-966 (see PartitionRole)
    follower: FollowerState | None = None  # set while this replica follows a leader
    isr_change_pending: bool = False  # leader: an AlterIsr is in flight
    # Leader: the ISR an AlterIsr asked for while its outcome is not known, and the partition
    # epoch it was based on (metadata newer than that settles it).
    pending_isr: tuple[int, ...] | None = None
    pending_isr_epoch: int = -1
    isr_retry_at_ms: int = 0  # leader: after a refused or failed ISR change, not before this
    # Leader: each follower's log end offset (its last fetch offset) and when it last was
    # caught up with the leader's log end.
    replica_leo: dict[int, int] = field(default_factory=dict)
    replica_caught_up_ms: dict[int, int] = field(default_factory=dict)
    # Leader: each follower's log start offset, as its fetches report it (DeleteRecords
    # answers once every in-sync replica's start reached the deletion offset).
    replica_log_start: dict[int, int] = field(default_factory=dict)
    # Leader: committed offset (every ISR member has it); follower: learned from fetches. Starts
    # from the replication-offset-checkpoint; never above the log end (truncation cuts it).
    hw: int = 0
    # A consumer's "nothing new" answer as last given, keyed by what it says (see idle_answer).
    _idle: tuple[tuple[int, int, int, int, bool], KeptPartitionAnswer] | None = field(default=None, repr=False)

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.index

    @property
    def high_watermark(self) -> int:
        """Never above the log end, never below the log start (Kafka's updateHighWatermark
        clamps both ways): a log started over at a higher offset (a follower below its
        leader's log start, a mirror starting at its source's) has nothing below it."""
        return max(self.log.log_start_offset, min(self.hw, self.log.log_end_offset))

    @property
    def high_watermark_lags_epoch_start(self) -> bool:
        """A new leader whose high watermark is still below the offset its epoch started at
        (it learnt the old leader's only as a follower, one fetch late): offsets it would
        give out now could go backwards. Kafka answers client ListOffsets with
        OFFSET_NOT_AVAILABLE then (KIP-207's OffsetNotAvailableException, retriable), until
        the followers' fetches move the high watermark past the epoch start."""
        start = self.log.leader_epochs.start_offset_of(self.leader_epoch)
        return self.is_leader and start >= 0 and self.high_watermark < start

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR the high watermark is computed over: the committed one, plus a member
        whose addition is in flight (see the module docstring)."""
        if self.pending_isr is None:
            return self.isr
        return self.isr + tuple(r for r in self.pending_isr if r not in self.isr)

    # ---- the metadata's word ---------------------------------------------------------

    def apply_role(self, role: PartitionRole, now_ms: int) -> RoleChange:
        """Take the role the metadata gives this replica (leader, follower, epochs, ISR)."""
        was_leader, old_epoch, old_isr = self.is_leader, self.leader_epoch, self.isr
        self.is_leader = role.leader == self.local_id
        self.leader_id = role.leader
        self.leader_epoch = role.leader_epoch
        self.partition_epoch = role.partition_epoch
        self.replicas = tuple(role.replicas)
        self.isr = tuple(role.isr)
        self.strict_min_isr = role.strict_min_isr
        epoch_changed = old_epoch != role.leader_epoch
        shrunk = expanded = False
        if self.is_leader and old_isr and old_isr != self.isr:
            # Counted by the leader, whoever changed the ISR: the leader itself (a lagging or
            # caught-up follower) or the controller (a fenced broker leaves every ISR).
            shrunk = not set(old_isr) <= set(self.isr)
            expanded = not set(self.isr) <= set(old_isr)
        if self.pending_isr is not None and (role.partition_epoch > self.pending_isr_epoch or epoch_changed
                                             or not self.is_leader):
            # Metadata newer than the AlterIsr: whatever the controller did with it is known now.
            self.pending_isr = None
            self.isr_change_pending = False
        if self.is_leader and not was_leader:
            # A new leader starts from the high watermark it learned as a follower (or read
            # from its checkpoint); the followers' next fetches move it on.
            self.hw = self.high_watermark
            self.replica_leo = {}
            self.replica_log_start = {}
            self.replica_caught_up_ms = {r: now_ms for r in self.isr}
            self.isr_change_pending = False
            self.pending_isr = None
        moved = False
        if self.is_leader:
            self.follower = None
            moved = self._advance_high_watermark()
            if not was_leader or epoch_changed:
                # Becoming leader starts the epoch at the log end, as Kafka's LeaderEpochFileCache does.
                self.log.leader_epochs.assign(role.leader_epoch, self.log.log_end_offset)
        elif role.leader >= 0 and role.leader != self.local_id:
            state = self.follower
            if state is None or state.leader_id != role.leader or state.leader_epoch != role.leader_epoch:
                self.follower = FollowerState(role.leader, role.leader_epoch)
        else:
            self.follower = None  # no leader to follow
        return RoleChange(became_leader=self.is_leader and not was_leader,
                          became_follower=was_leader and not self.is_leader,
                          epoch_changed=epoch_changed, isr_shrunk=shrunk, isr_expanded=expanded,
                          high_watermark_moved=moved)

    # ---- leader: appends and acknowledgements ----------------------------------------

    def append_as_leader(self, records: bytes, *, min_isr_checked: bool, now_ms: int) -> AppendResult:
        """Append a producer's batches. With `min_isr_checked` (acks=all) an ISR below
        min.insync.replicas refuses new batches with NotEnoughReplicas (a duplicate still gets
        its original offsets). Raises what `Log.append_as_leader` raises."""
        assert self.is_leader
        enough = not min_isr_checked or len(self.isr) >= self.min_insync_replicas
        result = self.log.append_as_leader(records, leader_epoch=self.leader_epoch, now_ms=now_ms,
                                           enough_replicas=enough)
        if not result.duplicate:
            self._advance_high_watermark()
        return result

    def append_mirrored(self, records: bytes, *, now_ms: int) -> MirrorAppend:
        """Leader of a mirror topic: append batches copied from its source at their own
        offsets (`Log.append_mirrored`), under this replica's leader epoch; the high
        watermark then moves as after a produce. Raises what `Log.append_mirrored` raises."""
        assert self.is_leader
        result = self.log.append_mirrored(records, leader_epoch=self.leader_epoch, now_ms=now_ms)
        if result.offsets_appended:
            self._advance_high_watermark()
        return result

    @property
    def min_insync_replicas(self) -> int:
        return int(self.log.config["min.insync.replicas"])

    def acks_all_outcome(self, required_offset: int) -> int | None:
        """acks=all: the error code to answer once `required_offset` is below the high
        watermark (none, or NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR shrank below
        min.insync.replicas meanwhile), NOT_LEADER_OR_FOLLOWER when leadership moved, or
        None while it is still to come."""
        if not self.is_leader:
            return ErrorCode.not_leader_or_follower
        if self.high_watermark < required_offset:
            # Strict min ISR (KIP-966): the high watermark will not reach it while the ISR is
            # short; answer now, as the record is in the log (the producer retries).
            return ErrorCode.not_enough_replicas_after_append if self.strict_min_isr and self.under_min_isr else None
        if len(self.isr) < self.min_insync_replicas:
            return ErrorCode.not_enough_replicas_after_append
        return ErrorCode.none

    def not_enough_replicas_message(self) -> str:
        return f"the ISR {list(self.isr)} is smaller than min.insync.replicas={self.min_insync_replicas}"

    # ---- leader: reads and follower positions ----------------------------------------

    def check_leader_epoch(self, current_leader_epoch: int, replica_id: int = -1) -> int:
        """A request's current_leader_epoch against this replica's (-1: the client did not say)."""
        if current_leader_epoch < 0 or current_leader_epoch == self.leader_epoch or replica_id == DEBUGGING_REPLICA_ID:
            return ErrorCode.none
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.fenced_leader_epoch
        return ErrorCode.unknown_leader_epoch

    def idle_answer(self, fetch_offset: int, current_leader_epoch: int, read_committed: bool) -> dict[str, Any] | None:
        """A consumer's Fetch answer for this leader's partition when it has nothing new at
        `fetch_offset`, or None when anything else is to be said (records, an error, not the
        leader). The same answer read_records + ReplicaManager.read_partition give, kept while
        the offsets it names stay: a sessionless consumer of 10,000 partitions (librdkafka)
        asks for every one every fetch.wait.max.ms, nearly all idle. Not to be changed by the
        caller (it is given again)."""
        if not self.is_leader or (0 <= current_leader_epoch != self.leader_epoch):
            return None
        log = self.log
        log_start = log.log_start_offset
        hw = max(log_start, min(self.hw, log.log_end_offset))
        lso = log.last_stable_offset(hw)
        if fetch_offset != (lso if read_committed else hw) or fetch_offset < log_start:
            return None
        key = (fetch_offset, hw, log_start, lso, read_committed)
        kept = self._idle
        if kept is not None and kept[0] == key:
            return kept[1]
        answer = KeptPartitionAnswer(
            partition_index=self.index, error_code=ErrorCode.none, high_watermark=hw, last_stable_offset=lso,
            log_start_offset=log_start, preferred_read_replica=-1, records=b"",
            aborted_transactions=[] if read_committed else None)
        self._idle = (key, answer)
        return answer

    def read_records(self, fetch_offset: int, max_bytes: int, *, replica_id: int, current_leader_epoch: int,
                     min_one_batch: bool, now_ms: int, read_committed: bool = False,
                     replica_log_start: int = -1, follower_read: bool = False) -> ReadResult:
        """Whole batches from `fetch_offset`: a consumer's up to the high watermark (up to
        the last stable offset for read_committed, with the aborted transactions among
        them), a follower's (which also reports its position) and the debugging consumer's
        up to the log end. At most `max_bytes`, except that with `min_one_batch` a first
        batch larger than that comes whole. With `follower_read` (a consumer's Fetch v11+,
        KIP-392) a follower serves the consumer too, up to the high watermark it learned."""
        debugging = replica_id == DEBUGGING_REPLICA_ID
        serves = self.is_leader or debugging or (follower_read and replica_id < 0 and self.follower is not None
                                                 and self.local_id in self.replicas)
        if not serves or (replica_id >= 0 and replica_id not in self.replicas):
            return ReadResult(ErrorCode.not_leader_or_follower)
        # Every partition a sessionless consumer reads comes through here on every Fetch, most
        # with nothing new: the high watermark is worked out once, an empty read not at all.
        log = self.log
        log_start = log.log_start_offset
        hw = max(log_start, min(self.hw, log.log_end_offset))  # self.high_watermark
        epoch_error = self.check_leader_epoch(current_leader_epoch, replica_id)
        if epoch_error != ErrorCode.none:
            return ReadResult(epoch_error, b"", hw, log_start)
        follower = None
        if replica_id >= 0:
            follower = self.on_follower_fetch(replica_id, fetch_offset, now_ms, replica_log_start)
            hw = self.high_watermark
        lso = log.last_stable_offset(hw)
        if read_committed and replica_id < 0:
            upper = lso
        else:
            upper = log.log_end_offset if replica_id >= 0 or debugging else hw  # read_upper_bound
        if fetch_offset == upper and fetch_offset >= log_start:
            return ReadResult(ErrorCode.none, b"", hw, log_start, follower, lso)  # nothing new (Log.read's b"")
        try:
            data = log.read(fetch_offset, max(0, max_bytes), upper, min_one_batch=min_one_batch)
        except OffsetOutOfRange:
            return ReadResult(ErrorCode.offset_out_of_range, b"", hw, log_start, follower, lso)
        aborted = log.collect_aborted(fetch_offset, upper) if read_committed and data else None
        return ReadResult(ErrorCode.none, data, hw, log_start, follower, lso, aborted)

    @property
    def last_stable_offset(self) -> int:
        return self.log.last_stable_offset(self.high_watermark)

    def append_marker(self, *, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                      now_ms: int) -> AppendResult:
        """Leader: a transaction marker (WriteTxnMarkers); raises what `Log.append_marker` raises."""
        assert self.is_leader
        result = self.log.append_marker(producer_id=producer_id, producer_epoch=producer_epoch, commit=commit,
                                        coordinator_epoch=coordinator_epoch, leader_epoch=self.leader_epoch,
                                        now_ms=now_ms)
        self._advance_high_watermark()
        return result

    def preferred_read_replica(self, client_rack: str, fetch_offset: int, now_ms: int,
                               rack_of: Callable[[int], str | None]) -> int:
        """Leader: the follower a consumer in `client_rack` should read from (KIP-392, the
        rack-aware selector), or -1 for this leader. Only in-sync followers whose log holds
        `fetch_offset` are candidates."""
        if not self.is_leader or not client_rack:
            return -1
        followers = [ReplicaView(r, rack_of(r), self.replica_leo[r], now_ms - self.replica_caught_up_ms.get(r, 0))
                     for r in self.isr
                     if r != self.local_id and r in self.replica_leo
                     and self.replica_leo[r] >= fetch_offset >= self.replica_log_start.get(r, self.log.log_start_offset)]
        leader = ReplicaView(self.local_id, rack_of(self.local_id), self.log.log_end_offset, 0)
        chosen = rack_aware_select(client_rack, leader, followers)
        return -1 if chosen == self.local_id else chosen

    def read_upper_bound(self, replica_id: int) -> int:
        """Followers and the replica verifier read to the log end; consumers only what is committed."""
        if replica_id >= 0 or replica_id == DEBUGGING_REPLICA_ID:
            return self.log.log_end_offset
        return self.high_watermark

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int,
                          log_start: int = -1) -> FollowerFetch:
        """A follower's fetch offset is its log end: the high watermark may move, and a
        follower that caught up joins the ISR. It also reports its log start."""
        if replica_id not in self.replicas or not self.is_leader:
            return FollowerFetch(False, None)
        self.replica_leo[replica_id] = fetch_offset
        start_moved = log_start >= 0 and self.replica_log_start.get(replica_id) != log_start
        if start_moved:
            self.replica_log_start[replica_id] = log_start
        leo = self.log.log_end_offset
        if fetch_offset >= leo:
            self.replica_caught_up_ms[replica_id] = now_ms
        moved = self._advance_high_watermark()
        change = None
        if (replica_id not in self.isr and not self.isr_change_pending and now_ms >= self.isr_retry_at_ms
                and fetch_offset >= leo and fetch_offset >= self.high_watermark):
            change = self._alter_isr((*self.isr, replica_id), f"expand with {replica_id}")
        return FollowerFetch(moved, change, start_moved)

    def maybe_shrink_isr(self, now_ms: int, lag_max_ms: int) -> AlterIsr | None:
        """Leader: followers not caught up for replica.lag.time.max.ms leave the ISR."""
        if not self.is_leader or self.isr_change_pending:
            return None
        laggards = [r for r in self.isr if r != self.local_id
                    and now_ms - self.replica_caught_up_ms.get(r, now_ms) > lag_max_ms]
        if not laggards:
            return None
        return self._alter_isr(tuple(r for r in self.isr if r not in laggards), f"shrink (lagging: {laggards})")

    def _alter_isr(self, isr: tuple[int, ...], reason: str) -> AlterIsr:
        self.isr_change_pending = True
        self.pending_isr = isr
        self.pending_isr_epoch = self.partition_epoch
        self._advance_high_watermark()  # an added member counts from now on (maximal ISR)
        return AlterIsr(self.topic, self.index, self.topic_id, self.leader_epoch, self.partition_epoch, isr, reason)

    def isr_change_answered(self, change: AlterIsr, answer: IsrAnswer, now_ms: int) -> bool:
        """The controller answered `change` (or could not be reached). The shell calls this
        for a committed change only after applying the metadata up to the controller's
        answer. True when the shell should send `change` again (its outcome is unknown and
        it still matters)."""
        current = (self.is_leader and self.leader_epoch == change.leader_epoch
                   and self.pending_isr == change.isr and self.pending_isr_epoch == change.partition_epoch)
        if not current:
            return False  # newer metadata settled it already (apply_role)
        self.isr_change_pending = False
        if answer is IsrAnswer.COMMITTED or answer is IsrAnswer.REFUSED:
            self.pending_isr = None  # committed: the metadata shows it; refused: it never happened
        if answer is not IsrAnswer.COMMITTED:
            self.isr_retry_at_ms = now_ms + ISR_CHANGE_RETRY_BACKOFF_MS
        if answer is IsrAnswer.UNKNOWN:
            self.isr_change_pending = True  # the shell sends it again
            return True
        return False

    # ---- leader: DeleteRecords ---------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """Leader: move the log start to `offset` (-1: the high watermark). The error code:
        OFFSET_OUT_OF_RANGE past the high watermark or below -1, as Kafka answers."""
        assert self.is_leader
        hw = self.high_watermark
        target = hw if offset == -1 else offset
        if target < 0 or target > hw:
            return ErrorCode.offset_out_of_range
        self.log.advance_log_start(target)
        return ErrorCode.none

    @property
    def low_watermark(self) -> int:
        """Leader: the smallest log start among the in-sync replicas (Kafka's low watermark,
        what DeleteRecords answers); a follower that has not reported one counts as 0."""
        starts = [self.log.log_start_offset if r == self.local_id else self.replica_log_start.get(r, 0)
                  for r in self.isr]
        return min(starts, default=self.log.log_start_offset)

    @property
    def under_min_isr(self) -> bool:
        """The committed ISR is smaller than min.insync.replicas (capped by the replica count,
        Kafka's effective min ISR)."""
        return len(self.isr) < min(self.min_insync_replicas, max(1, len(self.replicas)))

    def _advance_high_watermark(self) -> bool:
        """Leader: HW = smallest log end offset in the (maximal) ISR; never moves back; with
        strict min ISR (KIP-966) not at all while under min ISR. True if it moved."""
        if not self.is_leader or (self.strict_min_isr and self.under_min_isr):
            return False
        leo = self.log.log_end_offset
        ends = [leo if r == self.local_id else self.replica_leo.get(r, 0) for r in self.maximal_isr]
        new = min(ends) if ends else leo
        if new > self.hw:
            self.hw = new
            self.log.producer_state.on_high_watermark(new)
            return True
        return False

    def end_offset_for_epoch(self, leader_epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch on the leader: (largest epoch ≤ requested, its end offset)."""
        return self.log.leader_epochs.end_offset_for(leader_epoch, self.log.log_end_offset)

    # ---- follower: reconciling with the leader ---------------------------------------

    @property
    def needs_truncation(self) -> bool:
        return self.follower is not None and self.follower.needs_truncation

    @property
    def fetching(self) -> bool:
        """A follower ready to fetch: it knows where its history meets the leader's."""
        return self.follower is not None and not self.follower.needs_truncation

    def truncate_to_leader(self, leader_epoch: int, end_offset: int, now_ms: int) -> Truncation | None:
        """The leader answered OffsetForLeaderEpoch for our latest epoch: cut our log where
        the two histories diverge (KIP-101/279), then fetch from there. When the leader
        answers an epoch this log never had, the cut is where our largest smaller epoch ends
        and the question is asked again with it (Kafka's intermediate truncation): the
        histories may diverge further back."""
        assert self.follower is not None
        lg = self.log
        own_epoch = lg.leader_epochs.latest_epoch
        done = True
        if own_epoch == UNDEFINED_EPOCH:
            target = lg.log_end_offset  # nothing written under any epoch: nothing to compare
        elif leader_epoch == UNDEFINED_EPOCH:
            target = lg.log_start_offset  # the leader has none of our epochs
        else:
            found, own_end = lg.leader_epochs.end_offset_for(leader_epoch, lg.log_end_offset)
            if found not in (UNDEFINED_EPOCH, leader_epoch):
                target, done = own_end, False
                # the epochs from there on go even when no record does, so the next question
                # asks with the smaller epoch
                lg.leader_epochs.truncate_from_end(min(own_end, lg.log_end_offset))
            else:
                target = min(end_offset, own_end)
        self.follower.needs_truncation = not done
        if target >= lg.log_end_offset:
            # Nothing to cut, but an epoch this replica started as leader without writing a
            # batch in it ends here: the leader's batches that follow may be of an older
            # epoch, which that entry would contradict (as Kafka's UnifiedLog.truncateTo).
            lg.leader_epochs.truncate_from_end(lg.log_end_offset)
            return None
        before = lg.log_end_offset
        lg.truncate_to(target, now_ms)
        self.hw = min(self.hw, lg.log_end_offset)
        return Truncation(before, lg.log_end_offset)

    def handle_fetch_answer(self, error: int, records: bytes, leader_high_watermark: int, leader_log_start: int,
                            now_ms: int) -> FetchOutcome:
        """A follower takes its leader's answer for this partition. Raises StorageError
        (the disk refused the append; nothing was appended)."""
        if error == ErrorCode.offset_out_of_range:
            if self.on_fetch_out_of_range(leader_log_start, now_ms):
                return FetchOutcome(retry=True, restarted_at=self.log.log_end_offset)
            return FetchOutcome(retry=True)
        if error != ErrorCode.none:
            return FetchOutcome(retry=True)  # not leader / epoch mismatch: the metadata will catch up
        try:
            appended = self.append_fetched(records, leader_high_watermark, now_ms)
        except InvalidRecordBatch as exc:
            return FetchOutcome(retry=True, problem=str(exc))
        return FetchOutcome(appended=appended, log_start_moved=self.follow_log_start(leader_log_start))

    def append_fetched(self, records: bytes, leader_high_watermark: int, now_ms: int) -> int:
        """Append what the leader sent (unchanged) and learn its high watermark; the offsets
        appended. Raises InvalidRecordBatch (then truncation is redone) or StorageError."""
        appended = 0
        if records:
            try:
                appended = self.log.append_as_follower(records, now_ms=now_ms)
            except UnexpectedAppendOffset as exc:
                lg = self.log
                if not (lg.log_end_offset == lg.log_start_offset
                        and exc.first_offset < lg.log_end_offset <= exc.last_offset):
                    if self.follower is not None:
                        self.follower.needs_truncation = True
                    raise
                # An empty log starting inside the leader's first batch: the leader's log
                # start is not batch-aligned (DeleteRecords), and a fetch from it returns the
                # whole batch. Start the log at the batch's base (its log start then follows
                # the leader's), as Kafka's Partition.appendRecordsToFollowerOrFutureReplica.
                lg.truncate_fully_and_start_at(exc.first_offset, now_ms)
                appended = lg.append_as_follower(records, now_ms=now_ms)
            except InvalidRecordBatch:  # the fetched data does not continue our log
                if self.follower is not None:
                    self.follower.needs_truncation = True
                raise
        self.hw = min(leader_high_watermark, self.log.log_end_offset)
        self.log.producer_state.on_high_watermark(self.hw)
        return appended

    def follow_log_start(self, leader_log_start: int) -> bool:
        """Follower: the leader's log start moved on (DeleteRecords, retention): records below
        it go here too, up to what this replica knows is committed. True if it moved."""
        target = min(leader_log_start, self.high_watermark)
        if target <= self.log.log_start_offset:
            return False
        self.log.advance_log_start(target)
        return True

    def on_fetch_out_of_range(self, leader_log_start: int, now_ms: int) -> bool:
        """The leader refused our fetch offset. True when our whole log lies below the
        leader's log start (retention moved on while we were away): start over there, empty.
        Otherwise our log end is past the leader's: find the divergence again."""
        lg = self.log
        if 0 <= lg.log_end_offset < leader_log_start:
            lg.truncate_fully_and_start_at(leader_log_start, now_ms)
            self.hw = min(self.hw, lg.log_end_offset)
            return True
        if self.follower is not None:
            self.follower.needs_truncation = True
        return False


__all__ = [
    "AlterIsr",
    "FetchOutcome",
    "FollowerFetch",
    "FollowerState",
    "ISR_ANSWERS",
    "ISR_CHANGE_RETRY_BACKOFF_MS",
    "IsrAnswer",
    "isr_answer",
    "NotEnoughReplicas",
    "Partition",
    "PartitionRole",
    "ReadResult",
    "RoleChange",
    "Truncation",
]
