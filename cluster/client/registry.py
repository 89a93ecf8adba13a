"""A small client of a Confluent-compatible schema registry (ours, Confluent's, Karapace,
Redpanda's), over httpx: `RegistryClient` (blocking) and `AsyncRegistryClient` (trio or
asyncio: httpx.AsyncClient runs on trio through anyio).

Requests are built in one place (`_Requests`): path segments quoted, Confluent's content
type, auth (a bearer token or basic `user:password`, both `Secret`s resolved from the
topology's references, never logged) and TLS (`verify`: a CA file, an SSLContext, or the
system's store). Answers other than 2xx become `RegistryClientError` with Confluent's
`error_code` (the HTTP status when the body has none).

It lives in the client library (not cluster/registry/) because the packages above cluster/
(the mirror's schema sync, the warehouse loads) may use the client library only.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import httpx

from cluster.common.secrets import Secret, secret

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
DEFAULT_TIMEOUT_S = 30.0

Reference = tuple[str, str, int]
"""(name, subject, version) of a schema reference."""


class RegistrySpec(Protocol):
    """What the clients read of a topology's registry (topology.model.RegistrySpec)."""

    @property
    def url(self) -> str: ...

    @property
    def auth_token(self) -> str: ...


class RegistryClientError(Exception):
    """A registry answered other than 2xx (or could not be reached: http_status 0)."""

    def __init__(self, http_status: int, error_code: int, message: str) -> None:
        super().__init__(f"{message} (HTTP {http_status}, error code {error_code})")
        self.http_status = http_status
        self.error_code = error_code
        self.message = message


@dataclass(frozen=True)
class SchemaEntry:
    """One version of a subject as the registry answers it."""

    subject: str
    version: int
    schema_id: int
    schema_type: str
    text: str
    references: tuple[Reference, ...] = ()

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> SchemaEntry:
        return cls(subject=str(body["subject"]), version=int(body["version"]), schema_id=int(body["id"]),
                   schema_type=str(body.get("schemaType") or "AVRO"), text=str(body["schema"]),
                   references=_references(body.get("references")))


def _references(raw: Any) -> tuple[Reference, ...]:
    return tuple((str(r["name"]), str(r["subject"]), int(r["version"])) for r in (raw or ()))


def references_json(references: Sequence[Reference]) -> list[dict[str, Any]]:
    return [{"name": n, "subject": s, "version": v} for n, s, v in references]


def context_subject(context: str, subject: str) -> str:
    """`subject` in `context` (`.east` -> `:.east:subject`; the default context `.` leaves it)."""
    if context in ("", ".") or subject.startswith(":."):
        return subject
    return f":{context}:{subject}"


@dataclass(frozen=True)
class RegistryAuth:
    """How a client proves itself: a bearer token, or basic `user:password` (Confluent's
    `basic.auth.user.info`); both None: no Authorization header."""

    token: Secret | None = None
    basic: Secret | None = None

    @classmethod
    def from_spec(cls, spec: RegistrySpec, basic_user_info: str | None = None) -> RegistryAuth:
        """The topology's token reference of the registry, or a `user:password` reference."""
        if basic_user_info:
            return cls(basic=secret(basic_user_info, "registry basic.auth.user.info"))
        if spec.auth_token:
            return cls(token=secret(spec.auth_token, "registry.auth_token"))
        return cls()

    def headers(self) -> dict[str, str]:
        if self.token is not None:
            return {"Authorization": f"Bearer {self.token.reveal()}"}
        if self.basic is not None:
            import base64

            return {"Authorization": "Basic " + base64.b64encode(self.basic.reveal().encode()).decode()}
        return {}


@dataclass(frozen=True)
class RegistryAccess:
    """How a client that travels reaches a registry (the warehouse loads' Spark tasks): the
    topology's bearer-token reference, a `user:password` reference (which wins), and the PEM
    file whose certificate it trusts for HTTPS. References only, resolved by RegistryAuth
    where the client runs, so no secret is pickled into a task. A RegistrySpec without a url."""

    auth_token: str = ""
    basic_user_info: str = ""
    cafile: str = ""

    @property
    def url(self) -> str:
        return ""

    def auth(self) -> RegistryAuth:
        return RegistryAuth.from_spec(self, self.basic_user_info or None)

    def verify(self) -> bool | ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cafile) if self.cafile else True


