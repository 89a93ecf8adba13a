"""The request router (Kafka's KafkaApis): one table of the APIs this broker answers.

Each row is an API key, the versions advertised and the handler; ApiVersions is answered
from the same table, so what is advertised is exactly what is routed. Every request frame
of a connection comes through `RequestRouter.handle`: it checks the version, decodes the
body with kio, hands it to the handler and encodes the answer in the client's version.
This is the one place where a request is accepted or refused before any handler runs:
before SASL authentication only ApiVersions, SaslHandshake and SaslAuthenticate pass;
cluster-internal frames need CLUSTER_ACTION; every handler gets the principal and the
authorizer in its RequestContext and checks the resources it touches. The cluster's own frames (quorum messages,
controller calls and MirrorAppend, cluster/protocol/internal.py) are routed here too.

Handlers take `(version, request, context)` and answer with a dict of the response's
field names (cluster/protocol/messages.build), or None for no answer (acks=0).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import trio

from cluster.broker.context import PLAINTEXT_SESSION, RequestContext, Session
from cluster.broker.quotas import ClientQuotas
from cluster.broker.security import BrokerSecurity
from cluster.broker.security_handlers import SaslHandlers
from cluster.controller.features import SUPPORTED_FEATURES, finalized_levels
from cluster.controller.service import MetadataService
from cluster.protocol.api_keys import ApiKey, api_name, client_throttles
from cluster.protocol.errors import ErrorCode
from cluster.protocol.internal import (
    CONTROLLER_API_KEY,
    INTERNAL_API_KEYS,
    MIRROR_APPEND_API_KEY,
    QUORUM_API_KEY,
    internal_payload,
    rpc_response,
)
from cluster.protocol.messages import (
    EncodedBody,
    decode_request,
    encode_response,
    is_flexible_request,
    parse_request_header,
    peek_api,
    response_schema,
)
from cluster.replication.fetch_sessions import FetchSessionCache

Handler = Callable[[int, Any, RequestContext], Awaitable[dict[str, Any] | EncodedBody | None]]
# An internal call's handler: the frame's payload → the orjson answer.
InternalHandler = Callable[[memoryview], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Legacy:
    """Versions kio does not decode, read as a newer version the handler knows: `decode`
    (version, frame, body offset) → a value whose `.request` is the newer request (raises
    ProtocolError when unreadable); `encode` (that value, correlation id, the handler's
    answer) → the size-prefixed response frame in the client's version."""

    as_version: int
    decode: Callable[[int, bytes | bytearray, int], Any]
    encode: Callable[[Any, int, dict[str, Any]], bytes]


class CloseConnection(Exception):
    """The request cannot be answered in the protocol; close like Kafka does."""


@dataclass(frozen=True, slots=True)
class Api:
    key: ApiKey
    min_version: int
    max_version: int
    handler: Handler | None  # None: answered by the router itself (ApiVersions)
    # Versions below `legacy_below` are read by `legacy` (Produce v0-2: message sets of
    # magic 0/1 up-converted to v3).
    legacy_below: int = 0
    legacy: Legacy | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """A request's answer (None: none is sent) and how long its connection stays muted."""

    response: bytes | None
    throttle_ms: int = 0
    # KIP-219: a client at or above these versions waits out the throttle itself, so the
    # broker answers at once and then mutes; older clients get their answer late.
    client_throttles: bool = True


# Broker-to-broker requests are exempt from client quotas (Kafka exempts CLUSTER_ACTION).
_QUOTA_EXEMPT = frozenset({ApiKey.WRITE_TXN_MARKERS})


class RequestTimer(trio.abc.Instrument):
    """Time a task spends running (not waiting) while it handles a request: what
    `request_percentage` bounds, as Kafka's request-handler thread time. Installed only
    while some request quota is set."""

    def __init__(self) -> None:
        self.busy_ns: dict[trio.lowlevel.Task, int] = {}
        self._running: trio.lowlevel.Task | None = None
        self._since_ns = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task in self.busy_ns:
            self._running, self._since_ns = task, time.perf_counter_ns()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self._running is task:
            self.busy_ns[task] += time.perf_counter_ns() - self._since_ns
            self._running = None

    def start(self, task: trio.lowlevel.Task) -> None:
        self.busy_ns[task] = 0
        self._running, self._since_ns = task, time.perf_counter_ns()

    def stop(self, task: trio.lowlevel.Task) -> float:
        """Seconds the task ran since start()."""
        busy = self.busy_ns.pop(task, 0)
        if self._running is task:
            busy += time.perf_counter_ns() - self._since_ns
            self._running = None
        return busy / 1e9


