"""The cluster's own frames on the brokers' listener, outside Kafka's API key range.

Quorum messages and broker→controller calls travel on each node's Kafka port as Kafka
frames (size, request header v1) with two api keys Kafka never uses, never advertised in
ApiVersions: QUORUM_API_KEY frames are one-way Raft messages, and CONTROLLER_API_KEY
frames are calls answered with a response frame (correlation id, then an orjson body).
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
INTERNAL_API_KEYS = (QUORUM_API_KEY, CONTROLLER_API_KEY)
# api key, version 0, correlation id, null client id
_HEADER = struct.Struct(">hhih")
HEADER_BYTES = _HEADER.size
_I32 = struct.Struct(">i")
MAX_RPC_FRAME_BYTES = 64 << 20


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
