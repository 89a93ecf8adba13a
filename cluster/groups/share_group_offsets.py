"""The share-group offset admin decisions (KIP-932, Kafka 4.3.1's DescribeShareGroupOffsets,
AlterShareGroupOffsets and DeleteShareGroupOffsets), sans-IO: which share partitions a call
touches, with which state epoch, and what each one answers. The handlers
(cluster/broker/share_offsets_handlers.py) do the share coordinator's calls and the
partition leaders' ListOffsets around these.

A share partition is *initialized* for a group once the group coordinator has made its state
at the share coordinator (InitializeShareGroupState): when a member's subscription first
takes in its topic, or when AlterShareGroupOffsets sets it. Only initialized share partitions
are assigned to members, listed by a describe of all offsets, and deleted with the group.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cluster.protocol.errors import ErrorCode

OFFSETS_PARTITIONS_MAX = 10_000  # share partitions one offsets call may name
UNKNOWN_OFFSET = -1  # an offset not known (never initialized, or an error)
NO_OFFSET_INFORMATION = "There is no offset information to delete."
UNKNOWN_TOPIC_OR_PARTITION = "This server does not host this topic-partition."
NON_EMPTY_GROUP = "The group is not empty."

TopicPartitions = dict[str, set[int]]
"""topic id -> partitions."""


def share_lag(high_watermark: int, start_offset: int, delivery_complete_count: int) -> int:
    """KIP-1226's share-partition lag: the records from the start offset to the high
    watermark that are not settled yet (acquired, available or not fetched at all); -1 when
    the start or the settled count is not known. As Kafka, not clamped: a start offset
    altered past the high watermark gives a negative lag until records reach it."""
    if start_offset == UNKNOWN_OFFSET or delivery_complete_count < 0 or high_watermark < 0:
        return -1
    return high_watermark - start_offset - delivery_complete_count


def alter_state_epoch(group_epoch: int, stored_state_epoch: int | None) -> int:
    """The state epoch AlterShareGroupOffsets initializes a share partition with: above the
    stored one, so a share-partition leader that still holds the old state is fenced
    (FENCED_STATE_EPOCH) at its next write. Kafka uses the group epoch, which is durable
    there; here the group lives in its coordinator's memory and its epoch starts again at
    0 when the coordinator moves, so the stored epoch bounds it from below."""
    return max(group_epoch, 0 if stored_state_epoch is None else stored_state_epoch + 1)


def uninitialized(initialized: Mapping[str, set[int]], partition_counts: Mapping[str, int]) -> TopicPartitions:
    """Of the subscribed topics' partitions (topic id -> partition count), those the group
    has not initialized."""
    out: TopicPartitions = {}
    for topic_id, count in partition_counts.items():
        done = initialized.get(topic_id, set())
        missing = {p for p in range(count) if p not in done}
        if missing:
            out[topic_id] = missing
    return out


def add_partitions(into: TopicPartitions, topic_id: str, partitions: Iterable[int]) -> None:
    into.setdefault(topic_id, set()).update(partitions)


@dataclass(frozen=True, slots=True)
class DescribedPartition:
    """One partition of DescribeShareGroupOffsets' answer."""

    partition_index: int
    start_offset: int = UNKNOWN_OFFSET
    leader_epoch: int = 0
    lag: int = -1
    error_code: int = ErrorCode.none
    error_message: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {"partition_index": self.partition_index, "start_offset": self.start_offset,
                "leader_epoch": self.leader_epoch, "lag": self.lag, "error_code": self.error_code,
                "error_message": self.error_message}


def described(partition: int, summary_error: int, start_offset: int, leader_epoch: int,
              delivery_complete_count: int, high_watermark: tuple[int, int] | None) -> DescribedPartition:
    """A share partition as Kafka 4.3.1 describes it: the share coordinator's error is no
    error (start offset -1, leader epoch 0, lag -1: absence of data, as OffsetFetch); a
    share partition never started has no lag; the high watermark's error (the partition's
    leader could not answer, or none was asked: the topic went meanwhile) is the partition's."""
    if summary_error != ErrorCode.none or start_offset == UNKNOWN_OFFSET or delivery_complete_count < 0:
        ok = summary_error == ErrorCode.none
        return DescribedPartition(partition, start_offset if ok else UNKNOWN_OFFSET, leader_epoch if ok else 0)
    code, offset = high_watermark if high_watermark is not None else (ErrorCode.leader_not_available, -1)
    if code != ErrorCode.none:
        return DescribedPartition(partition, UNKNOWN_OFFSET, 0, -1, code, ErrorCode(code).name)
    return DescribedPartition(partition, start_offset, leader_epoch,
                              share_lag(offset, start_offset, delivery_complete_count))
