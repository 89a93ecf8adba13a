"""Warehouse load metrics as a Prometheus textfile: what node_exporter's textfile collector
(`--collector.textfile.directory`) serves for a batch job that is not running when it is
scraped, the way Prometheus documents it for cron jobs.

Every `dcmirror load` that ends (loaded, nothing new, or failed) rewrites
`<dir>/dcmirror_load.prom` atomically (a temporary file, then rename: the collector never
reads half a file). The directory is the warehouse config `load.metrics.textfile.dir`,
by default the warehouse `path` beside last_load.json; point the collector at it, or set it
to the collector's directory (Debian's: /var/lib/prometheus/node-exporter).

Counters (runs by result, rows) carry on from the previous file, so they only grow as long
as that file is kept; the last success time is kept across failed runs, which is what the
"load late" alert compares against. The text is built by a pure function (sans-IO); a file
that cannot be written is a warning, never a failed load.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

TEXTFILE_NAME = "dcmirror_load.prom"
TEXTFILE_DIR_KEY = "load.metrics.textfile.dir"
MAX_PREVIOUS_BYTES = 64 << 10  # a previous file larger than this is not ours: start over

# name -> (type, help); every name the file can hold, in the order written.
METRICS: dict[str, tuple[str, str]] = {
    "dcmirror_load_runs_total": ("counter", "Warehouse loads that ended, by result (ok, failed)"),
    "dcmirror_load_rows_total": ("counter", "Rows loaded into warehouse tables"),
    "dcmirror_load_last_run_timestamp_seconds": ("gauge", "When the last load ended (Unix time)"),
    "dcmirror_load_last_run_success": ("gauge", "1 if the last load succeeded, 0 if it failed"),
    "dcmirror_load_last_success_timestamp_seconds": ("gauge", "When the last successful load ended (Unix time)"),
    "dcmirror_load_last_duration_seconds": ("gauge", "How long the last load took"),
    "dcmirror_load_last_rows": ("gauge", "Rows the last load wrote"),
    "dcmirror_load_interval_seconds": ("gauge", "The schedule's load.interval.ms in seconds (0: not scheduled)"),
}
RESULTS = ("ok", "failed")

_SAMPLE = re.compile(r'^([a-z_]+)\{([^}]*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _labels(text: str) -> dict[str, str]:
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(text)}


def previous_values(text: str, source: str) -> dict[tuple[str, str], float]:
    """(metric, result label or "") -> value, for this source's samples of an earlier file;
    lines that do not parse are ignored (the counters then restart, as after a reset)."""
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in METRICS:
            continue
        labels = _labels(m.group(2))
        if labels.get("source") != source:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        if value == value and value >= 0:  # not NaN, not negative
            out[(m.group(1), labels.get("result", ""))] = value
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def load_metrics_text(outcome: Mapping[str, Any], previous: str, *, source: str, interval_s: float,
                      now_s: float) -> str:
    """The textfile after a load that ended with `outcome` (last_load.json's document:
    status "ok"/"failed", seconds, rows), continuing the counters of `previous`."""
    before = previous_values(previous, source)
    ok = outcome.get("status") == "ok"
    rows = int(outcome.get("rows") or 0) if ok else 0
    runs = {r: before.get(("dcmirror_load_runs_total", r), 0.0) for r in RESULTS}
    runs["ok" if ok else "failed"] += 1
    last_success = now_s if ok else before.get(("dcmirror_load_last_success_timestamp_seconds", ""))
    base = f'source="{_escape(source)}"'
    values: dict[str, list[tuple[str, float]]] = {
        "dcmirror_load_runs_total": [(f'{base},result="{r}"', runs[r]) for r in RESULTS],
        "dcmirror_load_rows_total": [(base, before.get(("dcmirror_load_rows_total", ""), 0.0) + rows)],
        "dcmirror_load_last_run_timestamp_seconds": [(base, round(now_s, 3))],
        "dcmirror_load_last_run_success": [(base, 1.0 if ok else 0.0)],
        # Never succeeded: no sample (an alert on `absent()` or on the failures catches that).
        "dcmirror_load_last_success_timestamp_seconds": [(base, round(last_success, 3))] if last_success else [],
        "dcmirror_load_last_duration_seconds": [(base, float(outcome["seconds"]))] if "seconds" in outcome else [],
        "dcmirror_load_last_rows": [(base, float(rows))],
        "dcmirror_load_interval_seconds": [(base, interval_s)],
    }
    lines = []
    for name, samples in values.items():
        kind, help_text = METRICS[name]
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f"{name}{{{labels}}} {_number(v)}" for labels, v in samples]
    return "\n".join(lines) + "\n"


def textfile_path(warehouse_path: Path, config: Mapping[str, str]) -> Path:
    return Path(config.get(TEXTFILE_DIR_KEY) or warehouse_path) / TEXTFILE_NAME


def write_load_metrics(path: Path, outcome: Mapping[str, Any], *, source: str, interval_s: float,
                       now_s: float) -> bool:
    """Rewrite the textfile at `path` after a load; False (and a warning) if it cannot be."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PREVIOUS_BYTES + 1)
        previous = raw.decode("utf-8", "replace") if len(raw) <= MAX_PREVIOUS_BYTES else ""
    except FileNotFoundError:
        previous = ""
    except OSError as exc:
        log.warning("load metrics: cannot read %s (%s); counters start over", path, exc.strerror or exc)
        previous = ""
    text = load_metrics_text(outcome, previous, source=source, interval_s=interval_s, now_s=now_s)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # not *.prom: the collector skips it
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        log.warning("load metrics: cannot write %s (%s)", path, exc.strerror or exc)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        return False
    return True
