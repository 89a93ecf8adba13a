"""Records of `__share_group_state`: each share partition's durable state (KIP-932), sans-IO.

One record per share partition, keyed by (group id, topic id, partition); the value is the
share partition's state as the share coordinator last accepted it: the state epoch, the
leader epoch of the share-partition leader that wrote it, the share-partition start offset
(SPSO, -1 while no leader has started the share partition) and the runs of in-flight
records that have a state or a delivery count. The topic is compacted, so the latest value
per key is the state; a None value (tombstone) deletes it. Kafka writes snapshots and
updates in its own binary schema; ours is versioned JSON as `__consumer_offsets` here
(cluster/groups/records.py), and the share-partition leaders speak Kafka's
ReadShareGroupState/WriteShareGroupState to the coordinator, so only the topic's bytes differ.

Everything decoded is bounded before it is allocated (key and value sizes, batch counts)
and checked (ascending, disjoint batches at or above the start offset, known states).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import orjson

from cluster.groups.records import partition_for
from cluster.groups.share_partition import RecordState, StateBatch

SHARE_STATE_TOPIC = "__share_group_state"
RECORD_VERSION = 1
KEY_BYTES_MAX = 4096  # a group id and a topic id, in JSON
VALUE_BYTES_MAX = 1 << 20
STATE_BATCHES_MAX = 10_000  # runs one share partition's state holds at most
UNINITIALIZED = -1  # the start offset of a share partition no leader has started yet
_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1
_DURABLE_STATES = frozenset({RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED})


class ShareKey(NamedTuple):
    """A share partition: one group's view of one topic partition."""

    group_id: str
    topic_id: str
    partition: int

    def coordinator_key(self) -> str:
        """FindCoordinator's key of type SHARE (2): "group:topicId:partition"."""
        return f"{self.group_id}:{self.topic_id}:{self.partition}"


@dataclass(frozen=True, slots=True)
class ShareStateValue:
    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...] = ()


class StateRecordError(ValueError):
    """A record or a request's state that breaks the format's limits or invariants."""


def state_partition_for(key: ShareKey, partitions: int) -> int:
    """The `__share_group_state` partition (and so the share coordinator) of a share partition."""
    return partition_for(key.coordinator_key(), partitions)


def check_batches(start_offset: int, batches: tuple[StateBatch, ...]) -> None:
    """Ascending, disjoint runs of durable states, at or above the start offset."""
    if len(batches) > STATE_BATCHES_MAX:
        raise StateRecordError(f"{len(batches)} state batches, at most {STATE_BATCHES_MAX}")
    previous_last = max(start_offset, 0) - 1
    for b in batches:
        if not previous_last < b.first_offset <= b.last_offset <= _INT64_MAX:
            raise StateRecordError(f"state batch [{b.first_offset}, {b.last_offset}] is out of order or below the "
                                   f"start offset {start_offset}")
        if b.state not in _DURABLE_STATES or not 0 <= b.delivery_count <= 0x7FFF:
            raise StateRecordError(f"state batch [{b.first_offset}, {b.last_offset}]: state {int(b.state)} "
                                   f"delivery count {b.delivery_count}")
        previous_last = b.last_offset


def check_value(value: ShareStateValue) -> None:
    if not (0 <= value.state_epoch <= _INT32_MAX and -1 <= value.leader_epoch <= _INT32_MAX
            and UNINITIALIZED <= value.start_offset <= _INT64_MAX):
        raise StateRecordError(f"state epoch {value.state_epoch}, leader epoch {value.leader_epoch}, "
                               f"start offset {value.start_offset}")
    if value.start_offset == UNINITIALIZED and value.batches:
        raise StateRecordError("an uninitialized share partition has no state batches")
    check_batches(value.start_offset, value.batches)


def encode_key(key: ShareKey) -> bytes:
    data = orjson.dumps({"v": RECORD_VERSION, "type": "share", "group": key.group_id, "topic_id": key.topic_id,
                         "partition": key.partition})
    assert len(data) <= KEY_BYTES_MAX, f"share state key of {len(data)} bytes"
    return data


def encode_value(value: ShareStateValue) -> bytes:
    check_value(value)  # never write what could not be read back
    data = orjson.dumps({"state_epoch": value.state_epoch, "leader_epoch": value.leader_epoch,
                         "start_offset": value.start_offset,
                         "batches": [[b.first_offset, b.last_offset, int(b.state), b.delivery_count]
                                     for b in value.batches]})
    assert len(data) <= VALUE_BYTES_MAX, f"share state value of {len(data)} bytes"
    return data


