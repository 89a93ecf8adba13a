"""Records of `__consumer_offsets`: committed offsets and group metadata, as versioned JSON.

Keys are deterministic so compaction keeps the latest value per offset/group; a None
value is a tombstone. `replay` rebuilds coordinator state from the records in log order.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson

from cluster.groups.consumer_group import ConsumerGroupState, from_doc, to_doc
from cluster.groups.state import CommittedOffset, Group, GroupState, Member

OFFSETS_TOPIC = "__consumer_offsets"
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class GroupRecord:
    group_id: str
    key: bytes
    value: bytes | None


def java_string_hash(s: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's abs(hashCode) % partitions (Utils.abs maps MIN_VALUE to 0)."""
    h = java_string_hash(group_id)
    return (0 if h == -(2**31) else abs(h)) % partitions


def _key(kind: str, group_id: str, topic: str | None = None, partition: int | None = None) -> bytes:
    doc: dict[str, Any] = {"v": RECORD_VERSION, "type": kind, "group": group_id}
    if topic is not None:
        doc["topic"] = topic
        doc["partition"] = partition
    return orjson.dumps(doc)


def offset_record(group_id: str, topic: str, partition: int, committed: CommittedOffset | None) -> GroupRecord:
    value = None
    if committed is not None:
        value = orjson.dumps({
            "offset": committed.offset, "leader_epoch": committed.leader_epoch,
            "metadata": committed.metadata, "commit_timestamp_ms": committed.commit_timestamp_ms,
        })
    return GroupRecord(group_id, _key("offset", group_id, topic, partition), value)


def group_metadata_record(group: Group, *, tombstone: bool = False) -> GroupRecord:
    if tombstone:
        return GroupRecord(group.group_id, _key("group", group.group_id), None)
    value = orjson.dumps({
        "protocol_type": group.protocol_type,
        "generation": group.generation,
        "protocol": group.protocol_name,
        "leader": group.leader_id,
        "state_timestamp_ms": group.state_timestamp_ms,
        "members": [
            {
                "member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
                "client_host": m.client_host, "session_timeout_ms": m.session_timeout_ms,
                "rebalance_timeout_ms": m.rebalance_timeout_ms,
                "protocols": [[name, base64.b64encode(meta).decode()] for name, meta in m.protocols],
                "assignment": base64.b64encode(m.assignment).decode(),
            }
            for m in group.members.values()
        ],
    })
    return GroupRecord(group.group_id, _key("group", group.group_id), value)


def consumer_group_record(group_id: str, state: ConsumerGroupState | None) -> GroupRecord:
    """A KIP-848 group's whole state (None: the group is no consumer group any more)."""
    return GroupRecord(group_id, _key("consumer_group", group_id),
                       None if state is None else orjson.dumps(to_doc(state)))


def replay(records: list[tuple[bytes | None, bytes | None]], now_ms: int) -> dict[str, Group]:
    """Groups rebuilt from (key, value) pairs in log order; the last value per key wins."""
    latest: dict[bytes, bytes | None] = {}
    for key, value in records:
        if key is not None:
            latest[key] = value
    groups: dict[str, Group] = {}
    for key, value in latest.items():
        try:
            k = orjson.loads(key)
            if k.get("v") != RECORD_VERSION:
                continue
            if value is None:
                continue
            v = orjson.loads(value)
        except orjson.JSONDecodeError:
            continue
        group = groups.setdefault(k["group"], Group(k["group"]))
        if k["type"] == "offset":
            group.offsets[(k["topic"], int(k["partition"]))] = CommittedOffset(
                int(v["offset"]), int(v["leader_epoch"]), v["metadata"], int(v["commit_timestamp_ms"])
            )
        elif k["type"] == "group":
            group.protocol_type = v["protocol_type"]
            group.generation = int(v["generation"])
            group.protocol_name = v["protocol"]
            group.leader_id = v["leader"]
            group.state_timestamp_ms = int(v["state_timestamp_ms"])
            for m in v["members"]:
                member = Member(
                    m["member_id"], m["group_instance_id"], m["client_id"], m["client_host"],
                    int(m["session_timeout_ms"]), int(m["rebalance_timeout_ms"]), v["protocol_type"] or "",
                    [(name, base64.b64decode(meta)) for name, meta in m["protocols"]],
                    now_ms,  # members get a full session to come back after a coordinator move
                    assignment=base64.b64decode(m["assignment"]),
                )
                group.members[member.member_id] = member
                if member.group_instance_id is not None:
                    group.static_members[member.group_instance_id] = member.member_id
        elif k["type"] == "consumer_group":
            group.consumer = from_doc(v, now_ms)
            group.protocol_type = "consumer"
    for group in groups.values():
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
    return groups
