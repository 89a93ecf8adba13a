"""A small admin HTTP server (h11 over trio) for /healthz, /metrics (Prometheus text) and
JSON status pages of brokers and mirror workers. GET only; bounded request size; one
request per connection is enough for scrapers and curl.

It binds where it is told (loopback by default in every caller). With a bearer token, every
page but /healthz (liveness probes carry no credentials) needs `Authorization: Bearer
<token>` (Prometheus: `authorization: {credentials_file: ...}`); without it the answer is 401.
With a TLS context it serves HTTPS only."""

from __future__ import annotations

import hmac
import logging
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import h11
import trio

from cluster.common.secrets import Secret

log = logging.getLogger("dcmirror.http")

MAX_REQUEST_BYTES = 16 << 10
REQUEST_TIMEOUT_S = 10.0
# -> (content type, body) answered with 200, or (status, content type, body)
Route = Callable[[], tuple[str, bytes] | tuple[int, str, bytes]]
# (labels, value), or (suffix, labels, value) for a histogram's _bucket/_sum/_count lines
Sample = tuple[dict[str, str], float] | tuple[str, dict[str, str], float]


def prometheus_text(metrics: Mapping[str, tuple[str, str, Sequence[Sample]]]) -> bytes:
    """Prometheus exposition text: {name: (type, help, [(labels, value), ...])}."""
    lines = []
    for name, (kind, help_text, samples) in metrics.items():
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for sample in samples:
            if len(sample) == 3:
                suffix, labels, value = sample
            else:
                suffix, (labels, value) = "", sample
            if labels:
                inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                lines.append(f"{name}{suffix}{{{inner}}} {_number(value)}")
            else:
                lines.append(f"{name}{suffix} {_number(value)}")
    return ("\n".join(lines) + "\n").encode()


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True)
class HttpSecurity:
    """How the admin HTTP server guards its pages (both optional)."""

    token: Secret | None = None
    """The bearer token (from a ${file:...}/${dir:...}/${env:...} reference, never logged)."""
    tls: ssl.SSLContext | None = None
    """HTTPS (cluster.security.tls.https_context)."""


def _authorized(request: Any, token: Secret | None) -> bool:
    if token is None:
        return True
    for name, value in request.headers:
        if name == b"authorization":
            scheme, _, given = bytes(value).partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.reveal().encode())
    return False


async def _handle(stream: Any, routes: Mapping[str, Route], security: HttpSecurity = HttpSecurity()) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    try:
        if security.tls is not None:
            stream = trio.SSLStream(stream, security.tls, server_side=True)
            with trio.fail_after(REQUEST_TIMEOUT_S):
                await stream.do_handshake()
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            request: Any = None
            while request is None:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(4096)
                    conn.receive_data(bytes(data))
                    if not data:
                        return
                elif isinstance(event, h11.Request):
                    request = event
                else:
                    return
            target = request.target.decode("ascii", "replace").split("?", 1)[0]
            route = routes.get(target)
            extra: list[tuple[str, str]] = []
            if request.method != b"GET":
                status, ctype, body = 405, "text/plain", b"GET only\n"
            elif target != "/healthz" and not _authorized(request, security.token):
                status, ctype, body = 401, "text/plain", b"a bearer token is required (Authorization: Bearer ...)\n"
                extra = [("www-authenticate", 'Bearer realm="dcmirror"')]
            elif route is None:
                status, ctype, body = 404, "text/plain", ("not found; try " + ", ".join(routes) + "\n").encode()
            else:
                try:
                    answer = route()
                    if len(answer) == 3:
                        status, ctype, body = answer
                    else:
                        status, (ctype, body) = 200, answer
                except Exception as exc:  # noqa: BLE001 - a broken page must not take the server down
                    log.exception("admin HTTP %s failed", target)
                    status, ctype, body = 500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode()
            headers = [("content-type", ctype), ("content-length", str(len(body))), ("connection", "close"), *extra]
            await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            await stream.send_all(conn.send(h11.Data(data=body)) or b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
    except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
        pass  # a bad request, a failed TLS handshake, a peer gone: this connection only
    finally:
        await stream.aclose()


async def serve(host: str, port: int, routes: Mapping[str, Route], *, security: HttpSecurity = HttpSecurity(),
                task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """Serve `routes` on host:port until cancelled."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    log.info("admin HTTP%s on %s:%d (%s)%s", "S" if security.tls else "", host, port, ", ".join(routes),
             ", bearer token required" if security.token else "")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(lambda s: _handle(s, routes, security), listeners)
