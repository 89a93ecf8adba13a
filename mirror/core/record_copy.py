"""A record-copying flow's partition, sans-IO: the bookkeeping of one source partition a
worker mirrors (position, acknowledgements, the history mirrored, records refused for their
size, a hole being refilled), and the decisions taken on it: what an acknowledgement or a
failed delivery does, which fetched chunk may be copied, what a claim found of the
partition's history, when a record is dead-lettered, whether a target lost what it
acknowledged. `mirror/worker.py` (`MirrorWorker`) asks the clusters and does what these say.
Where a claim resumes is mirror/history.py's `resume_point`.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Protocol

from cluster.protocol.errors import ErrorCode
from mirror.history import NO_EPOCH, Divergence, MirroredHistory, MirroredPosition, Resume
from topology.model import MirrorSpec, Topology

TopicPartition = tuple[str, int]
# Target refusals of a record for its size: it goes to the dead-letter topic, not around again.
SIZE_ERRORS = frozenset({ErrorCode.message_too_large, ErrorCode.record_list_too_large})
SIZE_REFUSALS_MAX = 2  # a record refused for its size this often is dead-lettered
FENCED_ERRORS = frozenset({ErrorCode.invalid_producer_epoch, ErrorCode.producer_fenced})
BATCH_FRAMING_BYTES = 96  # a one-record batch beyond key, value and headers: batch header, record framing
REQUEST_FRAMING_BYTES = 1 << 10  # a produce request around its one batch
# Partition states (status, metrics).
MIRRORING, CLAIMING, STOPPED, PAUSED, FILLING = "MIRRORING", "CLAIMING", "STOPPED", "PAUSED", "FILLING"


class Delivery(Protocol):
    """The outcome of records handed to the producer (its DeliveryFuture)."""

    @property
    def done(self) -> bool: ...

    error: Exception | None


class _Done:
    """Records that needed no delivery (skipped, dead-lettered, markers passed over): done
    once everything before them is."""

    __slots__ = ()
    done = True
    error: Exception | None = None


DONE: Delivery = _Done()


@dataclass
class PartitionMirror:
    """Bookkeeping of one source partition this worker mirrors."""

    source: TopicPartition
    target: TopicPartition
    next_offset: int = -1  # next source offset to mirror
    acked_offset: int = -1  # highest source offset the target acknowledged
    committed_offset: int = -1  # what the source group last committed (next offset)
    # (source offset, its delivery, whether the record was sent alone: a size refusal names it)
    pending: list[tuple[int, Delivery, bool]] = field(default_factory=list)
    last_timestamp_ms: int = -1  # of the last record mirrored
    records: int = 0
    bytes: int = 0
    broken: str | None = None  # why it must be claimed again
    stopped: str | None = None  # why it is not mirrored at all (on.topic.recreated = stop)
    # The source history mirrored so far: topic id, leader epochs (mirror/history.py).
    history: MirroredHistory = field(default_factory=MirroredHistory)
    target_topic_id: uuid.UUID | None = None  # the target incarnation this worker claimed
    target_leader_epoch: int = -1  # the target partition's leader epoch when last checked
    # Records the target refused for their size: source offset -> (reason, refusals). Sent
    # once more after the claim has sized the target again (the source's limit may have
    # grown since), dead-lettered at the second refusal.
    refused: dict[int, tuple[str, int]] = field(default_factory=dict)
    # A hole being filled: (first source offset the target already holds after it, where to
    # go on once the hole is filled).
    fill_until: tuple[int, int] | None = None

    # ---- acknowledgements ---------------------------------------------------------------

    def settle(self) -> Settled:
        """Move the acknowledged position forward over the deliveries done, in offset order;
        a failed delivery breaks the partition (it is claimed again: the target says where
        to resume), and a record sent alone that the target refused for its size is counted
        (dead-lettered when the partition resumes at it and is refused again)."""
        advanced = False
        while self.pending and self.pending[0][1].done:
            offset, delivery, single = self.pending.pop(0)
            if delivery.error is not None:
                code = getattr(delivery.error, "code", None)
                if single and code in SIZE_ERRORS:
                    self.refused[offset] = (str(delivery.error), self.refused.get(offset, ("", 0))[1] + 1)
                self.broken = f"delivery failed: {delivery.error}"
                self.pending.clear()
                return Settled(advanced, fenced=code in FENCED_ERRORS)
            if offset > self.acked_offset:
                self.acked_offset = offset
                advanced = True
        return Settled(advanced)

    def done_up_to(self, offset: int) -> None:
        """Source offsets up to `offset` need no delivery (skipped, dead-lettered): done once
        everything before them is."""
        self.pending.append((offset, DONE, False))

    def commit_offset(self) -> int | None:
        """The source group's offset to commit now (None: nothing new)."""
        offset = self.acked_offset + 1
        return offset if self.acked_offset >= 0 and offset > self.committed_offset else None

    def acknowledged(self) -> tuple[uuid.UUID | None, int, int]:
        """(topic id, leader epoch, next offset) the target acknowledged: a target found
        holding less later has lost records."""
        return self.history.topic_id, self.history.last_epoch, self.acked_offset + 1

    # ---- fetched chunks -----------------------------------------------------------------

    @property
    def copying(self) -> bool:
        """Whether fetched records may be copied (claimed, sought, not broken or stopped)."""
        return not self.broken and not self.stopped and self.next_offset >= 0

    def refusal(self, first_offset: int, chunk_topic_id: uuid.UUID | None) -> str | None:
        """Why a fetched chunk starting at `first_offset` must not be copied (the partition
        is claimed again), or None."""
        if chunk_topic_id is not None and self.history.topic_id is not None and chunk_topic_id != self.history.topic_id:
            return f"records of topic id {chunk_topic_id}, the claim was for {self.history.topic_id}"
        if first_offset < self.next_offset:
            # The consumer was positioned behind the mirror's back: never skip silently.
            return f"the source gave offset {first_offset} where {self.next_offset} was next (a position reset?)"
        return None

    def fill_step(self, offsets: list[int]) -> FillStep | None:
        """With a hole being filled: of a chunk's record offsets, how many come before the
        first offset the target already holds, and whether the hole is filled with them
        (None: no hole)."""
        if self.fill_until is None:
            return None
        first_held, go_on = self.fill_until
        keep = sum(1 for o in offsets if o < first_held)
        filled = keep < len(offsets) or bool(offsets and offsets[-1] + 1 >= first_held)
        return FillStep(keep, filled, go_on)

    def passed_to(self, position: int) -> bool:
        """The consumer moved past transaction markers or aborted data of the source: nothing
        there to copy, done once everything before it is. Whether the position moved."""
        if not self.copying or position <= self.next_offset:
            return False
        self.next_offset = position
        self.done_up_to(position - 1)
        return True

    def rewound(self, d: Divergence) -> None:
        """The source rewrote its history below the position: what was mirrored stays, the
        source's records from the divergence point on are mirrored next."""
        self.history.diverged(d)
        self.next_offset = d.start_offset
        self.acked_offset = min(self.acked_offset, d.start_offset - 1)
        self.pending.clear()

    # ---- status ---------------------------------------------------------------------------

    def state(self, paused: bool) -> str:
        return (STOPPED if self.stopped else CLAIMING if self.broken or self.next_offset < 0
                else PAUSED if paused else FILLING if self.fill_until else MIRRORING)

    def lag_records(self, high_watermark: int) -> int | None:
        return max(0, high_watermark - (self.acked_offset + 1)) if high_watermark >= 0 else None


