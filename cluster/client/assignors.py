"""Consumer-group partition assignors ("range", "roundrobin") over the members'
subscriptions (the embedded protocol's codec is cluster/protocol/consumer_protocol.py).
Sans-IO: dicts in, dicts out.

Assignments match the Java client's and librdkafka's (without rack awareness), so a group
mixing those clients with ours gets the same assignment whichever member leads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from cluster.protocol.consumer_protocol import (
    Subscription,
    TopicPartition,
)


class PartitionAssignor(Protocol):
    name: str

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]: ...


def _sorted_members(subscriptions: Mapping[str, Subscription]) -> list[str]:
    # Kafka's MemberInfo order: static members first, by group.instance.id; then by member id.
    def key(member_id: str) -> tuple[bool, str, str]:
        instance_id = subscriptions[member_id].group_instance_id
        return (instance_id is None, instance_id or "", member_id)

    return sorted(subscriptions, key=key)


def _members_per_topic(
    partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
) -> dict[str, list[str]]:
    """Existing topics (sorted) → subscribed members in assignment order."""
    members: dict[str, list[str]] = {}
    for member_id in _sorted_members(subscriptions):
        for topic in dict.fromkeys(subscriptions[member_id].topics):
            if topic in partitions_per_topic:
                members.setdefault(topic, []).append(member_id)
    return {topic: members[topic] for topic in sorted(members)}


class RangeAssignor:
    """Per topic: consecutive ranges of partitions to its subscribers in order, the first
    `partitions % subscribers` getting one extra."""

    name = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        assignment: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        for topic, members in _members_per_topic(partitions_per_topic, subscriptions).items():
            count = partitions_per_topic[topic]
            assert count >= 0, (topic, count)
            per_member, extra = divmod(count, len(members))
            start = 0
            for i, member_id in enumerate(members):
                length = per_member + (1 if i < extra else 0)
                assignment[member_id].extend((topic, p) for p in range(start, start + length))
                start += length
            assert start == count
        return assignment


class RoundRobinAssignor:
    """All partitions sorted by (topic, partition) dealt to the members in a cycle, skipping
    members not subscribed to the partition's topic."""

    name = "roundrobin"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        assignment: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        cycle = _sorted_members(subscriptions)
        subscribed = {m: set(subscriptions[m].topics) for m in cycle}
        position = 0
        for topic in _members_per_topic(partitions_per_topic, subscriptions):
            assert partitions_per_topic[topic] >= 0, (topic, partitions_per_topic[topic])
            for partition in range(partitions_per_topic[topic]):
                while topic not in subscribed[cycle[position]]:
                    position = (position + 1) % len(cycle)
                assignment[cycle[position]].append((topic, partition))
                position = (position + 1) % len(cycle)
        return assignment


ASSIGNORS: dict[str, PartitionAssignor] = {
    "range": RangeAssignor(),
    "roundrobin": RoundRobinAssignor(),
}
# Java clients configure partition.assignment.strategy with class names.
_JAVA_CLASS_NAMES = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
}


def assignor_for(names: str) -> list[PartitionAssignor]:
    """Assignors for a `partition.assignment.strategy` value such as "range,roundrobin", in
    preference order (the order JoinGroup offers them)."""
    if not names.strip():
        raise ValueError(
            f"partition.assignment.strategy is empty; supported: {', '.join(ASSIGNORS)}"
        )
    chosen: dict[str, PartitionAssignor] = {}
    for raw in names.split(","):
        name = _JAVA_CLASS_NAMES.get(raw.strip(), raw.strip())
        if name not in ASSIGNORS:
            raise ValueError(
                f"unknown partition.assignment.strategy {raw.strip()!r} in {names!r}; "
                f"supported: {', '.join(ASSIGNORS)}"
            )
        chosen.setdefault(name, ASSIGNORS[name])
    return list(chosen.values())
