"""Consumer-group offset translation: where a source group would resume in the target.

A source group's committed offset C (the next record it would read) of source partition p
translates to the first target offset of partition p holding a record mirrored from
source offset >= C: every record the group has read is before it, every record it has not
is at or after it. Target partition p holds source partition p's records in source order
(fence records and skipped cycles aside), so a binary search over target offsets finds it
exactly — no sync window, no approximation.

Workers write what they translate as checkpoint records (compacted topic
`dcmirror.checkpoints` in the target; key group/source cluster/topic/partition, JSON value)
and `dcmirror mirror translate --group G` reads them back, prints them, and can commit them
for G in the target so the group moves there and resumes at the exact offset.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from cluster.client.metadata import ClientCluster
from mirror import tail
from mirror.provenance import incarnation_of, source_position

CHECKPOINTS_TOPIC = "dcmirror.checkpoints"


@dataclass(frozen=True)
class Checkpoint:
    group: str
    source: str
    topic: str  # source topic
    partition: int
    source_offset: int  # the group's committed offset at the source
    target_topic: str
    target_offset: int  # where the group resumes in the target
    timestamp_ms: int

    @property
    def key(self) -> bytes:
        return f"{self.group}/{self.source}/{self.topic}/{self.partition}".encode()

    def value(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def parse(cls, value: bytes) -> Checkpoint:
        doc: dict[str, Any] = orjson.loads(value)
        return cls(**doc)


async def _first_mirrored_at_or_after(cluster: ClientCluster, topic: str, partition: int, offset: int, end: int,
                                      source_cluster: str, source_partition: int,
                                      topic_id: uuid.UUID | None = None) -> tuple[int, int] | None:
    """(target offset, source offset) of the first mirrored record at target offset >= `offset`
    (and < `end`), skipping fences, foreign records and records of other incarnations of the
    source topic than `topic_id` (when given)."""
    at = offset
    while at < end:
        batches = await tail.fetch_batches(cluster, topic, partition, at, max_bytes=1 << 20)
        if not batches:
            return None
        for b in batches:
            for r in b.records:
                if r.offset < at or r.offset >= end:
                    continue
                pos = source_position(r, source_cluster)
                if pos is not None and pos[0] == source_partition:
                    if topic_id is not None:
                        found_id, _ = incarnation_of(r)
                        if found_id is not None and found_id != topic_id:
                            continue
                    return r.offset, pos[1]
        at = batches[-1].header.base_offset + batches[-1].header.last_offset_delta + 1
    return None


async def translate(cluster: ClientCluster, topic: str, partition: int, source_cluster: str, source_partition: int,
                    source_offset: int, topic_id: uuid.UUID | None = None) -> int | None:
    """The target offset a group committed at `source_offset` (of the source topic's
    incarnation `topic_id`, when given) resumes from; None when the target does not hold
    that far yet (the mirror is behind the group).

    With f(t) = the source offset of the first mirrored record of that incarnation at target
    offset >= t (infinite past the last one), f never decreases (an older incarnation's
    records come first and are skipped), so the smallest t with f(t) >= source_offset is
    found by bisection over [log start, high watermark]. After a divergence (mirror/history.py)
    the diverged copies precede the source's new records at the same offsets, so a group
    committed inside that range may be sent to the diverged copy."""
    start, hw = await tail.offsets(cluster, topic, partition)
    lo, hi = start, hw
    while lo < hi:
        mid = (lo + hi) // 2
        got = await _first_mirrored_at_or_after(cluster, topic, partition, mid, hw, source_cluster, source_partition,
                                                topic_id)
        if got is None or got[1] >= source_offset:
            hi = mid
        else:
            lo = got[0] + 1  # f is the same up to that record: skip past it
    got = await _first_mirrored_at_or_after(cluster, topic, partition, lo, hw, source_cluster, source_partition,
                                            topic_id)
    if got is not None:
        return got[0]
    # Every mirrored record lies before lo and came from below source_offset: exact only if the
    # mirror has copied everything the group has read.
    last, _ = await tail.last_mirrored(cluster, topic, partition, hw, source_cluster, source_partition)
    if last is None or last.offset + 1 < source_offset or (topic_id is not None and last.topic_id not in (None, topic_id)):
        return None
    return lo
