"""The history of one source partition as a worker mirrored it, checked as a follower checks
its leader's (sans-IO: plain objects and functions; the worker does the requests).

A source partition's records are identified by (topic id, leader epoch, offset): a topic
deleted and created again under the same name gets another topic id (KIP-516) and offsets
from 0 again; an unclean leader election, a restore or any truncation below what was
mirrored shows as a leader epoch that ends earlier at the source than in the mirrored copy
(KIP-101/279). Every mirrored record carries its topic id and leader epoch in its provenance,
so the target partition's tail says where the copy stands, whoever wrote it.

Decisions:
- `resume_point`: where a worker taking a partition resumes, from the target's tail, the
  source's topic id, log start and high watermark, and the source's answer to
  OffsetForLeaderEpoch for the tail's epoch: after the tail (same history), at the
  divergence point (the source rewrote history below what was mirrored: the records it no
  longer has stay in the target and are reported), at the start of a new incarnation, or at
  the log start when the target holds nothing of this partition.
- `MirroredHistory.needs_check`: while mirroring, records of another leader epoch than the
  last mirrored one are copied only once the source confirmed that the last epoch still
  ends at or after the position (`MirroredHistory.divergence`).
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field

NO_EPOCH = -1
EPOCH_STARTS_MAX = 64  # leader epochs remembered per partition (the oldest are forgotten)


def topic_id_text(topic_id: uuid.UUID) -> str:
    """Kafka's textual topic id (Uuid.toString: URL-safe base64, no padding, 22 chars)."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()


def parse_topic_id(text: str | bytes | None) -> uuid.UUID | None:
    """The topic id of a provenance header (None when absent or unreadable)."""
    if not text:
        return None
    raw = text.decode("ascii", "replace") if isinstance(text, bytes) else text
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (ValueError, TypeError):
        return None


@dataclass(frozen=True)
class MirroredPosition:
    """The last record of a source partition in its target partition (in target order)."""

    offset: int
    topic_id: uuid.UUID | None  # None: written before provenance named topic ids
    leader_epoch: int  # NO_EPOCH: written before provenance named leader epochs


@dataclass(frozen=True)
class Divergence:
    """Mirrored source offsets [start_offset, end_offset] the source no longer holds as they
    were mirrored (an unclean election, a truncation, a restore): they stay in the target."""

    start_offset: int
    end_offset: int
    mirrored_epoch: int  # the leader epoch of the last mirrored record (NO_EPOCH: unknown)
    source_epoch: int  # the source's epoch at the divergence point (NO_EPOCH: unknown)

    @property
    def offsets(self) -> int:
        return self.end_offset - self.start_offset + 1


@dataclass(frozen=True)
class Resume:
    """Where to resume mirroring a partition, and what was found on the way."""

    offset: int
    leader_epoch: int  # of the history shared with the source up to `offset` (NO_EPOCH: unknown)
    new_incarnation: bool = False  # the source topic was created again since the tail was written
    divergence: Divergence | None = None
    lost_before_start: int = 0  # source offsets deleted before they were mirrored


def divergence_point(next_offset: int, last_epoch: int, epoch_starts: list[tuple[int, int]],
                     reply_epoch: int, reply_end_offset: int) -> tuple[int, int] | None:
    """Where the mirrored copy (up to `next_offset`, last record in `last_epoch`) and the
    source part, from the source's OffsetForLeaderEpoch answer for `last_epoch`; None when
    the source still holds the copy's history. Returns (offset, the source's epoch there).

    As a follower (KIP-279): the source's answer (epoch E', end X) is the largest epoch it
    has at or below ours and where that epoch ends in its log. E' == ours: the copy is
    good below X. E' < ours: the source never had our last epoch; the copy is good below
    min(X, where our copy's first epoch above E' starts), from `epoch_starts` ((epoch, first
    mirrored offset), ascending). An undefined answer (-1, -1: the source keeps no epoch that
    old) tells nothing: the copy is taken as good."""
    if reply_epoch < 0 or reply_end_offset < 0 or last_epoch < 0:
        return None
    if reply_epoch == last_epoch:
        point = reply_end_offset
    else:
        point = reply_end_offset
        for epoch, start in epoch_starts:
            if epoch > reply_epoch:
                if start >= 0:  # else not known: the source's end is the best there is
                    point = min(point, start)
                break
    if point >= next_offset:
        return None
    return point, reply_epoch


