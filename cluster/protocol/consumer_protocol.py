"""The classic "consumer" embedded protocol: ConsumerProtocolSubscription (JoinGroup member
metadata) and ConsumerProtocolAssignment (SyncGroup assignments), every version, with kio's
schemas. Sans-IO. Our consumer's assignors (cluster/client/assignors.py) and the group
coordinator (which topics a group's members subscribe to: OffsetDelete) both read them.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
