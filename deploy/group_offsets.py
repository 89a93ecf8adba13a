"""Moving a consumer group's committed offsets, as kafka-consumer-groups --reset-offsets does:
one place for `dcmirror groups reset-offsets` and the web console's group page.

A reset needs the group empty (no member would see its offsets move under it). Targets out
of a partition's range are clamped to it, as Kafka's tool does."""

from __future__ import annotations

from dataclasses import dataclass

from cluster.client.admin import EARLIEST, LATEST, Admin, AdminError

RESET_KINDS = ("earliest", "latest", "offset", "datetime", "shift")
"""to-earliest, to-latest, to-offset N, to-datetime T, shift-by N."""

TopicPartition = tuple[str, int]


class GroupNotEmpty(ValueError):
    """The group has members: its offsets are not moved."""


@dataclass(frozen=True)
class ResetTo:
    kind: str  # one of RESET_KINDS
    offset: int = 0  # the offset (kind offset) or the shift (kind shift, negative: back)
    timestamp_ms: int = 0  # kind datetime

    def __post_init__(self) -> None:
        if self.kind not in RESET_KINDS:
            raise ValueError(f"reset to {self.kind!r}: one of {', '.join(RESET_KINDS)}")

    def describe(self) -> str:
        return {"earliest": "to each partition's log start", "latest": "to each partition's end",
                "offset": f"to offset {self.offset}", "shift": f"by {self.offset:+d} from the committed offsets",
                "datetime": f"to the first offset at or after {self.timestamp_ms} ms"}[self.kind]


@dataclass(frozen=True)
class OffsetMove:
    topic: str
    partition: int
    current: int | None  # the committed offset now (None: none committed)
    new: int


async def partitions_of(admin: Admin, specs: list[str]) -> list[TopicPartition]:
    """TOPIC (every partition) or TOPIC:P1,P2 per spec, as kafka-consumer-groups takes them."""
    partitions: list[TopicPartition] = []
    for spec in specs:
        topic, _, parts = spec.partition(":")
        if parts:
            partitions += [(topic, int(p)) for p in parts.split(",")]
        else:
            meta = await admin.metadata([topic])
            (t,) = meta.topics
            if t.error_code != 0:
                raise AdminError(f"topic {topic!r}", t.error_code)
            partitions += [(topic, p.partition_index) for p in t.partitions]
    return partitions


async def plan_reset(admin: Admin, group: str, partitions: list[TopicPartition], to: ResetTo) -> list[OffsetMove]:
    """Where each partition's committed offset would go (nothing is committed here)."""
    (described,) = await admin.describe_groups([group])
    if described.group_state not in ("Empty", "Dead"):
        raise GroupNotEmpty(f"group {group} is {described.group_state}; stop its consumers before resetting offsets")
    return await plan_offsets(admin, partitions, to, await admin.committed_offsets(group))


async def plan_offsets(admin: Admin, partitions: list[TopicPartition], to: ResetTo,
                       current: dict[TopicPartition, int]) -> list[OffsetMove]:
    """Where each partition's offset would go from `current` (a share group's start offsets
    here), kept in the log's range as Kafka's tools keep it; nothing is moved here."""
    earliest = await admin.list_offsets(partitions, EARLIEST)
    latest = await admin.list_offsets(partitions, LATEST)
    if to.kind == "earliest":
        target = dict(earliest)
    elif to.kind == "latest":
        target = dict(latest)
    elif to.kind == "offset":
        target = dict.fromkeys(partitions, to.offset)
    elif to.kind == "datetime":
        by_time = await admin.list_offsets(partitions, to.timestamp_ms)
        target = {tp: (off if off >= 0 else latest[tp]) for tp, off in by_time.items()}
    else:
        target = {tp: current.get(tp, latest[tp]) + to.offset for tp in partitions}
    return [OffsetMove(tp[0], tp[1], current.get(tp), min(max(off, earliest[tp]), latest[tp]))
            for tp, off in sorted(target.items())]


async def commit_moves(admin: Admin, group: str, moves: list[OffsetMove]) -> None:
    await admin.commit_offsets(group, {(m.topic, m.partition): m.new for m in moves})
