"""A flow of mirror topics, sans-IO: what a topic pair is, where a partition's claim resumes,
which fetched chunk may be appended (docs/design.md, "Mirror topics keep offsets").

The worker (`mirror/mirror_topics.py`) asks the clusters and acts on these answers; the
simulation (`tests/mirror_sim.py`) runs them over simulated clusters.
"""

from __future__ import annotations

from dataclasses import dataclass

from cluster.protocol.internal import MIRROR_FENCE_CLUSTER, mirror_fenced

MIRROR_SOURCE_CONFIG = "mirror.source"
# Topic configs a mirror topic does not take from its source: the mirror's own marker, and
# what would make the copy differ from the source's batches or refuse them, or what is about
# one cluster's replicas (README, "Mirror topics").
CONFIG_EXCLUDES = frozenset({MIRROR_SOURCE_CONFIG, "message.timestamp.type", "compression.type",
                             "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
                             "message.timestamp.before.max.ms", "message.timestamp.after.max.ms",
                             "message.timestamp.difference.max.ms", "min.insync.replicas",
                             "follower.replication.throttled.replicas", "leader.replication.throttled.replicas",
                             "confluent.placement.constraints"})
# A topic's state when its target is not written (refused_topics in the status).
FAILED_OVER = "FAILED_OVER"  # the target is no mirror topic (promoted, failed over, or an ordinary one)
REVERSED = "REVERSED"  # the source's topic is a copy of its target (failed back): copied the other way
SOURCE_DELETED = "SOURCE_DELETED"  # the target is a copy of a source topic that is gone
OTHER_SOURCE = "OTHER_SOURCE"  # the target is a mirror topic of another topic
FENCED = "FENCED"  # a failover or failback holds the topic still (read-only, no mirrored batches)


def fence(topic: str) -> str:
    """The mirror.source a failover or failback puts on a topic while it reads where the copy
    ends or keeps aside what only the topic holds: producers are refused, as on any mirror
    topic, and so is MirrorAppend (cluster/storage/config.py `mirror_fenced`)."""
    return f"{MIRROR_FENCE_CLUSTER}:{topic}"


def fenced_topic(marker: str | None) -> str | None:
    """The topic a fence marker names (None: no fence)."""
    return marker.split(":", 1)[1] if marker is not None and mirror_fenced(marker) else None


def mirror_source_value(cluster: str, topic: str) -> str:
    return f"{cluster}:{topic}"


# ---- topic pairs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PairFacts:
    """What the clusters say of one topic pair of a direction (copied from -> into)."""

    source_cluster: str  # copied from, in this direction
    source_topic: str
    target_cluster: str
    target_topic: str
    reverse: bool  # the failed-back direction (the flow's target copied into its source)
    source_marker: str | None  # mirror.source of the topic copied from
    target_exists: bool
    target_marker: str | None


@dataclass(frozen=True)
class PairAction:
    """`copy`, `create` (a new mirror topic, then copy), `skip` (nothing, said nowhere) or
    `refuse` (not written; `state` and `why` go to the status)."""

    action: str
    state: str = ""
    why: str = ""


def topic_pair(f: PairFacts) -> PairAction:
    """Whether a direction copies a topic pair. Only the flow's direction creates mirror
    topics; a direction only ever writes into a topic marked as a copy of the one it reads,
    so whatever the order of commands and restarts, nothing is written into a primary."""
    marker = mirror_source_value(f.source_cluster, f.source_topic)
    promoting = f.target_marker == marker  # both are copies of each other: this direction finishes the copy
    if not f.reverse and f.source_marker == mirror_source_value(f.target_cluster, f.target_topic) and not promoting:
        return PairAction("refuse", REVERSED,
                          f"{REVERSED}: {f.source_topic} in {f.source_cluster} is a mirror topic of "
                          f"{f.target_cluster}:{f.target_topic} (failed back): copied the other way")
    if not f.target_exists:
        return PairAction("skip") if f.reverse else PairAction("create")
    if f.target_marker == marker:
        return PairAction("copy")
    if fenced_topic(f.target_marker) is not None:
        return PairAction("refuse", FENCED,
                          f"{FENCED}: {f.target_topic} in {f.target_cluster} is held still by a failover or failback "
                          "(`dcmirror mirror failover|failback`): not written into")
    if f.target_marker is None:
        return PairAction("refuse", FAILED_OVER,
                          f"{FAILED_OVER}: {f.target_topic} in {f.target_cluster} is not a mirror topic (promoted, "
                          "failed over, or an ordinary topic of that name): not written into")
    return PairAction("refuse", OTHER_SOURCE,
                      f"{f.target_topic} in {f.target_cluster} is a mirror topic of {f.target_marker}, not of "
                      f"{marker}: not written into")


