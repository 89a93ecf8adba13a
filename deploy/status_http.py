"""Mirror workers' state over the network: each worker's admin HTTP `/v1/status`, asked in
parallel with httpx, so `dcmirror status` and `dcmirror mirror status` work from any host
that reaches the workers (no shared files).

A flow whose workers declare admin HTTP addresses (`workers_http`, or config
`http.port.base`) is asked over HTTP: every worker within `timeout_s`, a worker that does not
answer in time (host down, process stopped, network cut) or answers with an error is listed
as such, with the reason. A flow without addresses falls back to the status files its
workers write on their own host (`via: "files"`), which only the host running them has.

The bearer token (`http.auth.token`, a reference) is sent when the flow has one; with
`http.ssl.keystore.location` the workers serve HTTPS, verified against `http.ssl.ca.location`
(default: the system's CAs). Secrets never appear in the answers or errors.
"""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio

from cluster.client.connection import connect_failure
from topology.model import MirrorSpec, Topology

STATUS_PATH = "/v1/status"
MAX_STATUS_BYTES = 4 << 20  # a worker's status document; a larger answer is refused, not read
LIVE_WORKER_AGE_S = 10.0  # a status file older than this is from a worker that is gone


def _client_options(flow: MirrorSpec) -> tuple[str, dict[str, str], ssl.SSLContext | bool]:
    """(scheme, headers, verify) for asking the flow's workers."""
    headers = {"Accept": "application/json"}
    token_ref = flow.config.get("http.auth.token")
    if token_ref:
        from cluster.common.secrets import secret

        headers["Authorization"] = f"Bearer {secret(token_ref, 'http.auth.token').reveal()}"
    if not flow.config.get("http.ssl.keystore.location"):
        return "http", headers, True
    ca = flow.config.get("http.ssl.ca.location")
    return "https", headers, ssl.create_default_context(cafile=ca) if ca else True


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _ask(client: httpx.AsyncClient, url: str, timeout_s: float) -> dict[str, Any]:
    """One worker's status document; raises with a short reason."""
    async with client.stream("GET", url, timeout=timeout_s) as response:
        if response.status_code != 200:
            raise ValueError(f"HTTP {response.status_code}" + (" (bearer token refused)"
                                                              if response.status_code == 401 else ""))
        declared = int(response.headers.get("content-length") or 0)
        if declared > MAX_STATUS_BYTES:
            raise ValueError(f"status of {declared} bytes (limit {MAX_STATUS_BYTES})")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_STATUS_BYTES:
                raise ValueError(f"status over {MAX_STATUS_BYTES} bytes")
    doc = orjson.loads(bytes(body))
    if not isinstance(doc, dict):
        raise ValueError("status is not a JSON object")
    return doc


