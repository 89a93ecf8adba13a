"""The console's routes (Starlette, served by Hypercorn's trio worker: server.py). Each page
is a route with a template; what it shows comes from views.py over the poller's snapshot.

Every input is bounded (names by Kafka's 249 characters, offsets and limits by range, the
query box by QUERY_CHARS_MAX); every POST carries the session's CSRF token and is refused
from another origin; pages are served with a strict Content-Security-Policy (scripts and
styles only from the console itself).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import trio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from cluster.client.admin import Admin, AdminError
from cluster.client.connection import KafkaAuthenticationError, KafkaConnectionError
from cluster.client.errors import KafkaError
from cluster.common.secrets import Secret
from deploy.console import views
from deploy.console.actions import (
    DR_ACTIONS,
    LINES_MAX,
    ActionRefused,
    ActionRunner,
    disaster_recovery,
    worker_views,
)
from deploy.console.auth import (
    COOKIE,
    PASSWORD_MAX,
    ROLE_ADMIN,
    ROLE_OPEN,
    ROLE_USER,
    USERNAME_MAX,
    Session,
    Sessions,
    token_matches,
)
from deploy.console.poller import Poller, warehouse_sql
from deploy.console.records import (
    RECORDS_PER_PAGE_MAX,
    client_settings,
    find_copy,
    flow_into_aggregate,
    provenance,
    read_page,
    warehouse_row_query,
)
from deploy.group_offsets import (
    RESET_KINDS,
    GroupNotEmpty,
    ResetTo,
    commit_moves,
    partitions_of,
    plan_reset,
)
from deploy.render.monitoring import MonitoringOptions
from topology.model import Topology

log = logging.getLogger("dcmirror.console")

HERE = Path(__file__).parent
NAME_MAX = 249  # Kafka's longest topic name; group ids and users are bounded the same way here
FORM_BYTES_MAX = 16 << 10
TYPED_ACTIONS = ("failover", "failback")  # confirmed by typing the flow's name
LOGIN_COOKIE = "dcmirror_login"  # the login form's double-submit token
LOGIN_FORM_S = 3600  # how long a login form stays good
QUERY_CHARS_MAX = 8192
QUERY_ROWS_MAX = 1000
PARTITION_ROWS_SHOWN = 500
LOGIN_TIMEOUT_S = 10.0
ACTION_TIMEOUT_S = 15.0
OFFSET_MAX = (1 << 63) - 1
SEARCH_CHARS_MAX = 200
SEARCH_SCAN_MAX = 2000
"""Records a search reads per page at most (Next goes on from where it stopped)."""
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


CLIENT_IDLE_S = 60.0
CLIENTS_MAX = 64
"""Admin clients kept open at most (the least recently used is closed first)."""


class SessionClients:
    """Admin clients kept open per (session id, cluster) while used within CLIENT_IDLE_S;
    closed when idle, on logout, and after any error (the next request opens a new one)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, str], tuple[Admin, float]] = {}
        self.locks: dict[tuple[str, str], trio.Lock] = {}

    @asynccontextmanager
    async def admin(self, key: tuple[str, str], make: Callable[[], Admin]) -> AsyncIterator[Admin]:
        await self.close_idle()
        async with self.locks.setdefault(key, trio.Lock()):  # one opening per key at a time
            found = self.open.get(key)
            if found is None:
                while len(self.open) >= CLIENTS_MAX:
                    await self.close(min(self.open, key=lambda k: self.open[k][1]))
                admin = make()
                await admin.__aenter__()
            else:
                admin = found[0]
            self.open[key] = (admin, time.monotonic())
        try:
            yield admin
        except BaseException:
            await self.close(key)
            raise

    async def close(self, key: tuple[str, str]) -> None:
        found = self.open.pop(key, None)
        if found is not None:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await found[0].__aexit__(None, None, None)

    async def close_session(self, session_id: str) -> None:
        for key in [k for k in self.open if k[0] == session_id]:
            await self.close(key)

    async def close_idle(self) -> None:
        now = time.monotonic()
        for key in [k for k, (_, used) in self.open.items() if now - used > CLIENT_IDLE_S]:
            await self.close(key)


class BadInput(ValueError):
    """A request the console refuses, with the reason shown to the user (400)."""


def bounded_name(value: str | None, what: str) -> str:
    if not value or len(value) > NAME_MAX or any(ord(c) < 32 for c in value):
        raise BadInput(f"{what} must be 1 to {NAME_MAX} printable characters")
    return value


def bounded_int(value: str | None, what: str, low: int, high: int, default: int | None = None) -> int | None:
    if value in (None, ""):
        return default
    assert value is not None
    digits = value[1:] if value.startswith("-") and low < 0 else value
    if len(value) > 20 or not (digits.isascii() and digits.isdigit()):  # "²" and "１" are digits to isdigit()
        raise BadInput(f"{what} must be a whole number in ASCII digits")
    number = int(value)
    if not low <= number <= high:
        raise BadInput(f"{what} must be between {low} and {high}")
    return number


