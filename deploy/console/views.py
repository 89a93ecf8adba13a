"""What the console's pages show, decided from what the poller saw (sans-IO: plain functions
and small state over dicts, no sockets, no clock of their own).

Colours follow the alert rules (deploy/render/monitoring.py): a flow is red ("crit") when an
alert of severity critical would fire for it (a worker down, records lost or diverged, a
partition failed), amber ("warn") for a warning (lag over the lag alert's threshold, a source
silent past its threshold, a paused flow), green otherwise; grey when nothing is known yet.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deploy.render.monitoring import MonitoringOptions
from topology.model import Topology

OK, WARN, CRIT, UNKNOWN = "ok", "warn", "crit", "unknown"
LEVEL_ORDER = {UNKNOWN: 0, OK: 1, WARN: 2, CRIT: 3}
LAG_HISTORY_SAMPLES = 120
"""Samples kept per flow partition for its lag chart (at the default 2 s refresh: 4 minutes)."""
VALUE_SHOWN_BYTES_MAX = 64 << 10
"""A record's key or value is shown up to this many bytes (the rest is counted, not shown)."""


def worse(a: str, b: str) -> str:
    return a if LEVEL_ORDER[a] >= LEVEL_ORDER[b] else b


# ---- flows ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowHealth:
    level: str
    reasons: tuple[str, ...]
    lag_records: int | None
    lag_s: float | None
    live_workers: int
    workers: int
    paused: bool


