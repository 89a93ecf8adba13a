"""The cluster's own frames on the brokers' listener, outside Kafka's API key range.

Quorum messages and broker→controller calls travel on each node's Kafka port as Kafka
frames (size, request header v1) with two api keys Kafka never uses, never advertised in
ApiVersions: QUORUM_API_KEY frames are one-way Raft messages, and CONTROLLER_API_KEY
frames are calls answered with a response frame (correlation id, then an orjson body).
MIRROR_APPEND_API_KEY frames carry record batches a mirror worker copied from another
cluster into a mirror topic at their source offsets (below), answered the same way.
One port per node keeps the topology's `brokers` list the whole address book, and the
frame size cap and connection limits of the listener apply to both.
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

from cluster.protocol.errors import ProtocolError

QUORUM_API_KEY = 32767
CONTROLLER_API_KEY = 32766
MIRROR_APPEND_API_KEY = 32765
INTERNAL_API_KEYS = (QUORUM_API_KEY, CONTROLLER_API_KEY, MIRROR_APPEND_API_KEY)
# api key, version 0, correlation id, null client id
_HEADER = struct.Struct(">hhih")
HEADER_BYTES = _HEADER.size
_I32 = struct.Struct(">i")
MAX_RPC_FRAME_BYTES = 64 << 20
# A mirror topic's `mirror.source = "dcmirror.fenced:<topic>"`: a topic a disaster-recovery
# step holds still (`dcmirror mirror failover|failback` while it reads where the copy ends,
# or keeps aside what only the topic holds): read-only for producers, as any mirror topic,
# and MirrorAppend refuses it too.
MIRROR_FENCE_CLUSTER = "dcmirror.fenced"


def mirror_fenced(mirror_source: str | None) -> bool:
    return mirror_source is not None and mirror_source.startswith(f"{MIRROR_FENCE_CLUSTER}:")
# MirrorAppend: the JSON header's size and the partitions one request may carry.
MAX_MIRROR_HEADER_BYTES = 1 << 20
MAX_MIRROR_PARTITIONS = 10_000


def internal_frame(api_key: int, correlation_id: int, payload: bytes) -> bytes:
    header = _HEADER.pack(api_key, 0, correlation_id, -1)
    return _I32.pack(len(header) + len(payload)) + header + payload


def internal_payload(frame: bytes | bytearray) -> memoryview:
    if len(frame) < HEADER_BYTES:
        raise ProtocolError("internal frame is shorter than its header")
    return memoryview(frame)[HEADER_BYTES:]


def rpc_response(correlation_id: int, body: dict[str, Any]) -> bytes:
    payload = orjson.dumps(body)
    return _I32.pack(4 + len(payload)) + _I32.pack(correlation_id) + payload


def rpc_response_body(frame: bytes | bytearray) -> tuple[int, dict[str, Any]]:
    """(correlation id, body) of a controller call's answer."""
    if len(frame) < 4:
        raise ProtocolError("controller answer is shorter than its correlation id")
    (correlation_id,) = _I32.unpack_from(frame, 0)
    body: dict[str, Any] = orjson.loads(bytes(frame[4:]))
    return correlation_id, body


def mirror_append_payload(topic: str, topic_id: str, timeout_ms: int,
                          partitions: list[tuple[int, bytes, int]]) -> bytes:
    """A MirrorAppend request's payload: a 4-byte length and an orjson header {topic,
    topic_id (the target topic's), timeout_ms, partitions: [{partition, bytes,
    log_start_offset}]}, then each partition's raw batches in that order (no base64).
    `partitions`: (partition, batches, the source's log start offset or -1)."""
    header = orjson.dumps({"topic": topic, "topic_id": topic_id, "timeout_ms": timeout_ms,
                           "partitions": [{"partition": p, "bytes": len(b), "log_start_offset": start}
                                          for p, b, start in partitions]})
    return b"".join([_I32.pack(len(header)), header, *(b for _, b, _ in partitions)])


def parse_mirror_append(payload: memoryview) -> tuple[dict[str, Any], list[tuple[int, memoryview, int]]]:
    """(header, [(partition, batches, log start offset)]) of a MirrorAppend payload; every
    size is checked against its limit and the payload before anything is copied. Raises
    ProtocolError naming what is wrong."""
    if len(payload) < 4:
        raise ProtocolError("MirrorAppend payload is shorter than its header length")
    (size,) = _I32.unpack_from(payload, 0)
    if not 0 < size <= min(MAX_MIRROR_HEADER_BYTES, len(payload) - 4):
        raise ProtocolError(f"MirrorAppend header of {size} bytes (at most {MAX_MIRROR_HEADER_BYTES}, "
                            f"{len(payload) - 4} present)")
    try:
        header = orjson.loads(bytes(payload[4 : 4 + size]))
        topic, topic_id = str(header["topic"]), str(header["topic_id"])
        timeout_ms = int(header["timeout_ms"])
        specs = header["partitions"]
        if not isinstance(specs, list) or len(specs) > MAX_MIRROR_PARTITIONS:
            raise ProtocolError(f"MirrorAppend carries more than {MAX_MIRROR_PARTITIONS} partitions")
        sizes = [(int(p["partition"]), int(p["bytes"]), int(p.get("log_start_offset", -1))) for p in specs]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"MirrorAppend header is malformed: {exc}") from None
    pos = 4 + size
    if any(n < 0 for _, n, _ in sizes) or sum(n for _, n, _ in sizes) != len(payload) - pos:
        raise ProtocolError(f"MirrorAppend partitions declare {sum(n for _, n, _ in sizes)} bytes, "
                            f"{len(payload) - pos} follow the header")
    if len({p for p, _, _ in sizes}) != len(sizes):
        raise ProtocolError("MirrorAppend names a partition twice")
    out = []
    for partition, n, start in sizes:
        out.append((partition, payload[pos : pos + n], start))
        pos += n
    return {"topic": topic, "topic_id": topic_id, "timeout_ms": timeout_ms}, out
