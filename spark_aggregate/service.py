"""`dcmirror warehouse serve`: one long-lived Spark session for the warehouse, so that
`dcmirror warehouse sql` answers in about a second and `dcmirror load` (by hand or scheduled)
skips the JVM and metastore start that each command otherwise pays.

The service holds the warehouse lock (the embedded Derby metastore admits one process) for
as long as it runs, and answers HTTP on a Unix socket, `<warehouse path>/warehouse.sock`,
mode 0600: only the user running it (and root) can ask, nothing listens on the network.

    GET  /healthz     ok
    POST /v1/sql      {"query": "...", "max_rows": N} -> {"columns", "rows", "truncated", "seconds"}
    POST /v1/load     {"query": null | "..." | ["...", ...]} -> {"exit_code", "output", "errors"}

Requests run one at a time (a load and a query never share the session at once); at most
MAX_PENDING_REQUESTS wait (more are answered 503), and a request body over MAX_REQUEST_BYTES
is refused before it is read. Loads go through the same code as
`dcmirror load` (commands.run_load): the ledger makes them exactly once whichever process
runs them, and a service killed mid-load leaves what a killed `dcmirror load` leaves.
SIGTERM or SIGINT stops it: the request under way finishes first.

With a load interval (`--load-interval-ms`) it also loads on its own, the first at once, then
each interval after the previous one started (one at a time with the requests): a
Kubernetes pod has no systemd timer, and another pod cannot reach the socket.
"""

from __future__ import annotations

import http.server
import io
import logging
import os
import signal
import socketserver
import sys
import threading
import time
from contextlib import nullcontext
from typing import Any

import orjson

from spark_aggregate.service_client import reachable, socket_path
from spark_aggregate.settings import WarehouseSettings

log = logging.getLogger("dcmirror.warehouse")

MAX_REQUEST_BYTES = 1 << 20
MAX_ROWS = 1_000_000
MAX_PENDING_REQUESTS = 16


class WarehouseService:
    """The session and what the handlers do with it (one request at a time)."""

    def __init__(self, settings: WarehouseSettings, spark: Any) -> None:
        self.settings = settings
        self.spark = spark
        self._busy = threading.Lock()

    def sql(self, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from spark_aggregate.commands import query_error_text, query_rows

        query, max_rows = doc.get("query"), doc.get("max_rows", 1000)
        if not isinstance(query, str) or not query.strip():
            return 400, {"error": "no query"}
        if not isinstance(max_rows, int) or not 1 <= max_rows <= MAX_ROWS:
            return 400, {"error": f"max_rows must be 1 to {MAX_ROWS}"}
        with self._busy:
            started = time.monotonic()
            try:
                columns, rows, truncated = query_rows(self.spark, self.settings, query, max_rows)
            except Exception as exc:  # noqa: BLE001 - a bad query is the user's error: say it plainly
                return 400, {"error": query_error_text(exc, self.settings)}
        return 200, {"columns": columns, "rows": rows, "truncated": truncated,
                     "seconds": round(time.monotonic() - started, 3)}

    def load(self, doc: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from spark_aggregate.commands import run_load

        query = doc.get("query")
        if query is not None and not isinstance(query, str) and not (
                isinstance(query, list) and all(isinstance(q, str) for q in query)):
            return 400, {"error": "query must be a string or a list of strings"}
        out, err = io.StringIO(), io.StringIO()
        with self._busy:
            code = run_load(self.settings, out=out, err=err, query=query, session=nullcontext(self.spark))
        return 200, {"exit_code": code, "output": out.getvalue(), "errors": err.getvalue()}


def _scheduled_load(service: WarehouseService, out: Any) -> None:
    """One load of the interval: its output (what `dcmirror load` prints) in the service's."""
    _, doc = service.load({})
    for text in (doc.get("output", ""), doc.get("errors", "")):
        if text:
            print(text.rstrip("\n"), file=out, flush=True)
    print(f"warehouse service: scheduled load exited {doc.get('exit_code')}", file=out, flush=True)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    service: WarehouseService
    slots: threading.BoundedSemaphore
    """Requests under way or waiting for the session; more are answered 503 at once."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def address_string(self) -> str:  # a Unix socket has no peer address
        return "local"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("warehouse service: " + format, *args)

    def _answer(self, status: int, doc: dict[str, Any]) -> None:
        body = orjson.dumps(doc)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/healthz":
            self._answer(200, {"status": "ok", "pid": os.getpid()})
        else:
            self._answer(404, {"error": f"no page {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        routes = {"/v1/sql": self.server.service.sql, "/v1/load": self.server.service.load}
        handler = routes.get(self.path)
        if handler is None:
            self._answer(404, {"error": f"no page {self.path}"})
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(411, {"error": "Content-Length required"})
            return
        if not 0 <= length <= MAX_REQUEST_BYTES:
            self.close_connection = True
            self._answer(413, {"error": f"request over {MAX_REQUEST_BYTES} bytes"})
            return
        try:
            doc = orjson.loads(self.rfile.read(length))
        except orjson.JSONDecodeError:
            self._answer(400, {"error": "request is not JSON"})
            return
        if not isinstance(doc, dict):
            self._answer(400, {"error": "request is not a JSON object"})
            return
        if not self.server.slots.acquire(blocking=False):
            self._answer(503, {"error": f"the warehouse service has {MAX_PENDING_REQUESTS} requests waiting; "
                                        "try again later"})
            return
        try:
            self._answer(*handler(doc))
        finally:
            self.server.slots.release()


def serve(settings: WarehouseSettings, out: Any = sys.stdout, err: Any = sys.stderr,
          load_interval_ms: int | None = None) -> int:
    """Run until SIGTERM/SIGINT; 1 if the warehouse is in use by another process. With
    `load_interval_ms`, load every that many milliseconds too."""
    from spark_aggregate.commands import own_session
    from spark_aggregate.session import WarehouseBusy, ensure_database

    prog = "dcmirror warehouse serve"
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with own_session(settings, prog) as spark:
            # The metastore's first use creates its schema (embedded Derby: seconds): done
            # before answering, so the first load or query does not pay it.
            ensure_database(spark, settings)
            path = socket_path(settings)
            path.unlink(missing_ok=True)  # left by a service that died: we hold the lock now
            old_umask = os.umask(0o177)
            try:
                with reachable(path) as name:
                    server = _Server(name, _Handler)
            finally:
                os.umask(old_umask)
            server.service = WarehouseService(settings, spark)
            server.slots = threading.BoundedSemaphore(MAX_PENDING_REQUESTS)
            thread = threading.Thread(target=server.serve_forever, name="warehouse-http", daemon=True)
            thread.start()
            print(f"warehouse service: Spark session ready; answering on {path}", file=out, flush=True)
            try:
                next_load = time.monotonic()
                while not stop.wait(0.5):
                    if load_interval_ms is not None and time.monotonic() >= next_load:
                        next_load = time.monotonic() + load_interval_ms / 1000
                        _scheduled_load(server.service, out)
            finally:
                server.shutdown()  # waits for serve_forever; a request under way finishes
                server.server_close()
                path.unlink(missing_ok=True)
            print("warehouse service: stopped", file=out, flush=True)
    except WarehouseBusy as exc:
        print(f"{prog}: {exc}", file=err)
        return 1
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
