"""The registry's HTTP API: Confluent Schema Registry's routes (Starlette, served by
Hypercorn's trio worker), thin over RegistryState (reads) and RegistryStore (writes).

Every route also answers under `/contexts/{context}/...` with its subjects and ids taken
in that context. Errors are Confluent's {"error_code": N, "message": "..."}.

Security as the admin HTTP servers: an optional bearer token and TLS (HttpSecurity), plus
optional HTTP basic auth (what Confluent's clients send for `basic.auth.user.info`) with
users from a file of `user: password` lines. Credentials are never logged.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from cluster.common.secrets import Secret
from cluster.registry.election import PrimaryElection
from cluster.registry.formats import SCHEMA_TYPES
from cluster.registry.state import (
    DEFAULT_CONTEXT,
    RegistryError,
    RegistryState,
    SchemaVersion,
    qualify,
    references_from_json,
    split_context,
)
from cluster.registry.store import NotPrimary, RegistryStore

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
FORWARDED_HEADER = "x-dcmirror-registry-forwarded"
FORWARD_TIMEOUT_S = 60.0
BODY_BYTES_MAX = 4 * 1024 * 1024
"""Largest request body read (checked against Content-Length before reading, and while
reading); the schema text inside has its own cap (state.SCHEMA_BYTES_MAX)."""


@dataclass(frozen=True)
class RegistrySecurity:
    """How the registry guards its routes: all optional; with both a token and basic users,
    either one is accepted."""

    token: Secret | None = None
    basic_users: Mapping[str, Secret] = field(default_factory=dict)
    tls: ssl.SSLContext | None = None

    @property
    def required(self) -> bool:
        return self.token is not None or bool(self.basic_users)

    def authorized(self, header: bytes | None) -> bool:
        if not self.required:
            return True
        if header is None:
            return False
        scheme, _, given = header.partition(b" ")
        given = given.strip()
        if scheme.lower() == b"bearer" and self.token is not None:
            return hmac.compare_digest(given, self.token.reveal().encode())
        if scheme.lower() == b"basic" and self.basic_users:
            try:
                user, sep, password = base64.b64decode(given, validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return False
            expected = self.basic_users.get(user)
            return bool(sep) and expected is not None and hmac.compare_digest(
                password.encode(), expected.reveal().encode())
        return False


def read_basic_users(path: Path) -> dict[str, Secret]:
    """A users file as Confluent's (Jetty's) property file login: `user: password[,role...]`
    per line, `#` comments. Errors name the file and line, never the password."""
    users: dict[str, Secret] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, rest = line.partition(":")
        if not sep or not user.strip():
            raise ValueError(f"{path}:{number}: expected `user: password`")
        users[user.strip()] = Secret(rest.split(",", 1)[0].strip())
    return users


class _Relayed(Exception):
    """The primary's answer to a forwarded write."""

    def __init__(self, response: Response) -> None:
        super().__init__("forwarded")
        self.response = response


class _JSON(Response):
    media_type = CONTENT_TYPE

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode()


def _answer(content: Any, status_code: int = 200) -> Response:
    return _JSON(content, status_code=status_code)


def _flag(request: Request, name: str, default: bool = False) -> bool:
    value = request.query_params.get(name)
    return default if value is None else value.lower() == "true"


INT32_MAX = 2**31 - 1
SCHEMAS_LIMIT_MAX = 1000
"""GET /schemas answers at most this many (Confluent's schema.search.default.limit and
schema.search.max.limit); the other lists are not limited unless asked."""