def _reason(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {connect_failure(exc)}"
    if isinstance(exc, orjson.JSONDecodeError):
        return "answer is not JSON"
    return str(exc) or type(exc).__name__


async def flow_workers_over_http(flow: MirrorSpec, timeout_s: float) -> list[dict[str, Any]]:
    """Every worker of the flow, asked at once: its status plus `index`, `address`,
    `reachable` and (when unreachable) `error`."""
    scheme, headers, verify = _client_options(flow)
    results: list[dict[str, Any]] = [{} for _ in range(flow.workers)]

    async def one(client: httpx.AsyncClient, index: int) -> None:
        address = flow.http_address(index)
        assert address is not None
        where = f"{_host(address[0])}:{address[1]}"
        base = {"index": index, "address": where, "worker": f"{flow.name}-w{index}"}
        started = time.monotonic()
        try:
            with trio.fail_after(timeout_s + 1):  # httpx's timeouts are per phase; this bounds the whole
                doc = await _ask(client, f"{scheme}://{where}{STATUS_PATH}", timeout_s)
        except (httpx.HTTPError, OSError, ValueError, trio.TooSlowError, orjson.JSONDecodeError) as exc:
            results[index] = base | {"reachable": False, "error": _reason(exc, timeout_s)}
            return
        results[index] = base | doc | {"reachable": True, "age_s": 0.0,
                                       "answer_ms": round((time.monotonic() - started) * 1000, 1)}

    async with httpx.AsyncClient(headers=headers, verify=verify, trust_env=False) as client:
        async with trio.open_nursery() as nursery:
            for i in range(flow.workers):
                nursery.start_soon(one, client, i)
    return results


def flow_workers_from_files(state_dir: Path) -> list[dict[str, Any]]:
    """What the workers of a flow last wrote into their status files on this host."""
    now_ms = time.time() * 1000
    workers = []
    for path in sorted(state_dir.glob("*.json")):
        try:
            status = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        status["age_s"] = (now_ms - status.get("reported_ms", 0)) / 1000
        status["reachable"] = status["age_s"] < LIVE_WORKER_AGE_S
        workers.append(status)
    return workers


# What the workers found of the sides' histories (mirror/history.py), summed per flow.
HISTORY_COUNTERS = ("source_recreations", "divergences", "diverged_records", "target_refills", "dead_letter_records")


def schema_sync_summary(workers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The flow's schema sync (mirror/schema_sync.py) over the workers that answered: copies,
    deletes followed and errors summed, the newest round; None: the flow copies no schemas."""
    docs = [w["schema_sync"] for w in workers if w.get("reachable") and w.get("schema_sync")]
    if not docs:
        return None
    return {"context": docs[0].get("context"),
            **{key: sum(d.get(key, 0) for d in docs) for key in ("schemas_copied", "deletes_followed",
                                                                  "configs_followed", "errors", "chunks_waited")},
            "last_sync_ms": max((d["last_sync_ms"] for d in docs if d.get("last_sync_ms")), default=None),
            "last_errors": [e for d in docs for e in d.get("last_errors", [])][-5:]}


def pause_summary(live: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the flow is paused as its live workers report it (mirror/flow_control.py): paused
    when any of them is, since the earliest of them, with the reason the newest gives."""
    paused = [w for w in live if w.get("paused")]
    newest = max(paused, key=lambda w: (w.get("flow_control") or {}).get("at_ms") or 0, default=None)
    return {"paused": bool(paused),
            "paused_since_ms": min((w["paused_since_ms"] for w in paused if w.get("paused_since_ms")), default=None),
            "pause_reason": newest.get("pause_reason") if newest else None,
            "paused_workers": len(paused)}


async def flow_reports(topology: Topology, flows: list[MirrorSpec], timeout_s: float,
                       state_dir: Any) -> list[dict[str, Any]]:
    """Per flow: its workers' state (over HTTP where they have addresses, else from this
    host's status files via `state_dir(topology, flow)`) and the flow's totals over the
    workers that answered."""
    workers: dict[str, list[dict[str, Any]]] = {}

    async def one(flow: MirrorSpec) -> None:
        workers[flow.name] = await flow_workers_over_http(flow, timeout_s)

    async with trio.open_nursery() as nursery:
        for flow in flows:
            if flow.http_address(0) is not None:
                nursery.start_soon(one, flow)
            else:
                workers[flow.name] = flow_workers_from_files(state_dir(topology, flow))
    report = []
    for flow in flows:
        found = workers[flow.name]
        live = [w for w in found if w.get("reachable")]
        report.append({"flow": flow.name, "source": flow.source, "target": flow.target,
                       "via": "http" if flow.http_address(0) is not None else "files",
                       "workers": found, "live_workers": len(live),
                       "lag_records": sum(w.get("lag_records", 0) for w in live),
                       "records": sum(w.get("records", 0) for w in live),
                       "data_loss_records": sum(w.get("data_loss_records", 0) for w in found),
                       "schema_sync": schema_sync_summary(found),
                       **pause_summary(live),
                       **{key: sum(w.get(key, 0) for w in found) for key in HISTORY_COUNTERS}})
    return report
