"""One client connection to a Kafka-protocol broker (trio): version negotiation, requests.

Requests are built from dicts for whichever version both sides support (see
protocol/messages.build), so callers never pick versions. Responses are matched to
requests strictly in order, as the protocol guarantees on one connection.
"""

from __future__ import annotations

import math
import os
import struct
from typing import Any

import trio

from cluster.protocol.api_keys import ApiKey, client_throttles
from cluster.protocol.errors import ProtocolError
from cluster.protocol.framing import FrameDecoder
from cluster.protocol.internal import internal_frame, rpc_response_body
from cluster.protocol.messages import decode_response, encode_request
from cluster.security.connector import PLAINTEXT, LinkSecurity, open_stream
from cluster.security.errors import AuthenticationFailed

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
API_VERSIONS = ApiKey.API_VERSIONS
MAX_RESPONSE_BYTES = 256 << 20

# The newest version of each API this client speaks (kio has every one of these). Metadata
# v10+ carries topic ids (KIP-516); a consumer asks for Fetch v13 (by topic id) itself.
CLIENT_MAX_VERSIONS = {
    0: 8, 1: 12, 2: 5, 3: 12, 8: 7, 9: 5, 10: 2, 11: 5, 12: 3, 13: 3, 14: 3, 15: 4, 16: 2,
    18: 3, 19: 4, 20: 3, 21: 2, 22: 1, 23: 3, 24: 3, 25: 3, 26: 3, 27: 1, 28: 3, 29: 3, 30: 3, 31: 3, 32: 2, 33: 1, 35: 4, 37: 1, 42: 1, 43: 1, 44: 0, 45: 0, 46: 0, 47: 0,
    48: 1, 49: 1, 50: 0, 51: 0, 60: 0, 61: 0, 65: 0, 66: 1, 69: 1, 75: 0, 90: 1, 91: 0, 92: 0,
}


class KafkaConnectionError(Exception):
    """The broker could not be reached or the connection broke; names the broker. `reason`:
    the why alone, without the broker's address (for messages that name it already)."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message


def connect_failure(exc: BaseException) -> str:
    """What went wrong connecting, short ("connection refused"): trio's "all attempts to
    connect to X failed" (and libraries wrapping it) say neither why nor more than the
    address the caller names already. The chain of causes is searched for the OS's reason."""
    if isinstance(exc, trio.TooSlowError):
        return "no connection in time"
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, BaseExceptionGroup):
            seen = next((e for e in seen.exceptions if isinstance(e, OSError)), None)
            continue
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno).lower()  # trio's strerror repeats the address
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror.lower()
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, KafkaConnectionError):
        return exc.reason
    return str(exc) or type(exc).__name__


class KafkaAuthenticationError(KafkaConnectionError):
    """The broker refused this client's login (SASL) or certificate; retrying will not help."""


class UnsupportedApi(Exception):
    pass


