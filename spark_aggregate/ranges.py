"""Offset ranges: what a batch read covers, resolved against the partitions' log start
offsets and high watermarks, and split into Spark input partitions (sans-IO)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from spark_aggregate.options import EARLIEST, LATEST, OffsetSpec, OptionError

TopicPartition = tuple[str, int]


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets [start, end) of one partition: the records one input partition reads."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.start}, {self.end})"


@dataclass(frozen=True)
class PartitionOffsets:
    """ListOffsets at the leader: the first offset still in the log and the high watermark
    (records below it are committed: on every in-sync replica)."""

    log_start: int
    high_watermark: int


class DataLossError(Exception):
    """Records that should be read were deleted (retention) before they were: names the
    partition and the missing offsets."""


@dataclass(frozen=True)
class Gap:
    """Offsets [start, end) of a partition that were gone before they could be read."""

    topic: str
    partition: int
    start: int
    end: int
    log_start: int

    def describe(self) -> str:
        return (f"{self.topic}-{self.partition}: offsets {self.start} to {self.end - 1} "
                f"({self.end - self.start} offsets) were deleted before they were read "
                f"(the log start offset is {self.log_start})")


def data_loss_message(gap: Gap) -> str:
    return (f"data loss in {gap.describe()}; a retention.ms or retention.bytes shorter than the time "
            "between loads deletes records first. Set failOnDataLoss=false to record the gap and go on")


def resolve_ranges(partitions: Iterable[TopicPartition], offsets: Mapping[TopicPartition, PartitionOffsets],
                   starting: OffsetSpec, ending: OffsetSpec, *, fail_on_data_loss: bool
                   ) -> tuple[list[OffsetRange], list[Gap]]:
    """The range of each partition (empty ones included) and the gaps found at its start.

    A start below the log start offset is data loss: an error with `fail_on_data_loss`,
    otherwise the range starts at the log start and the gap is returned. Explicit ends
    above the high watermark are refused: only committed records can be read.
    """
    wanted = sorted(set(partitions))
    for spec, name in ((starting, "startingOffsets"), (ending, "endingOffsets")):
        if spec.kind == "json":
            missing = [tp for tp in wanted if tp not in spec.offsets]
            extra = sorted(tp for tp in spec.offsets if tp not in set(wanted))
            if missing or extra:
                problems = []
                if missing:
                    problems.append("it leaves out " + ", ".join(f"{t}-{p}" for t, p in missing))
                if extra:
                    problems.append("it names partitions that are not read: " + ", ".join(f"{t}-{p}" for t, p in extra))
                raise OptionError(f"option {name} must give an offset for every partition read; "
                                  + "; ".join(problems))
    ranges: list[OffsetRange] = []
    gaps: list[Gap] = []
    for tp in wanted:
        log = offsets[tp]
        topic, partition = tp
        start = starting.offset_of(tp)
        end = ending.offset_of(tp)
        start = log.log_start if start == EARLIEST else start
        end = log.high_watermark if end == LATEST else end
        if end > log.high_watermark:
            raise OptionError(f"endingOffsets: offset {end} of {topic}-{partition} is beyond its high watermark "
                              f"{log.high_watermark} (only committed records can be read)")
        if start > end:
            raise OptionError(f"startingOffsets: offset {start} of {topic}-{partition} is beyond its ending "
                              f"offset {end}")
        if start < log.log_start and start < end:
            gap = Gap(topic, partition, start, min(log.log_start, end), log.log_start)
            if fail_on_data_loss:
                raise DataLossError(data_loss_message(gap))
            gaps.append(gap)
            start = min(log.log_start, end)
        ranges.append(OffsetRange(topic, partition, start, end))
    return ranges, gaps


def split_ranges(ranges: Sequence[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Non-empty ranges, split so that there are at least `min_partitions` (as Spark's Kafka
    source does: each range gets a share of the input partitions proportional to its size,
    at least one, and is cut into that many nearly equal parts)."""
    nonempty = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(nonempty) >= min_partitions:
        return nonempty
    total = sum(r.size for r in nonempty)
    out: list[OffsetRange] = []
    for r in nonempty:
        parts = min(r.size, max(1, -(-r.size * min_partitions // total)))  # ceil, at most one per offset
        for i in range(parts):
            lo = r.start + r.size * i // parts
            hi = r.start + r.size * (i + 1) // parts
            out.append(OffsetRange(r.topic, r.partition, lo, hi))
    return out


def cap_ranges(ranges: Sequence[OffsetRange], max_size: int) -> list[OffsetRange]:
    """Ranges cut into nearly equal parts of at most `max_size` offsets."""
    if max_size < 1:
        raise ValueError(f"max_size must be at least 1, not {max_size}")
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, -(-r.size // max_size))
        for i in range(parts):
            out.append(OffsetRange(r.topic, r.partition, r.start + r.size * i // parts,
                                   r.start + r.size * (i + 1) // parts))
    return out
