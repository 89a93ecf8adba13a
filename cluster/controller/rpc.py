"""Broker → controller calls: one connection to one node's controller endpoint, one call
at a time (frames: cluster/protocol/internal.py)."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import orjson
import trio

from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.internal import (
    CONTROLLER_API_KEY,
    MAX_RPC_FRAME_BYTES,
    internal_frame,
    rpc_response_body,
)
from cluster.security.connector import PLAINTEXT, LinkSecurity, open_stream
from cluster.security.errors import AuthenticationFailed

log = logging.getLogger(__name__)


class RpcUnavailable(Exception):
    """The node could not be reached or did not answer in time."""


class RpcClient:
    """Calls one node's controller endpoint; one connection, one call at a time."""

    def __init__(self, host: str, port: int, timeout_s: float = 5.0, link: LinkSecurity = PLAINTEXT) -> None:
        self.link = link
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self._stream: trio.abc.Stream | None = None
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
                        self._stream = await open_stream(self.host, self.port, self.link, client_id=b"controller-rpc")
                        self._decoder = FrameDecoder(MAX_RPC_FRAME_BYTES)
                    await self._stream.send_all(frame)
                    while (answer := self._decoder.next_frame()) is None:
                        data = await self._stream.receive_some(65536)
                        if not data:
                            raise OSError("connection closed")
                        self._decoder.receive_data(data)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError,
                    AuthenticationFailed) as exc:
                await self._reset()
                raise RpcUnavailable(f"{self.host}:{self.port}: {str(exc) or type(exc).__name__}") from None
            got_id, result = rpc_response_body(answer)
            if got_id != correlation_id:
                await self._reset()
                raise RpcUnavailable(f"{self.host}:{self.port}: answer to call {got_id}, expected {correlation_id}")
            return result

    async def _reset(self) -> None:
        if self._stream is not None:
            with trio.CancelScope(shield=True):
                await self._stream.aclose()
            self._stream = None

    async def aclose(self) -> None:
        await self._reset()
