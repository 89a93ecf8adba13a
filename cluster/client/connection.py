"""One client connection to a Kafka-protocol broker (trio): version negotiation, requests.

Requests are built from dicts for whichever version both sides support (see
protocol/messages.build), so callers never pick versions. Responses are matched to
requests strictly in order, as the protocol guarantees on one connection.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import trio
from kio.serial import entity_reader, entity_writer

from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.messages import build, request_schema, response_schema

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
API_VERSIONS = 18
MAX_RESPONSE_BYTES = 256 << 20

# The newest version of each API this client speaks (kio has every one of these).
CLIENT_MAX_VERSIONS = {
    0: 8, 1: 12, 2: 5, 3: 8, 8: 7, 9: 5, 10: 2, 11: 5, 12: 3, 13: 3, 14: 3, 15: 4, 16: 2,
    18: 3, 19: 4, 20: 3, 22: 1, 23: 3, 32: 2, 33: 1, 37: 1, 42: 1, 43: 1, 44: 0, 45: 0, 46: 0, 60: 0,
}


class KafkaConnectionError(Exception):
    """The broker could not be reached or the connection broke; names the broker."""


class UnsupportedApi(Exception):
    pass


class BrokerConnection:
    def __init__(self, host: str, port: int, *, client_id: str = "dcmirror") -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self._stream: trio.SocketStream | None = None
        self._decoder = FrameDecoder(MAX_RESPONSE_BYTES)
        self._correlation_id = 0
        self._lock = trio.Lock()
        self.versions: dict[int, tuple[int, int]] = {}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def connect(self, timeout_s: float = 10.0) -> BrokerConnection:
        try:
            with trio.fail_after(timeout_s):
                self._stream = await trio.open_tcp_stream(self.host, self.port)
                await self._negotiate()
        except (OSError, trio.TooSlowError) as exc:
            await self.aclose()
            raise KafkaConnectionError(f"cannot reach broker {self.address}: {exc}") from None
        return self

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()
            self._stream = None

    async def _negotiate(self) -> None:
        response = await self._roundtrip(API_VERSIONS, 0, {})
        if response.error_code != 0:
            raise KafkaConnectionError(f"broker {self.address} refused ApiVersions: error {response.error_code}")
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}

    def version_for(self, api_key: int) -> int:
        ours = CLIENT_MAX_VERSIONS.get(api_key)
        theirs = self.versions.get(api_key)
        if ours is None or theirs is None or theirs[0] > ours:
            raise UnsupportedApi(f"broker {self.address} and this client share no version of API {api_key}")
        return min(ours, theirs[1])

    async def request(self, api_key: int, body: dict[str, Any], *, timeout_s: float = 30.0) -> Any:
        """Send one request built from `body`; returns the decoded kio response."""
        version = self.version_for(api_key)
        try:
            with trio.fail_after(timeout_s):
                return await self._roundtrip(api_key, version, body)
        except trio.TooSlowError:
            await self.aclose()
            raise KafkaConnectionError(f"broker {self.address} did not answer API {api_key} within {timeout_s} s") from None

    async def _roundtrip(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        async with self._lock:
            if self._stream is None:
                raise KafkaConnectionError(f"connection to {self.address} is closed")
            self._correlation_id += 1
            correlation_id = self._correlation_id
            req_cls = request_schema(api_key, version)
            out = io.BytesIO()
            out.write(b"\x00\x00\x00\x00")
            out.write(_I16.pack(api_key) + _I16.pack(version) + _I32.pack(correlation_id))
            cid = self.client_id.encode()
            out.write(_I16.pack(len(cid)) + cid)
            if req_cls.__flexible__:
                out.write(b"\x00")
            entity_writer(req_cls)(out, build(req_cls, body))
            buf = out.getbuffer()
            _I32.pack_into(buf, 0, len(buf) - 4)
            del buf
            try:
                await self._stream.send_all(out.getvalue())
                frame = await self._read_frame()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                await self.aclose()
                raise KafkaConnectionError(f"connection to {self.address} broke: {exc}") from None
            (got,) = _I32.unpack_from(frame, 0)
            if got != correlation_id:
                raise ProtocolError(f"broker {self.address} answered correlation id {got}, expected {correlation_id}")
            resp_cls = response_schema(api_key, version)
            offset = 4 + (1 if resp_cls.__flexible__ and api_key != API_VERSIONS else 0)
            value, _ = entity_reader(resp_cls)(bytes(frame), offset)
            return value

    async def _read_frame(self) -> bytearray:
        assert self._stream is not None
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            data = await self._stream.receive_some(65536)
            if not data:
                raise trio.BrokenResourceError("connection closed by the broker")
            self._decoder.receive_data(data)


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for part in bootstrap.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bootstrap address {part!r} must be HOST:PORT")
        out.append((host, int(port)))
    return out


async def connect_any(bootstrap: str, *, client_id: str = "dcmirror", timeout_s: float = 10.0) -> BrokerConnection:
    errors = []
    for host, port in parse_bootstrap(bootstrap):
        try:
            return await BrokerConnection(host, port, client_id=client_id).connect(timeout_s)
        except KafkaConnectionError as exc:
            errors.append(str(exc))
    raise KafkaConnectionError("; ".join(errors))