@dataclass
class Console:
    """Everything a request may need: the topology, the poller's snapshot, the sessions."""

    topology: Topology
    poller: Poller
    token: Secret | None = None
    https: bool = False
    monitoring: MonitoringOptions = field(default_factory=MonitoringOptions)
    sessions: Sessions = field(default_factory=Sessions)
    decoders: dict[str, Any] = field(default_factory=dict)
    """Per cluster with a schema registry, its SchemaDecoder (decode.py), made when first needed."""
    clients: SessionClients = field(default_factory=lambda: SessionClients())
    """Open admin clients per (session, cluster), so a page acting as the user does not log
    in (TLS handshake and SCRAM, 2 round trips and PBKDF2) on every request."""
    flow_actions: dict[str, Callable[..., Awaitable[None]]] = field(default_factory=dict)
    """'pause' / 'resume' -> async fn(topology, flow, client settings, reason): set by server.py
    when the mirror's flow control is available."""
    actions: ActionRunner = field(default_factory=ActionRunner)
    """promote / failover / failback of mirror-topics flows, in the background: served (its
    `run`) by server.py beside the poller; without it the console offers none."""

    @property
    def sasl_clusters(self) -> list[str]:
        return [n for n, spec in self.topology.clusters.items()
                if spec.client_config().get("security.protocol", "PLAINTEXT").upper().startswith("SASL")]

    @property
    def open(self) -> bool:
        return self.token is None and not self.sasl_clusters