class _Internal:
    """A payload of one of the cluster's own calls (cluster/protocol/internal.py), sent in
    turn with Kafka requests on the same connection."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload


class _Slot:
    __slots__ = ("frame", "done")

    def __init__(self) -> None:
        self.frame: bytearray | None = None
        self.done = False


class BrokerConnection:
    """A connection that pipelines: up to `max_in_flight` requests are on the wire at once.

    Sending is serialized by a lock; responses come back in send order, so each request
    takes a ticket when it is sent, and whichever waiter holds the receive lock reads
    frames and hands each to its ticket's slot (the leader/follower pattern: no background
    task, so the connection needs no nursery). A waiter cancelled after sending leaves its
    slot behind to be discarded, so the stream never falls out of step.
    """

    def __init__(self, host: str, port: int, *, client_id: str = "dcmirror",
                 max_in_flight: int = 5, max_response_bytes: int = MAX_RESPONSE_BYTES,
                 link: LinkSecurity = PLAINTEXT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max.in.flight.requests.per.connection must be at least 1, not {max_in_flight}")
        self.host = host
        self.port = port
        self.client_id = client_id
        self._client_id_bytes = client_id.encode()
        self.link = link
        self._stream: trio.abc.Stream | None = None
        self._decoder = FrameDecoder(max_response_bytes)
        self._correlation_id = 0
        self._send_lock = trio.Lock()
        self._recv_lock = trio.Lock()
        self._in_flight = trio.Semaphore(max_in_flight)
        self._slots: dict[int, _Slot] = {}
        self._next_read = 1  # correlation id of the next response on the wire
        self._broken: str | None = None
        self.versions: dict[int, tuple[int, int]] = {}
        # KIP-219: an answer's throttle_time_ms holds the next request to this broker back
        # (the broker mutes the connection that long anyway), as Kafka's clients do.
        self.throttled_until = 0.0  # trio time
        self.throttle_time_ms_total = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def closed(self) -> bool:
        return self._stream is None

    async def connect(self, timeout_s: float = 10.0) -> BrokerConnection:
        try:
            with trio.fail_after(timeout_s):
                self._stream = await open_stream(self.host, self.port, self.link, client_id=self._client_id_bytes)
                await self._negotiate()
        except AuthenticationFailed as exc:
            await self.aclose()
            raise KafkaAuthenticationError(f"broker {self.address}: {exc}") from None
        except (OSError, trio.TooSlowError, KafkaConnectionError) as exc:
            await self.aclose()
            reason = connect_failure(exc)
            raise KafkaConnectionError(f"cannot reach broker {self.address}: {reason}", reason) from None
        return self

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            self._broken = self._broken or "closed"
            with trio.CancelScope(shield=True):
                await stream.aclose()

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

    async def request(self, api_key: int, body: dict[str, Any] | Any, *, timeout_s: float = 30.0,
                      expect_response: bool = True, version: int | None = None) -> Any:
        """Send one request built from `body` (a dict, or a ready kio request of the
        negotiated version, or of `version` when given: e.g. a broker-to-broker version
        above what clients use); returns the decoded kio response (None when
        `expect_response` is false: acks=0 produce gets no answer)."""
        if version is None:
            version = self.version_for(api_key)
        else:
            low, high = self.versions.get(api_key, (1, 0))
            if not low <= version <= high:
                raise UnsupportedApi(f"broker {self.address} does not speak version {version} of API {api_key}")
        try:
            with trio.fail_after(timeout_s):
                return await self._roundtrip(api_key, version, body, expect_response=expect_response)
        except trio.TooSlowError:
            await self.aclose()
            raise KafkaConnectionError(f"broker {self.address} did not answer API {api_key} within {timeout_s} s") from None

    def _encode(self, api_key: int, version: int, correlation_id: int, body: dict[str, Any] | Any) -> bytes:
        if isinstance(body, _Internal):
            return internal_frame(api_key, correlation_id, body.payload)
        return encode_request(api_key, version, correlation_id, self._client_id_bytes, body)

    async def call_internal(self, api_key: int, payload: bytes, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """One of the cluster's own calls (MirrorAppend) on this connection: the orjson
        answer. The broker closes the connection of a principal without CLUSTER_ACTION."""
        try:
            with trio.fail_after(timeout_s):
                pending = await self._send(api_key, 0, _Internal(payload), True)
                assert pending is not None
                frame = await pending.wait_frame()
        except trio.TooSlowError:
            await self.aclose()
            raise KafkaConnectionError(f"broker {self.address} did not answer API {api_key} within {timeout_s} s") from None
        return rpc_response_body(frame)[1]

    async def send(self, api_key: int, body: dict[str, Any] | Any, *, expect_response: bool = True,
                   version: int | None = None) -> PendingResponse | None:
        """Put one request on the wire (waiting for an in-flight slot); the answer is
        awaited separately, so one task can keep several requests in flight in order.
        `version`: one the caller checked the broker speaks (default: the negotiated one)."""
        return await self._send(api_key, self.version_for(api_key) if version is None else version, body,
                                expect_response)

    async def _send(self, api_key: int, version: int, body: dict[str, Any] | Any,
                    expect_response: bool) -> PendingResponse | None:
        delay_s = self.throttled_until - trio.current_time()
        if delay_s > 0:
            await trio.sleep(delay_s)
        await self._in_flight.acquire()
        try:
            async with self._send_lock:
                if self._stream is None:
                    raise KafkaConnectionError(f"connection to {self.address} is closed ({self._broken})")
                self._correlation_id += 1
                correlation_id = self._correlation_id
                data = self._encode(api_key, version, correlation_id, body)
                slot = _Slot()
                if expect_response:
                    self._slots[correlation_id] = slot
                elif self._next_read == correlation_id:
                    self._next_read += 1  # no answer will come; nothing earlier is outstanding
                else:
                    slot.done = True  # a ticket without a frame, skipped by the reader
                    self._slots[correlation_id] = slot
                try:
                    with trio.CancelScope(shield=True):
                        # A half-sent frame would desynchronize the stream: finish it.
                        await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._slots.pop(correlation_id, None)
                    await self._fail(f"send failed: {exc}")
                    raise KafkaConnectionError(f"connection to {self.address} broke: {exc}") from None
        except BaseException:
            self._in_flight.release()
            raise
        if not expect_response:
            self._in_flight.release()
            return None
        return PendingResponse(self, api_key, version, correlation_id, slot)

    async def _roundtrip(self, api_key: int, version: int, body: dict[str, Any] | Any, *,
                         expect_response: bool = True) -> Any:
        pending = await self._send(api_key, version, body, expect_response)
        return None if pending is None else await pending.wait()

    async def _await_frame(self, correlation_id: int, slot: _Slot) -> bytearray:
        while not slot.done:
            async with self._recv_lock:
                if slot.done:
                    break
                if self._stream is None:
                    raise KafkaConnectionError(f"connection to {self.address} broke ({self._broken})")
                try:
                    frame = await self._read_frame()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ProtocolError) as exc:
                    await self._fail(str(exc))
                    raise KafkaConnectionError(f"connection to {self.address} broke: {exc}") from None
                (got,) = _I32.unpack_from(frame, 0)
                expected = self._next_read
                while expected in self._slots and self._slots[expected].done and self._slots[expected].frame is None \
                        and expected != correlation_id:
                    # acks=0 requests sent out of turn get no frame: skip their tickets.
                    self._slots.pop(expected)
                    expected += 1
                if got != expected:
                    await self._fail(f"correlation id {got}, expected {expected}")
                    raise ProtocolError(f"broker {self.address} answered correlation id {got}, expected {expected}")
                self._next_read = expected + 1
                owner = self._slots.get(got)
                if owner is not None:
                    owner.frame = frame
                    owner.done = True
        if slot.frame is None:
            raise KafkaConnectionError(f"connection to {self.address} broke ({self._broken})")
        return slot.frame

    async def _fail(self, why: str) -> None:
        self._broken = why
        for s in self._slots.values():
            s.done = True
        await self.aclose()

    async def _read_frame(self) -> bytearray:
        assert self._stream is not None
        while True:
            frame = self._decoder.next_frame()
            if frame is not None:
                return frame
            data = await self._stream.receive_some(262144)
            if not data:
                raise trio.BrokenResourceError("connection closed by the broker")
            self._decoder.receive_data(data)


class PendingResponse:
    """The answer to a request already sent; `wait()` once."""

    __slots__ = ("_conn", "api_key", "version", "correlation_id", "_slot")

    def __init__(self, conn: BrokerConnection, api_key: int, version: int, correlation_id: int, slot: _Slot) -> None:
        self._conn = conn
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id
        self._slot = slot

    async def wait_frame(self, timeout_s: float | None = None) -> bytearray:
        """The answer's frame, undecoded (correlation id first)."""
        conn = self._conn
        try:
            with trio.fail_after(timeout_s if timeout_s is not None else math.inf):
                return await conn._await_frame(self.correlation_id, self._slot)
        except trio.TooSlowError:
            await conn.aclose()
            raise KafkaConnectionError(
                f"broker {conn.address} did not answer API {self.api_key} within {timeout_s} s") from None
        finally:
            conn._slots.pop(self.correlation_id, None)
            conn._in_flight.release()

    async def wait(self, timeout_s: float | None = None) -> Any:
        conn = self._conn
        frame = await self.wait_frame(timeout_s)
        response = decode_response(self.api_key, self.version, frame)
        throttle = getattr(response, "throttle_time", None)
        if throttle is not None and self.api_key != API_VERSIONS and client_throttles(self.api_key, self.version):
            throttle_ms = int(throttle.total_seconds() * 1000)
            if throttle_ms > 0:
                conn.throttle_time_ms_total += throttle_ms
                conn.throttled_until = max(conn.throttled_until, trio.current_time() + throttle_ms / 1000)
        return response


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    out = []
    for part in bootstrap.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"bootstrap address {part!r} must be HOST:PORT")
        out.append((host, int(port)))
    return out


async def connect_any(bootstrap: str, *, client_id: str = "dcmirror", timeout_s: float = 10.0,
                      link: LinkSecurity = PLAINTEXT) -> BrokerConnection:
    errors: list[KafkaConnectionError] = []
    for host, port in parse_bootstrap(bootstrap):
        try:
            return await BrokerConnection(host, port, client_id=client_id, link=link).connect(timeout_s)
        except KafkaConnectionError as exc:
            errors.append(exc)
    text = "; ".join(str(e) for e in errors)
    if any(isinstance(e, KafkaAuthenticationError) for e in errors):
        raise KafkaAuthenticationError(text)
    raise KafkaConnectionError(text)