@dataclass(frozen=True)
class Settled:
    advanced: bool  # the acknowledged position moved
    fenced: bool = False  # the delivery that broke the partition was refused as fenced


@dataclass(frozen=True)
class FillStep:
    keep: int  # records of the chunk (its first ones) still to copy into the hole
    filled: bool  # the hole is filled with them: the rest is in the target already
    go_on: int  # the source offset to seek once filled


# ---- claims ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimPlan:
    """What a claim does, from resume_point and the hole check."""

    resume: int
    fill_until: tuple[int, int] | None
    stop: str | None  # why the partition is not mirrored (on.topic.recreated = stop)
    last_epoch: int  # the history's epoch at the resume point
    keep_epoch_starts: bool  # the tail's epoch starts still describe what is mirrored

    @classmethod
    def of(cls, found: MirroredPosition | None, decision: Resume, fill: tuple[int, int] | None,
           source_start: int, source_topic: str, source_topic_id: uuid.UUID | None,
           on_topic_recreated: str) -> ClaimPlan:
        """`fill`: a hole found below the tail (then copying starts at the source's log start
        and goes on after the tail once it is filled)."""
        stop = None
        if decision.new_incarnation and on_topic_recreated == "stop":
            stop = (f"source topic {source_topic} was deleted and created again (topic id "
                    f"{found.topic_id if found else None} -> {source_topic_id}); on.topic.recreated = stop")
        same = found is not None and not decision.new_incarnation
        return cls(source_start if fill is not None else decision.offset, fill, stop,
                   decision.leader_epoch if fill is None else NO_EPOCH, same and fill is None)