def resume_point(tail: MirroredPosition | None, source_topic_id: uuid.UUID | None, log_start_offset: int,
                 high_watermark: int, epoch_reply: tuple[int, int] | None = None,
                 epoch_starts: list[tuple[int, int]] | None = None) -> Resume:
    """Where a worker taking a partition resumes. `epoch_reply`: the source's (epoch, end
    offset) for `tail.leader_epoch` (None when not asked: no tail, another incarnation, no
    epoch in the tail)."""
    if tail is None:
        return Resume(log_start_offset, NO_EPOCH)
    if tail.topic_id is not None and source_topic_id is not None and tail.topic_id != source_topic_id:
        return Resume(log_start_offset, NO_EPOCH, new_incarnation=True)
    next_offset = tail.offset + 1
    divergence = None
    epoch = tail.leader_epoch
    if epoch_reply is not None:
        found = divergence_point(next_offset, tail.leader_epoch, epoch_starts or [], *epoch_reply)
        if found is not None:
            point, epoch = found
            divergence = Divergence(point, tail.offset, tail.leader_epoch, epoch)
            next_offset = point
    if next_offset > high_watermark:
        # The source ends below what was mirrored and no epoch said where it parted
        # (provenance without epochs, or an answer that told nothing): what the source
        # holds now from its end on is new.
        divergence = Divergence(high_watermark, tail.offset, tail.leader_epoch, NO_EPOCH)
        next_offset = high_watermark
    if next_offset < log_start_offset:
        return Resume(log_start_offset, NO_EPOCH, divergence=divergence,
                      lost_before_start=log_start_offset - next_offset)
    return Resume(next_offset, epoch, divergence=divergence)


@dataclass
class MirroredHistory:
    """What a worker knows, while it mirrors, of one source partition's history (the
    position itself, the next source offset to mirror, is the worker's)."""

    topic_id: uuid.UUID | None = None
    last_epoch: int = NO_EPOCH
    epoch_starts: list[tuple[int, int]] = field(default_factory=list)  # (epoch, first offset; -1 unknown)

    def reset(self, topic_id: uuid.UUID | None, last_epoch: int,
              epoch_starts: list[tuple[int, int]] | None = None) -> None:
        self.topic_id = topic_id
        self.last_epoch = last_epoch
        starts = [(e, s) for e, s in epoch_starts or [] if e <= last_epoch]
        if last_epoch >= 0 and (not starts or starts[-1][0] != last_epoch):
            starts.append((last_epoch, -1))
        self.epoch_starts = starts[-EPOCH_STARTS_MAX:]

    def needs_check(self, epoch: int) -> bool:
        """Whether records of leader epoch `epoch` may only be copied once the source
        confirmed the last mirrored epoch still ends at or after the position."""
        return epoch != self.last_epoch and self.last_epoch >= 0

    def mirrored(self, first_offset: int, epoch: int) -> None:
        """Records of `epoch` from `first_offset` on were handed to the producer."""
        if epoch != self.last_epoch and epoch >= 0:
            self.epoch_starts = [(e, s) for e, s in self.epoch_starts if e < epoch][-EPOCH_STARTS_MAX + 1:]
            self.epoch_starts.append((epoch, first_offset))
            self.last_epoch = epoch

    def divergence(self, next_offset: int, reply_epoch: int, reply_end_offset: int) -> Divergence | None:
        """The source's answer for `last_epoch`: the mirrored records (below `next_offset`) it
        no longer holds, if any."""
        found = divergence_point(next_offset, self.last_epoch, self.epoch_starts, reply_epoch, reply_end_offset)
        if found is None:
            return None
        point, epoch = found
        return Divergence(point, next_offset - 1, self.last_epoch, epoch)

    def diverged(self, divergence: Divergence) -> None:
        """Continue from the divergence point, in the history shared with the source."""
        self.epoch_starts = [(e, s) for e, s in self.epoch_starts if e <= divergence.source_epoch
                             and s < divergence.start_offset]
        self.last_epoch = divergence.source_epoch