def _max(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


DEFAULT_THRESHOLDS = MonitoringOptions()


def flow_health(report: Mapping[str, Any] | None, workers_declared: int,
                options: MonitoringOptions = DEFAULT_THRESHOLDS,
                unreachable: Mapping[str, str] | None = None) -> FlowHealth:
    """A flow's colour and why, from its workers' status report (deploy/status_http.py);
    `unreachable`: the flow's source or target clusters the console's last poll could not
    reach (role -> cluster): amber at once, before any lag or silence alert would fire (a
    worker reports its last answer's high watermark, so a cut source reads as lag 0)."""
    if report is None:
        return FlowHealth(UNKNOWN, ("not asked yet",), None, None, 0, workers_declared, False)
    workers = list(report.get("workers", []))
    live = [w for w in workers if w.get("reachable")]
    parts = [p for w in live for p in w.get("partitions", [])]
    level, reasons = OK, []
    for role, cluster in (unreachable or {}).items():
        level = worse(level, WARN)
        reasons.append(f"{role} {cluster} unreachable")
    down = [w for w in workers if not w.get("reachable")]
    if down:
        level = CRIT
        reasons += [f"worker {w.get('worker', w.get('index'))} down: {w.get('error', 'no answer')}" for w in down]
    for key, what in (("data_loss_records", "records deleted at the source before they were mirrored"),
                      ("diverged_records", "mirrored records the source no longer holds"),
                      ("dead_letter_records", "records no target request can hold (dead letters)")):
        if report.get(key):
            level = CRIT
            reasons.append(f"{report[key]} {what}")
    failed = [p for p in parts if p.get("state") in ("STOPPED", "FAILED")]
    if failed:
        level = CRIT
        reasons += [f"{p['topic']}-{p['partition']} {p['state']}: {p.get('reason') or ''}".rstrip(": ")
                    for p in failed[:5]]
    lag_s = _max(p.get("lag_s") for p in parts)
    silent_s = _max(p.get("source_silent_s") for p in parts)
    if lag_s is not None and lag_s > options.lag_alert_s:
        level = worse(level, WARN)
        reasons.append(f"lags {lag_s:.0f} s (alert over {options.lag_alert_s:g} s)")
    if silent_s is not None and silent_s > options.source_silent_alert_s:
        level = worse(level, WARN)
        reasons.append(f"source silent {silent_s:.0f} s")
    paused = any(w.get("paused") for w in live)
    if paused:
        level = worse(level, WARN)
        reasons.append("paused")
    lag_records = sum(p.get("lag_records") or 0 for p in parts) if live else None
    return FlowHealth(level, tuple(reasons), lag_records, lag_s, len(live), max(workers_declared, len(workers)),
                      paused)


class RateTracker:
    """Records per second from a monotonically growing counter, over the last two polls that
    saw it (a counter that went down — a restarted worker — starts again)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}
        self._rate: dict[str, float] = {}

    def observe(self, key: str, now_s: float, counter: float) -> None:
        previous = self._last.get(key)
        self._last[key] = (now_s, counter)
        if previous is not None and now_s > previous[0] and counter >= previous[1]:
            self._rate[key] = (counter - previous[1]) / (now_s - previous[0])

    def rate(self, key: str) -> float | None:
        return self._rate.get(key)


@dataclass
class LagHistory:
    """Lag in records per flow partition over the last polls, for the flows page's charts."""

    samples: int = LAG_HISTORY_SAMPLES
    series: dict[tuple[str, str, int], deque[tuple[float, int]]] = field(default_factory=dict)

    def observe(self, flow: str, now_s: float, partitions: Iterable[Mapping[str, Any]]) -> None:
        for p in partitions:
            if p.get("lag_records") is None:
                continue
            key = (flow, str(p["topic"]), int(p["partition"]))
            self.series.setdefault(key, deque(maxlen=self.samples)).append((now_s, int(p["lag_records"])))

    def of(self, flow: str) -> dict[tuple[str, int], list[tuple[float, int]]]:
        return {(t, p): list(s) for (f, t, p), s in sorted(self.series.items()) if f == flow}


def sparkline(points: Sequence[tuple[float, int]], width: int = 160, height: int = 32) -> str:
    """SVG polyline points for a small chart of (time, value), scaled into width x height."""
    if not points:
        return ""
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1
    span = (t1 - t0) or 1.0
    return " ".join(f"{(t - t0) / span * width:.1f},{height - v / top * (height - 2) - 1:.1f}" for t, v in points)


# ---- clusters ---------------------------------------------------------------------------------


def partition_state(p: Mapping[str, Any], min_isr: int) -> str:
    """offline (no leader), under-min-isr, under-replicated, or ok."""
    if p["leader"] < 0:
        return "offline"
    if len(p["isr"]) < min(min_isr, len(p["replicas"])):
        return "under-min-isr"
    if len(p["isr"]) < len(p["replicas"]):
        return "under-replicated"
    return "ok"


PARTITION_STATE_ORDER = {"offline": 0, "under-min-isr": 1, "under-replicated": 2, "ok": 3}


def partitions_worst_first(partitions: Iterable[Mapping[str, Any]], min_isr: int = 1) -> list[dict[str, Any]]:
    rows = [dict(p, state=partition_state(p, min_isr)) for p in partitions]
    rows.sort(key=lambda p: (PARTITION_STATE_ORDER[p["state"]], p["topic"], p["partition"]))
    return rows


def cluster_level(cluster: Mapping[str, Any] | None, brokers_declared: int) -> tuple[str, list[str]]:
    """A cluster's colour: red when no broker answers, a broker is missing, no controller or
    partitions are offline; amber for under-replicated partitions."""
    if cluster is None:
        return UNKNOWN, ["not asked yet"]
    if cluster.get("error"):
        return CRIT, [f"unreachable: {cluster['error']}"]
    reasons, level = [], OK
    registered = {b["node_id"] for b in cluster.get("brokers", [])}
    missing = brokers_declared - len(registered)
    if missing > 0:
        level = CRIT
        reasons.append(f"{missing} of {brokers_declared} brokers not registered")
    if cluster.get("controller_id", -1) < 0:
        level = CRIT
        reasons.append("no active controller")
    counts = cluster.get("partition_counts", {})
    if counts.get("offline"):
        level = CRIT
        reasons.append(f"{counts['offline']} offline partitions")
    if counts.get("under-min-isr"):
        level = CRIT
        reasons.append(f"{counts['under-min-isr']} partitions under min ISR")
    if counts.get("under-replicated"):
        level = worse(level, WARN)
        reasons.append(f"{counts['under-replicated']} under-replicated partitions")
    return level, reasons


# ---- the map ----------------------------------------------------------------------------------

MAP_COLUMN_PX = 400
MAP_ROW_PX = 140
MAP_NODE_W = 190
MAP_NODE_H = 64
MAP_MARGIN_PX = 30


@dataclass(frozen=True)
class MapNode:
    id: str
    label: str
    sublabel: str
    kind: str  # cluster | warehouse
    x: int
    y: int


@dataclass(frozen=True)
class MapDatacenter:
    name: str
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class MapEdge:
    id: str  # the flow's name, or "warehouse"
    source: str
    target: str
    path: str  # SVG path data
    label_x: int
    label_y: int
    top: int  # the highest point of its curve or its labels


@dataclass(frozen=True)
class MapLayout:
    width: int
    height: int
    nodes: tuple[MapNode, ...]
    datacenters: tuple[MapDatacenter, ...]
    edges: tuple[MapEdge, ...]


def _depths(topology: Topology) -> dict[str, int]:
    """Column of each cluster: 0 for clusters nothing flows into, else one more than the
    deepest cluster flowing into it (cycles, e.g. disaster-recovery pairs, stop growing)."""
    depth = {name: 0 for name in topology.clusters}
    for _ in range(len(depth)):
        changed = False
        for m in topology.mirrors:
            want = depth[m.source] + 1
            if depth[m.target] < want and want < len(depth):
                depth[m.target], changed = want, True
        if not changed:
            break
    return depth


MAP_LABEL_ABOVE_PX = 30  # a flow's two label lines reach this far above label_y


def map_layout(topology: Topology) -> MapLayout:
    """Datacenters, clusters and flows placed left to right in the direction data flows,
    the warehouse after the cluster it loads from. Flows that arc over a column (and their
    labels) would rise above the top: everything moves down to keep them in the picture."""
    first = _map_layout(topology, 0)
    highest = min([MAP_MARGIN_PX, *(e.top for e in first.edges)])
    return first if highest >= MAP_MARGIN_PX // 2 else _map_layout(topology, MAP_MARGIN_PX // 2 - highest)


def _map_layout(topology: Topology, down_px: int) -> MapLayout:
    depth = _depths(topology)
    columns: dict[int, list[str]] = {}
    for name in sorted(topology.clusters, key=lambda n: (depth[n], topology.clusters[n].datacenter, n)):
        columns.setdefault(depth[name], []).append(name)
    rows = max(len(c) for c in columns.values())
    nodes: dict[str, MapNode] = {}
    for col, names in columns.items():
        offset = (rows - len(names)) * MAP_ROW_PX // 2
        for row, name in enumerate(names):
            spec = topology.clusters[name]
            count = len(spec.brokers)
            nodes[name] = MapNode(name, name, f"{spec.datacenter} · {count} broker{'' if count == 1 else 's'}",
                                  "cluster", MAP_MARGIN_PX + col * MAP_COLUMN_PX,
                                  MAP_MARGIN_PX + 20 + down_px + offset + row * MAP_ROW_PX)
    last_col = max(columns)
    if topology.warehouse is not None:
        src = nodes[topology.warehouse.source]
        last_col += 1
        nodes["warehouse"] = MapNode("warehouse", "warehouse", "Spark tables", "warehouse",
                                     MAP_MARGIN_PX + last_col * MAP_COLUMN_PX, src.y)
    dcs: dict[str, list[MapNode]] = {}
    for name, spec in topology.clusters.items():
        dcs.setdefault(spec.datacenter, []).append(nodes[name])
    pad = 14
    datacenters = tuple(
        MapDatacenter(dc, min(n.x for n in ns) - pad, min(n.y for n in ns) - pad - 18,
                      max(n.x for n in ns) + MAP_NODE_W + pad - (min(n.x for n in ns) - pad),
                      max(n.y for n in ns) + MAP_NODE_H + pad - (min(n.y for n in ns) - pad - 18))
        for dc, ns in sorted(dcs.items()))
    edges = []
    pairs: dict[tuple[str, str], int] = {}
    for m in topology.mirrors:
        a, b = nodes[m.source], nodes[m.target]
        k = pairs[(m.source, m.target)] = pairs.get((m.source, m.target), -1) + 1
        bend = 10 * k + (40 if (m.target, m.source) in pairs or any(
            x.source == m.target and x.target == m.source for x in topology.mirrors) else 0)
        bend = max(bend, _clearing_bend(a, b, [n for n in nodes.values() if n.id not in (a.id, b.id)]))
        edges.append(_edge(m.name, a, b, bend))
    if topology.warehouse is not None:
        edges.append(_edge("warehouse", nodes[topology.warehouse.source], nodes["warehouse"], 0))
    width = MAP_MARGIN_PX * 2 + last_col * MAP_COLUMN_PX + MAP_NODE_W
    height = max(n.y for n in nodes.values()) + MAP_NODE_H + MAP_MARGIN_PX + 14
    return MapLayout(width, height, tuple(nodes.values()), datacenters, tuple(edges))


def _clearing_bend(a: MapNode, b: MapNode, others: list[MapNode]) -> int:
    """How far a flow that skips a column must arc above the nodes between its ends (else it
    runs through the middle node and cannot be seen): 0 when nothing is in the way."""
    lo, hi = min(a.x, b.x), max(a.x, b.x)
    y_line = (a.y + b.y) // 2 + MAP_NODE_H // 2
    blocking = [n for n in others if lo < n.x < hi and n.y - 12 <= y_line <= n.y + MAP_NODE_H + 12]
    if not blocking:
        return 0
    # Clear the top of the blocking nodes' datacenter boxes and their labels (32 px above a
    # node) with room to spare: the curve's middle rises half the bend above the chord.
    top = min(n.y for n in blocking) - 32
    return 2 * (y_line - top) + 24


def _edge(name: str, a: MapNode, b: MapNode, bend: int) -> MapEdge:
    forward = b.x >= a.x
    x1 = a.x + (MAP_NODE_W if forward else 0)
    x2 = b.x + (0 if forward else MAP_NODE_W)
    lift = min(bend // 3, MAP_NODE_H // 2 - 8)  # the ends stay on the nodes' sides
    y1, y2 = a.y + MAP_NODE_H // 2 - lift, b.y + MAP_NODE_H // 2 - lift
    mx, my = (x1 + x2) // 2, (y1 + y2) // 2 - bend
    # A quadratic curve's midpoint lies halfway between the control point and the chord's:
    # the two label lines go just above it.
    label_y = (y1 + y2) // 2 - bend // 2 - 10
    top = min(y1, y2, (y1 + 2 * my + y2) // 4, label_y - MAP_LABEL_ABOVE_PX)
    return MapEdge(name, a.id, b.id, f"M {x1} {y1} Q {mx} {my} {x2} {y2}", mx, label_y, top)


# ---- records ----------------------------------------------------------------------------------

RENDER_MODES = ("auto", "json", "text", "hex")


def render_bytes(data: bytes | None, mode: str = "auto") -> tuple[str, str]:
    """(how it was rendered, the text) for a key or value: JSON pretty-printed when it parses
    (auto/json), UTF-8 text, else hex; longer than VALUE_SHOWN_BYTES_MAX is cut and says so."""
    if data is None:
        return "null", "null"
    cut = len(data) > VALUE_SHOWN_BYTES_MAX
    shown = data[:VALUE_SHOWN_BYTES_MAX]
    suffix = f"\n… {len(data) - VALUE_SHOWN_BYTES_MAX} more bytes not shown" if cut else ""
    if mode in ("auto", "json") and not cut:
        try:
            return "json", json.dumps(json.loads(shown), indent=2, ensure_ascii=False) + suffix
        except ValueError:
            pass
    if mode in ("auto", "json", "text"):
        try:
            return "text", shown.decode("utf-8") + suffix
        except UnicodeDecodeError:
            if mode == "text":
                return "base64", base64.b64encode(shown).decode() + suffix
    return "hex", hex_dump(shown) + suffix


def hex_dump(data: bytes) -> str:
    """As `hexdump -C`: per 16 bytes the offset, the bytes in hex and as ASCII (printable
    ASCII as itself, anything else '.')."""
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {chunk[:8].hex(' '):<23}  {chunk[8:].hex(' '):<23}  |{text}|")
    return "\n".join(lines)


def group_lag_total(rows: Iterable[Mapping[str, Any]]) -> int:
    return sum(r.get("lag") or 0 for r in rows)


def human_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "–"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"