def _q(segment: str | int) -> str:
    return quote(str(segment), safe="")


class _Requests:
    """Every request the clients make: (method, path, params, json body)."""

    @staticmethod
    def subjects(deleted: bool = False, prefix: str = "") -> tuple[str, str, dict[str, str], Any]:
        params = {"deleted": "true"} if deleted else {}
        if prefix:
            params["subjectPrefix"] = prefix
        return "GET", "/subjects", params, None

    @staticmethod
    def schemas(deleted: bool = False, prefix: str = "") -> tuple[str, str, dict[str, str], Any]:
        params = {"deleted": "true"} if deleted else {}
        if prefix:
            params["subjectPrefix"] = prefix
        return "GET", "/schemas", params, None

    @staticmethod
    def versions(subject: str, deleted: bool = False) -> tuple[str, str, dict[str, str], Any]:
        return "GET", f"/subjects/{_q(subject)}/versions", {"deleted": "true"} if deleted else {}, None

    @staticmethod
    def version(subject: str, version: int | str, deleted: bool = False) -> tuple[str, str, dict[str, str], Any]:
        return ("GET", f"/subjects/{_q(subject)}/versions/{_q(version)}",
                {"deleted": "true"} if deleted else {}, None)

    @staticmethod
    def schema_by_id(schema_id: int, subject: str | None) -> tuple[str, str, dict[str, str], Any]:
        return "GET", f"/schemas/ids/{int(schema_id)}", {"subject": subject} if subject else {}, None

    @staticmethod
    def id_versions(schema_id: int, subject: str | None, deleted: bool) -> tuple[str, str, dict[str, str], Any]:
        params = {"subject": subject} if subject else {}
        if deleted:
            params["deleted"] = "true"
        return "GET", f"/schemas/ids/{int(schema_id)}/versions", params, None

    @staticmethod
    def register(subject: str, schema_type: str, text: str, references: Sequence[Reference],
                 schema_id: int | None, version: int | None,
                 normalize: bool) -> tuple[str, str, dict[str, str], Any]:
        body: dict[str, Any] = {"schema": text}
        if schema_type and schema_type != "AVRO":
            body["schemaType"] = schema_type
        if references:
            body["references"] = references_json(references)
        if schema_id is not None:
            body["id"] = schema_id
        if version is not None:
            body["version"] = version
        return "POST", f"/subjects/{_q(subject)}/versions", {"normalize": "true"} if normalize else {}, body

    @staticmethod
    def delete_version(subject: str, version: int | str, permanent: bool) -> tuple[str, str, dict[str, str], Any]:
        return ("DELETE", f"/subjects/{_q(subject)}/versions/{_q(version)}",
                {"permanent": "true"} if permanent else {}, None)

    @staticmethod
    def delete_subject(subject: str, permanent: bool) -> tuple[str, str, dict[str, str], Any]:
        return "DELETE", f"/subjects/{_q(subject)}", {"permanent": "true"} if permanent else {}, None

    @staticmethod
    def get_config(subject: str | None) -> tuple[str, str, dict[str, str], Any]:
        return "GET", "/config" + (f"/{_q(subject)}" if subject is not None else ""), {}, None

    @staticmethod
    def put_config(level: str, subject: str | None) -> tuple[str, str, dict[str, str], Any]:
        return ("PUT", "/config" + (f"/{_q(subject)}" if subject is not None else ""), {},
                {"compatibility": level})

    @staticmethod
    def delete_config(subject: str) -> tuple[str, str, dict[str, str], Any]:
        return "DELETE", f"/config/{_q(subject)}", {}, None

    @staticmethod
    def get_mode(subject: str | None) -> tuple[str, str, dict[str, str], Any]:
        return "GET", "/mode" + (f"/{_q(subject)}" if subject is not None else ""), {}, None

    @staticmethod
    def put_mode(mode: str, subject: str | None, force: bool) -> tuple[str, str, dict[str, str], Any]:
        return ("PUT", "/mode" + (f"/{_q(subject)}" if subject is not None else ""),
                {"force": "true"} if force else {}, {"mode": mode})