class RequestRouter:
    def __init__(self, apis: Iterable[Api], *, ready: trio.Event, metadata: MetadataService,
                 observe: Callable[[int, float], None] | None = None, security: BrokerSecurity | None = None,
                 sasl: SaslHandlers | None = None, quotas: ClientQuotas | None = None,
                 mirror_append: InternalHandler | None = None,
                 fetch_sessions: FetchSessionCache | None = None) -> None:
        self.apis: dict[int, Api] = {}
        self.fetch_sessions = fetch_sessions  # a throttled fetch's dropped answer is sent again
        self.mirror_append = mirror_append  # MirrorAppend (a broker's; a controller has none)
        for api in apis:
            assert api.key not in self.apis, f"{api.key.api_name} is routed twice"
            assert api.min_version <= api.max_version, api
            self.apis[api.key] = api
        assert ApiKey.API_VERSIONS in self.apis, "ApiVersions must be answered"
        self.ready = ready
        self.metadata = metadata
        self._observe = observe
        self.security = security
        self.sasl = sasl
        self.quotas = quotas
        self._timer: RequestTimer | None = None

    def supported(self) -> dict[int, tuple[int, int]]:
        """API key → (min, max) version, as ApiVersions advertises them."""
        return {k: (a.min_version, a.max_version) for k, a in sorted(self.apis.items())}

    def api_versions_body(self, error: int = ErrorCode.none) -> dict[str, Any]:
        """The answer to ApiVersions; v3+ also carries the feature levels (KIP-584), which
        `kafka-features describe` prints: the finalized epoch is the metadata offset applied."""
        return {
            "error_code": error,
            "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                         for k, (lo, hi) in self.supported().items()],
            "throttle_time": 0,
            "supported_features": [{"name": n, "min_version": lo, "max_version": hi}
                                   for n, (lo, hi) in sorted(SUPPORTED_FEATURES.items())],
            "finalized_features_epoch": self.metadata.image.offset,
            # Kafka lists a feature as finalized only at a level above 0.
            "finalized_features": [{"name": n, "min_version_level": level, "max_version_level": level}
                                   for n, level in sorted(finalized_levels(self.metadata.image).items()) if level > 0],
        }

    async def handle(self, frame: bytearray, session: Session = PLAINTEXT_SESSION) -> bytes | None:
        """Answer one request frame; None means no response (acks=0 produce, quorum
        messages)."""
        return (await self.handle_answer(frame, session)).response

    async def handle_answer(self, frame: bytearray, session: Session = PLAINTEXT_SESSION) -> Answer:
        """Answer one request frame, with the time its connection is to be muted for (client
        quotas). Its time from here to the answer goes into the API's latency histogram."""
        start = trio.current_time()
        try:
            answer = await self._handle(frame, session)
            return answer if isinstance(answer, Answer) else Answer(answer)
        finally:
            if self._observe is not None and len(frame) >= 2:
                self._observe((frame[0] << 8) | frame[1], trio.current_time() - start)

    async def _handle(self, frame: bytearray, session: Session) -> bytes | Answer | None:
        sasl = session.sasl
        if sasl is not None and sasl.raw_tokens and sasl.state == "authenticate":
            return self._raw_sasl_token(frame, session)
        api_key, version, correlation_id = peek_api(frame)
        if sasl is not None and api_key not in _BEFORE_LOGIN and (
                not sasl.authenticated or sasl.state != "done"):
            raise CloseConnection(f"{api_name(api_key)} before SASL authentication completed")
        if sasl is not None and sasl.expired(self.metadata.clock.now_ms()) and api_key not in _BEFORE_LOGIN:
            raise CloseConnection("SASL session expired (connections.max.reauth.ms) without re-authentication")
        if api_key in INTERNAL_API_KEYS:
            if version != 0:
                raise CloseConnection(f"internal API {api_key} v{version} does not exist")
            self._admit_internal(session)
            if api_key == QUORUM_API_KEY:
                await self.metadata.deliver(frame)
                return None
            if api_key == MIRROR_APPEND_API_KEY:
                if self.mirror_append is None:
                    raise CloseConnection("this node takes no MirrorAppend")
                await self.ready.wait()
                return rpc_response(correlation_id, await self.mirror_append(internal_payload(frame)))
            assert api_key == CONTROLLER_API_KEY
            return rpc_response(correlation_id, await self.metadata.handle_rpc(frame))
        if not self.ready.is_set() and api_key not in _BEFORE_LOGIN:
            # Clients wait while the broker registers and catches up with the metadata log.
            await self.ready.wait()
        if api_key == ApiKey.API_VERSIONS:
            return self._api_versions(version, correlation_id, frame)
        api = self.apis.get(api_key)
        if api is None or not api.min_version <= version <= api.max_version:
            raise CloseConnection(f"unsupported API {api_name(api_key)} v{version}")
        encode: Callable[[Any], bytes] | None = None
        if version < api.legacy_below:
            legacy = api.legacy
            assert legacy is not None
            header = parse_request_header(frame, flexible=False)
            read = legacy.decode(version, frame, header.body_offset)
            request, version = read.request, legacy.as_version

            def encode(answer: Any) -> bytes:
                return legacy.encode(read, correlation_id, answer)
        else:
            header = parse_request_header(frame, flexible=is_flexible_request(api_key, version))
            request = decode_request(api_key, version, frame, header.body_offset)
        if api_key in _BEFORE_LOGIN:
            return encode_response(api_key, version, correlation_id, self._sasl_request(api_key, version, request,
                                                                                       session))
        ctx = RequestContext(header.client_id or "", "/" + session.client_ip, session.principal, session.listener,
                             None if self.security is None else self.security.authorizer(), session)
        assert api.handler is not None
        if encode is None:
            def encode(answer: Any) -> bytes:
                return encode_response(api_key, version, correlation_id, answer)
        if self.quotas is not None and api_key not in _QUOTA_EXEMPT and self._quotas_enabled():
            return await self._handle_with_quotas(api, version, request, ctx, len(frame), encode)
        answer = await api.handler(version, request, ctx)
        if answer is None:
            return None
        return encode(answer)

    def _quotas_enabled(self) -> bool:
        """Takes the image's quotas when they changed; True when any quota is set."""
        assert self.quotas is not None
        image = self.metadata.image
        self.quotas.update(image.client_quotas, image.quota_version)
        if self.quotas.request.enabled != (self._timer is not None):
            if self._timer is None:
                self._timer = RequestTimer()
                trio.lowlevel.add_instrument(self._timer)
            else:
                trio.lowlevel.remove_instrument(self._timer)
                self._timer = None
        return any(m.enabled for m in self.quotas.managers())

    async def _handle_with_quotas(self, api: Api, version: int, request: Any, ctx: RequestContext,
                                  request_bytes: int, encode: Callable[[Any], bytes]) -> Answer:
        """A request under client quotas, as Kafka's KafkaApis: produce bytes are recorded
        after the append (the data stays; only the next requests wait), fetch bytes when the
        answer is built (a throttled fetch answers empty, its bytes taken back), handler time
        for every request; the answer carries the largest throttle time."""
        assert self.quotas is not None and api.handler is not None
        quotas = self.quotas
        api_key = api.key
        user, client_id = ctx.principal.name, ctx.client_id
        consumer_fetch = api_key == ApiKey.FETCH and request.replica_id < 0
        exempt = (api_key == ApiKey.FETCH and not consumer_fetch) or (
            api_key == ApiKey.ADD_PARTITIONS_TO_TXN and version >= 4)
        if exempt:
            answer = await api.handler(version, request, ctx)
            return Answer(None if answer is None else encode(answer))
        if consumer_fetch:
            cap = quotas.fetch.max_value_in_window(user, client_id)
            if cap < request.max_bytes:
                request = dataclasses.replace(request, max_bytes=max(1, int(cap)))
        timer = self._timer
        task = trio.lowlevel.current_task()
        if timer is not None:
            timer.start(task)
        try:
            answer = await api.handler(version, request, ctx)
        finally:
            busy_s = timer.stop(task) if timer is not None else 0.0
        now_ms = self.metadata.clock.now_ms()
        bandwidth_ms = 0
        bandwidth = None
        if api_key == ApiKey.PRODUCE:
            bandwidth = quotas.produce
            bandwidth_ms = bandwidth.record(user, client_id, request_bytes, now_ms)
        acks_zero = api_key == ApiKey.PRODUCE and request.acks == 0
        # Kafka's nanosToPercentage: handler seconds × 100 (a rate of 100 is one handler's whole time).
        request_ms = 0 if acks_zero else quotas.request.record(user, client_id, busy_s * 100, now_ms)
        response: bytes | None = None
        if consumer_fetch:
            assert isinstance(answer, dict)
            bandwidth = quotas.fetch
            response = encode(answer)
            fetched = len(response)
            bandwidth_ms = bandwidth.record(user, client_id, fetched, now_ms)
            if max(bandwidth_ms, request_ms) > 0:
                bandwidth.unrecord(user, client_id, fetched, now_ms)
                # The fetch session goes on (KAFKA-6946); what this answer held is sent again.
                session_id = answer.get("session_id", 0)
                session = self.fetch_sessions.get(session_id) if self.fetch_sessions and session_id else None
                if session is not None:
                    session.resend()
                answer = {"error_code": ErrorCode.none, "session_id": session_id if session else 0, "responses": []}
                response = None
        throttle_ms = max(bandwidth_ms, request_ms)
        if throttle_ms > 0:
            (bandwidth if bandwidth is not None and bandwidth_ms > request_ms else quotas.request).throttled(
                throttle_ms)
        if answer is None:
            return Answer(None, throttle_ms)  # acks=0: no answer, but the connection is muted all the same
        if throttle_ms > 0 or response is None:
            if isinstance(answer, EncodedBody):  # a cached answer (Metadata)
                answer = answer.with_throttle_time(api_key, version, throttle_ms)
            elif "throttle_time" in response_schema(api_key, version).__dataclass_fields__:
                answer["throttle_time"] = throttle_ms
            response = encode(answer)
        return Answer(response, throttle_ms, client_throttles(api_key, version))

    def _admit_internal(self, session: Session) -> None:
        if self.security is not None and not self.security.may_send_internal(session):
            raise CloseConnection(f"{session.principal} may not send cluster-internal requests (CLUSTER_ACTION)")

    def _sasl_request(self, api_key: int, version: int, request: Any, session: Session) -> dict[str, Any]:
        if self.sasl is None or session.sasl is None:
            if api_key == ApiKey.SASL_HANDSHAKE:
                return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
            return {"error_code": ErrorCode.illegal_sasl_state, "error_message":
                    f"listener {session.listener} ({session.protocol}) does not use SASL",
                    "auth_bytes": b"", "session_lifetime": 0}
        if api_key == ApiKey.SASL_HANDSHAKE:
            return self.sasl.handshake(version, request, session)
        if session.sasl.raw_tokens or session.sasl.state != "authenticate":
            session.close_after_s = 0.0
            return {"error_code": ErrorCode.illegal_sasl_state,
                    "error_message": "SaslAuthenticate without a SaslHandshake v1 before it",
                    "auth_bytes": b"", "session_lifetime": 0}
        code, message, reply, lifetime_ms = self.sasl.authenticate(bytes(request.auth_bytes), session)
        return {"error_code": code, "error_message": message, "auth_bytes": reply, "session_lifetime": lifetime_ms}

    def _raw_sasl_token(self, frame: bytearray, session: Session) -> bytes:
        """After SaslHandshake v0 the tokens come bare: answer bare, or close on failure."""
        assert self.sasl is not None
        code, _, reply, _ = self.sasl.authenticate(bytes(frame), session)
        if code != ErrorCode.none:
            raise CloseConnection("SASL authentication failed")
        return len(reply).to_bytes(4, "big") + reply

    def _api_versions(self, version: int, correlation_id: int, frame: bytearray) -> bytes:
        lo, hi = self.supported()[ApiKey.API_VERSIONS]
        if not lo <= version <= hi:
            # Answer in v0 so any client can read the error and the supported ranges.
            return encode_response(ApiKey.API_VERSIONS, 0, correlation_id,
                                   self.api_versions_body(ErrorCode.unsupported_version))
        header = parse_request_header(frame, flexible=version >= 3)
        decode_request(ApiKey.API_VERSIONS, version, frame, header.body_offset)
        return encode_response(ApiKey.API_VERSIONS, version, correlation_id, self.api_versions_body())



_BEFORE_LOGIN = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
