"""Answers written straight from the handlers' dicts, without building kio entities: Fetch
answers and Metadata's topic entries, the two a broker of 10,000 partitions writes per
partition.

Fetch: a sessionless consumer of N partitions (librdkafka has no fetch sessions) names every one in
every Fetch, and every answer carries all N, most of them empty. Built as kio dataclasses and
written field by field, an answer of 10,000 empty partitions took ~120 ms of the broker's one
event loop; packed here per partition with `struct`, a few milliseconds. The bytes are the
generic encoder's (`messages.encode_response`), version for version (4 to the newest):
tests/unit/test_response_writers.py checks them against it on drawn answers. Only what the
broker's fetch handler puts in an answer is written here. An answer with anything else (a
partition's tagged fields — diverging epoch, current leader, snapshot id — or node
endpoints) returns None and takes the generic path.

Metadata: a topic's entry (`metadata_topic_entry`), every version; encoding every partition
of 10,000 through kio took ~130 ms for the first answer to a new question. A nameless entry
(an unknown topic id) takes the generic path.

DescribeTopicPartitions (KIP-966, v0): a topic's entry (`describe_partitions_topic_entry`) and
the answer around entries kept encoded (`describe_partitions_body`); through kio a page of
2,000 partitions took ~40 ms (Kafka answers it in ~8).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

FETCH_API_KEY = 1
FIRST_VERSION = 4  # below: message sets (the legacy codec)
FIRST_FLEXIBLE_VERSION = 12
FIRST_TOPIC_ID_VERSION = 13

_PARTITION_KEYS = frozenset({"partition_index", "error_code", "high_watermark", "last_stable_offset",
                             "log_start_offset", "aborted_transactions", "preferred_read_replica", "records"})
_TOP_KEYS = frozenset({"throttle_time", "error_code", "session_id", "responses"})
_TOPIC_KEYS = frozenset({"topic", "topic_id", "partitions"})

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD_V4 = struct.Struct(">ihqq")  # partition, error, high watermark, last stable offset
_HEAD_V5 = struct.Struct(">ihqqq")  # ... and log start offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_ZERO_UUID = bytes(16)


def uvarint_bytes(n: int) -> bytes:
    """An unsigned varint (compact lengths and counts)."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _int(value: Any) -> int:
    """timedelta (throttle time) or int, as the generic encoder takes either."""
    if hasattr(value, "total_seconds"):
        return int(value.total_seconds() * 1000)
    return int(value)