def needs_hole_check(found: MirroredPosition | None, decision: Resume) -> bool:
    """Whether the target may hold a hole below the tail (a re-created target that got
    retried writes of the old one before it was refilled): only on the same history."""
    return found is not None and not decision.new_incarnation and decision.divergence is None


def hole(first_mirrored: int, source_start: int, source_first_held: int | None,
         tail: MirroredPosition) -> tuple[int, int] | None:
    """A target starting (log start 0) with source offset `first_mirrored` above the source's
    log start, where the source still holds records below it: the hole to fill, as (the first
    offset the target holds, where to go on once filled), or None."""
    if first_mirrored <= source_start:
        return None
    if source_first_held is None or source_first_held >= first_mirrored:
        return None  # compaction or aborted transactions left the source nothing there
    return first_mirrored, tail.offset + 1


@dataclass(frozen=True)
class ClaimFindings:
    """What a claim found of a partition's history, to say (log, metrics, status events)."""

    new_incarnation: bool
    divergence: Divergence | None
    refill: bool  # the target lost records it had acknowledged, or has a hole: refilled
    lost_before_start: int  # source offsets deleted by retention before they were mirrored


def claim_findings(found: MirroredPosition | None, decision: Resume,
                   acknowledged: tuple[uuid.UUID | None, int, int] | None,
                   fill: tuple[int, int] | None) -> ClaimFindings:
    """`acknowledged`: what this process saw the target acknowledge of the partition before
    (topic id, leader epoch, next offset): a target found holding less of the same history
    lost records (deleted and created again, truncated, restored)."""
    lost_in_target = acknowledged is not None and not decision.new_incarnation and decision.divergence is None and (
        found is None or (found.topic_id == acknowledged[0] and found.offset + 1 < acknowledged[2]
                          and (found.leader_epoch < 0 or acknowledged[1] < 0 or found.leader_epoch <= acknowledged[1])))
    return ClaimFindings(decision.new_incarnation, decision.divergence, fill is not None or lost_in_target,
                         decision.lost_before_start)


def target_lost_acknowledged(found: MirroredPosition | None,
                             acknowledged: tuple[uuid.UUID | None, int, int] | None) -> bool:
    """After a leader change of the target partition: whether its tail holds less than it
    acknowledged to this worker (an unclean election there, a restore)."""
    return acknowledged is not None and (found is None or (found.topic_id == acknowledged[0]
                                                           and found.offset + 1 < acknowledged[2]))


# ---- records too large -------------------------------------------------------------------------


def record_limits(topic_max_bytes: int | None, producer_max_request_bytes: int, request_max_bytes: int,
                  provenance_bytes: int) -> tuple[int, int]:
    """What one record (key, value, headers) may take in the target: its topic's limit, its
    brokers' request limit, around it a batch and a request; and what its key and value may
    take beside the provenance headers the flow adds."""
    record_max = min(topic_max_bytes or producer_max_request_bytes,
                     request_max_bytes - REQUEST_FRAMING_BYTES) - BATCH_FRAMING_BYTES
    return record_max, record_max - provenance_bytes


def dead_letter_refused(refused: tuple[str, int] | None) -> bool:
    """A record the target refused for its size this often goes to the dead-letter topic
    (once the source's limit was read again and did not grow)."""
    return refused is not None and refused[1] >= SIZE_REFUSALS_MAX


# ---- topics ------------------------------------------------------------------------------------


def is_copy_from_target(topology: Topology, flow: MirrorSpec, topic: str) -> bool:
    """Whether `topic` is what a flow from our target into our source names its copies: its
    records all passed through the target, so mirroring it back would only grow a chain of
    empty topics (east.west.east...)."""
    for other in topology.mirrors:
        if other.source == flow.target and other.target == flow.source:
            dc = topology.cluster(other.source).datacenter
            pattern = re.escape(other.rename)
            for name, value in (("source", other.source), ("target", other.target), ("source_dc", dc)):
                pattern = pattern.replace(re.escape("{" + name + "}"), re.escape(value))
            pattern = pattern.replace(re.escape("{topic}"), ".+")
            if re.fullmatch(pattern, topic):
                return True
    return False