def decode_key(data: bytes) -> ShareKey | None:
    """The share partition a key names; None for a key of another kind or version."""
    if len(data) > KEY_BYTES_MAX:
        raise StateRecordError(f"share state key of {len(data)} bytes, at most {KEY_BYTES_MAX}")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StateRecordError(f"share state key is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != RECORD_VERSION or doc.get("type") != "share":
        return None
    group, topic_id, partition = doc.get("group"), doc.get("topic_id"), doc.get("partition")
    if not isinstance(group, str) or not isinstance(topic_id, str) or not isinstance(partition, int) \
            or not 0 <= partition <= _INT32_MAX:
        raise StateRecordError(f"share state key {doc!r}")
    return ShareKey(group, topic_id, partition)


def decode_value(data: bytes) -> ShareStateValue:
    if len(data) > VALUE_BYTES_MAX:
        raise StateRecordError(f"share state value of {len(data)} bytes, at most {VALUE_BYTES_MAX}")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise StateRecordError(f"share state value is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise StateRecordError("share state value is not an object")
    raw = doc.get("batches")
    if not isinstance(raw, list) or len(raw) > STATE_BATCHES_MAX:
        raise StateRecordError(f"share state batches: at most {STATE_BATCHES_MAX} in a list")
    fields = (doc.get("state_epoch"), doc.get("leader_epoch"), doc.get("start_offset"))
    if not all(isinstance(f, int) for f in fields):
        raise StateRecordError(f"share state value {fields!r}")
    batches: list[StateBatch] = []
    for b in raw:
        if not isinstance(b, list) or len(b) != 4 or not all(isinstance(x, int) for x in b):
            raise StateRecordError(f"share state batch {b!r}")
        try:
            state = RecordState(b[2])
        except ValueError:
            raise StateRecordError(f"share state batch {b!r}: unknown state") from None
        batches.append(StateBatch(b[0], b[1], state, b[3]))
    value = ShareStateValue(int(fields[0]), int(fields[1]), int(fields[2]), tuple(batches))  # type: ignore[arg-type]
    check_value(value)
    return value


def replay(records: list[tuple[bytes | None, bytes | None]]) -> dict[ShareKey, ShareStateValue]:
    """The share partitions' states from a state partition's (key, value) pairs in log
    order: the last value per key wins, a tombstone deletes. A record that cannot be read
    is a bug or a corruption the log's CRC did not catch: it raises."""
    out: dict[ShareKey, ShareStateValue] = {}
    for raw_key, raw_value in records:
        if raw_key is None:
            continue
        key = decode_key(raw_key)
        if key is None:
            continue
        if raw_value is None:
            out.pop(key, None)
        else:
            out[key] = decode_value(raw_value)
    return out


def merge_batches(old: tuple[StateBatch, ...], new: tuple[StateBatch, ...],
                  start_offset: int) -> tuple[StateBatch, ...]:
    """A write's batches over the stored ones (the write wins where they overlap), runs
    below `start_offset` dropped or cut, touching runs of one state and count joined: what
    Kafka's share coordinator does with a WriteShareGroupState (PersisterStateBatchCombiner)."""
    pieces: list[StateBatch] = list(new)
    j = 0
    for b in old:
        first = b.first_offset
        while j < len(new) and new[j].last_offset < first:
            j += 1
        k = j
        while first <= b.last_offset:
            if k < len(new) and new[k].first_offset <= b.last_offset:
                if new[k].first_offset > first:
                    pieces.append(StateBatch(first, new[k].first_offset - 1, b.state, b.delivery_count))
                first = new[k].last_offset + 1
                k += 1
            else:
                pieces.append(StateBatch(first, b.last_offset, b.state, b.delivery_count))
                break
    pieces.sort(key=lambda p: p.first_offset)
    out: list[StateBatch] = []
    for p in pieces:
        if p.last_offset < start_offset:
            continue
        if p.first_offset < start_offset:
            p = StateBatch(start_offset, p.last_offset, p.state, p.delivery_count)
        last = out[-1] if out else None
        if last is not None and last.last_offset + 1 == p.first_offset \
                and (last.state, last.delivery_count) == (p.state, p.delivery_count):
            out[-1] = StateBatch(last.first_offset, p.last_offset, p.state, p.delivery_count)
        else:
            out.append(p)
    return tuple(out)


def delivery_complete_count(value: ShareStateValue) -> int:
    """Records of the in-flight window that are settled (ACKNOWLEDGED or ARCHIVED): what
    KIP-1226's DeliveryCompleteCount counts, so that a share partition's lag is its high
    watermark less its start offset less this. -1 while no leader started the share partition."""
    if value.start_offset == UNINITIALIZED:
        return -1
    return sum(b.last_offset - max(b.first_offset, value.start_offset) + 1 for b in value.batches
               if b.state in (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED) and b.last_offset >= value.start_offset)
