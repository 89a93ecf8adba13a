"""Helpers of the ops tests: scraping a broker's admin HTTP server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def get(url: str, timeout_s: float = 10.0) -> tuple[int, str, bytes]:
    """(status, content type, body) of a GET, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type", ""), exc.read()


def scrape(base: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics, parsed by prometheus_client: (name, labels) -> value."""
    status, ctype, body = get(base + "/metrics")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype, body[:200])
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The one sample of `name` whose labels include `labels` (0 when there is none)."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, f"{name} {labels}: {len(found)} samples"
    return found[0] if found else 0.0


def cluster_view(base: str) -> dict[str, Any]:
    status, ctype, body = get(base + "/v1/cluster")
    assert status == 200 and ctype == "application/json", (status, ctype, body[:200])
    doc: dict[str, Any] = json.loads(body)
    return doc