def deleted_source(source_cluster: str, target_topic: str, target_marker: str | None,
                   source_topics: set[str]) -> str | None:
    """The source topic a target topic is a copy of, when that topic is gone from the source
    (None: it is not a copy of this source, or its topic is there)."""
    prefix = f"{source_cluster}:"
    if target_marker is None or not target_marker.startswith(prefix):
        return None
    topic = target_marker[len(prefix):]
    return None if topic in source_topics else topic


def deleted_why(source_cluster: str, source_topic: str, target_cluster: str, target_topic: str) -> str:
    return (f"{SOURCE_DELETED}: {source_cluster}:{source_topic} was deleted; {target_cluster}:{target_topic} keeps "
            "the copy (read-only): delete it, or make it an ordinary topic by hand; failover and promote leave it")


# ---- a partition's claim -------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimFacts:
    target_end: int  # the target partition's log end (its high watermark: what it holds for good)
    source_start: int  # the source partition's log start
    source_high_watermark: int
    both_marked: bool  # the topic copied from is itself marked as a copy of the target's
    # Whether the target's last batch is the source's batch at the same offsets (same last
    # offset, producer id and epoch, kind); None: not compared (an empty copy, or the source
    # no longer holds that offset).
    tail_matches: bool | None = None


@dataclass(frozen=True)
class Resume:
    """Copy from `position`; `lost` (first, last) offsets deleted at the source before they
    were copied (retention), said and counted."""

    position: int
    lost: tuple[int, int] | None = None


@dataclass(frozen=True)
class WaitPromotion:
    """Both sides are copies of each other: a promotion is under way, the other direction
    finishes the copy; claimed again later."""

    why: str = "waiting: both sides are mirror topics (a promotion under way)"


@dataclass(frozen=True)
class Diverged:
    """The target holds offsets the source does not: an operator decides, never the worker."""

    why: str


def claim(f: ClaimFacts) -> Resume | WaitPromotion | Diverged:
    """Where a mirror partition resumes: at the target's log end. Below the source's log
    start, the records between were lost to retention before they were copied (reported),
    and copying goes on from the log start; an empty copy simply starts there."""
    if f.target_end > f.source_high_watermark and f.both_marked:
        return WaitPromotion()
    if f.target_end <= f.source_high_watermark and f.tail_matches is False:
        return Diverged(f"the target's batch before offset {f.target_end} is not the source's at those offsets: "
                        "their histories differ below it (a failover under a promotion, a topic created again); "
                        "not copied further until an operator acts (`dcmirror mirror failback` keeps aside what "
                        "the target holds alone)")
    if f.target_end > f.source_high_watermark:
        return Diverged(f"the target holds offsets up to {f.target_end - 1}, the source only up to "
                        f"{f.source_high_watermark - 1}: the source lost records the mirror copied (an unclean "
                        "election, a topic created again); not copied further until an operator acts")
    if f.target_end < f.source_start and f.target_end == 0:
        return Resume(f.source_start)
    if f.target_end < f.source_start:
        return Resume(f.source_start, (f.target_end, f.source_start - 1))
    return Resume(f.target_end)


@dataclass(frozen=True)
class BatchTail:
    """What a claim compares of the batch holding the offset before the resume point."""

    last_offset: int
    producer_id: int
    producer_epoch: int
    control: bool
    transactional: bool


def tails_match(source: BatchTail | None, target: BatchTail | None) -> bool | None:
    """Whether both logs hold the same batch before the resume point (None: one side has none
    to compare). Not the CRC: a compacted copy may have cleaned the batch its own way."""
    if source is None or target is None:
        return None
    return source == target


def follows(fetch_offset: int, copy_position: int) -> bool:
    """Whether a fetched chunk is the data that follows what the target holds (a chunk of a
    position given up meanwhile is not: the partition is claimed again)."""
    return fetch_offset == copy_position
