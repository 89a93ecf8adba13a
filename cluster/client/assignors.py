"""Consumer-group partition assignors ("range", "roundrobin") and the classic "consumer"
embedded protocol they exchange (ConsumerProtocolSubscription in JoinGroup metadata,
ConsumerProtocolAssignment in SyncGroup). Sans-IO: bytes and dicts in, bytes and dicts out.

Assignments match the Java client's and librdkafka's (without rack awareness), so a group
mixing those clients with ours gets the same assignment whichever member leads it.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_assignment.v1 import data as assignment_v1
from kio.schema.consumer_protocol_assignment.v2 import data as assignment_v2
from kio.schema.consumer_protocol_assignment.v3 import data as assignment_v3
from kio.schema.consumer_protocol_subscription.v0 import data as subscription_v0
from kio.schema.consumer_protocol_subscription.v1 import data as subscription_v1
from kio.schema.consumer_protocol_subscription.v2 import data as subscription_v2
from kio.schema.consumer_protocol_subscription.v3 import data as subscription_v3
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

TopicPartition = tuple[str, int]

# Index = version. Versions newer than these are read with the newest schema: Kafka only ever
# appends fields, so an older reader sees the fields it knows and ignores the rest.
_SUBSCRIPTION_MODULES: tuple[Any, ...] = (
    subscription_v0, subscription_v1, subscription_v2, subscription_v3,
)
_ASSIGNMENT_MODULES: tuple[Any, ...] = (assignment_v0, assignment_v1, assignment_v2, assignment_v3)
_DECODE_ERRORS = (SerialError, ValueError, TypeError, OverflowError, struct.error)


@dataclass(frozen=True)
class Subscription:
    """One member's ConsumerProtocolSubscription.

    `group_instance_id` is not part of the embedded protocol: the leader fills it in from the
    JoinGroup response (static members sort by it, as in Kafka).
    """

    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: list[TopicPartition] = field(default_factory=list)
    generation_id: int = -1
    rack_id: str | None = None
    group_instance_id: str | None = None


def _grouped(
    partitions: Mapping[str, Iterable[int]] | Iterable[TopicPartition],
) -> dict[str, list[int]]:
    if isinstance(partitions, Mapping):
        return {topic: list(ps) for topic, ps in partitions.items()}
    grouped: dict[str, list[int]] = {}
    for topic, partition in partitions:
        grouped.setdefault(topic, []).append(partition)
    return grouped


def _encode(what: str, version: int, entity: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(struct.pack(">h", version))
    try:
        entity_writer(type(entity))(buffer, entity)
    except (SerialError, struct.error) as e:
        raise ValueError(f"cannot encode consumer protocol {what} v{version}: {e}") from e
    return buffer.getvalue()


def _decode(what: str, modules: tuple[Any, ...], class_name: str, data: bytes) -> Any:
    if len(data) < 2:
        raise ValueError(
            f"cannot decode consumer protocol {what}: {len(data)} bytes, need a 2-byte version"
        )
    (version,) = struct.unpack_from(">h", data)
    if version < 0:
        raise ValueError(f"cannot decode consumer protocol {what}: negative version {version}")
    schema = getattr(modules[min(version, len(modules) - 1)], class_name)
    try:
        value, _ = entity_reader(schema)(bytes(data), 2)
    except _DECODE_ERRORS as e:
        raise ValueError(f"cannot decode consumer protocol {what} v{version}: {e}") from e
    return value


def _not_null(items: Any, what: str, name: str) -> Any:
    # kio reads a null (-1) legacy array as None even where Kafka's schema forbids null.
    if items is None:
        raise ValueError(f"cannot decode consumer protocol {what}: {name} is null")
    return items


def _flattened(topic_partitions: Iterable[Any], what: str) -> list[TopicPartition]:
    return [
        (tp.topic, int(p))
        for tp in topic_partitions
        for p in _not_null(tp.partitions, what, f"partitions of topic {tp.topic!r}")
    ]


def encode_subscription(
    topics: Sequence[str],
    user_data: bytes | None = None,
    owned: Iterable[TopicPartition] = (),
    version: int = 1,
    *,
    generation_id: int = -1,
    rack_id: str | None = None,
) -> bytes:
    """JoinGroup metadata for the "consumer" protocol. Fields newer than `version` are dropped,
    as Kafka drops ignorable fields."""
    if not 0 <= version < len(_SUBSCRIPTION_MODULES):
        raise ValueError(f"subscription version {version} is not supported (0..3)")
    module = _SUBSCRIPTION_MODULES[version]
    fields: dict[str, Any] = {"topics": tuple(topics), "user_data": user_data}
    if version >= 1:
        fields["owned_partitions"] = tuple(
            module.TopicPartition(topic=t, partitions=tuple(ps))
            for t, ps in _grouped(owned).items()
        )
    if version >= 2:
        fields["generation_id"] = generation_id
    if version >= 3:
        fields["rack_id"] = rack_id
    return _encode("subscription", version, module.ConsumerProtocolSubscription(**fields))


def decode_subscription(data: bytes) -> Subscription:
    """Parse JoinGroup member metadata of any version; raise ValueError if malformed."""
    value = _decode("subscription", _SUBSCRIPTION_MODULES, "ConsumerProtocolSubscription", data)
    owned = getattr(value, "owned_partitions", ())
    return Subscription(
        topics=list(_not_null(value.topics, "subscription", "topics")),
        user_data=value.user_data,
        owned_partitions=_flattened(
            _not_null(owned, "subscription", "owned partitions"), "subscription"
        ),
        generation_id=int(getattr(value, "generation_id", -1)),
        rack_id=getattr(value, "rack_id", None),
    )


def encode_assignment(
    partitions: Mapping[str, Iterable[int]] | Iterable[TopicPartition],
    user_data: bytes | None = None,
    version: int = 1,
) -> bytes:
    """SyncGroup assignment for one member; partitions are grouped by topic in input order."""
    if not 0 <= version < len(_ASSIGNMENT_MODULES):
        raise ValueError(f"assignment version {version} is not supported (0..3)")
    module = _ASSIGNMENT_MODULES[version]
    assigned = tuple(
        module.TopicPartition(topic=t, partitions=tuple(ps))
        for t, ps in _grouped(partitions).items()
    )
    entity = module.ConsumerProtocolAssignment(assigned_partitions=assigned, user_data=user_data)
    return _encode("assignment", version, entity)


def decode_assignment(data: bytes) -> list[TopicPartition]:
    """Partitions in a SyncGroup assignment of any version. Empty bytes are an empty assignment
    (the broker and librdkafka send them); other malformed data raises ValueError."""
    if not data:
        return []
    value = _decode("assignment", _ASSIGNMENT_MODULES, "ConsumerProtocolAssignment", data)
    assigned = _not_null(value.assigned_partitions, "assignment", "partitions")
    return _flattened(assigned, "assignment")


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
