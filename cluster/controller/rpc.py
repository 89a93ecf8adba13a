"""Intra-cluster messages on the brokers' own listener.

Quorum messages and broker→controller calls travel on each node's Kafka port as Kafka
frames (size, request header v1) with two api keys outside Kafka's range, never
advertised in ApiVersions: QUORUM_API_KEY frames are one-way Raft messages, and
CONTROLLER_API_KEY frames are calls answered with a response frame (correlation id, then
an orjson body). One port per node keeps the topology's `brokers` list the whole address
book, and the frame size cap and connection limits of the listener apply to both.
"""

from __future__ import annotations

import itertools
import logging
import struct
from typing import Any

import orjson
import trio

from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder

log = logging.getLogger(__name__)

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


class RpcUnavailable(Exception):
    """The node could not be reached or did not answer in time."""


class RpcClient:
    """Calls one node's controller endpoint; one connection, one call at a time."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._stream: trio.SocketStream | None = None
        self._decoder = FrameDecoder(MAX_RPC_FRAME_BYTES)
        self._lock = trio.Lock()
        self._ids = itertools.count(1)

    async def call(self, op: str, args: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        async with self._lock:
            correlation_id = next(self._ids) & 0x7FFFFFFF
            frame = internal_frame(CONTROLLER_API_KEY, correlation_id, orjson.dumps({"op": op, "args": args}))
            try:
                with trio.fail_after(timeout_s or self.timeout_s):
                    if self._stream is None:
                        self._stream = await trio.open_tcp_stream(self.host, self.port)
                        self._decoder = FrameDecoder(MAX_RPC_FRAME_BYTES)
                    await self._stream.send_all(frame)
                    while (answer := self._decoder.next_frame()) is None:
                        data = await self._stream.receive_some(65536)
                        if not data:
                            raise OSError("connection closed")
                        self._decoder.receive_data(data)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError) as exc:
                await self._reset()
                raise RpcUnavailable(f"{self.host}:{self.port}: {str(exc) or type(exc).__name__}") from None
            (got_id,) = _I32.unpack_from(answer, 0)
            if got_id != correlation_id:
                await self._reset()
                raise RpcUnavailable(f"{self.host}:{self.port}: answer to call {got_id}, expected {correlation_id}")
            result: dict[str, Any] = orjson.loads(bytes(answer[4:]))
            return result

    async def _reset(self) -> None:
        if self._stream is not None:
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            self._stream = None

    async def aclose(self) -> None:
        await self._reset()