def _answer(response: httpx.Response) -> Any:
    if response.status_code < 300:
        return response.json() if response.content else None
    try:
        body = response.json()
        code = int(body.get("error_code", response.status_code))
        message = str(body.get("message", response.reason_phrase))
    except (ValueError, AttributeError, TypeError):
        code, message = response.status_code, response.text[:200] or response.reason_phrase
    raise RegistryClientError(response.status_code, code, message)


def _schema_triple(body: Mapping[str, Any]) -> tuple[str, str, tuple[Reference, ...]]:
    return str(body.get("schemaType") or "AVRO"), str(body["schema"]), _references(body.get("references"))


class _Base:
    def __init__(self, url: str, *, auth: RegistryAuth = RegistryAuth(),
                 verify: bool | str | ssl.SSLContext = True, timeout_s: float = DEFAULT_TIMEOUT_S,
                 transport: Any = None) -> None:
        self.url = url.rstrip("/")
        self._options: dict[str, Any] = {
            "base_url": self.url, "timeout": timeout_s, "verify": verify,
            "headers": {"Accept": CONTENT_TYPE, "Content-Type": CONTENT_TYPE, **auth.headers()}}
        if transport is not None:  # tests: httpx.MockTransport
            self._options["transport"] = transport

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


class RegistryClient(_Base):
    """Blocking client (tools, Spark executors). Use as a context manager, or close()."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = httpx.Client(**self._options)

    @classmethod
    def for_spec(cls, spec: RegistrySpec, *, basic_user_info: str | None = None,
                 verify: bool | str | ssl.SSLContext = True, **options: Any) -> RegistryClient:
        return cls(spec.url, auth=RegistryAuth.from_spec(spec, basic_user_info), verify=verify, **options)

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def call(self, request: tuple[str, str, dict[str, str], Any]) -> Any:
        method, path, params, body = request
        try:
            response = self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise RegistryClientError(0, 0, f"registry {self.url}: {type(exc).__name__}: {exc}") from None
        return _answer(response)

    def schema_by_id(self, schema_id: int, subject: str | None = None) -> tuple[str, str, tuple[Reference, ...]]:
        """(schema type, text, references) of id `schema_id` in the context of `subject`
        (a subject `:.east:x`, or a bare context `.east`; None: the default context)."""
        if subject is not None and subject.startswith(".") and ":" not in subject:
            subject = context_subject(subject, "_")
        return _schema_triple(self.call(_Requests.schema_by_id(schema_id, subject)))

    def subjects(self, *, deleted: bool = False, prefix: str = "") -> list[str]:
        return list(self.call(_Requests.subjects(deleted, prefix)))

    def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        return list(self.call(_Requests.versions(subject, deleted)))

    def version(self, subject: str, version: int | str = "latest", *, deleted: bool = False) -> SchemaEntry:
        return SchemaEntry.from_json(self.call(_Requests.version(subject, version, deleted)))

    def register(self, subject: str, text: str, schema_type: str = "AVRO", references: Sequence[Reference] = (),
                 *, schema_id: int | None = None, version: int | None = None, normalize: bool = False) -> int:
        return int(self.call(_Requests.register(subject, schema_type, text, references, schema_id, version,
                                                normalize))["id"])

    def delete_version(self, subject: str, version: int | str, *, permanent: bool = False) -> int:
        return int(self.call(_Requests.delete_version(subject, version, permanent)))

    def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        return list(self.call(_Requests.delete_subject(subject, permanent)))

    def config(self, subject: str | None = None) -> str:
        return str(self.call(_Requests.get_config(subject))["compatibilityLevel"])

    def set_config(self, level: str, subject: str | None = None) -> str:
        return str(self.call(_Requests.put_config(level, subject))["compatibility"])

    def mode(self, subject: str | None = None) -> str:
        return str(self.call(_Requests.get_mode(subject))["mode"])

    def set_mode(self, mode: str, subject: str | None = None, *, force: bool = False) -> str:
        return str(self.call(_Requests.put_mode(mode, subject, force))["mode"])


class AsyncRegistryClient(_Base):
    """The same calls, awaitable (trio or asyncio). Use `async with`, or aclose()."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._http = httpx.AsyncClient(**self._options)

    @classmethod
    def for_spec(cls, spec: RegistrySpec, *, basic_user_info: str | None = None,
                 verify: bool | str | ssl.SSLContext = True, **options: Any) -> AsyncRegistryClient:
        return cls(spec.url, auth=RegistryAuth.from_spec(spec, basic_user_info), verify=verify, **options)

    async def __aenter__(self) -> AsyncRegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(self, request: tuple[str, str, dict[str, str], Any]) -> Any:
        method, path, params, body = request
        try:
            response = await self._http.request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise RegistryClientError(0, 0, f"registry {self.url}: {type(exc).__name__}: {exc}") from None
        return _answer(response)

    async def schema_by_id(self, schema_id: int,
                           subject: str | None = None) -> tuple[str, str, tuple[Reference, ...]]:
        if subject is not None and subject.startswith(".") and ":" not in subject:
            subject = context_subject(subject, "_")
        return _schema_triple(await self.call(_Requests.schema_by_id(schema_id, subject)))

    async def id_versions(self, schema_id: int, subject: str | None = None, *,
                          deleted: bool = False) -> list[tuple[str, int]]:
        answer = await self.call(_Requests.id_versions(schema_id, subject, deleted))
        return [(str(x["subject"]), int(x["version"])) for x in answer]

    async def subjects(self, *, deleted: bool = False, prefix: str = "") -> list[str]:
        return list(await self.call(_Requests.subjects(deleted, prefix)))

    async def schemas(self, *, deleted: bool = False, prefix: str = "") -> list[SchemaEntry]:
        return [SchemaEntry.from_json(x) for x in await self.call(_Requests.schemas(deleted, prefix))]

    async def versions(self, subject: str, *, deleted: bool = False) -> list[int]:
        return list(await self.call(_Requests.versions(subject, deleted)))

    async def version(self, subject: str, version: int | str = "latest", *, deleted: bool = False) -> SchemaEntry:
        return SchemaEntry.from_json(await self.call(_Requests.version(subject, version, deleted)))

    async def register(self, subject: str, text: str, schema_type: str = "AVRO",
                       references: Sequence[Reference] = (), *, schema_id: int | None = None,
                       version: int | None = None, normalize: bool = False) -> int:
        return int((await self.call(_Requests.register(subject, schema_type, text, references, schema_id,
                                                       version, normalize)))["id"])

    async def delete_version(self, subject: str, version: int | str, *, permanent: bool = False) -> int:
        return int(await self.call(_Requests.delete_version(subject, version, permanent)))

    async def delete_subject(self, subject: str, *, permanent: bool = False) -> list[int]:
        return list(await self.call(_Requests.delete_subject(subject, permanent)))

    async def config(self, subject: str | None = None) -> str:
        return str((await self.call(_Requests.get_config(subject)))["compatibilityLevel"])

    async def set_config(self, level: str, subject: str | None = None) -> str:
        return str((await self.call(_Requests.put_config(level, subject)))["compatibility"])

    async def delete_config(self, subject: str) -> str:
        return str((await self.call(_Requests.delete_config(subject)))["compatibilityLevel"])

    async def mode(self, subject: str | None = None) -> str:
        return str((await self.call(_Requests.get_mode(subject)))["mode"])

    async def set_mode(self, mode: str, subject: str | None = None, *, force: bool = False) -> str:
        return str((await self.call(_Requests.put_mode(mode, subject, force)))["mode"])