def _int_param(request: Request, name: str, default: int) -> int:
    """A query parameter that is a Java int in Confluent's API: `-`? ASCII digits within 32
    bits, else 404 as JAX-RS answers a parameter it cannot convert."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 10 and -INT32_MAX - 1 <= int(raw) <= INT32_MAX):
        raise HTTPException(404)
    return int(raw)


def _page(request: Request, items: list[Any], *, limit_max: int | None = None) -> list[Any]:
    """`offset` and `limit` of Confluent's list endpoints: a limit that is not positive or
    above `limit_max` means the default (`limit_max`, or everything)."""
    offset = _int_param(request, "offset", 0)
    if offset < 0:
        raise RegistryError(422, 422, f"Invalid offset {offset}: it must not be negative")
    limit = _int_param(request, "limit", -1)
    if limit <= 0 or (limit_max is not None and limit > limit_max):
        limit = limit_max if limit_max is not None else len(items)
    return items[offset:offset + limit]


BODY_MEDIA_TYPES = frozenset({CONTENT_TYPE, "application/vnd.schemaregistry+json", "application/json",
                              "application/octet-stream"})
"""The bodies Confluent's resources consume (@Consumes); any other Content-Type is 415."""


def _encoded_slashes_kept(scope: Scope) -> Scope:
    """A subject may hold "/" (Confluent's clients send it as %2F): routing sees the path with
    %2F still encoded, so the slash stays inside its segment; `_subject` decodes it."""
    raw = scope.get("raw_path") if scope["type"] == "http" else None
    if not raw or b"%2f" not in raw.lower():
        return scope
    from urllib.parse import unquote

    path = raw.split(b"?", 1)[0].decode("latin-1")
    return {**scope, "path": unquote(path.replace("%2F", "%252F").replace("%2f", "%252F"))}


def _subject(request: Request, name: str = "subject") -> str:
    """A subject from the path, qualified with the /contexts/{context} prefix if any."""
    raw = request.path_params[name].replace("%2F", "/")
    context = request.path_params.get("context")
    if context and context != DEFAULT_CONTEXT and not raw.startswith(":."):
        return qualify(context if context.startswith(".") else f".{context}", raw)
    return raw


def _context_subject(request: Request) -> str | None:
    """The subject an id is looked up in: ?subject (qualified by the /contexts prefix unless
    it names its own context, as a client pointed at `.../contexts/.east` sends it), else
    the /contexts prefix, else None."""
    subject = request.query_params.get("subject")
    context = request.path_params.get("context")
    if context:
        context = context if context.startswith(".") else f".{context}"
    if subject:
        if context and context != DEFAULT_CONTEXT and not subject.startswith(":."):
            return qualify(context, subject)
        return subject
    if context and context != DEFAULT_CONTEXT:
        return qualify(context, "_")
    return None


def _schema_id(request: Request) -> int:
    try:
        return int(request.path_params["id"])
    except ValueError:
        raise RegistryError(404, 40403, "Schema not found") from None


def _body_schema(body: Any) -> tuple[str, str, Any]:
    if not isinstance(body, dict):
        raise RegistryError(422, 42201, "Invalid schema: the request body must be a JSON object")
    text = body.get("schema")
    if not isinstance(text, str) or not text:
        raise RegistryError(422, 42201, "Empty schema")
    schema_type = body.get("schemaType") or "AVRO"
    if not isinstance(schema_type, str):
        raise RegistryError(422, 42201, "Invalid schema type")
    return schema_type.upper(), text, references_from_json(body.get("references"))


