"""Asking a running `dcmirror warehouse serve` (spark_aggregate/service.py) over its Unix
socket, `<warehouse path>/warehouse.sock`, with httpx: `warehouse sql` and `load` use its
Spark session instead of starting a JVM and a metastore of their own.

No service (no socket, or a socket nobody accepts on: a service that died) means None, and
the command runs in a session of its own as before. A service that answers with an error
is that command's answer; one that accepts and then stops answering is an error after
the timeout, not a second load beside it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx
import orjson

from spark_aggregate.settings import WarehouseSettings

SOCKET_NAME = "warehouse.sock"
MAX_ANSWER_BYTES = 256 << 20  # a query's rows are bounded by --max-rows; a larger answer is refused
LOAD_TIMEOUT_S = 24 * 3600.0  # a load runs as long as it takes (as `dcmirror load` does)
SQL_TIMEOUT_S = 3600.0
SERVICE_PROG = "dcmirror warehouse serve"  # what the service's lock file says (session.warehouse_lock)
SERVICE_START_WAIT_S = 600.0  # a JVM and metastore start: ~10 s idle, minutes on a loaded machine


def socket_path(settings: WarehouseSettings) -> Path:
    return Path(settings.path) / SOCKET_NAME


def wait_for_starting_service(settings: WarehouseSettings, err: TextIO = sys.stderr,
                              limit_s: float = SERVICE_START_WAIT_S) -> bool:
    """True once a service that is starting (it holds the warehouse lock, its socket not yet
    there) answers on its socket; False when no service is starting, or it went away (the
    lock is free: the command runs in a session of its own). Without this wait a `dcmirror
    load` right after `dcmirror up` started the service found the warehouse busy."""
    from spark_aggregate.session import lock_holder

    sock = socket_path(settings)
    holder = lock_holder(settings)
    if holder is None or not holder.startswith(SERVICE_PROG):
        return False
    print(f"waiting for the warehouse service to start ({holder})", file=err, flush=True)
    deadline = time.monotonic() + limit_s
    while not sock.exists():
        holder = lock_holder(settings)
        if holder is None or not holder.startswith(SERVICE_PROG):
            return False  # it stopped before answering: the lock is free
        if time.monotonic() > deadline:
            print(f"the warehouse service has held the warehouse for {limit_s:g} s without answering on {sock}",
                  file=err, flush=True)
            return False
        time.sleep(0.2)
    return True


@contextmanager
def reachable(path: Path) -> Iterator[str]:
    """A name for the socket at `path` that fits AF_UNIX's 108 bytes however deep the
    warehouse lies: /proc/self/fd/N/NAME through an open descriptor of its directory."""
    if len(str(path).encode()) < 100:
        yield str(path)
        return
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


def ask_service(settings: WarehouseSettings, path: str, doc: dict[str, Any], err: TextIO) -> dict[str, Any] | None:
    """The service's JSON answer to POST `path`, or None when no service is running."""
    sock = socket_path(settings)
    if not sock.exists() and not wait_for_starting_service(settings, err):
        return None
    timeout_s = LOAD_TIMEOUT_S if path == "/v1/load" else SQL_TIMEOUT_S
    try:
        with reachable(sock) as name, httpx.Client(transport=httpx.HTTPTransport(uds=name),
                                                   timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
            with client.stream("POST", f"http://warehouse{path}", content=orjson.dumps(doc),
                               headers={"content-type": "application/json"}) as answer:
                body = bytearray()
                for chunk in answer.iter_bytes():
                    body += chunk
                    if len(body) > MAX_ANSWER_BYTES:
                        return {"error": f"the warehouse service's answer is over {MAX_ANSWER_BYTES} bytes",
                                "exit_code": 1}
    except (httpx.ConnectError, FileNotFoundError):
        return None  # a socket file left by a service that is gone (or removed just now)
    except httpx.HTTPError as exc:
        return {"error": f"the warehouse service at {sock} did not answer: {exc or type(exc).__name__}",
                "exit_code": 1}
    try:
        found = orjson.loads(bytes(body))
    except orjson.JSONDecodeError:
        return {"error": f"the warehouse service answered HTTP {answer.status_code} without JSON", "exit_code": 1}
    if not isinstance(found, dict):
        return {"error": "the warehouse service answered something other than a JSON object", "exit_code": 1}
    print(f"(answered by the warehouse service, {sock})", file=err)
    return found