def build_app(console: Console) -> Starlette:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["bytes"] = views.human_bytes
    env.filters["seconds"] = views.human_seconds
    env.filters["utc"] = lambda s: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(s))
    env.globals["quote"] = lambda s: quote(str(s), safe="")

    def session_of(request: Request) -> Session | None:
        if console.open:
            return Session("open", "local", ROLE_OPEN, "open", 0, 0)
        return console.sessions.get(request.cookies.get(COOKIE))

    def page(request: Request, template: str, session: Session | None, status: int = 200, **context: Any) -> Response:
        body = env.get_template(template).render(
            session=session, refresh_ms=console.poller.refresh_s * 1000, topology=console.topology,
            snapshot=console.poller.snapshot, path=request.url.path, open_console=console.open,
            monitoring=console.monitoring, **context)
        return HTMLResponse(body, status_code=status, headers=_headers())

    def _headers() -> dict[str, str]:
        return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
                "Cache-Control": "no-store"}

    def guarded(handler: Callable[[Request, Session], Awaitable[Response]], *, post: bool = False
                ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = session_of(request)
            if session is None:
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": "log in first"}, status_code=401)
                return RedirectResponse("/login?" + urlencode({"next": request.url.path}), status_code=303)
            if post:
                origin = request.headers.get("origin")
                if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
                    return PlainError(403, "cross-origin request refused")
                if int(request.headers.get("content-length") or 0) > FORM_BYTES_MAX:
                    return PlainError(413, f"form over {FORM_BYTES_MAX} bytes")
                form = await request.form(max_files=0, max_fields=20)
                token = form.get("csrf")
                if not isinstance(token, str) or not session.csrf_ok(token):
                    return PlainError(403, "missing or stale form token: reload the page and try again")
                request.state.form = form
            try:
                return await handler(request, session)
            except BadInput as exc:
                return page(request, "error.html", session, status=400, message=str(exc))
        return endpoint

    # ---- login ------------------------------------------------------------------------------

    def login_page(request: Request, target: str, error: str | None, status: int = 200) -> Response:
        # Login CSRF: the form carries a token that must equal a cookie only this origin sets
        # (double submit, SameSite=strict), so no other site can log a browser in as its user.
        login_csrf = secrets.token_urlsafe(24)
        response = page(request, "login.html", None, status=status, next=target, scram=bool(console.sasl_clusters),
                        token=console.token is not None, error=error, login_csrf=login_csrf)
        response.set_cookie(LOGIN_COOKIE, login_csrf, httponly=True, samesite="strict", secure=console.https,
                            path="/login", max_age=LOGIN_FORM_S)
        return response

    async def login_form(request: Request) -> Response:
        if console.open:
            return RedirectResponse("/", status_code=303)
        return login_page(request, _next(request.query_params.get("next")), None)

    async def login(request: Request) -> Response:
        client = request.client.host if request.client else "?"
        if console.sessions.too_many_failures(client):
            return PlainError(429, "too many failed logins from this address: wait a minute")
        origin = request.headers.get("origin")
        if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
            return PlainError(403, "cross-origin login refused")
        if int(request.headers.get("content-length") or 0) > FORM_BYTES_MAX:
            return PlainError(413, f"form over {FORM_BYTES_MAX} bytes")
        form = await request.form(max_files=0, max_fields=10)
        target = _next(str(form.get("next") or "/"))
        sent = str(form.get("login_csrf") or "")
        cookie = request.cookies.get(LOGIN_COOKIE) or ""
        if not sent or not cookie or not hmac.compare_digest(sent, cookie):
            return login_page(request, target, "the login form is stale: log in again", status=403)
        user, password, token = (str(form.get(k) or "") for k in ("username", "password", "token"))
        session: Session | None = None
        error = "wrong name or password"
        if token:
            if len(token) <= PASSWORD_MAX and token_matches(token, console.token):
                session = console.sessions.create("admin (token)", ROLE_ADMIN)
            else:
                error = "wrong token"
        elif user and password and len(user) <= USERNAME_MAX and len(password) <= PASSWORD_MAX:
            accepted, unreachable = await _scram_login(console, user, Secret(password))
            if accepted:
                session = console.sessions.create(user, ROLE_USER, password=Secret(password), clusters=tuple(accepted))
            elif unreachable and len(unreachable) == len(console.sasl_clusters):
                error = (f"no cluster answered ({', '.join(unreachable)} unreachable): the name and password could "
                         "not be checked; try again when one does")
            elif unreachable:
                error += f" (and {', '.join(unreachable)} did not answer)"
        if session is None:
            console.sessions.failed(client)
            log.info("console: failed login from %s", client)  # never the name or password typed
            return login_page(request, target, error, status=401)
        log.info("console: %s logged in (%s) from %s", session.user, session.role, client)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, session.id, httponly=True, samesite="strict", secure=console.https, path="/")
        return response

    async def logout(request: Request, session: Session) -> Response:
        console.sessions.drop(session.id)
        await console.clients.close_session(session.id)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # ---- pages ------------------------------------------------------------------------------

    async def home(request: Request, session: Session) -> Response:
        return page(request, "map.html", session, layout=views.map_layout(console.topology),
                    state=map_state(console))

    async def api_map(request: Request, session: Session) -> Response:
        return JSONResponse(map_state(console), headers={"Cache-Control": "no-store"})

    async def cluster_page(request: Request, session: Session) -> Response:
        name = _cluster(console, request.path_params["name"])
        spec = console.topology.clusters[name]
        found = console.poller.snapshot.clusters.get(name)
        level, reasons = views.cluster_level(found, len(spec.brokers))
        parts: list[dict[str, Any]] = []
        topics: list[dict[str, Any]] = []
        if found and not found.get("error"):
            every = [p for t in found["topics"].values() for p in t["partitions"]]
            parts = views.partitions_worst_first(every)
            for tname, t in found["topics"].items():
                ps = t["partitions"]
                topics.append({"name": tname, "internal": t["internal"], "partitions": len(ps),
                               "replication_factor": max((len(p["replicas"]) for p in ps), default=0),
                               "size_bytes": sum(p.get("size_bytes") or 0 for p in ps),
                               "records": sum((p.get("end_offset") or 0) - (p.get("start_offset") or 0) for p in ps),
                               "bad": sum(1 for p in views.partitions_worst_first(ps) if p["state"] != "ok")})
        shown_internal = request.query_params.get("internal") == "1"
        brokers = _brokers(spec, found)
        share_groups, share_error = await _share_groups(console, session, name)
        message = request.query_params.get("message")
        return page(request, "cluster.html", session, name=name, spec=spec, found=found, level=level,
                    message=message[:500] if message else None,
                    reasons=reasons, brokers=brokers, partitions=[p for p in parts if p["state"] != "ok"][:PARTITION_ROWS_SHOWN],
                    partitions_ok=sum(1 for p in parts if p["state"] == "ok"),
                    topics=[t for t in topics if shown_internal or not t["internal"]], shown_internal=shown_internal,
                    groups=[g for g in (found or {}).get("groups", []) if g.get("protocol_type") != "share"],
                    share_groups=share_groups, share_error=share_error)

    async def topic_page(request: Request, session: Session) -> Response:
        name = _cluster(console, request.path_params["name"])
        topic = bounded_name(request.path_params["topic"], "topic")
        found = (console.poller.snapshot.clusters.get(name) or {}).get("topics", {}).get(topic)
        if found is None:
            raise BadInput(f"cluster {name} has no topic {topic!r} (as of the last poll)")
        shown = request.query_params.get("configs") or "overrides"
        if shown not in ("overrides", "all"):
            raise BadInput("configs: overrides or all")
        configs: list[Any] = []
        error = None
        try:
            async with _admin(console, session, name) as admin:
                configs = sorted(await admin.topic_configs(topic), key=lambda c: c.name)
        except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError) as exc:
            error = f"configs not described: {exc}"
        overrides = [c for c in configs if c.config_source == 1]  # set on the topic (DescribeConfigs' TOPIC_CONFIG)
        return page(request, "topic.html", session, name=name, topic=topic, found=found,
                    partitions=views.partitions_worst_first(found["partitions"]),
                    configs=configs if shown == "all" else overrides, configs_total=len(configs),
                    overrides=len(overrides), shown_configs=shown, error=error)

    async def group_page(request: Request, session: Session) -> Response:
        name = _cluster(console, request.path_params["name"])
        group_id = bounded_name(request.path_params["group"], "group id")
        groups = (console.poller.snapshot.clusters.get(name) or {}).get("groups", [])
        group = next((g for g in groups if g["group_id"] == group_id), None)
        if group is None:
            raise BadInput(f"cluster {name} has no group {group_id!r} (as of the last poll)")
        consumer_group = None
        if group.get("protocol_type") == "consumer":
            try:
                async with _admin(console, session, name) as admin:
                    consumer_group = await admin.describe_consumer_group(group_id)
            except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError):
                consumer_group = None
        message = request.query_params.get("message")
        return page(request, "group.html", session, name=name, group=group, consumer_group=consumer_group,
                    message=message[:500] if message else None, reset_kinds=RESET_KINDS, plan=None, asked={})

    def _group_of(request: Request, name: str) -> dict[str, Any]:
        group_id = bounded_name(request.path_params["group"], "group id")
        groups = (console.poller.snapshot.clusters.get(name) or {}).get("groups", [])
        group = next((g for g in groups if g["group_id"] == group_id), None)
        if group is None:
            raise BadInput(f"cluster {name} has no group {group_id!r} (as of the last poll)")
        return dict(group)

    async def group_reset(request: Request, session: Session) -> Response:
        """Move a group's committed offsets, as kafka-consumer-groups --reset-offsets: a
        preview first, committed when confirmed, as the session's principal."""
        name = _cluster(console, request.path_params["name"])
        group = _group_of(request, name)
        form = request.state.form
        to = _reset_to(str(form.get("to") or ""), str(form.get("value") or ""))
        topic = str(form.get("topic") or "")
        back = f"/clusters/{quote(name, safe='')}/groups/{quote(group['group_id'], safe='')}?"
        try:
            with trio.fail_after(ACTION_TIMEOUT_S):
                async with _admin(console, session, name) as admin:
                    if topic:
                        partitions = await partitions_of(admin, [bounded_name(topic, "topic")])
                    else:  # every partition the group has offsets of
                        partitions = sorted({(r["topic"], r["partition"]) for r in group.get("offsets", [])})
                    if not partitions:
                        raise BadInput(f"group {group['group_id']} has no committed offsets: name a topic")
                    moves = await plan_reset(admin, group["group_id"], partitions, to)
                    if form.get("execute") == "yes":
                        await commit_moves(admin, group["group_id"], moves)
        except (GroupNotEmpty, AdminError, KafkaError, KafkaConnectionError, OSError, trio.TooSlowError) as exc:
            message = f"offsets of group {group['group_id']} not moved: {exc}"
            return RedirectResponse(back + urlencode({"message": message[:500]}), status_code=303)
        if form.get("execute") == "yes":
            log.info("console: offsets of group %s on %s moved %s by %s", group["group_id"], name, to.describe(),
                     session.user)
            message = f"committed {len(moves)} offset(s) of group {group['group_id']} {to.describe()}"
            return RedirectResponse(back + urlencode({"message": message[:500]}), status_code=303)
        return page(request, "group.html", session, name=name, group=group, consumer_group=None, message=None,
                    reset_kinds=RESET_KINDS, plan=moves,
                    asked={"to": to.kind, "value": str(form.get("value") or ""), "topic": topic})

    async def group_delete(request: Request, session: Session) -> Response:
        """Delete an empty group and its offsets (kafka-consumer-groups --delete), confirmed
        by typing its id, as the session's principal."""
        name = _cluster(console, request.path_params["name"])
        group = _group_of(request, name)
        group_id = group["group_id"]
        if request.state.form.get("confirm_name") != group_id:
            raise BadInput(f"type the group's id ({group_id}) to confirm deleting it")
        try:
            with trio.fail_after(ACTION_TIMEOUT_S):
                async with _admin(console, session, name) as admin:
                    await admin.delete_group(group_id)
        except (AdminError, KafkaError, KafkaConnectionError, OSError, trio.TooSlowError) as exc:
            message = f"group {group_id} not deleted: {exc}"
            return RedirectResponse(f"/clusters/{quote(name, safe='')}/groups/{quote(group_id, safe='')}?"
                                    + urlencode({"message": message[:500]}), status_code=303)
        log.info("console: group %s on %s deleted by %s", group_id, name, session.user)
        return RedirectResponse(f"/clusters/{quote(name, safe='')}?"
                                + urlencode({"message": f"group {group_id} deleted"}), status_code=303)

    async def records_page(request: Request, session: Session) -> Response:
        """A partition's records from an offset or a time, as cards or a compact table, with
        Previous / Next; `q` searches keys, values and headers (as shown: decoded, JSON, text
        or hex) from there on, at most SEARCH_SCAN_MAX records per page."""
        name = _cluster(console, request.path_params["name"])
        topic = bounded_name(request.path_params["topic"], "topic")
        q = request.query_params
        partition = bounded_int(q.get("partition"), "partition", 0, 1 << 20, 0)
        offset = bounded_int(q.get("offset"), "offset", 0, OFFSET_MAX)
        limit = bounded_int(q.get("limit"), "limit", 1, RECORDS_PER_PAGE_MAX, 20)
        mode = q.get("mode", "auto") if q.get("mode", "auto") in views.RENDER_MODES else "auto"
        view = q.get("view") or "cards"
        if view not in ("cards", "table"):
            raise BadInput("view: cards or table")
        search = q.get("q") or ""
        if len(search) > SEARCH_CHARS_MAX or any(ord(c) < 32 for c in search):
            raise BadInput(f"search: at most {SEARCH_CHARS_MAX} printable characters")
        timestamp_ms = None
        if q.get("time"):
            timestamp_ms = _parse_time(q["time"])
        assert partition is not None and limit is not None
        error, rows, result = None, [], None
        scanned, next_offset = 0, None
        registry = console.topology.clusters[name].registry if mode == "auto" else None

        async def shown(records: Any) -> list[dict[str, Any]]:
            decoded: dict[tuple[int, str], tuple[str, str]] = {}
            if registry is not None and records:
                decoded = await trio.to_thread.run_sync(_decode_records, console, name, registry, records)
            out = []
            for r in records:
                key_kind, key_text = decoded.get((r.offset, "key")) or views.render_bytes(r.key, mode)
                value_kind, value_text = decoded.get((r.offset, "value")) or views.render_bytes(r.value, mode)
                out.append({"offset": r.offset, "timestamp": r.timestamp, "time": _time_text(r.timestamp),
                            "key_kind": key_kind, "key": key_text, "value_kind": value_kind, "value": value_text,
                            "value_bytes": len(r.value or b""),
                            "headers": [(k, views.render_bytes(v, "text")[1]) for k, v in r.headers],
                            "provenance": provenance(r)})
            return out

        try:
            async with _admin(console, session, name) as admin:
                if not search:
                    result = await read_page(admin.cluster, topic, partition, offset=offset,
                                             timestamp_ms=timestamp_ms, limit=limit)
                    rows = await shown(result.records)
                    next_offset = rows[-1]["offset"] + 1 if rows else None
                else:
                    needle = search.casefold()
                    at = offset if offset is not None or timestamp_ms is not None else 0
                    while len(rows) < limit and scanned < SEARCH_SCAN_MAX:
                        page_ = await read_page(admin.cluster, topic, partition, offset=at,
                                                timestamp_ms=timestamp_ms if result is None else None,
                                                limit=RECORDS_PER_PAGE_MAX)
                        result = result or page_
                        if not page_.records:
                            break
                        for row in await shown(page_.records):
                            scanned += 1
                            next_offset = row["offset"] + 1
                            text = " ".join([row["key"], row["value"], *(f"{k}={v}" for k, v in row["headers"])])
                            if needle in text.casefold():
                                rows.append(row)
                                if len(rows) == limit or scanned == SEARCH_SCAN_MAX:
                                    break
                        at = next_offset
        except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError, ValueError) as exc:
            error = f"not read: {exc}" if not isinstance(exc, trio.TooSlowError) else "not read: no answer in time"
        flow = flow_into_aggregate(console.topology, name, topic)
        previous = None
        if result is not None and not search and result.asked_offset > result.start_offset:
            previous = max(result.start_offset, result.asked_offset - limit)
        if search and result is not None and next_offset is not None and next_offset >= result.end_offset:
            next_offset = None  # searched to the log's end
        return page(request, "records.html", session, name=name, topic=topic, partition=partition,
                    offset=offset, limit=limit, mode=mode, time_text=q.get("time", ""), rows=rows,
                    result=result, error=error, flow=flow, modes=views.RENDER_MODES, view=view, search=search,
                    scanned=scanned, scan_max=SEARCH_SCAN_MAX, next_offset=next_offset, previous=previous)

    async def follow(request: Request, session: Session) -> Response:
        """From a source record to its copy in the target of the flow that mirrors it."""
        name = _cluster(console, request.query_params.get("cluster"))
        topic = bounded_name(request.query_params.get("topic"), "topic")
        partition = bounded_int(request.query_params.get("partition"), "partition", 0, 1 << 20)
        offset = bounded_int(request.query_params.get("offset"), "offset", 0, OFFSET_MAX)
        if partition is None or offset is None:
            raise BadInput("give partition and offset")
        flow = flow_into_aggregate(console.topology, name, topic)
        if flow is None:
            raise BadInput(f"no flow mirrors {topic} of {name}")
        target_topic = flow.target_topic(topic, console.topology.clusters[name].datacenter)
        topic_id = ((console.poller.snapshot.clusters.get(name) or {}).get("topics", {}).get(topic) or {}).get("topic_id")
        if flow.mirror_topics:
            at: int | None = offset  # offset-keeping mirror topics: the copy is at the same offset
        else:
            try:
                async with _admin(console, session, flow.target) as admin:
                    at = await find_copy(admin.cluster, target_topic, partition, name, offset, topic_id)
            except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError, ValueError) as exc:
                raise BadInput(f"the copy in {flow.target} could not be looked up: {exc}") from exc
        if at is None:
            raise BadInput(f"{topic}-{partition}@{offset} of {name} has no copy in {target_topic} of {flow.target} "
                           f"(not mirrored yet, or deleted there)")
        return RedirectResponse(f"/clusters/{quote(flow.target)}/topics/{quote(target_topic, safe='')}/records?"
                                + urlencode({"partition": partition, "offset": at, "limit": 1,
                                             "source": f"{name}/{topic}/{partition}/{offset}"}), status_code=303)

    async def flows_page(request: Request, session: Session) -> Response:
        snap = console.poller.snapshot
        rows = []
        for m in console.topology.mirrors:
            report = snap.flows.get(m.name)
            health = views.flow_health(report, m.workers, console.monitoring, _unreachable_sides(snap, m))
            rows.append({"spec": m, "report": report, "health": health,
                         "rate": (report or {}).get("records_per_s"),
                         "charts": {f"{t}-{p}": views.sparkline(points)
                                    for (t, p), points in console.poller.lag_history.of(m.name).items()}})
        return page(request, "flows.html", session, flows=rows, can_act=bool(console.flow_actions),
                    typed_actions=TYPED_ACTIONS, can_recover=console.actions.serving, runs=console.actions.runs,
                    lines_max=LINES_MAX,
                    message=request.query_params.get("message"))

    async def flow_action(request: Request, session: Session) -> Response:
        """pause / resume (at once) and promote / failover / failback (in the background) of a
        flow, each confirmed, as the session's principal."""
        flow_name = request.path_params["flow"]
        action = request.path_params["action"]
        flow = next((m for m in console.topology.mirrors if m.name == flow_name), None)
        if flow is None or action not in ("pause", "resume", *DR_ACTIONS):
            raise BadInput("no such flow or action")
        if action in TYPED_ACTIONS:
            # Destructive (a failover makes the copy writable; a failback deletes the old
            # primary's topic): confirmed by typing the flow's name, not by one click.
            if request.state.form.get("confirm_name") != flow_name:
                raise BadInput(f"type the flow's name ({flow_name}) to confirm: {action}")
        elif request.state.form.get("confirm") != "yes":
            raise BadInput(f"tick the box to confirm: {action} flow {flow_name}")
        back = "/flows?{}#flow-" + quote(flow_name, safe="")
        if action in DR_ACTIONS:
            if not flow.mirror_topics:
                raise BadInput(f"flow {flow_name} has no mirror topics (mirror_topics = true): no {action}")
            # A failover asks the source only whether it still answers (and how far it is).
            sides = {side: _flow_settings(console, session, flow, side) for side in ("source", "target")}
            work = disaster_recovery(console.topology, flow, action, sides.get("source"), sides["target"],
                                     worker_views(console.poller.snapshot.flows.get(flow_name)))
            try:
                console.actions.start(flow_name, action, session.user, work)
            except ActionRefused as exc:
                return page(request, "error.html", session, status=409, message=str(exc))
            log.info("console: %s of flow %s started by %s", action, flow_name, session.user)
            message = f"flow {flow_name}: {action} started; its progress is below"
            return RedirectResponse(back.format(urlencode({"message": message})), status_code=303)
        do = console.flow_actions.get(action)
        if do is None:
            raise BadInput("this console cannot pause or resume flows")
        reason = str(request.state.form.get("reason") or f"{action}d from the console by {session.user}")[:200]
        try:
            with trio.fail_after(ACTION_TIMEOUT_S):
                await do(console.topology, flow, _flow_settings(console, session, flow, "target"), reason)
        except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError, ValueError) as exc:
            log.info("console: %s of flow %s by %s refused: %s", action, flow_name, session.user, exc)
            message = f"{action} of {flow_name} refused: {exc}"
        else:
            log.info("console: flow %s %sd by %s", flow_name, action, session.user)
            message = f"flow {flow_name}: {action} requested; the workers follow within their next poll"
        return RedirectResponse(back.format(urlencode({"message": message[:500]})), status_code=303)

    async def api_flow_action(request: Request, session: Session) -> Response:
        """The flow's last (or running) background action: progress lines and outcome."""
        flow_name = bounded_name(request.path_params["flow"], "flow")
        if not any(m.name == flow_name for m in console.topology.mirrors):
            return JSONResponse({"error": f"no flow {flow_name!r}"}, status_code=404)
        run = console.actions.last(flow_name)
        return JSONResponse(run.as_json() if run else {"flow": flow_name, "action": None},
                            headers={"Cache-Control": "no-store"})

    async def warehouse_page(request: Request, session: Session) -> Response:
        return page(request, "warehouse.html", session, warehouse=console.topology.warehouse,
                    found=console.poller.snapshot.warehouse, query=request.query_params.get("query", "")[:QUERY_CHARS_MAX],
                    answer=None)

    async def warehouse_query(request: Request, session: Session) -> Response:
        if console.topology.warehouse is None:
            raise BadInput("this topology has no warehouse")
        query = str(request.state.form.get("query") or "").strip()
        if not query or len(query) > QUERY_CHARS_MAX:
            raise BadInput(f"a query of 1 to {QUERY_CHARS_MAX} characters")
        rows = bounded_int(str(request.state.form.get("max_rows") or "100"), "rows", 1, QUERY_ROWS_MAX, 100) or 100
        started = time.monotonic()
        answer = await trio.to_thread.run_sync(warehouse_sql, console.topology, query, rows)
        if answer is None:
            answer = {"error": "no warehouse service runs on the console's host (dcmirror warehouse serve)"}
        answer["console_seconds"] = round(time.monotonic() - started, 3)
        log.info("console: warehouse query by %s (%d chars)", session.user, len(query))
        return page(request, "warehouse.html", session, warehouse=console.topology.warehouse,
                    found=console.poller.snapshot.warehouse, query=query, answer=answer)

    async def warehouse_row(request: Request, session: Session) -> Response:
        """The warehouse row of a source record (the query is shown, then run)."""
        q = request.query_params
        name = _cluster(console, q.get("cluster"))
        topic = bounded_name(q.get("topic"), "topic")
        partition = bounded_int(q.get("partition"), "partition", 0, 1 << 20)
        offset = bounded_int(q.get("offset"), "offset", 0, OFFSET_MAX)
        flow = flow_into_aggregate(console.topology, name, topic)
        wh = console.topology.warehouse
        if flow is None or wh is None or partition is None or offset is None:
            raise BadInput("no flow and warehouse for this record")
        from spark_aggregate.settings import table_name

        target_topic = flow.target_topic(topic, console.topology.clusters[name].datacenter)
        topic_id = ((console.poller.snapshot.clusters.get(name) or {}).get("topics", {}).get(topic) or {}).get("topic_id")
        query = warehouse_row_query(table_name(target_topic), name, partition, offset, topic_id)
        answer = await trio.to_thread.run_sync(warehouse_sql, console.topology, query, 10)
        if answer is None:
            answer = {"error": "no warehouse service runs on the console's host (dcmirror warehouse serve)"}
        return page(request, "warehouse.html", session, warehouse=wh, found=console.poller.snapshot.warehouse,
                    query=query, answer=answer)

    async def security_page(request: Request, session: Session) -> Response:
        from cluster.security.acl import AclFilter

        found: dict[str, dict[str, Any]] = {}

        async def one(name: str) -> None:  # the clusters side by side, not one after another
            entry: dict[str, Any] = {}
            try:
                async with _admin(console, session, name) as admin:
                    entry["users"] = await admin.describe_scram_credentials()
                    entry["acls"] = await admin.describe_acls(AclFilter())
            except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError) as exc:
                entry["error"] = str(exc)[:300] or type(exc).__name__
            found[name] = entry

        async with trio.open_nursery() as nursery:
            for name in console.topology.clusters:
                nursery.start_soon(one, name)
        found = {name: found[name] for name in console.topology.clusters}
        return page(request, "security.html", session, found=found)

    async def healthz(request: Request) -> Response:
        return Response("ok\n", media_type="text/plain")

    routes = [
        Route("/healthz", healthz),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", guarded(logout, post=True), methods=["POST"]),
        Route("/", guarded(home)),
        Route("/api/map", guarded(api_map)),
        Route("/clusters/{name}", guarded(cluster_page)),
        Route("/clusters/{name}/topics/{topic}", guarded(topic_page)),
        Route("/clusters/{name}/topics/{topic}/records", guarded(records_page)),
        Route("/clusters/{name}/groups/{group}", guarded(group_page)),
        Route("/clusters/{name}/groups/{group}/reset-offsets", guarded(group_reset, post=True), methods=["POST"]),
        Route("/clusters/{name}/groups/{group}/delete", guarded(group_delete, post=True), methods=["POST"]),
        Route("/follow", guarded(follow)),
        Route("/flows", guarded(flows_page)),
        Route("/flows/{flow}/{action}", guarded(flow_action, post=True), methods=["POST"]),
        Route("/api/flows/{flow}/action", guarded(api_flow_action)),
        Route("/warehouse", guarded(warehouse_page)),
        Route("/warehouse/query", guarded(warehouse_query, post=True), methods=["POST"]),
        Route("/warehouse/row", guarded(warehouse_row)),
        Route("/security", guarded(security_page)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)


def PlainError(status: int, text: str) -> Response:  # noqa: N802 - reads as a response class
    return Response(text + "\n", status_code=status, media_type="text/plain")


def _next(value: str | None) -> str:
    """Only a local path: never redirect a login elsewhere."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value or len(value) > 512:
        return "/"
    return value


def _cluster(console: Console, name: str | None) -> str:
    if name not in console.topology.clusters:
        raise BadInput(f"no cluster {name!r} in the topology")
    assert name is not None
    return name


def _settings(console: Console, session: Session, cluster: str) -> dict[str, Any]:
    """Client settings to act as the session's principal on `cluster`."""
    spec = console.topology.clusters[cluster]
    if session.role == ROLE_USER:
        if cluster not in session.clusters:
            raise BadInput(f"{session.user} is not a user of cluster {cluster} (it refused the login)")
        return client_settings(spec, session.user, session.password)
    return client_settings(spec, None, None)


def _flow_settings(console: Console, session: Session, flow: Any, side: str) -> dict[str, Any]:
    """Client settings to act on one side of a flow: a SCRAM user as themself (the brokers'
    ACLs decide); the topology's own identity (token, open console) with the flow's
    `source.*` / `target.*` principal over it, as `dcmirror mirror promote` connects."""
    from mirror.worker import WorkerConfig

    config = _settings(console, session, flow.source if side == "source" else flow.target)
    if session.role != ROLE_USER:
        config.update(getattr(WorkerConfig.from_flow(flow), side))
    return config


SHARE_GROUPS_SHOWN = 100  # share groups a cluster page describes (one ShareGroupDescribe each)


async def _share_groups(console: Console, session: Session, cluster: str) -> tuple[list[dict[str, Any]], str | None]:
    """The cluster's share groups (KIP-932), read-only: state, members and the partitions
    assigned to them; (rows, why they could not be read)."""
    rows: list[dict[str, Any]] = []
    try:
        async with _admin(console, session, cluster) as admin:
            with trio.fail_after(10):
                for group_id, state in (await admin.list_share_groups())[:SHARE_GROUPS_SHOWN]:
                    try:
                        g = await admin.describe_share_group(group_id)
                    except KafkaError:
                        rows.append({"group_id": group_id, "state": state, "members": [], "partitions": []})
                        continue
                    members = [{"member_id": m.member_id, "client_id": m.client_id, "host": m.client_host,
                                "assignment": sorted(f"{t.topic_name}:{p}" for t in m.assignment.topic_partitions
                                                     for p in t.partitions)}
                               for m in sorted(g.members, key=lambda m: (m.client_id, m.member_id))]
                    rows.append({"group_id": group_id, "state": g.group_state, "members": members,
                                 "partitions": sorted({a for m in members for a in m["assignment"]})})
    except (KafkaError, KafkaConnectionError, OSError, trio.TooSlowError) as exc:
        return rows, f"share groups not listed: {exc}"
    return rows, None


def _admin(console: Console, session: Session, cluster: str) -> Any:
    """The session's open admin client of `cluster` (async with; kept open for the next page)."""
    config = _settings(console, session, cluster)
    config.setdefault("default.api.timeout.ms", 5000)
    bootstrap = config.pop("bootstrap.servers")
    return console.clients.admin((session.id, cluster),
                                 lambda: Admin(bootstrap, client_id="dcmirror-console", config=config))


async def _scram_login(console: Console, user: str, password: Secret) -> tuple[list[str], list[str]]:
    """(the SASL clusters that accept (user, password), those that did not answer at all)."""
    accepted: list[str] = []
    unreachable: list[str] = []

    async def one(name: str) -> None:
        spec = console.topology.clusters[name]
        config = client_settings(spec, user, password)
        config["default.api.timeout.ms"] = int(LOGIN_TIMEOUT_S * 1000)
        try:
            with trio.fail_after(LOGIN_TIMEOUT_S):
                async with Admin(config.pop("bootstrap.servers"), client_id="dcmirror-console-login", config=config):
                    accepted.append(name)
        except (KafkaError, KafkaAuthenticationError):
            pass  # an answer: refused (SASL_AUTHENTICATION_FAILED and the like)
        except (KafkaConnectionError, OSError, trio.TooSlowError):
            unreachable.append(name)
        except ValueError:
            pass

    async with trio.open_nursery() as nursery:
        for name in console.sasl_clusters:
            nursery.start_soon(one, name)
    return sorted(accepted), sorted(unreachable)


def _unreachable_sides(snap: Any, flow: Any) -> dict[str, str]:
    """The flow's source and target clusters the last poll could not reach."""
    return {role: cluster for role, cluster in (("source", flow.source), ("target", flow.target))
            if (snap.clusters.get(cluster) or {}).get("error")}


def _brokers(spec: Any, found: dict[str, Any] | None) -> list[dict[str, Any]]:
    registered = {b["node_id"]: b for b in (found or {}).get("brokers", [])}
    controller = (found or {}).get("controller_id", -1)
    leaders: dict[int, int] = {}
    for t in (found or {}).get("topics", {}).values():
        for p in t["partitions"]:
            leaders[p["leader"]] = leaders.get(p["leader"], 0) + 1
    rows = []
    for i, b in enumerate(spec.brokers):
        seen = registered.get(b.node_id)
        rows.append({"node_id": b.node_id, "address": str(b), "rack": (seen or {}).get("rack") or
                     (spec.racks[i] if i < len(spec.racks) else None),
                     "listeners": {name: str(addrs[i]) for name, addrs in spec.listeners.items() if i < len(addrs)},
                     "registered": seen is not None, "controller": b.node_id == controller,
                     "leaders": leaders.get(b.node_id, 0)})
    return rows


def map_state(console: Console) -> dict[str, Any]:
    """What the map's live parts show: per cluster and flow a level and labels; per
    datacenter whether it is cut (no cluster of it answers, or every flow out of it finds its
    source silent)."""
    snap = console.poller.snapshot
    topo = console.topology
    clusters = {}
    for name, spec in topo.clusters.items():
        level, reasons = views.cluster_level(snap.clusters.get(name), len(spec.brokers))
        c = snap.clusters.get(name) or {}
        clusters[name] = {"level": level, "reasons": reasons,
                          "text": f"{len(c.get('brokers', []))}/{len(spec.brokers)} brokers · "
                                  f"{sum(1 for t in c.get('topics', {}).values() if not t['internal'])} topics"
                          if not c.get("error") else "unreachable"}
    flows: dict[str, dict[str, Any]] = {}
    silent_flows: set[str] = set()
    for m in topo.mirrors:
        report = snap.flows.get(m.name)
        h = views.flow_health(report, m.workers, console.monitoring, _unreachable_sides(snap, m))
        if any(r.startswith("source silent") for r in h.reasons):
            silent_flows.add(m.name)
        rate = (report or {}).get("records_per_s")
        flows[m.name] = {"level": h.level, "reasons": list(h.reasons), "lag_records": h.lag_records,
                         "lag_s": h.lag_s, "rate": rate, "workers": f"{h.live_workers}/{h.workers}",
                         "text": f"{'–' if rate is None else f'{rate:,.0f}'} rec/s · lag "
                                 f"{'–' if h.lag_records is None else f'{h.lag_records:,}'} rec / "
                                 f"{views.human_seconds(h.lag_s)}"}
    datacenters = {}
    for dc in sorted({s.datacenter for s in topo.clusters.values()}):
        names = [n for n, s in topo.clusters.items() if s.datacenter == dc]
        unreachable = all((snap.clusters.get(n) or {}).get("error") for n in names) and snap.polls > 0
        out_flows = [m for m in topo.mirrors if m.source in names]
        silent = bool(out_flows) and all(m.name in silent_flows for m in out_flows)
        datacenters[dc] = {"cut": unreachable or silent,
                           "why": "no broker answers the console" if unreachable else
                                  "every flow out of it finds its source silent" if silent else ""}
    warehouse = None
    if topo.warehouse is not None:
        wh = snap.warehouse or {}
        loads = wh.get("loads") or []
        warehouse = {"level": views.OK if loads else views.UNKNOWN if not wh.get("service") else views.WARN,
                     "text": (f"last load {loads[0]['finished_at']}" if loads else
                              "no service running" if not wh.get("service") else "no load yet")}
    return {"at_s": snap.at_s, "poll_ms": snap.poll_ms, "clusters": clusters, "flows": flows,
            "datacenters": datacenters, "warehouse": warehouse}


def _decode_records(console: Console, cluster: str, registry: Any, records: Any) -> dict[tuple[int, str], tuple[str, str]]:
    """Wire-format keys and values decoded through the cluster's registry (in a thread)."""
    from deploy.console.decode import SchemaDecoder, context_of

    decoder = console.decoders.get(cluster)
    if decoder is None:
        decoder = console.decoders[cluster] = SchemaDecoder(registry)
    out: dict[tuple[int, str], tuple[str, str]] = {}
    contexts = console.topology.schema_contexts(cluster) if cluster in console.topology.clusters else ()
    for r in records:
        where = provenance(r)
        context = context_of(where["cluster"] if where else None, cluster, contexts)
        for part, data in (("key", r.key), ("value", r.value)):
            found = decoder.decode(data, context)
            if found is not None:
                out[(r.offset, part)] = found
    return out


TIME_MS_MAX = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: any later is no record's time


def _parse_time(text: str) -> int:
    """A time for the record browser: epoch milliseconds, or ISO 8601 (UTC unless it says)."""
    from datetime import UTC, datetime

    text = text.strip()[:40]
    if text.isascii() and text.isdigit():
        if len(text) > len(str(TIME_MS_MAX)) or int(text) > TIME_MS_MAX:
            raise BadInput(f"time: epoch milliseconds up to {TIME_MS_MAX} (the year 9999)")
        return int(text)
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise BadInput("time: epoch milliseconds or an ISO 8601 time such as 2026-11-27T10:00:00") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        return max(0, int(when.timestamp() * 1000))
    except (OverflowError, ValueError):
        raise BadInput("time: a time between 1970 and 9999") from None


def _reset_to(kind: str, value: str) -> ResetTo:
    """The reset form's target: earliest / latest, an offset (ASCII digits), a shift (may be
    negative), or a time (epoch ms or ISO 8601)."""
    if kind not in RESET_KINDS:
        raise BadInput(f"reset to: one of {', '.join(RESET_KINDS)}")
    if kind == "offset":
        return ResetTo(kind, bounded_int(value, "offset", 0, OFFSET_MAX) or 0)
    if kind == "shift":
        shift = bounded_int(value, "shift", -OFFSET_MAX, OFFSET_MAX)
        if shift is None:
            raise BadInput("shift: a whole number of offsets (negative: back)")
        return ResetTo(kind, shift)
    if kind == "datetime":
        return ResetTo(kind, timestamp_ms=_parse_time(value))
    return ResetTo(kind)


def _time_text(timestamp_ms: int) -> str:
    if timestamp_ms < 0:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(timestamp_ms / 1000)) + f".{timestamp_ms % 1000:03d}Z"