class RegistryApp:
    """The ASGI application of one registry."""

    def __init__(self, store: RegistryStore, *, security: RegistrySecurity = RegistrySecurity(),
                 body_bytes_max: int = BODY_BYTES_MAX) -> None:
        self.store = store
        self.security = security
        self.body_bytes_max = body_bytes_max
        self.metrics = {"forwarded": 0, "forward_errors": 0}
        routes = self._routes()
        self.starlette = Starlette(
            routes=[*routes, Mount("/contexts/{context}", routes=routes)],
            exception_handlers={RegistryError: self._registry_error, HTTPException: self._http_error,
                                _Relayed: self._relay})

    @property
    def state(self) -> RegistryState:
        return self.store.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.security.required:
            header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not self.security.authorized(header):
                response = _JSON({"error_code": 401, "message": "Unauthorized"}, status_code=401,
                                 headers={"WWW-Authenticate": 'Basic realm="SchemaRegistry"'})
                await response(scope, receive, send)
                return
        await self.starlette(_encoded_slashes_kept(scope), receive, send)

    # -- plumbing -----------------------------------------------------------------------

    async def _registry_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RegistryError)
        response = _answer(exc.body(), exc.http_status)
        if exc.http_status == 413:
            # The body was not read: the connection cannot carry another request, so say so
            # (a client that reused it would find it closed under its next request).
            response.headers["connection"] = "close"
        return response

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        phrase = {404: "Not Found", 405: "Method Not Allowed"}.get(exc.status_code, str(exc.detail))
        return _answer({"error_code": exc.status_code, "message": f"HTTP {exc.status_code} {phrase}"},
                       exc.status_code)

    async def _json(self, request: Request) -> Any:
        media = request.headers.get("content-type")
        if media is not None and media.split(";", 1)[0].strip().lower() not in BODY_MEDIA_TYPES:
            raise RegistryError(415, 415, "HTTP 415 Unsupported Media Type")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.body_bytes_max):
            raise RegistryError(413, 413, f"Request body larger than {self.body_bytes_max} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.body_bytes_max:
                raise RegistryError(413, 413, f"Request body larger than {self.body_bytes_max} bytes")
            chunks.append(chunk)
        raw = b"".join(chunks)
        request.state.raw_body = raw
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            raise RegistryError(400, 400, "Unrecognized request body: not JSON") from None

    async def _write(self, request: Request, plan: Callable[[RegistryState], tuple[list[Any], Any]]) -> Any:
        """store.write, or the same request forwarded to the primary (its answer relayed as
        a _Relayed exception, turned into the response by _relay)."""
        try:
            return await self.store.write(plan)
        except NotPrimary as exc:
            if request.headers.get(FORWARDED_HEADER):
                raise RegistryError(500, 50003, "Error while forwarding the request to the primary: "
                                                "the primary does not take it") from None
            raise _Relayed(await self._forward(request, exc.primary_url)) from None

    async def _forward(self, request: Request, primary_url: str) -> Response:
        import httpx

        raw = getattr(request.state, "raw_body", b"")
        headers = {FORWARDED_HEADER: "1", "content-type": request.headers.get("content-type", CONTENT_TYPE)}
        if "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        url = primary_url.rstrip("/") + request.url.path
        try:
            async with httpx.AsyncClient(timeout=FORWARD_TIMEOUT_S) as client:
                answer = await client.request(request.method, url, params=str(request.query_params),
                                              content=raw, headers=headers)
        except httpx.HTTPError as exc:
            self.metrics["forward_errors"] += 1
            log.warning("forwarding %s %s to the primary %s failed: %s", request.method, request.url.path,
                        primary_url, type(exc).__name__)
            raise RegistryError(500, 50003, "Error while forwarding the request to the primary") from None
        self.metrics["forwarded"] += 1
        if answer.status_code < 300:
            with trio.move_on_after(FORWARD_TIMEOUT_S):
                await self.store.catch_up(FORWARD_TIMEOUT_S)   # read-your-writes on this instance too
        return Response(answer.content, status_code=answer.status_code,
                        media_type=answer.headers.get("content-type", CONTENT_TYPE))

    async def _relay(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _Relayed)
        return exc.response

    def _routes(self) -> list[BaseRoute]:
        def r(path: str, endpoint: Callable[[Request], Awaitable[Response]], *methods: str) -> Route:
            return Route(path, endpoint, methods=list(methods))

        return [
            r("/", self.root, "GET"),
            r("/schemas/types", self.schema_types, "GET"),
            r("/schemas", self.schemas, "GET"),
            r("/schemas/ids/{id}", self.schema_by_id, "GET"),
            r("/schemas/ids/{id}/schema", self.schema_text_by_id, "GET"),
            r("/schemas/ids/{id}/subjects", self.id_subjects, "GET"),
            r("/schemas/ids/{id}/versions", self.id_versions, "GET"),
            r("/subjects", self.subjects, "GET"),
            r("/subjects/{subject}", self.lookup, "POST"),
            r("/subjects/{subject}", self.delete_subject, "DELETE"),
            r("/subjects/{subject}/versions", self.versions, "GET"),
            r("/subjects/{subject}/versions", self.register, "POST"),
            r("/subjects/{subject}/versions/{version}", self.version, "GET"),
            r("/subjects/{subject}/versions/{version}", self.delete_version, "DELETE"),
            r("/subjects/{subject}/versions/{version}/schema", self.version_text, "GET"),
            r("/subjects/{subject}/versions/{version}/referencedby", self.referenced_by, "GET"),
            r("/compatibility/subjects/{subject}/versions", self.compatibility, "POST"),
            r("/compatibility/subjects/{subject}/versions/{version}", self.compatibility, "POST"),
            r("/config", self.get_config, "GET"),
            r("/config", self.put_config, "PUT"),
            r("/config", self.delete_config, "DELETE"),
            r("/config/{subject}", self.get_config, "GET"),
            r("/config/{subject}", self.put_config, "PUT"),
            r("/config/{subject}", self.delete_config, "DELETE"),
            r("/mode", self.get_mode, "GET"),
            r("/mode", self.put_mode, "PUT"),
            r("/mode/{subject}", self.get_mode, "GET"),
            r("/mode/{subject}", self.put_mode, "PUT"),
            r("/mode/{subject}", self.delete_mode, "DELETE"),
            r("/contexts", self.contexts, "GET"),
        ]

    # -- schemas ------------------------------------------------------------------------

    async def root(self, request: Request) -> Response:
        return _answer({})

    async def schema_types(self, request: Request) -> Response:
        return _answer(sorted(SCHEMA_TYPES))

    async def schemas(self, request: Request) -> Response:
        prefix = request.query_params.get("subjectPrefix", "")
        context = request.path_params.get("context")
        if context and context != DEFAULT_CONTEXT and not prefix.startswith(":."):
            prefix = qualify(context if context.startswith(".") else f".{context}", prefix)
        found = self.state.latest_schemas(prefix=prefix, latest_only=_flag(request, "latestOnly"),
                                          deleted=_flag(request, "deleted"))
        return _answer([sv.body() for sv in _page(request, found, limit_max=SCHEMAS_LIMIT_MAX)])

    async def schema_by_id(self, request: Request) -> Response:
        sv = self.state.schema_by_id(_schema_id(request), subject=_context_subject(request))
        return _answer(self._formatted(request, sv, sv.body(with_subject=False)))

    async def schema_text_by_id(self, request: Request) -> Response:
        sv = self.state.schema_by_id(_schema_id(request), subject=_context_subject(request))
        return _raw_schema(sv)

    async def id_subjects(self, request: Request) -> Response:
        pairs = self.state.id_versions(_schema_id(request), subject=_context_subject(request),
                                       deleted=_flag(request, "deleted"))
        return _answer(_page(request, sorted({s for s, _ in pairs})))

    async def id_versions(self, request: Request) -> Response:
        pairs = self.state.id_versions(_schema_id(request), subject=_context_subject(request),
                                       deleted=_flag(request, "deleted"))
        return _answer(_page(request, [{"subject": s, "version": v} for s, v in pairs]))

    # -- subjects -----------------------------------------------------------------------

    async def subjects(self, request: Request) -> Response:
        prefix = request.query_params.get("subjectPrefix", "")
        context = request.path_params.get("context")
        if context and context != DEFAULT_CONTEXT and not prefix.startswith(":."):
            prefix = qualify(context if context.startswith(".") else f".{context}", prefix)
        return _answer(_page(request, self.state.subjects(deleted=_flag(request, "deleted"),
                                                          deleted_only=_flag(request, "deletedOnly"), prefix=prefix)))

    async def versions(self, request: Request) -> Response:
        return _answer(_page(request, self.state.versions(
            _subject(request), deleted=_flag(request, "deleted"), deleted_only=_flag(request, "deletedOnly"),
            deleted_as_negative=_flag(request, "deletedAsNegative"))))

    async def version(self, request: Request) -> Response:
        sv = self.state.version(_subject(request), request.path_params["version"], deleted=_flag(request, "deleted"))
        return _answer(self._formatted(request, sv, sv.body()))

    def _formatted(self, request: Request, sv: SchemaVersion, body: dict[str, Any]) -> dict[str, Any]:
        """`?format=serialized`: a Protobuf schema as its base64 FileDescriptorProto (what
        confluent-kafka's Protobuf deserializer asks for); other formats are answered as registered."""
        if request.query_params.get("format") == "serialized":
            body["schema"] = self.state.serialized_text(sv)
        return body

    async def version_text(self, request: Request) -> Response:
        sv = self.state.version(_subject(request), request.path_params["version"], deleted=_flag(request, "deleted"))
        return _raw_schema(sv)

    async def referenced_by(self, request: Request) -> Response:
        return _answer(self.state.referenced_by(_subject(request), request.path_params["version"]))

    async def register(self, request: Request) -> Response:
        subject = _subject(request)
        body = await self._json(request)
        schema_type, text, references = _body_schema(body)
        schema_id, version = body.get("id"), body.get("version")
        for name, value in (("id", schema_id), ("version", version)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise RegistryError(422, 42202 if name == "version" else 42201, f"Invalid {name} {value!r}")
        if schema_id is not None and schema_id < 0:
            schema_id = None                    # Confluent's clients send -1 for "no id"
        if version is not None and version <= 0:
            version = None
        normalize = _flag(request, "normalize")
        answer = await self._write(request, lambda state: state.plan_register(
            subject, schema_type, text, references, normalize=normalize, schema_id=schema_id, version=version))
        return _answer({"id": answer})

    async def lookup(self, request: Request) -> Response:
        subject = _subject(request)
        schema_type, text, references = _body_schema(await self._json(request))
        sv = self.state.lookup(subject, schema_type, text, references, normalize=_flag(request, "normalize"),
                               deleted=_flag(request, "deleted"))
        return _answer(sv.body())

    async def delete_subject(self, request: Request) -> Response:
        subject = _subject(request)
        permanent = _flag(request, "permanent")
        return _answer(await self._write(
            request, lambda state: state.plan_delete_subject(subject, permanent=permanent)))

    async def delete_version(self, request: Request) -> Response:
        subject, version = _subject(request), request.path_params["version"]
        permanent = _flag(request, "permanent")
        return _answer(await self._write(
            request, lambda state: state.plan_delete_version(subject, version, permanent=permanent)))

    async def compatibility(self, request: Request) -> Response:
        subject = _subject(request)
        version = request.path_params.get("version")
        schema_type, text, references = _body_schema(await self._json(request))
        if version is not None:
            self.state.version(subject, version)        # 40401 / 40402 / 42202 first, as Confluent
        messages = self.state.compatibility(subject, version, schema_type, text, references,
                                            normalize=_flag(request, "normalize"))
        out: dict[str, Any] = {"is_compatible": not messages}
        if _flag(request, "verbose"):
            out["messages"] = messages
        return _answer(out)

    # -- config and mode ----------------------------------------------------------------

    def _scope(self, request: Request) -> str | None:
        if "subject" in request.path_params:
            return _subject(request)
        context = request.path_params.get("context")
        if context and context != DEFAULT_CONTEXT:
            return f":{context if context.startswith('.') else '.' + context}:"
        return None

    async def get_config(self, request: Request) -> Response:
        scope = self._scope(request)
        if scope is not None and scope.endswith(":") and split_context(scope)[1] == "":
            level = self.state.config(scope, default_to_global=True)
        else:
            level = self.state.config(scope, default_to_global=_flag(request, "defaultToGlobal"))
        return _answer({"compatibilityLevel": level})

    async def put_config(self, request: Request) -> Response:
        scope = self._scope(request)
        body = await self._json(request)
        level = body.get("compatibility", body.get("compatibilityLevel")) if isinstance(body, dict) else None
        answer = await self._write(request, lambda state: state.plan_config(level, scope))
        return _answer({"compatibility": answer})

    async def delete_config(self, request: Request) -> Response:
        scope = self._scope(request)
        answer = await self._write(request, lambda state: state.plan_delete_config(scope))
        return _answer({"compatibilityLevel": answer})

    async def get_mode(self, request: Request) -> Response:
        scope = self._scope(request)
        return _answer({"mode": self.state.mode(scope, default_to_global=_flag(request, "defaultToGlobal")
                                                or (scope is not None and scope.endswith(":")))})

    async def put_mode(self, request: Request) -> Response:
        scope = self._scope(request)
        body = await self._json(request)
        mode = body.get("mode") if isinstance(body, dict) else None
        force = _flag(request, "force")
        answer = await self._write(request, lambda state: state.plan_mode(mode, scope, force=force))
        return _answer({"mode": answer})

    async def delete_mode(self, request: Request) -> Response:
        scope = self._scope(request)
        answer = await self._write(request, lambda state: state.plan_delete_mode(scope))
        return _answer({"mode": answer})

    async def contexts(self, request: Request) -> Response:
        return _answer(_page(request, self.state.contexts()))


def _raw_schema(sv: SchemaVersion) -> Response:
    """GET .../schema: the schema itself (the JSON document for Avro and JSON Schema, the
    .proto text for Protobuf), not wrapped in an object."""
    media = "text/plain" if sv.schema_type == "PROTOBUF" else CONTENT_TYPE
    return Response(sv.text.encode(), media_type=media)


# -- serving ----------------------------------------------------------------------------

def _hypercorn_config(host: str, port: int, tls: ssl.SSLContext | None, logger: logging.Logger) -> Any:
    from hypercorn.config import Config

    class _Config(Config):  # type: ignore[misc]
        @property
        def ssl_enabled(self) -> bool:
            return tls is not None

        def create_ssl_context(self) -> ssl.SSLContext | None:
            return tls

    config = _Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logger
    config.graceful_timeout = 1.0
    return config


async def serve(app: ASGIApp | RegistryApp, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                logger: logging.Logger | None = None,
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on host:port (HTTPS with `tls`) until cancelled; the server's own lines go
    to `logger` (default the registry's)."""
    from hypercorn.trio import serve as hypercorn_serve

    config = _hypercorn_config(host, port, tls, logger or log)
    await hypercorn_serve(app, config, task_status=task_status)  # type: ignore[arg-type]


async def run_registry(client_config: Mapping[str, Any], host: str, port: int, *,
                       security: RegistrySecurity = RegistrySecurity(), advertised_url: str | None = None,
                       eligible: bool = True,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """A whole registry: the store (replayed before the port opens), the primary election
    (instances of one cluster share the group; `advertised_url` is how the others reach
    this one), then the HTTP API."""
    if advertised_url is None:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        shown = f"[{shown}]" if ":" in shown else shown
        advertised_url = f"{'https' if security.tls else 'http'}://{shown}:{port}"
    election = PrimaryElection(client_config, advertised_url, eligible=eligible)
    store = RegistryStore(client_config, election=election)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        nursery.start_soon(election.run)
        await nursery.start(partial(serve, RegistryApp(store, security=security), host, port, tls=security.tls))
        log.info("schema registry serving on %s:%d (%d subjects)", host, port, len(store.state.subjects()))
        task_status.started()