class KeptPartitionAnswer(dict[str, Any]):
    """A Fetch answer's partition that its leader gives again while nothing changes (a
    consumer's "nothing new", Partition.idle_answer): written once per version, then its
    bytes are joined as they are. Never changed once made."""

    __slots__ = ("encoded",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encoded: dict[int, bytes] = {}


def _kept_partition_bytes(version: int, p: KeptPartitionAnswer) -> bytes | None:
    """A kept partition's bytes in `version`, as fetch_body_parts writes them in an answer."""
    kept = p.encoded.get(version)
    if kept is None:
        parts = fetch_body_parts(version, {"responses": [{"topic": "", "partitions": [dict(p)]}]})
        if parts is None:
            return None
        kept = p.encoded[version] = b"".join(parts[2:len(parts) - 2] if version >= FIRST_FLEXIBLE_VERSION
                                             else parts[2:])
    return kept


def fetch_body_parts(version: int, body: Mapping[str, Any]) -> list[bytes] | None:
    """The encoded body of a Fetch answer as chunks to join (records are not copied), or None
    when the answer holds something only the generic encoder writes."""
    if version < FIRST_VERSION or not body.keys() <= _TOP_KEYS:
        return None
    flexible = version >= FIRST_FLEXIBLE_VERSION
    by_id = version >= FIRST_TOPIC_ID_VERSION
    head = _HEAD_V5 if version >= 5 else _HEAD_V4
    with_replica = version >= 11
    out: list[bytes] = []
    append = out.append
    top = bytearray(_I32.pack(_int(body.get("throttle_time", 0))))
    if version >= 7:
        top += _I16.pack(int(body.get("error_code", 0))) + _I32.pack(int(body.get("session_id", 0)))
    topics: Sequence[Mapping[str, Any]] = body.get("responses") or ()
    top += uvarint_bytes(len(topics) + 1) if flexible else _I32.pack(len(topics))
    append(bytes(top))
    for topic in topics:
        if not topic.keys() <= _TOPIC_KEYS:
            return None
        if by_id:
            topic_id = topic.get("topic_id")
            key = _ZERO_UUID if topic_id is None else uuid.UUID(str(topic_id)).bytes \
                if not isinstance(topic_id, uuid.UUID) else topic_id.bytes
        else:
            name = (topic.get("topic") or "").encode()
            key = uvarint_bytes(len(name) + 1) + name if flexible else _I16.pack(len(name)) + name
        partitions: Sequence[Mapping[str, Any]] = topic.get("partitions") or ()
        append(key + (uvarint_bytes(len(partitions) + 1) if flexible else _I32.pack(len(partitions))))
        for p in partitions:
            if type(p) is KeptPartitionAnswer:
                kept = _kept_partition_bytes(version, p)
                if kept is None:
                    return None
                append(kept)
                continue
            if not p.keys() <= _PARTITION_KEYS:
                return None
            fixed = (p.get("partition_index", 0), p.get("error_code", 0), p.get("high_watermark", 0),
                     p.get("last_stable_offset", -1))
            chunk = head.pack(*fixed, p.get("log_start_offset", -1)) if version >= 5 else head.pack(*fixed)
            aborted = p.get("aborted_transactions")
            if aborted is None:
                chunk += b"\x00" if flexible else b"\xff\xff\xff\xff"
            else:
                chunk += uvarint_bytes(len(aborted) + 1) if flexible else _I32.pack(len(aborted))
                for a in aborted:
                    chunk += _ABORTED.pack(a["producer_id"], a["first_offset"])
                    if flexible:
                        chunk += b"\x00"
            if with_replica:
                chunk += _I32.pack(p.get("preferred_read_replica", -1))
            records = p.get("records")
            if records is None:
                append(chunk + (b"\x00" if flexible else b"\xff\xff\xff\xff"))
                if flexible:
                    append(b"\x00")
                continue
            if not records:
                append(chunk + (b"\x01\x00" if flexible else b"\x00\x00\x00\x00"))
                continue
            append(chunk + (uvarint_bytes(len(records) + 1) if flexible else _I32.pack(len(records))))
            append(records if isinstance(records, bytes) else bytes(records))
            if flexible:
                append(b"\x00")  # the partition's tagged fields: none
        if flexible:
            append(b"\x00")  # the topic's
    if flexible:
        append(b"\x00")  # the answer's
    return out


METADATA_FIRST_FLEXIBLE_VERSION = 9
_METADATA_TOPIC_KEYS = frozenset({"error_code", "name", "is_internal", "partitions", "topic_id",
                                  "topic_authorized_operations"})
_METADATA_PARTITION_HEAD = struct.Struct(">hii")  # error, partition, leader
_INT32S: dict[int, struct.Struct] = {}


def _int32_array(values: Sequence[int], flexible: bool) -> bytes:
    n = len(values)
    packer = _INT32S.get(n)
    if packer is None:
        packer = _INT32S[n] = struct.Struct(f">{n}i")
    return (uvarint_bytes(n + 1) if flexible else _I32.pack(n)) + packer.pack(*values)


def metadata_topic_entry(version: int, topic: Mapping[str, Any]) -> bytes | None:
    """One topic of a Metadata answer as it sits in the encoded topic array, or None for
    what only the generic encoder writes (a topic without a name, a key it does not know)."""
    name = topic.get("name")
    if name is None or not topic.keys() <= _METADATA_TOPIC_KEYS:
        return None
    flexible = version >= METADATA_FIRST_FLEXIBLE_VERSION
    raw = name.encode()
    out = [_I16.pack(int(topic.get("error_code", 0))),
           uvarint_bytes(len(raw) + 1) + raw if flexible else _I16.pack(len(raw)) + raw]
    if version >= 10:
        topic_id = topic.get("topic_id")
        out.append(_ZERO_UUID if topic_id is None else topic_id.bytes)
    if version >= 1:
        out.append(b"\x01" if topic.get("is_internal") else b"\x00")
    partitions: Sequence[Mapping[str, Any]] = topic.get("partitions") or ()
    out.append(uvarint_bytes(len(partitions) + 1) if flexible else _I32.pack(len(partitions)))
    head = _METADATA_PARTITION_HEAD.pack
    for p in partitions:
        chunk = head(int(p.get("error_code", 0)), p.get("partition_index", 0), p.get("leader_id", 0))
        if version >= 7:
            chunk += _I32.pack(p.get("leader_epoch", -1))
        chunk += _int32_array(p.get("replica_nodes") or (), flexible) + _int32_array(p.get("isr_nodes") or (), flexible)
        if version >= 5:
            chunk += _int32_array(p.get("offline_replicas") or (), flexible)
        out.append(chunk + b"\x00" if flexible else chunk)
    if version >= 8:
        out.append(_I32.pack(topic.get("topic_authorized_operations", -2147483648)))
    if flexible:
        out.append(b"\x00")
    return b"".join(out)


DESCRIBE_TOPIC_PARTITIONS_API_KEY = 75
_DTP_TOPIC_KEYS = frozenset({"error_code", "name", "topic_id", "is_internal", "partitions",
                             "topic_authorized_operations"})
_DTP_PARTITION_HEAD = struct.Struct(">hiii")  # error, partition, leader, leader epoch


def _nullable_int32_array(values: Sequence[int] | None) -> bytes:
    return b"\x00" if values is None else _int32_array(values, True)


def describe_partitions_topic_entry(topic: Mapping[str, Any]) -> bytes | None:
    """One topic of a DescribeTopicPartitions v0 answer as it sits in the encoded topic array
    (a flexible version: compact arrays and strings, tag buffers), or None for what only the
    generic encoder writes (a key it does not know)."""
    if not topic.keys() <= _DTP_TOPIC_KEYS:
        return None
    name = topic.get("name")
    out = [_I16.pack(int(topic.get("error_code", 0)))]
    if name is None:
        out.append(b"\x00")
    else:
        raw = name.encode()
        out.append(uvarint_bytes(len(raw) + 1) + raw)
    topic_id = topic.get("topic_id")
    out.append(_ZERO_UUID if topic_id is None else topic_id.bytes)
    out.append(b"\x01" if topic.get("is_internal") else b"\x00")
    partitions: Sequence[Mapping[str, Any]] = topic.get("partitions") or ()
    out.append(uvarint_bytes(len(partitions) + 1))
    head = _DTP_PARTITION_HEAD.pack
    for p in partitions:
        out.append(b"".join((
            head(int(p.get("error_code", 0)), p.get("partition_index", 0), p.get("leader_id", 0),
                 p.get("leader_epoch", -1)),
            _int32_array(p.get("replica_nodes") or (), True), _int32_array(p.get("isr_nodes") or (), True),
            _nullable_int32_array(p.get("eligible_leader_replicas")),
            _nullable_int32_array(p.get("last_known_elr")),
            _int32_array(p.get("offline_replicas") or (), True), b"\x00")))
    out.append(_I32.pack(topic.get("topic_authorized_operations", -2147483648)))
    out.append(b"\x00")
    return b"".join(out)


def describe_partitions_body(throttle_time_ms: int, topics: Sequence[bytes],
                             next_cursor: Mapping[str, Any] | None) -> bytes:
    """A DescribeTopicPartitions v0 answer whose topics are already encoded
    (`describe_partitions_topic_entry`): the throttle time, the topics, the nullable cursor."""
    out = [_I32.pack(throttle_time_ms), uvarint_bytes(len(topics) + 1), *topics]
    if next_cursor is None:
        out.append(b"\xff")
    else:
        raw = next_cursor["topic_name"].encode()
        out += [b"\x01", uvarint_bytes(len(raw) + 1), raw, _I32.pack(next_cursor["partition_index"]), b"\x00"]
    out.append(b"\x00")
    return b"".join(out)
